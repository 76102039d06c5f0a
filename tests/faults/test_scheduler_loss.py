"""The scheduler lost (SIGKILL) or frozen (SIGSTOP) under a stepping vec env.

Real ``dask scheduler`` and ``dask worker`` processes. A witness env's observation is
``(env index, episode, step)``: every observation a vec env hands out is checked
against the one before it (the next step of the same episode, or the first step of the
next one after a ``done``), so that no call can pass off old buffers as a step.

- SIGKILL of the scheduler under a ``DaskVecEnv``, a ``DaskVectorEnv`` and ``DaskPPO``:
  a :class:`~daskvec.errors.SchedulerLostError` naming the scheduler, every later call
  raises it, ``close()`` returns promptly.
- SIGSTOP of the scheduler while a worker holding envs is SIGKILLed: each call returns
  or raises within its timeout (it used to block until the scheduler was resumed).
- SIGSTOP of the scheduler alone: the direct channels keep stepping.

Elapsed times are bounds on waits that used to be unbounded, generous for a loaded
machine (``2 * timeout + 30`` s per call), not performance thresholds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import DaskProcesses
from envs import WitnessEnv, triple
from stable_baselines3.common.callbacks import BaseCallback

from daskvec import DaskVecEnv, DaskVectorEnv
from daskvec.errors import DaskVecEnvError, SchedulerLostError
from daskvec.sb3 import DaskPPO
from daskvec.sb3.vec_env import State

N_ENVS = 4
HORIZON = 7
#: timeout, step_timeout and worker_wait_timeout of every vec env here.
TIMEOUT = 20.0
OPTIONS = {"timeout": TIMEOUT, "step_timeout": TIMEOUT, "worker_wait_timeout": TIMEOUT}
#: A bound on any single call: its timeout, twice over, plus room for a loaded 2-core machine.
CALL_BOUND = 2 * TIMEOUT + 30
#: A guard on the wait for the typed error after the scheduler is killed (Dask's reconnection
#: attempts, then the timeout): the test fails rather than loops if it never comes.
LOSS_BOUND = 90.0
#: A guard on "close() returns promptly" once the scheduler is lost.
CLOSE_BOUND = 30.0


def witness_fns() -> list[Callable[[], gym.Env[Any, Any]]]:
    return [lambda i=i: WitnessEnv(i, HORIZON) for i in range(N_ENVS)]  # type: ignore[misc]


class Witness:
    """Every observation handed out, checked against the one before it, per env."""

    def __init__(self) -> None:
        self.last: list[tuple[int, int, int]] | None = None
        self.steps = 0

    def first(self, obs: Any) -> None:
        got = [triple(o) for o in np.asarray(obs)]
        for i, (idx, _, t) in enumerate(got):
            assert idx == i and t == 0, f"reset: env {i} handed out {got[i]}"
        self.last = got

    def sb3_step(self, obs: Any, dones: Any, infos: list[dict[str, Any]]) -> None:
        """A ``VecEnv`` step: a done env's row is the next episode's first observation."""
        assert self.last is not None
        for i in range(N_ENVS):
            _, ep, t = self.last[i]
            now = triple(obs[i])
            if dones[i]:
                if "daskvec" in infos[i]:  # rebuilt: a fresh env
                    assert now == (i, 0, 0), f"step {self.steps}: rebuilt env {i} handed out {now}"
                else:
                    term = triple(infos[i]["terminal_observation"])
                    assert term == (i, ep, t + 1) and t + 1 == HORIZON, (
                        f"step {self.steps}: env {i} ended at {term} after {self.last[i]}"
                    )
                    assert now == (i, ep + 1, 0), f"step {self.steps}: env {i} handed out {now} after {term}"
            else:
                assert now == (i, ep, t + 1), (
                    f"step {self.steps}: env {i} handed out {now} after {self.last[i]} (stale or wrong data)"
                )
            self.last[i] = now
        self.steps += 1

    def vector_step(self, obs: Any, terminated: Any, truncated: Any, prev_done: np.ndarray) -> np.ndarray:
        """A Gymnasium ``NEXT_STEP`` step: after a done, the row is the next episode's first observation."""
        assert self.last is not None
        for i in range(N_ENVS):
            _, ep, t = self.last[i]
            now = triple(obs[i])
            want = (i, ep + 1, 0) if prev_done[i] else (i, ep, t + 1)
            assert now == want, f"step {self.steps}: env {i} handed out {now} after {self.last[i]}, wanted {want}"
            assert bool(truncated[i]) == (now[2] == HORIZON) and not terminated[i], f"step {self.steps}: env {i}"
            self.last[i] = now
        self.steps += 1
        return np.logical_or(terminated, truncated)


def kill_scheduler(procs: DaskProcesses) -> None:
    """SIGKILL the scheduler process (the fixture's teardown skips processes already gone)."""
    procs.scheduler.kill()
    procs.scheduler.wait(timeout=10)


@contextlib.contextmanager
def frozen_scheduler(procs: DaskProcesses, resume_after: float) -> Iterator[None]:
    """SIGSTOP the scheduler for the block; SIGCONT at its end, or after ``resume_after`` s at the latest.

    The latest resume is a guard: a call that waits for the scheduler with no bound
    returns after it (and fails its elapsed-time check) instead of hanging the test.
    """
    pid = procs.scheduler.pid
    os.kill(pid, signal.SIGSTOP)
    guard = threading.Timer(resume_after, os.kill, (pid, signal.SIGCONT))
    guard.start()
    try:
        yield
    finally:
        guard.cancel()
        os.kill(pid, signal.SIGCONT)


def timed(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    """``(result, exception, seconds)`` of ``fn()``."""
    start = time.monotonic()
    try:
        return fn(), None, time.monotonic() - start
    except Exception as e:  # recorded, and checked by the caller
        return None, e, time.monotonic() - start


class Losses:
    """The SchedulerLostErrors a test sees: their type checked at once, the address they name at the end.

    The address is checked last so that a wrong address does not hide the behaviour
    checked after the first error.
    """

    def __init__(self, procs: DaskProcesses) -> None:
        self.address = procs.address
        self.seen: list[tuple[str, SchedulerLostError]] = []

    def check(self, err: BaseException | None, what: str) -> None:
        assert isinstance(err, SchedulerLostError), f"{what}: wanted SchedulerLostError, got {err!r}"
        assert isinstance(err, DaskVecEnvError)
        self.seen.append((what, err))

    def every_call_raises(self, calls: dict[str, Callable[[], Any]]) -> None:
        """Each call raises SchedulerLostError again (twice over: it stays broken) and returns nothing."""
        for _ in range(2):
            for what, call in calls.items():
                got, err, seconds = timed(call)
                assert err is not None, f"{what} returned {got!r} after the scheduler was lost"
                self.check(err, what)
                assert seconds < CALL_BOUND, f"{what} took {seconds:.1f}s to raise"

    def assert_named(self) -> None:
        """Every error names the scheduler (attribute ``address`` and message)."""
        assert self.seen
        wrong = {
            what: err.address for what, err in self.seen if err.address != self.address or self.address not in str(err)
        }
        assert not wrong, (
            f"SchedulerLostError must name the scheduler {self.address}; these named {wrong} "
            f"(first message: {self.seen[0][1]})"
        )


def assert_prompt_close(close: Callable[[], None]) -> float:
    start = time.monotonic()
    close()
    seconds = time.monotonic() - start
    assert seconds < CLOSE_BOUND, f"close() took {seconds:.1f}s after the scheduler was lost"
    return seconds


def report(**figures: Any) -> None:
    """The elapsed figures, printed for ``-s`` runs."""
    print(" ".join(f"{k}={v:.1f}s" if isinstance(v, float) else f"{k}={v}" for k, v in figures.items()))


def sb3_step(witness: Witness, env: DaskVecEnv, actions: np.ndarray) -> None:
    obs, _, dones, infos = env.step(actions)
    witness.sb3_step(obs, dones, infos)


def sb3_calls(env: DaskVecEnv) -> dict[str, Callable[[], Any]]:
    actions = np.zeros(N_ENVS, dtype=np.int64)
    return {
        "step": lambda: env.step(actions),
        "step_async": lambda: env.step_async(actions),
        "reset": env.reset,
        "get_attr": lambda: env.get_attr("index"),
        "set_attr": lambda: env.set_attr("index", 0),
        "env_method": lambda: env.env_method("reset"),
    }


# --------------------------------------------------------------------------- the scheduler killed
@pytest.mark.timeout(240)
def test_scheduler_killed_under_a_stepping_daskvecenv(dask_processes: Any) -> None:
    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), procs.address, **OPTIONS)
    try:
        witness = Witness()
        witness.first(env.reset())
        actions = np.zeros(N_ENVS, dtype=np.int64)
        for _ in range(3):
            sb3_step(witness, env, actions)
        kill_scheduler(procs)
        start = time.monotonic()
        err = None
        while err is None:  # steps may go on over the channels until the workers notice; then the typed error
            assert time.monotonic() - start < LOSS_BOUND, f"still stepping {LOSS_BOUND:.0f}s after the scheduler died"
            result, err, _ = timed(lambda: env.step(actions))
            if err is None:
                obs, _, dones, infos = result
                witness.sb3_step(obs, dones, infos)
        to_error = time.monotonic() - start
        losses = Losses(procs)
        losses.check(err, "the first failing step")
        assert env.state is State.BROKEN
        losses.every_call_raises(sb3_calls(env))
        assert env.state is State.BROKEN
        closing = assert_prompt_close(env.close)
        assert env.closed
        report(steps_after_kill=witness.steps - 3, to_error=to_error, close=closing)
        losses.assert_named()
    finally:
        env.close()


@pytest.mark.timeout(240)
def test_scheduler_killed_under_a_stepping_daskvectorenv(dask_processes: Any) -> None:
    procs = dask_processes(2)
    env = DaskVectorEnv(witness_fns(), procs.address, **OPTIONS)
    try:
        witness = Witness()
        obs, _ = env.reset(seed=0)
        witness.first(obs)
        actions = np.zeros(N_ENVS, dtype=np.int64)
        done = np.zeros(N_ENVS, dtype=bool)
        for _ in range(3):
            obs, _, term, trunc, _ = env.step(actions)
            done = witness.vector_step(obs, term, trunc, done)
        kill_scheduler(procs)
        start = time.monotonic()
        err = None
        while err is None:
            assert time.monotonic() - start < LOSS_BOUND, f"still stepping {LOSS_BOUND:.0f}s after the scheduler died"
            result, err, _ = timed(lambda: env.step(actions))
            if err is None:
                obs, _, term, trunc, _ = result
                done = witness.vector_step(obs, term, trunc, done)
        to_error = time.monotonic() - start
        losses = Losses(procs)
        losses.check(err, "the first failing step")
        calls = {
            "step": lambda: env.step(actions),
            "reset": lambda: env.reset(seed=1),
            "get_attr": lambda: env.get_attr("index"),
            "call": lambda: env.call("reset"),
            "send": lambda: env.send(actions),
        }
        losses.every_call_raises(calls)
        closing = assert_prompt_close(env.close)
        report(steps_after_kill=witness.steps - 3, to_error=to_error, close=closing)
        losses.assert_named()
    finally:
        env.close()


class KillOnRollout(BaseCallback):
    """Witnesses every step of the rollouts; SIGKILLs the scheduler as rollout ``kill_at`` starts."""

    def __init__(self, procs: DaskProcesses, kill_at: int) -> None:
        super().__init__()
        self.procs, self.kill_at = procs, kill_at
        self.witness = Witness()
        self.rollouts = 0
        self.killed_at: float | None = None
        self.steps_after_kill = 0

    def _on_rollout_start(self) -> None:
        self.rollouts += 1
        if self.witness.last is None:
            self.witness.first(self.model._last_obs)
        if self.rollouts == self.kill_at:
            kill_scheduler(self.procs)
            self.killed_at = time.monotonic()

    def _on_step(self) -> bool:
        loc = self.locals
        before = [triple(o) for o in np.asarray(loc["obs"])]
        assert before == self.witness.last, f"a step started from {before}, not from {self.witness.last}"
        self.witness.sb3_step(loc["new_obs"], loc["dones"], loc["infos"])
        if self.killed_at is not None:
            self.steps_after_kill += 1
        return True


@pytest.mark.timeout(240)
@pytest.mark.usefixtures("one_torch_thread")
def test_scheduler_killed_under_daskppo_learn(dask_processes: Any) -> None:
    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), procs.address, **OPTIONS)
    try:
        model = DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
        cb = KillOnRollout(procs, kill_at=2)
        with pytest.raises(Exception) as caught:  # its type is checked below
            model.learn(16 * N_ENVS * 10_000, callback=cb)  # ends only by the error
        assert cb.killed_at is not None, "learn() ended before the scheduler was killed"
        to_error = time.monotonic() - cb.killed_at
        assert to_error < LOSS_BOUND
        losses = Losses(procs)
        losses.check(caught.value, "learn()")
        assert env.state is State.BROKEN
        losses.every_call_raises(sb3_calls(env))
        with pytest.raises(SchedulerLostError):
            model.learn(16 * N_ENVS, reset_num_timesteps=False)
        closing = assert_prompt_close(env.close)
        report(rollouts=cb.rollouts, steps_after_kill=cb.steps_after_kill, to_error=to_error, close=closing)
        losses.assert_named()
    finally:
        env.close()


# --------------------------------------------------------------------------- the scheduler frozen
@pytest.mark.timeout(300)
def test_frozen_scheduler_and_a_lost_worker_bound_every_call(dask_processes: Any) -> None:
    """SIGSTOP of the scheduler, then SIGKILL of a worker holding envs: each call ends within its timeout."""
    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), procs.address, envs_per_actor=2, **OPTIONS)
    try:
        witness = Witness()
        witness.first(env.reset())
        actions = np.zeros(N_ENVS, dtype=np.int64)
        sb3_step(witness, env, actions)
        victim = env.groups[0]
        (proc,) = [p for p in procs.workers if p.pid == victim["pid"]]
        calls = sb3_calls(env)
        order = ["step", "step", "reset", "get_attr", "env_method", "step"]
        record: list[tuple[str, str, float]] = []
        # the guard resumes the scheduler once every call could have used its bound
        with frozen_scheduler(procs, resume_after=CALL_BOUND + 60):
            procs.kill_worker(proc)
            for what in order:
                got, err, seconds = timed(calls[what])
                record.append((what, "returned" if err is None else type(err).__name__, seconds))
                assert seconds < CALL_BOUND, (
                    f"{what} took {seconds:.1f}s with the scheduler frozen (timeouts {TIMEOUT:.0f}s): {record}"
                )
                if err is None and what == "step":
                    witness.sb3_step(got[0], got[2], got[3])
                elif err is not None:
                    assert isinstance(err, DaskVecEnvError), f"{what} raised {err!r}"
            # the lost envs cannot be rebuilt without a scheduler: the env is broken, for good
            assert env.state is State.BROKEN, record
            losses = Losses(procs)
            losses.check(timed(calls["step"])[1], "a step after the others")
            closing = assert_prompt_close(env.close)
        report(calls=[(w, o, round(s, 1)) for w, o, s in record], close=closing)
        losses.assert_named()
    finally:
        env.close()


@pytest.mark.timeout(240)
def test_frozen_scheduler_does_not_stop_direct_stepping(dask_processes: Any) -> None:
    """With the scheduler SIGSTOPped and no worker lost, the direct channels keep stepping."""
    procs = dask_processes(2)
    env = DaskVecEnv(witness_fns(), procs.address, transport="direct", **OPTIONS)
    try:
        assert env.transport == "direct"
        witness = Witness()
        witness.first(env.reset())
        actions = np.zeros(N_ENVS, dtype=np.int64)
        with frozen_scheduler(procs, resume_after=CALL_BOUND + 60):
            start = time.monotonic()
            # 20 steps, and on for a few seconds so that the dashboard figures fall due
            # (sent without waiting: the stepping thread never waits for the scheduler)
            while witness.steps < 20 or time.monotonic() - start < 5.0:
                assert witness.steps < 1_000_000
                obs, _, dones, infos = env.step(actions)
                witness.sb3_step(obs, dones, infos)
                assert "daskvec" not in str(infos), infos
            stepped = time.monotonic() - start
            assert env.state is State.IDLE
            assert env.get_attr("index") == list(range(N_ENVS))  # attribute calls go over the channels too
            closing = assert_close_bounded(env)
        report(steps=witness.steps, stepping=stepped, close=closing)
    finally:
        env.close()


def assert_close_bounded(env: DaskVecEnv) -> float:
    """close() with the scheduler frozen waits at most its bounded waits (a drain, a log event, the client)."""
    start = time.monotonic()
    env.close()
    seconds = time.monotonic() - start
    assert seconds < CALL_BOUND, f"close() took {seconds:.1f}s with the scheduler frozen"
    return seconds


@pytest.mark.timeout(240)
def test_a_vec_env_made_while_the_scheduler_is_frozen_raises_within_its_timeout(dask_processes: Any) -> None:
    """Construction asks the scheduler with the vec env's ``timeout``: it raises the typed error, where it
    waited Dask's 30 s (and, the scheduler back meanwhile, went on as if nothing had happened)."""
    from distributed import Client

    procs = dask_processes(1)
    with Client(procs.address, set_as_default=False, timeout=60) as client:
        client.wait_for_workers(1, timeout=60)
        with frozen_scheduler(procs, resume_after=15):  # longer than the timeout, shorter than Dask's 30 s
            got, err, seconds = timed(lambda: DaskVecEnv(witness_fns(), client, timeout=4, worker_wait_timeout=4))
        if got is not None:
            got.close()
        assert isinstance(err, SchedulerLostError), (
            f"wanted SchedulerLostError after {seconds:.1f}s, got {got or err!r}"
        )
        assert procs.address in str(err)


@pytest.mark.timeout(240)
def test_a_frozen_scheduler_given_by_address_fails_the_connection_within_connect_timeout(
    dask_processes: Any,
) -> None:
    """Dask's ``Client(address, timeout=...)`` bounds the TCP connection, not the handshake
    after it: with the scheduler frozen it waited until the scheduler answered (over 200 s)."""
    from distributed import Client

    procs = dask_processes(1)
    with Client(procs.address, set_as_default=False, timeout=60) as observer:
        observer.wait_for_workers(1, timeout=60)
        before = observer.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.clients))
        with frozen_scheduler(procs, resume_after=30):
            got, err, seconds = timed(lambda: DaskVecEnv(witness_fns(), procs.address, timeout=3, connect_timeout=3))
        if got is not None:
            got.close()
        assert isinstance(err, ValueError), f"wanted ValueError after {seconds:.1f}s, got {got or err!r}"
        assert seconds < 3 + 5, f"the connection took {seconds:.1f}s to fail"
        assert procs.address in str(err) and "did not answer" in str(err)
        # the Client that came after the caller gave up is closed, not left connected
        deadline = time.monotonic() + 30
        while (now := observer.run_on_scheduler(lambda dask_scheduler: sorted(dask_scheduler.clients))) != before:
            assert time.monotonic() < deadline, f"clients {now} after the scheduler came back, {before} before"
            time.sleep(0.2)


def test_the_error_of_a_client_that_dropped_its_scheduler_connection_says_so() -> None:
    """A client that lost its scheduler drops its RPC object: the next call fails with an
    ``AttributeError`` of ``None``, which the message named ("'NoneType' object has no
    attribute 'identity'", seen by a fault probe under DaskPPO)."""
    from types import SimpleNamespace

    from daskvec._core.dask_internals import scheduler_lost

    client = SimpleNamespace(scheduler=SimpleNamespace(address="tcp://10.0.0.1:8786"))
    err = scheduler_lost(client, AttributeError("'NoneType' object has no attribute 'identity'"), 5.0)
    assert isinstance(err, SchedulerLostError) and err.address == "tcp://10.0.0.1:8786"
    assert "NoneType" not in str(err) and "lost its connection" in str(err)
