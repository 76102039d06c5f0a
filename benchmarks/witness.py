"""The witness env, and the probe of what daskvec holds on a worker: shared by the soak and the tests.

:class:`WitnessEnv`'s observation is ``(env index, episode, step)``, so a caller can prove
from every row it is handed that no step returned stale, shifted or foreign data.
:func:`footprint_probe` tells what daskvec holds in a worker process (threads, sockets,
env processes), to check that ``close()`` left nothing there.

Both live here, not in the tests, so that ``benchmarks/soak.py`` runs without the tests
and ``dask worker`` processes started with the checkout root on ``PYTHONPATH`` import
them; the tests import them from here (``tests/envs.py`` re-exports the witness).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


class WitnessEnv(gym.Env[np.ndarray, np.int64]):
    """Observation ``(index, episode, step)``: a test proves from it that no step returned stale,
    shifted or foreign data. Truncated after ``horizon`` steps (never, if ``None``); each step
    sleeps ``delay`` seconds.

    Parameters
    ----------
    index : int
        The env's index in its vec env: the first element of every observation.
    horizon : int, optional
        Steps after which an episode is truncated (``None``: never).
    delay : float
        Seconds each step sleeps (a stand-in for an env's own work).
    """

    def __init__(self, index: int, horizon: int | None = None, delay: float = 0.0) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1e9, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.horizon, self.delay = index, horizon, delay
        self.episode = -1
        self.t = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.episode, self.t], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return self._obs(), {}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        return self._obs(), 1.0, False, self.horizon is not None and self.t >= self.horizon, {}


def triple(x: Any) -> tuple[int, int, int]:
    """A witness observation as ``(index, episode, step)``.

    Parameters
    ----------
    x : array_like
        One env's observation.

    Returns
    -------
    tuple of int
        ``(index, episode, step)``.
    """
    a = np.asarray(x)
    return int(a[0]), int(a[1]), int(a[2])


def footprint_probe(dask_ports: set[int]) -> Any:
    """A function for ``Client.run``: what daskvec holds in a worker process.

    Its threads (by name), its sockets (every socket of the process but Dask's own
    comms, which end at the scheduler's or a worker's port) and its child processes (env
    processes). Made here, as a closure, so that it travels to the workers by value.

    Parameters
    ----------
    dask_ports : set of int
        The ports of Dask's own comms (see :func:`dask_ports`).

    Returns
    -------
    callable
        ``footprint() -> {"threads": [...], "sockets": [...], "env processes": [...]}``.
    """
    ports = frozenset(dask_ports)

    def footprint() -> dict[str, list[str]]:
        import threading

        import psutil

        def dask_comm(conn: Any) -> bool:
            return any(isinstance(a, tuple) and len(a) == 2 and a[1] in ports for a in (conn.laddr, conn.raddr))

        me = psutil.Process()
        return {
            "threads": sorted(t.name for t in threading.enumerate() if t.name.startswith("daskvec")),
            "sockets": sorted(
                f"{c.family.name} {c.laddr}->{c.raddr} {c.status}"
                for c in me.net_connections("all")
                if not dask_comm(c)
            ),
            "env processes": sorted(str(p.pid) for p in me.children() if p.status() != psutil.STATUS_ZOMBIE),
        }

    return footprint


def dask_ports(client: Any) -> set[int]:
    """The ports of the scheduler and of every worker: the ends of Dask's own comms.

    Parameters
    ----------
    client : distributed.Client
        A client of the cluster.

    Returns
    -------
    set of int
    """
    info = client.scheduler_info()
    return {int(a.rsplit(":", 1)[1]) for a in [info["address"], *info["workers"]]}
