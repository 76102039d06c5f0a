"""The ``groups`` scenario: what the client pays per vec-step and per env group.

One :class:`~daskvec.DaskVecEnv` of CartPole-v1 envs, one env per group
(``envs_per_actor=1``), for each group count (2, 8, 32 and 64 by default; several
groups share a worker): the client sends every group its actions and reads one reply
per group each step, so its own work grows with the number of groups, while CartPole's
steps cost the workers next to nothing. Reported per group count, as medians over
``repeat`` windows:

- ``wall_s_per_vec_step``: wall time of a vec-step, and ``wall_s_per_group`` (divided
  by the number of groups);
- ``cpu_s_per_vec_step``: CPU time of the client's stepping thread per vec-step (what
  the client itself spends: encoding, system calls, decoding, the buffers), and
  ``cpu_s_per_group``.

Every group count runs on one cluster: the one ``scheduler`` names, or an embedded
``LocalCluster`` started once for the scenario. The module needs only daskvec's public
API, so the same measurement runs against another version of daskvec.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import statistics
import time
from collections.abc import Iterator, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["GROUPS_SCENARIO", "format_groups_case", "groups_cases", "measure_groups"]

#: The scenario's name in ``daskvec bench --scenario``.
GROUPS_SCENARIO = "groups"


@contextlib.contextmanager
def _client(scheduler: str | None) -> Iterator[Any]:
    """A client of ``scheduler``, or of an embedded cluster started for the whole scenario."""
    from distributed import Client

    from daskvec.cluster.clients import embedded_cluster

    if scheduler is not None:
        with Client(scheduler, set_as_default=False) as c:
            yield c
        return
    with embedded_cluster() as cluster, Client(cluster, set_as_default=False) as c:
        yield c


def _window(env: Any, actions: np.ndarray, start: int, seconds: float, steps: int | None) -> tuple[int, float, float]:
    """Step for ``steps`` vec-steps or ``seconds``; return (vec-steps, wall seconds, stepping-thread CPU seconds)."""
    n = 0
    wall0, cpu0 = time.perf_counter(), time.thread_time()
    end = wall0 + seconds
    while (n < steps) if steps is not None else (n == 0 or time.perf_counter() < end):
        env.step(actions[(start + n) % len(actions)])
        n += 1
    return n, time.perf_counter() - wall0, time.thread_time() - cpu0


def measure_groups(
    client: Any,
    n_groups: int,
    *,
    seconds: float = 2.0,
    steps: int | None = None,
    warmup: float = 0.5,
    repeat: int = 1,
    seed: int = 0,
    transport: str = "auto",
) -> dict[str, Any]:
    """Time a DaskVecEnv of ``n_groups`` single-env CartPole groups on ``client``'s cluster.

    Parameters
    ----------
    client : distributed.Client
        The cluster's client.
    n_groups : int
        Groups (and envs: one env per group).
    seconds : float
        Length of each timed window (ignored when ``steps`` is given).
    steps : int, optional
        Vec-steps per timed window instead of a time budget (the warm-up is then
        ``max(1, steps // 10)`` vec-steps).
    warmup : float
        Seconds of stepping before the first window.
    repeat : int
        Timed windows, one after the other on the same vec env; medians are reported.
    seed : int
        Seeds the envs and the actions.
    transport : str
        DaskVecEnv's ``transport``.

    Returns
    -------
    dict
        Medians of ``wall_s_per_vec_step``, ``cpu_s_per_vec_step``, ``wall_s_per_group``,
        ``cpu_s_per_group`` and ``steps_per_s`` (env-steps per second); the per-window
        figures (``*_runs``), ``vec_steps`` (of the last window), ``groups``,
        ``workers`` and ``transport``.
    """
    from daskvec import DaskVecEnv
    from daskvec.bench.envs import action_cycle

    fns = [functools.partial(gym.make, "CartPole-v1")] * n_groups
    actions = action_cycle(gym.spaces.Discrete(2), n_groups, 1024, seed)
    env = DaskVecEnv(fns, client=client, envs_per_actor=1, transport=transport)
    try:
        env.seed(seed)
        env.reset()
        k, _, _ = _window(env, actions, 0, warmup, None if steps is None else max(1, steps // 10))
        walls, cpus, counts = [], [], []
        for _ in range(repeat):
            n, wall, cpu = _window(env, actions, k, seconds, steps)
            k += n
            walls.append(wall / n)
            cpus.append(cpu / n)
            counts.append(n)
        groups = env.groups
        out: dict[str, Any] = {
            "groups": len(groups),
            "workers": len({g["worker"] for g in groups}),
            "transport": env.transport_summary(),
        }
    finally:
        env.close()
    wall_step, cpu_step = statistics.median(walls), statistics.median(cpus)
    return {
        **out,
        "vec_steps": counts[-1],
        "wall_s_per_vec_step": wall_step,
        "cpu_s_per_vec_step": cpu_step,
        "wall_s_per_group": wall_step / n_groups,
        "cpu_s_per_group": cpu_step / n_groups,
        "steps_per_s": n_groups / wall_step,
        "wall_s_per_vec_step_runs": walls,
        "cpu_s_per_vec_step_runs": cpus,
    }


def groups_cases(sizes: Sequence[int], opts: Any) -> Iterator[dict[str, Any]]:
    """One case per group count in ``sizes``, all on one cluster; yields each case when it is measured.

    ``opts`` is the run's :class:`~daskvec.bench.scenarios.BenchOptions` (``seconds``,
    ``steps``, ``warmup``, ``repeat``, ``seed``, ``scheduler``, ``transport``).
    """
    with _client(opts.scheduler) as client:
        for n in sizes:
            case: dict[str, Any] = {
                "scenario": GROUPS_SCENARIO,
                "case": f"groups-{n}",
                "env": "CartPole-v1",
                "n_envs": n,
                "n_groups": n,
                "results": {},
            }
            logger.info("bench groups-%d", n)
            try:
                case["results"]["dask"] = measure_groups(
                    client,
                    n,
                    seconds=opts.seconds,
                    steps=opts.steps,
                    warmup=opts.warmup,
                    repeat=opts.repeat,
                    seed=opts.seed,
                    transport=opts.transport,
                )
            except Exception as e:  # reported; the other group counts still run
                logger.exception("bench: groups-%d failed", n)
                case["results"]["dask"] = {"error": f"{type(e).__name__}: {e}"}
            yield case


def format_groups_case(case: dict[str, Any]) -> list[str]:
    """Table lines of a ``groups`` case: client time per vec-step and per group."""
    res = case["results"].get("dask", {})
    if "error" in res:
        return [f"{case['case']:<12} {'DaskVecEnv':<15} {res['error']}"]
    us = 1e6
    return [
        f"{case['case']:<12} {'DaskVecEnv':<15} {res['steps_per_s']:>12,.0f}  "
        f"{res['groups']} groups on {res['workers']} workers: wall {res['wall_s_per_vec_step'] * us:,.0f} us/vec-step "
        f"({res['wall_s_per_group'] * us:.1f} us/group), client CPU {res['cpu_s_per_vec_step'] * us:,.0f} us/vec-step "
        f"({res['cpu_s_per_group'] * us:.1f} us/group); {res['transport']}"
    ]


def scenario_cases(scenario: str, sizes: list[int], kinds: list[str], opts: Any) -> Iterator[dict[str, Any]]:
    """``daskvec bench --scenario groups``: its cases when DaskVecEnv is among the vec envs (none otherwise)."""
    if "dask" in kinds:
        yield from groups_cases(sizes, opts)


#: Table lines of a case, for ``daskvec bench``'s table.
format_case = format_groups_case
