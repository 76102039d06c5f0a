"""The benchmark run: every selected scenario's cases on every selected vec env, then the dashboard."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

from daskvec.bench import source
from daskvec.bench.envs import action_cycle
from daskvec.bench.machine import _usable_cores, machine_info
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
    Case,
    Options,
    _cases,
    missing_packages,
)

logger = logging.getLogger(__name__)

__all__ = ["SCHEMA_VERSION", "run_benchmark"]

SCHEMA_VERSION = 1


def _error_entry(kind: str, exc: BaseException) -> dict[str, Any]:
    logger.exception("bench: %s failed", LABELS.get(kind, kind))
    return {"error": f"{type(exc).__name__}: {exc}"}


def _prepare_imports(kinds: Sequence[str]) -> None:
    """Import what the vec envs need before any memory baseline is taken."""
    import psutil  # noqa: F401
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv  # noqa: F401

    if "dask" in kinds:
        import distributed  # noqa: F401

        import daskvec.vec_env  # noqa: F401


def run_benchmark(
    scenarios: Sequence[str] = SCENARIOS, vec_envs: Sequence[str] = VEC_ENVS, *, n_envs: Sequence[int] | None = None,
    seconds: float = 2.0, steps: int | None = None, warmup: float = 0.5, repeat: int = 1, seed: int = 0,
    scheduler: str | None = None, transport: str = "auto", env_process: bool = False,
    subproc_start_method: str | None = None, async_context: str | None = None, heavy_step_s: float = 1e-3,
    training_timesteps: int = 25_000, eval_episodes: int = 10, contention_timesteps: int = 8192,
    dashboard: bool = False, dashboard_route: str | None = None, out_dir: str | os.PathLike[str] | None = None,
    plot: bool = True,
) -> dict[str, Any]:  # fmt: skip
    """Run the benchmark and return its results as data.

    Parameters
    ----------
    scenarios : sequence of str
        Any of :data:`SCENARIOS`; ``"all"`` for every one but the real workloads
        (:data:`WORKLOADS`: ``atari``, ``mujoco``, ``contention``), ``"workloads"`` for those.
        ``gym-faces``, ``straggler`` and ``groups`` run from a source checkout only
        (:mod:`daskvec.bench.source`); ``"all"`` skips them elsewhere.
    vec_envs : sequence of str
        Any of :data:`VEC_ENVS`. Ratios need ``"subproc"`` (the baseline). The EnvPool
        kinds (``envpool``: EnvPool alone with a thread per core; ``dask-envpool``:
        :meth:`DaskVecEnv.from_vector_envs` over EnvPool groups) run only in the workload
        scenarios that have an EnvPool task, and are skipped when EnvPool is missing.
    n_envs : sequence of int, optional
        Env counts for every selected stepping scenario (the first one for training),
        instead of :data:`DEFAULT_ENVS`.
    seconds, steps, warmup, repeat, seed
        A time budget per timed window, or a fixed number of vec-steps (``steps``; the
        warm-up is then ``max(1, steps // 10)`` vec-steps); seconds of warm-up stepping
        before each window; independent runs per vec env (medians are reported); the
        seed of the envs (env ``i`` gets ``seed + i``), the actions and PPO.
    scheduler : str, optional
        Scheduler address for DaskVecEnv; ``None`` starts the embedded LocalCluster
        for each run, as ``DaskVecEnv(env_fns)`` does.
    transport, env_process, subproc_start_method, async_context
        DaskVecEnv's ``transport`` (``"auto"``, ``"direct"``, ``"actor"``) and ``env_process``;
        start methods of SubprocVecEnv and AsyncVectorEnv (``None``: their defaults).
    heavy_step_s, training_timesteps, eval_episodes, contention_timesteps
        CPU seconds per step of the heavy scenario's env; PPO timesteps and evaluation
        episodes of the training scenario; PPO timesteps of the contention scenario.
    dashboard, dashboard_route
        Also measure DaskVecEnv with the daskvec dashboard page open vs closed (from a
        source checkout); the page's route, when ``/individual-plots.json`` does not list it.
    out_dir, plot
        Write ``bench-<timestamp>.json`` in ``out_dir`` (if any; and a PNG chart when
        ``plot``: needs matplotlib), plus ``latest.json``/``latest.png``.

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
    given = locals()  # the Options fields among the arguments
    chosen, kinds = _check_selection(scenarios, vec_envs, transport, seconds, steps, warmup, repeat, n_envs, dashboard)
    opts = Options(**{f.name: given[f.name] for f in dataclasses.fields(Options) if f.name != "cores"},
                   cores=_usable_cores())  # fmt: skip
    _prepare_imports(kinds)
    started = time.perf_counter()
    results = _new_results(opts, chosen, kinds, n_envs, dashboard)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for scenario in chosen:
        sizes = [int(n) for n in n_envs] if n_envs else list(DEFAULT_ENVS[scenario])
        for case_out in _scenario_cases(scenario, sizes, kinds, opts, opts.cores):
            results["cases"].append(case_out)
            _save_partial(results, out_dir, started, stamp)
    if dashboard:
        results["dashboard"] = _dashboard_entry(opts, n_envs, dashboard_route)
    _stamp_end(results, started)
    results["complete"] = True
    if out_dir is not None:
        results["files"] = write_results(results, out_dir, plot=plot, stamp=stamp)
    return results


def _check_selection(
    scenarios: Sequence[str],
    vec_envs: Sequence[str],
    transport: str,
    seconds: float,
    steps: int | None,
    warmup: float,
    repeat: int,
    n_envs: Sequence[int] | None,
    dashboard: bool = False,
) -> tuple[list[str], list[str]]:
    """Check :func:`run_benchmark`'s options; return the scenarios and vec env kinds to run, in run order."""
    named = set(scenarios)
    if "all" in named:
        named |= {s for s in SCENARIOS if s not in WORKLOADS}
    if "workloads" in named:
        named |= set(WORKLOADS)
    chosen = [s for s in SCENARIOS if s in named]
    unknown = [s for s in scenarios if s not in (*SCENARIOS, "all", "workloads", "none")]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {(*SCENARIOS, 'all', 'workloads', 'none')}")
    bad = [k for k in vec_envs if k not in VEC_ENVS]
    if bad or not vec_envs:
        raise ValueError(f"vec_envs must be a non-empty subset of {VEC_ENVS}, not {list(vec_envs)}")
    if transport not in ("auto", "direct", "actor"):
        raise ValueError(f"transport must be 'auto', 'direct' or 'actor', not {transport!r}")
    if (steps is None and seconds <= 0) or (steps is not None and steps < 1) or warmup < 0 or repeat < 1:
        raise ValueError("seconds (or steps) and repeat must be positive and warmup non-negative")
    if n_envs is not None and (not n_envs or any(int(n) < 1 for n in n_envs)):
        raise ValueError(f"n_envs must be positive env counts, not {n_envs!r}")
    for s in [*(set(scenarios) & set(source.IN_SOURCE)), *(["--dashboard"] if dashboard else [])]:
        source.require(s)  # named (not through "all"): needs a source checkout
    kinds = [k for k in VEC_ENVS if k in vec_envs]
    return chosen, kinds


def _new_results(
    opts: Options, chosen: list[str], kinds: list[str], n_envs: Sequence[int] | None, dashboard: bool
) -> dict[str, Any]:
    """The results of a run before any case: machine, settings, and ``complete`` still ``False``."""
    return {
        "schema": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {
            **opts.as_dict(),
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


def _stamp_end(results: dict[str, Any], started: float) -> None:
    """Record the run's duration so far and the load average now."""
    results["duration_s"] = time.perf_counter() - started
    results["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None


def _save_partial(results: dict[str, Any], out_dir: str | os.PathLike[str] | None, started: float, stamp: str) -> None:
    """Keep the JSON on disk current, so a long run that is interrupted still leaves its results."""
    if out_dir is not None:
        _stamp_end(results, started)
        write_results(results, out_dir, plot=False, stamp=stamp)


def _scenario_cases(
    scenario: str, sizes: list[int], kinds: list[str], opts: Options, cores: int
) -> Iterator[dict[str, Any]]:
    """Measure one scenario's cases on every vec env, yielding each case as it is done."""
    if scenario == "training":
        yield _training_case(sizes[0], kinds, opts)
        return
    if scenario == "contention":
        yield _training_case(sizes[0], kinds, opts, contention=True)
        return
    missing = missing_packages(scenario)
    if missing:  # a workload whose packages are absent: said once, nothing else fails
        yield {"scenario": scenario, "case": scenario, "n_envs": sizes[0], "results": {},
               "skipped": f"needs {', '.join(missing)}: pip install 'daskvec[workloads]'"}  # fmt: skip
        return
    if scenario in source.IN_SOURCE:  # gym-faces, straggler, groups: by their modules in benchmarks/
        if source.benchmarks_dir() is None:
            yield {"scenario": scenario, "case": scenario, "n_envs": sizes[0], "results": {},
                   "skipped": "a benchmark of the source repository (benchmarks/), run from a checkout"}  # fmt: skip
        else:
            yield from source.module(scenario).scenario_cases(scenario, sizes, kinds, opts)
        return
    for case in _cases(scenario, sizes, opts.heavy_step_s):
        yield _stepping_case(case, kinds, opts, cores)


def _training_case(n: int, kinds: list[str], opts: Options, contention: bool = False) -> dict[str, Any]:
    """PPO with ``n`` envs on every vec env but AsyncVectorEnv, with the ratios.

    ``contention``: PPO for ``opts.contention_timesteps`` while :data:`CONTENTION_BUSY`
    busy-loop processes compete for the cores, started before each vec env is built and
    stopped after its run.
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
    for kind in kinds:
        if kind in ("async", *ENVPOOL_KINDS):
            if kind == "async":
                case_out["results"][kind] = {"skipped": "AsyncVectorEnv is not a Stable-Baselines3 VecEnv"}
            continue
        try:
            with busy_processes(CONTENTION_BUSY if contention else 0):
                case_out["results"][kind] = _measure_training_case(kind, n, opts)
        except Exception as e:
            case_out["results"][kind] = _error_entry(kind, e)
    _add_ratios(case_out)
    return case_out


def _stepping_case(case: Case, kinds: list[str], opts: Options, cores: int) -> dict[str, Any]:
    """Step ``case`` on every vec env with the same seeded actions, with the ratios."""
    probe_env = case.make()
    space = probe_env.action_space
    probe_env.close()
    actions = action_cycle(space, case.n_envs, _ACTION_CYCLE, opts.seed)
    case_out: dict[str, Any] = {
        "scenario": case.scenario,
        "case": case.name,
        "env": case.env,
        "n_envs": case.n_envs,
        "ideal_steps_per_s": cores / opts.heavy_step_s if case.scenario == "heavy" else None,
        "cores": cores,
        "results": {},
    }
    for kind in kinds:
        if kind in ENVPOOL_KINDS and case.envpool_task is None:
            continue  # no EnvPool counterpart of this env
        if kind in ENVPOOL_KINDS and missing_packages("envpool"):
            case_out["results"][kind] = {"skipped": "envpool is not installed (pip install envpool)"}
            continue
        try:
            case_out["results"][kind] = _measure_case(kind, case, actions, opts)
        except Exception as e:
            case_out["results"][kind] = _error_entry(kind, e)
    pool, on_pool = case_out["results"].get("envpool", {}), case_out["results"].get("dask-envpool", {})
    if pool.get("steps_per_s") and on_pool.get("steps_per_s"):
        on_pool["of_envpool"] = on_pool["steps_per_s"] / pool["steps_per_s"]
    dummy = case_out["results"].get("dummy", {})
    if case.python_ideal and dummy.get("steps_per_s"):
        # a Python env steps at most this fast on this machine: every core as busy as one process
        case_out["ideal_steps_per_s"] = cores * dummy["steps_per_s"]
        case_out["ideal"] = f"{cores} cores x DummyVecEnv"
    _add_ratios(case_out)
    return case_out


def _dashboard_entry(opts: Options, n_envs: Sequence[int] | None, route: str | None) -> dict[str, Any]:
    """The dashboard open-vs-closed measurement with the first env count (8 by default), or its error."""
    sizes = [int(n) for n in n_envs] if n_envs else [8]
    try:
        return dict(source.module("--dashboard").measure_dashboard(opts, n_envs=sizes[0], route=route))
    except Exception as e:
        return {"available": False, **_error_entry("dask", e)}
