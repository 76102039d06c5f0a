"""Learning parity of collecting ahead: the same learner, synchronous and ``collect_ahead=1``, over seeds.

``python -m benchmarks.ahead_parity --seeds 0,1,2,3,4`` trains, for each seed, the
synchronous learner and the one collecting ahead (alternated, the order rotated with the
seed) and evaluates each deterministically (``--episodes`` on a seeded env of its own):

- ``ppo``: DaskPPO on CartPole-v1, 8 envs, RL Zoo's hyperparameters (constant rates),
  50,000 timesteps;
- ``sac``: DaskSAC on Pendulum-v1, 4 envs, RL Zoo's learning rate, collected 8 vec-steps
  at a time with 32 gradient steps (one per env-step, as RL Zoo's ``train_freq=1``), 20,000
  timesteps.

The test: a 95% bootstrap interval of the difference of the two modes' mean evaluations
(the seeds resampled, 10,000 times), and whether the asynchronous mean lies within the
synchronous runs' spread (their min to max). The JSON keeps every run.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.learning import ZOO_CARTPOLE
from benchmarks.learning_runs import alternated, evaluate, learning_client
from daskvec.bench.machine import machine_info

logger = logging.getLogger(__name__)

__all__ = ["bootstrap_difference", "run_parity"]

SAC_PENDULUM: dict[str, Any] = {"learning_rate": 1e-3, "train_freq": (8, "step"), "gradient_steps": 32}
SETTINGS = {
    "ppo": ("CartPole-v1", 8, 50_000, ZOO_CARTPOLE),
    "sac": ("Pendulum-v1", 4, 20_000, SAC_PENDULUM),
}


def bootstrap_difference(a: list[float], b: list[float], draws: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """A 95% bootstrap interval of ``mean(b) - mean(a)``, each resampled with replacement."""
    rng = np.random.default_rng(seed)
    x, y = np.asarray(a), np.asarray(b)
    diffs = rng.choice(y, (draws, len(y))).mean(axis=1) - rng.choice(x, (draws, len(x))).mean(axis=1)
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def _train(algo: str, ahead: int, seed: int, episodes: int, client: Any, timesteps: int) -> dict[str, Any]:
    from stable_baselines3.common.env_util import make_vec_env

    from daskvec.sb3 import DaskPPO, DaskSAC
    from daskvec.sb3.vec_env import DaskVecEnv

    env_id, n_envs, _, hyper = SETTINGS[algo]
    cls: Any = DaskPPO if algo == "ppo" else DaskSAC
    started = time.perf_counter()
    env = make_vec_env(
        env_id,
        n_envs=n_envs,
        seed=seed,
        vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
        vec_env_kwargs={"client": client},
    )
    try:
        model = cls("MlpPolicy", env, seed=seed, device="cpu", collect_ahead=ahead, **hyper)
        model.learn(timesteps)
    finally:
        env.close()
    wall = time.perf_counter() - started
    score = evaluate(model, env_id, episodes, seed=10_000 + seed)
    logger.info("parity: %s ahead=%d seed %d: %.1f in %.0fs", algo, ahead, seed, score, wall)
    return {"seed": seed, "collect_ahead": ahead, "mean_return": score, "wall_s": round(wall, 2)}


def run_parity(
    algo: str, seeds: list[int], episodes: int = 20, out_path: Path | None = None, timesteps: int | None = None
) -> dict[str, Any]:
    """Train ``algo`` synchronous and collecting ahead on every seed; the bootstrap test of their difference.

    ``timesteps`` replaces the algorithm's default (50,000 for PPO, 20,000 for SAC).
    """
    runs: list[dict[str, Any]] = []
    steps = SETTINGS[algo][2] if timesteps is None else timesteps
    with learning_client() as (client, _):
        for seed, ahead in alternated((0, 1), seeds):
            runs.append(_train(algo, ahead, seed, episodes, client, steps))
    sync = [r["mean_return"] for r in runs if r["collect_ahead"] == 0]
    ahead_ = [r["mean_return"] for r in runs if r["collect_ahead"] == 1]
    low, high = bootstrap_difference(sync, ahead_)
    env_id, n_envs, _, hyper = SETTINGS[algo]
    result = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {"algo": algo, "env": env_id, "n_envs": n_envs, "timesteps": steps, "episodes": episodes},
        "hyperparameters": {k: list(v) if isinstance(v, tuple) else v for k, v in hyper.items()},
        "runs": runs,
        "sync_mean": float(np.mean(sync)),
        "ahead_mean": float(np.mean(ahead_)),
        "difference_95": [low, high],
        "ahead_within_sync_spread": min(sync) <= float(np.mean(ahead_)) <= max(sync),
        "sync_wall_s_median": float(np.median([r["wall_s"] for r in runs if r["collect_ahead"] == 0])),
        "ahead_wall_s_median": float(np.median([r["wall_s"] for r in runs if r["collect_ahead"] == 1])),
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=sorted(SETTINGS), default="ppo")
    parser.add_argument("--seeds", default="0,1,2,3,4", help="comma-separated seeds (default 0,1,2,3,4)")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--timesteps", type=int, default=None, help="default: 50,000 (ppo), 20,000 (sac)")
    parser.add_argument("--out", default="bench-results/ahead-parity.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    seeds = [int(s) for s in args.seeds.split(",")]
    res = run_parity(args.algo, seeds, args.episodes, Path(args.out), args.timesteps)
    logger.info(
        "%s: synchronous %.1f, ahead %.1f; 95%% interval of the difference [%.1f, %.1f]; within spread: %s",
        args.algo,
        res["sync_mean"],
        res["ahead_mean"],
        *res["difference_95"],
        res["ahead_within_sync_spread"],
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
