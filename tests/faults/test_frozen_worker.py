"""A worker holding several groups freezes mid-step: the run pays one ``step_timeout``, not one per group.

Real ``dask scheduler`` and ``dask worker`` processes; the freeze is a ``SIGSTOP`` of the
worker process, sent right after one of its groups answered a step while the other is
still in its envs' step (its env is made slow). Every observation handed out is checked
by a witness: each env's observation is ``(env index, episode, step)``, so stale,
shifted or repeated data shows. Durations are only compared with bounds derived from
``step_timeout``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import WitnessEnv, triple
from waiting import wait_until

from daskvec import DaskVecEnv
from daskvec._core.handles import Group
from daskvec.worker import INFO_KEY

N_ENVS = 4
#: The step timeout of these tests: the whole freeze must cost at most about this much.
STEP_TIMEOUT = 10.0
#: What the freeze may cost beyond one step_timeout: the rebuilds of the frozen worker's groups.
BOUND = 1.5 * STEP_TIMEOUT
#: The slow env's step: long enough that the freeze lands inside it, well below step_timeout.
SLOW = STEP_TIMEOUT / 3
#: The slow env's steps before it says it is inside a collection (the fast group's fragment is in by then).
FLAG_AFTER = 5


class FlaggingWitnessEnv(WitnessEnv):
    """The witness, never truncated, that can touch a file once it is a few steps into a collection."""

    def __init__(self, index: int) -> None:
        super().__init__(index)
        self.flag: str | None = None
        self.flagged = 0

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        out = super().step(action)
        if self.flag is not None:  # say, once, that this env is a few slow steps into a collection
            self.flagged += 1
            if self.flagged == FLAG_AFTER:
                Path(self.flag).touch()
        return out


def witness_fns() -> list[Callable[[], gym.Env[Any, Any]]]:
    return [lambda i=i: FlaggingWitnessEnv(i) for i in range(N_ENVS)]  # type: ignore[misc]


class Witness:
    """Every row handed out, checked against the one before it for the same env."""

    def __init__(self) -> None:
        self.last: dict[int, tuple[int, int, int]] = {}
        self.rebuilt: list[int] = []
        self.moved: list[int] = []

    def first(self, ids: Any, obs: Any) -> None:
        for i, o in zip(ids, np.asarray(obs), strict=True):
            assert triple(o) == (i, 0, 0), f"reset: env {i} handed out {triple(o)}"
            self.last[int(i)] = (int(i), 0, 0)

    def row(self, i: int, obs: Any, reward: float, done: bool, info: dict[str, Any], terminal: Any) -> None:
        """One env's row of a step; ``terminal``: the observation its truncation reports, if it was rebuilt."""
        now, (_, ep, t) = triple(obs), self.last[i]
        if INFO_KEY in info and info[INFO_KEY]["reason"] == "moved":  # its step happened, then a fresh env
            assert done and reward == 1.0, f"env {i}: moved with done={done}, reward={reward}"
            assert triple(terminal) == (i, ep, t + 1), f"env {i}: moved at {triple(terminal)} after {self.last[i]}"
            assert now == (i, 0, 0), f"moved env {i} handed out {now}"
            self.moved.append(i)
        elif INFO_KEY in info:  # rebuilt: a truncation whose step never happened, then a fresh env
            assert info[INFO_KEY]["reason"] == "timeout", info
            assert done and reward == 0.0, f"env {i}: rebuilt with done={done}, reward={reward}"
            assert triple(terminal) == self.last[i], f"env {i}: truncated at {triple(terminal)} after {self.last[i]}"
            assert now == (i, 0, 0), f"rebuilt env {i} handed out {now}"
            self.rebuilt.append(i)
        else:
            assert not done and now == (i, ep, t + 1), f"env {i} handed out {now} after {self.last[i]} (wrong data)"
        self.last[i] = now

    def sb3_step(self, obs: Any, rewards: Any, dones: Any, infos: list[dict[str, Any]]) -> None:
        for i in range(N_ENVS):
            self.row(i, obs[i], float(rewards[i]), bool(dones[i]), infos[i], infos[i].get("terminal_observation"))


def on_one_worker(groups: list[Group]) -> tuple[str, Group, Group]:
    """A worker holding two groups, and those two groups."""
    by_worker: dict[str, list[Group]] = {}
    for g in groups:
        by_worker.setdefault(g.worker, []).append(g)
    worker, mine = next((w, gs) for w, gs in sorted(by_worker.items()) if len(gs) == 2)
    return worker, mine[0], mine[1]


def stop(pid: int) -> None:
    """SIGSTOP process ``pid`` and wait until it is stopped (the signal lands a little later)."""
    import psutil

    os.kill(pid, signal.SIGSTOP)
    wait_until(lambda: psutil.Process(pid).status() == psutil.STATUS_STOPPED, 30, f"process {pid} to stop")


def freeze_after_one_answered(unanswered: Callable[[], list[Group]], fast: Group, slow: Group) -> None:
    """SIGSTOP the worker of ``fast`` and ``slow`` once ``fast`` answered the step in flight, ``slow`` not yet."""
    wait_until(lambda: fast not in unanswered(), STEP_TIMEOUT, "the fast group's reply")
    os.kill(fast.desc.pid, signal.SIGSTOP)
    # the freeze must land in the slow group's step for the test to mean anything
    assert slow in unanswered(), "the slow group answered before its worker froze: the test proves nothing"


@pytest.mark.timeout(240)
def test_a_frozen_worker_holding_two_groups_costs_one_step_timeout(dask_processes: Any) -> None:
    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), client=procs.address, envs_per_actor=1, step_timeout=STEP_TIMEOUT, timeout=60)
    assert env._engine.pool is not None
    pool = env._engine.pool
    worker, fast, slow = on_one_worker(env._groups)
    pid = fast.desc.pid
    guard = threading.Timer(180, os.kill, (pid, signal.SIGCONT))  # a failing test, not a stopped worker, if it hangs
    guard.start()
    try:
        env.set_attr("delay", SLOW, indices=slow.env_indices)
        witness = Witness()
        witness.first(range(N_ENVS), env.reset())
        actions = np.zeros(N_ENVS, dtype=np.int64)
        witness.sb3_step(*env.step(actions))
        started = time.monotonic()
        env.step_async(actions)
        freeze_after_one_answered(lambda: pool.unanswered(0.0), fast, slow)
        witness.sb3_step(*env.step_wait())
        witness.sb3_step(*env.step(actions))  # the fast group's worker is still frozen
        witness.sb3_step(*env.step(actions))
        took = time.monotonic() - started
        print(f"three steps from the freeze: {took:.1f}s (bound {BOUND:.0f}s)")
        assert took <= BOUND, (
            f"a worker frozen with two groups cost {took:.1f}s over three steps (step_timeout {STEP_TIMEOUT:.0f}s)"
        )
        # both groups of the frozen worker were rebuilt elsewhere, each env once
        assert sorted(witness.rebuilt) == sorted(fast.env_indices + slow.env_indices), witness.rebuilt
        assert sorted(e["env"] for e in env.restart_log) == sorted(witness.rebuilt), env.restart_log
        assert all(e["from_worker"] == worker and e["worker"] != worker for e in env.restart_log), env.restart_log
        assert worker not in {g["worker"] for g in env.groups}
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)
        env.close()


class VectorWitness(Witness):
    """:class:`Witness` for the Gymnasium face (``NEXT_STEP``): a rebuilt env's row keeps its last
    observation (reward 0, truncated), and its next row is the fresh env's first observation."""

    def __init__(self) -> None:
        super().__init__()
        self.fresh: set[int] = set()

    def batch(self, obs: Any, rewards: Any, terminated: Any, truncated: Any, info: dict[str, Any]) -> list[int]:
        ids = [int(i) for i in info["env_id"]]
        marked = info.get("_daskvec", np.zeros(len(ids), dtype=bool))
        for k, i in enumerate(ids):
            now, (_, ep, t) = triple(obs[k]), self.last[i]
            assert not terminated[k], f"env {i} terminated"
            if i in self.fresh:  # the row after a rebuild: the fresh env's first observation
                assert now == (i, 0, 0) and rewards[k] == 0.0 and not truncated[k], f"env {i} handed out {now}"
                self.fresh.discard(i)
            elif marked[k]:  # rebuilt: its step never happened
                assert info["daskvec"]["reason"][k] == "timeout", info["daskvec"]
                assert now == self.last[i], f"rebuilt env {i} handed out {now} after {self.last[i]}"
                assert rewards[k] == 0.0 and truncated[k], f"env {i}: rebuilt with reward {rewards[k]}"
                self.fresh.add(i)
                self.rebuilt.append(i)
            else:
                assert now == (i, ep, t + 1) and not truncated[k], f"env {i} handed out {now} after {self.last[i]}"
            self.last[i] = now
        return ids


@pytest.mark.timeout(240)
def test_a_frozen_worker_holding_two_groups_costs_one_step_timeout_through_send_and_recv(
    dask_processes: Any,
) -> None:
    from daskvec.gymnasium.vector_env import DaskVectorEnv
    from daskvec.transport import wait_ready

    procs = dask_processes(2)
    env = DaskVectorEnv(
        witness_fns(), procs.address, envs_per_actor=1, step_timeout=STEP_TIMEOUT, timeout=60, batch_size=1
    )
    pool = env._engine.pool
    assert pool is not None
    worker, fast, slow = on_one_worker(pool.groups)
    pid = fast.desc.pid
    guard = threading.Timer(180, os.kill, (pid, signal.SIGCONT))
    guard.start()

    def round_trip() -> None:
        """Send every env its action, then take batches until each env came back once."""
        env.send(np.zeros(N_ENVS, dtype=np.int64))
        back: list[int] = []
        while len(back) < N_ENVS:
            back += witness.batch(*env.recv())
        assert sorted(back) == list(range(N_ENVS)), back

    try:
        env.set_attr("delay", [SLOW if i in slow.env_indices else 0.0 for i in range(N_ENVS)])
        witness = VectorWitness()
        obs, _ = env.reset()
        witness.first(range(N_ENVS), obs)
        round_trip()
        started = time.monotonic()
        env.send(np.zeros(N_ENVS, dtype=np.int64))
        freeze_after_one_answered(lambda: [g for g in (fast, slow) if not wait_ready([g.channel], 0.0)], fast, slow)
        back: list[int] = []
        while len(back) < N_ENVS:
            back += witness.batch(*env.recv())
        round_trip()  # the fast group's worker is still frozen
        round_trip()
        took = time.monotonic() - started
        print(f"three rounds from the freeze: {took:.1f}s (bound {BOUND:.0f}s)")
        assert took <= BOUND, (
            f"a worker frozen with two groups cost {took:.1f}s over three rounds (step_timeout {STEP_TIMEOUT:.0f}s)"
        )
        assert sorted(witness.rebuilt) == sorted(fast.env_indices + slow.env_indices), witness.rebuilt
        assert not witness.fresh, f"envs {witness.fresh} never handed out their fresh env's first observation"
        assert worker not in {g.worker for g in pool.groups}
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)
        env.close()


@pytest.mark.timeout(300)
def test_a_frozen_worker_holding_two_groups_costs_one_step_timeout_in_worker_side_rollouts(
    dask_processes: Any, tmp_path: Path
) -> None:
    """DaskPPO collecting on the workers: the rollout during which the worker froze waits for its
    heartbeats to stop for ``step_timeout``; the next one must not wait for them a second time."""
    from stable_baselines3.common.callbacks import BaseCallback

    from daskvec.sb3 import DaskPPO

    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), client=procs.address, envs_per_actor=1, step_timeout=STEP_TIMEOUT, timeout=60)
    worker, fast, slow = on_one_worker(env._groups)
    pid = fast.desc.pid
    flag = tmp_path / "slow-env-inside"
    witness = Witness()
    n_steps = 32

    def freeze_when_flagged() -> None:
        deadline = time.monotonic() + STEP_TIMEOUT * 3
        while not flag.exists():
            if time.monotonic() > deadline:
                return  # the test fails below: nothing froze
            time.sleep(0.01)
        os.kill(pid, signal.SIGSTOP)

    class Freeze(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollouts = 0
            self.started = 0.0
            self.collected: dict[int, float] = {}
            self.rebuilt_in: dict[int, list[int]] = {}

        def _on_training_start(self) -> None:
            witness.first(range(N_ENVS), self.model._last_obs)

        def _on_rollout_start(self) -> None:
            self.rollouts += 1
            if self.rollouts == 2:
                self.training_env.set_attr("delay", SLOW / 10, indices=slow.env_indices)
                self.training_env.set_attr("flag", str(flag), indices=slow.env_indices)
                threading.Thread(target=freeze_when_flagged, daemon=True).start()
            self.started = time.monotonic()

        def _on_step(self) -> bool:
            self.collected.setdefault(self.rollouts, time.monotonic() - self.started)  # replayed once it is in
            before = len(witness.rebuilt)
            loc = self.locals
            witness.sb3_step(loc["new_obs"], loc["rewards"], loc["dones"], loc["infos"])
            self.rebuilt_in.setdefault(self.rollouts, []).extend(witness.rebuilt[before:])
            return True

    guard = threading.Timer(240, os.kill, (pid, signal.SIGCONT))
    guard.start()
    callback = Freeze()
    try:
        model = DaskPPO("MlpPolicy", env, n_steps=n_steps, batch_size=n_steps * N_ENVS, n_epochs=1, device="cpu")
        model.learn(total_timesteps=n_steps * N_ENVS * 3, callback=callback)
        # the freeze landed inside the slow group's fragment, after the fast group's was in
        assert sorted(callback.rebuilt_in.get(2, [])) == sorted(slow.env_indices), callback.rebuilt_in
        assert sorted(witness.rebuilt) == sorted(fast.env_indices + slow.env_indices), witness.rebuilt
        print(f"rollouts collected in {callback.collected}")
        # waiting for heartbeats to stop for step_timeout again would take at least that long
        assert callback.collected[3] < STEP_TIMEOUT, (
            f"the rollout after the freeze took {callback.collected[3]:.1f}s (step_timeout {STEP_TIMEOUT:.0f}s)"
        )
        assert worker not in {g["worker"] for g in env.groups}
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)
        env.close()


@pytest.mark.timeout(300)
def test_a_worker_frozen_past_step_timeout_then_resumed_takes_envs_again(dask_processes: Any) -> None:
    """Its quarantine ends once it answers probes again, and the envs spread back over both workers."""
    from daskvec._core.directory import PROBES_TO_HEAL
    from daskvec._core.recovery import PROBE_INTERVAL

    procs = dask_processes(2)
    step_timeout, timeout = 3.0, 20.0
    env = DaskVecEnv(witness_fns(), client=procs.address, envs_per_actor=1, step_timeout=step_timeout, timeout=timeout)
    worker, fast, other = on_one_worker(env._groups)
    pid = fast.desc.pid
    guard = threading.Timer(240, os.kill, (pid, signal.SIGCONT))
    guard.start()
    try:
        witness = Witness()
        witness.first(range(N_ENVS), env.reset())
        actions = np.zeros(N_ENVS, dtype=np.int64)
        witness.sb3_step(*env.step(actions))
        stop(pid)
        witness.sb3_step(*env.step(actions))  # both its groups time out: rebuilt on the other worker
        assert {g["worker"] for g in env.groups} != {worker} and worker not in {g["worker"] for g in env.groups}
        os.kill(pid, signal.SIGCONT)
        # probes every PROBE_INTERVAL, each answered within timeout; then a census and the moves
        bound = PROBES_TO_HEAL * (PROBE_INTERVAL + timeout) + PROBE_INTERVAL + timeout
        resumed = time.monotonic()
        while sorted(Counter(g["worker"] for g in env.groups).values()) != [2, 2]:
            assert time.monotonic() - resumed < bound, (
                f"{bound:.0f}s after it resumed, the envs are still spread {Counter(g['worker'] for g in env.groups)}"
            )
            witness.sb3_step(*env.step(actions))
            time.sleep(0.05)  # pacing, not waiting for anything: the steps are what brings the move
        print(f"spread again {time.monotonic() - resumed:.1f}s after the worker resumed (bound {bound:.0f}s)")
        witness.sb3_step(*env.step(actions))
        assert sorted(witness.rebuilt) == sorted(fast.env_indices + other.env_indices), witness.rebuilt
        moved_to = {e["env"]: e["worker"] for e in env.restart_log if e["reason"] == "moved"}
        assert sorted(moved_to) == sorted(witness.moved) and set(moved_to.values()) == {worker}, env.restart_log
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)
        env.close()
