"""Gymnasium scenarios of the benchmark: the faces side by side, and stragglers.

``gym-faces``
    CartPole-v1 stepped through Gymnasium's ``SyncVectorEnv`` and ``AsyncVectorEnv`` and
    :class:`~daskvec.DaskVectorEnv`, with the same seeded actions; env-steps per second
    and the ratio to ``AsyncVectorEnv`` (the one-machine baseline Gymnasium users have).
``straggler``
    Envs of uneven step cost (:class:`SleepEnv`: a step waits a set time, as a step that
    waits for a simulator or a slower node does, without using this machine's cores):
    one group of envs is ``slow_factor`` times slower than the others. One
    ``DaskVectorEnv`` is stepped synchronously (every step waits for the slow group), then
    with ``send``/``recv`` (batches of one group: each group steps at its own pace). The
    ideal of each is computed from the costs: synchronous ``n_envs / max group time``,
    recv-based ``sum over groups of envs / group time``.

Importing this module stays light (numpy and gymnasium): workers import it to build
:class:`SleepEnv`.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["GYM_LABELS", "GYM_SCENARIOS", "SleepEnv", "gym_faces_case", "straggler_case", "straggler_ideal"]

#: The benchmark's Gymnasium scenarios.
GYM_SCENARIOS = ("gym-faces", "straggler")
GYM_LABELS = {
    "gym_sync": "SyncVectorEnv",
    "gym_async": "AsyncVectorEnv",
    "gym_dask": "DaskVectorEnv",
    "sync_step": "DaskVectorEnv step()",
    "recv": "DaskVectorEnv send/recv",
}


class SleepEnv(gym.Env[np.ndarray, np.int64]):
    """A step that takes ``step_s`` seconds of waiting (no CPU); episodes of 200 steps."""

    def __init__(self, step_s: float) -> None:
        self.step_s = float(step_s)
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(4, dtype=np.float32), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict]:
        time.sleep(self.step_s)
        self.t += 1
        obs = np.full(4, (self.t % 100) / 100.0, dtype=np.float32)
        return obs, 1.0, False, self.t >= 200, {}


def _timed_steps(step: Callable[[np.ndarray], int], actions: np.ndarray, seconds: float, warmup: float) -> float:
    """Env-steps per second of ``step`` (which returns how many env-steps it made) over ``seconds``."""
    k, end = 0, time.perf_counter() + warmup
    while time.perf_counter() < end or k == 0:
        step(actions[k % len(actions)])
        k += 1
    done, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        done += step(actions[k % len(actions)])
        k += 1
    return done / (time.perf_counter() - start)


def _gym_vec(kind: str, fns: list[Callable[[], Any]], client: Any) -> Any:
    if kind == "gym_sync":
        return gym.vector.SyncVectorEnv(fns)
    if kind == "gym_async":
        return gym.vector.AsyncVectorEnv(fns)
    from daskvec.gymnasium.vector_env import DaskVectorEnv

    return DaskVectorEnv(fns, client)


def _face_run(kind: str, fns: list[Callable[[], Any]], actions: np.ndarray, opts: dict[str, Any]) -> dict[str, float]:
    """One construction, reset and timed window of one face."""
    t0 = time.perf_counter()
    envs = _gym_vec(kind, fns, opts["client"])
    try:
        envs.reset(seed=opts["seed"])
        envs.step(actions[0])
        ttfs = time.perf_counter() - t0

        def step(a: np.ndarray) -> int:
            envs.step(a)
            return len(fns)

        rate = _timed_steps(step, actions, opts["seconds"], opts["warmup"])
    finally:
        envs.close()
    return {"steps_per_s": rate, "ttfs_s": ttfs}


def gym_faces_case(
    n_envs: int, seconds: float, warmup: float, seed: int, client: Any = None, repeat: int = 1
) -> dict[str, Any]:
    """CartPole-v1 on SyncVectorEnv, AsyncVectorEnv and DaskVectorEnv; ratios to AsyncVectorEnv.

    With ``repeat`` > 1 the faces run in turn that many times (construction included) and
    the medians are reported, so that a noisy minute weighs on all of them alike.
    """
    from daskvec.bench.envs import action_cycle

    fns: list[Callable[[], Any]] = [functools.partial(gym.make, "CartPole-v1")] * n_envs
    actions = action_cycle(gym.spaces.Discrete(2), n_envs, 1024, seed)
    opts = {"seconds": seconds, "warmup": warmup, "seed": seed, "client": client}
    case: dict[str, Any] = {
        "scenario": "gym-faces",
        "case": f"gym-faces-{n_envs}",
        "env": "CartPole-v1",
        "n_envs": n_envs,
        "results": {},
    }
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in GYM_LABELS if kind.startswith("gym_")}
    for r in range(repeat):
        for kind, done in runs.items():
            if "error" in case["results"].get(kind, {}):
                continue
            logger.info("bench gym-faces-%d: %s, run %d/%d", n_envs, GYM_LABELS[kind], r + 1, repeat)
            try:
                done.append(_face_run(kind, fns, actions, opts))
            except Exception as e:  # reported, the other faces still run
                logger.exception("bench: %s failed", GYM_LABELS[kind])
                case["results"][kind] = {"error": f"{type(e).__name__}: {e}"}
    for kind, done in runs.items():
        if done and kind not in case["results"]:
            case["results"][kind] = {
                "steps_per_s": float(np.median([d["steps_per_s"] for d in done])),
                "ttfs_s": float(np.median([d["ttfs_s"] for d in done])),
                "steps_per_s_runs": [d["steps_per_s"] for d in done],
            }
    base = case["results"].get("gym_async", {}).get("steps_per_s")
    for res in case["results"].values():
        res["ratio_to_async"] = res["steps_per_s"] / base if base and "steps_per_s" in res else None
    return case


def straggler_ideal(group_seconds: list[float], group_sizes: list[int]) -> tuple[float, float]:
    """Ideal env-steps/s of synchronous and of recv-based stepping, from each group's step time.

    Synchronous: every vec-step waits for the slowest group. Recv-based: each group steps
    at its own pace, so the rates add up.
    """
    sync = sum(group_sizes) / max(group_seconds)
    independent = sum(n / s for n, s in zip(group_sizes, group_seconds, strict=True))
    return sync, independent


def straggler_case(
    seconds: float,
    warmup: float,
    seed: int,
    client: Any = None,
    groups: int = 4,
    envs_per_group: int = 4,
    step_s: float = 2e-3,
    slow_factor: float = 4.0,
) -> dict[str, Any]:
    """One DaskVectorEnv, one slow group: synchronous ``step()`` against ``send``/``recv``."""
    from daskvec.gymnasium.vector_env import DaskVectorEnv

    n = groups * envs_per_group
    costs = [step_s * (slow_factor if i < envs_per_group else 1.0) for i in range(n)]
    fns = [functools.partial(SleepEnv, c) for c in costs]
    group_s = [sum(costs[g * envs_per_group : (g + 1) * envs_per_group]) for g in range(groups)]
    ideal_sync, ideal_recv = straggler_ideal(group_s, [envs_per_group] * groups)
    case: dict[str, Any] = {
        "scenario": "straggler",
        "case": f"straggler-{n}",
        "n_envs": n,
        "env": f"SleepEnv: {groups} groups of {envs_per_group}, {step_s * 1e3:g} ms/step, one group x{slow_factor:g}",
        "ideal": {"sync_step": ideal_sync, "recv": ideal_recv},
        "results": {},
    }
    rng = np.random.default_rng(seed)
    actions = rng.integers(0, 2, size=(256, n))
    envs = DaskVectorEnv(fns, client, batch_size=envs_per_group, envs_per_actor=envs_per_group)
    try:
        envs.reset(seed=seed)

        def sync_step(a: np.ndarray) -> int:
            envs.step(a)
            return n

        rate_sync = _timed_steps(sync_step, actions, seconds, warmup)
        envs.send(actions[0])

        def recv_step(a: np.ndarray) -> int:
            info = envs.recv()[4]
            ids = info["env_id"]
            envs.send(a[ids], ids)
            return len(ids)

        rate_recv = _timed_steps(recv_step, actions, seconds, warmup)
        while envs.pending:  # collect what is still in flight before closing
            envs.recv()
    finally:
        envs.close()
    for kind, rate in (("sync_step", rate_sync), ("recv", rate_recv)):
        case["results"][kind] = {"steps_per_s": rate, "fraction_of_ideal": rate / case["ideal"][kind]}
    case["recv_over_sync"] = rate_recv / rate_sync
    case["ideal_recv_over_sync"] = ideal_recv / ideal_sync
    return case


def format_gym_case(case: dict[str, Any]) -> list[str]:
    """Table lines of a Gymnasium scenario's case."""
    lines = []
    for kind, res in case["results"].items():
        label = GYM_LABELS.get(kind, kind)
        if "error" in res:
            lines.append(f"{case['case']:<12} {label:<24} {res['error']}")
            continue
        note = ""
        if res.get("ratio_to_async") is not None:
            note = f"x{res['ratio_to_async']:.2f} AsyncVectorEnv"
        if "fraction_of_ideal" in res:
            note = f"{res['fraction_of_ideal']:.2f} of ideal {case['ideal'][kind]:,.0f}"
        lines.append(f"{case['case']:<12} {label:<24} {res['steps_per_s']:>12,.0f}  {note}")
    if "recv_over_sync" in case:
        ratio, ideal = case["recv_over_sync"], case["ideal_recv_over_sync"]
        lines.append(f"{case['case']:<12} recv / step(): x{ratio:.2f} (ideal x{ideal:.2f})")
    return lines


def scenario_cases(scenario: str, sizes: list[int], kinds: list[str], opts: Any) -> Iterator[dict[str, Any]]:
    """``daskvec bench --scenario gym-faces`` or ``straggler`` with the run's options (its first env count)."""
    n = sizes[0]
    seconds = opts.seconds if opts.steps is None else max(0.2, opts.steps / 100)
    if scenario == "gym-faces":
        yield gym_faces_case(n, seconds, opts.warmup, opts.seed, opts.scheduler, repeat=opts.repeat)
        return
    groups = max(2, n // 4)
    per_group = max(1, n // groups)
    yield straggler_case(seconds, opts.warmup, opts.seed, opts.scheduler, groups=groups, envs_per_group=per_group)


#: Table lines of a case, for ``daskvec bench``'s table.
format_case = format_gym_case
