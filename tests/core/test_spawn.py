"""GroupPool.spawn's placement loop, in process: which groups are waited for and where the rest go."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest

from daskvec._core.handles import Group
from daskvec._core.pool import GroupPool
from daskvec.errors import EnvBuildError

GONE, GONE_TOO, LIVE = "tcp://gone:1", "tcp://gone:2", "tcp://live:1"


class FakeFuture:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class FakeDirectory:
    """Every retry goes to the live worker, but those ``elsewhere`` sends to another."""

    def __init__(self, elsewhere: dict[int, str]) -> None:
        self.elsewhere = elsewhere

    def wait_for_workers(self, exclude: list[str]) -> list[str]:
        assert GONE in exclude, "the worker that failed a group was offered again"
        return [LIVE]

    def assign(self, retry: list[list[int]], workers: list[str], load: dict[str, int]) -> list[tuple[list[int], str]]:
        return [(indices, self.elsewhere.pop(indices[0], workers[0])) for indices in retry]

    def quarantine(self, worker: str, why: str) -> None:
        raise AssertionError("a worker that left is not quarantined")


def spawning_pool(
    waited: list[tuple[list[int], str]], futures: list[FakeFuture], elsewhere: dict[int, str] | None = None
) -> GroupPool:
    """A pool of 4 envs whose groups on the ``GONE`` workers fail as a vanished worker does;
    each wait for a group is recorded."""
    options = SimpleNamespace(transport="direct", timeout=30.0, worker_wait_timeout=30.0)
    env_fns = [functools.partial(dict, env=i) for i in range(4)]
    pool = GroupPool(None, env_fns, options, FakeDirectory(elsewhere or {}))  # type: ignore[arg-type]

    def submit(indices: list[int], worker: str, history: Any) -> tuple[Any, ...]:
        futures.append(FakeFuture())
        return indices, worker, None, f"g{indices}", futures[-1]

    def connect(indices: list[int], worker: str, token: Any, key: str, fut: Any, deadline: float) -> Group:
        waited.append((indices, worker))
        if worker in (GONE, GONE_TOO):  # what _await_actor raises after a second's wait
            raise OSError(f"worker {worker} left before the env group was created on it")
        group = Group(key, list(indices), worker, fut, None, None, None)  # type: ignore[arg-type]
        pool.groups.append(group)
        return group

    def teardown(groups: list[Group], graceful: bool = True) -> None:
        torn.extend(groups)

    torn: list[Group] = []
    pool._submit = submit  # type: ignore[method-assign]
    pool._connect = connect  # type: ignore[method-assign]
    pool.teardown = teardown  # type: ignore[method-assign]
    pool.torn = torn  # type: ignore[attr-defined]
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


def test_a_worker_lost_counts_against_every_group_being_built_on_it() -> None:
    """Envs whose build ends the process of two workers in a row are a crashing factory: a group not
    waited for on a worker found gone still counts that worker (envs [1] here, built second there)."""
    waited: list[tuple[list[int], str]] = []
    pool = spawning_pool(waited, [], elsewhere={1: GONE_TOO})
    with pytest.raises(EnvBuildError, match=r"building envs \[1\] .* on 2 workers in a row"):
        pool.spawn([([0], GONE), ([1], GONE)], SimpleNamespace())  # type: ignore[arg-type]
    assert waited == [([0], GONE), ([0], LIVE), ([1], GONE_TOO)]
    assert [g.env_indices for g in pool.torn] == [[0]]  # type: ignore[attr-defined]  # what was built is undone
