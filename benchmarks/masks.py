"""MaskablePPO on DaskVecEnv with and without the action-mask cache.

sb3-contrib's ``MaskablePPO`` calls ``env_method("action_masks")`` before every step.
With ``cache_action_masks=True`` (the default) the masks travel with the step replies
and that call costs no round trip; with ``False`` it costs one more round trip per group
per step. This script trains ``MaskablePPO`` on cheap maskable envs both ways, in
alternation on one cluster, and reports env-steps/s of the whole ``learn`` and of the
rollout collection alone (the part the cache speeds up): the medians over ``--repeat``
runs each way, and the median ratio of the back-to-back pairs (less exposed to a shared
machine's drift), with the client/transit/env split of each vec-step (the extra round
trip shows in the client's share: it happens between two steps).

.. code-block:: console

    $ python -m benchmarks.masks --n-envs 8 --timesteps 8192 --repeat 3

Needs ``sb3-contrib``. Workers import this module to build :class:`MaskedCycleEnv`, so
its top level imports only NumPy and Gymnasium.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["MaskedCycleEnv", "main", "measure", "run"]

logger = logging.getLogger(__name__)


class MaskedCycleEnv(gym.Env[np.ndarray, np.int64]):
    """A cheap env with action masks: 8 actions, of which 3 are forbidden in turn.

    The observation is the step count within the episode, one-hot over 8 slots; an
    episode lasts 100 steps; the reward is 1 for action ``t % 8``'s neighbour. Taking
    a forbidden action raises, so a learner working from stale masks fails loudly.
    """

    N_ACTIONS = 8

    def __init__(self, horizon: int = 100) -> None:
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(self.N_ACTIONS,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(self.N_ACTIONS)
        self.horizon = horizon
        self.t = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.N_ACTIONS, dtype=np.float32)
        obs[self.t % self.N_ACTIONS] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def action_masks(self) -> np.ndarray:
        mask = np.ones(self.N_ACTIONS, dtype=bool)
        mask[[(self.t + k) % self.N_ACTIONS for k in (0, 2, 5)]] = False
        return mask

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_masks()[int(action)]:
            raise RuntimeError(f"action {action} is masked at t={self.t}")
        reward = float(int(action) == (self.t + 1) % self.N_ACTIONS)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.horizon, {}


def _rollout_timer() -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutTimer(BaseCallback):
        """Seconds spent collecting rollouts (between rollout start and end)."""

        def __init__(self) -> None:
            super().__init__()
            self.seconds = 0.0
            self._start = 0.0

        def _on_rollout_start(self) -> None:
            self._start = time.perf_counter()

        def _on_rollout_end(self) -> None:
            self.seconds += time.perf_counter() - self._start

        def _on_step(self) -> bool:
            return True

    return RolloutTimer()


def measure(
    cache: bool, client: Any, n_envs: int, timesteps: int, seed: int = 0, **vec_env_kwargs: Any
) -> dict[str, Any]:
    """Train MaskablePPO for ``timesteps`` on ``n_envs`` MaskedCycleEnvs; return its rates.

    Returns
    -------
    dict
        ``cache``, ``env_steps_per_s`` (whole ``learn``), ``collect_env_steps_per_s``
        (rollout collection only), ``timesteps``, and ``mask_cache_hits``.
    """
    from sb3_contrib import MaskablePPO

    from daskvec.sb3.vec_env import DaskVecEnv

    env = DaskVecEnv([MaskedCycleEnv] * n_envs, client=client, cache_action_masks=cache, **vec_env_kwargs)
    try:
        model = MaskablePPO("MlpPolicy", env, device="cpu", seed=seed, n_steps=64, batch_size=256, n_epochs=1)
        timer = _rollout_timer()
        start = time.perf_counter()
        model.learn(timesteps, callback=timer)
        wall = time.perf_counter() - start
        steps = int(model.num_timesteps)
        hits = env._masks.hits
        t = env.timer
        split = {f"{k}_ms_per_vec_step": v / max(t.vec_steps, 1) * 1e3 for k, v in t.totals().items()}
    finally:
        env.close()
    return {
        "cache": cache,
        "timesteps": steps,
        "env_steps_per_s": steps / wall,
        "collect_env_steps_per_s": steps / max(timer.seconds, 1e-9),
        "mask_cache_hits": hits,
        **split,
    }


def run(
    n_envs: int, timesteps: int, repeat: int, scheduler: str | None = None, seed: int = 0, **vec_env_kwargs: Any
) -> dict[str, Any]:
    """Alternate runs with and without the cache on one cluster; medians and their ratio."""
    import torch
    from distributed import Client

    from daskvec.cluster.clients import embedded_cluster

    torch.set_num_threads(1)
    cluster = embedded_cluster() if scheduler is None else None
    try:
        with Client(cluster or scheduler, direct_to_workers=True, set_as_default=False) as client:
            measure(True, client, n_envs, min(timesteps, 2048), seed, **vec_env_kwargs)  # warm-up: imports, actors
            runs: list[dict[str, Any]] = []
            for k in range(repeat):
                for cache in (True, False) if k % 2 == 0 else (False, True):
                    runs.append(measure(cache, client, n_envs, timesteps, seed, **vec_env_kwargs))
                    logger.info("%s", runs[-1])
            workers = len(client.scheduler_info()["workers"])
    finally:
        if cluster is not None:
            cluster.close()
    out: dict[str, Any] = {
        "n_envs": n_envs,
        "timesteps": timesteps,
        "repeat": repeat,
        "workers": workers,
        "options": vec_env_kwargs,
        "load_average": os.getloadavg(),
        "runs": runs,
    }
    for key in ("env_steps_per_s", "collect_env_steps_per_s"):
        on = statistics.median(r[key] for r in runs if r["cache"])
        off = statistics.median(r[key] for r in runs if not r["cache"])
        # each pair ran back to back, so its ratio is less exposed to the machine's drift
        pairs = [a[key] / b[key] if a["cache"] else b[key] / a[key] for a, b in zip(runs[::2], runs[1::2], strict=True)]
        out[key] = {"cache": on, "no_cache": off, "ratio": statistics.median(pairs), "pair_ratios": pairs}
    for part in ("client", "transit", "env"):
        key = f"{part}_ms_per_vec_step"
        out[key] = {
            c: statistics.median(r[key] for r in runs if r["cache"] is (c == "cache")) for c in ("cache", "no_cache")
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.masks``: print the medians (and write JSON with ``--out``)."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.masks", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-envs", type=int, default=8, help="envs (default 8)")
    parser.add_argument("--timesteps", type=int, default=8192, help="MaskablePPO timesteps per run (default 8192)")
    parser.add_argument("--repeat", type=int, default=3, help="runs with and without the cache (default 3)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS", help="default: an embedded LocalCluster")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--busy-poll", type=float, default=None, help="DaskVecEnv's busy_poll (default: its own)")
    parser.add_argument("--envs-per-actor", type=int, default=None, help="DaskVecEnv's envs_per_actor")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="also write the results there")
    args = parser.parse_args(argv)
    if min(args.n_envs, args.timesteps, args.repeat) < 1:
        parser.error("--n-envs, --timesteps and --repeat must be positive")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from daskvec.bench.command import _quiet_logs

    with _quiet_logs():  # the embedded cluster's INFO lines would bury the figures
        options = {"envs_per_actor": args.envs_per_actor}
        if args.busy_poll is not None:
            options["busy_poll"] = args.busy_poll
        results = run(args.n_envs, args.timesteps, args.repeat, args.scheduler, args.seed, **options)
    print(
        f"MaskablePPO, {args.n_envs} MaskedCycleEnvs on {results['workers']} workers, "
        f"{args.timesteps} timesteps x {args.repeat} runs each (medians):"
    )
    for key, label in (("env_steps_per_s", "learn()"), ("collect_env_steps_per_s", "rollout collection")):
        r = results[key]
        pairs = ", ".join(f"{x:.2f}" for x in r["pair_ratios"])
        print(
            f"  {label:20s} cache {r['cache']:8.0f}  no cache {r['no_cache']:8.0f}  env-steps/s  "
            f"median ratio of back-to-back pairs {r['ratio']:.2f}x (pairs: {pairs})"
        )
    split = {
        c: "/".join(f"{results[f'{p}_ms_per_vec_step'][c]:.2f}" for p in ("client", "transit", "env"))
        for c in ("cache", "no_cache")
    }
    print(f"  ms per vec-step, client/transit/env: cache {split['cache']}, no cache {split['no_cache']}")
    print(f"load average at the end: {', '.join(f'{x:.1f}' for x in results['load_average'])}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)
        print(f"json: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
