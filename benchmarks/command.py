"""The benchmarks' part of ``daskvec bench``: the scenarios that run on their own, and ``--tls``.

:mod:`daskvec.bench.command` parses the options and calls :func:`run_own` or
:func:`run_tls` (through :mod:`daskvec.bench.source`); each prints its table and writes
its JSON in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

__all__ = ["run_own", "run_tls"]


def run_own(args: argparse.Namespace) -> int:
    """Run the ``hosts``, ``ceiling``, ``learning``, ``learning-offpolicy`` and/or ``time-to-reward`` scenarios."""
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if "hosts" in args.scenario and _hosts(args):
        return 2
    if "ceiling" in args.scenario:
        _ceiling(args)
    if "learning" in args.scenario:
        from benchmarks.learning import format_learning_table, run_learning_check

        out = Path(args.out) / "learning-check.json"
        res = run_learning_check(args.learning_seeds, scheduler=args.scheduler, out_path=out)
        print(format_learning_table(res))
        print(f"json: {out}")
    if "time-to-reward" in args.scenario:
        _time_to_reward(args)
    if "learning-offpolicy" in args.scenario:
        from benchmarks.offpolicy_learning import format_offpolicy_table, run_offpolicy_learning_check

        out = Path(args.out) / "offpolicy-learning-check.json"
        off = run_offpolicy_learning_check(args.learning_seeds, scheduler=args.scheduler, out_path=out)
        print(format_offpolicy_table(off))
        print(f"json: {out}")
    return 0


def _time_to_reward(args: argparse.Namespace) -> None:
    from benchmarks.time_to_reward import format_time_to_reward_table, plot_curves, run_time_to_reward

    delay = args.env_delay / 1000
    cpus = getattr(args, "ttr_hosts_cpus", None)
    if cpus is not None and not args.ttr_rtt:
        raise SystemExit("--ttr-hosts-cpus pins the emulated hosts' processes: give --ttr-rtt too")
    for rtt in args.ttr_rtt or [None]:
        name = f"time-to-reward-delay-{args.env_delay:g}ms" + ("" if rtt is None else f"-rtt-{rtt:g}ms")
        name += "" if cpus is None else f"-hosts-cpu-{cpus}"
        out = Path(args.out) / f"{name}.json"
        res = run_time_to_reward(
            args.ttr_cases,
            args.learning_seeds,
            env_delay=delay,
            scheduler=args.scheduler,
            out_path=out,
            rtt_ms=rtt,
            hosts_cpus=cpus,
        )
        print(format_time_to_reward_table(res))
        print(f"json: {out}")
        if not args.no_plot:
            try:
                print(f"plot: {plot_curves(res, out.with_suffix('.png'))}")
            except ImportError:
                print('plot: skipped (matplotlib is not installed: pip install -e ".[bench]")')


def _hosts(args: argparse.Namespace) -> int:
    from benchmarks.across import format_across_table, run_across_hosts

    try:
        res = run_across_hosts(
            args.rtt,
            n_hosts=args.hosts,
            n_envs=(args.envs or [64])[0],
            seconds=args.seconds,
            n_steps=args.rollout_steps,
            repeat=max(args.repeat, 2),
            seed=args.seed,
            out_dir=args.out,
        )
    except RuntimeError as e:
        print(f"daskvec bench: {e}", file=sys.stderr)
        return 2
    print(format_across_table(res))
    print(f"json: {res['files']['json']}")
    return 0


def _ceiling(args: argparse.Namespace) -> None:
    from benchmarks.ceiling import format_ceiling_table, run_ceiling
    from daskvec.bench.scenarios import missing_packages

    for workload, default_envs in (("mujoco", 64), ("atari", 16)):
        if missing_packages(workload):
            print(f"ceiling {workload}: skipped, needs {', '.join(missing_packages(workload))}")
            continue
        res = run_ceiling(
            workload,
            (args.envs or [default_envs])[0],
            seconds=max(args.seconds, 2.0),
            warmup=args.warmup,
            rounds=max(args.repeat, 3),
            seed=args.seed,
        )
        out = Path(args.out) / f"ceiling-{workload}.json"
        out.write_text(json.dumps(res, indent=1, default=str))
        print(format_ceiling_table(res))
        print(f"json: {out}")


def run_tls(args: argparse.Namespace) -> int:
    """``daskvec bench --tls``: print the table, write ``tls.json`` in ``--out``."""
    from benchmarks.tls import format_tls_table, run_tls_benchmark

    result = run_tls_benchmark(n_envs=(args.envs or [8])[0], seconds=args.seconds, warmup=args.warmup, seed=args.seed)
    print(format_tls_table(result))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / "tls.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"json: {path}")
    return 1 if any("error" in r for r in result["results"].values()) else 0
