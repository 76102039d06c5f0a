"""What the benchmark measures: scenarios, vec env kinds, cases and the run's options."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from daskvec.bench.envs import BusyEnv, ImageEnv

__all__ = ["BASELINE", "DEFAULT_ENVS", "LABELS", "SCENARIOS", "VEC_ENVS", "Case", "Options"]


#: Scenario names, in the order they run.
SCENARIOS: tuple[str, ...] = ("light", "heavy", "images", "training", "gym-faces", "straggler", "groups")
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
    "gym-faces": (64,),  # issue 16 (daskvec.bench.gym_faces)
    "straggler": (16,),
    "groups": (2, 8, 32, 64),  # env groups of one CartPole each (daskvec.bench.groups)
}

#: Pre-generated action batches per case; the vec envs cycle through them.
_ACTION_CYCLE = 1024


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
