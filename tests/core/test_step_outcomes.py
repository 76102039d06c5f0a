"""A step whose groups end in different ways at once: replies, an env error, a timeout.

Every group's outcome of a step must be dealt with before the step is over, whatever
is raised: otherwise a group that timed out is still stepping when the caller steps
again, and its late reply is read as the next step's result.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import assert_same

from daskvec import DaskVecEnv
from daskvec.cluster.clients import scheduler_workers
from daskvec.protocol.messages import INFO_KEY, StepReply


class ScriptedEnv(gym.Env[np.ndarray, int]):
    """Observation ``[steps since reset, env index]``; at step ``at`` it raises (once) or sleeps."""

    def __init__(self, index: int, at: int, raise_at: bool, sleep_s: float = 0.0) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.at, self.raise_at, self.sleep_s = index, at, raise_at, sleep_s
        self.t = 0
        self.raised = False

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.t, self.index], dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.t == self.at:
            if self.raise_at and not self.raised:
                self.raised = True
                raise RuntimeError(f"env {self.index} fails at its step {self.t}")
            if self.sleep_s:
                time.sleep(self.sleep_s)
        return np.array([self.t, self.index], dtype=np.float32), 1.0, False, False, {}


@pytest.fixture
def dclient(cluster2: Any) -> Iterator[Any]:
    from distributed import Client

    with Client(cluster2, direct_to_workers=True, set_as_default=False) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", ["direct", "actor"])
def test_env_error_and_timeout_in_one_step(dclient: Any, transport: str) -> None:
    """Env 0 raises at its 5th step while env 1 sleeps 3 s in the same step (step_timeout=1).

    The error reaches the caller; the hung group is rebuilt before it does, so the next
    step reports env 1 as truncated (it was lost with its group) and returns the rebuilt
    env's observation, never the late reply of the step that timed out.
    """
    workers = sorted(scheduler_workers(dclient))
    fns = [
        lambda: ScriptedEnv(0, at=5, raise_at=True),
        lambda: ScriptedEnv(1, at=5, raise_at=False, sleep_s=3.0),
    ]
    env = DaskVecEnv(
        fns, client=dclient, envs_per_actor=1, workers=workers, step_timeout=1.0, timeout=30, transport=transport
    )
    try:
        assert len({g["worker"] for g in env.groups}) == 2  # one group per worker
        obs = env.reset()
        for t in range(1, 5):
            obs, _, dones, _ = env.step(np.zeros(2, dtype=np.int64))
            assert obs[:, 0].tolist() == [t, t] and not dones.any()
        with pytest.raises(RuntimeError, match="env 0 fails at its step 5"):
            env.step(np.zeros(2, dtype=np.int64))
        obs, rewards, dones, infos = env.step(np.zeros(2, dtype=np.int64))
        assert obs[1].tolist() == [1, 1], f"env 1 returned {obs[1].tolist()}: a late reply of the timed-out step"
        # env 0 raised at step 5 (its counter counted it) and made step 6 now
        assert obs[0].tolist() == [6, 0] and not dones[0]
        # env 1: the end of its old episode, reported now; its observation is the rebuilt env's
        assert dones[1] and rewards[1] == 0.0
        assert infos[1]["TimeLimit.truncated"] is True and infos[1][INFO_KEY]["reason"] == "timeout"
        assert infos[1]["terminal_observation"].tolist() == [4, 1]  # what the learner saw last
        # env 1's group timed out and was rebuilt (before the error was raised)
        assert [(e["env"], e["reason"]) for e in env.restart_log] == [(1, "timeout")]
        obs, _, dones, _ = env.step(np.zeros(2, dtype=np.int64))
        assert obs[:, 0].tolist() == [7, 2] and not dones.any()
    finally:
        env.close()


# --------------------------------------------------------------------------- episode ends, compact replies
class EndingEnv(gym.Env[np.ndarray, int]):
    """Observation ``[steps since reset, env index, episodes]``; no infos, so replies travel compact.

    ``script`` maps the env's step count (over its life) to how the episode ends then:
    ``"terminated"`` or ``"truncated"``. The reward is ``index + steps since reset``.
    """

    def __init__(self, index: int, script: dict[int, str]) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.script = index, script
        self.t = self.steps = self.episodes = 0

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.index, self.episodes], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.steps += 1
        how = self.script.get(self.steps)
        obs, reward = self._obs(), float(self.index + self.t)
        if how is not None:
            self.episodes += 1
        return obs, reward, how == "terminated", how == "truncated", {}


# step -> {env: how}; two groups of three envs (0-2, 3-5): the last env of a group often ends alone
ENDINGS: dict[int, dict[int, str]] = {
    2: {2: "terminated"},
    3: {5: "truncated"},
    4: {0: "terminated", 5: "terminated"},
    5: {2: "truncated", 3: "truncated"},
    6: {1: "terminated", 2: "terminated"},
    8: {5: "terminated"},
}


def ending_fns() -> list[Any]:
    scripts = [{step: ends[i] for step, ends in ENDINGS.items() if i in ends} for i in range(6)]
    return [functools.partial(EndingEnv, i, scripts[i]) for i in range(6)]


@pytest.mark.timeout(120)
def test_episode_ends_on_the_compact_path(dclient: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Episodes that end (the last env of a group alone, among others) reach SB3's infos from compact replies.

    The envs add no infos, so every step reply travels as a compact record; the result of
    each step must equal DummyVecEnv's: dones, ``terminal_observation``,
    ``TimeLimit.truncated``, reset infos.
    """
    from stable_baselines3.common.vec_env import DummyVecEnv

    from daskvec.transport import codec

    compact: list[Any] = []
    real_decode_step = codec._decode_step

    def spy(frames: Any, window: Any = None) -> Any:
        message = real_decode_step(frames, window)
        compact.append(message)
        return message

    monkeypatch.setattr(codec, "_decode_step", spy)
    reference = DummyVecEnv(ending_fns())
    env = DaskVecEnv(ending_fns(), client=dclient, transport="direct", envs_per_actor=3, timeout=30)
    try:
        assert [g["envs"] for g in env.groups] == [[0, 1, 2], [3, 4, 5]]
        assert_same(env.reset(), reference.reset(), "reset")
        actions = np.zeros(6, dtype=np.int64)
        for step in range(1, 10):
            obs, rewards, dones, infos = env.step(actions)
            want = reference.step(actions)
            ends = ENDINGS.get(step, {})
            assert dones.tolist() == [i in ends for i in range(6)], f"step {step}: dones {dones.tolist()}, ends {ends}"
            for i, how in ends.items():
                assert "terminal_observation" in infos[i], f"step {step}: env {i} ended ({how}) without one"
                assert infos[i]["terminal_observation"][0] == want[3][i]["terminal_observation"][0] > 0
                assert infos[i]["TimeLimit.truncated"] is (how == "truncated"), f"step {step}: env {i} {how}"
                assert obs[i][0] == 0.0, f"step {step}: env {i} was not reset"
            assert_same((obs, rewards, dones, infos), want, f"step {step}")
            assert_same(env.reset_infos, reference.reset_infos, f"step {step} reset infos")
        replies = [m for m in compact if isinstance(m, StepReply)]
        assert len(replies) == 9 * 2, f"{len(replies)} of 18 step replies travelled compact"
    finally:
        env.close()
        reference.close()


# --------------------------------------------------------------------------- no scheduler call on the step
@pytest.mark.timeout(120)
def test_auto_rebalance_never_waits_for_the_scheduler(dclient: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``auto_rebalance`` a step asks for the scheduler's workers and goes on; a later step plans from the answer.

    The question is a stand-in that answers only when the test says (a frozen scheduler
    until then), and a blocking call to the scheduler from a step fails the test. A
    failed answer breaks the env as a lost scheduler does.
    """
    import concurrent.futures

    from daskvec._core import dask_internals as _dask
    from daskvec._core import recovery
    from daskvec.errors import DaskVecEnvError, SchedulerLostError

    workers = scheduler_workers(dclient)
    env = DaskVecEnv(
        [lambda: gym.make("CartPole-v1")] * 4,
        client=dclient,
        envs_per_actor=2,
        timeout=30,
        auto_rebalance=True,
        rebalance_interval=1e-6,
    )
    questions: list[concurrent.futures.Future[dict[str, Any]]] = []
    blocking: list[str] = []
    planned: list[list[str]] = []
    real_plan = recovery.plan_rebalance

    def ask(client: Any, timeout: float = 30.0) -> concurrent.futures.Future[dict[str, Any]]:
        questions.append(concurrent.futures.Future())
        return questions[-1]

    def wait_for_scheduler(client: Any, timeout: float = 30.0) -> dict[str, Any]:
        blocking.append("scheduler_workers")
        raise AssertionError("a step waited for the scheduler")

    def plan(groups: Any, receivers: Any, envs_per_actor: Any = None, **kwargs: Any) -> Any:
        planned.append(list(receivers))
        return real_plan(groups, receivers, envs_per_actor, **kwargs)

    try:
        # the real question, answered on the client's event loop
        assert set(_dask.scheduler_workers_soon(dclient, 30).result(timeout=30)) == set(workers)
        env.reset()
        monkeypatch.setattr(_dask, "scheduler_workers_soon", ask)
        monkeypatch.setattr(_dask, "scheduler_workers", wait_for_scheduler)
        monkeypatch.setattr(recovery, "plan_rebalance", plan)
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(20):  # the scheduler never answers: every step returns all the same
            env.step(actions)
        assert (len(questions), blocking, planned) == (1, [], [])  # one question in flight, never waited for
        questions[0].set_result(workers)
        env.step(actions)
        assert planned == [sorted(workers)] and blocking == []  # planned from the answer (balanced: no move)
        env.step(actions)
        assert len(questions) == 2  # the next interval asks again
        questions[1].set_exception(SchedulerLostError("the scheduler is gone", address="tcp://gone:1"))
        with pytest.raises(SchedulerLostError, match="the scheduler is gone"):
            env.step(actions)
        with pytest.raises(DaskVecEnvError):
            env.step(actions)  # broken: every later call raises
        assert blocking == []
    finally:
        env.close()


def test_a_worker_list_never_answered_counts_as_a_lost_scheduler(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step only looks at the question; past ``timeout`` (and a grace) unanswered, the scheduler is lost."""
    import concurrent.futures
    import types

    from daskvec._core import recovery
    from daskvec._core.options import Options
    from daskvec.errors import SchedulerLostError

    now = [1000.0]
    monkeypatch.setattr(recovery, "time", types.SimpleNamespace(monotonic=lambda: now[0], time=time.time))
    asked: list[concurrent.futures.Future[dict[str, Any]]] = []

    class Directory:
        any_deadline = False
        any_quarantined = False

        def ask_workers(self) -> concurrent.futures.Future[dict[str, Any]]:
            asked.append(concurrent.futures.Future())
            return asked[-1]

    pool = types.SimpleNamespace(groups=[], client=None)
    options = Options(auto_rebalance=True, rebalance_interval=10.0, timeout=30.0)
    rec = recovery.Recovery(pool, Directory(), recovery.RestartLedger(0), options)  # type: ignore[arg-type]
    assert not rec.migration_due
    now[0] += 11
    assert rec.migration_due and rec.migrate() == [] and len(asked) == 1
    now[0] += 30  # within timeout + grace: nothing to do yet, nothing waited for
    assert not rec.migration_due
    now[0] += recovery._CENSUS_GRACE + 1
    assert rec.migration_due
    with pytest.raises(SchedulerLostError, match="did not answer"):
        rec.migrate()
    assert asked[0].cancelled()


@pytest.mark.parametrize("transport", ["auto", "actor"])
def test_a_quarantine_ends_after_probes_answered_in_a_row(monkeypatch: pytest.MonkeyPatch, transport: str) -> None:
    """Each look reads the probe sent at the look before: two answers in a row heal a worker, a
    silence starts the count again; a new quarantine forgets the answers; never with actor calls."""
    import concurrent.futures

    from daskvec._core import directory
    from daskvec._core.options import Options

    probes: list[concurrent.futures.Future[None]] = []

    def probe(client: Any, worker: str, timeout: float) -> concurrent.futures.Future[None]:
        probes.append(concurrent.futures.Future())
        return probes[-1]

    monkeypatch.setattr(directory._dask, "worker_answers_soon", probe)
    d = directory.WorkerDirectory(None, Options(transport=transport, timeout=30.0))
    d.quarantine("w", "froze")
    assert d.any_quarantined and d.probe_quarantined() == []
    if transport == "actor":
        assert probes == [] and d.quarantined() == {"w"}
        return
    assert len(probes) == 1 and d.probe_quarantined() == [] and len(probes) == 1  # still on its way
    probes[-1].set_result(None)
    assert d.probe_quarantined() == [] and len(probes) == 2  # one answer, the next probe sent
    probes[-1].set_exception(TimeoutError())
    assert d.probe_quarantined() == [] and len(probes) == 3  # silent again: the count starts over
    probes[-1].set_result(None)
    assert d.probe_quarantined() == [] and len(probes) == 4
    d.quarantine("w", "froze again")  # the probe in flight was sent before: it proves nothing
    probes[-1].set_result(None)
    assert d.probe_quarantined() == [] and len(probes) == 5
    probes[-1].set_result(None)
    assert d.probe_quarantined() == []
    probes[-1].set_result(None)
    assert d.probe_quarantined() == ["w"] and d.quarantined() == set()
