"""PPO on CartPole from partial batches: DaskVectorEnv's send/recv, per-env trajectories and GAE.

The learner never waits for all envs: ``recv()`` returns the envs (whole groups) that
finished first, ``send()`` gives exactly those envs their next actions. Each env's
transitions go into a trajectory of its own, keyed by ``info["env_id"]``; advantages are
computed per env (GAE along that env's own time axis), never over a fixed
``(T, num_envs)`` grid, because the envs do not advance in lockstep: in one rollout a fast
env may have made three times as many steps as a slow one.

With the default ``NEXT_STEP`` autoreset mode, the row that ends an episode carries the
episode's last observation (terminated: no bootstrap; truncated: bootstrap from it),
and the env's next row is the first observation of the next episode (reward 0): the
action sent for that row is not a transition and is dropped.

Run it (an embedded LocalCluster is started when no scheduler is given)::

    python docs/examples/partial_batch_ppo.py --total-steps 120000

It prints the mean return of greedy evaluation episodes at the end (CartPole-v1 caps at 500).
"""

from __future__ import annotations

import argparse
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import daskvec

logger = logging.getLogger("partial_batch_ppo")


class ActorCritic(nn.Module):
    """Two small MLPs: action logits and state value."""

    def __init__(self, n_obs: int, n_actions: int, hidden: int = 64) -> None:
        super().__init__()
        self.pi = nn.Sequential(nn.Linear(n_obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                nn.Linear(hidden, n_actions))  # fmt: skip
        self.v = nn.Sequential(nn.Linear(n_obs, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                               nn.Linear(hidden, 1))  # fmt: skip

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self.v(obs).squeeze(-1)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.pi(obs))


@dataclass
class Trajectory:
    """One env's transitions since the last update, in its own time order."""

    obs: list[np.ndarray] = field(default_factory=list)
    actions: list[int] = field(default_factory=list)
    logps: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    ends: list[str] = field(default_factory=list)  # "" (goes on), "term" or "trunc"
    next_obs: list[np.ndarray] = field(default_factory=list)  # what the step led to

    def __len__(self) -> int:
        return len(self.actions)


@dataclass
class Config:
    num_envs: int = 8
    batch_size: int = 4
    rollout: int = 1024  # transitions per update, over all envs
    total_steps: int = 120_000
    lr: float = 1e-3
    gamma: float = 0.99
    lam: float = 0.95
    epochs: int = 8
    minibatch: int = 256
    clip: float = 0.2
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    seed: int = 1
    eval_episodes: int = 10


class PartialBatchCollector:
    """Keeps the envs busy with send/recv and files every transition under its env's id."""

    def __init__(self, envs: Any, model: ActorCritic, seed: int) -> None:
        self.envs, self.model = envs, model
        n = envs.num_envs
        self.trajs = [Trajectory() for _ in range(n)]
        self.last_obs: list[np.ndarray | None] = [None] * n
        self.last_act: list[tuple[int, float] | None] = [None] * n
        self.starting = np.zeros(n, dtype=bool)  # next row of this env is a reset row (NEXT_STEP)
        self.episode_return = np.zeros(n)
        self.returns: list[float] = []
        obs, _ = envs.reset(seed=seed)
        self._act(np.arange(n), obs)

    @torch.no_grad()
    def _act(self, ids: np.ndarray, obs: np.ndarray) -> None:
        dist = self.model.dist(torch.as_tensor(obs, dtype=torch.float32))
        actions = dist.sample()
        logps = dist.log_prob(actions)
        for k, i in enumerate(ids.tolist()):
            self.last_obs[i] = obs[k]
            self.last_act[i] = (int(actions[k]), float(logps[k]))
        self.envs.send(actions.numpy(), ids)

    def collect(self, n_transitions: int) -> int:
        """Receive batches until ``n_transitions`` transitions were filed; return how many."""
        filed = 0
        while filed < n_transitions:
            obs, rewards, terms, truncs, info = self.envs.recv()
            ids = info["env_id"]
            for k, i in enumerate(ids.tolist()):
                if self.starting[i]:  # a reset row: the action sent for it was not a step
                    self.starting[i] = False
                    continue
                act, logp = self.last_act[i]  # type: ignore[misc]
                t = self.trajs[i]
                t.obs.append(self.last_obs[i])  # type: ignore[arg-type]
                t.actions.append(act)
                t.logps.append(logp)
                t.rewards.append(float(rewards[k]))
                t.ends.append("term" if terms[k] else "trunc" if truncs[k] else "")
                t.next_obs.append(obs[k])
                filed += 1
                self.episode_return[i] += rewards[k]
                if terms[k] or truncs[k]:
                    self.starting[i] = True
                    self.returns.append(float(self.episode_return[i]))
                    self.episode_return[i] = 0.0
            self._act(ids, obs)
        return filed

    def take(self) -> list[Trajectory]:
        """The trajectories gathered so far; collection goes on into fresh ones."""
        out, self.trajs = self.trajs, [Trajectory() for _ in self.trajs]
        return [t for t in out if len(t)]


@torch.no_grad()
def per_env_gae(model: ActorCritic, traj: Trajectory, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Advantages and returns along one env's own time axis.

    A terminated step has no future; a truncated one bootstraps from the value of the
    observation it reached; the last step of the trajectory (the env goes on) too.
    """
    values = model.value(torch.as_tensor(np.array(traj.obs), dtype=torch.float32)).numpy()
    next_values = model.value(torch.as_tensor(np.array(traj.next_obs), dtype=torch.float32)).numpy()
    adv = np.zeros(len(traj), dtype=np.float32)
    running = 0.0
    for t in reversed(range(len(traj))):
        end = traj.ends[t]
        bootstrap = 0.0 if end == "term" else next_values[t]
        delta = traj.rewards[t] + gamma * bootstrap - values[t]
        # the advantage chain stops where an episode ends (terminated or truncated)
        running = delta + (0.0 if end else gamma * lam * running)
        adv[t] = running
    return adv, adv + values


def update(model: ActorCritic, opt: torch.optim.Optimizer, trajs: list[Trajectory], cfg: Config) -> float:
    """One PPO update on the transitions of every env's trajectory."""
    parts = [per_env_gae(model, t, cfg.gamma, cfg.lam) for t in trajs]
    obs = torch.as_tensor(np.concatenate([np.array(t.obs) for t in trajs]), dtype=torch.float32)
    actions = torch.as_tensor(np.concatenate([t.actions for t in trajs]))
    old_logp = torch.as_tensor(np.concatenate([t.logps for t in trajs]), dtype=torch.float32)
    raw_adv = torch.as_tensor(np.concatenate([a for a, _ in parts]))
    ret = torch.as_tensor(np.concatenate([r for _, r in parts]))
    adv = (raw_adv - raw_adv.mean()) / (raw_adv.std() + 1e-8)
    n = len(actions)
    loss = torch.zeros(())
    for _ in range(cfg.epochs):
        for idx in torch.randperm(n).split(cfg.minibatch):
            a = adv[idx]
            dist = model.dist(obs[idx])
            ratio = (dist.log_prob(actions[idx]) - old_logp[idx]).exp()
            pg = -torch.min(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a).mean()
            vf = ((model.value(obs[idx]) - ret[idx]) ** 2).mean()
            loss = pg + cfg.vf_coef * vf
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
    return float(loss.detach())


@torch.no_grad()
def evaluate(model: ActorCritic, episodes: int, seed: int) -> float:
    """Mean return of greedy episodes on a local CartPole-v1."""
    env = gym.make("CartPole-v1")
    total = 0.0
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + ep)
        done = False
        while not done:
            action = int(model.dist(torch.as_tensor(obs, dtype=torch.float32)).probs.argmax())
            obs, reward, term, trunc, _ = env.step(action)
            total += float(reward)
            done = term or trunc
    env.close()
    return total / episodes


def train(cfg: Config, client: Any = None) -> tuple[ActorCritic, float]:
    """Train PPO from partial batches; return the model and its mean evaluated return."""
    torch.manual_seed(cfg.seed)
    envs = daskvec.make_vec(
        "CartPole-v1", num_envs=cfg.num_envs, client=client, vector_kwargs={"batch_size": cfg.batch_size}
    )
    model = ActorCritic(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5)
    start, steps = time.perf_counter(), 0
    try:
        collector = PartialBatchCollector(envs, model, cfg.seed)
        while steps < cfg.total_steps:
            frac = 1.0 - steps / cfg.total_steps
            opt.param_groups[0]["lr"] = cfg.lr * frac
            steps += collector.collect(cfg.rollout)
            trajs = collector.take()
            loss = update(model, opt, trajs, cfg)
            recent = collector.returns[-20:]
            logger.info(
                "steps %d  loss %.3f  mean return (last 20 episodes) %.1f  %d env trajectories of %d-%d steps",
                steps, loss, np.mean(recent) if recent else 0.0, len(trajs),
                min(map(len, trajs)), max(map(len, trajs)),
            )  # fmt: skip
    finally:
        envs.close()
    score = evaluate(model, cfg.eval_episodes, seed=10_000 + cfg.seed)
    logger.info("%d steps in %.0f s; mean evaluated return %.1f", steps, time.perf_counter() - start, score)
    return model, score


def main(argv: list[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-steps", type=int, default=Config.total_steps)
    parser.add_argument("--num-envs", type=int, default=Config.num_envs)
    parser.add_argument("--batch-size", type=int, default=Config.batch_size)
    parser.add_argument("--eval-episodes", type=int, default=Config.eval_episodes)
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--scheduler", default=None, help="scheduler address (default: an embedded LocalCluster)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = Config(num_envs=args.num_envs, batch_size=args.batch_size, total_steps=args.total_steps,
                 eval_episodes=args.eval_episodes, seed=args.seed)  # fmt: skip
    _, score = train(cfg, args.scheduler)
    return score


if __name__ == "__main__":
    main()
