"""What daskvec's client keeps of Dask's own log records (daskvec._core.dask_internals)."""

from __future__ import annotations

import functools
import logging
import sys
import time
from typing import Any

import pytest
from envs import CountingEnv

from daskvec import DaskVecEnv
from daskvec._core.dask_internals import ReleasedActorCalls, quiet_released_actor_calls


def loop_record(exc: BaseException) -> logging.LogRecord:
    """tornado's record of a task on the event loop that ended with ``exc``."""
    try:
        raise exc
    except BaseException:
        exc_info = sys.exc_info()
    return logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "Exception in callback", None, exc_info)


def test_a_call_to_a_released_group_actor_is_dropped_and_other_loop_errors_are_kept() -> None:
    f = ReleasedActorCalls()
    assert not f.filter(loop_record(KeyError("daskvec-group-1b0fee48e1df452ead7b9762283bbf50")))
    assert f.filter(loop_record(KeyError("some-other-actor-key")))
    assert f.filter(loop_record(ValueError("daskvec-group-1b0fee48")))
    assert f.filter(logging.LogRecord("tornado.application", logging.ERROR, __file__, 1, "no exception", None, None))


def release(key: str, dask_worker: Any) -> None:
    """What a worker does with an abandoned group's actor: shut its envs down and forget it."""
    dask_worker.state.actors.pop(key).shutdown()


def test_the_filter_is_on_from_the_first_engine_opened_until_the_last_closed() -> None:
    def on() -> bool:
        return any(isinstance(f, ReleasedActorCalls) for f in logging.getLogger("tornado.application").filters)

    assert not on()
    quiet_released_actor_calls(True)
    quiet_released_actor_calls(True)
    quiet_released_actor_calls(False)
    assert on()
    quiet_released_actor_calls(False)
    assert not on()


@pytest.mark.timeout(120)
def test_a_call_in_flight_to_a_group_its_worker_released_logs_nothing(
    client2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """As after a frozen worker resumes: the call reaches a worker that no longer holds the actor."""
    with DaskVecEnv([functools.partial(CountingEnv, horizon=100)] * 2, client2, envs_per_actor=1) as env:
        group = env._engine.pool.groups[0]  # type: ignore[union-attr]
        key = group.actor.key
        client2.run(release, key, workers=[group.worker])
        with caplog.at_level(logging.ERROR, logger="tornado.application"):
            call = group.actor.busy_for()
            deadline = time.monotonic() + 30
            # Dask's proxy never completes the call's future: wait for the loop's task to end
            while not [r for r in caplog.records if r.name == "tornado.application"] and time.monotonic() < deadline:
                time.sleep(0.1)
        assert not call.done()
        assert not [r for r in caplog.records if r.name == "tornado.application"], caplog.text
        env._engine.pool.groups.remove(group)  # type: ignore[union-attr]  # released already: not closed again
