"""Worker side of the direct channel: :class:`ChannelServer` and its busy polling."""

from __future__ import annotations

import contextlib
import hmac
import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from daskvec.transport.codec import decode, encode
from daskvec.transport.wire import (
    DIGEST_BYTES,
    HANDSHAKE_TIMEOUT,
    NONCE_BYTES,
    ChannelError,
    digest,
    recv_exact,
    recv_frames,
    send_frames,
)

logger = logging.getLogger(__name__)

__all__ = ["ChannelServer", "check_busy_poll"]

#: Connections (by id) whose client sent its last request within the poll budget
#: of the previous reply: the ones stepping fast. A connection busy-polls only while
#: no other connection in its process is hot, so polls never fight a stepping
#: thread of the same process for the GIL.
_HOT: set[int] = set()
#: After this many requests in a row that arrived later than the budget (a client
#: busy with something else, e.g. a training update), a connection stops polling until
#: a request comes quickly again.
_POLL_MISSES = 8


def check_busy_poll(value: Any, name: str = "busy_poll") -> float:
    """``value`` as a busy-poll budget in seconds, or ``ValueError`` naming ``name`` if it is not one (0 to 0.1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 0.1:
        raise ValueError(f"{name} must be a number of seconds between 0 and 0.1, not {value!r}")
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
        conn.settimeout(HANDSHAKE_TIMEOUT)
        server_nonce = secrets.token_bytes(NONCE_BYTES)
        conn.sendall(server_nonce)
        answer = recv_exact(conn, DIGEST_BYTES + NONCE_BYTES)
        proof, client_nonce = bytes(answer[:DIGEST_BYTES]), bytes(answer[DIGEST_BYTES:])
        if not hmac.compare_digest(proof, digest(self._token, b"client", server_nonce)):
            return False
        conn.sendall(digest(self._token, b"server", client_nonce))
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
                    frames = recv_frames(conn)
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
                    send_frames(conn, encode(reply))
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
