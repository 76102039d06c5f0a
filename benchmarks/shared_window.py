"""``python -m benchmarks.shared_window``: observations through the shared window, or on the socket.

One vec env, one embedded cluster: each round times a window of stepping with the
shared window on and one with it off (in alternating order), switched on the workers
between windows by raising the codec's threshold (``WINDOW_MIN_BYTES``, a private
constant, as ``benchmarks/masks.py`` reads private counters). The same envs, the
same groups, the same processes: only the path of the observations differs. Reported
as env-steps/s per round and the ratio on/off, with the median.

Workloads: ``envpool`` (2 groups of EnvPool ``Pong-v5`` x16, 451 KB of frame stacks per
group and step) and ``atari`` (SB3's ``AtariWrapper`` x16 in 2 groups of 8,
``VecFrameStack(4)`` on the client: 56 KB per group, below the window's threshold unless
``--threshold`` lowers it).
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
from typing import Any

import numpy as np

from benchmarks._timing import rate, write_json

logger = logging.getLogger(__name__)

#: A threshold no observation reaches: the window is off.
OFF = 1 << 60


def set_threshold(value: int) -> int:
    """On a worker: observations of at least ``value`` bytes go through the window."""
    import daskvec.transport.codec as codec

    codec.WINDOW_MIN_BYTES = value
    return value


def build(workload: str) -> tuple[Any, Any, int]:
    """The vec env to step (wrapped as a user would), its DaskVecEnv, and its number of envs."""
    from daskvec import DaskVecEnv
    from daskvec.bench.envs import make_atari, make_envpool

    if workload == "envpool":
        fns = [functools.partial(make_envpool, "Pong-v5", 16, 16 * k, 1) for k in range(2)]
        raw = DaskVecEnv.from_vector_envs(fns)
        return raw, raw, 32
    from stable_baselines3.common.vec_env import VecFrameStack

    raw = DaskVecEnv([functools.partial(make_atari, "PongNoFrameskip-v4")] * 16)
    return VecFrameStack(raw, 4), raw, 16


def run(workload: str, rounds: int, seconds: float, threshold: int) -> dict[str, Any]:
    """Alternate the window on and off for ``rounds`` rounds; the rates and ratios."""
    venv, raw, n = build(workload)
    client = raw._engine.client
    try:
        venv.seed(0)
        venv.reset()
        actions = np.random.default_rng(0).integers(0, 6, size=(64, n))
        rows = []
        for r in range(rounds):
            got = {}
            for name in ("off", "on") if r % 2 == 0 else ("on", "off"):
                client.run(set_threshold, threshold if name == "on" else OFF)
                got[name] = rate(venv, actions, seconds)
            rows.append({"round": r, **got, "ratio": got["on"] / got["off"]})
            logger.info(
                "round %d: off %.0f, on %.0f env-steps/s, ratio %.2f", r, got["off"], got["on"], rows[-1]["ratio"]
            )
    finally:
        venv.close()
    return {
        "workload": workload,
        "threshold": threshold,
        "seconds": seconds,
        "rounds": rows,
        "median_ratio": statistics.median(row["ratio"] for row in rows),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", choices=("envpool", "atari"), default="envpool")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--threshold", type=int, default=None, help="bytes (default: WINDOW_MIN_BYTES)")
    parser.add_argument("--out", default=None, help="write the result as JSON here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logger.setLevel(logging.INFO)
    from daskvec.transport.window import WINDOW_MIN_BYTES

    result = run(args.workload, args.rounds, args.seconds, args.threshold or WINDOW_MIN_BYTES)
    logger.info("median ratio on/off: %.3f", result["median_ratio"])
    write_json(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
