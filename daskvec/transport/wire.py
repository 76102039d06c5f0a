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
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import ssl
import struct
import threading
import time

logger = logging.getLogger(__name__)

__all__ = [
    "COUNT",
    "DIGEST_BYTES",
    "HANDSHAKE_TIMEOUT",
    "MAX_FRAMES",
    "MAX_MESSAGE_BYTES",
    "NONCE_BYTES",
    "ChannelError",
    "PickleLoadError",
    "ProtocolError",
    "RateLimitedLog",
    "digest",
    "machine_id",
    "recv_exact",
    "recv_frames",
    "send_frames",
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
def send_frames(sock: socket.socket, frames: list[bytes | memoryview]) -> None:
    """Write one message's frames (header first) to ``sock``."""
    views = [memoryview(f).cast("B") for f in frames]
    if isinstance(sock, ssl.SSLSocket):  # no sendmsg on TLS sockets
        total = sum(v.nbytes for v in views)
        if total <= _JOIN_MAX:
            sock.sendall(b"".join(views))
        else:
            for v in views:
                sock.sendall(v)
        return
    while views:
        sent = sock.sendmsg(views)
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


def recv_frames(sock: socket.socket) -> list[bytearray]:
    """Read one message and return its frames (without the header).

    Raises
    ------
    ProtocolError
        A header that announces no frame, too many, or more than
        :data:`MAX_MESSAGE_BYTES` in all.
    ChannelError
        The peer closed the connection.
    """
    # Every message has at least one frame: read the count and the first length at once.
    count, first = _FIRST.unpack(recv_exact(sock, _FIRST.size))
    if not 0 < count <= MAX_FRAMES:
        raise ProtocolError(f"malformed message header ({count} frames)")
    lengths = (first, *struct.unpack(f"!{count - 1}Q", recv_exact(sock, 8 * (count - 1)))) if count > 1 else (first,)
    if sum(lengths) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message too large ({sum(lengths)} bytes announced, at most {MAX_MESSAGE_BYTES})")
    return [recv_exact(sock, n) for n in lengths]


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
