"""The reaper: one thread per process that releases what finalizers queue.

An env group or env process that Dask drops without a shutdown (its client died) is
released by a ``weakref.finalize`` callback. The collector can run such a callback
anywhere, even inside a lock the release needs, and it must not start threads; so the
callback only queues the work (a ``SimpleQueue.put`` is safe there) and this thread
carries it out.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

__all__ = ["queue_release", "start_reaper"]

_RELEASES: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_reaper: threading.Thread | None = None
_reaper_lock = threading.Lock()


def queue_release(job: Callable[[], None]) -> None:
    """Queue ``job`` for the reaper thread (safe inside a finalizer)."""
    _RELEASES.put(job)


def _reaper_loop() -> None:
    while True:
        job = _RELEASES.get()
        try:
            job()
        except Exception:
            logger.exception("a queued release (env group or env process) failed")


def start_reaper() -> None:
    """Start this process's reaper thread if it is not running (call outside finalizers)."""
    global _reaper
    with _reaper_lock:
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reaper_loop, name="daskvec-reaper", daemon=True)
            _reaper.start()
