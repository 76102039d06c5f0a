"""Bytes on a socket: frames, the mutual handshake, and what breaks a channel.

A message is a header (the number of frames and their lengths) followed by the frames;
on a plain socket it is written with one ``sendmsg``, on a TLS socket (which has no
``sendmsg``) with ``sendall``. Before any message, both ends prove that they know the
token the client handed the actor through Dask (HMAC-SHA256 over a fresh nonce from
each side).

Reading never trusts a length it was told: a frame is read in chunks into a buffer that
grows only as the bytes arrive, so a header that claims a gigabyte costs nothing until a
gigabyte has actually been sent, and a message larger than :data:`MAX_MESSAGE_BYTES` is
refused outright.

The worker side reads and writes blocking sockets (:class:`FrameReader`, whose
receive waits by itself there, and :func:`send_frames`): a request usually costs it one
``recv``. The client side keeps each socket non-blocking for its whole life and waits
with ``poll`` (:class:`FrameReader`, :func:`write_frames`): a step then costs it one
``sendmsg``, one ``poll`` and, when the reply fits the buffer sized from the previous
one, one ``recv`` per group, with no switch of the socket's mode in between.
"""

from __future__ import annotations

import array
import hashlib
import hmac
import logging
import math
import os
import select
import socket
import ssl
import struct
import threading
import time
from collections.abc import Sequence
from typing import cast

from daskvec.transport.window import ANCILLARY_BYTES, fds_from_ancillary

logger = logging.getLogger(__name__)

__all__ = [
    "COUNT",
    "DIGEST_BYTES",
    "HANDSHAKE_TIMEOUT",
    "MAX_FRAMES",
    "MAX_MESSAGE_BYTES",
    "NONCE_BYTES",
    "ChannelError",
    "FrameReader",
    "PickleLoadError",
    "ProtocolError",
    "RateLimitedLog",
    "digest",
    "machine_id",
    "recv_exact",
    "send_frames",
    "write_frames",
]

COUNT = struct.Struct("!I")
NONCE_BYTES = 32
DIGEST_BYTES = 32
#: Seconds a peer has, in all, to complete the handshake (TLS included).
HANDSHAKE_TIMEOUT = 10.0
#: Most frames in one message (a header of at most 512 KiB).
MAX_FRAMES = 1 << 16
#: Largest message accepted, all frames together (4 GiB).
MAX_MESSAGE_BYTES = 1 << 32
#: Frames up to this size are read in one allocation; larger ones grow as bytes arrive.
_CHUNK = 1 << 20
#: Above this total, a message's frames are written one ``sendall`` each on a TLS socket
#: instead of being joined into one buffer first.
_JOIN_MAX = 1 << 16


class ChannelError(ConnectionError):
    """The channel to an env-group actor broke: its worker died, hung or is unreachable."""


class ProtocolError(ChannelError):
    """A peer sent bytes that are not a well-formed message; the connection is dropped."""


class PickleLoadError(ProtocolError):
    """A whole message arrived, but its pickle does not load here (its ``__cause__`` says why).

    The stream is still in step: a client turns this into an error reply (say, an env's
    info holding a class the client cannot import) instead of dropping the group.
    """


# --------------------------------------------------------------------------- sockets
def send_frames(sock: socket.socket, frames: list[bytes | memoryview], fds: Sequence[int] = ()) -> None:
    """Write one message's frames (header first) to ``sock``, passing ``fds`` with its first bytes (Unix only)."""
    views = [memoryview(f).cast("B") for f in frames]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS sockets
        total = sum(v.nbytes for v in views)
        if total <= _JOIN_MAX:
            sock.sendall(b"".join(views))
        else:
            for v in views:
                sock.sendall(v)
        return
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    while views:
        sent = sock.sendmsg(views, ancillary)
        ancillary = []  # the descriptors went with the first bytes
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def recv_exact(sock: socket.socket, n: int) -> bytearray:
    """Read exactly ``n`` bytes; the buffer grows in chunks as they arrive.

    Raises
    ------
    ChannelError
        If the peer closes the connection first.
    """
    buf = bytearray(min(n, _CHUNK))
    got = 0
    while got < n:
        if got == len(buf):  # full, more announced: grow, at most doubling what has arrived
            buf.extend(bytes(min(n, 2 * len(buf)) - len(buf)))
        with memoryview(buf) as view:
            k = sock.recv_into(view[got:], len(buf) - got)
        if k == 0:
            raise ChannelError("connection closed by peer")
        got += k
    return buf


_FIRST = struct.Struct("!IQ")


# --------------------------------------------------------------------------- reading whole messages
#: ``recvmsg``'s flag of ancillary data cut short, as a plain int (the enum's ``&`` costs a microsecond).
_CTRUNC = int(getattr(socket, "MSG_CTRUNC", 0))
#: Descriptors received are closed in any program this process starts.
_CLOEXEC = int(getattr(socket, "MSG_CMSG_CLOEXEC", 0))
#: The smallest buffer a message is read into at first: header and body of a small reply
#: arrive with one ``recv``.
_FIRST_READ = 1024


def _header_size(count: int) -> int:
    return COUNT.size + 8 * count


class FrameReader:
    """Read whole messages from a socket, in as few system calls as the bytes allow.

    Each message is read into a fresh buffer (the frames it gives back, and arrays
    decoded from them, stay valid) sized twice the previous message, so that a reply
    like the last one, header and body, arrives with one ``poll`` and one ``recv``. A
    larger message grows the buffer as its bytes arrive, as :func:`recv_exact` does: a
    header that claims a gigabyte costs nothing until the bytes come. A message that a
    timeout cut short is kept, and the next :meth:`read` goes on with it, so the stream
    never falls out of step.

    On a non-blocking socket (the client's) each wait is a ``poll`` with the read's
    deadline; on a blocking one (a worker's connection, read with no timeout) the
    receive waits by itself: a request then costs one ``recv``.

    Parameters
    ----------
    sock : socket.socket
        A connected socket, plain or TLS: non-blocking, or blocking and read with
        ``timeout=None``.
    fds : bool, optional
        Also take the descriptors a peer passes (``SCM_RIGHTS``, a Unix socket): each
        read is a ``recvmsg``, and :meth:`take_fds` hands them out.
    """

    def __init__(self, sock: socket.socket, fds: bool = False) -> None:
        self._sock = sock
        self._tls = isinstance(sock, ssl.SSLSocket)
        self._blocking = sock.gettimeout() is None  # its receive waits by itself
        self._fds: list[int] = []
        self._with_fds = fds
        self._readable = select.poll()
        self._readable.register(sock.fileno(), select.POLLIN)
        self._size = _FIRST_READ
        # the message being read: its buffer, the bytes in it, the frames' lengths once known
        self._buf: bytearray | None = None
        self._got = 0
        self._lengths: Sequence[int] | None = None

    def read(self, timeout: float | None) -> list[memoryview]:
        """Read one message; return its frames (without the header).

        Parameters
        ----------
        timeout : float or None
            Seconds to wait for the whole message, in all; ``None``: no limit.

        Raises
        ------
        TimeoutError
            No whole message within ``timeout`` (what arrived is kept for the next call).
        ProtocolError
            A header that announces no frame, too many, or more than
            :data:`MAX_MESSAGE_BYTES` in all.
        ChannelError
            The peer closed the connection.
        OSError
            The socket failed.
        ValueError
            A ``timeout`` for a blocking socket, whose receive cannot keep one.
        """
        if timeout is not None and self._blocking:
            raise ValueError("a blocking socket's receive cannot keep a timeout: read it with timeout=None")
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._buf is None and not self._tls:
            # the common case, kept short: a new message on a plain socket, often a
            # single frame (a compact step reply) that one recv brings whole
            if not self._blocking:
                self._wait(deadline, timeout)
            buf = self._buf = bytearray(self._size)
            try:
                if self._with_fds:  # inline: this path runs twice per step of a light workload
                    self._got, ancdata, flags, _ = self._sock.recvmsg_into([buf], ANCILLARY_BYTES, _CLOEXEC)
                    if ancdata or flags & _CTRUNC:
                        self._keep_fds(ancdata, flags)
                else:
                    self._got = self._sock.recv_into(buf)
            except BlockingIOError:
                self._got = 0
            else:
                if self._got == 0:
                    raise ChannelError("connection closed by peer")
            if self._got >= _FIRST.size:
                count, first = _FIRST.unpack_from(buf, 0)
                if count == 1 and self._got == _FIRST.size + first:
                    self._buf, self._got = None, 0
                    self._size = min(max(2 * (_FIRST.size + first), _FIRST_READ), _CHUNK)
                    return [memoryview(buf)[_FIRST.size : _FIRST.size + first]]
        return self._read_on(deadline, timeout)

    def _read_on(self, deadline: float | None, timeout: float | None) -> list[memoryview]:
        """:meth:`read` from wherever the message in progress is: header, frames, growth, TLS."""
        buf = self._buf
        if buf is None:
            buf = self._buf = bytearray(self._size)
            self._got = 0
        # a plain socket drained by the last recv has nothing before poll says so; a TLS
        # socket may hold decrypted bytes that poll cannot see
        wait = not self._blocking and not self._buffered()
        while True:
            need = self._need(buf)
            if self._got >= need and self._lengths is not None:
                return self._finish(buf, need)
            if self._got == len(buf):  # full, more announced: grow, at most doubling what has arrived
                buf.extend(bytes(min(need, max(_CHUNK, 2 * len(buf))) - len(buf)))
            if wait:
                self._wait(deadline, timeout)
            try:
                with memoryview(buf) as view:
                    k = self._recv_fds(view[self._got :]) if self._with_fds else self._sock.recv_into(view[self._got :])
            except (BlockingIOError, ssl.SSLWantReadError):
                wait = True
                continue
            except ssl.SSLWantWriteError:  # TLS renegotiation: wait for room, then read again
                _wait_for(self._sock, select.POLLOUT, deadline, timeout)
                wait = False
                continue
            if k == 0:
                raise ChannelError("connection closed by peer")
            self._got += k
            # a short read took all the socket had: wait for more (unless TLS has decrypted bytes
            # buffered); a full buffer is grown and read again at once
            wait = self._got < len(buf) and not self._blocking and not self._buffered()

    def _recv_fds(self, view: memoryview) -> int:
        """``recv_into`` that keeps the descriptors passed with the bytes (the fast path in :meth:`read` inlines it)."""
        k, ancdata, flags, _ = self._sock.recvmsg_into([view], ANCILLARY_BYTES, _CLOEXEC)
        if ancdata or flags & _CTRUNC:
            self._keep_fds(ancdata, flags)
        return int(k)

    def _keep_fds(self, ancdata: list[tuple[int, int, bytes]], flags: int) -> None:
        """Keep the descriptor a message brought (closed by :meth:`close` if never taken); at most one.

        Raises
        ------
        ProtocolError
            More than one descriptor came with a message (every one is closed at once).
        """
        self._fds.extend(fds_from_ancillary(ancdata))
        if flags & _CTRUNC or len(self._fds) > 1:
            self.close()
            raise ProtocolError("a peer passed more than one descriptor with a message")

    @property
    def has_fds(self) -> bool:
        """Whether descriptors came since the last :meth:`take_fds` (checked per reply without allocating)."""
        return bool(self._fds)

    @property
    def fds(self) -> list[int]:
        """The descriptors passed and not yet taken: the reader's own list, which a consumer empties.

        Descriptors still in it when the reader is closed are closed with it, so handing
        this list (rather than :meth:`take_fds`'s copy) to whoever closes them leaks
        nothing if that hand-over is interrupted.
        """
        return self._fds

    def take_fds(self) -> list[int]:
        """The descriptors passed since the last call, in order; the caller owns (closes) them."""
        fds, self._fds = self._fds, []
        return fds

    def close(self) -> None:
        """Close descriptors passed and never taken."""
        for fd in self.take_fds():
            os.close(fd)

    def _buffered(self) -> bool:
        """Whether a TLS socket holds decrypted bytes, which ``poll`` cannot see."""
        return self._tls and cast(ssl.SSLSocket, self._sock).pending() > 0

    def _need(self, buf: bytearray) -> int:
        """Bytes the message needs before it can be parsed further (its total once the header is in)."""
        if self._lengths is not None:
            return _header_size(len(self._lengths)) + sum(self._lengths)
        if self._got < _FIRST.size:
            return _FIRST.size
        count, first = _FIRST.unpack_from(buf, 0)
        if not 0 < count <= MAX_FRAMES:
            raise ProtocolError(f"malformed message header ({count} frames)")
        head = _header_size(count)
        if self._got < head:
            return head
        lengths = (first, *struct.unpack_from(f"!{count - 1}Q", buf, _FIRST.size)) if count > 1 else (first,)
        if sum(lengths) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message too large ({sum(lengths)} bytes announced, at most {MAX_MESSAGE_BYTES})")
        self._lengths = lengths
        return head + sum(lengths)

    def _finish(self, buf: bytearray, total: int) -> list[memoryview]:
        """The frames of the whole message in ``buf``; bytes beyond it start the next message."""
        lengths = self._lengths
        assert lengths is not None
        view = memoryview(buf)
        frames = []
        offset = _header_size(len(lengths))
        for n in lengths:
            frames.append(view[offset : offset + n])
            offset += n
        self._size = min(max(2 * total, _FIRST_READ), _CHUNK)
        rest = self._got - total
        self._lengths = None
        self._buf = None
        if rest:  # a peer that sent more than one message: keep the rest for the next read
            self._buf = bytearray(max(self._size, rest))
            self._buf[:rest] = view[total : self._got]
        self._got = rest
        return frames

    def _wait(self, deadline: float | None, timeout: float | None) -> None:
        """Wait until the socket is readable (or closed), or raise ``TimeoutError`` at ``deadline``."""
        while not self._readable.poll(_poll_ms(deadline)):
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"no whole message within {timeout:.3g}s")


def _poll_ms(deadline: float | None) -> int | None:
    """What ``poll`` waits until ``deadline``: whole milliseconds, rounded up (``None``: no limit)."""
    if deadline is None:
        return None
    return max(math.ceil((deadline - time.monotonic()) * 1000), 0)


def _wait_for(sock: socket.socket, event: int, deadline: float | None, timeout: float | None) -> None:
    """Wait until ``sock`` is ready for ``event``, or raise ``TimeoutError`` at ``deadline``.

    A rare path (a full socket buffer, TLS wanting the other direction): the poll object is made per call.
    """
    ready = select.poll()
    ready.register(sock.fileno(), event)
    while not ready.poll(_poll_ms(deadline)):
        if deadline is not None and time.monotonic() >= deadline:
            raise TimeoutError(f"the peer was not ready within {timeout:.3g}s")


def write_frames(sock: socket.socket, frames: list[bytes | memoryview], timeout: float | None) -> None:
    """Write one message's frames (header first) to a non-blocking ``sock``.

    One ``sendmsg`` when the socket has room (a TLS socket, which has none, gets one
    ``send`` of the joined frames, or one per frame above 64 KiB); otherwise it waits
    with ``poll`` for room, at most ``timeout`` seconds in all (``None``: no limit).

    Raises
    ------
    TimeoutError
        The peer took no bytes for ``timeout`` seconds: part of the message may have
        been written, so the stream is out of step.
    OSError
        The socket failed (the peer is gone).
    """
    sent = 0
    if type(sock) is socket.socket:  # plain: the whole message usually leaves with one sendmsg
        try:
            sent = sock.sendmsg(frames)
        except BlockingIOError:
            sent = 0
        if sent == sum(memoryview(f).nbytes for f in frames):
            return
    views = _drop_sent([memoryview(f).cast("B") for f in frames], sent)
    tls = isinstance(sock, ssl.SSLSocket)
    if tls and sum(v.nbytes for v in views) <= _JOIN_MAX:
        views = [memoryview(b"".join(views))]
    deadline: float | None = None
    while views:
        try:
            sent = sock.send(views[0]) if tls else sock.sendmsg(views)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError) as e:
            if deadline is None and timeout is not None:
                deadline = time.monotonic() + timeout
            event = select.POLLIN if isinstance(e, ssl.SSLWantReadError) else select.POLLOUT
            _wait_for(sock, event, deadline, timeout)
            continue
        views = _drop_sent(views, sent)


def _drop_sent(views: list[memoryview], sent: int) -> list[memoryview]:
    """``views`` without their first ``sent`` bytes (those a send took)."""
    while views and sent >= views[0].nbytes:
        sent -= views[0].nbytes
        views.pop(0)
    if views and sent:
        views[0] = views[0][sent:]
    return views


def digest(token: bytes, role: bytes, nonce: bytes) -> bytes:
    """HMAC-SHA256 of ``role + nonce`` under ``token``."""
    return hmac.new(token, role + nonce, hashlib.sha256).digest()


def machine_id() -> str:
    """Identify this machine's kernel: a Unix socket is reachable only where this matches.

    The host name and, on Linux, the kernel's boot id. Two containers on one host
    usually differ in host name and then use TCP, which is always correct; when they
    match but cannot see each other's files, the Unix connection fails and the client
    falls back to TCP.
    """
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


# --------------------------------------------------------------------------- logging
class RateLimitedLog:
    """Log a kind of event at most once per ``interval`` seconds, counting the rest.

    A flood of hostile connections must not flood the worker's log: the first event of
    a burst is logged, the following ones are counted, and the next line logged says
    how many were left out.

    Parameters
    ----------
    log : logging.Logger
        Where lines go.
    interval : float
        Seconds between two lines of the same kind.
    """

    def __init__(self, log: logging.Logger, interval: float = 10.0) -> None:
        self._log = log
        self._interval = interval
        self._lock = threading.Lock()
        self._last: dict[str, float] = {}
        self._skipped: dict[str, int] = {}

    def __call__(self, kind: str, level: int, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless a line of ``kind`` went out within the interval; True if logged."""
        now = time.monotonic()
        with self._lock:
            last = self._last.get(kind)
            if last is not None and now - last < self._interval:
                self._skipped[kind] = self._skipped.get(kind, 0) + 1
                return False
            self._last[kind] = now
            skipped = self._skipped.pop(kind, 0)
        if skipped:
            msg += " (%d more like this since the last such line)"
            args = (*args, skipped)
        self._log.log(level, msg, *args)
        return True
