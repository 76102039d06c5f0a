"""Transport: how requests reach an env-group actor and how replies come back.

Dask places the env-group actors, keeps their lifecycle and monitors them; this module
moves each step's data. There are two channels with one interface:

:class:`DirectChannel`
    The fast path. The actor listens on a TCP port of its worker's host and on a
    Unix socket in a private directory; the client keeps one socket to it, the Unix
    one when both run on the same machine (a loopback TCP send costs more kernel
    time), TCP otherwise. After each reply the actor can busy-poll briefly for the
    next request (``busy_poll``). A request is a single ``sendmsg`` of a small
    header, one payload and the raw buffers of large NumPy arrays (out of band, so
    arrays are never pickled element by element). The payload is a pickle, except
    for the two messages of every step, which are compact records of raw arrays
    whenever their content allows (see :func:`encode`). A connection is
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
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
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
    "StepReply",
    "decode",
    "encode",
    "iter_replies",
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


# ------------------------------------------------------------- step replies
@dataclass(slots=True, eq=False)
class StepReply:
    """What one env group returns for a step: the value of its ``("ok", ...)`` reply.

    The worker (:meth:`daskvec.worker.EnvGroup._step`) builds it, the client
    (:meth:`daskvec.vec_env.DaskVecEnv.step_wait`) reads it, and :func:`encode` writes
    it in the compact form when ``plain`` says that it fits.

    Attributes
    ----------
    obs : array, dict or tuple of arrays
        The group's observations stacked along a first axis (after any automatic reset).
    rewards : numpy.ndarray
        ``float64``, one per env.
    dones : numpy.ndarray
        ``bool``, one per env.
    infos : list of dict
        One per env. Every one holds ``"TimeLimit.truncated"``; those of finished
        episodes hold ``"terminal_observation"`` too.
    reset_infos : dict of int to dict
        For the envs that were reset after their episode ended (by position in the
        group): the reset info.
    env_seconds : float
        Wall time the group spent in its envs' ``step`` and ``reset`` calls.
    restarts : list of int
        Each env's restart count.
    plain : bool
        Set by the group when its infos hold nothing but what it adds itself
        (``"TimeLimit.truncated"``, and ``"terminal_observation"`` exactly for the
        finished episodes) and every reset info is empty: then the reply travels in
        the compact form, from which :func:`decode` rebuilds the same infos.
    """

    obs: Any
    rewards: np.ndarray
    dones: np.ndarray
    infos: list[dict[str, Any]]
    reset_infos: dict[int, dict[str, Any]]
    env_seconds: float
    restarts: list[int]
    plain: bool = False


# ------------------------------------------------------------- compact step messages
# The two messages of every step have a fixed form: ("step", (actions,)) and, in the
# common case, ("ok", StepReply) whose infos carry nothing but the keys the group adds
# itself (the group says so: StepReply.plain). They are written as raw arrays behind a
# one-byte tag instead of as a pickle: no pickler, no reduce callbacks, no objects to
# rebuild by the unpickler. Both sit on the critical path of every step; with cheap
# envs this gave 14% more steps per second (docs/benchmark.md). Every other message,
# and every step reply that does not fit (dict observations, infos with keys of the
# env's own, reset infos that are not empty), stays a pickle. A pickle of protocol 2
# or later starts with 0x80, so the tags below never collide with one.
_STEP_REQUEST = 0x01
_STEP_REPLY = 0x02
_PICKLE = 0x80
# per-env bits of a compact step reply
_DONE, _TRUNCATED, _TERMINAL, _RESET_INFO = 1, 2, 4, 8
_REPLY_HEAD = struct.Struct("<BdI")  # tag, env_seconds, number of envs n; then n flag bytes,
# n little-endian float64 rewards, n int64 restart counts, the observations and, if any
# env has a terminal observation, those stacked
_ARRAY_HEAD = struct.Struct("<BBB")  # length of the dtype string, ndim, out of band?
_F8 = np.dtype("<f8")
_META_OUT: dict[tuple[np.dtype[Any], tuple[int, ...], bool], bytes] = {}
_META_IN: dict[bytes, tuple[np.dtype[Any], tuple[int, ...], int]] = {}
_META_CACHE_MAX = 256


def _array_parts(arr: np.ndarray, parts: list[bytes], extra: list[memoryview]) -> None:
    """Append ``arr``'s description and data to a compact message."""
    oob = arr.nbytes >= OUT_OF_BAND_MIN_BYTES
    key = (arr.dtype, arr.shape, oob)
    meta = _META_OUT.get(key)
    if meta is None:
        dtype = arr.dtype.str.encode()
        meta = _ARRAY_HEAD.pack(len(dtype), arr.ndim, oob) + dtype + struct.pack(f"<{arr.ndim}Q", *arr.shape)
        if len(_META_OUT) >= _META_CACHE_MAX:
            _META_OUT.clear()
        _META_OUT[key] = meta
    parts.append(meta)
    if oob:
        extra.append(memoryview(cast(Any, np.ascontiguousarray(arr))).cast("B"))
    else:
        parts.append(arr.tobytes())


def _parse_meta(meta: bytes) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    n_dtype, ndim, oob = _ARRAY_HEAD.unpack_from(meta, 0)
    dtype = np.dtype(meta[_ARRAY_HEAD.size : _ARRAY_HEAD.size + n_dtype].decode())
    if dtype.hasobject:
        raise ValueError("object arrays are not sent raw")
    shape = struct.unpack_from(f"<{ndim}Q", meta, _ARRAY_HEAD.size + n_dtype)
    count = 1
    for dim in shape:
        count *= dim
    return dtype, shape, -1 if oob else count


def _read_array(payload: Any, offset: int, extra: list[Any]) -> tuple[np.ndarray, int]:
    """Read one array written by :func:`_array_parts`; returns it and the next offset."""
    size = _ARRAY_HEAD.size + payload[offset] + 8 * payload[offset + 1]
    meta = bytes(payload[offset : offset + size])
    known = _META_IN.get(meta)
    if known is None:
        known = _parse_meta(meta)
        if len(_META_IN) >= _META_CACHE_MAX:
            _META_IN.clear()
        _META_IN[meta] = known
    dtype, shape, count = known
    offset += size
    if count < 0:
        arr = np.frombuffer(extra.pop(0), dtype=dtype)
    else:
        arr = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
        offset += arr.nbytes
    if not arr.flags.writeable:  # a frame of immutable bytes (the actor channel)
        arr = arr.copy()
    return arr.reshape(shape), offset


def _encode_step(obj: Any) -> tuple[bytes, list[memoryview]] | None:
    """The compact form of a step request or reply, or None if ``obj`` has no such form."""
    if type(obj) is not tuple or len(obj) != 2:
        return None
    head, body = obj
    parts: list[bytes] = []
    extra: list[memoryview] = []
    if head == "step":
        if type(body) is not tuple or len(body) != 1:
            return None
        actions = body[0]
        if type(actions) is not np.ndarray or actions.dtype.hasobject:
            return None
        parts.append(b"\x01")  # _STEP_REQUEST
        _array_parts(actions, parts, extra)
        return b"".join(parts), extra
    if head != "ok" or type(body) is not StepReply or not body.plain:
        return None
    obs, rewards, dones = body.obs, body.rewards, body.dones
    n = len(body.infos)
    if not (
        type(obs) is np.ndarray
        and not obs.dtype.hasobject
        and len(obs) == n
        and type(rewards) is np.ndarray
        and rewards.shape == (n,)
        and type(dones) is np.ndarray
        and dones.dtype == np.bool_
        and dones.shape == (n,)
        and len(body.restarts) == n
    ):
        return None
    # A plain reply's infos say nothing that the flags do not: "TimeLimit.truncated",
    # which only a finished episode sets, and the terminal observation of each one.
    flags = bytearray(dones.tobytes())  # _DONE per finished episode
    terminal: list[np.ndarray] = []
    row_shape = obs.shape[1:]
    for pos, done in enumerate(flags):
        if done:
            info = body.infos[pos]
            last = info.get("terminal_observation")
            if type(last) is not np.ndarray or last.dtype != obs.dtype or last.shape != row_shape:
                return None
            terminal.append(last)
            flags[pos] |= _TERMINAL | (_TRUNCATED if info.get("TimeLimit.truncated") else 0)
    for pos in body.reset_infos:
        if not 0 <= pos < n:
            return None
        flags[pos] |= _RESET_INFO
    try:
        counts = struct.pack(f"<{n}q", *body.restarts)
    except struct.error:
        return None
    parts.append(_REPLY_HEAD.pack(_STEP_REPLY, body.env_seconds, n))
    parts.append(bytes(flags))
    parts.append(rewards.astype("<f8", copy=False).tobytes())
    parts.append(counts)
    _array_parts(obs, parts, extra)
    if terminal:
        _array_parts(np.stack(terminal), parts, extra)
    return b"".join(parts), extra


def _decode_step(frames: Sequence[Any]) -> Any:
    """Rebuild the message that :func:`_encode_step` wrote, as the pickle path would."""
    payload = frames[0]
    extra = list(frames[1:])
    try:
        if payload[0] == _STEP_REQUEST:
            actions, _ = _read_array(payload, 1, extra)
            return ("step", (actions,))
        _, env_seconds, n = _REPLY_HEAD.unpack_from(payload, 0)
        offset = _REPLY_HEAD.size
        flags = bytes(payload[offset : offset + n])
        offset += n
        rewards = np.frombuffer(payload, dtype=_F8, count=n, offset=offset)
        if not rewards.flags.writeable:
            rewards = rewards.copy()
        offset += 8 * n
        restarts = list(struct.unpack_from(f"<{n}q", payload, offset))
        offset += 8 * n
        obs, offset = _read_array(payload, offset, extra)
        terminal = _read_array(payload, offset, extra)[0] if any(b & _TERMINAL for b in flags) else None
    except (struct.error, ValueError, TypeError, IndexError) as e:
        raise ChannelError(f"malformed compact message: {e}") from e
    if len(flags) != n or len(obs) != n:
        raise ChannelError("malformed compact step reply (lengths differ)")
    infos: list[dict[str, Any]] = []
    reset_infos: dict[int, dict[str, Any]] = {}
    dones: list[bool] = []
    k = 0
    for pos, bits in enumerate(flags):
        dones.append(bool(bits & _DONE))
        info: dict[str, Any] = {"TimeLimit.truncated": bool(bits & _TRUNCATED)}
        if bits & _TERMINAL:
            if terminal is None or k >= len(terminal):
                raise ChannelError("malformed compact step reply (terminal observations)")
            info["terminal_observation"] = terminal[k]
            k += 1
        if bits & _RESET_INFO:
            reset_infos[pos] = {}
        infos.append(info)
    reply = StepReply(
        obs, rewards, np.array(dones, dtype=bool), infos, reset_infos, env_seconds, restarts, plain=True
    )
    return ("ok", reply)


def _framed(payload: bytes | memoryview, extra: Sequence[bytes | memoryview]) -> list[bytes | memoryview]:
    lengths = [memoryview(payload).nbytes, *(memoryview(x).nbytes for x in extra)]
    header = _COUNT.pack(len(lengths)) + struct.pack(f"!{len(lengths)}Q", *lengths)
    return [header, payload, *extra]


def encode(obj: Any) -> list[bytes | memoryview]:
    """Encode ``obj`` as frames: a header, one payload, then the raw buffers of large arrays.

    Parameters
    ----------
    obj : object
        Anything cloudpickle can pickle. NumPy arrays inside it are written as raw
        bytes with their dtype and shape; those of at least
        :data:`OUT_OF_BAND_MIN_BYTES` are not copied at all but sent as separate
        frames after the payload. A step request, and a step reply whose infos hold
        only the keys the group sets itself, get a compact payload of raw arrays;
        everything else is one pickle.

    Returns
    -------
    list of bytes-like
        ``[header, payload, buffer, ...]`` ready for :func:`socket.socket.sendmsg`.
    """
    compact = _encode_step(obj)
    if compact is not None:
        return _framed(*compact)
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
    return _framed(f.getbuffer(), [b.raw() for b in buffers])


def decode(frames: Sequence[bytes | bytearray | memoryview]) -> Any:
    """Decode the frames made by :func:`encode` (without the header frame).

    Raises
    ------
    ChannelError
        If the payload is neither a pickle nor a well-formed compact step message.
    """
    tag = frames[0][0] if len(frames[0]) else -1
    if tag == _PICKLE:
        return pickle.loads(frames[0], buffers=frames[1:])
    if tag in (_STEP_REQUEST, _STEP_REPLY):
        return _decode_step(frames)
    raise ChannelError(f"malformed message (payload starts with byte {tag})")


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


def check_busy_poll(value: Any) -> float:
    """``value`` as a busy-poll budget in seconds, or ``ValueError`` if it is not one (0 to 0.1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 0.1:
        raise ValueError(f"busy_poll must be a number of seconds between 0 and 0.1, not {value!r}")
    return float(value)


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
        ``handler(request) -> reply``, called on the connection's thread, one request
        at a time per connection. It reports errors in its reply; a ``ChannelError``
        it raises (e.g. its owner is gone) drops the connection.
    name : str
        Used in thread names and log messages.
    unix_dir : str or None, optional
        Directory in which to make the private directory of the Unix socket; ``""``
        (the default) is the system's temporary directory. ``None`` or an unusable
        directory: TCP only.
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
    refused : int
        Connections dropped because the peer failed the handshake.
    polls, poll_hits : int
        How many times a connection busy-polled for its next request, and how many of
        those polls found it (the rest ended in a sleep in the kernel). Diagnostic
        counts, added to without a lock.
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
        budget = check_busy_poll(busy_poll)
        # polling needs non-blocking peeks and sched_yield (POSIX); elsewhere it is off
        self._busy_poll = budget if hasattr(socket, "MSG_DONTWAIT") and hasattr(os, "sched_yield") else 0.0
        self._token = token
        self._handler = handler
        self._name = name
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self.refused = 0
        self.polls = 0
        self.poll_hits = 0
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
                    self.polls += 1
                    if _poll_readable(conn, budget):
                        self.poll_hits += 1
                try:
                    frames = _recv_frames(conn)
                except (OSError, ChannelError):
                    return
                if budget:
                    quick = time.perf_counter() - replied <= budget
                    misses = 0 if quick else misses + 1
                    (_HOT.add if quick else _HOT.discard)(me)
                try:
                    reply = self._handler(decode(frames))
                except ChannelError as e:  # a malformed message, or a handler that is gone
                    logger.warning("daskvec channel %s dropped a connection: %s", self._name, e)
                    return
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


def iter_replies(channels: Sequence[Channel], timeout: float | None) -> Generator[Any, None, None]:
    """Yield the replies of many channels, one wait for all of them, each as soon as it is in.

    The channels are read in order, so a caller can take in the first reply while the
    later ones are still on their way. A caller that stops early must still exhaust
    the iterator (or the channels stay one reply behind).

    Parameters
    ----------
    channels : sequence of Channel
        Channels that each have one request pending.
    timeout : float or None
        Overall deadline in seconds for all replies.

    Yields
    ------
    object
        For each channel, in order, its decoded reply or the exception
        (``ChannelError`` or ``TimeoutError``) that its receive raised. A failure of
        one channel does not stop the others from being collected.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    for ch in channels:
        # once the deadline has passed, a reply that has already arrived must still be
        # collected: give every later channel a short grace instead of nothing
        remaining = None if deadline is None else max(deadline - time.monotonic(), _GRACE)
        try:
            reply = ch.recv(remaining)
        except (ChannelError, TimeoutError) as e:
            reply = e
        yield reply


def recv_many(channels: Sequence[Channel], timeout: float | None) -> list[Any]:
    """All the replies of :func:`iter_replies` (same parameters) as a list, in channel order."""
    return list(iter_replies(channels, timeout))
