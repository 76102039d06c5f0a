"""The embedded workers' preload: which of Dask's log records it keeps from the user's terminal."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from distributed.core import Status

from daskvec.worker.preload import ClosingHeartbeat

HEARTBEAT = "Failed to communicate with scheduler during heartbeat."


class FakeWorker:
    """What the filter reads of a worker: its status."""

    def __init__(self, status: Status) -> None:
        self.status = status


def record(msg: str) -> logging.LogRecord:
    return logging.LogRecord("distributed.worker", logging.ERROR, __file__, 1, msg, None, None)


@pytest.mark.parametrize("status", [Status.closing, Status.closed, Status.closing_gracefully, Status.failed])
def test_a_heartbeat_cut_short_by_the_workers_own_close_is_dropped(status: Status) -> None:
    """Ctrl-C in the user's process closes its workers; a heartbeat in flight then fails."""
    worker = FakeWorker(status)
    assert not ClosingHeartbeat(worker).filter(record(HEARTBEAT))


@pytest.mark.parametrize("status", [Status.running, Status.paused])
def test_a_heartbeat_failing_while_the_worker_runs_is_still_logged(status: Status) -> None:
    worker = FakeWorker(status)
    assert ClosingHeartbeat(worker).filter(record(HEARTBEAT))


@pytest.mark.parametrize("status", [Status.closing, Status.running])
def test_other_records_of_a_closing_worker_are_kept(status: Status) -> None:
    worker: Any = FakeWorker(status)
    assert ClosingHeartbeat(worker).filter(record("Compute Failed"))
    assert ClosingHeartbeat(worker).filter(record("Stopping worker at tcp://x. Reason: nanny-close"))
