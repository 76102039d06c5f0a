"""The reaper: one thread per process that releases env groups nobody will use again.

A group (:class:`~daskvec.worker.EnvGroup`, or :class:`~daskvec.worker.EnvHost` and its
env process) is released by its ``shutdown()``. Two kinds are never asked:

- groups whose actor Dask dropped: the client gave the group up after a timeout (it
  does not ask a group that may be stuck), or the client died. Their worker forgets the
  actor's key, but the object lives on: its own threads and reference cycles keep it,
  and a frozen and resumed worker keeps everything it held. So every
  :data:`CHECK_INTERVAL` seconds this thread looks each group's key up in its worker
  (a dict lookup, off the step path) and has the groups whose key is gone release
  themselves (``release_dropped``);
- groups garbage collected without a shutdown (outside a worker, for instance): a
  ``weakref.finalize`` callback queues their release. The collector can run such a
  callback anywhere, even inside a lock the release needs, and it must not start
  threads; so the callback only queues the work (a ``SimpleQueue.put`` is safe there)
  and this thread carries it out.

Each group's release runs once, whichever way comes first (:class:`Release`). The
thread runs only while some release is still to come: a worker whose groups are all
released holds no daskvec thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Protocol

from daskvec.worker import probes

logger = logging.getLogger(__name__)

__all__ = ["CHECK_INTERVAL", "Droppable", "Release"]

#: Seconds between two checks of whether the workers still hold their groups' actors.
CHECK_INTERVAL = 1.0

_RELEASES: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_lock = threading.Lock()
_pending: set[Release] = set()  # releases still to run; the thread ends when none is left
_reaper: threading.Thread | None = None


class Droppable(Protocol):
    """A group the reaper can release once Dask dropped its actor."""

    def release_dropped(self) -> bool:
        """Release what the group holds, as its shutdown would; ``False``: busy, ask again later."""
        ...


class Release:
    """The release of one group: ``job`` runs exactly once, on whichever of these comes first.

    - :meth:`now`, from the group's shutdown (or from ``release_dropped``);
    - on the reaper thread, once the group is garbage collected (``job`` must not refer
      to the group, or it would never be);
    - once :meth:`watch` was called, when the worker no longer holds the group's actor:
      the reaper calls the group's ``release_dropped``, which calls :meth:`now` when it can.

    Parameters
    ----------
    owner : Droppable
        The group.
    job : callable
        Closes what the group holds.
    """

    def __init__(self, owner: Droppable, job: Callable[[], None]) -> None:
        self._job = job
        self._owner = weakref.ref(owner)
        self._watch: tuple[Any, Hashable] | None = None
        self._finalizer = weakref.finalize(owner, _RELEASES.put, self._run)
        self._finalizer.atexit = False  # at exit the process takes everything with it
        global _reaper
        with _lock:
            _pending.add(self)
            if _reaper is None:
                _reaper = threading.Thread(target=_reaper_loop, name="daskvec-reaper", daemon=True)
                _reaper.start()

    def watch(self, worker: Any, key: Hashable | None) -> None:
        """Release the group once ``worker`` no longer holds the actor ``key``.

        Call it when the group is ready for ``release_dropped`` (at the end of its
        constructor). Nothing to watch when ``worker`` or ``key`` is ``None`` (not an
        actor of this process, e.g. a group in an env process).
        """
        if worker is not None and key is not None:
            self._watch = (worker, key)

    @property
    def done(self) -> bool:
        """Whether the release ran, or is queued to run."""
        return not self._finalizer.alive

    def now(self) -> bool:
        """Run the release on this thread unless it ran or was queued already; whether it ran here."""
        if self._finalizer.detach() is None:
            return False
        self._run()
        return True

    def _run(self) -> None:
        try:
            self._job()
        finally:
            with _lock:
                _pending.discard(self)

    def _dropped(self) -> Droppable | None:
        """The group, if its worker no longer holds its actor and it is not released yet."""
        if self._watch is None or self.done:
            return None
        owner = self._owner()
        if owner is None or probes.holds_actor(*self._watch):
            return None
        return owner


def _release_dropped() -> None:
    """Have every group whose actor its worker dropped release itself."""
    with _lock:
        releases = list(_pending)
    for release in releases:
        owner = release._dropped()
        if owner is None:
            continue
        try:
            if not owner.release_dropped():
                logger.debug("%r was dropped by Dask but is busy; releasing it later", owner)
        except Exception:  # not asked again (no log line every second); collected, it is still released
            release._watch = None
            logger.exception("releasing %r, which Dask dropped, failed", owner)
        del owner  # no reference of this thread keeps it until the next check


def _reaper_loop() -> None:
    global _reaper
    while True:
        try:
            job = _RELEASES.get(timeout=CHECK_INTERVAL)
        except queue.Empty:
            pass
        else:
            try:
                job()
            except Exception:
                logger.exception("a queued release (env group or env process) failed")
            del job
        _release_dropped()
        with _lock:
            if not _pending:  # a Release made from now on starts a new thread
                _reaper = None
                return
