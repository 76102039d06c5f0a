"""Stepping and training measurements: one vec env built, reset, stepped, timed, its memory read, and closed.

:func:`process_memory` runs on Dask workers (through ``client.run``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import multiprocessing
import platform
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from daskvec.bench.envs import busy_loop
from daskvec.bench.scenarios import LABELS, BenchOptions, Case, _make_vec

logger = logging.getLogger(__name__)

__all__ = ["busy_processes", "process_memory"]

_MB = 1024.0 * 1024.0


def _proc_memory(proc: Any) -> dict[str, Any]:
    """RSS and USS (MB) of a ``psutil.Process``; USS falls back to RSS when unreadable."""
    import psutil

    try:
        full = proc.memory_full_info()
        rss, uss = full.rss, getattr(full, "uss", full.rss)
    except (psutil.AccessDenied, psutil.ZombieProcess):
        rss = uss = proc.memory_info().rss
    return {"pid": proc.pid, "rss_mb": rss / _MB, "uss_mb": uss / _MB}


def process_memory() -> dict[str, Any]:
    """Memory of the calling process and, under ``"children"``, of its child processes
    (run on Dask workers through ``client.run``: the children are the env processes)."""
    import psutil

    me = psutil.Process()
    out = _proc_memory(me)
    out["host"] = platform.node()
    children = []
    for child in me.children():
        with contextlib.suppress(psutil.Error):
            children.append(_proc_memory(child))
    out["children"] = children
    return out


def _mp_helper_pids() -> set[int]:
    """PIDs of multiprocessing's long-lived helpers (forkserver, resource tracker)."""
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver, resource_tracker

        pids = (forkserver._forkserver._forkserver_pid, resource_tracker._resource_tracker._pid)  # type: ignore[attr-defined]
        return {int(pid) for pid in pids if pid}
    return set()


def _descendants() -> dict[int, Any]:
    import psutil

    try:
        return {p.pid: p for p in psutil.Process().children(recursive=True)}
    except psutil.Error:
        return {}


class _MemoryProbe:
    """Client memory before construction and the processes a vec env added."""

    def __init__(self) -> None:
        import psutil

        self.proc = psutil.Process()
        self.before = set(_descendants())
        self.client_before = _proc_memory(self.proc)

    def new_processes(self) -> dict[int, Any]:
        helpers = _mp_helper_pids()
        return {pid: p for pid, p in _descendants().items() if pid not in self.before and pid not in helpers}

    def measure(self, kind: str, env: Any, n_envs: int) -> dict[str, Any]:
        """Memory after stepping: client, env-holding processes and helpers, per env."""
        import psutil

        client = _proc_memory(self.proc)
        env_pids = {int(p.pid) for p in getattr(env, "processes", []) if p.pid} if kind in ("subproc", "async") else ()
        procs: list[dict[str, Any]] = []
        seen: set[int] = set()
        local_host = platform.node()
        if kind in ("dask", "dask-envpool"):
            env = env.unwrapped  # under SB3's wrappers (VecFrameStack)
            workers = sorted({g["worker"] for g in env.groups})
            try:
                remote = env.client.run(process_memory, workers=workers)
            except Exception as e:  # memory is a report, not a reason to fail the run
                logger.warning("could not read worker memory: %s", e)
                remote = {}
            for addr, m in sorted(remote.items()):
                children = m.pop("children", [])
                procs.append({**m, "role": "worker", "worker": addr})
                procs.extend({**c, "role": "env process", "worker": addr} for c in children)
                if m.get("host") == local_host:
                    seen.update(int(x["pid"]) for x in [m, *children])
        for pid, p in sorted(self.new_processes().items()):
            with contextlib.suppress(psutil.Error):
                if pid not in seen:
                    procs.append({**_proc_memory(p), "role": "env process" if pid in env_pids else "helper"})
        if kind == "subproc":  # SubprocVecEnv's forkserver is part of its cost
            for pid in _mp_helper_pids():
                with contextlib.suppress(psutil.Error):
                    procs.append({**_proc_memory(psutil.Process(pid)), "role": "helper"})
        holders = [p for p in procs if p["role"] in ("worker", "env process")]
        helpers = [p for p in procs if p["role"] == "helper"]
        delta = client["uss_mb"] - self.client_before["uss_mb"]
        env_uss = sum(p["uss_mb"] for p in holders)
        helper_uss = sum(p["uss_mb"] for p in helpers)
        n = max(1, n_envs)
        return {
            "client_rss_mb": client["rss_mb"],
            "client_uss_mb": client["uss_mb"],
            "client_delta_uss_mb": delta,
            "env_processes": len(holders),
            "env_processes_uss_mb": env_uss,
            "helpers_uss_mb": helper_uss,
            "processes": procs,
            "client_per_env_mb": max(0.0, delta) / n,
            "env_processes_per_env_mb": env_uss / n,
            "per_env_mb": (max(0.0, delta) + env_uss + helper_uss) / n,
        }

    def leftovers(self, timeout: float = 15.0) -> int:
        """Wait up to ``timeout`` for the processes the vec env started to exit; count the rest."""
        import psutil

        procs = list(self.new_processes().values())
        if not procs:
            return 0
        _, alive = psutil.wait_procs(procs, timeout=timeout)
        alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if alive:
            logger.warning("%d processes still running after close: %s", len(alive), [p.pid for p in alive])
        return len(alive)


class _Stepper:
    """Reset and step one vec env; Gymnasium's AsyncVectorEnv and EnvPool through their own API."""

    def __init__(self, kind: str, env: Any, seed: int) -> None:
        self.kind = kind
        self.env = env
        self.seed = seed
        self.last_obs: Any = None
        self.reward_sum = 0.0
        self.dones = 0

    def reset(self) -> None:
        if self.kind == "envpool":  # seeded when made; reset(seed=...) would only warn
            self.last_obs, _ = self.env.reset()
        elif self.kind == "async":
            self.last_obs, _ = self.env.reset(seed=self.seed)
        else:
            self.env.seed(self.seed)
            self.last_obs = self.env.reset()

    def step(self, actions: np.ndarray) -> None:
        if self.kind in ("async", "envpool"):  # Gymnasium's vector API; the others are SB3 VecEnvs
            obs, rew, term, trunc, _ = self.env.step(actions)
            done = np.logical_or(term, trunc)
        else:
            obs, rew, done, _ = self.env.step(actions)
        self.last_obs = obs
        self.reward_sum += float(np.sum(rew))
        self.dones += int(np.sum(done))


def _dask_figures(kind: str, env: Any) -> dict[str, Any]:
    """DaskVecEnv's transport, workers, groups and dashboard (under SB3's wrappers, such as VecFrameStack)."""
    if kind not in ("dask", "dask-envpool"):
        return {}
    env = env.unwrapped
    return {
        "transport": env.transport_summary(),
        "workers": len({g["worker"] for g in env.groups}),
        "groups": len(env.groups),
        "dashboard_link": env.dashboard_link,
    }


def _obs_checksum(obs: Any) -> float:
    if isinstance(obs, dict | tuple):
        return float(sum(_obs_checksum(v) for v in (obs.values() if isinstance(obs, dict) else obs)))
    return float(np.sum(np.asarray(obs), dtype=np.float64))


def _run_window(
    stepper: _Stepper, actions: np.ndarray, start: int, seconds: float, steps: int | None
) -> tuple[int, float]:
    """Step for ``steps`` vec-steps, or until ``seconds`` have passed (at least once); return (count, elapsed)."""
    n, t0 = 0, time.perf_counter()
    while n < steps if steps is not None else n == 0 or time.perf_counter() < t0 + seconds:
        stepper.step(actions[(start + n) % len(actions)])
        n += 1
    return n, time.perf_counter() - t0


def _measure_once(kind: str, case: Case, actions: np.ndarray, opts: BenchOptions) -> dict[str, Any]:
    """Build, reset, first-step, warm up, time and close one vec env."""
    probe = _MemoryProbe()
    fns = [case.make for _ in range(case.n_envs)]
    t0 = time.perf_counter()
    stepper = _Stepper(kind, _make_vec(kind, fns, opts, case), opts.seed)
    try:
        t1 = time.perf_counter()
        stepper.reset()
        t2 = time.perf_counter()
        stepper.step(actions[0])
        t3 = time.perf_counter()
        warm_steps = max(1, opts.steps // 10) if opts.steps is not None else None
        n_warm, _ = _run_window(stepper, actions, 1, opts.warmup, warm_steps)
        stepper.reward_sum, stepper.dones = 0.0, 0
        n, elapsed = _run_window(stepper, actions, 1 + n_warm, opts.seconds, opts.steps)
        memory = probe.measure(kind, stepper.env, case.n_envs)
        info = _dask_figures(kind, stepper.env)
    except BaseException:
        with contextlib.suppress(Exception):
            stepper.env.close()
        raise
    t4 = time.perf_counter()
    stepper.env.close()
    close_s = time.perf_counter() - t4
    return {
        "steps_per_s": n * case.n_envs / elapsed if elapsed > 0 else float("nan"),
        "vec_steps": n,
        "elapsed_s": elapsed,
        "warmup_vec_steps": n_warm,
        "ttfs_s": t3 - t0,
        "construct_s": t1 - t0,
        "reset_s": t2 - t1,
        "first_step_s": t3 - t2,
        "close_s": close_s,
        "reward_sum": stepper.reward_sum,
        "dones": stepper.dones,
        "obs_checksum": _obs_checksum(stepper.last_obs),
        "memory": memory,
        "leftover_processes": probe.leftovers(),
        **info,
    }


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values)) if values else float("nan")


def _summary(runs: list[dict[str, Any]], medians: Sequence[str], lists: dict[str, str]) -> dict[str, Any]:
    """The last run's figures, with the medians of ``medians`` over the runs and ``lists`` of every run's."""
    out = {**runs[-1], **{key: _median([run[key] for run in runs]) for key in medians}}
    out.update({name: [run[key] for run in runs] for name, key in lists.items()})
    out["leftover_processes"] = max(run["leftover_processes"] for run in runs)
    return out


def _measure_case(kind: str, case: Case, actions: np.ndarray, opts: BenchOptions) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for r in range(opts.repeat):
        logger.info("bench %s: %s, run %d/%d", case.name, LABELS[kind], r + 1, opts.repeat)
        runs.append(_measure_once(kind, case, actions, opts))
    return _summary(
        runs,
        ("steps_per_s", "ttfs_s", "construct_s", "reset_s", "first_step_s"),
        {"steps_per_s_runs": "steps_per_s", "ttfs_runs": "ttfs_s"},
    )


def _measure_training(kind: str, n_envs: int, opts: BenchOptions) -> dict[str, Any]:
    """PPO on CartPole-v1: wall time from construction to the end of ``learn``, then evaluate."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv

    n_steps = int(min(2048, max(8, math.ceil(opts.training_timesteps / n_envs))))
    batch_size = int(min(64, n_steps * n_envs))
    probe = _MemoryProbe()
    t0 = time.perf_counter()
    env = _make_vec(kind, [lambda: Monitor(gym.make("CartPole-v1"))] * n_envs, opts)  # as SB3's make_vec_env
    try:
        env.seed(opts.seed)
        t1 = time.perf_counter()
        model = PPO("MlpPolicy", env, seed=opts.seed, device="cpu", n_steps=n_steps, batch_size=batch_size, verbose=0)
        model.learn(total_timesteps=opts.training_timesteps)
        wall = time.perf_counter() - t0
        memory = probe.measure(kind, env, n_envs)
        info = _dask_figures(kind, env)
    finally:
        env.close()
    leftovers = probe.leftovers()
    eval_env = DummyVecEnv([lambda: Monitor(gym.make("CartPole-v1"))])
    eval_env.seed(opts.seed + 10_000)
    try:
        evaluated = evaluate_policy(model, eval_env, n_eval_episodes=opts.eval_episodes, deterministic=True)
    finally:
        eval_env.close()
    mean, std = float(evaluated[0]), float(evaluated[1])  # type: ignore[arg-type]
    return {
        "wall_s": wall,
        "construct_s": t1 - t0,
        "timesteps": int(model.num_timesteps),
        "steps_per_s": model.num_timesteps / wall if wall > 0 else float("nan"),
        "mean_reward": float(mean),
        "std_reward": float(std),
        "n_steps": n_steps,
        "batch_size": batch_size,
        "memory": memory,
        "leftover_processes": leftovers,
        **info,
    }


def _measure_training_case(kind: str, n_envs: int, opts: BenchOptions) -> dict[str, Any]:
    runs = [_measure_training(kind, n_envs, opts) for _ in range(opts.repeat)]
    return _summary(runs, ("wall_s", "steps_per_s"), {"wall_runs": "wall_s", "mean_reward_runs": "mean_reward"})


@contextlib.contextmanager
def busy_processes(n: int) -> Iterator[list[int]]:
    """``n`` processes spinning on the CPU while the block runs (the ``contention`` scenario); their pids.

    Started with ``spawn`` (they hold nothing of this process) and killed when the block ends, however it ends.
    """
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=busy_loop, name="daskvec-bench-busy", daemon=True) for _ in range(n)]
    try:
        for p in procs:
            p.start()
        yield [int(p.pid) for p in procs if p.pid]
    finally:
        for p in procs:
            if p.pid is not None:
                p.kill()
                p.join(timeout=10)
