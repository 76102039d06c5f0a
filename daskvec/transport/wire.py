"""Bytes on a socket: frames, the mutual handshake, and what breaks a channel.

A message is a header (the number of frames and their lengths) followed by the frames;
it is written with one ``sendmsg``. Before any message, both ends prove that they know
the token the client handed the actor through Dask (HMAC-SHA256 over a fresh nonce
from each side).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import socket
import struct

logger = logging.getLogger(__name__)

__all__ = [
    "COUNT",
    "DIGEST_BYTES",
    "HANDSHAKE_TIMEOUT",
    "NONCE_BYTES",
    "ChannelError",
    "digest",
    "machine_id",
    "recv_exact",
    "recv_frames",
    "send_frames",
]

COUNT = struct.Struct("!I")
NONCE_BYTES = 32
DIGEST_BYTES = 32
HANDSHAKE_TIMEOUT = 10.0
MAX_FRAMES = 1 << 16
MAX_FRAME_BYTES = 1 << 34


class ChannelError(ConnectionError):
    """The channel to an env-group actor broke: its worker died, hung or is unreachable."""


# --------------------------------------------------------------------------- sockets
def send_frames(sock: socket.socket, frames: list[bytes | memoryview]) -> None:
    views = [memoryview(f).cast("B") for f in frames]
    while views:
        sent = sock.sendmsg(views)
        while views and sent >= views[0].nbytes:
            sent -= views[0].nbytes
            views.pop(0)
        if views and sent:
            views[0] = views[0][sent:]


def recv_exact(sock: socket.socket, n: int) -> bytearray:
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


def recv_frames(sock: socket.socket) -> list[bytearray]:
    # Every message has at least one frame: read the count and the first length at once.
    count, first = _FIRST.unpack(recv_exact(sock, _FIRST.size))
    if not 0 < count <= MAX_FRAMES:
        raise ChannelError(f"malformed message header ({count} frames)")
    lengths = (first, *struct.unpack(f"!{count - 1}Q", recv_exact(sock, 8 * (count - 1)))) if count > 1 else (first,)
    if any(n > MAX_FRAME_BYTES for n in lengths):
        raise ChannelError("malformed message header (frame too large)")
    return [recv_exact(sock, n) for n in lengths]


def digest(token: bytes, role: bytes, nonce: bytes) -> bytes:
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
