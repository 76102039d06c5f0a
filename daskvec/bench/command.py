"""``daskvec bench`` on the command line: options, quiet logs, the table, the exit code."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from daskvec.bench import source
from daskvec.bench.driver import run_benchmark
from daskvec.bench.report import format_table
from daskvec.bench.scenarios import SCENARIOS, VEC_ENVS, BenchOptions

__all__ = ["add_arguments", "main", "run"]


def _comma_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _number_list(kind: type[int] | type[float], example: str, low: float) -> Callable[[str], list[Any]]:
    """An argparse type: comma-separated ``kind`` numbers, each at least ``low``."""

    def parse(value: str) -> list[Any]:
        try:
            out = [kind(v) for v in _comma_list(value)]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected numbers such as {example}, not {value!r}") from None
        if not out or any(x < low for x in out):
            raise argparse.ArgumentTypeError(f"expected numbers of at least {low:g}, not {value!r}")
        return out

    return parse


#: Scenarios that run on their own, outside ``all``: the across-hosts, learning and Python-ceiling
#: benchmarks of the source repository (:mod:`daskvec.bench.source`).
OWN_RUN = ("hosts", "learning", "learning-offpolicy", "ceiling", "time-to-reward")

_SCENARIO_HELP = (
    "scenarios to run (default: all, which leaves out the real workloads atari, mujoco and contention: name "
    "them, or 'workloads'); 'none' with --dashboard runs only that. From a source checkout only (benchmarks/): "
    "gym-faces, straggler and groups (in 'all' there), and, on their own, 'hosts' (emulated hosts, needs root), "
    "'learning', 'learning-offpolicy', 'ceiling' (DaskVecEnv's step time against the Python ceiling) and "
    "'time-to-reward' (seconds until an evaluation reaches a threshold, learners synchronous and collecting ahead)"
)
_ENVS_HELP = (
    "env counts for every scenario instead of the defaults (light 8,64; heavy 8; images 16; groups 2,8,32,64 "
    "groups of one env; atari 16; mujoco 16,64; contention 8)"
)
_STARTS = ["fork", "forkserver", "spawn"]

#: ``daskvec bench``'s options after --scenario, --vec-envs and --envs: flags and ``add_argument`` keywords.
_OPTIONS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--seconds",), {"type": float, "default": 2.0, "help": "time budget of each timed window (default 2)"}),
    (("--steps",), {"type": int, "default": None, "help": "fixed vec-steps per timed window instead of --seconds"}),
    (("--warmup",), {"type": float, "default": 0.5, "help": "seconds of warm-up before timing (default 0.5)"}),
    (("--repeat",), {"type": int, "default": 1, "help": "independent runs per vec env; medians are reported"}),
    (
        ("--settle",),
        {
            "type": float,
            "default": 20.0,
            "metavar": "SECONDS",
            "help": "before each vec env, wait up "
            "to this long for the CPU to be idle (processes of the one before exiting; default 20, 0: no)",
        },
    ),
    (("--seed",), {"type": int, "default": 0, "help": "seed of envs, actions and PPO (default 0)"}),
    (
        ("--scheduler",),
        {
            "default": None,
            "metavar": "ADDRESS",
            "help": "Dask scheduler address for DaskVecEnv (default: embedded LocalCluster)",
        },
    ),
    (
        ("--transport",),
        {"default": "auto", "choices": ["auto", "direct", "actor"], "help": "DaskVecEnv transport (default auto)"},
    ),
    (
        ("--env-process",),
        {
            "action": "store_true",
            "help": "DaskVecEnv(env_process=True): envs in a process of their own beside each worker",
        },
    ),
    (
        ("--subproc-start-method",),
        {
            "default": None,
            "choices": _STARTS,
            "help": "SubprocVecEnv start method (default: its own, forkserver on Linux)",
        },
    ),
    (
        ("--async-context",),
        {"default": None, "choices": _STARTS, "help": "AsyncVectorEnv multiprocessing context (default: its own)"},
    ),
    (
        ("--timesteps",),
        {
            "type": int,
            "default": 25_000,
            "dest": "training_timesteps",
            "metavar": "TIMESTEPS",
            "help": "PPO timesteps of the training scenario",
        },
    ),
    (("--eval-episodes",), {"type": int, "default": 10, "help": "evaluation episodes after training"}),
    (
        ("--contention-timesteps",),
        {"type": int, "default": 8192, "help": "PPO timesteps of the contention scenario (default 8192)"},
    ),
    (
        ("--out",),
        {
            "default": "bench-results",
            "metavar": "DIR",
            "help": "directory for the JSON and PNG results (default bench-results)",
        },
    ),
    (("--no-plot",), {"action": "store_true", "help": "skip the PNG chart"}),
    (("-v", "--verbose"), {"action": "store_true", "help": "keep Dask's and daskvec's INFO log lines"}),
    # the benchmarks of the source repository (benchmarks/): run from a checkout only
    (
        ("--dashboard",),
        {
            "action": "store_true",
            "help": "also measure DaskVecEnv with the daskvec dashboard page open vs closed (checkout)",
        },
    ),
    (("--dashboard-route",), {"default": None, "help": "route of the page if it cannot be discovered"}),
    (
        ("--tls",),
        {
            "action": "store_true",
            "help": "instead of the scenarios: the encrypted direct channel vs actor "
            "calls on a TLS cluster vs the plaintext direct channel (CartPole, --envs, default 8; checkout)",
        },
    ),
    (
        ("--rtt",),
        {
            "type": _number_list(float, "0,2,10", 0),
            "default": [0.0, 2.0, 10.0],
            "metavar": "MS[,MS...]",
            "help": "hosts scenario: round trips the relay adds on each host (default 0,2,10)",
        },
    ),
    (("--hosts",), {"type": int, "default": 2, "help": "hosts scenario: emulated worker hosts (default 2)"}),
    (
        ("--rollout-steps",),
        {"type": int, "default": 128, "help": "hosts scenario: PPO n_steps per rollout (default 128)"},
    ),
    (
        ("--learning-seeds",),
        {
            "type": _number_list(int, "0,1,2", 0),
            "default": [0, 1, 2],
            "metavar": "S[,S...]",
            "help": "learning scenarios: seeds (default 0,1,2)",
        },
    ),
    (
        ("--ttr-cases",),
        {
            "type": lambda s: [c for c in s.split(",") if c],
            "default": ["ppo-dummy", "daskppo", "daskppo-ahead"],
            "metavar": "CASE[,CASE...]",
            "help": "time-to-reward: the cases, the first the ratios' reference (default ppo-dummy,daskppo,"
            "daskppo-ahead; also ppo-subproc, ppo-dask, sac-dummy, sac-subproc, dasksac, dasksac-ahead)",
        },
    ),
    (
        ("--env-delay",),
        {
            "type": float,
            "default": 0.0,
            "metavar": "MS",
            "help": "time-to-reward: milliseconds each env step waits (a simulator elsewhere; default 0: CPU only)",
        },
    ),
    (
        ("--ttr-rtt",),
        {
            "type": _number_list(float, "0,2,10", 0),
            "default": None,
            "metavar": "MS[,MS...]",
            "help": "time-to-reward: run daskvec's workers on 2 emulated hosts (root) at each of these round "
            "trips, one run and JSON per value (default: an embedded LocalCluster)",
        },
    ),
    (
        ("--ttr-hosts-cpus",),
        {
            "default": None,
            "metavar": "CPUS",
            "help": "time-to-reward with --ttr-rtt: the emulated hosts' processes run on these CPUs only "
            "(taskset -c syntax, e.g. 1), keeping the envs' computing off the learner's core (default: any)",
        },
    ),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``daskvec bench`` options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The (sub)parser of the ``bench`` command.
    """
    scenarios = [*SCENARIOS, "all", "workloads", "none", *OWN_RUN]
    parser.add_argument(
        "--scenario",
        nargs="+",
        default=["all"],
        choices=scenarios,
        metavar="SCENARIO",
        help=f"one or more of: {', '.join(scenarios)}; {_SCENARIO_HELP}",
    )
    parser.add_argument(
        "--vec-envs",
        type=_comma_list,
        default=list(VEC_ENVS),
        metavar="LIST",
        help=f"comma-separated vec envs to compare (default: {','.join(VEC_ENVS)})",
    )
    parser.add_argument("--envs", type=_number_list(int, "8,64", 1), default=None, metavar="N[,N...]", help=_ENVS_HELP)
    for flags, kwargs in _OPTIONS:
        parser.add_argument(*flags, **kwargs)


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Raise Dask's and daskvec's loggers to WARNING while the benchmark runs (the embedded cluster's
    INFO lines would bury the table)."""
    names = ["distributed", "daskvec"] + [
        n for n in list(logging.root.manager.loggerDict) if n.startswith(("distributed.", "daskvec."))
    ]
    saved = {n: logging.getLogger(n).level for n in names}
    for n in names:
        log = logging.getLogger(n)
        if log.getEffectiveLevel() < logging.WARNING:
            log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for n, level in saved.items():
            logging.getLogger(n).setLevel(level)


def run(args: argparse.Namespace) -> int:
    """Run ``daskvec bench`` with parsed ``args``; print the table; return the exit code.

    Returns
    -------
    int
        0 when every measurement ran, 1 when any vec env failed (the others are still
        reported), 2 for invalid options.
    """
    quiet = _quiet_logs() if not getattr(args, "verbose", False) else contextlib.nullcontext()
    asked = "--tls" if getattr(args, "tls", False) else next((s for s in args.scenario if s in OWN_RUN), None)
    try:
        with quiet:
            if asked is not None:  # run by benchmarks/command.py, from a source checkout
                command = source.module(asked, "command")
                return int(command.run_tls(args) if asked == "--tls" else command.run_own(args))
            settings = {
                f.name: getattr(args, f.name) for f in dataclasses.fields(BenchOptions) if hasattr(args, f.name)
            }
            results = run_benchmark(
                args.scenario,
                args.vec_envs,
                n_envs=args.envs,
                dashboard=args.dashboard,
                dashboard_route=args.dashboard_route,
                out_dir=args.out,
                plot=not args.no_plot,
                **settings,
            )
    except ValueError as e:  # invalid options; InSourceOnly: a benchmark of the source repository asked of a wheel
        print(f"daskvec bench: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    for kind, path in results["files"].items():
        print(f"{kind}: {path}")
    if results.get("plot_skipped"):
        print(results["plot_skipped"])
    failed = any("error" in r for c in results["cases"] for r in c["results"].values())
    failed = failed or bool(results.get("dashboard") and "error" in results["dashboard"])
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m daskvec.bench``."""
    from daskvec import bench

    parser = argparse.ArgumentParser(prog="daskvec bench", description=(bench.__doc__ or "").split("\n\n")[0])
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))
