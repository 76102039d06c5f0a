"""The reaper on its own: each group's release runs once, whichever way comes first.

A fake worker (its ``state.actors`` dict) and a fake group stand in for Dask's and
daskvec's; the reaper thread runs in the test process. ``tests/test_faults.py`` checks
the same with real ``dask worker`` processes.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from waiting import wait_until

from daskvec.worker import reaper
from daskvec.worker.reaper import Release


class FakeGroup:
    """Releases itself when asked, unless ``busy`` is set (a call in progress)."""

    def __init__(self) -> None:
        self.busy = threading.Event()
        self.asked = 0
        self.release: Release | None = None

    def release_dropped(self) -> bool:
        self.asked += 1
        if self.busy.is_set():
            return False
        assert self.release is not None
        self.release.now()
        return True


def fake_worker(key: str) -> Any:
    """What the reaper reads of a Dask worker holding the actor ``key``."""
    return SimpleNamespace(state=SimpleNamespace(actors={key: None}))


_checks = [0]  # the reaper's checks so far


@pytest.fixture(autouse=True)
def counted_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick checks, counted: a test waits for whole checks instead of sleeping."""
    check = reaper._release_dropped

    def counted() -> None:
        check()
        _checks[0] += 1

    monkeypatch.setattr(reaper, "CHECK_INTERVAL", 0.02)
    monkeypatch.setattr(reaper, "_release_dropped", counted)


@pytest.fixture(autouse=True)
def bystander(counted_checks: None) -> Iterator[None]:
    """A group its worker holds throughout: the reaper runs (and checks) until the test ends."""
    group = FakeGroup()
    group.release = Release(group, lambda: None)
    group.release.watch(fake_worker("bystander"), "bystander")
    yield
    group.release.now()


def wait_for_checks(n: int = 2) -> None:
    """Wait until the reaper has made ``n`` whole checks from now (the first may have begun already)."""
    start = _checks[0]
    wait_until(lambda: _checks[0] >= start + n, 10, f"{n} checks of the reaper", every=0.01)


def test_a_dropped_group_is_released_once_when_no_call_runs() -> None:
    worker, group, released = fake_worker("group-1"), FakeGroup(), []
    group.release = Release(group, lambda: released.append(1))
    group.release.watch(worker, "group-1")
    group.busy.set()
    del worker.state.actors["group-1"]  # the client gave the group up
    wait_until(lambda: group.asked >= 2, 10, "asking the busy group again", every=0.01)
    assert released == []  # a call in progress keeps the envs
    group.busy.clear()
    wait_until(lambda: released == [1], 10, "the release", every=0.01)
    asked = group.asked
    wait_for_checks()
    assert released == [1] and group.asked == asked and group.release.done
    assert not group.release.now()


def test_a_group_shut_down_first_is_not_released_again() -> None:
    worker, group, released = fake_worker("group-2"), FakeGroup(), []
    group.release = Release(group, lambda: released.append(1))
    group.release.watch(worker, "group-2")
    assert group.release.now()  # its shutdown
    del worker.state.actors["group-2"]
    wait_for_checks()
    assert released == [1] and group.asked == 0


def test_a_held_group_stays_and_a_collected_one_is_released() -> None:
    worker, group, released = fake_worker("group-3"), FakeGroup(), []
    group.release = Release(group, lambda: released.append(1))
    group.release.watch(worker, "group-3")
    wait_for_checks()
    assert released == [] and group.asked == 0
    del group
    gc.collect()
    wait_until(lambda: released == [1], 10, "the release of the collected group", every=0.01)
