"""Observations in shared memory, for groups on the client's machine.

A group whose client connected over its Unix socket (the client runs on the group's
machine) writes large observation batches into a memory file (``memfd``) instead of
the socket: its step reply then carries the rewards, flags and infos, and only the
description of the observations (dtype and shape). The client maps the same file and
copies the observations from it straight into its step buffers. An Atari batch of 16
frame stacks (451 KB) otherwise crosses the socket in several rounds of
wake-ups, since it is larger than a Unix socket's send buffer (about 208 KiB), and
each reply is read into a newly allocated buffer.

Who owns what: each connection of a group has one :class:`WindowWriter`, which makes
the memory file when a first large observation comes (and a larger one when a larger
observation comes) and passes its descriptor to the client in the ancillary data of
that reply (``SCM_RIGHTS``). The client's :class:`WindowReader` maps it and closes the
descriptor. The file has no name: it is freed when the last mapping goes, whichever
process dies first, so nothing is ever left behind in ``/dev/shm``.

Why one window per connection is enough: a group writes into it only while it answers
a request, and the client sends a group its next request only after it took the last
reply's observations into its buffers. An array read from the window is valid until
the next request on its channel; the client's buffers copy it before that.

Linux only (``os.memfd_create``); elsewhere, and over TCP or TLS, observations travel
on the socket as before. Both ends agree first: the client says in the group's spec
that it can read a window (``GroupSpec.shared_memory``; an older client's spec does
not), and the worker's config key ``daskvec.shared-memory`` can turn it off (see
:func:`daskvec.config.worker_shared_memory`).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import logging
import math
import mmap
import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

__all__ = ["WINDOW_MIN_BYTES", "WindowReader", "WindowWriter", "fds_from_ancillary", "supported"]

#: Observation batches at least this large go through the window; smaller ones cost
#: less on the socket (one read brings the whole reply).
WINDOW_MIN_BYTES = 1 << 17

#: Ancillary space for the descriptors one read may bring (one is expected).
ANCILLARY_BYTES = socket.CMSG_SPACE(4 * 4) if hasattr(socket, "CMSG_SPACE") else 0


#: The seals of a window: its size is fixed (and so are its seals).
SEALS = getattr(fcntl, "F_SEAL_SHRINK", 0) | getattr(fcntl, "F_SEAL_GROW", 0) | getattr(fcntl, "F_SEAL_SEAL", 0)


def supported() -> bool:
    """Whether this platform can share a window: sealed memory files and descriptor passing (Linux)."""
    return (
        hasattr(os, "memfd_create")
        and hasattr(fcntl, "F_ADD_SEALS")
        and hasattr(socket, "SCM_RIGHTS")
        and hasattr(socket, "AF_UNIX")
    )


def fds_from_ancillary(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors passed in ``recvmsg``'s ancillary data (``SCM_RIGHTS``), in order."""
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            got = array.array("i")
            got.frombytes(data[: len(data) - len(data) % got.itemsize])
            fds.extend(got)
    return fds


class WindowWriter:
    """A group's side of one connection's window: a memory file it writes observations into.

    Parameters
    ----------
    log : callable, optional
        ``log(kind, level, msg, *args)`` for the line saying a window cannot be made: the
        channel server's rate-limited log, since each new connection would say it again.
        By default, this module's logger.
    """

    def __init__(self, log: Callable[..., object] | None = None) -> None:
        self._say = log if log is not None else (lambda _kind, level, msg, *args: logger.log(level, msg, *args))
        self._map: mmap.mmap | None = None
        self._new_fd: int | None = None  # the descriptor the next reply hands the client
        #: a window could not be made: this connection's observations stay on the socket
        self.failed = False

    @property
    def size(self) -> int:
        """Bytes of the current memory file (0: none yet)."""
        return 0 if self._map is None else len(self._map)

    def put(self, arr: np.ndarray) -> bool:
        """Copy ``arr`` to the start of the window; False if no window can be made (send it on the socket).

        A window that cannot be made (no descriptors left, no memory, a sandbox that
        forbids memory files) turns this connection's window off for good, with one
        log line: its observations then travel on the socket, as elsewhere.
        """
        if self.failed:
            return False
        if arr.nbytes > self.size:
            try:
                self._grow(arr.nbytes)
            except OSError as e:
                self.failed = True
                self._drop()
                self._say(
                    "window",
                    logging.WARNING,
                    "daskvec: no shared window for observations (%s); they go on the socket",
                    e,
                )
                return False
        assert self._map is not None
        np.copyto(np.frombuffer(self._map, dtype=arr.dtype, count=arr.size).reshape(arr.shape), arr, casting="no")
        return True

    def _grow(self, nbytes: int) -> None:
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        fd = os.memfd_create("daskvec-obs", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            # sealed at its size: the client's mapping can never lose pages under it (SIGBUS)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
            mapped = mmap.mmap(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self._drop()
        self._map, self._new_fd = mapped, fd

    def take_fd(self) -> int | None:
        """The descriptor of a window made since the last call, for the reply to carry (the caller closes it)."""
        fd, self._new_fd = self._new_fd, None
        return fd

    def _drop(self) -> None:
        if self._new_fd is not None:
            os.close(self._new_fd)
            self._new_fd = None
        if self._map is not None:
            with contextlib.suppress(BufferError):  # a view still alive: the mapping goes with it
                self._map.close()
            self._map = None

    def close(self) -> None:
        """Unmap the window (idempotent); the client's mapping, if any, stays valid."""
        self._drop()


class WindowReader:
    """The client's side of one channel's window: the group's memory file, mapped read-only."""

    def __init__(self) -> None:
        self._map: mmap.mmap | None = None

    def adopt(self, fds: list[int]) -> None:
        """Map the last of ``fds`` (a new window replaces the old one) and close them all.

        ``fds`` is emptied as its descriptors are closed, so it can be the reader's own
        list (:attr:`daskvec.transport.wire.FrameReader.fds`): a descriptor never
        handed over, say by a Ctrl-C before this call, stays there for the reader's
        ``close()``.

        Raises
        ------
        ValueError
            The descriptor is not a memory file sealed at its size (its owner could
            shrink it under the mapping, and a read would kill this process with SIGBUS).
        OSError
            It cannot be mapped.
        """
        try:
            fd = fds[-1]
            try:
                seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
            except OSError:
                seals = 0
            if seals & SEALS != SEALS:
                raise ValueError("the window passed is not a memory file sealed at its size")
            size = os.fstat(fd).st_size
            mapped = mmap.mmap(fd, size, prot=mmap.PROT_READ) if size else None
        finally:
            while fds:
                os.close(fds.pop())
        self._map = mapped  # the old mapping goes when no array reads it any more

    @property
    def mapped(self) -> bool:
        """Whether the group shared a window (and it is still mapped here)."""
        return self._map is not None

    def array(self, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        """A read-only view of the window as an array of ``dtype`` and ``shape`` (valid until the next request).

        Raises
        ------
        ValueError
            No window was shared, or it is smaller than the array.
        """
        count = math.prod(shape)
        if self._map is None:
            raise ValueError("observations in a shared window, but none was shared")
        if count * dtype.itemsize > len(self._map):
            raise ValueError(f"observations of {count * dtype.itemsize} bytes in a window of {len(self._map)}")
        return np.frombuffer(self._map, dtype=dtype, count=count).reshape(shape)

    def close(self) -> None:
        """Forget the window (its memory is freed once no array reads it and the group closed its side)."""
        self._map = None
