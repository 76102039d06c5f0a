"""``python -m benchmarks.envpool_layout``: how to split an EnvPool over groups on one machine.

In each round, in one process, three ways to step the same number of EnvPool envs,
each for a window of ``--seconds``: EnvPool alone (as many threads as cores), then
``DaskVecEnv.from_vector_envs`` over **one** EnvPool with as many threads as cores (one
group), then over **one EnvPool per core** with one thread each (one group per
worker of the embedded cluster). Both vec envs live for the whole run, on the same
workers; the one not stepping is idle. Reported as env-steps/s and as fractions of
EnvPool alone, with their medians.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: EnvPool task -> envs stepped, as in ``daskvec bench``'s real workloads.
TASKS = {"Pong-v5": 32, "HalfCheetah-v5": 64}


def _rate(step: Callable[[Any], Any], actions: np.ndarray, seconds: float) -> float:
    for k in range(10):
        step(actions[k % len(actions)])
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        step(actions[k % len(actions)])
        k += 1
    return k * actions.shape[1] / (time.perf_counter() - t0)


def run(task: str, rounds: int, seconds: float, cores: int | None = None) -> dict[str, Any]:
    """Alternate the three layouts for ``rounds`` rounds; rates and fractions of EnvPool alone."""
    from daskvec import DaskVecEnv
    from daskvec.bench.envs import make_envpool

    n = TASKS[task]
    cores = cores or len(os.sched_getaffinity(0))
    per_core = [n // cores + (1 if k < n % cores else 0) for k in range(cores)]
    one = DaskVecEnv.from_vector_envs([functools.partial(make_envpool, task, n, 0, cores)])
    client = one._engine.client
    split = DaskVecEnv.from_vector_envs(
        [functools.partial(make_envpool, task, size, sum(per_core[:k]), 1) for k, size in enumerate(per_core)],
        client=client,
    )
    alone = make_envpool(task, n, 0, cores)
    rng = np.random.default_rng(0)
    space = alone.action_space
    if hasattr(space, "n"):
        actions = rng.integers(0, int(space.n), size=(64, n))
    else:
        actions = rng.uniform(space.low, space.high, size=(64, n, *space.shape)).astype(space.dtype)
    rows = []
    try:
        for venv in (one, split):
            venv.reset()
        alone.reset()
        for r in range(rounds):
            row: dict[str, Any] = {"round": r, "alone": _rate(alone.step, actions, seconds)}
            row["one_group"] = _rate(one.step, actions, seconds)
            row["group_per_core"] = _rate(split.step, actions, seconds)
            row["one_group_of_alone"] = row["one_group"] / row["alone"]
            row["group_per_core_of_alone"] = row["group_per_core"] / row["alone"]
            rows.append(row)
            logger.info(
                "round %d: EnvPool alone %.0f; one group %.0f (%.2f); a group per core %.0f (%.2f) env-steps/s",
                r,
                row["alone"],
                row["one_group"],
                row["one_group_of_alone"],
                row["group_per_core"],
                row["group_per_core_of_alone"],
            )
    finally:
        one.close()
        split.close()
        alone.close()
    return {
        "task": task,
        "envs": n,
        "cores": cores,
        "seconds": seconds,
        "rounds": rows,
        "median_one_group_of_alone": statistics.median(r["one_group_of_alone"] for r in rows),
        "median_group_per_core_of_alone": statistics.median(r["group_per_core_of_alone"] for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=sorted(TASKS), nargs="+", default=sorted(TASKS))
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    results = []
    for task in args.task:
        result = run(task, args.rounds, args.seconds)
        logger.info(
            "%s x%d, medians of EnvPool alone: one group %.2f, a group per core %.2f",
            task,
            result["envs"],
            result["median_one_group_of_alone"],
            result["median_group_per_core_of_alone"],
        )
        results.append(result)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
