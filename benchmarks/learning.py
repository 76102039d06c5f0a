"""The learning check: DaskPPO against PPO with ``DummyVecEnv`` on the same seeds.

``daskvec bench --scenario learning`` (or :func:`run_learning_check`) trains PPO on
CartPole-v1 with 8 envs for 50,000 timesteps, for seeds 0, 1 and 2, twice per seed:
SB3's ``PPO`` on ``DummyVecEnv`` and :class:`~daskvec.learners.on_policy.DaskPPO` on a
:class:`~daskvec.DaskVecEnv` (rollouts collected on the workers). Each model is
evaluated deterministically on a seeded CartPole for 20 episodes. The check passes when
DaskPPO's mean evaluated reward (over the seeds) lies within the spread of PPO's
per-seed rewards (their min to max); ``not_below`` says whether it is at least PPO's
min. Hyperparameters are RL Zoo's for CartPole-v1 (``n_steps=32``,
``batch_size=256``, ``gae_lambda=0.8``, ``gamma=0.98``, ``n_epochs=20``,
``learning_rate=1e-3``, ``clip_range=0.2``), with constant rates.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.learning_runs import alternated, evaluate, learning_client
from daskvec.bench.machine import machine_info

logger = logging.getLogger(__name__)

__all__ = ["ZOO_CARTPOLE", "format_learning_table", "run_learning_check"]

#: RL Zoo's PPO hyperparameters for CartPole-v1 (schedules made constant).
ZOO_CARTPOLE: dict[str, Any] = {
    "n_steps": 32,
    "batch_size": 256,
    "gae_lambda": 0.8,
    "gamma": 0.98,
    "n_epochs": 20,
    "ent_coef": 0.0,
    "learning_rate": 1e-3,
    "clip_range": 0.2,
}

cartpole = functools.partial(gym.make, "CartPole-v1")


def _train(kind: str, seed: int, n_envs: int, timesteps: int, episodes: int, client: Any) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    from daskvec.sb3 import DaskPPO
    from daskvec.sb3.vec_env import DaskVecEnv

    t0 = time.perf_counter()
    if kind == "ppo":
        env = make_vec_env(cartpole, n_envs=n_envs, seed=seed, vec_env_cls=DummyVecEnv)
        cls: Any = PPO
    else:
        env = make_vec_env(
            cartpole,
            n_envs=n_envs,
            seed=seed,
            vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
            vec_env_kwargs={"client": client},
        )
        cls = DaskPPO
    try:
        model = cls("MlpPolicy", env, seed=seed, device="cpu", **ZOO_CARTPOLE)
        model.learn(timesteps)
    finally:
        env.close()
    wall = time.perf_counter() - t0
    reward = evaluate(model, "CartPole-v1", episodes, seed=10_000 + seed)
    logger.info("learning check: %s seed %d: %.1f in %.0fs", kind, seed, reward, wall)
    return {"seed": seed, "mean_reward": reward, "wall_s": wall}


def run_learning_check(
    seeds: Sequence[int] = (0, 1, 2),
    *,
    n_envs: int = 8,
    timesteps: int = 50_000,
    eval_episodes: int = 20,
    scheduler: str | None = None,
    out_path: str | Path | None = None,
) -> dict[str, Any]:
    """Train PPO (DummyVecEnv) and DaskPPO (DaskVecEnv) per seed; compare evaluated rewards.

    Parameters
    ----------
    seeds : sequence of int
        Seeds of envs and models.
    n_envs, timesteps, eval_episodes : int
        Envs per run, ``learn()`` timesteps, deterministic evaluation episodes.
    scheduler : str, optional
        Dask scheduler for DaskVecEnv (default: one embedded LocalCluster for the run).
    out_path : path, optional
        Where to write the results as JSON.

    Returns
    -------
    dict
        ``runs`` (per kind, per seed), ``summary`` (mean, std, min, max per kind) and
        ``within_spread``.
    """
    started = time.perf_counter()
    runs: dict[str, list[dict[str, Any]]] = {"ppo": [], "daskppo": []}
    with learning_client(scheduler) as (client, _):
        for seed, kind in alternated(list(runs), seeds):
            runs[kind].append(_train(kind, int(seed), n_envs, timesteps, eval_episodes, client))
    summary = {}
    for kind, rows in runs.items():
        r = np.array([row["mean_reward"] for row in rows])
        summary[kind] = {
            "mean": float(r.mean()),
            "std": float(r.std()),
            "min": float(r.min()),
            "max": float(r.max()),
            "wall_s": float(np.mean([row["wall_s"] for row in rows])),
        }
    ppo, dask = summary["ppo"], summary["daskppo"]
    results = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": dict(
            env="CartPole-v1",
            n_envs=n_envs,
            timesteps=timesteps,
            seeds=list(seeds),
            eval_episodes=eval_episodes,
            hyperparameters=ZOO_CARTPOLE,
        ),
        "runs": runs,
        "summary": summary,
        # DaskPPO's mean over the seeds within PPO's per-seed min..max; not_below: at least PPO's min
        "within_spread": ppo["min"] <= dask["mean"] <= ppo["max"],
        "not_below": dask["mean"] >= ppo["min"],
        "duration_s": time.perf_counter() - started,
    }
    if out_path is not None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(results, indent=2))
    return results


def format_learning_table(results: dict[str, Any]) -> str:
    """The learning check as a plain-text table."""
    s = results["settings"]
    lines = [
        f"PPO on CartPole-v1, {s['n_envs']} envs, {s['timesteps']} timesteps, seeds {s['seeds']}, "
        f"mean of {s['eval_episodes']} deterministic evaluation episodes"
    ]
    for kind, label in (("ppo", "PPO + DummyVecEnv"), ("daskppo", "DaskPPO + DaskVecEnv")):
        per_seed = ", ".join(f"{r['mean_reward']:.1f}" for r in results["runs"][kind])
        m = results["summary"][kind]
        lines.append(f"{label:<22} {per_seed:<24} mean {m['mean']:.1f} +- {m['std']:.1f}  ({m['wall_s']:.0f} s/run)")
    lines.append(
        f"DaskPPO's mean within PPO's per-seed spread: {'yes' if results['within_spread'] else 'no'}"
        f"; at least PPO's worst seed: {'yes' if results['not_below'] else 'NO'}"
    )
    return "\n".join(lines)
