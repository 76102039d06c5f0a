"""Errors: remote env exceptions keep their type and context; user mistakes get clear errors."""

from __future__ import annotations

import functools
import os
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import BrokenStepEnv, CountingEnv, EnvCrashed, ReshapingEnv, SlowAttrEnv, SpaceEnv

from daskvec import DaskVecEnv
from daskvec._core.engine import Engine
from daskvec.cluster.clients import scheduler_workers
from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
    EnvBuildError,
    NoAsyncCallError,
    SchedulerLostError,
    StepTimeoutError,
    WorkerLostError,
)
from daskvec.protocol.messages import INFO_KEY, GroupSpec

TRANSPORTS = ["direct", "actor"]


@pytest.fixture(scope="module")
def worker_addresses(dclient: Any) -> list[str]:
    return sorted(scheduler_workers(dclient))


def counting(n: int = 4, **kwargs: Any) -> list[Any]:
    return [functools.partial(CountingEnv, **kwargs) for _ in range(n)]


# --------------------------------------------------------------------------- remote env errors
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_env_exception_keeps_type_index_worker_traceback(
    transport: str, dclient: Any, worker_addresses: list[str]
) -> None:
    fns = [functools.partial(BrokenStepEnv, horizon=50, fail_at=3 if i == 2 else None) for i in range(4)]
    with DaskVecEnv(fns, client=dclient, transport=transport, envs_per_actor=2) as venv:
        venv.reset()
        venv.step(np.zeros(4, dtype=np.int64))
        venv.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(EnvCrashed, match="env crashed at step 3") as info:
            venv.step(np.zeros(4, dtype=np.int64))
        exc = info.value
        assert type(exc) is EnvCrashed  # the user's own class, rebuilt on the client
        assert exc.env_index == 2  # type: ignore[attr-defined]
        group_of_2 = next(g for g in venv.groups if 2 in g["envs"])
        assert exc.worker == group_of_2["worker"] in worker_addresses  # type: ignore[attr-defined]
        notes = "\n".join(getattr(exc, "__notes__", []))
        assert "env 2" in notes and group_of_2["worker"] in notes
        assert "remote_traceback" in notes.splitlines()[-1]  # the last line says where the traceback is
        assert "Traceback (most recent call last)" not in notes  # kept on the exception, not printed with it
        remote = exc.remote_traceback  # type: ignore[attr-defined]
        assert remote.startswith("Traceback (most recent call last)")
        assert "in step" in remote and "EnvCrashed: env crashed at step 3" in remote  # the frame that raised
        assert not any(set(line.strip()) <= set("^~") for line in remote.splitlines())  # no position markers
        assert exc.__traceback__ is not None and exc.__cause__ is None  # only the client's own frames


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_builtin_exception_from_step_and_reset(transport: str, dclient: Any) -> None:
    fns = counting(2, horizon=50)
    fns[1] = functools.partial(CountingEnv, horizon=50, fail_at=1)
    with DaskVecEnv(fns, client=dclient, transport=transport, envs_per_actor=1) as venv:
        venv.reset()
        with pytest.raises(ValueError, match="boom at step 1") as info:
            venv.step(np.zeros(2, dtype=np.int64))
        assert info.value.env_index == 1  # type: ignore[attr-defined]
        # the failed step left the vec env usable: attribute calls still work
        assert venv.get_attr("horizon") == [50, 50]

    def bad_reset_env() -> SpaceEnv:
        env = SpaceEnv("box")
        env.reset = lambda **kw: (_ for _ in ()).throw(KeyError("no reset today"))  # type: ignore[method-assign]
        return env

    with (
        DaskVecEnv([SpaceEnv, bad_reset_env], client=dclient, transport=transport) as venv,
        pytest.raises(KeyError, match="no reset today") as info,
    ):
        venv.reset()
    assert info.value.env_index == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_attribute_error_stays_attribute_error(transport: str, dclient: Any) -> None:
    fns = [functools.partial(BrokenStepEnv) for _ in range(3)]
    with DaskVecEnv(fns, client=dclient, transport=transport) as venv:
        with pytest.raises(AttributeError) as info:
            venv.get_attr("not_there", indices=[1])
        assert info.value.env_index == 1  # type: ignore[attr-defined]
        with pytest.raises(AttributeError):
            venv.env_method("not_a_method")
        with pytest.raises(AttributeError, match="no_such_field"):
            venv.env_method("lookup", indices=-1)
        assert not venv.has_attr("not_there")
        assert venv.has_attr("lookup")


def test_out_of_range_indices(dclient: Any) -> None:
    with DaskVecEnv(counting(3), client=dclient) as venv:
        with pytest.raises(IndexError):
            venv.get_attr("horizon", indices=3)
        with pytest.raises(IndexError):
            venv.get_attr("horizon", indices=[-4])
        with pytest.raises(TypeError):
            venv.get_attr("horizon", indices=["a"])


# --------------------------------------------------------------------------- constructor mistakes
def test_empty_and_non_callable_env_fns(dclient: Any) -> None:
    with pytest.raises(ValueError, match="empty"):
        DaskVecEnv([], client=dclient)
    with pytest.raises(TypeError, match=r"env_fns\[1\].*not a callable.*, not env instances$"):
        DaskVecEnv([CountingEnv, CountingEnv()], client=dclient)
    with pytest.raises(TypeError, match=r"env_fns\[0\] is a str, not a callable.*functools.partial.*not env ids$"):
        DaskVecEnv(["CartPole-v1"], client=dclient)  # type: ignore[list-item]
    with pytest.raises(TypeError, match="single callable"):
        DaskVecEnv(CountingEnv, client=dclient)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"cluster_kwargs configures the embedded LocalCluster.*client=Client"):
        DaskVecEnv([CountingEnv], client=dclient, cluster_kwargs={"n_workers": 5})
    with pytest.raises(TypeError):
        DaskVecEnv("CartPole-v1", client=dclient)  # type: ignore[arg-type]


def test_factories_returning_the_same_instance(dclient: Any, worker_addresses: list[str]) -> None:
    env = CountingEnv()
    with pytest.raises(ValueError, match="same env instance"):
        DaskVecEnv([lambda: env, lambda: env], client=dclient)

    # not visible from the client: a caching factory hands out one env on the worker
    cache: dict[str, CountingEnv] = {}

    def shared() -> CountingEnv:
        return cache.setdefault("env", CountingEnv())

    with pytest.raises(ValueError, match="same environment instance"):
        DaskVecEnv([shared, shared], client=dclient, workers=worker_addresses[:1])


def _window_cartpole() -> Any:
    """CartPole rendering to a window (pygame), on a worker without a display."""
    import gymnasium as gym

    os.environ.pop("DISPLAY", None)
    os.environ.pop("WAYLAND_DISPLAY", None)
    return gym.make("CartPole-v1", render_mode="human")


@pytest.mark.timeout(120)
def test_envs_rendering_to_a_window_answer_within_seconds(dclient: Any, worker_addresses: list[str]) -> None:
    """Two groups of ``render_mode="human"`` envs on one worker process: refused at once, saying why and what
    to do (before: the second group's window failed at the first reset with ``EGL_BAD_ACCESS``, crashed the
    worker, or blocked until the build timeout); each group in an env process of its own: they step.

    Every wait is bounded by ``timeout=30``.
    """
    pytest.importorskip("pygame", reason="CartPole renders to a window with pygame")
    with pytest.raises(EnvBuildError, match=r"render to a window \(render_mode='human'\)") as info:
        DaskVecEnv([_window_cartpole] * 2, client=dclient, workers=worker_addresses[:1], envs_per_actor=1, timeout=30)
    assert "env_process=True" in str(info.value)

    venv = DaskVecEnv(
        [_window_cartpole] * 2,
        client=dclient,
        workers=worker_addresses[:1],
        envs_per_actor=1,
        env_process=True,
        timeout=30,
    )
    try:
        assert len(venv.groups) == 2
        venv.reset()
        obs, _, _, _ = venv.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4)
    finally:
        venv.close()


def _window_mujoco() -> Any:
    """A MuJoCo env rendering to a window (GLFW, MuJoCo's viewer), on a worker without a display."""
    import gymnasium as gym

    os.environ.pop("DISPLAY", None)
    os.environ.pop("WAYLAND_DISPLAY", None)
    return gym.make("InvertedPendulum-v5", render_mode="human")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("env_process", [False, True], ids=["in-worker", "env-process"])
@pytest.mark.parametrize("face", ["sb3", "gymnasium"])
def test_a_window_without_a_display_answers_within_seconds(dclient: Any, face: str, env_process: bool) -> None:
    """A ``render_mode="human"`` env whose window needs a display, on workers that have none: refused at
    its build, saying why and what to do, on both faces, in a worker and in an env process.

    Before, GLFW aborted the process holding the env at its first reset: in a worker, the
    rebuild elsewhere was refused as a "second window" (a wrong cause); in an env process,
    each rebuild aborted again and the vec env waited 300 s for another worker.
    """
    pytest.importorskip("mujoco", reason="MuJoCo's viewer renders to a window with GLFW")
    from daskvec import DaskVectorEnv

    make = DaskVecEnv if face == "sb3" else DaskVectorEnv
    with pytest.raises(EnvBuildError, match=r"render_mode='human'\) with GLFW") as info:
        venv = make([_window_mujoco] * 2, client=dclient, env_process=env_process, timeout=20)
        try:
            venv.reset()  # where GLFW would open the window
        finally:
            venv.close()
    message = str(info.value)
    assert "has no display" in message and "render_mode='rgb_array'" in message, message


@pytest.mark.timeout(30)
def test_a_window_without_a_display_renders_to_nowhere_with_pygame(dclient: Any) -> None:
    """pygame's SDL falls back to an offscreen driver without a display: CartPole with
    ``render_mode="human"`` steps on the Gymnasium face too, one env process per group."""
    pytest.importorskip("pygame", reason="CartPole renders to a window with pygame")
    from daskvec import DaskVectorEnv

    envs = DaskVectorEnv([_window_cartpole] * 2, client=dclient, env_process=True, envs_per_actor=1, timeout=20)
    try:
        envs.reset(seed=0)
        obs, *_ = envs.step(np.zeros(2, dtype=np.int64))
        assert obs.shape == (2, 4)
    finally:
        envs.close()


class _AbortAtReset(gym.Env[np.ndarray, int]):
    """Ends its process at reset, as GLFW does at an env's first render where there is no display."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        os.abort()

    def step(self, action: int) -> Any:
        raise AssertionError("never stepped")


@pytest.mark.timeout(120)
def test_an_env_that_ends_its_env_process_at_reset_fails_within_seconds(dclient: Any) -> None:
    """Each rebuild of such an env ends its env process again: the rebuilds use the live workers
    again and the last failure is named, instead of waiting ``worker_wait_timeout`` (300 s) for
    another worker."""
    venv = DaskVecEnv([_AbortAtReset] * 2, client=dclient, env_process=True, envs_per_actor=1, timeout=20)
    try:
        with pytest.raises(WorkerLostError, match="lost again each time they were rebuilt") as info:
            venv.reset()
        assert "reset one in a process of your own" in str(info.value)
    finally:
        venv.close()


def test_envs_with_different_spaces(dclient: Any) -> None:
    with pytest.raises(ValueError, match="spaces") as info:
        DaskVecEnv(
            [functools.partial(SpaceEnv, "box"), functools.partial(SpaceEnv, "discrete")],
            client=dclient,
            envs_per_actor=1,
        )
    assert "env 1" in str(info.value)


def test_unpicklable_factory_names_its_index(dclient: Any) -> None:
    lock = threading.Lock()

    def with_lock() -> CountingEnv:
        with lock:
            return CountingEnv()

    with pytest.raises(TypeError, match=r"env_fns\[2\] cannot be pickled"):
        DaskVecEnv([CountingEnv, CountingEnv, with_lock], client=dclient)


@pytest.mark.timeout(60)
def test_unreachable_scheduler_fails_within_the_timeout() -> None:
    """An address nobody answers fails after ``timeout`` (2 s here), not Dask's 30 s connect timeout.

    The bound is the product's: the connection is attempted for the timeout given, then
    given up. The 15 s allowed on top cover a loaded machine, and stay well below the 30 s
    that an attempt ignoring ``timeout`` would take.
    """
    with socket.socket() as s:  # bound but never listening: connections are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(ValueError, match=rf"cannot reach a Dask scheduler at 'tcp://127.0.0.1:{port}' within 2s"):
            DaskVecEnv(counting(2), client=f"tcp://127.0.0.1:{port}", timeout=2)
        elapsed = time.monotonic() - start
    assert elapsed < 2 + 15, f"gave up after {elapsed:.1f} s with timeout=2"


def test_bad_options(dclient: Any) -> None:
    for kwargs in (
        {"transport": "carrier-pigeon"},
        {"envs_per_actor": 0},
        {"timeout": 0},
        {"on_worker_lost": "ignore"},
        {"on_env_error": "ignore"},
        {"max_restarts": -1},
        {"busy_poll": -1},
        {"busy_poll": 5.0},
        {"busy_poll": "fast"},
    ):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=name):
            DaskVecEnv(counting(2), client=dclient, **kwargs)
    with pytest.raises(TypeError):
        DaskVecEnv(counting(2), client=3.14)


# --------------------------------------------------------------------------- call-order mistakes
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_call_order_errors(transport: str, dclient: Any) -> None:
    venv = DaskVecEnv(counting(4), client=dclient, transport=transport, envs_per_actor=2)
    try:
        venv.reset()
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()
        with pytest.raises(ValueError, match="3 actions for 4 envs"):
            venv.step_async(np.zeros(3, dtype=np.int64))
        assert not venv.waiting  # the refused batch left nothing pending
        venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadySteppingError):
            venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadySteppingError):
            venv.get_attr("horizon")
        with pytest.raises(AlreadySteppingError):
            venv.reset()
        obs, _, _, _ = venv.step_wait()  # the pending step is still collected correctly
        assert obs[:, 0].tolist() == [1, 1, 1, 1]
        with pytest.raises(NoAsyncCallError):
            venv.step_wait()
    finally:
        venv.close()
    for call in (
        venv.reset,
        lambda: venv.step(np.zeros(4, dtype=np.int64)),
        lambda: venv.step_async(np.zeros(4, dtype=np.int64)),
        venv.step_wait,
        lambda: venv.get_attr("horizon"),
        lambda: venv.set_attr("horizon", 1),
        lambda: venv.env_method("double", 1),
        venv.get_images,
    ):
        with pytest.raises(ClosedEnvError):
            call()
    assert issubclass(ClosedEnvError, DaskVecEnvError)
    venv.close()  # still a no-op


@pytest.mark.parametrize("transport", TRANSPORTS)
@pytest.mark.parametrize("bad", [[0, 1], [1]])
def test_observations_of_the_wrong_shape(transport: str, bad: list[int], dclient: Any) -> None:
    # the envs in `bad` break their space on their 3rd step. A whole group gone wrong
    # is found by the client, which must still read the other group's reply of that
    # step (or every later call would get the reply before its own); one env of a
    # group is found by the group, which cannot stack the observations.
    fns = [functools.partial(ReshapingEnv, bad_at=3 if i in bad else -1) for i in range(4)]
    venv = DaskVecEnv(fns, client=dclient, transport=transport, envs_per_actor=2)
    try:
        venv.reset()
        actions = np.zeros(4, dtype=np.int64)
        venv.step(actions)
        venv.step(actions)
        found = (
            r"envs \[0, 1\] on .* do not fit the observation space .*got shape \(2, 3\)"
            if len(bad) == 2
            else r"observations of envs \[0, 1\] do not stack \(env 0: \(2,\), env 1: \(3,\)\)"
        )
        with pytest.raises(ValueError, match=found + r".*match its observation_space"):
            venv.step(actions)
        assert not venv.waiting
        obs = venv.reset()
        assert obs[:, 0].tolist() == [0, 0, 0, 0]
        obs, *_ = venv.step(actions)
        assert obs[:, 0].tolist() == [1, 1, 1, 1]
        assert venv.get_attr("total_steps") == [4, 4, 4, 4]
    finally:
        venv.close()


def test_interrupted_step_wait_stays_pending(dclient: Any) -> None:
    """Ctrl-C while waiting for replies leaves the step pending; the next step_wait collects it."""
    # a step_wait that read the first group's reply again would time out after 20 s
    venv = DaskVecEnv(counting(4), client=dclient, transport="direct", envs_per_actor=2, step_timeout=20)
    try:
        venv.reset()
        channel = venv._groups[1].channel
        real_recv = channel.recv

        def interrupted(timeout: float | None) -> Any:
            channel.recv = real_recv  # type: ignore[method-assign]
            raise KeyboardInterrupt

        channel.recv = interrupted  # type: ignore[method-assign]
        venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(KeyboardInterrupt):
            venv.step_wait()
        assert venv.waiting
        with pytest.raises(AlreadySteppingError):
            venv.step_async(np.zeros(4, dtype=np.int64))
        obs, _, _, _ = venv.step_wait()
        assert obs[:, 0].tolist() == [1, 1, 1, 1]
        obs, _, _, _ = venv.step(np.zeros(4, dtype=np.int64))
        assert obs[:, 0].tolist() == [2, 2, 2, 2]
    finally:
        venv.close()


def test_reset_drops_a_step_whose_wait_was_interrupted(dclient: Any) -> None:
    """learn() again after a Ctrl-C in a notebook: reset() collects the interrupted step and drops it;
    a step sent and never waited for still refuses a reset."""
    venv = DaskVecEnv(counting(4), client=dclient, transport="direct", envs_per_actor=2, step_timeout=20)
    try:
        venv.reset()
        interrupt_once(venv._groups[1].channel)
        venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(KeyboardInterrupt):
            venv.step_wait()
        with pytest.raises(AlreadySteppingError, match=r"the last step was interrupted \(reset\(\) drops it\)"):
            venv.get_attr("total_steps")
        obs = venv.reset()
        assert not venv.waiting and obs[:, 0].tolist() == [0, 0, 0, 0]
        assert venv.get_attr("total_steps") == [1, 1, 1, 1]  # the interrupted step was stepped, then dropped
        obs, _, _, _ = venv.step(np.zeros(4, dtype=np.int64))
        assert obs[:, 0].tolist() == [1, 1, 1, 1]
        venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadySteppingError, match=r"^a step is pending: call step_wait\(\)"):
            venv.reset()
        obs, _, _, _ = venv.step_wait()
        assert obs[:, 0].tolist() == [2, 2, 2, 2]
    finally:
        venv.close()


def interrupt_once(channel: Any) -> None:
    """The next ``recv`` on ``channel`` raises KeyboardInterrupt (Ctrl-C during the wait); later ones read."""
    real_recv = channel.recv

    def interrupted(timeout: float | None) -> Any:
        channel.recv = real_recv
        raise KeyboardInterrupt

    channel.recv = interrupted


def test_interrupted_step_wait_keeps_an_env_error_read_before(dclient: Any) -> None:
    """Ctrl-C after the first group's reply (env 1's error) was read: the resumed step_wait raises it."""
    fns = counting(4, horizon=50)
    fns[1] = functools.partial(BrokenStepEnv, horizon=50, fail_at=1)
    venv = DaskVecEnv(fns, client=dclient, transport="direct", envs_per_actor=2, step_timeout=20)
    try:
        assert [g["envs"] for g in venv.groups] == [[0, 1], [2, 3]]  # groups are read in this order
        venv.reset()
        interrupt_once(venv._groups[1].channel)
        venv.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(KeyboardInterrupt):
            venv.step_wait()  # the first group's reply (env 1's error) is read, then Ctrl-C
        assert venv.waiting
        try:
            venv.step_wait()
        except EnvCrashed as e:
            assert e.env_index == 1, f"the error of env {e.env_index}, not env 1"  # type: ignore[attr-defined]
        else:
            pytest.fail("the resumed step_wait returned: env 1's error, read before Ctrl-C, was lost")
        assert not venv.waiting
        assert venv.get_attr("total_steps") == [1, 1, 1, 1]  # usable again, every env stepped once
    finally:
        venv.close()


class ExitingEnv(CountingEnv):
    """Ends its process (an interpreter crash) at its ``exit_at``-th step, the first time only (a flag file)."""

    def __init__(self, exit_at: int, flag: str) -> None:
        super().__init__(horizon=50)
        self.exit_at, self.flag = exit_at, flag

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.total_steps + 1 == self.exit_at and not os.path.exists(self.flag):
            with open(self.flag, "w"):
                pass
            os._exit(3)
        return super().step(action)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("policy", ["restart", "raise"])
def test_interrupted_step_wait_keeps_a_group_lost_before(dclient: Any, tmp_path: Path, policy: str) -> None:
    """Ctrl-C after the first group was read as lost (its env process ended mid-step).

    The resumed step_wait reports that group as lost: its envs rebuilt and truncated
    (``on_worker_lost="restart"``), or ``WorkerLostError`` naming them (``"raise"``).
    """
    fns = counting(4, horizon=50)
    fns[0] = functools.partial(ExitingEnv, exit_at=2, flag=str(tmp_path / "exited"))
    venv = DaskVecEnv(
        fns,
        client=dclient,
        transport="direct",
        envs_per_actor=2,
        env_process=True,
        timeout=60,
        step_timeout=30,
        on_worker_lost=policy,
    )
    try:
        assert [g["envs"] for g in venv.groups] == [[0, 1], [2, 3]]  # groups are read in this order
        venv.reset()
        last, _, _, _ = venv.step(np.zeros(4, dtype=np.int64))
        lost_pid = venv.groups[0]["env_pid"]
        interrupt_once(venv._groups[1].channel)
        venv.step_async(np.ones(4, dtype=np.int64))
        with pytest.raises(KeyboardInterrupt):
            venv.step_wait()  # the first group's channel fails (its process ended), then Ctrl-C
        assert (tmp_path / "exited").exists() and venv.waiting
        if policy == "raise":
            try:
                venv.step_wait()
            except WorkerLostError as e:
                assert e.env_indices == [0, 1], f"envs {e.env_indices} reported lost, not [0, 1]"
            else:
                pytest.fail("the resumed step_wait returned: envs [0, 1], lost before Ctrl-C, were not reported")
            return
        obs, rewards, dones, infos = venv.step_wait()
        assert dones.tolist() == [True, True, False, False], f"the lost group was not reported: dones {dones}"
        for i in (0, 1):
            marker = infos[i].get(INFO_KEY)
            assert marker is not None and marker["reason"] == "worker_lost", f"env {i}: {infos[i]}"
            assert infos[i]["TimeLimit.truncated"] is True and rewards[i] == 0.0
            np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i])
            assert obs[i][0] == 0.0  # the rebuilt env's first observation
        assert obs[2:, 0].tolist() == [2, 2] and rewards[2:].tolist() == [1.0, 1.0]
        assert sorted(e["env"] for e in venv.restart_log) == [0, 1]
        assert lost_pid not in {g["env_pid"] for g in venv.groups}
        obs, _, dones, _ = venv.step(np.zeros(4, dtype=np.int64))
        assert obs[:, 0].tolist() == [1, 1, 3, 3] and not dones.any()
    finally:
        venv.close()


# --------------------------------------------------------------------------- timeouts
@pytest.mark.timeout(120)
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_timeout_bounds_attribute_calls(transport: str, dclient: Any, worker_addresses: list[str]) -> None:
    venv = DaskVecEnv(
        [functools.partial(SlowAttrEnv, delay=6.0)],
        client=dclient,
        transport=transport,
        workers=worker_addresses[1:],
        timeout=1.0,
        on_worker_lost="raise",
    )
    try:
        with pytest.raises(StepTimeoutError) as info:
            venv.get_attr("slow")
        assert isinstance(info.value, WorkerLostError) and info.value.env_indices == [0]
        assert info.value.worker == worker_addresses[1]
    finally:
        venv.close()


@pytest.mark.timeout(120)
def test_step_timeout_bounds_step_wait(dclient: Any, worker_addresses: list[str]) -> None:
    venv = DaskVecEnv(
        [functools.partial(SlowAttrEnv, step_delay=6.0), CountingEnv],
        client=dclient,
        transport="direct",
        workers=worker_addresses[1:],
        envs_per_actor=1,
        timeout=30,
        step_timeout=1.0,
        on_worker_lost="raise",
    )
    try:
        venv.reset()
        venv.step_async(np.zeros(2, dtype=np.int64))
        with pytest.raises(StepTimeoutError) as info:
            venv.step_wait()
        assert info.value.env_indices == [0]
    finally:
        venv.close()


@pytest.mark.timeout(150)
def test_timeout_with_restart_policy_does_not_hang(dclient: Any) -> None:
    """With the default ``on_worker_lost="restart"`` a hung call gets its env rebuilt, not an endless wait.

    The rebuilt env hangs again on the same call, so the call finally fails with a
    daskvec error; what matters is that every wait was bounded by ``timeout``.
    """
    venv = DaskVecEnv(
        [functools.partial(SlowAttrEnv, delay=3.0), CountingEnv],
        client=dclient,
        envs_per_actor=1,
        timeout=1.0,
        worker_wait_timeout=5.0,
    )
    try:
        with pytest.raises(WorkerLostError):
            venv.get_attr("slow", indices=0)
        assert venv.restart_counts[0] >= 1 and venv.restart_counts[1] == 0
        assert venv.get_attr("horizon", indices=1) == [10]  # the other env was not disturbed
    finally:
        venv.close()


def _profiler_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "python/cpython#106883" in r.getMessage()]


@pytest.mark.timeout(180)
def test_warns_once_per_worker_that_profiles_on_python_311(dclient: Any, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    import dask
    from distributed import Client, LocalCluster

    hazard = sys.version_info < (3, 12)
    caplog.set_level(logging.WARNING, logger="daskvec")
    # the suite's own workers run without the profiler (conftest): no warning
    with DaskVecEnv(counting(2), client=dclient, envs_per_actor=1, timeout=60):
        pass
    assert _profiler_warnings(caplog) == []
    # Dask's default: the profiler on
    with (
        dask.config.set({"distributed.worker.profile.enabled": True}),
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
        DaskVecEnv(counting(2), client=client, envs_per_actor=1, timeout=60) as env,
    ):
        assert len(env.groups) == 2  # two groups on the one worker
        warned = _profiler_warnings(caplog)
        assert len(warned) == (1 if hazard else 0), warned
        if hazard:  # the line to add where these workers get their config: this process's
            assert 'add `dask.config.set({"distributed.worker.profile.enabled": False})`' in warned[0]
            assert env.groups[0]["worker"] in warned[0]


@pytest.mark.processes
@pytest.mark.timeout(240)
@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the profiler hazard concerns Python 3.11 only")
def test_one_profiler_warning_names_every_worker_of_the_cluster(caplog: pytest.LogCaptureFixture) -> None:
    """A user's own LocalCluster with Dask's default profiler: one warning naming its workers, not one per worker.

    Four worker processes rather than eight, for a 2-core machine: one line for four
    shows the same as one for eight. Worker threads of this process (``processes=False``)
    would show the warning as well, but their profiler would then sample this test
    process's threads, where the hazard warned about could freeze the suite itself.
    """
    import logging

    import dask
    from distributed import Client, LocalCluster

    caplog.set_level(logging.WARNING, logger="daskvec")
    with (
        dask.config.set({"distributed.worker.profile.enabled": True}),
        LocalCluster(
            n_workers=4, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        workers = sorted(client.scheduler_info()["workers"])
        assert len(workers) == 4
        with DaskVecEnv(counting(4), client=client, envs_per_actor=1, timeout=60) as env:
            assert sorted({g["worker"] for g in env.groups}) == workers  # one group on each worker
        warned = _profiler_warnings(caplog)
        assert len(warned) == 1, warned
        assert warned[0].startswith(f"workers {', '.join(workers)} run Dask's profiler"), warned[0]
        assert "\n" not in warned[0]  # one line
        # a second vec env on the same cluster names no worker again
        with DaskVecEnv(counting(4), client=client, envs_per_actor=1, timeout=60):
            pass
        assert len(_profiler_warnings(caplog)) == 1


def test_an_env_that_restarts_constantly_logs_rate_limited_warnings_and_counts_exactly(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every step of env 1 raises: 200 restarts, each counted and marked, but not 200 warnings."""
    import logging

    import cloudpickle

    from daskvec.protocol.messages import Command, StepReply, StepRequest
    from daskvec.transport.wire import RateLimitedLog
    from daskvec.worker import env_group as group_module

    # a limiter of this test's own: another test's restart must not have used up its first line
    monkeypatch.setattr(group_module, "_restart_log", RateLimitedLog(group_module.logger, 10.0), raising=False)
    steps = 200
    factories = cloudpickle.dumps([CountingEnv, functools.partial(CountingEnv, fail_at=1)])  # each rebuild fails again
    spec = GroupSpec((0, 1), token=None, on_env_error="restart", max_restarts=steps)
    group = group_module.EnvGroup(factories, spec, worker_address="test")
    try:
        group.dispatch((Command.RESET, ([0, 1], [None, None])))
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="daskvec.worker"):
            for k in range(1, steps + 1):
                reply = group.dispatch(StepRequest(np.array([1, 1])))
                assert isinstance(reply, StepReply)
                assert list(reply.restarted) == [1] and reply.restarted[1]["restarts"] == k
        elapsed = time.monotonic() - start
        assert group.restarts == [0, steps] and group.stats.restarts == steps and group.stats.errors == steps
    finally:
        group.shutdown()
    lines = [r.getMessage() for r in caplog.records if "rebuilding it" in r.getMessage()]
    bound = 1 + elapsed // 10.0  # one line per 10 s
    assert 1 <= len(lines) <= bound, f"{len(lines)} restart warnings for {steps} restarts in {elapsed:.1f} s"
    assert lines[0].startswith("env 1 raised ValueError: boom at step 1; rebuilding it (restart 1)")


# --------------------------------------------------------------------------- a build that ends too late
class ClosedFlagEnv(CountingEnv):
    """Records its ``close()`` in a shared list."""

    def __init__(self, closed: list[int], index: int) -> None:
        super().__init__()
        self.closed, self.index = closed, index

    def close(self) -> None:
        self.closed.append(self.index)
        super().close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("vector", [False, True], ids=["envs", "vector"])
def test_a_build_that_returns_after_its_timeout_closes_what_it_made(vector: bool) -> None:
    """The worker gave up on the factories (EnvBuildTimeoutError); when they return later,
    their envs are closed on the build's thread, not left open on the worker."""
    from gymnasium.vector import AutoresetMode, SyncVectorEnv

    from daskvec.errors import EnvBuildTimeoutError
    from daskvec.protocol.messages import Autoreset
    from daskvec.worker.build import build_group

    release, closed = threading.Event(), []

    def slow(k: int) -> Any:
        release.wait(30)
        return ClosedFlagEnv(closed, k)

    if vector:
        fns: list[Any] = [
            lambda: SyncVectorEnv(
                [functools.partial(slow, k) for k in range(2)], autoreset_mode=AutoresetMode.SAME_STEP
            )
        ]
    else:
        fns = [functools.partial(slow, k) for k in range(2)]
    with pytest.raises(EnvBuildTimeoutError, match=r"did not return within 0\.2s"):
        build_group(fns, [] if vector else [0, 1], "test-worker", Autoreset.SAME_STEP, vector, timeout=0.2)
    assert closed == []
    release.set()
    deadline = time.monotonic() + 20
    while sorted(closed) != [0, 1]:
        assert time.monotonic() < deadline, f"the late envs were not closed: {closed}"
        time.sleep(0.02)
    # a build within its timeout is handed over, open
    release.set()
    envs = build_group(fns, [] if vector else [0, 1], "test-worker", Autoreset.SAME_STEP, vector, timeout=20)
    assert sorted(closed) == [0, 1]  # the new envs are open
    for env in envs if isinstance(envs, list) else [envs]:
        env.close()
    assert sorted(closed) == [0, 0, 1, 1]


@pytest.mark.timeout(120)  # the 300 s worker_wait_timeout is not waited out
@pytest.mark.processes
def test_a_placement_no_embedded_worker_matches_fails_at_once_naming_the_workers() -> None:
    with pytest.raises(WorkerLostError) as info:
        DaskVecEnv(counting(2), workers=["nosuchworker"], worker_wait_timeout=300, cluster_kwargs={"n_workers": 1})
    message = str(info.value)
    assert (
        "no eligible workers matching workers=['nosuchworker']:" in message and "resources" not in message.split(":")[0]
    )
    assert "the cluster has 1: " in message and "the embedded cluster gets no other workers" in message


@pytest.mark.timeout(120)
def test_a_placement_no_worker_matches_waits_for_one_on_a_users_cluster(dclient: Any) -> None:
    """A user's cluster may still get such workers (an adaptive or jobqueue one): wait, then say what is there."""
    with pytest.raises(WorkerLostError) as info:
        DaskVecEnv(counting(2), client=dclient, resources={"GPU": 1}, worker_wait_timeout=1)
    message = str(info.value)
    assert "no eligible workers matching resources={'GPU': 1}: the cluster has " in message
    assert "workers=" not in message and "none appeared within worker_wait_timeout=1s" in message


class LockEnv(CountingEnv):
    """An env with an attribute that does not pickle."""

    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_value_that_cannot_travel_back_names_its_worker(dclient: Any, transport: str) -> None:
    """``get_attr`` of something that does not pickle: an error naming the group's worker (not the channel)."""
    from daskvec.errors import RemoteEnvError

    venv = DaskVecEnv([LockEnv] * 2, client=dclient, transport=transport, envs_per_actor=2)
    try:
        with pytest.raises(RemoteEnvError, match="cannot") as info:
            venv.get_attr("lock", indices=[0])
        assert info.value.worker == venv.groups[0]["worker"]
    finally:
        venv.close()


class SleepOnceEnv(CountingEnv):
    """Sleeps ``delay`` seconds in its 3rd step, once per worker process (a hang the step timeout ends)."""

    def __init__(self, delay: float) -> None:
        super().__init__(horizon=1000)
        self.delay = delay

    def step(self, action: int) -> Any:
        if self.t == 2 and not os.environ.get("DASKVEC_TEST_SLEPT"):
            os.environ["DASKVEC_TEST_SLEPT"] = "1"
            time.sleep(self.delay)
        return super().step(action)


@pytest.mark.timeout(120)  # without the fallback: WorkerLostError after worker_wait_timeout
@pytest.mark.processes
def test_a_worker_that_timed_out_takes_its_envs_back_when_it_is_the_only_one() -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40) as lc,
        Client(lc, set_as_default=False) as client,
    ):
        (worker,) = client.scheduler_info()["workers"]
        fns = [functools.partial(SleepOnceEnv, 3.0)] * 2
        venv = DaskVecEnv(fns, client=client, step_timeout=1.0, worker_wait_timeout=30)
        try:
            venv.reset()
            actions = np.zeros(2, dtype=np.int64)
            venv.step(actions)
            venv.step(actions)
            obs, _, dones, infos = venv.step(actions)  # the 3rd step hangs past step_timeout
            assert dones.tolist() == [True, True]
            assert [info[INFO_KEY]["reason"] for info in infos] == ["timeout", "timeout"]
            assert [g["worker"] for g in venv.groups] == [worker]  # the same worker, the only one
            obs, _, dones, _ = venv.step(actions)
            assert obs[:, 0].tolist() == [1, 1] and not dones.any()
        finally:
            venv.close()


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(3)])
def test_a_stop_during_recovery_is_raised_as_itself_and_breaks_the_vec_env(dclient: Any, stop: BaseException) -> None:
    """A Ctrl-C or a signal handler's sys.exit() while daskvec recovers: the caller's own stop comes
    out, not a DaskVecEnvError; groups may be half placed, so the vec env refuses to step after it."""
    with DaskVecEnv(counting(2), client=dclient) as venv:
        venv.reset()
        with pytest.raises(type(stop)), venv._engine.fail_stop():
            raise stop
        with pytest.raises(DaskVecEnvError, match="close it and create a new one"):
            venv.step(np.zeros(2, dtype=np.int64))


def test_a_failure_during_recovery_breaks_the_vec_env_with_its_cause(dclient: Any) -> None:
    with DaskVecEnv(counting(2), client=dclient) as venv:
        venv.reset()
        cause = r"could not recover its env groups \(RuntimeError: half placed\)"
        with pytest.raises(DaskVecEnvError, match=cause), venv._engine.fail_stop():
            raise RuntimeError("half placed")
        with pytest.raises(DaskVecEnvError, match="close it and create a new one"):
            venv.reset()


@pytest.mark.parametrize("stop", [KeyboardInterrupt(), SystemExit(3)])
def test_a_stop_while_the_scheduler_is_lost_is_raised_as_itself(stop: BaseException) -> None:
    """The client reconnecting when Ctrl-C comes: the stop is raised (code catching Exception must not
    swallow it) and the engine stays broken by the lost scheduler."""
    engine = SimpleNamespace(client=SimpleNamespace(status="connecting"), broken=None)
    engine._failure = functools.partial(Engine._failure, engine)
    with pytest.raises(type(stop)), Engine.fail_stop(engine):  # type: ignore[arg-type]
        raise stop
    assert isinstance(engine.broken, SchedulerLostError)
