"""``wait_until``: the one way the tests wait for a condition (poll it, with a bound)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_until(
    predicate: Callable[[], Any], timeout: float, what: str | Callable[[], str] = "the condition", every: float = 0.05
) -> Any:
    """Poll ``predicate`` every ``every`` seconds until it returns something truthy; that value.

    Raises
    ------
    AssertionError
        ``predicate`` was still falsy after ``timeout`` seconds; the message names ``what``
        (a callable is asked then, so it can report the state at the end of the wait).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what() if callable(what) else what}")
        time.sleep(every)
