"""Where a DaskVecEnv step's time goes on one machine, against the Python ceiling.

``daskvec bench --scenario ceiling`` steps one workload (``mujoco`` or ``atari``, see
:mod:`daskvec.bench.scenarios`) with DummyVecEnv (the single-process rate; the ideal
is cores x that rate), with one DummyVecEnv per core running at once, each on its share
of the envs and with no communication at all (the **parallel ceiling**: what this
machine gives Python envs stepped in parallel, shared caches, memory bandwidth and the
hypervisor included), and with DaskVecEnv on the embedded cluster under a few settings
(:data:`VARIANTS`), in turns, ``rounds`` times, so that a shared machine's load weighs
on all of them alike. For each DaskVecEnv run it splits a vec-step's wall time with the
vec env's own :class:`~daskvec.monitoring.metrics.ClientTimer` (the caller's time between steps;
the slowest group's time inside its envs; the rest of the wait: transport, the workers'
decoding and encoding, the client's take-in of the replies) and counts the CPU each
process used per vec-step (the client process with all its threads, which hold the
embedded scheduler; each worker), with ``psutil``.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from daskvec.bench.envs import action_cycle
from daskvec.bench.machine import _usable_cores, machine_info
from daskvec.bench.scenarios import _ACTION_CYCLE, Case, _cases, missing_packages

logger = logging.getLogger(__name__)

__all__ = ["VARIANTS", "format_ceiling_table", "run_ceiling"]

#: DaskVecEnv settings compared, by name: keyword arguments of the vec env, and of the embedded
#: cluster under ``"cluster_kwargs"``.
VARIANTS: dict[str, dict[str, Any]] = {
    "default": {},
    "busy_poll=0": {"busy_poll": 0.0},
}


def _cpu_seconds(pids: Sequence[int]) -> dict[int, float]:
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = float(t.user + t.system)
        except psutil.Error:
            out[pid] = float("nan")
    return out


def _window(env: Any, actions: np.ndarray, start: int, seconds: float) -> tuple[int, float]:
    n, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while True:
        env.step_async(actions[(start + n) % len(actions)])
        env.step_wait()
        n += 1
        if time.perf_counter() >= end:
            return n, time.perf_counter() - t0


def _measure_dummy(case: Case, actions: np.ndarray, seconds: float, warmup: float, seed: int) -> float:
    from daskvec.bench.measure import _measure_case
    from daskvec.bench.scenarios import BenchOptions

    res = _measure_case("dummy", case, actions, BenchOptions(seconds=seconds, warmup=warmup, seed=seed))
    return float(res["steps_per_s"])


def _parallel_worker(case: Case, n_envs: int, seed: int, seconds: float, warmup: float, start: Any, out: Any) -> None:
    """One process of the parallel ceiling: a DummyVecEnv of ``n_envs``, timed from a common start."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    env: Any = DummyVecEnv([case.make] * n_envs)
    if case.frame_stack:
        from stable_baselines3.common.vec_env import VecFrameStack

        env = VecFrameStack(env, case.frame_stack)
    probe = case.make()
    actions = action_cycle(probe.action_space, n_envs, _ACTION_CYCLE, seed)
    probe.close()
    env.seed(seed)
    env.reset()
    start.wait()
    n_warm, _ = _window(env, actions, 0, warmup)
    n, elapsed = _window(env, actions, n_warm, seconds)
    out.put(n * n_envs / elapsed)
    env.close()


def _measure_parallel(case: Case, cores: int, seconds: float, warmup: float, seed: int) -> float:
    """The parallel ceiling: ``cores`` DummyVecEnv processes at once, their env-steps/s summed."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(cores), ctx.Queue()
    shares = [case.n_envs // cores + (1 if k < case.n_envs % cores else 0) for k in range(cores)]
    procs = [
        ctx.Process(target=_parallel_worker, args=(case, n, seed + k, seconds, warmup, start, out), daemon=True)
        for k, n in enumerate(shares)
        if n
    ]
    try:
        for p in procs:
            p.start()
        rates = [out.get(timeout=300) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return float(sum(rates))


def _measure_dask(
    case: Case, actions: np.ndarray, settings: dict[str, Any], seconds: float, warmup: float, seed: int
) -> dict[str, Any]:
    """One DaskVecEnv run on the embedded cluster: rate, time split, CPU per vec-step."""
    from stable_baselines3.common.vec_env import VecFrameStack

    from daskvec.sb3.vec_env import DaskVecEnv

    kwargs = dict(settings)
    dask_env = DaskVecEnv([case.make] * case.n_envs, **kwargs)
    env: Any = VecFrameStack(dask_env, case.frame_stack) if case.frame_stack else dask_env
    try:
        env.seed(seed)
        env.reset()
        n_warm, _ = _window(env, actions, 0, warmup)
        timer = dask_env.timer
        before = (timer.client_s, timer.transit_s, timer.env_s, timer.vec_steps)
        workers = sorted({g["pid"] for g in dask_env.groups})
        pids = [os.getpid(), *workers]
        cpu0 = _cpu_seconds(pids)
        n, elapsed = _window(env, actions, n_warm, seconds)
        cpu1 = _cpu_seconds(pids)
        steps = timer.vec_steps - before[3]
        split = {
            name: (now - was) / max(steps, 1) * 1e3
            for name, now, was in zip(
                ("client_ms", "transit_ms", "env_ms"),
                (timer.client_s, timer.transit_s, timer.env_s),
                before,
                strict=False,
            )
        }
        return {
            "steps_per_s": n * case.n_envs / elapsed,
            "vec_step_ms": elapsed / n * 1e3,
            **split,
            "client_cpu_ms": (cpu1[pids[0]] - cpu0[pids[0]]) / n * 1e3,
            "worker_cpu_ms": [(cpu1[p] - cpu0[p]) / n * 1e3 for p in workers],
            "workers": len(workers),
            "groups": len(dask_env.groups),
            "transport": dask_env.transport_summary(),
        }
    finally:
        env.close()


def run_ceiling(
    workload: str = "mujoco",
    n_envs: int = 64,
    *,
    seconds: float = 4.0,
    warmup: float = 1.0,
    rounds: int = 3,
    variants: Sequence[str] = tuple(VARIANTS),
    seed: int = 0,
) -> dict[str, Any]:
    """Measure DummyVecEnv and DaskVecEnv under each of ``variants``, in turns, ``rounds`` times.

    Parameters
    ----------
    workload : {"mujoco", "atari"}
        The workload (its packages must be installed).
    n_envs : int
        Envs of every vec env.
    seconds, warmup : float
        Timed window and warm-up of each run.
    rounds : int
        Turns over DummyVecEnv and the variants; medians are reported.
    variants : sequence of str
        Names in :data:`VARIANTS`.
    seed : int
        Seeds the envs and the actions.

    Returns
    -------
    dict
        ``machine``, ``settings``, ``dummy_steps_per_s`` and ``parallel_steps_per_s`` (each
        round), ``ideal_steps_per_s`` (cores x the median DummyVecEnv rate),
        ``parallel_ceiling_steps_per_s`` (the median parallel ceiling) and, per variant,
        each round's figures and their medians with the fractions of both.

    Raises
    ------
    ValueError
        An unknown workload or variant, or missing packages.
    """
    if workload not in ("mujoco", "atari"):
        raise ValueError(f"workload must be 'mujoco' or 'atari', not {workload!r}")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ValueError(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}")
    if missing_packages(workload):
        raise ValueError(f"{workload} needs {missing_packages(workload)}: pip install 'daskvec[workloads]'")
    (case,) = _cases(workload, [n_envs], 1e-3)
    probe = case.make()
    actions = action_cycle(probe.action_space, n_envs, _ACTION_CYCLE, seed)
    probe.close()
    cores = _usable_cores()
    out: dict[str, Any] = {
        "machine": machine_info(),
        "cores": cores,
        "case": case.name,
        "settings": {"seconds": seconds, "warmup": warmup, "rounds": rounds, "seed": seed},
        "dummy_steps_per_s": [],
        "parallel_steps_per_s": [],
        "variants": {v: {"runs": []} for v in variants},
    }
    for r in range(rounds):
        logger.info("ceiling %s: round %d/%d", case.name, r + 1, rounds)
        out["dummy_steps_per_s"].append(_measure_dummy(case, actions, seconds, warmup, seed))
        out["parallel_steps_per_s"].append(_measure_parallel(case, cores, seconds, warmup, seed))
        for v in variants:
            try:
                out["variants"][v]["runs"].append(_measure_dask(case, actions, VARIANTS[v], seconds, warmup, seed))
            except Exception as e:
                logger.exception("ceiling: variant %s failed", v)
                out["variants"][v]["runs"].append({"error": f"{type(e).__name__}: {e}"})
    _summarise(out)
    out["load_average_end"] = list(os.getloadavg())
    return out


def _summarise(out: dict[str, Any]) -> None:
    """The ideal, the parallel ceiling, and each variant's medians over its runs with its fractions of both."""
    ideal = out["cores"] * statistics.median(out["dummy_steps_per_s"])
    out["ideal_steps_per_s"] = ideal
    out["parallel_ceiling_steps_per_s"] = parallel = statistics.median(out["parallel_steps_per_s"])
    for entry in out["variants"].values():
        runs = [x for x in entry["runs"] if "error" not in x]
        if not runs:
            continue
        for key in ("steps_per_s", "vec_step_ms", "client_ms", "transit_ms", "env_ms", "client_cpu_ms"):
            entry[key] = statistics.median(x[key] for x in runs)
        entry["worker_cpu_ms"] = [
            statistics.median(x["worker_cpu_ms"][k] for x in runs) for k in range(len(runs[0]["worker_cpu_ms"]))
        ]
        entry["fraction_of_ideal"] = entry["steps_per_s"] / ideal
        entry["fraction_of_parallel"] = entry["steps_per_s"] / parallel
        entry["fraction_runs"] = [x["steps_per_s"] / ideal for x in runs]


def format_ceiling_table(res: dict[str, Any]) -> str:
    """The result of :func:`run_ceiling` as a table: one row per variant, and the ideal."""
    n = int(res["case"].split("-")[-1])
    ideal_ms = n / res["ideal_steps_per_s"] * 1e3
    lines = [
        f"{res['case']}: ideal {res['ideal_steps_per_s']:,.0f} env-steps/s = {res['cores']} cores x DummyVecEnv "
        f"(median of {[round(x) for x in res['dummy_steps_per_s']]}); an ideal vec-step takes {ideal_ms:.2f} ms",
        f"parallel ceiling ({res['cores']} DummyVecEnv processes at once, no communication): "
        f"{res['parallel_ceiling_steps_per_s']:,.0f} env-steps/s "
        f"({res['parallel_ceiling_steps_per_s'] / res['ideal_steps_per_s']:.2f} of the ideal; "
        f"median of {[round(x) for x in res['parallel_steps_per_s']]})",
        f"{'variant':<14} {'env-steps/s':>11} {'of ideal':>8} {'of par.':>7} {'step ms':>8} {'env ms':>7} "
        f"{'transit':>8} {'client':>7} {'client CPU':>10}  worker CPU ms/step",
    ]
    for name, e in res["variants"].items():
        if "steps_per_s" not in e:
            lines.append(f"{name:<14} {e['runs'][0].get('error')}")
            continue
        lines.append(
            f"{name:<14} {e['steps_per_s']:>11,.0f} {e['fraction_of_ideal']:>8.2f} {e['fraction_of_parallel']:>7.2f} "
            f"{e['vec_step_ms']:>8.2f} "
            f"{e['env_ms']:>7.2f} {e['transit_ms']:>8.2f} {e['client_ms']:>7.2f} {e['client_cpu_ms']:>10.2f}  "
            + ", ".join(f"{x:.2f}" for x in e["worker_cpu_ms"])
        )
    m = res["machine"]
    lines.append(
        f"load average at start {m['load_average'][0]:.1f}, at the end {res['load_average_end'][0]:.1f} "
        f"({res['cores']} cores); per vec-step: 'env ms' the slowest group in its envs, 'transit' the "
        "rest of the wait, 'client' the caller between steps"
    )
    return "\n".join(lines)
