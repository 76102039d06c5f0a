"""Client side of the transport: one channel per env group, and waiting for many replies."""

from __future__ import annotations

import contextlib
import hmac
import logging
import secrets
import select
import socket
import ssl
import time
from collections.abc import Generator, Sequence
from typing import Any, Protocol

from daskvec.protocol.messages import RemoteError
from daskvec.transport.codec import decode, encode, pack, unpack
from daskvec.transport.window import WindowReader
from daskvec.transport.window import supported as window_supported
from daskvec.transport.wire import (
    DIGEST_BYTES,
    NONCE_BYTES,
    ChannelError,
    FrameReader,
    PickleLoadError,
    ProtocolError,
    digest,
    recv_exact,
    write_frames,
)

logger = logging.getLogger(__name__)

__all__ = ["ActorChannel", "Channel", "DirectChannel", "iter_replies", "recv_many", "wait_ready"]

#: Seconds every channel still gets once the overall deadline of a wait has passed.
_GRACE = 0.1


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
    ssl_context : ssl.SSLContext or None, optional
        A client-side TLS context (the cluster's ``get_connection_args("client")``):
        the TCP connection is TLS, with this context's certificate for mutual TLS,
        before the token handshake. Not for a Unix socket.
    send_timeout : float or None, optional
        Seconds a request may wait for room in the socket (a group that stopped
        reading); ``None``: no limit.

    Notes
    -----
    After the handshake the socket stays non-blocking for good: every wait is a
    ``poll`` with its own deadline, so no call switches the socket's mode (each switch
    is a system call). A step costs one ``sendmsg``, one ``poll`` and usually one
    ``recv`` (see :class:`~daskvec.transport.wire.FrameReader`).

    Over a Unix socket (Linux) the group may hand its observations over in a shared
    memory window (:mod:`daskvec.transport.window`): a reply's ``obs`` is then a
    read-only view of it, valid until the next :meth:`send`.

    Attributes
    ----------
    family : {"tcp", "tls", "unix"}
        Which kind of socket this channel uses.

    Raises
    ------
    ChannelError
        When the address cannot be reached, the TLS handshake fails or the peer
        fails the token handshake.
    """

    kind = "direct"

    def __init__(
        self,
        address: tuple[str, int] | str,
        token: bytes,
        connect_timeout: float = 5.0,
        ssl_context: ssl.SSLContext | None = None,
        send_timeout: float | None = None,
    ) -> None:
        self.address = address
        self.send_timeout = send_timeout
        if isinstance(address, str) and ssl_context is not None:
            raise ValueError("a TLS channel needs a TCP address, not a Unix socket path")
        self.family = "unix" if isinstance(address, str) else "tcp" if ssl_context is None else "tls"
        where = self._where = address if isinstance(address, str) else f"{address[0]}:{address[1]}"
        sock = self._open(address, connect_timeout, ssl_context)
        try:
            server_nonce = bytes(recv_exact(sock, NONCE_BYTES))
            client_nonce = secrets.token_bytes(NONCE_BYTES)
            sock.sendall(digest(token, b"client", server_nonce) + client_nonce)
            proof = bytes(recv_exact(sock, DIGEST_BYTES))
        except OSError as e:
            sock.close()
            raise ChannelError(f"handshake with {where} failed: {e}") from e
        if not hmac.compare_digest(proof, digest(token, b"server", client_nonce)):
            sock.close()
            raise ChannelError(f"peer at {where} failed authentication")
        if self.family != "unix":
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self._sock: socket.socket | None = sock
        # on this machine the group may share a window for its observations (transport/window.py)
        self._window = WindowReader() if self.family == "unix" and window_supported() else None
        self._reader = FrameReader(sock, fds=self._window is not None)

    def _open(
        self, address: tuple[str, int] | str, timeout: float, ssl_context: ssl.SSLContext | None
    ) -> socket.socket:
        """Connect, and complete the TLS handshake when there is a context."""
        try:
            if isinstance(address, str):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    sock.settimeout(timeout)
                    sock.connect(address)
                except BaseException:
                    sock.close()
                    raise
                return sock
            sock = socket.create_connection(address, timeout=timeout)
        except OSError as e:
            raise ChannelError(f"cannot connect to {self._where}: {e}") from e
        if ssl_context is None:
            return sock
        try:
            hostname = address[0] if ssl_context.check_hostname else None
            return ssl_context.wrap_socket(sock, server_hostname=hostname)
        except (OSError, ssl.CertificateError) as e:
            sock.close()
            raise ChannelError(f"TLS handshake with {self._where} failed: {e}") from e

    def send(self, request: Any) -> None:
        """See :class:`Channel`."""
        if self._sock is None:
            raise ChannelError("channel is closed")
        frames = encode(request)
        try:
            write_frames(self._sock, frames, self.send_timeout)
        except TimeoutError as e:  # part of the request may be out: the stream is out of step
            raise ChannelError(f"send to {self._where} failed: the group took no request bytes ({e})") from e
        except OSError as e:
            raise ChannelError(f"send to {self._where} failed: {e}") from e

    def recv(self, timeout: float | None) -> Any:
        """See :class:`Channel`."""
        if self._sock is None:
            raise ChannelError("channel is closed")
        try:
            frames = self._reader.read(timeout)
        except TimeoutError as e:
            raise TimeoutError(f"no reply from {self._where} within {timeout or 0:.1f}s") from e
        except OSError as e:
            cls = ProtocolError if isinstance(e, ProtocolError) else ChannelError
            raise cls(f"receive from {self._where} failed: {e}") from e
        if self._reader.has_fds:  # a new window, made for this reply's observations
            assert self._window is not None  # only a reader made for a window takes descriptors
            try:
                self._window.adopt(self._reader.fds)  # emptied as it closes them
            except (OSError, ValueError) as e:
                raise ProtocolError(f"receive from {self._where} failed: its shared window: {e}") from e
        return _decode_reply(frames, self._where, self._window)

    @property
    def shared_memory(self) -> bool:
        """Whether the group hands its observations over in a shared window (see :mod:`daskvec.transport.window`)."""
        return self._window is not None and self._window.mapped

    def fileno(self) -> int:
        """The socket's descriptor, to wait on several channels at once (-1 once closed)."""
        return -1 if self._sock is None else self._sock.fileno()

    def close(self) -> None:
        """See :class:`Channel`."""
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
            self._sock = None
            self._reader.close()
            if self._window is not None:
                self._window.close()


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
        try:
            return unpack(data)
        except PickleLoadError as e:
            return _unloadable(e, "the actor")

    def done(self) -> bool:
        """Whether the reply (or the call's failure) is in, so that :meth:`recv` will not wait."""
        return self._pending is None or bool(self._pending.done())

    def close(self) -> None:
        """See :class:`Channel`."""
        self._pending = None


def _decode_reply(frames: Sequence[Any], where: str, window: WindowReader | None = None) -> Any:
    """A reply decoded, or a :class:`RemoteError` if its pickle does not load on this side."""
    try:
        return decode(frames, window)
    except PickleLoadError as e:
        return _unloadable(e, where)


def _unloadable(exc: PickleLoadError, where: str) -> RemoteError:
    cause = exc.__cause__ or exc
    return RemoteError(
        type=f"{type(cause).__module__}.{type(cause).__qualname__}",
        message=f"the reply from {where} cannot be unpickled on the client: {cause} (is everything the envs "
        "return, infos included, importable here?)",
        traceback="",
        env_index=None,
        worker=where,
    )


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


#: Seconds between two looks at actor channels, which have no descriptor to wait on.
_ACTOR_POLL = 0.001


def wait_ready(channels: Sequence[Channel], timeout: float) -> list[int]:
    """Wait until at least one channel has its reply in; return the positions of those that do.

    Used for partial batches, where the groups that answer first are taken in
    first. A direct channel is ready when its socket is readable (a reply, or the peer
    gone); an actor channel when its call is done. Returns ``[]`` after ``timeout``
    seconds without any.
    """
    deadline = time.monotonic() + timeout
    fds = {ch.fileno(): k for k, ch in enumerate(channels) if isinstance(ch, DirectChannel) and ch.fileno() >= 0}
    others = [k for k, ch in enumerate(channels) if not isinstance(ch, DirectChannel) or ch.fileno() < 0]
    while True:
        ready = [k for k in others if not isinstance(ch := channels[k], ActorChannel) or ch.done()]
        remaining = deadline - time.monotonic()
        wait = 0.0 if ready else max(min(remaining, _ACTOR_POLL if others else remaining), 0.0)
        if fds:
            ready += [fds[fd] for fd in select.select(list(fds), [], [], wait)[0]]
        elif wait > 0:
            time.sleep(wait)
        if ready or remaining <= 0:
            return sorted(ready)
