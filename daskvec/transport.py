"""Transport: how requests reach an env-group actor and how replies come back.

Dask places the env-group actors, keeps their lifecycle and monitors them; this module
moves each step's data. There are two channels with one interface:

:class:`DirectChannel`
    The fast path. The actor listens on a TCP port of its worker's host and on a
    Unix socket in a private directory; the client keeps one socket to it, the Unix
    one when both run on the same machine (a loopback TCP send costs more kernel
    time), TCP otherwise. After each reply the actor can busy-poll briefly for the
    next request (``busy_poll``). A request is a single ``sendmsg`` of a small
    header, one pickle and the raw buffers of any NumPy arrays (pickle protocol 5,
    out of band, so arrays are never pickled element by element). A connection is
    served only after a mutual HMAC-SHA256 challenge over a fresh random token that
    the client handed the actor through Dask: a stranger is dropped before a single
    byte it sent is unpickled.

:class:`ActorChannel`
    The fallback, when the worker's host cannot be reached from the client (a client
    outside the cluster network) or the cluster uses TLS. The same encoded request
    travels as one bytes argument of an ordinary Dask actor call, so it is protected
    by whatever Dask's own comms use.

Both channels carry the same messages, encoded by :func:`encode` and decoded by
:func:`decode`: a request is ``(command, args)``, a reply ``("ok", value)`` or
``("err", error)``. The worker side (:mod:`daskvec.worker`) produces replies; the
client side (:mod:`daskvec.vec_env`) sends requests and waits for replies with
:func:`recv_many`, one wait for all groups per step.
"""

from __future__ import annotations

import contextlib
import copyreg
import hashlib
import hmac
import io
import logging
import os
import pickle
import secrets
import shutil
import socket
import struct
import tempfile
import threading
import time
from collections import ChainMap
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import cloudpickle
import numpy as np

logger = logging.getLogger(__name__)

__all__ = [
    "ActorChannel",
    "Channel",
    "ChannelError",
    "ChannelServer",
    "DirectChannel",
    "decode",
    "encode",
    "machine_id",
    "pack",
    "recv_many",
    "unpack",
]

_COUNT = struct.Struct("!I")
_NONCE_BYTES = 32
_DIGEST_BYTES = 32
_HANDSHAKE_TIMEOUT = 10.0
_MAX_FRAMES = 1 << 16
_MAX_FRAME_BYTES = 1 << 34
_GRACE = 0.1


class ChannelError(ConnectionError):
    """The channel to an env-group actor broke: its worker died, hung or is unreachable."""


# --------------------------------------------------------------------------- encoding
#: Arrays at least this large travel as separate out-of-band frames (never copied
#: into the pickle); smaller ones ride inside it as raw bytes.
OUT_OF_BAND_MIN_BYTES = 1 << 14


def _array_from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)  # a writable copy


def _array_from_buffer(buffer: Any, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    return np.frombuffer(buffer, dtype=dtype).reshape(shape)  # the received frame, not a copy


def _reduce_array(arr: np.ndarray) -> Any:
    # NumPy's own pickling of small arrays goes through Python helpers and costs more
    # than a whole CartPole step; (bytes, dtype, shape) does not. Only arrays reach
    # this function (it is the pickler's dispatch entry for np.ndarray), so the other
    # objects of a message are pickled by C code alone.
    if arr.dtype.hasobject:
        return arr.__reduce_ex__(5)
    if arr.nbytes >= OUT_OF_BAND_MIN_BYTES:
        arr = np.ascontiguousarray(arr)
        return _array_from_buffer, (pickle.PickleBuffer(arr.data), arr.dtype.str, arr.shape)
    return _array_from_bytes, (arr.tobytes(), arr.dtype.str, arr.shape)


class _Pickler(pickle.Pickler):
    """The fast C pickler, for messages of plain data."""


class _CloudPickler(cloudpickle.Pickler):
    """The fallback for what plain pickle cannot handle (lambdas, classes from ``__main__``)."""


# Set after the class bodies: they are class-level tables, looked up by C code for types
# pickle does not handle natively. ChainMaps are live views: what is registered with
# copyreg (or cloudpickle) later still counts.
_ARRAYS: dict[type, Any] = {np.ndarray: _reduce_array}
_Pickler.dispatch_table = ChainMap(_ARRAYS, cast(Any, copyreg.dispatch_table))
_CloudPickler.dispatch_table = ChainMap(_ARRAYS, cloudpickle.Pickler.dispatch_table)


def encode(obj: Any) -> list[bytes | memoryview]:
    """Encode ``obj`` as frames: a header, one pickle, then the raw buffers of large arrays.

    Parameters
    ----------
    obj : object
        Anything cloudpickle can pickle. NumPy arrays inside it are written as raw
        bytes with their dtype and shape; those of at least
        :data:`OUT_OF_BAND_MIN_BYTES` are not copied at all but sent as separate
        frames after the pickle.

    Returns
    -------
    list of bytes-like
        ``[header, pickle, buffer, ...]`` ready for :func:`socket.socket.sendmsg`.
    """
    buffers: list[pickle.PickleBuffer] = []
    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    except Exception:
        # The C pickler is several times faster than cloudpickle; fall back to it only
        # for what plain pickle cannot handle (lambdas, classes from __main__, ...).
        buffers.clear()
        f = io.BytesIO()
        _CloudPickler(f, protocol=5, buffer_callback=buffers.append).dump(obj)
    payload = f.getbuffer()
    frames = [b.raw() for b in buffers]
    lengths = [payload.nbytes, *(r.nbytes for r in frames)]
    header = _COUNT.pack(len(lengths)) + struct.pack(f"!{len(lengths)}Q", *lengths)
    return [header, payload, *frames]


def decode(frames: Sequence[bytes | bytearray | memoryview]) -> Any:
    """Decode the frames made by :func:`encode` (without the header frame)."""
    return pickle.loads(frames[0], buffers=frames[1:])


def pack(obj: Any) -> bytes:
    """Encode ``obj`` into one bytes object (used by :class:`ActorChannel`)."""
    return b"".join(encode(obj))


def unpack(data: bytes | bytearray | memoryview) -> Any:
    """Inverse of :func:`pack`."""
    view = memoryview(data)
    (count,) = _COUNT.unpack_from(view, 0)
    offset = _COUNT.size
    lengths = struct.unpack_from(f"!{count}Q", view, offset)
    offset += 8 * count
    frames = []
    for n in lengths:
        frames.append(view[offset : offset + n])
        offset += n
    return decode(frames)


# --------------------------------------------------------------------------- sockets
def _send_frames(sock: socket.socket, frames: list[bytes | memoryview]) -> None:
    views = [memoryview(f).cast("B") for f in frames]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise ChannelError("connection closed by peer")
        got += k
    return buf


_FIRST = struct.Struct("!IQ")


def _recv_frames(sock: socket.socket) -> list[bytearray]:
    # Every message has at least one frame: read the count and the first length at once.
    count, first = _FIRST.unpack(_recv_exact(sock, _FIRST.size))
    if not 0 < count <= _MAX_FRAMES:
        raise ChannelError(f"malformed message header ({count} frames)")
    lengths = (first, *struct.unpack(f"!{count - 1}Q", _recv_exact(sock, 8 * (count - 1)))) if count > 1 else (first,)
    if any(n > _MAX_FRAME_BYTES for n in lengths):
        raise ChannelError("malformed message header (frame too large)")
    return [_recv_exact(sock, n) for n in lengths]


#: Connections (by id) whose client sent its last request within the poll budget
#: of the previous reply: the ones stepping fast. A connection busy-polls only while
#: no other connection in its process is hot, so polls never fight a stepping
#: thread of the same process for the GIL.
_HOT: set[int] = set()
#: After this many requests in a row that arrived later than the budget (a client
#: busy with something else, e.g. a training update), a connection stops polling until
#: a request comes quickly again.
_POLL_MISSES = 8


def _poll_readable(conn: socket.socket, budget: float) -> bool:
    """Busy-poll ``conn`` for up to ``budget`` seconds; True once data is waiting.

    Each round yields the CPU, so a runnable process on the same core (the client,
    on a machine it shares with its workers) is not held up by the poll.
    """
    end = time.perf_counter() + budget
    flags = socket.MSG_PEEK | socket.MSG_DONTWAIT
    while True:
        try:
            conn.recv(1, flags)
            return True  # a byte waiting, or b"" when the peer closed: the receive finds out which
        except BlockingIOError:
            pass
        except OSError:
            return True  # let the blocking receive report the error
        if time.perf_counter() >= end:
            return False
        os.sched_yield()


def _digest(token: bytes, role: bytes, nonce: bytes) -> bytes:
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


#: Longest Unix socket path used; the kernel's limit is 107 bytes on Linux, 103 on macOS.
_MAX_UNIX_PATH = 100


class ChannelServer:
    """Worker side of :class:`DirectChannel`: a listening socket served by threads.

    Parameters
    ----------
    host : str
        Interface to listen on (the host of the worker's own address).
    token : bytes
        Shared secret; only a peer that proves knowledge of it is served.
    handler : callable
        ``handler(request) -> reply``; must not raise. Called on the connection's
        thread, one request at a time per connection.
    name : str
        Used in thread names and log messages.
    unix_dir : str or None, optional
        Directory in which to make the private directory of the Unix socket (default:
        the system's temporary directory). ``None`` or an unusable directory: TCP only.
    busy_poll : float, optional
        Seconds to keep polling a connection for its next request after each reply,
        before sleeping in the kernel (default 0: sleep at once). When the client
        answers within this budget, the request is picked up without the wake-up of a
        sleeping thread, which on virtual machines costs tens to hundreds of
        microseconds per round trip. Only the one fast-stepping connection of a
        process polls, and it stops while its client is slow.

    Attributes
    ----------
    address : tuple of (str, int)
        The TCP address.
    unix_path : str or None
        The Unix socket's path, when there is one. It lives in a directory only this
        user can enter, and the same handshake guards it.
    """

    def __init__(
        self,
        host: str,
        token: bytes,
        handler: Callable[[Any], Any],
        name: str = "daskvec",
        unix_dir: str | None = "",
        busy_poll: float = 0.0,
    ) -> None:
        if not busy_poll >= 0:
            raise ValueError(f"busy_poll must be a number of seconds >= 0, not {busy_poll!r}")
        # polling needs non-blocking peeks and sched_yield (POSIX); elsewhere it is off
        self._busy_poll = float(busy_poll) if hasattr(socket, "MSG_DONTWAIT") and hasattr(os, "sched_yield") else 0.0
        self._token = token
        self._handler = handler
        self._name = name
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self.refused = 0
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(16)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._listeners = [self._sock]
        self._unix_dir: str | None = None
        self.unix_path: str | None = None
        if unix_dir is not None and hasattr(socket, "AF_UNIX"):
            self._listen_unix(unix_dir or None)
        for sock in self._listeners:
            threading.Thread(
                target=self._accept_loop, args=(sock,), name=f"{name}-accept", daemon=True
            ).start()

    def _listen_unix(self, parent: str | None) -> None:
        try:
            # mkdtemp makes the directory with mode 0700: other users cannot connect at all
            directory = tempfile.mkdtemp(prefix="daskvec-", dir=parent)
        except OSError as e:
            logger.debug("no Unix socket for %s: %s", self._name, e)
            return
        path = os.path.join(directory, "channel")
        if len(os.fsencode(path)) > _MAX_UNIX_PATH:
            logger.debug("no Unix socket for %s: path %s is too long", self._name, path)
            os.rmdir(directory)
            return
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.bind(path)
            sock.listen(16)
        except OSError as e:
            logger.debug("no Unix socket for %s: %s", self._name, e)
            sock.close()
            shutil.rmtree(directory, ignore_errors=True)
            return
        self._unix_dir, self.unix_path = directory, path
        self._listeners.append(sock)

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._closed.is_set():
            try:
                conn, peer = listener.accept()
            except OSError:
                return
            threading.Thread(
                target=self._serve, args=(conn, peer or "unix"), name=f"{self._name}-conn", daemon=True
            ).start()

    def _authenticate(self, conn: socket.socket) -> bool:
        conn.settimeout(_HANDSHAKE_TIMEOUT)
        server_nonce = secrets.token_bytes(_NONCE_BYTES)
        conn.sendall(server_nonce)
        answer = _recv_exact(conn, _DIGEST_BYTES + _NONCE_BYTES)
        proof, client_nonce = bytes(answer[:_DIGEST_BYTES]), bytes(answer[_DIGEST_BYTES:])
        if not hmac.compare_digest(proof, _digest(self._token, b"client", server_nonce)):
            return False
        conn.sendall(_digest(self._token, b"server", client_nonce))
        conn.settimeout(None)
        return True

    def _serve(self, conn: socket.socket, peer: Any) -> None:
        with self._lock:
            self._conns.add(conn)
        try:
            try:
                ok = self._authenticate(conn)
            except (OSError, ChannelError):
                ok = False
            if not ok:
                self.refused += 1
                logger.warning("daskvec channel %s refused an unauthenticated peer %s", self._name, peer)
                return
            if conn.family != getattr(socket, "AF_UNIX", None):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            # no polling before the first request that came within the budget of a reply
            budget, misses, replied = self._busy_poll, _POLL_MISSES, -float("inf")
            me = id(conn)
            only_me = {me}
            while not self._closed.is_set():
                if misses < _POLL_MISSES and _HOT.issubset(only_me):  # no other hot connection here
                    _poll_readable(conn, budget)
                try:
                    frames = _recv_frames(conn)
                except (OSError, ChannelError):
                    return
                if budget:
                    quick = time.perf_counter() - replied <= budget
                    misses = 0 if quick else misses + 1
                    (_HOT.add if quick else _HOT.discard)(me)
                reply = self._handler(decode(frames))
                try:
                    _send_frames(conn, encode(reply))
                except OSError:
                    return
                replied = time.perf_counter()
        finally:
            _HOT.discard(id(conn))
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def close(self) -> None:
        """Stop listening and drop every connection (idempotent)."""
        if self._closed.is_set():
            return
        self._closed.set()
        for sock in self._listeners:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        if self._unix_dir is not None:
            shutil.rmtree(self._unix_dir, ignore_errors=True)
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            with contextlib.suppress(OSError):
                c.shutdown(socket.SHUT_RDWR)


# --------------------------------------------------------------------------- channels
class Channel(Protocol):
    """What the client needs from a channel to one env-group actor."""

    kind: str

    def send(self, request: Any) -> None:
        """Send one request; do not wait for the reply."""

    def recv(self, timeout: float | None) -> Any:
        """Wait for the reply to the last request (``TimeoutError`` after ``timeout`` s)."""

    def close(self) -> None:
        """Release the channel (idempotent)."""


class DirectChannel:
    """Client side of the fast path: one authenticated socket to one actor.

    Parameters
    ----------
    address : tuple of (str, int), or str
        The actor's TCP address, or the path of its Unix socket, as the actor reported.
    token : bytes
        The secret given to the actor when it was created.
    connect_timeout : float
        Seconds to wait for the connection and the handshake.

    Attributes
    ----------
    family : {"tcp", "unix"}
        Which kind of socket this channel uses.

    Raises
    ------
    ChannelError
        When the address cannot be reached or the peer fails the handshake.
    """

    kind = "direct"

    def __init__(self, address: tuple[str, int] | str, token: bytes, connect_timeout: float = 5.0) -> None:
        self.address = address
        self.family = "unix" if isinstance(address, str) else "tcp"
        where = self._where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
        try:
            if isinstance(address, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(connect_timeout)
                    sock.connect(address)
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection(address, timeout=connect_timeout)
        except OSError as e:
            raise ChannelError(f"cannot connect to {where}: {e}") from e
        try:
            server_nonce = bytes(_recv_exact(sock, _NONCE_BYTES))
            client_nonce = secrets.token_bytes(_NONCE_BYTES)
            sock.sendall(_digest(token, b"client", server_nonce) + client_nonce)
            proof = bytes(_recv_exact(sock, _DIGEST_BYTES))
        except OSError as e:
            sock.close()
            raise ChannelError(f"handshake with {where} failed: {e}") from e
        if not hmac.compare_digest(proof, _digest(token, b"server", client_nonce)):
            sock.close()
            raise ChannelError(f"peer at {where} failed authentication")
        if self.family == "tcp":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(None)
        self._sock: socket.socket | None = sock

    def send(self, request: Any) -> None:
        """See :class:`Channel`."""
        if self._sock is None:
            raise ChannelError("channel is closed")
        try:
            self._sock.settimeout(None)
            _send_frames(self._sock, encode(request))
        except OSError as e:
            raise ChannelError(f"send to {self._where} failed: {e}") from e

    def recv(self, timeout: float | None) -> Any:
        """See :class:`Channel`."""
        if self._sock is None:
            raise ChannelError("channel is closed")
        self._sock.settimeout(timeout)
        try:
            frames = _recv_frames(self._sock)
        except TimeoutError:
            raise
        except OSError as e:
            raise ChannelError(f"receive from {self._where} failed: {e}") from e
        return decode(frames)

    def fileno(self) -> int:
        """The socket's file descriptor (for ``select``)."""
        return -1 if self._sock is None else self._sock.fileno()

    def close(self) -> None:
        """See :class:`Channel`."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None


class ActorChannel:
    """Client side of the fallback path: ordinary Dask actor calls.

    Parameters
    ----------
    actor : distributed.Actor
        Proxy of an :class:`daskvec.worker.EnvGroup`.
    """

    kind = "actor"

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._pending: Any = None

    def send(self, request: Any) -> None:
        """See :class:`Channel`."""
        try:
            self._pending = self._actor.handle(pack(request))
        except Exception as e:  # the proxy raises when its worker is known to be gone
            raise ChannelError(str(e)) from e

    def recv(self, timeout: float | None) -> Any:
        """See :class:`Channel`."""
        fut, self._pending = self._pending, None
        if fut is None:
            raise ChannelError("no request is pending on this channel")
        try:
            data = fut.result(timeout=timeout)
        except TimeoutError:
            raise
        except Exception as e:
            raise ChannelError(f"actor call failed: {type(e).__name__}: {e}") from e
        return unpack(data)

    def close(self) -> None:
        """See :class:`Channel`."""
        self._pending = None


def recv_many(channels: Sequence[Channel], timeout: float | None) -> list[Any]:
    """Wait once for the replies of many channels.

    Parameters
    ----------
    channels : sequence of Channel
        Channels that each have one request pending.
    timeout : float or None
        Overall deadline in seconds for all replies.

    Returns
    -------
    list
        For each channel its decoded reply, or the exception (``ChannelError`` or
        ``TimeoutError``) that its receive raised. A failure of one channel does not
        stop the others from being collected.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    out: list[Any] = []
    for ch in channels:
        # once the deadline has passed, a reply that has already arrived must still be
        # collected: give every later channel a short grace instead of nothing
        remaining = None if deadline is None else max(deadline - time.monotonic(), _GRACE)
        try:
            out.append(ch.recv(remaining))
        except (ChannelError, TimeoutError) as e:
            out.append(e)
    return out
