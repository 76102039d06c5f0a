"""Learning throughput across emulated hosts, for :mod:`benchmarks.across`.

Two workloads, each with the worker-side learner beside SB3's own algorithm over the
same synchronous :class:`~daskvec.DaskVecEnv`, timed over ``learn()`` (env-steps per
second, training included):

- ``sac``: :class:`~daskvec.sb3.DaskSAC` and SB3's ``SAC`` on Pendulum-v1 (16 envs,
  ``train_freq=(16, "step")``, ``gradient_steps=16``);
- ``cnn``: :class:`~daskvec.learners.on_policy.DaskPPO` and SB3's ``PPO`` with ``CnnPolicy`` on 84x84x4
  frame stacks (``VecFrameStack(4)`` over 84x84 grey frames: Atari Pong when ``ale-py``
  is installed, otherwise :func:`~daskvec.bench.envs.grey_frames`, a cheap synthetic image
  env; the results say which).

Every ``learn()`` counts the vec env's own ``step_wait`` calls and worker-side
collections: the Dask learners must see at most one ``step_wait`` per collection (none
when they collect on the workers), SB3's see one per vec-step.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
import statistics
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from daskvec.bench.envs import grey_frames, make_atari

logger = logging.getLogger(__name__)

__all__ = [
    "LearnSettings",
    "StepWaitSpy",
    "format_learning_table",
    "image_env",
    "learning_ratios",
    "measure_learning",
    "pendulum",
]


#: The off-policy workload's env (gymnasium's own factory).
pendulum = functools.partial(gym.make, "Pendulum-v1")


def image_env() -> tuple[Callable[[], gym.Env[Any, Any]], str]:
    """The CNN workload's env factory and its name: Atari Pong if ``ale-py`` is installed, else ``grey_frames``."""
    if importlib.util.find_spec("ale_py") is not None:
        return functools.partial(make_atari, "PongNoFrameskip-v4"), "PongNoFrameskip-v4 (ale-py, AtariWrapper)"
    return grey_frames, "synthetic 84x84 grey frames (daskvec.bench.envs.grey_frames; ale-py not installed)"


@dataclasses.dataclass(frozen=True)
class LearnSettings:
    """Sizes of the two learning workloads (kept short for a 2-core machine).

    Attributes
    ----------
    sac_envs, sac_freq, sac_timesteps : int
        Pendulum-v1 envs, ``train_freq=(sac_freq, "step")`` (and ``gradient_steps``), ``learn()`` timesteps.
    cnn_envs, cnn_n_steps, cnn_timesteps : int
        Image envs, PPO's ``n_steps``, ``learn()`` timesteps.
    cnn_batch_size, cnn_epochs : int
        PPO's ``batch_size`` and ``n_epochs``.
    n_stack : int
        ``VecFrameStack``'s frames.
    """

    sac_envs: int = 16
    sac_freq: int = 16
    sac_timesteps: int = 4096
    cnn_envs: int = 8
    cnn_n_steps: int = 64
    cnn_timesteps: int = 2048
    cnn_batch_size: int = 256
    cnn_epochs: int = 1
    n_stack: int = 4

    def describe(self, image_name: str) -> dict[str, Any]:
        """The settings as the results record them."""
        return {**dataclasses.asdict(self), "sac_env": "Pendulum-v1", "cnn_env": image_name}


class StepWaitSpy:
    """Counts a ``DaskVecEnv``'s own ``step_wait`` calls and worker-side collections (``finish_rollout``) while in use.

    The counting wrappers are instance attributes, removed on exit: the vec env's class
    is untouched.
    """

    def __init__(self, env: Any) -> None:
        self.env = env
        self.step_waits = 0
        self.collections = 0

    def __enter__(self) -> StepWaitSpy:
        step_wait, collect = self.env.step_wait, self.env.finish_rollout

        def counted_step_wait() -> Any:
            self.step_waits += 1
            return step_wait()

        def counted_collect(*args: Any, **kwargs: Any) -> Any:
            self.collections += 1
            return collect(*args, **kwargs)

        self.env.step_wait = counted_step_wait
        self.env.finish_rollout = counted_collect
        return self

    def __exit__(self, *exc: object) -> None:
        del self.env.step_wait, self.env.finish_rollout


def _rollout_counter() -> Any:
    from stable_baselines3.common.callbacks import BaseCallback

    class RolloutCounter(BaseCallback):
        """Counts collections (``on_rollout_start``) and vec-steps."""

        def __init__(self) -> None:
            super().__init__()
            self.rollouts = self.vec_steps = 0

        def _on_rollout_start(self) -> None:
            self.rollouts += 1

        def _on_step(self) -> bool:
            self.vec_steps += 1
            return True

    return RolloutCounter()


def _timed(fn: Callable[..., Any], spent: dict[str, float], key: str) -> Callable[..., Any]:
    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t0

    return timed


def _learn(make_model: Callable[[], Any], venv: Any, timesteps: int) -> dict[str, Any]:
    """One ``learn(timesteps)`` of a fresh model: env-steps/s (training included), the seconds spent in
    ``collect_rollouts`` and in ``train``, and the round-trip counts."""
    model = make_model()
    counter = _rollout_counter()
    spent = {"collect_s": 0.0, "train_s": 0.0}
    model.collect_rollouts = _timed(model.collect_rollouts, spent, "collect_s")
    model.train = _timed(model.train, spent, "train_s")
    with StepWaitSpy(venv) as spy:
        t0 = time.perf_counter()
        model.learn(timesteps, callback=counter)
        wall = time.perf_counter() - t0
    return {
        "steps_per_s": model.num_timesteps / wall,
        "wall_s": wall,
        "timesteps": model.num_timesteps,
        "collections": counter.rollouts,
        "vec_steps": counter.vec_steps,
        "step_waits": spy.step_waits,
        "worker_collections": spy.collections,
        **spent,
    }


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median throughput of the runs, their counts (the worst run's) and every sample."""
    return {
        "steps_per_s": float(statistics.median(r["steps_per_s"] for r in runs)),
        "samples": [r["steps_per_s"] for r in runs],
        "collect_s": float(statistics.median(r["collect_s"] for r in runs)),
        "train_s": float(statistics.median(r["train_s"] for r in runs)),
        "step_waits_per_collection": max(r["step_waits"] / max(r["collections"], 1) for r in runs),
        "worker_collections": min(r["worker_collections"] for r in runs),
        "collections": max(r["collections"] for r in runs),
        "vec_steps": max(r["vec_steps"] for r in runs),
    }


def measure_learning(
    client: Any, settings: LearnSettings, seed: int, repeat: int, image: Callable[[], gym.Env[Any, Any]] | None = None
) -> dict[str, Any]:
    """Both workloads on ``client``'s workers: each learner ``repeat`` times, alternated, medians reported.

    Parameters
    ----------
    client : distributed.Client
        Where the envs run (emulated hosts in the benchmark, any cluster in tests).
    settings : LearnSettings
        The workloads' sizes.
    seed : int
        Seeds the models (and so their envs).
    repeat : int
        Rounds of every measurement.
    image : callable, optional
        The CNN workload's env factory (default :func:`image_env`'s).

    Returns
    -------
    dict
        ``sac`` and ``cnn``, each with ``dask`` and ``sb3``: ``steps_per_s`` (median),
        ``samples``, ``collect_s`` and ``train_s`` (medians of the seconds in
        ``collect_rollouts`` and ``train``), ``step_waits_per_collection`` (the worst run's),
        ``worker_collections``, ``collections`` and ``vec_steps``.
    """
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.vec_env import VecFrameStack

    from daskvec.sb3 import DaskPPO, DaskSAC
    from daskvec.sb3.vec_env import DaskVecEnv

    s = settings
    image = image or image_env()[0]
    sac_kw: dict[str, Any] = {
        "train_freq": (s.sac_freq, "step"),
        "gradient_steps": s.sac_freq,
        "buffer_size": s.sac_timesteps,
        "seed": seed,
        "device": "cpu",
        "verbose": 0,
    }
    ppo_kw: dict[str, Any] = {
        "n_steps": s.cnn_n_steps,
        "batch_size": s.cnn_batch_size,
        "n_epochs": s.cnn_epochs,
        "seed": seed,
        "device": "cpu",
        "verbose": 0,
    }
    out: dict[str, Any] = {}
    cls: Any
    with DaskVecEnv([pendulum] * s.sac_envs, client) as env:
        runs: dict[str, list[dict[str, Any]]] = {"dask": [], "sb3": []}
        for _ in range(repeat):
            for key, cls in (("dask", DaskSAC), ("sb3", SAC)):
                runs[key].append(_learn(functools.partial(cls, "MlpPolicy", env, **sac_kw), env, s.sac_timesteps))
        out["sac"] = {key: _summary(r) for key, r in runs.items()}
        out["sac"]["restarts"] = int(env.restart_counts.sum())
    with DaskVecEnv([image] * s.cnn_envs, client) as env:
        stacked = VecFrameStack(env, s.n_stack)
        runs = {"dask": [], "sb3": []}
        for _ in range(repeat):
            for key, cls in (("dask", DaskPPO), ("sb3", PPO)):
                runs[key].append(_learn(functools.partial(cls, "CnnPolicy", stacked, **ppo_kw), env, s.cnn_timesteps))
        out["cnn"] = {key: _summary(r) for key, r in runs.items()}
        out["cnn"]["restarts"] = int(env.restart_counts.sum())
    return out


def learning_ratios(rows: list[dict[str, Any]], base: dict[str, Any], goals: dict[str, Any]) -> None:
    """Each row's learning figures as fractions of ``base``'s; the 10 ms and round-trip goals."""
    if not all("learning" in r for r in rows):
        return
    for r in rows:
        for case in ("sac", "cnn"):
            for key in ("dask", "sb3"):
                fig = r["learning"][case][key]
                fig["vs_0ms"] = fig["steps_per_s"] / base["learning"][case][key]["steps_per_s"]
    row10 = next((r for r in rows if r["rtt_ms"] == 10.0), None)
    if row10 is not None and base["rtt_ms"] == 0:
        goals["daskSAC_at_10ms_ge_0.7_of_0ms"] = row10["learning"]["sac"]["dask"]["vs_0ms"] >= 0.7
        goals["daskPPO_cnn_at_10ms_ge_0.7_of_0ms"] = row10["learning"]["cnn"]["dask"]["vs_0ms"] >= 0.7
    goals["dask_learners_at_most_one_step_wait_per_collection"] = all(
        r["learning"][case]["dask"]["step_waits_per_collection"] <= 1 for r in rows for case in ("sac", "cnn")
    )


def format_learning_table(results: dict[str, Any]) -> list[str]:
    """The learning rows of the across-hosts table (nothing when they were not measured)."""
    rows = results["rows"]
    s = results["settings"].get("learning")
    if s is None or not all("learning" in r for r in rows):
        return []
    lines = [
        f"learn() env-steps/s, training included; SAC: {s['sac_env']} x{s['sac_envs']}, "
        f"train_freq=({s['sac_freq']}, 'step'), gradient_steps={s['sac_freq']}, learn({s['sac_timesteps']}); "
        f"PPO CnnPolicy: {s['cnn_env']} x{s['cnn_envs']}, VecFrameStack({s['n_stack']}), "
        f"n_steps={s['cnn_n_steps']}, learn({s['cnn_timesteps']})",
        f"{'rtt ms':>6} {'DaskSAC':>8} {'vs 0ms':>6} {'SAC/DVE':>8} {'vs 0ms':>6} {'DaskPPO':>8} {'vs 0ms':>6} "
        f"{'PPO/DVE':>8} {'vs 0ms':>6}  step_wait per collection (DaskSAC SAC DaskPPO PPO)",
    ]
    for r in rows:
        cells, waits = [], []
        for case in ("sac", "cnn"):
            for key in ("dask", "sb3"):
                fig = r["learning"][case][key]
                cells.append(f"{fig['steps_per_s']:>8,.0f} {fig.get('vs_0ms', float('nan')):>6.2f}")
                waits.append(f"{fig['step_waits_per_collection']:g}")
        lines.append(f"{r['rtt_ms']:>6g} {' '.join(cells)}  {' '.join(waits)}")
    lines.append("(DVE: over the synchronous DaskVecEnv) seconds in collect_rollouts / train (medians):")
    for r in rows:
        split = [
            f"{r['learning'][c][k]['collect_s']:.2f}/{r['learning'][c][k]['train_s']:.2f}"
            for c in ("sac", "cnn")
            for k in ("dask", "sb3")
        ]
        lines.append(f"{r['rtt_ms']:>6g} " + " ".join(f"{x:>15}" for x in split))
    return lines
