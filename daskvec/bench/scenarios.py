"""What the benchmark measures: scenarios, vec env kinds, cases and the run's options."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from daskvec.bench.envs import BusyEnv, ImageEnv, make_atari, make_envpool
from daskvec.bench.machine import _usable_cores

__all__ = [
    "BASELINE",
    "DEFAULT_ENVS",
    "ENVPOOL_KINDS",
    "LABELS",
    "SCENARIOS",
    "VEC_ENVS",
    "WORKLOADS",
    "Case",
    "BenchOptions",
    "missing_packages",
]


#: Scenario names, in the order they run.
SCENARIOS: tuple[str, ...] = (
    "light",
    "heavy",
    "images",
    "training",
    "gym-faces",
    "straggler",
    "groups",
    "atari",
    "mujoco",
    "contention",
)
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
_NEEDS: dict[str, tuple[str, ...]] = {"atari": ("ale_py", "cv2"), "mujoco": ("mujoco",), "envpool": ("envpool",)}


def missing_packages(what: str) -> list[str]:
    """The modules that ``what`` (a workload, or ``"envpool"``) needs and this Python cannot import."""
    return [m for m in _NEEDS.get(what, ()) if importlib.util.find_spec(m) is None]


#: Default env counts per scenario (``--envs`` overrides them).
DEFAULT_ENVS: dict[str, tuple[int, ...]] = {
    "light": (8, 64),
    "heavy": (8,),
    "images": (16,),
    "training": (8,),
    "gym-faces": (64,),  # benchmarks.gym_faces
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
    """One measured configuration: a scenario with an env (``make``) and a number of envs.

    ``make_async`` is the factory ``AsyncVectorEnv`` gets instead (stacking its own frames:
    Gymnasium has no ``VecFrameStack``), ``frame_stack`` the ``VecFrameStack`` around the SB3
    vec envs (0: none), ``envpool_task`` the EnvPool kinds' task; ``python_ideal`` reports
    cores x DummyVecEnv's rate of the same run.
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


def _cases(scenario: str, sizes: Sequence[int], heavy_step_s: float) -> list[Case]:
    if scenario == "atari":
        return [
            Case(
                scenario,
                f"atari-{n}",
                "PongNoFrameskip-v4, AtariWrapper + VecFrameStack(4)",
                int(n),
                functools.partial(make_atari, "PongNoFrameskip-v4"),
                make_async=functools.partial(make_atari, "PongNoFrameskip-v4", 4),
                frame_stack=4,
                envpool_task="Pong-v5",
                python_ideal=True,
            )
            for n in sizes
        ]
    if scenario == "mujoco":
        cheetah = functools.partial(gym.make, "HalfCheetah-v5")
        return [
            Case(
                scenario,
                f"mujoco-{n}",
                "HalfCheetah-v5",
                int(n),
                cheetah,
                envpool_task="HalfCheetah-v5",
                python_ideal=True,
            )
            for n in sizes
        ]
    envs: dict[str, tuple[str, Callable[[], gym.Env[Any, Any]]]] = {
        "light": ("CartPole-v1", functools.partial(gym.make, "CartPole-v1")),
        "heavy": (f"BusyEnv ({heavy_step_s * 1e3:g} ms CPU/step)", functools.partial(BusyEnv, step_cpu_s=heavy_step_s)),
        "images": ("ImageEnv (84x84x3 uint8)", ImageEnv),
    }
    if scenario not in envs:
        raise ValueError(f"no stepping case for scenario {scenario!r}")
    return [Case(scenario, f"{scenario}-{n}", envs[scenario][0], int(n), envs[scenario][1]) for n in sizes]


@dataclass
class BenchOptions:
    """Settings of one benchmark run: ``daskvec bench``'s options of the same names (docs/benchmark.md).

    Besides them: ``training_timesteps`` (``--timesteps``), ``heavy_step_s`` (CPU seconds per
    step of the heavy scenario's env) and ``cores`` (default: this process's CPU affinity).
    ``settle`` bounds the wait for an idle CPU before each vec env (``--settle``).
    """

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
    cores: int = field(default_factory=_usable_cores)
    contention_timesteps: int = 8192
    settle: float = 20.0

    def __post_init__(self) -> None:
        if self.transport not in ("auto", "direct", "actor"):
            raise ValueError(f"transport must be 'auto', 'direct' or 'actor', not {self.transport!r}")
        steps, seconds = self.steps, self.seconds
        if (steps is None and seconds <= 0) or (steps is not None and steps < 1) or self.warmup < 0 or self.repeat < 1:
            raise ValueError("seconds (or steps) and repeat must be positive and warmup non-negative")
        if self.settle < 0:
            raise ValueError(f"settle must be 0 (no wait) or a positive number of seconds, not {self.settle}")

    def dask_kwargs(self) -> dict[str, Any]:
        """The ``DaskVecEnv`` options these settings ask for."""
        return {"client": self.scheduler, "transport": self.transport, "env_process": self.env_process}


def _make_vec(kind: str, fns: list[Callable[[], Any]], opts: BenchOptions, case: Case | None = None) -> Any:
    """Build the vec env of ``kind`` for ``fns`` (for the EnvPool kinds, ``case``'s EnvPool task).

    Each kind's package is imported here, when it is used: an import during a measurement
    would count as that vec env's memory.
    """
    if kind in ENVPOOL_KINDS:
        task, n = (case.envpool_task, case.n_envs) if case is not None else (None, len(fns))
        if task is None:
            raise ValueError(f"{kind} needs a case with an EnvPool task")
        if kind == "envpool":
            return make_envpool(task, n, opts.seed, opts.cores)
        # dask-envpool: one EnvPool with a thread per core, as one group: on one machine it beats
        # one EnvPool per core (docs/vector-groups.md, "How many vector envs")
        from daskvec.sb3.vec_env import DaskVecEnv

        vector_fn = functools.partial(make_envpool, task, n, opts.seed, opts.cores)
        return DaskVecEnv.from_vector_envs([vector_fn], **opts.dask_kwargs())
    if kind == "async":
        if case is not None and case.make_async is not None:
            fns = [case.make_async] * len(fns)
        return gym.vector.AsyncVectorEnv(fns, context=opts.async_context, shared_memory=True)
    if kind not in VEC_ENVS:
        raise ValueError(f"unknown vec env {kind!r}; choose from {VEC_ENVS}")
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    if kind == "dummy":
        venv: Any = DummyVecEnv(fns)
    elif kind == "subproc":
        venv = SubprocVecEnv(fns, start_method=opts.subproc_start_method)
    else:
        from daskvec.sb3.vec_env import DaskVecEnv

        venv = DaskVecEnv(fns, **opts.dask_kwargs())
    return VecFrameStack(venv, case.frame_stack) if case is not None and case.frame_stack else venv
