"""Every use of Dask internals by daskvec's client side, in one place, with the reason.

Public Dask API is used everywhere else. What is here has no public equivalent that
does what daskvec needs (a bounded wait, an answer that is not a stale cache); each
function names the public API it stands in for. If a Dask release breaks one of these,
this is the file to change.

The dashboard's uses of Dask internals are of another kind (extending the scheduler's
Bokeh application); they are listed in the docstring of :mod:`daskvec.dashboard`:
``distributed.dashboard.scheduler.applications`` (where pages are registered, as
Dask's own docs describe for preloads), the dashboard's Jinja template variables (the
navigation link), ``distributed.dashboard.components`` (the component base class and
theme Dask's own pages use) and ``Scheduler._instances`` (the schedulers running in
this process, whose workers' figures the Prometheus collector reports).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import weakref
from typing import Any

from daskvec.errors import SchedulerLostError
from daskvec.protocol.messages import GROUP_KEY_PREFIX

__all__ = [
    "ReleasedActorCalls",
    "heartbeat_interval",
    "is_actor_lost",
    "log_event",
    "log_event_nowait",
    "placement_errors",
    "quiet_released_actor_calls",
    "register_scheduler_plugin",
    "run_on_scheduler",
    "scheduler_address",
    "scheduler_lost",
    "scheduler_workers",
    "scheduler_workers_soon",
]


#: The last scheduler address each client was seen with: a client that has lost its
#: scheduler drops the RPC object that knows the address, and the error must name it.
_ADDRESSES: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()


def scheduler_address(client: Any) -> str:
    """The address of ``client``'s scheduler, for messages (``""`` if it was never known).

    Remembered per client while it is connected: call it once then, so that an error
    raised after the scheduler is gone can still name it.
    """
    try:
        address = str(client.scheduler.address or "")
    except Exception:  # the client dropped its RPC object after losing the scheduler
        address = ""
    with contextlib.suppress(TypeError):  # a stand-in client that takes no weak reference
        if address:
            _ADDRESSES[client] = address
        else:
            address = _ADDRESSES.get(client, "")
    return address


def heartbeat_interval(n_workers: int) -> float:
    """Seconds between two heartbeats of each worker of a cluster of ``n_workers`` (Dask's rule).

    No public API says it: ``distributed.scheduler.heartbeat_interval``, which the
    scheduler sends each worker when it registers (0.5 s up to 10 workers, more with
    more). 5 s if that function is gone.
    """
    try:
        from distributed.scheduler import heartbeat_interval as dask_interval

        return float(dask_interval(n_workers))
    except Exception:  # moved or changed in a later Dask
        return 5.0


def scheduler_workers(client: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The scheduler's current view of every worker: ``{address: worker info}``.

    Instead of ``Client.scheduler_info()``, which returns a cache that the client's own
    periodic refresh rewrites, without per-worker entries, from its event loop thread:
    read right after a refresh it can come back with no workers at all. This asks the
    scheduler directly through its ``identity`` handler, waiting at most ``timeout``
    seconds: a frozen scheduler (a GC pause, a stalled VM) would otherwise block the
    caller until it resumes.

    Raises
    ------
    SchedulerLostError
        The scheduler did not answer in time, or the client has lost it (a killed
        scheduler shows as ``CommClosedError`` after Dask's reconnection attempts, or
        as an attribute error of an RPC object the client already dropped).
    """
    try:
        identity = client.sync(client.scheduler.identity, n_workers=-1, callback_timeout=timeout)
    except Exception as e:
        raise scheduler_lost(client, e, timeout) from e
    return dict(identity.get("workers", {}))


def scheduler_workers_soon(client: Any, timeout: float = 30.0) -> concurrent.futures.Future[dict[str, Any]]:
    """:func:`scheduler_workers` without waiting: the answer comes in the future returned.

    The question is asked from the client's event loop (``client.loop.add_callback``,
    as :func:`log_event_nowait` sends), so the calling thread, the one that steps the
    envs, never waits for the scheduler; it looks at the future when it suits it.
    Within ``timeout`` seconds of the loop running the question, the future holds the
    scheduler's ``{address: worker info}`` or a :class:`SchedulerLostError`.
    """
    answer: concurrent.futures.Future[dict[str, Any]] = concurrent.futures.Future()

    async def ask() -> None:
        try:
            identity = await asyncio.wait_for(client.scheduler.identity(n_workers=-1), timeout)
        except asyncio.CancelledError as e:  # the loop is closing: say so, then let the task end
            answer.set_exception(scheduler_lost(client, e, timeout))
            raise
        except Exception as e:
            answer.set_exception(scheduler_lost(client, e, timeout))
        else:
            answer.set_result(dict(identity.get("workers", {})))

    try:
        client.loop.add_callback(ask)
    except Exception as e:  # a client without a running loop
        answer.set_exception(scheduler_lost(client, e, timeout))
    return answer


def worker_answers_soon(client: Any, worker: str, timeout: float) -> concurrent.futures.Future[None]:
    """Ask ``worker`` itself who it is, without waiting: the future holds ``None`` once it answered.

    A quarantined worker's proof of life: its own event loop must answer a request sent
    now (``Worker.identity`` over the client's connection pool, the internal
    ``client.rpc``), which a stopped process never does. The future holds the error
    instead if it does not answer within ``timeout`` seconds of the loop asking, or if
    it is gone. Asked from the client's event loop, as :func:`scheduler_workers_soon`
    asks, so the stepping thread never waits.
    """
    answer: concurrent.futures.Future[None] = concurrent.futures.Future()

    async def ask() -> None:
        try:
            await asyncio.wait_for(client.rpc(worker).identity(), timeout)
        except asyncio.CancelledError as e:  # the loop is closing
            answer.set_exception(e)
            raise
        except Exception as e:
            answer.set_exception(e)
        else:
            answer.set_result(None)

    try:
        client.loop.add_callback(ask)
    except Exception as e:  # a client without a running loop
        answer.set_exception(e)
    return answer


def scheduler_lost(client: Any, exc: BaseException, timeout: float | None = None) -> SchedulerLostError:
    """The :class:`SchedulerLostError` for a call to ``client``'s scheduler that failed with ``exc``."""
    address = scheduler_address(client)
    if isinstance(exc, TimeoutError) and timeout is not None:
        what = f"did not answer within {timeout:.0f}s"
    elif isinstance(exc, AttributeError):  # the client dropped its connection object after losing the scheduler
        what = "is gone (the client lost its connection to it)"
    else:
        what = f"cannot be reached ({type(exc).__name__}: {exc})"
    return SchedulerLostError(
        f"the Dask scheduler {address or '(address unknown)'} {what}; without it no env can be placed or "
        "rebuilt, so this vec env is broken. Check the scheduler (its process, host and network), then "
        "close() this vec env and create a new one",
        address=address,
    )


def register_scheduler_plugin(client: Any, plugin: Any, name: str, timeout: float) -> None:
    """``client.register_plugin(plugin, name=name)`` for a scheduler plugin, waiting at most ``timeout`` seconds.

    ``Client.register_plugin`` has no timeout: a frozen scheduler would hold the vec
    env's construction until it resumes. The client's own coroutine is awaited
    through ``Client.sync``, whose ``callback_timeout`` bounds the wait. A plugin whose
    class says ``idempotent = True`` is registered once: later calls leave the first
    instance, without the scheduler's "overwriting" warning.
    """
    idempotent = bool(getattr(plugin, "idempotent", False))
    client.sync(client._register_scheduler_plugin, plugin, name, idempotent, callback_timeout=timeout)


def log_event_nowait(client: Any, topic: str, msg: dict[str, Any]) -> None:
    """Send an event to the scheduler's log without waiting.

    Instead of ``Client.log_event``, which blocks until the scheduler answers and has no
    timeout: the vec env publishes its figures from the stepping thread every few
    seconds, and a scheduler slow to answer must not stall a step.
    """
    with contextlib.suppress(Exception):
        client.loop.add_callback(client.scheduler.log_event, topic=topic, msg=msg)


def log_event(client: Any, topic: str, msg: dict[str, Any], timeout: float) -> None:
    """Send an event to the scheduler's log and wait for it, at most ``timeout`` seconds.

    ``Client.log_event`` with a bound on the wait (used on ``close()``, when the
    scheduler may already be gone).
    """
    with contextlib.suppress(Exception):
        client.sync(client.scheduler.log_event, topic=topic, msg=msg, callback_timeout=timeout)


def run_on_scheduler(client: Any, function: Any, timeout: float) -> Any:
    """``client.run_on_scheduler(function)``, waiting at most ``timeout`` seconds.

    ``Client.run_on_scheduler`` has no timeout of its own; its keyword arguments go to
    ``Client.sync``, whose ``callback_timeout`` bounds the wait (used to check the
    dashboard's pages before showing a link, when the scheduler may be slow or gone).
    """
    return client.run_on_scheduler(function, callback_timeout=timeout)


def placement_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that say a task could not run on its worker, not that it failed.

    ``KilledWorker``, ``CommClosedError`` and ``FutureCancelledError`` are not exported at
    the top of ``distributed``; their modules have moved between releases.
    """
    errors: list[type[BaseException]] = []
    with contextlib.suppress(ImportError):
        from distributed.client import FutureCancelledError

        errors.append(FutureCancelledError)
    with contextlib.suppress(ImportError):
        from distributed.scheduler import KilledWorker

        errors.append(KilledWorker)
    with contextlib.suppress(ImportError):
        from distributed.comm.core import CommClosedError

        errors.append(CommClosedError)
    return tuple(errors)


def is_actor_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is Dask's error for a call to an actor whose worker died.

    Dask raises a plain ``RuntimeError`` for it; only its message tells it apart.
    """
    return isinstance(exc, RuntimeError) and "Worker holding Actor was lost" in str(exc)


class ReleasedActorCalls(logging.Filter):
    """Drops the event loop's record of a call that reached a daskvec group's actor after its release.

    A call to an actor (``actor.busy_for()``) is a task on the client's event loop. When
    the worker no longer holds the actor, its ``actor_execute`` raises ``KeyError(key)``,
    which Dask's proxy does not catch (it catches ``OSError`` only): the task ends with
    the error, its future never gets a result, and tornado logs "Exception in callback"
    with a 25-line traceback. daskvec releases the groups of a frozen or partitioned
    worker while calls to them are in flight (the watch of a collection asks every group
    whether its envs hang); they reach the worker when it answers again, once per
    group. No caller waits on those calls, and nothing is for the user to do.
    Other records of the loop are kept.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """``False`` for a ``KeyError`` naming a daskvec group's actor, ``True`` for any other record."""
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, KeyError) and str(exc.args[0] if exc.args else "").startswith(GROUP_KEY_PREFIX))


#: The engines open in this process, each of which wants :class:`ReleasedActorCalls` on.
_QUIET = {"engines": 0}
_QUIET_LOCK = threading.Lock()


def quiet_released_actor_calls(on: bool) -> None:
    """Put :class:`ReleasedActorCalls` on tornado's ``tornado.application`` logger while an engine is open.

    ``on``: an engine opens (``True``) or closes (``False``). The filter is on from the first
    engine opened until the last one closes: nothing of daskvec's is left on the logger.
    """
    log = logging.getLogger("tornado.application")
    with _QUIET_LOCK:
        _QUIET["engines"] = max(_QUIET["engines"] + (1 if on else -1), 0)
        present = [f for f in log.filters if isinstance(f, ReleasedActorCalls)]
        if _QUIET["engines"] and not present:
            log.addFilter(ReleasedActorCalls())
        elif not _QUIET["engines"]:
            for f in present:
                log.removeFilter(f)
