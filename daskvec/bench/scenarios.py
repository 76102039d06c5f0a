"""What the benchmark measures: scenarios, vec env kinds, cases and the run's options."""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from daskvec.bench.envs import BusyEnv, ImageEnv, make_atari, make_envpool, make_mujoco

__all__ = [
    "BASELINE",
    "DEFAULT_ENVS",
    "ENVPOOL_KINDS",
    "LABELS",
    "SCENARIOS",
    "VEC_ENVS",
    "WORKLOADS",
    "Case",
    "Options",
    "missing_packages",
]


#: Scenario names, in the order they run.
SCENARIOS: tuple[str, ...] = (
    "light", "heavy", "images", "training", "gym-faces", "straggler", "groups", "atari", "mujoco", "contention",
)  # fmt: skip
#: Real workloads: their own packages (the ``workloads`` extra), minutes each; run when named
#: (or with ``workloads``), not with ``all``.
WORKLOADS: tuple[str, ...] = ("atari", "mujoco", "contention")
#: Vec env kinds, in the order they run within a scenario.
VEC_ENVS: tuple[str, ...] = ("dummy", "subproc", "async", "dask", "envpool", "dask-envpool")
#: Kinds that step EnvPool's C++ envs: only in the workload scenarios that have an EnvPool task.
ENVPOOL_KINDS: tuple[str, ...] = ("envpool", "dask-envpool")
#: The vec env every ratio is relative to.
BASELINE = "subproc"

LABELS: dict[str, str] = {
    "dummy": "DummyVecEnv",
    "subproc": "SubprocVecEnv",
    "async": "AsyncVectorEnv",
    "dask": "DaskVecEnv",
    "envpool": "EnvPool",
    "dask-envpool": "Dask(EnvPool)",
}

#: The modules each workload needs (pip install "daskvec[workloads]").
_NEEDS: dict[str, tuple[str, ...]] = {
    "atari": ("ale_py", "cv2"),
    "mujoco": ("mujoco",),
    "envpool": ("envpool",),
}


def missing_packages(what: str) -> list[str]:
    """The modules that ``what`` (a workload, or ``"envpool"``) needs and this Python cannot import."""
    return [m for m in _NEEDS.get(what, ()) if importlib.util.find_spec(m) is None]


#: Default env counts per scenario (``--envs`` overrides them).
DEFAULT_ENVS: dict[str, tuple[int, ...]] = {
    "light": (8, 64),
    "heavy": (8,),
    "images": (16,),
    "training": (8,),
    "gym-faces": (64,),  # issue 16 (benchmarks.gym_faces)
    "straggler": (16,),
    "groups": (2, 8, 32, 64),  # env groups of one CartPole each (benchmarks.groups)
    "atari": (16,),
    "mujoco": (16, 64),
    "contention": (8,),
}

#: Busy-loop processes beside the ``contention`` scenario's PPO runs.
CONTENTION_BUSY = 4

#: Pre-generated action batches per case; the vec envs cycle through them.
_ACTION_CYCLE = 1024


@dataclass(frozen=True)
class Case:
    """One measured configuration: a scenario with an env and a number of envs.

    Attributes
    ----------
    make : callable
        One env's factory, for every kind but those below.
    make_async : callable, optional
        The factory ``AsyncVectorEnv`` gets instead (an Atari env stacking its own frames,
        since Gymnasium has no ``VecFrameStack``).
    frame_stack : int
        ``VecFrameStack(n)`` around the SB3 vec envs (0: none).
    envpool_task : str, optional
        The EnvPool task of the same workload, for the EnvPool kinds.
    python_ideal : bool
        Report the Python ideal: cores x DummyVecEnv's single-process rate of the same run.
    """

    scenario: str
    name: str
    env: str
    n_envs: int
    make: Callable[[], gym.Env[Any, Any]]
    make_async: Callable[[], gym.Env[Any, Any]] | None = None
    frame_stack: int = 0
    envpool_task: str | None = None
    python_ideal: bool = False

    def envpool_fns(self, seed: int, groups: int, threads: int) -> list[Callable[[], Any]]:
        """``groups`` EnvPool factories sharing this case's envs, each with ``threads`` threads."""
        assert self.envpool_task is not None
        sizes = [self.n_envs // groups + (1 if k < self.n_envs % groups else 0) for k in range(groups)]
        starts = [sum(sizes[:k]) for k in range(groups)]
        return [functools.partial(make_envpool, self.envpool_task, n, seed + start, threads)
                for n, start in zip(sizes, starts, strict=True) if n]  # fmt: skip


def envpool_groups(n_envs: int, cores: int) -> int:
    """How many EnvPool groups ``dask-envpool`` makes: one per core, at most one per 4 envs."""
    return max(1, min(cores, math.ceil(n_envs / 4)))


def _cases(scenario: str, sizes: Sequence[int], heavy_step_s: float) -> list[Case]:
    if scenario == "atari":
        return [Case(scenario, f"atari-{n}", "PongNoFrameskip-v4, AtariWrapper + VecFrameStack(4)", int(n),
                     functools.partial(make_atari, "PongNoFrameskip-v4"),
                     make_async=functools.partial(make_atari, "PongNoFrameskip-v4", 4), frame_stack=4,
                     envpool_task="Pong-v5", python_ideal=True) for n in sizes]  # fmt: skip
    if scenario == "mujoco":
        cheetah = functools.partial(make_mujoco, "HalfCheetah-v5")
        return [Case(scenario, f"mujoco-{n}", "HalfCheetah-v5", int(n), cheetah, envpool_task="HalfCheetah-v5",
                     python_ideal=True) for n in sizes]  # fmt: skip
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
    cores: int = 1
    contention_timesteps: int = 8192

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def dask_kwargs(self) -> dict[str, Any]:
        """The ``DaskVecEnv`` options these settings ask for."""
        return {"client": self.scheduler, "transport": self.transport, "env_process": self.env_process}


def _make_vec(kind: str, fns: list[Callable[[], Any]], opts: Options, case: Case | None = None) -> Any:
    """Build the vec env of ``kind`` for ``fns`` (for the EnvPool kinds, ``case``'s EnvPool task)."""
    if kind in ENVPOOL_KINDS:
        if case is None or case.envpool_task is None:
            raise ValueError(f"{kind} needs a case with an EnvPool task")
        if kind == "envpool":
            return make_envpool(case.envpool_task, case.n_envs, opts.seed, opts.cores)
        from daskvec.vec_env import DaskVecEnv

        groups = envpool_groups(case.n_envs, opts.cores)
        vector_fns = case.envpool_fns(opts.seed, groups, max(1, opts.cores // groups))
        return DaskVecEnv.from_vector_envs(vector_fns, **opts.dask_kwargs())
    if kind == "async":
        if case is not None and case.make_async is not None:
            fns = [case.make_async] * len(fns)
        return gym.vector.AsyncVectorEnv(fns, context=opts.async_context, shared_memory=True)
    if kind == "dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        venv: Any = DummyVecEnv(fns)
    elif kind == "subproc":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        venv = SubprocVecEnv(fns, start_method=opts.subproc_start_method)
    elif kind == "dask":
        from daskvec.vec_env import DaskVecEnv

        venv = DaskVecEnv(fns, **opts.dask_kwargs())
    else:
        raise ValueError(f"unknown vec env {kind!r}; choose from {VEC_ENVS}")
    if case is not None and case.frame_stack:
        from stable_baselines3.common.vec_env import VecFrameStack

        venv = VecFrameStack(venv, case.frame_stack)
    return venv
