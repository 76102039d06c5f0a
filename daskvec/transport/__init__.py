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
    whenever their content allows (see :func:`encode`). The client's socket stays
    non-blocking and waits with ``poll``: a reply that fits the buffer sized from the
    previous one costs one ``poll`` and one ``recv``. A connection is
    served only after a mutual HMAC-SHA256 challenge over a fresh random token that
    the client handed the actor through Dask: a stranger is dropped before a single
    byte it sent is unpickled.

:class:`ActorChannel`
    The fallback, when the worker's host cannot be reached from the client (a client
    outside the cluster network) or the cluster uses TLS. The same encoded request
    travels as one bytes argument of an ordinary Dask actor call, so it is protected
    by whatever Dask's own comms use.

Both channels carry the same messages (:mod:`daskvec.protocol.messages`), encoded by
:func:`encode` and decoded by :func:`decode`: a request is a
:class:`~daskvec.protocol.messages.StepRequest` or ``(Command, args)``, a reply the request's
value or a :class:`~daskvec.protocol.messages.RemoteError`. The worker side
(:mod:`daskvec.worker`) produces replies; the client side (:mod:`daskvec._core.pool`) sends
requests and waits for replies with :func:`iter_replies`, one wait for all groups per step.
"""

from __future__ import annotations

from daskvec.protocol.messages import StepReply
from daskvec.transport.channels import ActorChannel, Channel, DirectChannel, iter_replies, recv_many, wait_ready
from daskvec.transport.codec import OUT_OF_BAND_MIN_BYTES, decode, encode, pack, pack_reply, unpack
from daskvec.transport.server import ChannelServer, check_busy_poll
from daskvec.transport.wire import ChannelError, ProtocolError, machine_id

__all__ = [
    "OUT_OF_BAND_MIN_BYTES",
    "ActorChannel",
    "Channel",
    "ChannelError",
    "ChannelServer",
    "DirectChannel",
    "ProtocolError",
    "StepReply",
    "check_busy_poll",
    "decode",
    "encode",
    "iter_replies",
    "machine_id",
    "pack",
    "pack_reply",
    "recv_many",
    "unpack",
    "wait_ready",
]
