"""Emulated worker hosts for the tests: :mod:`benchmarks.hosts`, plus the ``emulated`` fixture.

The hosts themselves (namespaces, bridge, delay relay, partitions) live in
:mod:`benchmarks.hosts`, shared with the across-hosts benchmark; this file adds the
pytest fixture that starts them and removes them after each test.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from benchmarks.hosts import (
    EmulatedHosts,
    Host,
    emulated_hosts,
    measure_relay_cost,
    missing_requirements,
    recv_exactly,
    recv_line,
)

__all__ = [
    "EmulatedHosts",
    "Host",
    "emulated_fixture",
    "emulated_hosts",
    "measure_relay_cost",
    "missing_requirements",
    "recv_exactly",
    "recv_line",
]


@pytest.fixture(name="emulated")
def emulated_fixture(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``emulated(n, rtt_ms=0.0, **kw)`` starts ``n`` hosts; all removed after the test.

    Skips the test (saying why) without root, ``ip``, ``unshare`` or ``iptables``.
    """
    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    started: list[EmulatedHosts] = []

    def start(n: int = 2, rtt_ms: float | Sequence[float] = 0.0, **kw: Any) -> EmulatedHosts:
        h = EmulatedHosts(n, rtt_ms, workdir=tmp_path / f"hosts{len(started)}", **kw)
        h.workdir.mkdir()
        started.append(h)
        return h.start()

    try:
        yield start
    finally:
        for h in reversed(started):
            h.close()
