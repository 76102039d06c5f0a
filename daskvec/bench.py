"""The benchmark behind ``daskvec bench``: DaskVecEnv side by side with the usual vec envs.

One process run steps SB3's ``DummyVecEnv`` and ``SubprocVecEnv``, Gymnasium's
``AsyncVectorEnv`` (through its own loop) and :class:`~daskvec.DaskVecEnv` on the same
envs with the same pre-generated, seeded random actions, and reports for each:

- env-steps per second over a fixed time budget (or a fixed step count) after a warm-up;
- time to first step: construction + first reset + first step, i.e. what a user waits
  for before the first transition (for DaskVecEnv with no scheduler this includes
  starting the embedded ``LocalCluster``);
- memory: the client process and every process holding envs (RSS and USS), per env;
- the ratio of each figure to ``SubprocVecEnv``'s in the same run.

Scenarios (see :data:`SCENARIOS`): ``light`` (CartPole-v1, 8 and 64 envs), ``heavy``
(:class:`BusyEnv`, a step that burns 1 ms of CPU, 8 envs; the ideal is
``n_cores x 1000`` env-steps/s), ``images`` (:class:`ImageEnv`, 84x84x3 uint8
observations, 16 envs) and ``training`` (PPO on CartPole-v1 with 8 envs for 25,000
timesteps, wall time from construction to the end of ``learn`` plus the evaluated mean
reward). ``--dashboard`` measures DaskVecEnv with the daskvec dashboard page open in a
headless browser against the page closed.

Results come back as a dict (:func:`run_benchmark`), and are written as JSON and a PNG
bar chart with the machine description. The env classes here are light (numpy and
gymnasium only) because Dask workers and subprocesses import this module to build them.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import functools
import importlib.metadata
import json
import logging
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "BASELINE",
    "SCENARIOS",
    "VEC_ENVS",
    "BusyEnv",
    "ImageEnv",
    "add_arguments",
    "format_table",
    "machine_info",
    "plot_results",
    "run",
    "run_benchmark",
]

#: Scenario names, in the order they run.
SCENARIOS: tuple[str, ...] = ("light", "heavy", "images", "training")
#: Vec env kinds, in the order they run within a scenario.
VEC_ENVS: tuple[str, ...] = ("dummy", "subproc", "async", "dask")
#: The vec env every ratio is relative to.
BASELINE = "subproc"

LABELS: dict[str, str] = {
    "dummy": "DummyVecEnv",
    "subproc": "SubprocVecEnv",
    "async": "AsyncVectorEnv",
    "dask": "DaskVecEnv",
}

#: Default env counts per scenario (``--envs`` overrides them).
DEFAULT_ENVS: dict[str, tuple[int, ...]] = {
    "light": (8, 64),
    "heavy": (8,),
    "images": (16,),
    "training": (8,),
}

SCHEMA_VERSION = 1
_ACTION_CYCLE = 1024
_MB = 1024.0 * 1024.0
_PACKAGES = (
    "daskvec",
    "dask",
    "distributed",
    "stable-baselines3",
    "gymnasium",
    "numpy",
    "torch",
    "cloudpickle",
    "tornado",
    "bokeh",
    "psutil",
    "matplotlib",
)


# =========================================================================== envs
def _spin(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i
    return total


#: Loop iterations of :func:`_spin` per CPU second, updated as :func:`burn_cpu` runs.
_SPIN_RATE = [2e7]


def burn_cpu(seconds: float, since: float | None = None) -> None:
    """Compute until the calling thread has used ``seconds`` of CPU time.

    ``time.thread_time`` counts only this thread's CPU, so the cost of one step is the
    same whether the env runs alone in a subprocess or next to a Dask worker's event
    loop thread (``process_time`` would count those threads too), and a preempted
    step is not cut short as a wall-clock loop would be.

    The work is plain Python arithmetic in chunks, each half of the CPU time left
    (from a running estimate of the loop's speed), so the clock is read about ten
    times per millisecond rather than in a tight loop: reading a thread's CPU clock is
    a system call, and a loop of thousands of them is not what a simulator does.

    Parameters
    ----------
    seconds : float
        CPU seconds to use.
    since : float, optional
        A ``time.thread_time()`` reading to count from (default: now), so that work
        done since then is part of the ``seconds``.
    """
    now = time.thread_time()
    end = (now if since is None else since) + seconds
    while now < end:
        chunk = max(int(_SPIN_RATE[0] * (end - now) * 0.5), 64)
        _spin(chunk)
        later = time.thread_time()
        if later > now:
            _SPIN_RATE[0] = 0.8 * _SPIN_RATE[0] + 0.2 * chunk / (later - now)
        now = later


class BusyEnv(gym.Env[np.ndarray, np.int64]):
    """An env whose ``step`` burns ``step_cpu_s`` seconds of CPU (a busy loop, not a sleep).

    Parameters
    ----------
    step_cpu_s : float
        CPU seconds each step costs (default 1 ms).
    horizon : int
        Steps before the episode is truncated.
    """

    def __init__(self, step_cpu_s: float = 1e-3, horizon: int = 200) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_cpu_s = float(step_cpu_s)
        self.horizon = int(horizon)
        self.t = 0
        self.state = np.zeros(4, dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """See ``gymnasium.Env.reset``."""
        super().reset(seed=seed)
        self.t = 0
        self.state = self.np_random.uniform(-1.0, 1.0, size=4).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move the state deterministically with the action, then burn the rest of the step's CPU.

        The state update counts towards ``step_cpu_s``: the whole step costs that much
        CPU (within a few microseconds), so "ideal" throughput is exactly
        ``cores / step_cpu_s``.
        """
        start = time.thread_time()
        self.t += 1
        shift = 0.01 if int(action) == 1 else -0.01
        self.state = np.clip(np.roll(self.state, 1) + shift, -1.0, 1.0).astype(np.float32)
        obs = self.state.copy()
        burn_cpu(self.step_cpu_s, since=start)
        return obs, 1.0, False, self.t >= self.horizon, {}


class ImageEnv(gym.Env[np.ndarray, np.int64]):
    """An env with 84x84x3 ``uint8`` observations (Atari-sized frames) and a cheap step.

    Each step returns a new array (a seeded base frame XOR the step counter), as a real
    image env does, so every transport moves a fresh 21 KB frame per env and step.
    """

    def __init__(self, size: int = 84, horizon: int = 100) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=(size, size, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.size = int(size)
        self.horizon = int(horizon)
        self.t = 0
        self.base = np.zeros((size, size, 3), dtype=np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """See ``gymnasium.Env.reset``."""
        super().reset(seed=seed)
        self.t = 0
        self.base = self.np_random.integers(0, 256, size=(self.size, self.size, 3), dtype=np.uint8)
        return self.base.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Return the next frame; reward is the action, truncation at ``horizon``."""
        self.t += 1
        obs = np.bitwise_xor(self.base, np.uint8((self.t + int(action)) & 0xFF))
        return obs, float(action), False, self.t >= self.horizon, {}


# =========================================================================== cases
@dataclass(frozen=True)
class Case:
    """One measured configuration: a scenario with an env and a number of envs."""

    scenario: str
    name: str
    env: str
    n_envs: int
    make: Callable[[], gym.Env[Any, Any]]


def _cases(scenario: str, sizes: Sequence[int], heavy_step_s: float) -> list[Case]:
    if scenario == "light":
        make: Callable[[], gym.Env[Any, Any]] = functools.partial(gym.make, "CartPole-v1")
        env = "CartPole-v1"
    elif scenario == "heavy":
        make = functools.partial(BusyEnv, step_cpu_s=heavy_step_s)
        env = f"BusyEnv ({heavy_step_s * 1e3:g} ms CPU/step)"
    elif scenario == "images":
        make = ImageEnv
        env = "ImageEnv (84x84x3 uint8)"
    else:
        raise ValueError(f"no stepping case for scenario {scenario!r}")
    return [Case(scenario, f"{scenario}-{n}", env, int(n), make) for n in sizes]


def action_cycle(space: gym.Space[Any], n_envs: int, length: int, seed: int) -> np.ndarray:
    """Pre-generate ``length`` seeded batches of random actions for ``n_envs`` envs.

    Every vec env of a case steps through the same batches in the same order.
    """
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(int(space.start), int(space.start) + int(space.n), size=(length, n_envs), dtype=np.int64)
    if isinstance(space, gym.spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        return rng.uniform(low, high, size=(length, n_envs, *space.shape)).astype(space.dtype)
    space.seed(seed)
    return np.stack([np.stack([space.sample() for _ in range(n_envs)]) for _ in range(length)])


# =========================================================================== memory
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
    pids: set[int] = set()
    with contextlib.suppress(Exception):
        from multiprocessing import forkserver

        pid = forkserver._forkserver._forkserver_pid  # type: ignore[attr-defined]
        if pid:
            pids.add(int(pid))
    with contextlib.suppress(Exception):
        from multiprocessing import resource_tracker

        pid = resource_tracker._resource_tracker._pid  # type: ignore[attr-defined]
        if pid:
            pids.add(int(pid))
    return pids


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
        env_pids: set[int] = set()
        if kind in ("subproc", "async"):
            env_pids = {int(p.pid) for p in getattr(env, "processes", []) if p.pid}
        procs: list[dict[str, Any]] = []
        seen: set[int] = set()
        local_host = platform.node()
        if kind == "dask":
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
            if pid in seen:
                continue
            try:
                m = _proc_memory(p)
            except psutil.Error:
                continue
            role = "env process" if pid in env_pids else "helper"
            procs.append({**m, "role": role})
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


# =========================================================================== options
@dataclass
class Options:
    """Settings of one benchmark run (see :func:`run_benchmark`)."""

    seconds: float = 2.0
    steps: int | None = None
    warmup: float = 0.5
    repeat: int = 1
    seed: int = 0
    scheduler: str | None = None
    transport: str = "auto"
    env_process: bool = False
    subproc_start_method: str | None = None
    async_context: str | None = None
    heavy_step_s: float = 1e-3
    training_timesteps: int = 25_000
    eval_episodes: int = 10

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def dask_kwargs(self) -> dict[str, Any]:
        """The ``DaskVecEnv`` options these settings ask for."""
        return {"client": self.scheduler, "transport": self.transport, "env_process": self.env_process}


# =========================================================================== vec envs
def _make_vec(kind: str, fns: list[Callable[[], Any]], opts: Options) -> Any:
    if kind == "dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(fns)
    if kind == "subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv(fns, start_method=opts.subproc_start_method)
    if kind == "async":
        return gym.vector.AsyncVectorEnv(fns, context=opts.async_context)
    if kind == "dask":
        from daskvec.vec_env import DaskVecEnv

        return DaskVecEnv(fns, **opts.dask_kwargs())
    raise ValueError(f"unknown vec env {kind!r}; choose from {VEC_ENVS}")


class _Stepper:
    """Reset/step/close one vec env; Gymnasium's AsyncVectorEnv through its own API."""

    def __init__(self, kind: str, env: Any, seed: int) -> None:
        self.kind = kind
        self.env = env
        self.seed = seed
        self.last_obs: Any = None
        self.reward_sum = 0.0
        self.dones = 0

    def reset(self) -> None:
        if self.kind == "async":
            self.last_obs, _ = self.env.reset(seed=self.seed)
        else:
            self.env.seed(self.seed)
            self.last_obs = self.env.reset()

    def step(self, actions: np.ndarray) -> None:
        if self.kind == "async":
            obs, rew, term, trunc, _ = self.env.step(actions)
            done = np.logical_or(term, trunc)
        else:
            obs, rew, done, _ = self.env.step(actions)
        self.last_obs = obs
        self.reward_sum += float(np.sum(rew))
        self.dones += int(np.sum(done))

    def close(self) -> None:
        self.env.close()

    def describe(self) -> dict[str, Any]:
        if self.kind != "dask":
            return {}
        env = self.env
        return {
            "transport": env.transport_summary(),
            "workers": len({g["worker"] for g in env.groups}),
            "groups": len(env.groups),
            "dashboard_link": env.dashboard_link,
        }


def _obs_checksum(obs: Any) -> float:
    if isinstance(obs, dict):
        return float(sum(_obs_checksum(v) for v in obs.values()))
    if isinstance(obs, tuple):
        return float(sum(_obs_checksum(v) for v in obs))
    return float(np.sum(np.asarray(obs), dtype=np.float64))


def _run_window(
    stepper: _Stepper, actions: np.ndarray, start: int, seconds: float, steps: int | None
) -> tuple[int, float]:
    """Step for ``steps`` vec-steps, or until ``seconds`` have passed; return (count, elapsed)."""
    length = len(actions)
    n = 0
    t0 = time.perf_counter()
    if steps is not None:
        for i in range(steps):
            stepper.step(actions[(start + i) % length])
        n = steps
    else:
        end = t0 + seconds
        while True:
            stepper.step(actions[(start + n) % length])
            n += 1
            if time.perf_counter() >= end:
                break
    return n, time.perf_counter() - t0


def _measure_once(kind: str, case: Case, actions: np.ndarray, opts: Options) -> dict[str, Any]:
    """Build, reset, first-step, warm up, time and close one vec env."""
    probe = _MemoryProbe()
    fns = [case.make for _ in range(case.n_envs)]
    t0 = time.perf_counter()
    stepper = _Stepper(kind, _make_vec(kind, fns, opts), opts.seed)
    closed = False
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
        info = stepper.describe()
        t4 = time.perf_counter()
        stepper.close()
        closed = True
        close_s = time.perf_counter() - t4
    finally:
        if not closed:
            with contextlib.suppress(Exception):
                stepper.close()
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


def _measure_case(kind: str, case: Case, actions: np.ndarray, opts: Options) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for r in range(opts.repeat):
        logger.info("bench %s: %s, run %d/%d", case.name, LABELS[kind], r + 1, opts.repeat)
        runs.append(_measure_once(kind, case, actions, opts))
    last = runs[-1]
    timed = ("steps_per_s", "ttfs_s", "construct_s", "reset_s", "first_step_s")
    out = {k: v for k, v in last.items() if k not in timed}
    for key in timed:
        out[key] = _median([run[key] for run in runs])
    out["steps_per_s_runs"] = [run["steps_per_s"] for run in runs]
    out["ttfs_runs"] = [run["ttfs_s"] for run in runs]
    out["leftover_processes"] = max(run["leftover_processes"] for run in runs)
    return out


# =========================================================================== training
def _measure_training(kind: str, n_envs: int, opts: Options) -> dict[str, Any]:
    """PPO on CartPole-v1: wall time from construction to the end of ``learn``, then evaluate."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    classes: dict[str, tuple[Any, dict[str, Any]]] = {
        "dummy": (DummyVecEnv, {}),
        "subproc": (SubprocVecEnv, {"start_method": opts.subproc_start_method}),
    }
    if kind == "dask":
        from daskvec.vec_env import DaskVecEnv

        classes["dask"] = (DaskVecEnv, opts.dask_kwargs())
    cls, kwargs = classes[kind]
    n_steps = int(min(2048, max(8, math.ceil(opts.training_timesteps / n_envs))))
    batch_size = int(min(64, n_steps * n_envs))
    probe = _MemoryProbe()
    t0 = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=n_envs, seed=opts.seed, vec_env_cls=cls, vec_env_kwargs=kwargs)
    try:
        t1 = time.perf_counter()
        model = PPO("MlpPolicy", env, seed=opts.seed, device="cpu", n_steps=n_steps, batch_size=batch_size, verbose=0)
        model.learn(total_timesteps=opts.training_timesteps)
        wall = time.perf_counter() - t0
        memory = probe.measure(kind, env, n_envs)
        info = _Stepper(kind, env, opts.seed).describe()
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


def _measure_training_case(kind: str, n_envs: int, opts: Options) -> dict[str, Any]:
    runs = [_measure_training(kind, n_envs, opts) for _ in range(opts.repeat)]
    out = dict(runs[-1])
    out["wall_s"] = _median([r["wall_s"] for r in runs])
    out["steps_per_s"] = _median([r["steps_per_s"] for r in runs])
    out["wall_runs"] = [r["wall_s"] for r in runs]
    out["mean_reward_runs"] = [r["mean_reward"] for r in runs]
    return out


# =========================================================================== machine
def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _git_commit() -> str | None:
    here = Path(__file__).resolve().parent
    git = shutil.which("git")
    if git is None:
        return None
    try:
        out = subprocess.run([git, "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def machine_info() -> dict[str, Any]:
    """Describe the machine and software a benchmark ran on.

    Returns
    -------
    dict
        CPU model, logical/physical/usable cores, memory, OS, Python, load average,
        package versions and the daskvec git commit (when run from a checkout).
    """
    import psutil

    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {
        "cpu": _cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": psutil.cpu_count(logical=False),
        "cores_usable": _usable_cores(),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "load_average": load,
        "packages": versions,
        "daskvec_commit": _git_commit(),
    }


# =========================================================================== dashboard
def _http_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def bokeh_routes(dask_scheduler: Any = None) -> list[str]:
    """The Bokeh app routes a scheduler's dashboard serves (run through ``client.run_on_scheduler``)."""
    routes: list[str] = []
    for app in getattr(getattr(dask_scheduler, "http_application", None), "applications", []):
        contexts = getattr(app, "applications", None)
        if isinstance(contexts, dict):
            routes.extend(str(path) for path in contexts)
    return sorted(routes)


def find_dashboard_route(client: Any, base: str | None, route: str | None = None) -> str | None:
    """The daskvec page's route on a cluster's dashboard, or ``None`` if it is not served.

    ``route`` wins when given. Otherwise the scheduler's Bokeh routes are searched for
    ``/daskvec`` (the page a user opens), then for any route mentioning daskvec; if
    the scheduler cannot be asked, ``/individual-plots.json`` is searched.
    """
    if route:
        return route if route.startswith("/") else "/" + route
    try:
        routes = list(client.run_on_scheduler(bokeh_routes))
    except Exception as e:
        logger.debug("cannot list the scheduler's dashboard routes: %s", e)
        routes = []
        if base:
            try:
                plots = _http_json(base.rstrip("/") + "/individual-plots.json")
                routes = ["/" + str(p).split("://", 1)[-1].split("/", 1)[-1] for p in plots.values()]
            except (OSError, ValueError) as e2:
                logger.warning("cannot read %s/individual-plots.json: %s", base, e2)
    if "/daskvec" in routes:
        return "/daskvec"
    ours = sorted((r for r in routes if "daskvec" in r.lower()), key=len)
    return ours[0] if ours else None


def bokeh_connections(dask_scheduler: Any = None, route: str = "") -> int:
    """Open (websocket-connected) Bokeh sessions on ``route`` of a scheduler's dashboard.

    Run through ``client.run_on_scheduler``; tells whether a browser really has the page open.
    """
    total = 0
    for app in getattr(getattr(dask_scheduler, "http_application", None), "applications", []):
        contexts = getattr(app, "applications", None)
        if not isinstance(contexts, dict):
            continue
        for path, ctx in contexts.items():
            if route and path.rstrip("/") != route.rstrip("/"):
                continue
            for session in getattr(ctx, "sessions", []):
                total += int(getattr(session, "connection_count", 0) > 0)
    return total


@contextlib.contextmanager
def _open_page(url: str, client: Any, route: str, timeout: float = 90.0) -> Iterator[dict[str, Any]]:
    """Keep ``url`` open in headless chromium (or a Bokeh client subprocess) while inside."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    profile = tempfile.mkdtemp(prefix="daskvec-bench-chromium-")
    if chromium:
        cmd = [chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
               "--no-first-run", "--window-size=1280,900", f"--user-data-dir={profile}", url]
        method = "chromium"
    else:
        code = ("import sys; from bokeh.client import pull_session; "
                "s = pull_session(url=sys.argv[1]); s.loop_until_closed()")
        cmd = [sys.executable, "-c", code, url]
        method = "bokeh.client"
    before = _connections(client, route)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    state: dict[str, Any] = {"method": method, "connected": False}
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None:
            if _connections(client, route) > before:
                state["connected"] = True
                break
            time.sleep(0.25)
        if not state["connected"]:
            logger.warning("the dashboard page %s did not connect within %.0fs (%s)", url, timeout, method)
        yield state
    finally:
        _stop_process_group(proc)
        shutil.rmtree(profile, ignore_errors=True)


def _stop_process_group(proc: subprocess.Popen[bytes]) -> None:
    import signal

    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def _connections(client: Any, route: str) -> int:
    try:
        return int(client.run_on_scheduler(bokeh_connections, route=route))
    except Exception as e:
        logger.debug("cannot count dashboard sessions: %s", e)
        return 0


def _install_dashboard() -> str | None:
    """Register the daskvec dashboard page before a scheduler starts; say why not if impossible."""
    import importlib

    try:
        dashboard = importlib.import_module("daskvec.dashboard")
    except ImportError as e:
        return f"daskvec.dashboard is not available ({e})"
    install = getattr(dashboard, "install", None)
    if callable(install):
        install()
    return None


def measure_dashboard(opts: Options, n_envs: int = 8, route: str | None = None) -> dict[str, Any]:
    """DaskVecEnv env-steps/s on CartPole-v1 with the daskvec dashboard page open vs closed.

    Alternates ``opts.repeat`` windows closed/open on one DaskVecEnv and reports the
    medians. The page is opened in headless chromium (a Bokeh client subprocess when
    chromium is missing), and counted as open once its Bokeh session is connected.

    Returns
    -------
    dict
        ``available`` and, when the page was found, ``closed_steps_per_s``,
        ``open_steps_per_s``, ``ratio_open_to_closed``, the route and the method used.
    """
    reason = _install_dashboard()
    from daskvec.vec_env import DaskVecEnv

    case = _cases("light", [n_envs], opts.heavy_step_s)[0]
    actions = action_cycle(gym.make("CartPole-v1").action_space, n_envs, _ACTION_CYCLE, opts.seed)
    env = DaskVecEnv([case.make for _ in range(n_envs)], **opts.dask_kwargs())
    stepper = _Stepper("dask", env, opts.seed)
    try:
        link = env.dashboard_link
        base = link.rsplit("/", 1)[0] if link else None
        found = find_dashboard_route(env.client, base, route)
        if not found:
            why = reason or (f"the scheduler's dashboard at {base} does not serve the daskvec page (a scheduler "
                             "must start after `import daskvec.dashboard`, or with `--preload daskvec.dashboard`)")
            return {"available": False, "reason": why, "dashboard_link": link}
        if not base:
            return {"available": False, "reason": "the cluster has no dashboard", "dashboard_link": link}
        url = base.rstrip("/") + found
        stepper.reset()
        pos = _run_window(stepper, actions, 0, opts.warmup, None if opts.steps is None else max(1, opts.steps // 10))[0]
        closed: list[float] = []
        opened: list[float] = []
        methods: set[str] = set()
        connected: list[bool] = []
        for _ in range(opts.repeat):
            n, el = _run_window(stepper, actions, pos, opts.seconds, opts.steps)
            pos += n
            closed.append(n * n_envs / el)
            with _open_page(url, env.client, found) as state:
                time.sleep(1.0)  # let the page's first full render pass before timing
                n, el = _run_window(stepper, actions, pos, opts.seconds, opts.steps)
                pos += n
                opened.append(n * n_envs / el)
                methods.add(state["method"])
                connected.append(bool(state["connected"]))
        closed_med, open_med = _median(closed), _median(opened)
        return {
            "available": True,
            "url": url,
            "route": found,
            "method": ", ".join(sorted(methods)),
            "page_connected": all(connected),
            "n_envs": n_envs,
            "transport": env.transport_summary(),
            "closed_steps_per_s": closed_med,
            "open_steps_per_s": open_med,
            "closed_runs": closed,
            "open_runs": opened,
            "ratio_open_to_closed": open_med / closed_med if closed_med > 0 else float("nan"),
        }
    finally:
        env.close()


# =========================================================================== driver
def _error_entry(kind: str, exc: BaseException) -> dict[str, Any]:
    logger.exception("bench: %s failed", LABELS.get(kind, kind))
    return {"error": f"{type(exc).__name__}: {exc}"}


def _add_ratios(case: dict[str, Any]) -> None:
    results = case["results"]
    base = results.get(BASELINE, {})
    for res in results.values():
        if "error" in res or "skipped" in res:
            continue
        if case["scenario"] == "training":
            ok = "wall_s" in base
            res["ratio_wall"] = res["wall_s"] / base["wall_s"] if ok else None
            res["ratio_steps_per_s"] = base["wall_s"] / res["wall_s"] if ok else None
            res["ratio_mem_per_env"] = (res["memory"]["per_env_mb"] / base["memory"]["per_env_mb"]
                                        if ok and base["memory"]["per_env_mb"] > 0 else None)
            continue
        ok = "steps_per_s" in base
        res["ratio_steps_per_s"] = res["steps_per_s"] / base["steps_per_s"] if ok else None
        res["ratio_ttfs"] = res["ttfs_s"] / base["ttfs_s"] if ok and base["ttfs_s"] > 0 else None
        res["ratio_mem_per_env"] = (res["memory"]["per_env_mb"] / base["memory"]["per_env_mb"]
                                    if ok and base["memory"]["per_env_mb"] > 0 else None)
        if case.get("ideal_steps_per_s"):
            res["fraction_of_ideal"] = res["steps_per_s"] / case["ideal_steps_per_s"]


def _prepare_imports(kinds: Sequence[str]) -> None:
    """Import what the vec envs need before any memory baseline is taken."""
    import psutil  # noqa: F401
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv  # noqa: F401

    if "dask" in kinds:
        import distributed  # noqa: F401

        import daskvec.vec_env  # noqa: F401


def run_benchmark(
    scenarios: Sequence[str] = SCENARIOS,
    vec_envs: Sequence[str] = VEC_ENVS,
    *,
    n_envs: Sequence[int] | None = None,
    seconds: float = 2.0,
    steps: int | None = None,
    warmup: float = 0.5,
    repeat: int = 1,
    seed: int = 0,
    scheduler: str | None = None,
    transport: str = "auto",
    env_process: bool = False,
    subproc_start_method: str | None = None,
    async_context: str | None = None,
    heavy_step_s: float = 1e-3,
    training_timesteps: int = 25_000,
    eval_episodes: int = 10,
    dashboard: bool = False,
    dashboard_route: str | None = None,
    out_dir: str | os.PathLike[str] | None = None,
    plot: bool = True,
) -> dict[str, Any]:
    """Run the benchmark and return its results as data.

    Parameters
    ----------
    scenarios : sequence of str
        Any of :data:`SCENARIOS` (``"all"`` for every one).
    vec_envs : sequence of str
        Any of :data:`VEC_ENVS`. Ratios need ``"subproc"`` (the baseline).
    n_envs : sequence of int, optional
        Env counts for every selected stepping scenario (the first one for training),
        instead of :data:`DEFAULT_ENVS`.
    seconds : float
        Time budget of each timed window (ignored when ``steps`` is given).
    steps : int, optional
        A fixed number of vec-steps per timed window instead of a time budget (the
        warm-up is then ``max(1, steps // 10)`` vec-steps, so runs are reproducible
        step for step).
    warmup : float
        Seconds of warm-up stepping before each timed window (at least one vec-step).
    repeat : int
        Independent runs (construction included) per vec env; medians are reported.
    seed : int
        Seeds the envs (env ``i`` gets ``seed + i``), the actions and PPO.
    scheduler : str, optional
        Scheduler address for DaskVecEnv; ``None`` starts the embedded LocalCluster
        for each run, as ``DaskVecEnv(env_fns)`` does.
    transport : {"auto", "direct", "actor"}
        DaskVecEnv's transport.
    env_process : bool
        DaskVecEnv's ``env_process``: envs in a process of their own beside each worker.
    subproc_start_method, async_context : str, optional
        Multiprocessing start methods for SubprocVecEnv and AsyncVectorEnv (their own
        defaults when ``None``).
    heavy_step_s : float
        CPU seconds per step of the heavy scenario's env.
    training_timesteps, eval_episodes : int
        PPO timesteps and evaluation episodes of the training scenario.
    dashboard : bool
        Also measure DaskVecEnv with the daskvec dashboard page open vs closed.
    dashboard_route : str, optional
        The page's route, when it cannot be found in ``/individual-plots.json``.
    out_dir : path, optional
        Write ``bench-<timestamp>.json`` (and ``.png`` when ``plot``) there, plus
        ``latest.json``/``latest.png``.
    plot : bool
        Draw the PNG bar chart (needs matplotlib).

    Returns
    -------
    dict
        ``machine``, ``settings``, ``cases`` (one per scenario and env count, with a
        ``results`` entry per vec env and ratios to SubprocVecEnv), ``dashboard`` and
        ``files``.

    Raises
    ------
    ValueError
        For an unknown scenario, vec env or transport, or non-positive durations.
    """
    chosen = list(SCENARIOS) if "all" in scenarios else [s for s in SCENARIOS if s in scenarios]
    unknown = [s for s in scenarios if s not in (*SCENARIOS, "all", "none")]
    if unknown:
        raise ValueError(f"unknown scenario(s) {unknown}; choose from {(*SCENARIOS, 'all', 'none')}")
    bad = [k for k in vec_envs if k not in VEC_ENVS]
    if bad or not vec_envs:
        raise ValueError(f"vec_envs must be a non-empty subset of {VEC_ENVS}, not {list(vec_envs)}")
    if transport not in ("auto", "direct", "actor"):
        raise ValueError(f"transport must be 'auto', 'direct' or 'actor', not {transport!r}")
    if (steps is None and seconds <= 0) or (steps is not None and steps < 1) or warmup < 0 or repeat < 1:
        raise ValueError("seconds (or steps) and repeat must be positive and warmup non-negative")
    if n_envs is not None and (not n_envs or any(int(n) < 1 for n in n_envs)):
        raise ValueError(f"n_envs must be positive env counts, not {n_envs!r}")
    kinds = [k for k in VEC_ENVS if k in vec_envs]
    opts = Options(seconds=seconds, steps=steps, warmup=warmup, repeat=repeat, seed=seed, scheduler=scheduler,
                   transport=transport, env_process=env_process, subproc_start_method=subproc_start_method,
                   async_context=async_context,
                   heavy_step_s=heavy_step_s, training_timesteps=training_timesteps, eval_episodes=eval_episodes)
    _prepare_imports(kinds)
    started = time.perf_counter()
    results: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {**opts.as_dict(), "scenarios": chosen, "vec_envs": kinds, "baseline": BASELINE,
                     "n_envs": list(n_envs) if n_envs else None, "dashboard": dashboard},
        "cases": [],
        "dashboard": None,
        "files": {},
        "complete": False,
    }
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")

    def save_partial() -> None:
        """Keep the JSON on disk current, so a long run that is interrupted still leaves its results."""
        if out_dir is not None:
            results["duration_s"] = time.perf_counter() - started
            results["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
            write_results(results, out_dir, plot=False, stamp=stamp)

    cores = _usable_cores()
    for scenario in chosen:
        sizes = [int(n) for n in n_envs] if n_envs else list(DEFAULT_ENVS[scenario])
        if scenario == "training":
            n = sizes[0]
            case_out: dict[str, Any] = {"scenario": scenario, "case": f"training-{n}", "env": "CartPole-v1 (PPO)",
                                        "n_envs": n, "timesteps": training_timesteps, "results": {}}
            for kind in kinds:
                if kind == "async":
                    case_out["results"][kind] = {"skipped": "AsyncVectorEnv is not a Stable-Baselines3 VecEnv"}
                    continue
                try:
                    case_out["results"][kind] = _measure_training_case(kind, n, opts)
                except Exception as e:
                    case_out["results"][kind] = _error_entry(kind, e)
            _add_ratios(case_out)
            results["cases"].append(case_out)
            save_partial()
            continue
        for case in _cases(scenario, sizes, heavy_step_s):
            probe_env = case.make()
            space = probe_env.action_space
            probe_env.close()
            actions = action_cycle(space, case.n_envs, _ACTION_CYCLE, seed)
            case_out = {"scenario": scenario, "case": case.name, "env": case.env, "n_envs": case.n_envs,
                        "ideal_steps_per_s": cores / heavy_step_s if scenario == "heavy" else None,
                        "cores": cores, "results": {}}
            for kind in kinds:
                try:
                    case_out["results"][kind] = _measure_case(kind, case, actions, opts)
                except Exception as e:
                    case_out["results"][kind] = _error_entry(kind, e)
            _add_ratios(case_out)
            results["cases"].append(case_out)
            save_partial()
    if dashboard:
        sizes = [int(n) for n in n_envs] if n_envs else [8]
        try:
            results["dashboard"] = measure_dashboard(opts, n_envs=sizes[0], route=dashboard_route)
        except Exception as e:
            results["dashboard"] = {"available": False, **_error_entry("dask", e)}
    results["duration_s"] = time.perf_counter() - started
    results["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    results["complete"] = True
    if out_dir is not None:
        results["files"] = write_results(results, out_dir, plot=plot, stamp=stamp)
    return results


def write_results(
    results: dict[str, Any], out_dir: str | os.PathLike[str], plot: bool = True, stamp: str | None = None
) -> dict[str, str]:
    """Write the results as JSON (and a PNG chart) into ``out_dir``; return the paths.

    Files are named ``bench-<stamp>.json``/``.png`` (``stamp`` defaults to now) and
    copied to ``latest.json``/``latest.png``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    files: dict[str, str] = {"json": str(out / f"bench-{stamp}.json")}
    if plot and results["cases"]:
        files["png"] = str(out / f"bench-{stamp}.png")
        plot_results(results, files["png"])
        shutil.copyfile(files["png"], out / "latest.png")
    results["files"] = files
    text = json.dumps(results, indent=2, default=_json_default, allow_nan=True)
    Path(files["json"]).write_text(text)
    (out / "latest.json").write_text(text)
    return files


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


# =========================================================================== reporting
def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def format_table(results: dict[str, Any]) -> str:
    """The results as a plain-text table (one row per case and vec env)."""
    head = (f"{'case':<12} {'vec env':<15} {'env-steps/s':>12} {'x Subproc':>9} {'first step s':>12} "
            f"{'x Subproc':>9} {'MB/env':>8} {'x Subproc':>9}  notes")
    lines = [head, "-" * len(head)]
    for case in results["cases"]:
        for kind, res in case["results"].items():
            label = LABELS.get(kind, kind)
            if "error" in res or "skipped" in res:
                lines.append(f"{case['case']:<12} {label:<15} {res.get('error') or res.get('skipped')}")
                continue
            notes = []
            if case["scenario"] == "training":
                first = f"{_fmt(res['wall_s'], '.1f')} wall"
                notes.append(f"reward {res['mean_reward']:.1f}+-{res['std_reward']:.1f}")
                ratio_first = res.get("ratio_wall")
            else:
                first = _fmt(res["ttfs_s"], ".2f")
                ratio_first = res.get("ratio_ttfs")
                if res.get("fraction_of_ideal") is not None:
                    notes.append(f"{res['fraction_of_ideal']:.2f} of ideal {case['ideal_steps_per_s']:.0f}")
            if res.get("transport"):
                notes.append(res["transport"])
            if res.get("leftover_processes"):
                notes.append(f"{res['leftover_processes']} processes left running")
            lines.append(
                f"{case['case']:<12} {label:<15} {_fmt(res['steps_per_s'], ',.0f'):>12} "
                f"{_fmt(res.get('ratio_steps_per_s'), '.2f'):>9} {first:>12} {_fmt(ratio_first, '.2f'):>9} "
                f"{_fmt(res['memory']['per_env_mb'], '.1f'):>8} {_fmt(res.get('ratio_mem_per_env'), '.2f'):>9}  "
                + "; ".join(notes)
            )
    dash = results.get("dashboard")
    if dash:
        if dash.get("available"):
            lines.append(
                f"dashboard ({dash['method']}, {dash['route']}): "
                f"DaskVecEnv {dash['closed_steps_per_s']:,.0f} env-steps/s "
                f"page closed, {dash['open_steps_per_s']:,.0f} open ({dash['ratio_open_to_closed']:.2f}x)"
                + ("" if dash.get("page_connected") else " [page never connected]")
            )
        else:
            lines.append(f"dashboard: not measured ({dash.get('reason') or dash.get('error')})")
    m = results["machine"]
    lines.append(
        f"machine: {m['cpu']}, {m['cores_usable']} usable cores, {m['memory_gb']} GB, Python {m['python']}, "
        f"load average at start {_fmt((m.get('load_average') or [None])[0], '.2f')}"
    )
    start = (m.get("load_average") or [0.0])[0]
    end = (results.get("load_average_end") or [0.0])[0]
    # Only the load before the run says something about other processes: by the end, the
    # 1-min figure is mostly the benchmark's own (64 SubprocVecEnv children, Dask workers).
    if start > 0.5 * (m.get("cores_usable") or 1):
        lines.append(
            f"WARNING: the machine was busy before the run (1-min load average {start:.1f}, "
            f"{m.get('cores_usable')} cores): other processes competed for the CPU, figures and ratios are unreliable"
        )
    lines.append(f"load average at the end {end:.1f} (counts the benchmark's own processes, still exiting)")
    lines.append("training rows: 'env-steps/s' is timesteps / wall time, 'first step s' is the wall time of the run;"
                 " 'x Subproc' above 1 is faster for env-steps/s, below 1 is faster for times.")
    return "\n".join(lines)


def plot_results(results: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Draw the ratios to SubprocVecEnv per case as grouped bars into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cases = results["cases"]
    kinds = [k for k in VEC_ENVS if any(k in c["results"] for c in cases)]
    colors = {"dummy": "#8c8c8c", "subproc": "#4c72b0", "async": "#dd8452", "dask": "#55a868"}
    panels = (
        ("ratio_steps_per_s", "Speed vs SubprocVecEnv (higher is better)\nenv-steps/s; training: 1 / wall time"),
        ("ratio_ttfs", "Time to first step vs SubprocVecEnv (lower is better)\nconstruction + reset + first step"),
        ("ratio_mem_per_env", "Memory per env vs SubprocVecEnv (lower is better)\nclient growth + env processes, USS"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 5.4))
    width = 0.8 / max(1, len(kinds))
    x = np.arange(len(cases))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for j, kind in enumerate(kinds):
            vals = [c["results"].get(kind, {}).get(key) for c in cases]
            heights = [v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else np.nan for v in vals]
            pos = x - 0.4 + width * (j + 0.5)
            ax.bar(pos, heights, width, label=LABELS[kind], color=colors[kind])
            for p, h in zip(pos, heights, strict=True):
                if np.isfinite(h):
                    ax.annotate(f"{h:.2g}", (p, h), ha="center", va="bottom", fontsize=7,
                                xytext=(0, 2), textcoords="offset points")
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_xticks(x, [c["case"] for c in cases], rotation=20)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    m = results["machine"]
    fig.suptitle(f"daskvec bench: {m['cpu']}, {m['cores_usable']} cores, {m['memory_gb']} GB, "
                 f"Python {m['python']} ({results['created']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# =========================================================================== CLI
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``daskvec bench`` options to ``parser``.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The (sub)parser of the ``bench`` command.
    """
    parser.add_argument("--scenario", nargs="+", default=["all"], choices=[*SCENARIOS, "all", "none"],
                        help="scenarios to run (default: all); 'none' with --dashboard runs only that")
    parser.add_argument("--vec-envs", type=_comma_list, default=list(VEC_ENVS), metavar="LIST",
                        help=f"comma-separated vec envs to compare (default: {','.join(VEC_ENVS)})")
    parser.add_argument("--envs", type=_int_list, default=None, metavar="N[,N...]",
                        help="env counts for every scenario instead of the defaults (light 8,64; heavy 8; images 16)")
    parser.add_argument("--seconds", type=float, default=2.0, help="time budget of each timed window (default 2)")
    parser.add_argument("--steps", type=int, default=None, help="fixed vec-steps per timed window instead of --seconds")
    parser.add_argument("--warmup", type=float, default=0.5, help="seconds of warm-up before timing (default 0.5)")
    parser.add_argument("--repeat", type=int, default=1, help="independent runs per vec env; medians are reported")
    parser.add_argument("--seed", type=int, default=0, help="seed of envs, actions and PPO (default 0)")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="Dask scheduler address for DaskVecEnv (default: embedded LocalCluster)")
    parser.add_argument("--transport", default="auto", choices=["auto", "direct", "actor"],
                        help="DaskVecEnv transport (default auto)")
    parser.add_argument("--env-process", action="store_true",
                        help="DaskVecEnv(env_process=True): envs in a process of their own beside each worker")
    parser.add_argument("--subproc-start-method", default=None, choices=["fork", "forkserver", "spawn"],
                        help="SubprocVecEnv start method (default: its own, forkserver on Linux)")
    parser.add_argument("--async-context", default=None, choices=["fork", "forkserver", "spawn"],
                        help="AsyncVectorEnv multiprocessing context (default: its own)")
    parser.add_argument("--timesteps", type=int, default=25_000, help="PPO timesteps of the training scenario")
    parser.add_argument("--eval-episodes", type=int, default=10, help="evaluation episodes after training")
    parser.add_argument("--dashboard", action="store_true",
                        help="also measure DaskVecEnv with the daskvec dashboard page open vs closed")
    parser.add_argument("--dashboard-route", default=None, help="route of the page if it cannot be discovered")
    parser.add_argument("--out", default="bench-results", metavar="DIR",
                        help="directory for the JSON and PNG results (default bench-results)")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG chart")
    parser.add_argument("-v", "--verbose", action="store_true", help="keep Dask's and daskvec's INFO log lines")


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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``python -m daskvec.bench``."""
    parser = argparse.ArgumentParser(prog="daskvec bench", description=__doc__.split("\n\n")[0] if __doc__ else None)
    add_arguments(parser)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
