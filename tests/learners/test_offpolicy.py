"""DaskSAC, DaskTD3, DaskDDPG and DaskDQN: collections on the workers fill the replay buffer as SB3's loop does.

An actor pinned to one action (its output layer's weights zero, ``learning_rate=0`` so
that training leaves it so) makes SB3's loop on ``DummyVecEnv`` and the worker-side
collections on ``DaskVecEnv`` see the same transitions, whatever the batch each side
runs the network on; everything random that SB3 draws on the client (the warm-up's
uniform actions, DQN's epsilon draws, the action noise) is drawn with the same seeds.
The replay buffers, every callback step, ``num_timesteps``, ``ep_info_buffer``, DQN's
exploration rate and the noise states are then compared. Faults use real processes: a
``dask worker`` killed with SIGKILL during a collection, every stored transition then
checked against Pendulum's own dynamics.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import DDPG, DQN, SAC, TD3
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.noise import ActionNoise, NormalActionNoise, OrnsteinUhlenbeckActionNoise
from stable_baselines3.common.vec_env import DummyVecEnv, VecFrameStack, VecMonitor, VecNormalize

from benchmarks.across_learn import StepWaitSpy
from daskvec import DaskVecEnv
from daskvec.sb3 import DaskDDPG, DaskDQN, DaskSAC, DaskTD3

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_ENVS = 4
K = 8  # vec-steps per collection
#: Keys of SB3's off-policy collect_rollouts locals that callbacks read.
SB3_LOCALS = {
    "self",
    "env",
    "callback",
    "train_freq",
    "replay_buffer",
    "action_noise",
    "learning_starts",
    "log_interval",
    "num_collected_steps",
    "num_collected_episodes",
    "continue_training",
    "actions",
    "buffer_actions",
    "new_obs",
    "rewards",
    "dones",
    "infos",
}
SMALL = {"net_arch": [16, 16]}


class EndsBothWays(gym.Wrapper[Any, Any, Any, Any]):
    """Pendulum whose episodes started upside down terminate at their 5th step; the others are truncated at 7."""

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self.t, self.upside_down = 0, bool(obs[0] < 0)
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.t += 1
        return obs, reward, terminated or (self.upside_down and self.t == 5), truncated, info


def short_pendulum() -> gym.Env[Any, Any]:
    return Monitor(EndsBothWays(gym.make("Pendulum-v1", max_episode_steps=7)))


def bare_short_pendulum() -> gym.Env[Any, Any]:
    return EndsBothWays(gym.make("Pendulum-v1", max_episode_steps=7))


def short_cartpole() -> gym.Env[Any, Any]:
    """Always pushed left, CartPole falls after 8-10 steps: cut at 9, some episodes end each way."""
    return Monitor(gym.make("CartPole-v1", max_episode_steps=9))


class SlowPendulum(gym.Wrapper[Any, Any, Any, Any]):
    """Pendulum with 20 ms per step, so that a collection lasts long enough to kill its worker."""

    def step(self, action: Any) -> Any:
        time.sleep(0.02)
        return self.env.step(action)


def slow_pendulum() -> gym.Env[Any, Any]:
    return Monitor(SlowPendulum(gym.make("Pendulum-v1", max_episode_steps=13)))


def pin(model: Any) -> None:
    """Make the actor act the same whatever it sees (SAC: a standard deviation of e^-20, lost in rounding)."""
    with th.no_grad():
        if isinstance(model, DQN):
            head = model.policy.q_net.q_net[-1]
            head.weight.zero_()
            head.bias.copy_(th.tensor([1.0, 0.0]))  # always push left
        elif isinstance(model, SAC):
            model.actor.mu.weight.zero_()
            model.actor.mu.bias.fill_(0.3)
            model.actor.log_std.weight.zero_()
            model.actor.log_std.bias.fill_(-20.0)
        else:  # TD3, DDPG
            head = model.actor.mu[-2]
            head.weight.zero_()
            head.bias.fill_(0.3)


class Recorder(BaseCallback):
    """Everything a callback sees, per step; stops at step ``stop_at`` if given."""

    def __init__(self, stop_at: int | None = None, on_rollout: Any = None) -> None:
        super().__init__()
        self.steps: list[dict[str, Any]] = []
        self.rollout_starts = 0
        self.rollout_ends = 0
        self.stop_at = stop_at
        self.on_rollout = on_rollout

    def _on_rollout_start(self) -> None:
        self.rollout_starts += 1
        if self.on_rollout is not None:
            self.on_rollout(self.rollout_starts)

    def _on_step(self) -> bool:
        loc, model = self.locals, self.model
        noise: Any = model.action_noise
        self.steps.append(
            {
                "num_timesteps": self.num_timesteps,
                "keys": set(loc),
                "actions": np.copy(loc["actions"]),
                "buffer_actions": np.copy(loc["buffer_actions"]),
                "rewards": np.copy(loc["rewards"]),
                "dones": np.copy(loc["dones"]),
                "new_obs": np.copy(loc["new_obs"]),
                "infos": [{k: v for k, v in i.items() if k != "episode"} for i in loc["infos"]],
                "episodes": [(i["episode"]["r"], i["episode"]["l"]) for i in loc["infos"] if "episode" in i],
                "exploration_rate": getattr(model, "exploration_rate", None),
                "ou_state": None
                if noise is None or not hasattr(noise.noises[0], "noise_prev")
                else np.stack([n.noise_prev for n in noise.noises]),
            }
        )
        return self.stop_at is None or len(self.steps) < self.stop_at

    def _on_rollout_end(self) -> None:
        self.rollout_ends += 1


def make(cls: Any, env: Any, pinned: bool = True, **kw: Any) -> Any:
    policy_kwargs = dict(kw.pop("policy_kwargs", SMALL))  # SB3 adds keys to it
    kw.setdefault("learning_rate", 0.0)
    kw.setdefault("buffer_size", 1000)
    kw.setdefault("batch_size", 16)
    kw.setdefault("train_freq", (K, "step"))
    model = cls("MlpPolicy", env, seed=0, device="cpu", policy_kwargs=policy_kwargs, **kw)
    if pinned:
        pin(model)
    return model


def train(cls: Any, env: Any, collections: int, callback: BaseCallback | None = None, **kw: Any) -> Any:
    model = make(cls, env, **kw)
    model.learn(K * N_ENVS * collections, callback=callback)
    return model


def fallbacks(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """The warnings saying that SB3's own loop is used instead of worker-side collections."""
    return [w for w in caught if "SB3's own loop" in str(w.message)]


def assert_same_replay_buffers(got: Any, want: Any) -> None:
    a, b = got.replay_buffer, want.replay_buffer
    assert (a.pos, a.full) == (b.pos, b.full)
    assert a.pos > 0
    for name in ("observations", "next_observations", "actions", "rewards", "dones", "timeouts"):
        x, y = getattr(a, name)[: a.pos], getattr(b, name)[: b.pos]
        assert x.shape == y.shape, name
        np.testing.assert_array_equal(x, y, err_msg=name)


def assert_same_steps(got: Recorder, want: Recorder) -> None:
    assert len(got.steps) == len(want.steps) > 0
    assert (got.rollout_starts, got.rollout_ends) == (want.rollout_starts, want.rollout_ends)
    for t, (x, y) in enumerate(zip(got.steps, want.steps, strict=True)):
        assert x["keys"] >= SB3_LOCALS, f"step {t}: locals miss {SB3_LOCALS - x['keys']}"
        assert x["num_timesteps"] == y["num_timesteps"]
        assert x["exploration_rate"] == y["exploration_rate"], f"step {t}"
        for name in ("actions", "buffer_actions", "rewards", "dones", "new_obs"):
            np.testing.assert_array_equal(x[name], y[name], err_msg=f"step {t}: {name}")
        if y["ou_state"] is not None:
            np.testing.assert_array_equal(x["ou_state"], y["ou_state"], err_msg=f"step {t}: OU noise state")
        assert x["episodes"] == y["episodes"], f"step {t}"
        for i, (p, q) in enumerate(zip(x["infos"], y["infos"], strict=True)):
            assert set(p) == set(q), f"step {t} env {i}: {sorted(p)} vs {sorted(q)}"
            if "terminal_observation" in p:
                np.testing.assert_array_equal(p["terminal_observation"], q["terminal_observation"])
            assert p.get("TimeLimit.truncated") == q.get("TimeLimit.truncated")


def assert_same_run(got: Any, want: Any, got_cb: Recorder, want_cb: Recorder) -> None:
    assert_same_steps(got_cb, want_cb)
    assert_same_replay_buffers(got, want)
    assert got.num_timesteps == want.num_timesteps
    assert got._episode_num == want._episode_num > 0
    assert getattr(got, "_n_calls", None) == getattr(want, "_n_calls", None)  # DQN's _on_step count
    assert [(e["r"], e["l"]) for e in got.ep_info_buffer] == [(e["r"], e["l"]) for e in want.ep_info_buffer]
    assert len(got.ep_info_buffer) > 0


# --------------------------------------------------------------------------- same data as SB3's loop
CASES = {
    # learning_starts in the middle of the first collection: warm-up, then the actor
    "sac": (DaskSAC, SAC, short_pendulum, {"learning_starts": 20}),
    "td3": (DaskTD3, TD3, short_pendulum, {"learning_starts": 20}),
    "ddpg": (DaskDDPG, DDPG, short_pendulum, {"learning_starts": 20}),
    # epsilon from 1 to 0.05 over the first half: random and greedy steps interleaved
    "dqn": (
        DaskDQN,
        DQN,
        short_cartpole,
        {"learning_starts": 20, "exploration_fraction": 0.5, "target_update_interval": 8},
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_replay_buffer_and_callbacks_as_sb3_loop(case: str, client2: Any) -> None:
    """Three collections: the same buffer, steps, infos, episodes and exploration as SB3's loop."""
    dask_cls, sb3_cls, env_fn, kw = CASES[case]
    want_cb, got_cb = Recorder(), Recorder()
    want = train(sb3_cls, DummyVecEnv([env_fn] * N_ENVS), 3, want_cb, **kw)
    with DaskVecEnv([env_fn] * N_ENVS, client2) as env, StepWaitSpy(env) as counter:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = train(dask_cls, env, 3, got_cb, **kw)
        assert not fallbacks(caught)
        assert (counter.collections, counter.step_waits) == (3, 0)
        assert env.restart_log == []
    # episodes ended both ways, so timeouts and terminal observations were exercised
    dones, timeouts = want.replay_buffer.dones[: want.replay_buffer.pos], want.replay_buffer.timeouts
    assert timeouts[: want.replay_buffer.pos].sum() and dones.sum() > timeouts.sum()
    # both phases: random actions before learning_starts, the actor's after
    acts = np.array([s["actions"] for s in want_cb.steps])
    if sb3_cls is DQN:  # the schedule ran through the collections; its random steps came with it
        rates = [s["exploration_rate"] for s in want_cb.steps]
        assert rates[-1] == pytest.approx(0.05) and len(set(rates)) > 3
        assert (acts[:5] == 1).any() and (acts[5:] == 1).any() and (acts[5:] == 0).any()
    else:
        assert len(np.unique(acts[:5])) == acts[:5].size and len(np.unique(acts[5:])) == 1
    assert_same_run(got, want, got_cb, want_cb)
    assert got.num_timesteps == 3 * K * N_ENVS


@pytest.mark.parametrize("noise", ["normal", "ou"])
def test_action_noise_as_sb3_loop(noise: str, client2: Any) -> None:
    """Gaussian and Ornstein-Uhlenbeck noise per env, reset at episode ends, drawn as SB3 draws it."""

    def kw() -> dict[str, Any]:
        base: ActionNoise
        if noise == "normal":
            base = NormalActionNoise(np.zeros(1), 0.5 * np.ones(1))
        else:
            base = OrnsteinUhlenbeckActionNoise(
                np.zeros(1), 0.5 * np.ones(1), theta=0.3, dt=0.5, initial_noise=0.1 * np.ones(1)
            )
        return {"action_noise": base, "learning_starts": 8}

    want_cb, got_cb = Recorder(), Recorder()
    want = train(TD3, DummyVecEnv([short_pendulum] * N_ENVS), 3, want_cb, **kw())
    with DaskVecEnv([short_pendulum] * N_ENVS, client2) as env, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(DaskTD3, env, 3, got_cb, **kw())
    assert not fallbacks(caught)
    # the noise moved the pinned actor's actions, and clipping to [-1, 1] happened
    acts = np.array([s["buffer_actions"] for s in want_cb.steps[2:]])
    assert len(np.unique(acts)) > 20 and (np.abs(acts) == 1).any()
    assert_same_run(got, want, got_cb, want_cb)
    if noise == "ou":  # the states the next collection starts from
        for a, b in zip(got.action_noise.noises, want.action_noise.noises, strict=True):
            np.testing.assert_array_equal(a.noise_prev, b.noise_prev)


def test_vecnormalize_and_vecmonitor(client2: Any) -> None:
    """Original observations and rewards in the buffer; VecNormalize's statistics as SB3's."""
    kw = {"learning_starts": 20, "gamma": 0.9}

    def wrap(venv: Any) -> VecNormalize:
        return VecNormalize(VecMonitor(venv), gamma=0.9)

    want_cb, got_cb = Recorder(), Recorder()
    want = train(SAC, wrap(DummyVecEnv([bare_short_pendulum] * N_ENVS)), 3, want_cb, **kw)
    with DaskVecEnv([bare_short_pendulum] * N_ENVS, client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = wrap(venv)
        got = train(DaskSAC, env, 3, got_cb, **kw)
    assert not fallbacks(caught)
    assert_same_run(got, want, got_cb, want_cb)
    w = want.get_env()
    for name in ("obs_rms", "ret_rms"):
        a, b = getattr(env, name), getattr(w, name)
        np.testing.assert_array_equal(a.mean, b.mean, err_msg=name)
        np.testing.assert_array_equal(a.var, b.var, err_msg=name)
        assert a.count == b.count
    # the statistics moved, so normalised and original observations differ
    assert not np.allclose(env.obs_rms.mean, 0.0) and not np.allclose(env.obs_rms.var, 1.0)


def test_the_workers_actor_sees_normalised_observations(client2: Any) -> None:
    """An actor that is not pinned acts on the observations as VecNormalize gives them (statistics fixed here)."""

    def wrap(venv: Any) -> VecNormalize:
        vn = VecNormalize(venv, training=False, norm_reward=False)
        vn.obs_rms.mean, vn.obs_rms.var = np.array([0.5, -0.5, 1.0]), np.array([0.04, 0.09, 4.0])
        return vn

    want = make(TD3, wrap(DummyVecEnv([short_pendulum] * N_ENVS)), pinned=False, learning_starts=0)
    want.learn(2 * K * N_ENVS)
    with DaskVecEnv([short_pendulum] * N_ENVS, client2) as venv:
        env = wrap(venv)
        got = make(DaskTD3, env, pinned=False, learning_starts=0)
        got.learn(2 * K * N_ENVS)
        a, b = got.replay_buffer, want.replay_buffer
        assert a.pos == b.pos == 2 * K
        # the actor computed on other batches than SB3's (groups of 2, not 4 envs): float32 rounding apart
        for name in ("observations", "next_observations", "actions", "rewards"):
            np.testing.assert_allclose(
                getattr(a, name)[: a.pos], getattr(b, name)[: b.pos], rtol=1e-4, atol=1e-5, err_msg=name
            )
        # and the actor's actions on raw observations would have been others
        raw = got.policy.scale_action(got.policy.predict(a.observations[: a.pos].reshape(-1, 3), deterministic=True)[0])
        assert not np.allclose(raw, a.actions[: a.pos].reshape(-1, 1), atol=1e-2)


def test_on_step_false_stops_training(client2: Any) -> None:
    want_cb, got_cb = Recorder(stop_at=3), Recorder(stop_at=3)
    want = train(TD3, DummyVecEnv([short_pendulum] * N_ENVS), 4, want_cb, learning_starts=0)
    with DaskVecEnv([short_pendulum] * N_ENVS, client2) as env:
        got = train(DaskTD3, env, 4, got_cb, learning_starts=0)
        env.reset()  # the vec env is usable afterwards
    assert len(got_cb.steps) == len(want_cb.steps) == 3
    assert got.num_timesteps == want.num_timesteps == 3 * N_ENVS
    assert got_cb.rollout_ends == want_cb.rollout_ends == 0
    # the two steps stored before the stop, as SB3 stored them
    assert got.replay_buffer.pos == want.replay_buffer.pos == 2
    assert_same_replay_buffers(got, want)


# --------------------------------------------------------------------------- round trips
def test_one_step_wait_per_vec_step_with_sb3s_sac(client2: Any) -> None:
    """The instrument of the next test: SB3's own SAC on a DaskVecEnv pays a step_wait per vec-step."""
    with DaskVecEnv([short_pendulum] * N_ENVS, client2) as env, StepWaitSpy(env) as counter:
        model = make(SAC, env, learning_starts=0)
        model.learn(4 * K * N_ENVS)
    assert counter.step_waits == 4 * K and counter.collections == 0


@pytest.mark.parametrize("cls", [DaskSAC, DaskTD3, DaskDQN])
def test_at_most_one_step_wait_per_collection(cls: Any, client2: Any) -> None:
    """During learn(), the learner's DaskVecEnv sees no step_wait: one collection request per train_freq."""
    env_fn = short_cartpole if cls is DaskDQN else short_pendulum
    cb = Recorder()
    with DaskVecEnv([env_fn] * N_ENVS, client2) as env, StepWaitSpy(env) as counter:
        model = make(cls, env, learning_starts=0, learning_rate=1e-3)
        model.learn(4 * K * N_ENVS, callback=cb)
    assert cb.rollout_starts == 4 and len(cb.steps) == 4 * K
    assert counter.step_waits <= cb.rollout_starts
    assert counter.collections == cb.rollout_starts


def test_train_freq_of_one_step_is_sb3s_loop(client2: Any) -> None:
    """One vec-step per collection: SB3's own loop, without a warning (one round trip either way)."""
    want = train(TD3, DummyVecEnv([short_pendulum] * N_ENVS), 2, train_freq=1, learning_starts=8)
    with (
        DaskVecEnv([short_pendulum] * N_ENVS, client2) as env,
        warnings.catch_warnings(record=True) as caught,
        StepWaitSpy(env) as counter,
    ):
        warnings.simplefilter("always")
        got = train(DaskTD3, env, 2, train_freq=1, learning_starts=8)
    assert not fallbacks(caught)
    assert counter.collections == 0 and counter.step_waits == 2 * K
    assert_same_replay_buffers(got, want)


# --------------------------------------------------------------------------- seeds
def test_seeded_daskSAC_repeats(client2: Any) -> None:
    """A seeded DaskSAC that samples and trains gives the same replay buffer and weights run after run."""
    runs = []
    for _ in range(2):
        with DaskVecEnv([short_pendulum] * N_ENVS, client2) as env:
            model = DaskSAC(
                "MlpPolicy",
                env,
                train_freq=(K, "step"),
                learning_starts=8,
                buffer_size=1000,
                batch_size=16,
                policy_kwargs=dict(SMALL),
                seed=3,
                device="cpu",
            )
            model.learn(3 * K * N_ENVS)
            runs.append(model)
    a, b = runs
    acts = a.replay_buffer.actions[2 : a.replay_buffer.pos]
    assert len(np.unique(acts)) == acts.size  # sampled, not pinned
    assert_same_replay_buffers(a, b)
    for (k, x), (_, y) in zip(a.policy.state_dict().items(), b.policy.state_dict().items(), strict=True):
        assert th.equal(x, y), k


# --------------------------------------------------------------------------- fallbacks
@pytest.mark.parametrize(
    ("kw", "n_envs", "why"),
    [
        ({"train_freq": (1, "episode")}, 1, "episode"),
        ({"use_sde": True}, N_ENVS, "use_sde"),
        ({"action_noise": "custom"}, N_ENVS, "action noise"),
        ({"wrap": True}, N_ENVS, "VecFrameStack"),
    ],
)
def test_unsupported_falls_back_with_one_warning(kw: dict[str, Any], n_envs: int, why: str, client2: Any) -> None:
    class Custom(NormalActionNoise):
        pass

    kw = dict(kw)
    if kw.pop("action_noise", None):
        kw["action_noise"] = Custom(np.zeros(1), np.ones(1))
    wrap = kw.pop("wrap", False)
    with DaskVecEnv([short_pendulum] * n_envs, client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = VecFrameStack(venv, 2) if wrap else venv
        model = DaskSAC(
            "MlpPolicy",
            env,
            learning_starts=0,
            buffer_size=1000,
            batch_size=16,
            policy_kwargs=dict(SMALL),
            seed=0,
            device="cpu",
            **{"train_freq": (K, "step"), **kw},
        )
        model.learn(3 * K * n_envs)
    ours = fallbacks(caught)
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert why in str(ours[0].message)
    assert model.num_timesteps >= 3 * K * n_envs


# --------------------------------------------------------------------------- a worker killed mid-collection
def pendulum_transition(obs: np.ndarray, action: float) -> tuple[np.ndarray, float]:
    """Pendulum-v1's own step from an observation (theta recovered from its cosine and sine)."""
    g, m, length, dt = 10.0, 1.0, 1.0, 0.05
    theta, thdot = float(np.arctan2(obs[1], obs[0])), float(obs[2])
    u = float(np.clip(action, -2.0, 2.0))
    norm = ((theta + np.pi) % (2 * np.pi)) - np.pi
    cost = norm**2 + 0.1 * thdot**2 + 0.001 * u**2
    newthdot = float(np.clip(thdot + (3 * g / (2 * length) * np.sin(theta) + 3.0 / (m * length**2) * u) * dt, -8, 8))
    newth = theta + newthdot * dt
    return np.array([np.cos(newth), np.sin(newth), newthdot]), -cost


@pytest.mark.timeout(180)
def test_worker_killed_mid_collection(dask_processes: Any) -> None:
    """SIGKILL of a worker during a collection: its envs report a truncation at the collection's first step
    (next_obs: their last observation) and every transition stored is one Pendulum could make."""
    procs = dask_processes(2)
    killed: dict[str, Any] = {}
    k = 32
    with DaskVecEnv([slow_pendulum] * N_ENVS, procs.address, step_timeout=30) as env:
        victim = env.groups[0]
        assert len({g["worker"] for g in env.groups}) == 2

        def kill_during_second(n: int) -> None:
            if n == 2:  # ~0.3 s into a collection of ~0.7 s
                timer = threading.Timer(0.3, os.kill, (victim["pid"], signal.SIGKILL))
                timer.start()
                killed["timer"] = timer

        cb = Recorder(on_rollout=kill_during_second)
        noise = OrnsteinUhlenbeckActionNoise(np.zeros(1), 0.3 * np.ones(1))
        model = DaskTD3(
            "MlpPolicy",
            env,
            train_freq=(k, "step"),
            learning_starts=16,
            action_noise=noise,
            buffer_size=1000,
            batch_size=16,
            policy_kwargs=dict(SMALL),
            seed=0,
            device="cpu",
        )
        model.learn(4 * k * N_ENVS, callback=cb)
        killed["timer"].join()
        log = env.restart_log
        assert sorted(e["env"] for e in log) == sorted(victim["envs"])
        assert {e["reason"] for e in log} == {"worker_lost"}
        assert victim["worker"] not in {g["worker"] for g in env.groups}
    assert model.num_timesteps == 4 * k * N_ENVS and cb.rollout_ends == 4
    lost = sorted(victim["envs"])
    first = cb.steps[k]  # the second collection's first step
    for i in range(N_ENVS):
        info = first["infos"][i]
        if i in lost:
            assert first["dones"][i] and info["TimeLimit.truncated"] and first["rewards"][i] == 0.0
            assert info["daskvec"]["reason"] == "worker_lost"
            np.testing.assert_array_equal(info["terminal_observation"], cb.steps[k - 1]["new_obs"][i])
        else:
            assert "daskvec" not in info
    assert all("daskvec" not in i for s in cb.steps[k + 1 :] for i in s["infos"])
    rb = model.replay_buffer
    assert rb.pos == 4 * k
    # in the buffer: the lost envs' step is a timeout from their last observation to itself, reward 0
    np.testing.assert_array_equal(rb.next_observations[k, lost], rb.observations[k, lost])
    assert (rb.rewards[k, lost] == 0).all() and rb.dones[k, lost].all() and rb.timeouts[k, lost].all()
    # every other transition is one Pendulum makes: no env's data mixed with another's or with a rebuilt env's
    checked = 0
    for t in range(rb.pos):
        for i in range(N_ENVS):
            if t == k and i in lost:
                continue
            want_obs, want_reward = pendulum_transition(rb.observations[t, i], 2.0 * float(rb.actions[t, i, 0]))
            np.testing.assert_allclose(rb.next_observations[t, i], want_obs, atol=2e-4, err_msg=f"step {t} env {i}")
            assert rb.rewards[t, i] == pytest.approx(want_reward, abs=2e-3), f"step {t} env {i}"
            checked += 1
    assert checked == 4 * k * N_ENVS - len(lost)
