"""GroupPool.spawn's placement loop, in process: which groups are waited for and where the rest go."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from daskvec._core.handles import Group
from daskvec._core.pool import GroupPool

GONE, LIVE = "tcp://gone:1", "tcp://live:1"


class FakeFuture:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeDirectory:
    """Every retry goes to the one live worker."""

    def wait_for_workers(self, exclude: list[str]) -> list[str]:
        assert GONE in exclude, "the worker that failed a group was offered again"
        return [LIVE]

    def assign(self, retry: list[list[int]], workers: list[str], load: dict[str, int]) -> list[tuple[list[int], str]]:
        return [(indices, workers[0]) for indices in retry]

    def quarantine(self, worker: str, why: str) -> None:
        raise AssertionError("a worker that left is not quarantined")


def spawning_pool(waited: list[tuple[list[int], str]], futures: list[FakeFuture]) -> GroupPool:
    """A pool whose groups on ``GONE`` fail as a vanished worker does; each wait for a group is recorded."""
    options = SimpleNamespace(transport="direct", timeout=30.0, worker_wait_timeout=30.0)
    pool = GroupPool(None, [], options, FakeDirectory())  # type: ignore[arg-type]

    def submit(indices: list[int], worker: str, history: Any) -> tuple[Any, ...]:
        futures.append(FakeFuture())
        return indices, worker, None, f"g{indices}", futures[-1]

    def connect(indices: list[int], worker: str, token: Any, key: str, fut: Any, deadline: float) -> Group:
        waited.append((indices, worker))
        if worker == GONE:  # what _await_actor raises after a second's wait
            raise OSError(f"worker {worker} left before the env group was created on it")
        group = Group(key, list(indices), worker, fut, None, None, None)  # type: ignore[arg-type]
        pool.groups.append(group)
        return group

    pool._submit = submit  # type: ignore[method-assign]
    pool._connect = connect  # type: ignore[method-assign]
    return pool


def test_a_worker_found_gone_is_waited_for_once_per_attempt(caplog: pytest.LogCaptureFixture) -> None:
    """Three groups placed on a worker that has left: the first one's wait finds it gone, the
    other two are not waited for there (each would cost another second) and all go elsewhere."""
    waited: list[tuple[list[int], str]] = []
    futures: list[FakeFuture] = []
    pool = spawning_pool(waited, futures)
    layout = [([0], GONE), ([1], LIVE), ([2], GONE), ([3], GONE)]
    history = SimpleNamespace()
    created = pool.spawn(layout, history)
    assert [(g.env_indices, g.worker) for g in created] == [([1], LIVE), ([0], LIVE), ([2], LIVE), ([3], LIVE)]
    assert [w for _, w in waited].count(GONE) == 1, waited
    assert all(f.cancelled for f, (_, w) in zip(futures[:4], layout, strict=True) if w == GONE)
    assert "not creating env groups [[2], [3]] on tcp://gone:1 either" in caplog.text
