"""DaskVecEnv against a separate ``dask scheduler`` and ``dask worker`` processes started by the test."""

from __future__ import annotations

import functools
import sys
from typing import Any

import numpy as np
import pytest
from envs import SpaceEnv, assert_same
from stable_baselines3.common.vec_env import DummyVecEnv

from daskvec import DaskVecEnv
from daskvec.cluster.clients import scheduler_workers


@pytest.mark.timeout(240)
def test_scheduler_address_and_worker_processes(dask_processes: Any) -> None:
    procs = dask_processes(2)
    fns = [functools.partial(SpaceEnv, "dict", horizon=4, terminate_at=3 if i % 2 else None) for i in range(6)]
    venv = DaskVecEnv(fns, client=procs.address, envs_per_actor=2, timeout=60)  # an address string
    ref = DummyVecEnv(fns)
    from distributed import Client

    with Client(procs.address, set_as_default=False, timeout=60) as observer:
        worker_pids = observer.run(lambda: __import__("os").getpid())
        try:
            groups = venv.groups
            assert [g["envs"] for g in groups] == [[0, 1], [2, 3], [4, 5]]
            assert {g["worker"] for g in groups} == set(worker_pids)  # both worker processes hold envs
            assert {g["transport"] for g in groups} == {"direct"}
            assert {g["socket"] for g in groups} == {"unix"}  # worker processes on this machine
            # the envs live in the worker processes, not here
            pids = {g["worker"]: g["pid"] for g in groups}
            assert pids == {w: worker_pids[w] for w in pids}

            for v in (venv, ref):
                v.seed(2024)
            assert_same(venv.reset(), ref.reset())
            rng = np.random.default_rng(1)
            for _ in range(12):
                actions = rng.integers(0, 4, size=6)
                assert_same(venv.step(actions), ref.step(actions))

            # worker-side code stays light: stepping envs did not import SB3 or torch there
            heavy = observer.run(lambda: sorted(m for m in ("stable_baselines3", "torch") if m in sys.modules))
            assert list(heavy.values()) == [[], []]
        finally:
            venv.close()
            ref.close()

        # close() released the actors but left the scheduler and workers it did not start
        assert procs.scheduler.poll() is None and all(w.poll() is None for w in procs.workers)

        def actors(dask_scheduler: Any) -> int:
            return sum(len(ws.actors) for ws in dask_scheduler.workers.values())

        assert len(scheduler_workers(observer)) == 2
        import time

        deadline = time.monotonic() + 30
        while observer.run_on_scheduler(actors):
            assert time.monotonic() < deadline, "actors still alive after close()"
            time.sleep(0.1)


_CLIENT_SCRIPT = """
import functools, sys, time
import gymnasium as gym
from daskvec import DaskVecEnv
env = DaskVecEnv([functools.partial(gym.make, "CartPole-v1")] * 4, client=sys.argv[1], timeout=60,
                 env_process=sys.argv[2] == "env_process")
env.reset()
print("ready", flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("where", ["worker", "env_process"])
def test_groups_of_a_killed_client_are_released(dask_processes: Any, tmp_path: Any, where: str) -> None:
    """A client that dies without closing (kill -9, a notebook kernel killed) leaves nothing on the workers."""
    import os
    import signal
    import subprocess
    import time

    from distributed import Client

    def _held_by_workers() -> tuple[int, int, int]:  # defined here: sent to the workers by value
        """(groups alive, daskvec threads, env processes) of a worker process, after a collection."""
        import gc
        import threading

        import psutil

        from daskvec.worker import EnvGroup, EnvHost

        gc.collect()
        groups = sum(isinstance(o, (EnvGroup, EnvHost)) for o in gc.get_objects())
        threads = sum(t.name.startswith("daskvec-") and t.name != "daskvec-reaper" for t in threading.enumerate())
        children = [p for p in psutil.Process().children() if p.status() != psutil.STATUS_ZOMBIE]
        return groups, threads, len(children)

    procs = dask_processes(2)
    script = tmp_path / "client.py"
    script.write_text(_CLIENT_SCRIPT)
    user = subprocess.Popen(
        [sys.executable, str(script), procs.address, where],
        cwd=tmp_path,
        env=procs.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert user.stdout is not None
        assert user.stdout.readline().strip() == "ready"
        with Client(procs.address, set_as_default=False, timeout=60) as observer:
            held = observer.run(_held_by_workers)
            assert sum(g for g, _, _ in held.values()) == 2  # one group of 2 envs per worker
            if where == "worker":
                assert all(t >= 3 for _, t, _ in held.values())  # two listeners and a connection each
            else:
                assert all(t >= 1 and c == 1 for _, t, c in held.values())  # stats poller; env process
            os.kill(user.pid, signal.SIGKILL)
            user.wait(timeout=30)
            deadline = time.monotonic() + 60
            while any(held.values()) and time.monotonic() < deadline:
                time.sleep(1)
                held = {w: v for w, v in observer.run(_held_by_workers).items() if any(v)}
            assert not held, f"groups and threads left on the workers after the client died: {held}"
    finally:
        if user.poll() is None:
            user.kill()
            user.wait(timeout=30)
