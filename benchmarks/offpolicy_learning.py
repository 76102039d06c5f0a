"""The off-policy learning check: DaskSAC and DaskDQN against SAC and DQN on the same seeds.

``daskvec bench --scenario learning-offpolicy`` (or :func:`run_offpolicy_learning_check`)
trains, for seeds 0, 1 and 2, SB3's algorithm on ``DummyVecEnv`` and its daskvec
counterpart on a :class:`~daskvec.DaskVecEnv` (collections on the workers), with the
same hyperparameters, envs and timesteps:

- ``sac``: SAC on Pendulum-v1, 4 envs, 20,000 timesteps, RL Zoo's learning rate
  (1e-3); ``train_freq=(8, "step")`` with ``gradient_steps=32``, one gradient step per
  env-step as in the Zoo's single-env setting;
- ``dqn``: DQN on CartPole-v1, 4 envs, 50,000 timesteps, RL Zoo's hyperparameters with
  ``train_freq=(64, "step")`` (256 env-steps, as the Zoo's 256 with one env) and
  ``gradient_steps=128``.

Each model is evaluated deterministically for 20 episodes on a seeded env. The check
passes when the daskvec mean (over the seeds) lies within the spread (min to max) of
SB3's per-seed rewards.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.learning_runs import alternated, evaluate, learning_client
from daskvec.bench.machine import machine_info

logger = logging.getLogger(__name__)

__all__ = ["OFF_POLICY_TASKS", "format_offpolicy_table", "run_offpolicy_learning_check"]

#: Per task: the env, envs, timesteps and hyperparameters (RL Zoo's, adapted to 4 envs).
OFF_POLICY_TASKS: dict[str, dict[str, Any]] = {
    "sac": {
        "env": "Pendulum-v1",
        "n_envs": 4,
        "timesteps": 20_000,
        "hyperparameters": {"learning_rate": 1e-3, "train_freq": (8, "step"), "gradient_steps": 32},
    },
    "dqn": {
        "env": "CartPole-v1",
        "n_envs": 4,
        "timesteps": 50_000,
        "hyperparameters": {
            "learning_rate": 2.3e-3,
            "batch_size": 64,
            "buffer_size": 100_000,
            "learning_starts": 1000,
            "gamma": 0.99,
            "target_update_interval": 10,
            "train_freq": (64, "step"),
            "gradient_steps": 128,
            "exploration_fraction": 0.16,
            "exploration_final_eps": 0.04,
            "policy_kwargs": {"net_arch": [256, 256]},
        },
    },
}


def _train(task: str, dask: bool, seed: int, episodes: int, client: Any) -> dict[str, Any]:
    from stable_baselines3 import DQN, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    from daskvec.sb3 import DaskDQN, DaskSAC
    from daskvec.sb3.vec_env import DaskVecEnv

    spec = OFF_POLICY_TASKS[task]
    t0 = time.perf_counter()
    if dask:
        env = make_vec_env(
            spec["env"],
            n_envs=spec["n_envs"],
            seed=seed,
            vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
            vec_env_kwargs={"client": client},
        )
        cls: Any = {"sac": DaskSAC, "dqn": DaskDQN}[task]
    else:
        env = make_vec_env(spec["env"], n_envs=spec["n_envs"], seed=seed, vec_env_cls=DummyVecEnv)
        cls = {"sac": SAC, "dqn": DQN}[task]
    try:
        hyper = {k: dict(v) if isinstance(v, dict) else v for k, v in spec["hyperparameters"].items()}
        model = cls("MlpPolicy", env, seed=seed, device="cpu", **hyper)
        model.learn(spec["timesteps"])
    finally:
        env.close()
    wall = time.perf_counter() - t0
    reward = evaluate(model, spec["env"], episodes, seed=10_000 + seed)
    logger.info(
        "off-policy learning check: %s%s seed %d: %.1f in %.0fs", "dask" if dask else "", task, seed, reward, wall
    )
    return {"seed": seed, "mean_reward": reward, "wall_s": wall}


def _summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    r = np.array([row["mean_reward"] for row in rows])
    wall = float(np.mean([row["wall_s"] for row in rows]))
    return {
        "mean": float(r.mean()),
        "std": float(r.std()),
        "min": float(r.min()),
        "max": float(r.max()),
        "wall_s": wall,
    }


def run_offpolicy_learning_check(
    seeds: Sequence[int] = (0, 1, 2),
    tasks: Sequence[str] = ("sac", "dqn"),
    *,
    eval_episodes: int = 20,
    scheduler: str | None = None,
    out_path: str | Path | None = None,
) -> dict[str, Any]:
    """Train each task's SB3 algorithm (DummyVecEnv) and its daskvec counterpart (DaskVecEnv) per seed.

    Parameters
    ----------
    seeds : sequence of int
        Seeds of envs and models.
    tasks : sequence of str
        Keys of :data:`OFF_POLICY_TASKS`.
    eval_episodes : int
        Deterministic evaluation episodes per model.
    scheduler : str, optional
        Dask scheduler for DaskVecEnv (default: an embedded 2-worker LocalCluster).
    out_path : path, optional
        Where to write the results as JSON.

    Returns
    -------
    dict
        Per task: ``runs`` (``sb3`` and ``dask``, per seed), ``summary`` (mean, std,
        min, max, wall time) and ``within_spread``.
    """
    started = time.perf_counter()
    out: dict[str, Any] = {}
    with learning_client(scheduler) as (client, _):
        for task in tasks:
            runs: dict[str, list[dict[str, Any]]] = {"sb3": [], "dask": []}
            for seed, kind in alternated(list(runs), seeds):
                runs[kind].append(_train(task, kind == "dask", int(seed), eval_episodes, client))
            summary = {kind: _summary(rows) for kind, rows in runs.items()}
            sb3, dask = summary["sb3"], summary["dask"]
            within = sb3["min"] <= dask["mean"] <= sb3["max"]
            out[task] = {"runs": runs, "summary": summary, "within_spread": within}
    results = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            "seeds": list(seeds),
            "eval_episodes": eval_episodes,
            "tasks": {t: OFF_POLICY_TASKS[t] for t in tasks},
        },
        "tasks": out,
        "duration_s": time.perf_counter() - started,
    }
    if out_path is not None:
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(results, indent=2))
    return results


def format_offpolicy_table(results: dict[str, Any]) -> str:
    """The off-policy learning check as a plain-text table."""
    s = results["settings"]
    lines = [f"seeds {s['seeds']}, mean of {s['eval_episodes']} deterministic evaluation episodes"]
    for task, res in results["tasks"].items():
        spec = s["tasks"][task]
        lines.append(f"{task.upper()} on {spec['env']}, {spec['n_envs']} envs, {spec['timesteps']} timesteps")
        for kind, label in (("sb3", f"{task.upper()} + DummyVecEnv"), ("dask", f"Dask{task.upper()} + DaskVecEnv")):
            per_seed = ", ".join(f"{r['mean_reward']:.1f}" for r in res["runs"][kind])
            m = res["summary"][kind]
            lines.append(
                f"  {label:<24} {per_seed:<28} mean {m['mean']:.1f} +- {m['std']:.1f}  ({m['wall_s']:.0f} s/run)"
            )
        lines.append(f"  within SB3's per-seed spread: {'yes' if res['within_spread'] else 'no'}")
    return "\n".join(lines)
