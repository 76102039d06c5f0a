"""Worker side of the direct channel: :class:`ChannelServer` and its busy polling."""

from __future__ import annotations

import collections
import contextlib
import hmac
import logging
import os
import secrets
import shutil
import socket
import ssl
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from daskvec.transport import window
from daskvec.transport.codec import decode, encode, unsendable
from daskvec.transport.wire import (
    DIGEST_BYTES,
    HANDSHAKE_TIMEOUT,
    NONCE_BYTES,
    ChannelError,
    FrameReader,
    ProtocolError,
    RateLimitedLog,
    digest,
    recv_exact,
    send_frames,
)

logger = logging.getLogger(__name__)

__all__ = ["ChannelServer", "check_busy_poll"]

#: Connections (by id) whose client sent its last request within the poll budget
#: of the previous reply: the ones stepping fast. A connection busy-polls only while
#: no other connection in its process is quick, so polls never fight a stepping
#: thread of the same process for the GIL.
_QUICK_CONNECTIONS: set[int] = set()
#: After this many requests in a row that arrived later than the budget (a client
#: busy with something else, e.g. a training update), a connection stops polling until
#: a request comes quickly again.
_POLL_MISSES = 8
#: Seconds a poll's ``sched_yield`` may keep the thread off the CPU before the poll
#: judges its core contended: other threads were waiting to run there (another
#: process's env, a training loop, another job on a shared node), so the machine has no
#: idle core for the poll to spin on. A yield with nothing waiting returns in
#: microseconds; the client's own step between two requests takes well under this.
CONTENDED_YIELD = 0.001
#: Polls in a row that found the core contended before a connection pauses polling (one
#: alone is no sign: a virtual machine's CPU is sometimes taken away for a moment).
CONTENDED_POLLS = 4
#: Seconds a connection waits for its requests in the kernel, without polling, after
#: :data:`CONTENDED_POLLS` polls in a row found its core contended; then it polls again.
CONTENDED_PAUSE = 1.0


def check_busy_poll(value: Any, name: str = "busy_poll") -> float:
    """``value`` as a busy-poll budget in seconds, or ``ValueError`` naming ``name`` if it is not one (0 to 0.1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 0.1:
        raise ValueError(f"{name} must be a number of seconds between 0 and 0.1, not {value!r}")
    return float(value)


def _poll_readable(conn: socket.socket, budget: float) -> tuple[bool, bool]:
    """Busy-poll ``conn`` for up to ``budget`` seconds: whether data is waiting, and whether the core is contended.

    Each round yields the CPU, so a runnable process on the same core (the client,
    on a machine it shares with its workers) is not held up by the poll. A yield that
    kept this thread off the CPU for over :data:`CONTENDED_YIELD` ends the poll after
    one more look at the socket, and the core counts as contended: spinning on a core
    that others wait for takes their time and makes this thread's own wake-up later.
    """
    end = time.perf_counter() + budget
    flags = socket.MSG_PEEK | socket.MSG_DONTWAIT
    tls = isinstance(conn, ssl.SSLSocket)
    contended = False
    while True:
        if tls and cast(ssl.SSLSocket, conn).pending():
            return True, contended  # decrypted bytes already buffered
        try:
            socket.socket.recv(conn, 1, flags)  # the raw socket's recv: TLS sockets refuse flags
            return True, contended  # a byte waiting, or b"" when the peer closed: the receive finds out which
        except BlockingIOError:
            pass
        except OSError:
            return True, contended  # let the blocking receive report the error
        now = time.perf_counter()
        if contended or now >= end:
            return False, contended
        os.sched_yield()
        contended = time.perf_counter() - now > CONTENDED_YIELD


#: Longest Unix socket path used; the kernel's limit is 107 bytes on Linux, 103 on macOS.
_MAX_UNIX_PATH = 100
#: Connections that may wait for their handshake at once, per server. When that many
#: wait, a new connection is always taken in and pushes one out: the one that has waited
#: longest among those of the peer address holding the most slots. A right client's
#: handshake takes milliseconds, so it is done before a flood pushes it out; and a
#: flood from one address pushes out only its own connections.
MAX_PENDING = 64
#: Seconds the accept loop sleeps after an error, doubling per error in a row up to the max.
_BACKOFF_MIN, _BACKOFF_MAX = 0.01, 1.0
#: Seconds between two checks of the handshake deadlines (the accept loop's wake-ups).
_SWEEP_INTERVAL = 0.5
#: Seconds between two log lines of the same kind (refusals, accept errors, malformed
#: messages before or after the handshake, connections that failed).
LOG_INTERVAL = 10.0


@dataclass(eq=False)
class _Pending:
    """A connection waiting for its handshake, and when it must be done."""

    sock: socket.socket
    host: str
    deadline: float
    evicted: bool = False

    def cut(self) -> None:
        """Shut the connection down from another thread: its blocking read ends at once."""
        with contextlib.suppress(OSError):
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)  # the raw socket, TLS or not


class ChannelServer:
    """Worker side of :class:`DirectChannel`: a listening socket served by threads.

    Hostile peers are expected. At most ``max_pending`` connections wait for their
    handshake at once, each for at most ``handshake_timeout`` seconds in all (TLS
    included); a connection beyond the cap is taken in and pushes out the one that has
    waited longest among those of the busiest peer address, so no rate of fresh
    connections keeps a right client out, and a flood from one address pushes out only
    its own. The accept loop outlives any error (no descriptor left, ``EMFILE``,
    included): it backs off, logs once per burst and goes on. A malformed message ends
    its connection with one log line; no thread dies with a traceback. Every repeated
    log line of one kind is rate-limited (:class:`daskvec.transport.wire.RateLimitedLog`),
    before the handshake and after it alike: a peer holding the token may still be
    buggy, and its reconnect loop must not flood the worker's log.

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
        process polls, it stops while its client is slow, and it pauses while the
        machine has no idle core (a yield of the poll kept it off the CPU).
    ssl_context : ssl.SSLContext or None, optional
        A server-side TLS context (the worker's ``get_listen_args("worker")``): every
        TCP connection must complete a TLS handshake, with a client certificate when
        the context requires one, before the token handshake. The Unix socket, private
        to this user on this machine, stays plain.
    shared_memory : bool, optional
        Write large step observations into a memory file shared with a client that
        connected over the Unix socket (see :mod:`daskvec.transport.window`; Linux).
    max_pending : int, optional
        Connections that may wait for their handshake at once.
    handshake_timeout : float, optional
        Seconds a connection has, in all, to complete its handshake.
    worker : str, optional
        The worker's address, named by the error sent back for a reply that cannot be
        encoded (default: ``name``).

    Attributes
    ----------
    address : tuple of (str, int)
        The TCP address.
    unix_path : str or None
        The Unix socket's path, when there is one. It lives in a directory only this
        user can enter, and the same handshake guards it.
    tls : bool
        Whether TCP connections are TLS.
    refused : int
        Connections dropped because the peer failed the handshake (TLS or token), ran
        out of time, or was pushed out of its slot by newer connections.
    accept_errors : int
        Errors of the accept loop (each followed by a back-off).
    polls, poll_hits, polls_contended : int
        How many times a connection busy-polled for its next request, how many of
        those polls found it (the rest ended in a sleep in the kernel), and how many
        found the core contended (after :data:`CONTENDED_POLLS` such polls in a row,
        that connection does not poll for :data:`CONTENDED_PAUSE` seconds). Diagnostic
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
        ssl_context: ssl.SSLContext | None = None,
        shared_memory: bool = False,
        max_pending: int = MAX_PENDING,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        worker: str = "",
    ) -> None:
        budget = check_busy_poll(busy_poll)
        # polling needs non-blocking peeks and sched_yield (POSIX); elsewhere it is off
        self._busy_poll = budget if hasattr(socket, "MSG_DONTWAIT") and hasattr(os, "sched_yield") else 0.0
        self._token = token
        self._handler = handler
        self._shared_memory = bool(shared_memory) and window.supported()
        self._name = name
        self._worker = worker or name
        self._ssl = ssl_context
        self.tls = ssl_context is not None
        self._max_pending = max(int(max_pending), 1)
        self._handshake_timeout = float(handshake_timeout)
        self._log = RateLimitedLog(logger, LOG_INTERVAL)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._pending: list[_Pending] = []  # oldest first
        self.refused = 0
        self.accept_errors = 0
        self.polls = 0
        self.poll_hits = 0
        self.polls_contended = 0
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.socket(family, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, 0))
        self._sock.listen(128)
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._listeners = [self._sock]
        self._unix_dir: str | None = None
        self.unix_path: str | None = None
        if unix_dir is not None and hasattr(socket, "AF_UNIX"):
            self._listen_unix(unix_dir or None)
        for sock in self._listeners:
            sock.settimeout(_SWEEP_INTERVAL)  # the accept loop wakes up to enforce deadlines
            threading.Thread(target=self._accept_loop, args=(sock,), name=f"{name}-accept", daemon=True).start()

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
            sock.listen(128)
        except OSError as e:
            logger.debug("no Unix socket for %s: %s", self._name, e)
            sock.close()
            shutil.rmtree(directory, ignore_errors=True)
            return
        self._unix_dir, self.unix_path = directory, path
        self._listeners.append(sock)

    # ------------------------------------------------------------------ accepting
    def _accept_loop(self, listener: socket.socket) -> None:
        delay = 0.0
        while not self._closed.is_set():
            self._sweep()
            try:
                conn, peer = listener.accept()
            except TimeoutError:
                continue
            except Exception as e:  # EMFILE, ENFILE, ENOBUFS, ECONNABORTED, ...: back off, go on
                if self._closed.is_set() or listener.fileno() < 0:
                    return
                self.accept_errors += 1
                delay = min(max(2 * delay, _BACKOFF_MIN), _BACKOFF_MAX)
                self._log(
                    "accept",
                    logging.WARNING,
                    "daskvec channel %s cannot accept connections (%s: %s); retrying",
                    self._name,
                    type(e).__name__,
                    e,
                )
                self._closed.wait(delay)
                continue
            delay = 0.0
            try:
                self._admit(conn, peer or "unix")
            except Exception as e:  # e.g. no thread can be started: drop this one, keep accepting
                conn.close()
                self._log("admit", logging.WARNING, "daskvec channel %s dropped a connection: %s", self._name, e)

    def _admit(self, conn: socket.socket, peer: Any) -> None:
        """Give ``conn`` a handshake slot (pushing another out if none is free) and a thread."""
        host = peer[0] if isinstance(peer, tuple) else str(peer)
        entry = _Pending(conn, host, time.monotonic() + self._handshake_timeout)
        with self._lock:
            evicted = self._evict() if len(self._pending) >= self._max_pending else None
            self._pending.append(entry)
        if evicted is not None:
            self._log(
                "full",
                logging.WARNING,
                "daskvec channel %s has %d connections waiting for their handshake; pushed out the oldest from %s",
                self._name,
                self._max_pending,
                evicted.host,
            )
            evicted.cut()  # counted as refused by its own thread, when its read fails
        try:
            threading.Thread(target=self._serve, args=(entry, peer), name=f"{self._name}-conn", daemon=True).start()
        except BaseException:
            self._forget(entry)
            raise

    def _evict(self) -> _Pending:
        """Take out of the slots the oldest connection of the address holding the most (under the lock).

        Refusing the newest instead would let any flood faster than the slots turn over
        keep every right client out; pushing out the oldest at any age bounds a right
        handshake's risk to a flood of ``max_pending`` connections within its few
        milliseconds. Choosing among the busiest address's connections keeps a flood
        from one address off the others' slots altogether.
        """
        counts = collections.Counter(p.host for p in self._pending)
        most = max(counts.values())
        victim = next(p for p in self._pending if counts[p.host] == most)  # oldest first
        self._pending.remove(victim)
        victim.evicted = True
        return victim

    def _sweep(self) -> None:
        """Cut the connections whose handshake deadline has passed."""
        now = time.monotonic()
        with self._lock:
            late = [p for p in self._pending if p.deadline <= now]
        for p in late:
            p.cut()

    def _forget(self, entry: _Pending) -> None:
        with self._lock, contextlib.suppress(ValueError):
            self._pending.remove(entry)

    # ------------------------------------------------------------------ handshake
    def _handshake(self, entry: _Pending) -> socket.socket | None:
        """TLS (on TCP, when configured) then the token; the socket to serve, or None if refused.

        Every read and write is bounded by what is left of the deadline; the accept
        loop cuts the connection when the deadline passes during a read.
        """
        conn = entry.sock
        conn.settimeout(max(entry.deadline - time.monotonic(), 0.001))
        if self._ssl is not None and conn.family != getattr(socket, "AF_UNIX", None):
            conn = self._ssl.wrap_socket(conn, server_side=True, do_handshake_on_connect=False)
            entry.sock = conn  # the wrapped socket took over the descriptor
            conn.do_handshake()
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        conn.sendall(server_nonce)
        conn.settimeout(max(entry.deadline - time.monotonic(), 0.001))
        answer = recv_exact(conn, DIGEST_BYTES + NONCE_BYTES)
        proof, client_nonce = bytes(answer[:DIGEST_BYTES]), bytes(answer[DIGEST_BYTES:])
        if not hmac.compare_digest(proof, digest(self._token, b"client", server_nonce)):
            return None
        conn.sendall(digest(self._token, b"server", client_nonce))
        conn.settimeout(None)
        return conn

    def _refuse(self, peer: Any, why: str) -> None:
        self.refused += 1
        self._log("refused", logging.WARNING, "daskvec channel %s refused a peer %s: %s", self._name, peer, why)

    # ------------------------------------------------------------------ serving
    def _serve(self, entry: _Pending, peer: Any) -> None:
        conn = entry.sock
        try:
            try:
                served = self._handshake(entry)
            except ssl.SSLError as e:
                self._refuse(peer, f"TLS handshake failed ({e.reason or e})")
                return
            except (OSError, ChannelError) as e:
                if entry.evicted:
                    why = "pushed out by newer connections (every handshake slot taken)"
                elif time.monotonic() >= entry.deadline:
                    why = "no handshake in time"
                else:
                    why = f"handshake broke off ({e})"
                self._refuse(peer, why)
                return
            finally:
                self._forget(entry)
                conn = entry.sock
            if served is None:
                self._refuse(peer, "wrong token")
                return
            with self._lock:
                self._conns.add(conn)
            if conn.family != getattr(socket, "AF_UNIX", None):
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._serve_requests(conn, peer)
        except Exception as e:  # never a dead thread with a traceback: one line, the connection ends
            why = "".join(traceback.format_exception_only(type(e), e)).strip()
            self._log(
                "failed", logging.ERROR, "daskvec channel %s dropped a connection from %s: %s", self._name, peer, why
            )
        finally:
            _QUICK_CONNECTIONS.discard(id(conn))
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    def _serve_requests(self, conn: socket.socket, peer: Any) -> None:
        shared = window.WindowWriter(self._log) if self._shared_memory and conn.family == socket.AF_UNIX else None
        try:
            self._serve_loop(conn, peer, shared)
        finally:
            if shared is not None:
                shared.close()

    def _serve_loop(self, conn: socket.socket, peer: Any, shared: window.WindowWriter | None) -> None:
        # no polling before the first request that came within the budget of a reply
        budget, misses, replied = self._busy_poll, _POLL_MISSES, -float("inf")
        me = id(conn)
        only_me = {me}
        contended, calm_from = 0, 0.0  # polls in a row on a contended core; no polls before calm_from
        reader = FrameReader(conn)  # the connection is blocking: each read waits by itself
        while not self._closed.is_set():
            # polls: quick client, no other quick connection here, not paused for contention
            if (
                misses < _POLL_MISSES
                and _QUICK_CONNECTIONS.issubset(only_me)
                and (not calm_from or time.perf_counter() >= calm_from)
            ):
                calm_from = 0.0
                self.polls += 1
                found, busy_core = _poll_readable(conn, budget)
                self.poll_hits += found
                if not busy_core:
                    contended = 0
                else:
                    self.polls_contended += 1
                    contended += 1
                    if contended == CONTENDED_POLLS:
                        contended, calm_from = 0, time.perf_counter() + CONTENDED_PAUSE
            try:
                request = decode(reader.read(None))
            except ProtocolError as e:
                # a peer that passed the handshake holds the token, but may still be buggy or
                # hostile: its reconnect loop must not flood the worker's log either
                self._log(
                    "malformed",
                    logging.WARNING,
                    "daskvec channel %s dropped a connection from %s: %s",
                    self._name,
                    peer,
                    e,
                )
                return
            except (OSError, ChannelError):  # the peer left
                return
            if budget:
                quick = time.perf_counter() - replied <= budget
                misses = 0 if quick else misses + 1
                (_QUICK_CONNECTIONS.add if quick else _QUICK_CONNECTIONS.discard)(me)
            try:
                reply = self._handler(request)
            except ChannelError as e:  # a handler that is gone
                self._log("gone", logging.WARNING, "daskvec channel %s dropped a connection: %s", self._name, e)
                return
            frames = self._encode(reply, shared)
            fd = None if shared is None else shared.take_fd()
            try:
                send_frames(conn, frames, () if fd is None else (fd,))
            except OSError:
                return
            finally:
                if fd is not None:  # the client has its own copy of it now (or never will)
                    os.close(fd)
            replied = time.perf_counter()

    def _encode(self, reply: Any, shared: window.WindowWriter | None) -> list[bytes | memoryview]:
        """``encode(reply)``, or a :class:`RemoteError` saying why it cannot be sent."""
        try:
            return encode(reply, shared)
        except Exception as e:
            return encode(unsendable(reply, e, self._worker))

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
            pending = list(self._pending)
        for c in conns:
            with contextlib.suppress(OSError):
                socket.socket.shutdown(c, socket.SHUT_RDWR)
        for p in pending:
            p.cut()
