"""What every learning benchmark shares: one cluster for a run, the cases alternated, one evaluation.

:mod:`benchmarks.learning`, :mod:`benchmarks.offpolicy_learning`,
:mod:`benchmarks.time_to_reward`, :mod:`benchmarks.ahead_parity` and
:mod:`benchmarks.ahead_sample_efficiency` train several cases on several seeds and compare
them; a new learning benchmark takes its cluster, its order of runs and its evaluation
from here, so that its figures can be set beside theirs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import gymnasium as gym
import numpy as np

__all__ = ["alternated", "episode_returns", "evaluate", "learning_client"]

Case = TypeVar("Case")


def alternated(cases: Sequence[Case], seeds: Sequence[int]) -> Iterator[tuple[int, Case]]:
    """``(seed, case)`` for every case on every seed: the cases in turn, the order rotated by one each seed.

    No case always runs first (on a cold cluster) or last (after the others warmed the
    machine), and a drift in the machine's load over the run reaches every case alike.
    """
    for k, seed in enumerate(seeds):
        shift = k % len(cases)
        for case in [*cases[shift:], *cases[:shift]]:
            yield seed, case


@contextlib.contextmanager
def learning_client(
    scheduler: str | None = None, rtt_ms: float | None = None, hosts_cpus: str | None = None
) -> Iterator[tuple[Any, list[str]]]:
    """A ``Client`` for the daskvec cases of a run, and the addresses of its emulated hosts (if any).

    On ``scheduler``'s cluster if given; else on two emulated hosts (root, :mod:`benchmarks.hosts`)
    whose relays add ``rtt_ms`` to every round trip, if given (their processes on the CPUs
    ``hosts_cpus`` only, if given: ``taskset -c`` syntax); else on an embedded
    ``LocalCluster`` of two single-threaded worker processes. Whatever was started is
    closed on exit. Dask's stack-sampling profiler is off on the workers started here: on
    CPython 3.11 it can deadlock a worker while env groups start their threads.
    """
    if scheduler is not None and rtt_ms is not None:
        raise ValueError("give scheduler or rtt_ms, not both: rtt_ms starts emulated hosts of its own")
    if hosts_cpus is not None and rtt_ms is None:
        raise ValueError("hosts_cpus pins the emulated hosts' processes: give rtt_ms too")
    import dask
    from distributed import Client, LocalCluster

    with contextlib.ExitStack() as stack:
        hosts: list[str] = []
        if rtt_ms is not None:
            from benchmarks.hosts import EmulatedHosts, checkout_env, missing_requirements

            missing = missing_requirements()
            if missing:
                raise RuntimeError(f"rtt_ms needs emulated hosts: {missing}")
            emulated = EmulatedHosts(2, rtt_ms, cpus=hosts_cpus)
            emulated.env.update(checkout_env())  # the workers unpickle the benchmarks' env factories
            stack.callback(emulated.close)
            client = stack.enter_context(emulated.start().client())
            hosts = [h.address for h in emulated.hosts]
        else:
            address: Any = scheduler
            if scheduler is None:
                with dask.config.set({"distributed.worker.profile.enabled": False}):
                    address = stack.enter_context(
                        LocalCluster(n_workers=2, threads_per_worker=1, dashboard_address=":0", silence_logs=40)
                    )
            client = stack.enter_context(Client(address, direct_to_workers=True, set_as_default=False))
        yield client, hosts


def episode_returns(model: Any, env_id: str, episodes: int, seed: int) -> list[float]:
    """The returns of ``episodes`` deterministic episodes on a seeded ``env_id`` of its own.

    The env is wrapped in a ``Monitor``, as SB3's ``evaluate_policy`` expects (the returns
    are the episodes' own). The tests' learning checks use it too.
    """
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    env = Monitor(gym.make(env_id))
    env.reset(seed=seed)
    try:
        rewards, _ = evaluate_policy(
            model, env, n_eval_episodes=episodes, deterministic=True, return_episode_rewards=True
        )
    finally:
        env.close()
    return [float(r) for r in rewards]  # type: ignore[union-attr]  # a list: return_episode_rewards=True


def evaluate(model: Any, env_id: str, episodes: int, seed: int) -> float:
    """The mean of :func:`episode_returns`: the one evaluation of the learning benchmarks."""
    return float(np.mean(episode_returns(model, env_id, episodes, seed)))
