"""A user's error as one short message: the cause, where, what to do.

An error caused by a user's code or input (a factory or an env that raised on a
worker, an unreachable scheduler address) would otherwise reach the terminal as
screens of frames: daskvec's and Dask's own, the worker's frames rebuilt on the client
(under Python 3.11+ with position markers, ``^^^^``, computed from the wrong source),
and chained exceptions that repeat the same cause. Here such an error is *marked*: it
keeps its type (a remote ``NameNotFound`` is still Gymnasium's, an ``AttributeError``
still an ``AttributeError``), the remote traceback goes on the exception
(``exc.remote_traceback``) and to the ``daskvec`` logger at DEBUG, and the public entry
points (:func:`short_errors`) raise it without the frames and causes in between. An
error not marked (a bug in daskvec) keeps its whole traceback.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from daskvec.protocol.messages import format_traceback, strip_markers

__all__ = ["TRACEBACK_HINT", "mark", "shorten", "short_errors"]

logger = logging.getLogger(__name__)

#: Set on an exception that :func:`short_errors` raises without its frames.
_MARK = "_daskvec_short"

#: How to see what :func:`shorten` keeps off the screen; ends the last note.
TRACEBACK_HINT = "for the full traceback, print(err.remote_traceback) or log 'daskvec' at DEBUG"

P = ParamSpec("P")
R = TypeVar("R")


def mark(exc: BaseException) -> BaseException:
    """Mark ``exc`` as complete in itself (its message says the cause and what to do), and return it.

    Its chained causes are dropped from what Python prints (the caller put what they
    said into the message); :func:`short_errors` raises it without daskvec's frames.
    """
    exc.__cause__ = None
    exc.__suppress_context__ = True
    try:
        setattr(exc, _MARK, True)
    except Exception:  # an exception type that refuses attributes: it keeps its frames
        logger.debug("cannot mark %r", exc)
    return exc


def shorten(exc: BaseException, hint: str, remote_traceback: str | None = None) -> BaseException:
    """``exc``, raised by user code on a worker, made ready to reach the user as one short message.

    Parameters
    ----------
    exc : BaseException
        The exception, with the type the user's code raised.
    hint : str
        What to do, as the last note (``"daskvec: "`` and :data:`TRACEBACK_HINT` are added).
    remote_traceback : str, optional
        The traceback formatted where the exception was raised. By default the one the
        worker set on the exception (``exc.remote_traceback``), else the one it carries.

    Returns
    -------
    BaseException
        ``exc`` itself, with ``remote_traceback`` set (position markers removed), no
        traceback nor chained causes to print, and the hint as its last note.
    """
    if getattr(exc, _MARK, False):  # shortened already (a nested entry point)
        return exc
    if remote_traceback is None:
        remote_traceback = getattr(exc, "remote_traceback", None) or format_traceback(exc)
    remote_traceback = strip_markers(remote_traceback)
    try:
        exc.remote_traceback = remote_traceback  # type: ignore[attr-defined]
    except Exception:  # an exception type that refuses attributes: keep the traceback in a note instead
        exc.add_note(remote_traceback)
    logger.debug("the full traceback of %s: %s\n%s", type(exc).__name__, exc, remote_traceback)
    exc.add_note(f"daskvec: {hint}; {TRACEBACK_HINT}")
    return mark(exc).with_traceback(None)


def short_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Decorate a public entry point: a marked error leaves it without the frames below it.

    The user's own frames (the line that called the entry point) stay; daskvec's and
    Dask's frames in between are logged at DEBUG. Errors not marked pass unchanged.
    """

    @functools.wraps(fn)
    def entry(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except BaseException as e:
            if not getattr(e, _MARK, False):
                raise
            logger.debug("where daskvec raised %s:\n%s", type(e).__name__, format_traceback(e))
            raise e.with_traceback(None) from None

    return entry
