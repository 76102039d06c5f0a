"""``daskvec bench`` on the command line: options, quiet logs, the table, the exit code."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence

from daskvec.bench.driver import run_benchmark
from daskvec.bench.report import format_table
from daskvec.bench.scenarios import SCENARIOS, VEC_ENVS

__all__ = ["add_arguments", "main", "run"]


def _comma_list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _int_list(value: str) -> list[int]:
    try:
        out = [int(v) for v in _comma_list(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated env counts such as 8,64, not {value!r}") from None
    if not out or any(n < 1 for n in out):
        raise argparse.ArgumentTypeError(f"env counts must be positive, not {value!r}")
    return out


def _float_list(value: str) -> list[float]:
    try:
        out = [float(v) for v in _comma_list(value)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds such as 0,2,10, not {value!r}") from None
    if not out or any(x < 0 for x in out):
        raise argparse.ArgumentTypeError(f"round trips must be >= 0 ms, not {value!r}")
    return out


#: Scenarios that run on their own, outside ``all`` (issue 13), and the Python-ceiling analysis.
OWN_RUN = ("hosts", "learning", "learning-offpolicy", "ceiling")


def _run_own(args: argparse.Namespace) -> int:
    """Run the ``hosts``, ``learning`` and/or ``learning-offpolicy`` scenarios; print their tables."""
    from pathlib import Path

    if "hosts" in args.scenario:
        from benchmarks.across import format_across_table, run_across_hosts

        try:
            res = run_across_hosts(args.rtt, n_hosts=args.hosts, n_envs=(args.envs or [64])[0], seconds=args.seconds,
                                   n_steps=args.rollout_steps, repeat=max(args.repeat, 2), seed=args.seed,
                                   out_dir=args.out)  # fmt: skip
        except RuntimeError as e:
            print(f"daskvec bench: {e}", file=sys.stderr)
            return 2
        print(format_across_table(res))
        print(f"json: {res['files']['json']}")
    if "ceiling" in args.scenario:
        import json

        from benchmarks.ceiling import format_ceiling_table, run_ceiling
        from daskvec.bench.scenarios import missing_packages

        Path(args.out).mkdir(parents=True, exist_ok=True)
        for workload, default_envs in (("mujoco", 64), ("atari", 16)):
            if missing_packages(workload):
                print(f"ceiling {workload}: skipped, needs {', '.join(missing_packages(workload))}")
                continue
            res = run_ceiling(workload, (args.envs or [default_envs])[0], seconds=max(args.seconds, 2.0),
                              warmup=args.warmup, rounds=max(args.repeat, 3), seed=args.seed)  # fmt: skip
            out = Path(args.out) / f"ceiling-{workload}.json"
            out.write_text(json.dumps(res, indent=1, default=str))
            print(format_ceiling_table(res))
            print(f"json: {out}")
    if "learning" in args.scenario:
        from benchmarks.learning import format_learning_table, run_learning_check

        out = Path(args.out) / "learning-check.json"
        res = run_learning_check(args.learning_seeds, scheduler=args.scheduler, out_path=out)
        print(format_learning_table(res))
        print(f"json: {out}")
    if "learning-offpolicy" in args.scenario:
        from benchmarks.offpolicy_learning import format_offpolicy_table, run_offpolicy_learning_check

        out = Path(args.out) / "offpolicy-learning-check.json"
        off = run_offpolicy_learning_check(args.learning_seeds, scheduler=args.scheduler, out_path=out)
        print(format_offpolicy_table(off))
        print(f"json: {out}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``daskvec bench`` options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The (sub)parser of the ``bench`` command.
    """
    parser.add_argument(
        "--scenario",
        nargs="+",
        default=["all"],
        choices=[*SCENARIOS, "all", "workloads", "none", *OWN_RUN],
        help="scenarios to run (default: all, which leaves out the real workloads atari, mujoco and "
        "contention: name them, or 'workloads'); 'none' with --dashboard runs only that; "
        "'hosts' (emulated hosts, needs root), 'learning', 'learning-offpolicy' and 'ceiling' (where "
        "DaskVecEnv's step time goes against the Python ceiling, mujoco and atari) run on their own",
    )
    parser.add_argument(
        "--vec-envs",
        type=_comma_list,
        default=list(VEC_ENVS),
        metavar="LIST",
        help=f"comma-separated vec envs to compare (default: {','.join(VEC_ENVS)})",
    )
    parser.add_argument(
        "--envs",
        type=_int_list,
        default=None,
        metavar="N[,N...]",
        help="env counts for every scenario instead of the defaults (light 8,64; heavy 8; images 16; "
        "groups 2,8,32,64 groups of one env; atari 16; mujoco 16,64; contention 8)",
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget of each timed window (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="fixed vec-steps per timed window instead of --seconds")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up before timing (default 0.5)")
    parser.add_argument("--repeat", type=int, default=1, help="independent runs per vec env; medians are reported")
    parser.add_argument("--seed", type=int, default=0, help="seed of envs, actions and PPO (default 0)")
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="Dask scheduler address for DaskVecEnv (default: embedded LocalCluster)",
    )
    parser.add_argument(
        "--transport", default="auto", choices=["auto", "direct", "actor"], help="DaskVecEnv transport (default auto)"
    )
    parser.add_argument(
        "--env-process",
        action="store_true",
        help="DaskVecEnv(env_process=True): envs in a process of their own beside each worker",
    )
    parser.add_argument(
        "--subproc-start-method",
        default=None,
        choices=["fork", "forkserver", "spawn"],
        help="SubprocVecEnv start method (default: its own, forkserver on Linux)",
    )
    parser.add_argument(
        "--async-context",
        default=None,
        choices=["fork", "forkserver", "spawn"],
        help="AsyncVectorEnv multiprocessing context (default: its own)",
    )
    parser.add_argument("--timesteps", type=int, default=25_000, help="PPO timesteps of the training scenario")
    parser.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes after training")
    parser.add_argument(
        "--contention-timesteps", type=int, default=8192, help="PPO timesteps of the contention scenario (default 8192)"
    )
    parser.add_argument(
        "--dashboard",
        action="store_true",
        help="also measure DaskVecEnv with the daskvec dashboard page open vs closed",
    )
    parser.add_argument("--dashboard-route", default=None, help="route of the page if it cannot be discovered")
    parser.add_argument(
        "--out",
        default="bench-results",
        metavar="DIR",
        help="directory for the JSON and PNG results (default bench-results)",
    )
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG chart")
    # issue 13: across emulated hosts, and the learning check
    parser.add_argument(
        "--rtt",
        type=_float_list,
        default=[0.0, 2.0, 10.0],
        metavar="MS[,MS...]",
        help="hosts scenario: round trips the relay adds on each host (default 0,2,10)",
    )
    parser.add_argument("--hosts", type=int, default=2, help="hosts scenario: emulated worker hosts (default 2)")
    parser.add_argument(
        "--rollout-steps", type=int, default=128, help="hosts scenario: PPO n_steps per rollout (default 128)"
    )
    parser.add_argument(
        "--learning-seeds",
        type=_int_list,
        default=[0, 1, 2],
        metavar="S[,S...]",
        help="learning scenario: seeds (default 0,1,2)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="keep Dask's and daskvec's INFO log lines")
    parser.add_argument(
        "--tls",
        action="store_true",  # issue 15
        help="instead of the scenarios: the encrypted direct channel vs actor calls on a TLS "
        "cluster vs the plaintext direct channel (CartPole, --envs, default 8)",
    )


@contextlib.contextmanager
def _quiet_logs() -> Iterator[None]:
    """Raise Dask's and daskvec's loggers to WARNING while the benchmark runs.

    The embedded cluster's scheduler and nannies live in this process; their INFO
    lines would bury the table.
    """
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
    if getattr(args, "tls", False):
        return _run_tls(args, quiet)
    if any(s in OWN_RUN for s in args.scenario):
        with quiet:
            return _run_own(args)
    try:
        with quiet:
            results = run_benchmark(
                scenarios=args.scenario,
                vec_envs=args.vec_envs,
                n_envs=args.envs,
                seconds=args.seconds,
                steps=args.steps,
                warmup=args.warmup,
                repeat=args.repeat,
                seed=args.seed,
                scheduler=args.scheduler,
                transport=args.transport,
                env_process=args.env_process,
                subproc_start_method=args.subproc_start_method,
                async_context=args.async_context,
                training_timesteps=args.timesteps,
                eval_episodes=args.eval_episodes,
                contention_timesteps=args.contention_timesteps,
                dashboard=args.dashboard,
                dashboard_route=args.dashboard_route,
                out_dir=args.out,
                plot=not args.no_plot,
            )
    except ValueError as e:
        print(f"daskvec bench: {e}", file=sys.stderr)
        return 2
    print(format_table(results))
    for kind, path in results["files"].items():
        print(f"{kind}: {path}")
    failed = any("error" in r for c in results["cases"] for r in c["results"].values())
    failed = failed or bool(results.get("dashboard") and "error" in results["dashboard"])
    return 1 if failed else 0


def _run_tls(args: argparse.Namespace, quiet: contextlib.AbstractContextManager[None]) -> int:
    """``daskvec bench --tls``: print the table, write ``tls.json`` in ``--out``."""
    import json
    import os

    from benchmarks.tls import format_tls_table, run_tls_benchmark

    with quiet:
        result = run_tls_benchmark(n_envs=(args.envs or [8])[0], seconds=args.seconds, warmup=args.warmup,
                                   seed=args.seed)  # fmt: skip
    print(format_tls_table(result))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "tls.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=2)
    print(f"json: {path}")
    return 1 if any("error" in r for r in result["results"].values()) else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m daskvec.bench``."""
    doc = sys.modules[__package__].__doc__ if __package__ else None  # the package's, as before the split
    parser = argparse.ArgumentParser(prog="daskvec bench", description=doc.split("\n\n")[0] if doc else None)
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))
