"""The worker-side figures of :mod:`daskvec.monitoring.metrics` against values known in advance.

No cluster: :class:`GroupStats` is fed known ``record_step(n_envs, seconds)`` calls and
known returns, with ``time.monotonic`` replaced by a clock the test moves, so rates are
exact and never depend on how busy the machine is.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Iterator

import pytest

from daskvec.monitoring import metrics
from daskvec.monitoring.metrics import GroupStats


class FakeClock:
    """A ``time.monotonic`` that only moves when the test says so."""

    def __init__(self, start: float = 100.0) -> None:
        self.t = start

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeClock]:
    """Fake monotonic clock in :mod:`daskvec.monitoring.metrics`, and no group of other tests counted."""
    import time

    fake = FakeClock()
    monkeypatch.setattr(
        metrics, "time", types.SimpleNamespace(monotonic=fake, perf_counter=time.perf_counter, time=time.time)
    )
    monkeypatch.setattr(metrics, "_groups", weakref.WeakSet())
    monkeypatch.setattr(metrics, "_retired", {"steps": 0.0, "episodes": 0.0, "errors": 0.0, "restarts": 0.0})
    monkeypatch.setattr(metrics, "_summary_cache", None)
    yield fake


def test_steps_per_second_is_env_steps_over_the_last_five_seconds(clock: FakeClock) -> None:
    stats = GroupStats(4)
    metrics.install_worker_metrics(None, stats)
    # a 4-env group stepped every 0.5 s from t=100 to t=104.5: 4 / 0.5 = 8 env-steps/s
    for i in range(10):
        clock.t = 100.0 + 0.5 * i
        stats.record_step(4, 0.001)
    assert stats.steps == 40
    assert stats.steps_per_second() == pytest.approx(8.0)
    assert metrics.worker_summary()["daskvec_steps_per_s"] == pytest.approx(8.0)
    # 1.5 s idle: the window (t >= 101, 12 steps done then) holds 28 steps in 5 s
    clock.t = 106.0
    assert stats.steps_per_second() == pytest.approx(28 / 5.0)
    # idle for longer than the window: 0
    clock.t = 104.5 + 5.5
    assert stats.steps_per_second() == 0.0
    assert metrics.worker_summary()["daskvec_steps_per_s"] == 0.0


def test_rate_sums_groups_each_with_its_own_pace(clock: FakeClock) -> None:
    fast, slow = GroupStats(2), GroupStats(1)
    metrics.install_worker_metrics(None, fast)
    metrics.install_worker_metrics(None, slow)
    for i in range(9):  # t = 100 .. 104: fast steps every 0.5 s, slow every 1 s
        clock.t = 100.0 + 0.5 * i
        fast.record_step(2, 0.001)
        if i % 2 == 0:
            slow.record_step(1, 0.001)
    assert fast.steps_per_second() == pytest.approx(2 / 0.5)
    assert slow.steps_per_second() == pytest.approx(1 / 1.0)
    assert metrics.worker_summary()["daskvec_steps_per_s"] == pytest.approx(4.0 + 1.0)


def test_step_time_percentiles_and_mean_return_pool_the_groups(clock: FakeClock) -> None:
    a, b = GroupStats(1), GroupStats(1)
    metrics.install_worker_metrics(None, a)
    metrics.install_worker_metrics(None, b)
    # 98 calls of 1 ms and 2 of 500 ms: p50 = 1 ms, p99 = 500 ms (mean would be 10.98 ms)
    for _ in range(98):
        a.record_step(1, 0.001)
    for _ in range(2):
        b.record_step(1, 0.5)
    # returns 1, 2, 3 on one group, 10 on the other: mean 4 (max 10, mean of the group means 6)
    for r in (1.0, 2.0, 3.0):
        a.record_episode(r)
    b.record_episode(10.0)
    s = metrics.worker_summary()
    assert s["daskvec_step_p50_ms"] == pytest.approx(1.0)
    assert s["daskvec_step_p99_ms"] == pytest.approx(500.0)
    assert s["daskvec_mean_return"] == pytest.approx(4.0)
    assert s["daskvec_episodes"] == 4 and s["daskvec_steps"] == 100 and s["daskvec_envs"] == 2


def test_percentiles_interpolate_like_numpy(clock: FakeClock) -> None:
    stats = GroupStats(1)
    metrics.install_worker_metrics(None, stats)
    for ms in range(1, 101):  # 1, 2, ..., 100 ms
        stats.record_step(1, ms / 1000)
    s = metrics.worker_summary()
    assert s["daskvec_step_p50_ms"] == pytest.approx(50.5)
    assert s["daskvec_step_p99_ms"] == pytest.approx(99.01)


def test_mean_return_covers_the_last_hundred_episodes(clock: FakeClock) -> None:
    stats = GroupStats(1)
    metrics.install_worker_metrics(None, stats)
    for _ in range(50):
        stats.record_episode(1000.0)  # pushed out of the window by the 100 below
    for i in range(100):
        stats.record_episode(float(i % 4 + 1))  # 1, 2, 3, 4, ...: mean 2.5
    s = metrics.worker_summary()
    assert s["daskvec_mean_return"] == pytest.approx(2.5)
    assert s["daskvec_episodes"] == 150


def test_mirror_keeps_the_env_process_figures(clock: FakeClock) -> None:
    src = GroupStats(2)
    for i in range(5):
        clock.t = 100.0 + i
        src.record_step(2, 0.002 * (i + 1))
    src.record_episode(3.0)
    src.errors, src.restarts = 1, 1
    dst = GroupStats(2)
    metrics.install_worker_metrics(None, dst)
    dst.mirror(src.snapshot())
    s = metrics.worker_summary()
    assert (s["daskvec_steps"], s["daskvec_episodes"], s["daskvec_errors"], s["daskvec_restarts"]) == (10, 1, 1, 1)
    assert dst.steps_per_second() == pytest.approx(src.steps_per_second()) == pytest.approx(8 / 4.0)
    assert s["daskvec_step_p50_ms"] == pytest.approx(6.0) and s["daskvec_mean_return"] == pytest.approx(3.0)
