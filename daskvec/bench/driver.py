"""The benchmark run: every selected scenario's cases on every selected vec env, then the dashboard."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import importlib
import logging
import os
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from daskvec.bench import source
from daskvec.bench.envs import action_cycle
from daskvec.bench.machine import load_average, machine_info, wait_idle
from daskvec.bench.measure import _measure_case, _measure_training_case, busy_processes
from daskvec.bench.report import _add_ratios, write_results
from daskvec.bench.scenarios import (
    _ACTION_CYCLE,
    BASELINE,
    CONTENTION_BUSY,
    DEFAULT_ENVS,
    ENVPOOL_KINDS,
    LABELS,
    SCENARIOS,
    VEC_ENVS,
    WORKLOADS,
    BenchOptions,
    Case,
    _cases,
    missing_packages,
)

logger = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "run_benchmark"]

SCHEMA_VERSION = 1


def _prepare_imports(kinds: Sequence[str]) -> None:
    """Import what the vec envs need before any memory baseline is taken."""
    dask = any(k.startswith("dask") for k in kinds)
    for name in ("psutil", "stable_baselines3.common.vec_env", *(["daskvec.sb3.vec_env"] if dask else [])):
        importlib.import_module(name)


def run_benchmark(
    scenarios: Sequence[str] = SCENARIOS,
    vec_envs: Sequence[str] = VEC_ENVS,
    *,
    n_envs: Sequence[int] | None = None,
    dashboard: bool = False,
    dashboard_route: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    plot: bool = True,
    **settings: Any,
) -> dict[str, Any]:
    """Run the benchmark and return its results as data (docs/benchmark.md describes them).

    Parameters
    ----------
    scenarios, vec_envs : sequence of str
        Any of :data:`SCENARIOS` (``"all"``: all but the real workloads, :data:`WORKLOADS`, which
        ``"workloads"`` names) and of :data:`VEC_ENVS` (ratios need ``"subproc"``, the baseline).
    n_envs : sequence of int, optional
        Env counts for every scenario (the first one for training) instead of :data:`DEFAULT_ENVS`.
    dashboard, dashboard_route
        Also measure DaskVecEnv with the dashboard page open vs closed (from a source checkout).
    out_dir, plot
        Write ``bench-<timestamp>.json`` (and a PNG chart when ``plot``) and ``latest.*`` there.
    **settings
        The fields of :class:`BenchOptions` (``seconds``, ``steps``, ``repeat``, ``scheduler``, ...).

    Returns
    -------
    dict
        ``machine``, ``settings``, ``cases`` (per scenario and env count: a ``results`` entry
        per vec env, ratios to SubprocVecEnv), ``dashboard``, ``files``.

    Raises
    ------
    ValueError
        For an unknown scenario, vec env or transport, or non-positive durations;
        :class:`~daskvec.bench.source.InSourceOnly` for a benchmark of the source repository
        asked of an installed wheel.
    """
    opts = BenchOptions(**settings)
    chosen, kinds = _check_selection(scenarios, vec_envs, n_envs, dashboard)
    _prepare_imports(kinds)
    started = time.perf_counter()
    results = _new_results(opts, chosen, kinds, n_envs, dashboard)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for scenario in chosen:
        sizes = [int(n) for n in n_envs] if n_envs else list(DEFAULT_ENVS[scenario])
        for case_out in _scenario_cases(scenario, sizes, kinds, opts):
            results["cases"].append(case_out)
            _save(results, started, out_dir, stamp)  # an interrupted long run still leaves its results
    if dashboard:  # with the first env count, 8 by default
        dashboard_of = source.module("--dashboard").dashboard_entry
        results["dashboard"] = dict(dashboard_of(opts, int((n_envs or [8])[0]), dashboard_route))
    results["complete"] = True
    _save(results, started, out_dir, stamp, plot=plot)
    return results


def _check_selection(
    scenarios: Sequence[str], vec_envs: Sequence[str], n_envs: Sequence[int] | None = None, dashboard: bool = False
) -> tuple[list[str], list[str]]:
    """Check the selection; return the scenarios and vec env kinds to run, in run order."""
    unknown = [s for s in scenarios if s not in (*SCENARIOS, "all", "workloads", "none")]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {(*SCENARIOS, 'all', 'workloads', 'none')}")
    if not vec_envs or any(k not in VEC_ENVS for k in vec_envs):
        raise ValueError(f"vec_envs must be a non-empty subset of {VEC_ENVS}, not {list(vec_envs)}")
    if n_envs is not None and (not n_envs or any(int(n) < 1 for n in n_envs)):
        raise ValueError(f"n_envs must be positive env counts, not {n_envs!r}")
    for s in [*(set(scenarios) & set(source.IN_SOURCE)), *(["--dashboard"] if dashboard else [])]:
        source.require(s)  # named (not through "all"): needs a source checkout
    named = set(scenarios)
    named |= {s for s in SCENARIOS if s not in WORKLOADS} if "all" in named else set()
    named |= set(WORKLOADS) if "workloads" in named else set()
    return [s for s in SCENARIOS if s in named], [k for k in VEC_ENVS if k in vec_envs]


def _new_results(
    opts: BenchOptions, chosen: list[str], kinds: list[str], n_envs: Sequence[int] | None, dashboard: bool
) -> dict[str, Any]:
    """The results of a run before any case: machine, settings, and ``complete`` still ``False``."""
    return {
        "schema": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            **dataclasses.asdict(opts),
            "scenarios": chosen,
            "vec_envs": kinds,
            "baseline": BASELINE,
            "n_envs": list(n_envs) if n_envs else None,
            "dashboard": dashboard,
        },
        "cases": [],
        "dashboard": None,
        "files": {},
        "complete": False,
    }


def _save(
    results: dict[str, Any], started: float, out_dir: str | os.PathLike[str] | None, stamp: str, plot: bool = False
) -> None:
    """Record the run's duration so far and the load average now; write the results in ``out_dir`` (if any)."""
    results["duration_s"] = time.perf_counter() - started
    results["load_average_end"] = load_average()
    if out_dir is not None:
        write_results(results, out_dir, plot=plot, stamp=stamp)


def _scenario_cases(scenario: str, sizes: list[int], kinds: list[str], opts: BenchOptions) -> Iterator[dict[str, Any]]:
    """Measure one scenario's cases on every vec env, yielding each case as it is done."""
    missing = missing_packages(scenario)
    if missing:  # a workload whose packages are absent: said once, nothing else fails
        yield _skipped(scenario, sizes[0], f"needs {', '.join(missing)}: pip install 'daskvec[workloads]'")
    elif scenario in ("training", "contention"):
        yield _training_case(sizes[0], kinds, opts, contention=scenario == "contention")
    elif scenario not in source.IN_SOURCE:
        yield from (_stepping_case(case, kinds, opts) for case in _cases(scenario, sizes, opts.heavy_step_s))
    elif source.benchmarks_dir() is None:
        yield _skipped(scenario, sizes[0], "a benchmark of the source repository (benchmarks/), run from a checkout")
    else:  # gym-faces, straggler, groups: by their modules in benchmarks/
        yield from source.module(scenario).scenario_cases(scenario, sizes, kinds, opts)


def _skipped(scenario: str, n: int, why: str) -> dict[str, Any]:
    return {"scenario": scenario, "case": scenario, "n_envs": n, "results": {}, "skipped": why}


def _measure_kinds(
    case_out: dict[str, Any], kinds: list[str], measure: Callable[[str], dict[str, Any]], settle: float
) -> None:
    """``measure`` each kind into ``case_out["results"]``: a failure is that kind's error entry.

    Before each kind the CPU gets up to ``settle`` seconds to go idle (``settle_s``: the wait).
    """
    for kind in kinds:
        waited, idle = wait_idle(settle)
        if not idle:
            logger.warning(
                "bench: the CPU was still busy after %.0f s before %s; its figures may be low",
                settle,
                LABELS.get(kind, kind),
            )
        try:
            case_out["results"][kind] = {**measure(kind), "settle_s": round(waited, 2)}
        except Exception as e:
            logger.exception("bench: %s failed", LABELS.get(kind, kind))
            case_out["results"][kind] = {"error": f"{type(e).__name__}: {e}"}


def _training_case(n: int, kinds: list[str], opts: BenchOptions, contention: bool = False) -> dict[str, Any]:
    """PPO with ``n`` envs on every SB3 vec env, with the ratios.

    ``contention``: PPO for ``opts.contention_timesteps`` while :data:`CONTENTION_BUSY`
    busy-loop processes compete for the cores, from before each vec env is built to after its run.
    """
    scenario = "contention" if contention else "training"
    if contention:
        opts = dataclasses.replace(opts, training_timesteps=opts.contention_timesteps)
    env = f"CartPole-v1 (PPO{f', {CONTENTION_BUSY} busy-loop processes beside' if contention else ''})"
    case_out: dict[str, Any] = {
        "scenario": scenario,
        "case": f"{scenario}-{n}",
        "env": env,
        "n_envs": n,
        "timesteps": opts.training_timesteps,
        "results": {},
    }

    def measure(kind: str) -> dict[str, Any]:
        if kind == "async":
            return {"skipped": "AsyncVectorEnv is not a Stable-Baselines3 VecEnv"}
        with busy_processes(CONTENTION_BUSY if contention else 0):
            return _measure_training_case(kind, n, opts)

    _measure_kinds(case_out, [k for k in kinds if k not in ENVPOOL_KINDS], measure, opts.settle)
    _add_ratios(case_out)
    return case_out


def _stepping_case(case: Case, kinds: list[str], opts: BenchOptions) -> dict[str, Any]:
    """Step ``case`` on every vec env with the same seeded actions, with the ratios."""
    probe_env = case.make()
    actions = action_cycle(probe_env.action_space, case.n_envs, _ACTION_CYCLE, opts.seed)
    probe_env.close()
    cores = opts.cores
    case_out: dict[str, Any] = {
        "scenario": case.scenario,
        "case": case.name,
        "env": case.env,
        "n_envs": case.n_envs,
        "ideal_steps_per_s": cores / opts.heavy_step_s if case.scenario == "heavy" else None,
        "cores": cores,
        "results": {},
    }

    def measure(kind: str) -> dict[str, Any]:
        if kind in ENVPOOL_KINDS and missing_packages("envpool"):
            return {"skipped": "envpool is not installed (pip install envpool)"}
        return _measure_case(kind, case, actions, opts)

    # the EnvPool kinds only where the env has an EnvPool counterpart
    _measure_kinds(case_out, [k for k in kinds if case.envpool_task or k not in ENVPOOL_KINDS], measure, opts.settle)
    results = case_out["results"]
    pool, on_pool = results.get("envpool", {}), results.get("dask-envpool", {})
    if pool.get("steps_per_s") and on_pool.get("steps_per_s"):
        on_pool["of_envpool"] = on_pool["steps_per_s"] / pool["steps_per_s"]
    if case.python_ideal and results.get("dummy", {}).get("steps_per_s"):
        # a Python env steps at most this fast on this machine: every core as busy as one process
        case_out["ideal_steps_per_s"] = cores * results["dummy"]["steps_per_s"]
        case_out["ideal"] = f"{cores} cores x DummyVecEnv"
    _add_ratios(case_out)
    return case_out
