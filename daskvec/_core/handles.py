"""The client's records of its env groups: the handle of each, and what is in flight to them.

:class:`Group` is the client-side handle of one env-group actor (its envs, worker,
channel and what it said of itself), :class:`PendingRequest` a request sent to one group
whose reply was not handed out yet, and :class:`StepOutcome` what one collection found
(the groups heard from, env errors, lost groups, env-error restarts).
:class:`~daskvec._core.pool.GroupPool` makes and uses them; the engine, buffers and
recovery read them. Plain records: nothing here sends or waits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskvec.protocol.messages import GroupDesc, RemoteError, StepReply
from daskvec.transport import Channel

__all__ = ["WAITING", "Group", "PendingRequest", "StepOutcome", "WorkerFrozen", "answers"]


@dataclass(eq=False)  # identity semantics: groups are compared and looked up as handles
class Group:
    """Client-side handle of one env-group actor.

    Attributes
    ----------
    gid : str
        The actor's Dask key.
    env_indices : list of int
        The vec-env indices of its envs, in order.
    worker : str
        Address of the worker holding it.
    desc : GroupDesc
        What the group said about itself when created (spaces, deadline, pids, ...).
    index : slice or numpy.ndarray
        Its rows in the vec env's buffers.
    """

    gid: str
    env_indices: list[int]
    worker: str
    future: Any
    actor: Any
    channel: Channel
    desc: GroupDesc
    index: Any = field(init=False)

    def __post_init__(self) -> None:
        self.renumber(self.env_indices)

    def renumber(self, env_indices: list[int]) -> None:
        """Give the group its envs' indices (a vector group's are known once it is built)."""
        self.env_indices = idx = list(env_indices)
        if idx == list(range(idx[0], idx[0] + len(idx))):
            self.index = slice(idx[0], idx[0] + len(idx))
        else:
            self.index = np.asarray(idx, dtype=np.intp)

    @property
    def deadline(self) -> float | None:
        """When the group's worker is expected to leave (epoch seconds), if known."""
        return self.desc.deadline

    @property
    def env_pid(self) -> int | None:
        """Id of the process stepping the envs (the env process, or the worker's own)."""
        return self.desc.pid if self.desc.env_pid is None else self.desc.env_pid

    def describe(self) -> dict[str, Any]:
        """The group as plain data (an entry of ``DaskVecEnv.groups``).

        Its env indices, worker, transport, the worker's ``deadline`` (epoch seconds at
        which its lifetime or batch job ends, or ``None``) and ``env_pid``, the id of the
        process stepping the envs on the worker's host (the worker's own with
        ``env_process=False``). ``socket`` says how a direct channel is connected:
        ``"unix"`` when the group runs on the client's machine, ``"tcp"`` otherwise,
        ``"tls"`` on a secured cluster (``None`` for the actor transport). ``busy_poll`` is
        the budget the group's worker applies to its channel. ``shared_memory`` is True
        once the group hands its observations over in a memory window shared with this
        process (same machine, batches of 128 KiB or more; see
        :mod:`daskvec.transport.window`).

        Where the group listens, for an operator checking a firewall or a socket:
        ``channel`` is what this process is connected to (``"host:port"`` over TCP or
        TLS, the socket's path over Unix, ``None`` for the actor transport);
        ``address`` is the group's TCP listener (``"host:port"``) and ``socket_path``
        its Unix socket (``None`` when it has none); ``encrypted`` says whether the
        channel's traffic is encrypted (TLS; for the actor transport, Dask's own
        ``tls://`` comms).
        """
        family = getattr(self.channel, "family", None)
        address = self.desc.address
        return {
            "envs": list(self.env_indices),
            "worker": self.worker,
            "transport": self.channel.kind,
            "socket": getattr(self.channel, "family", None),
            "key": self.gid,
            "deadline": self.deadline,
            "env_pid": self.env_pid,
            "pid": self.desc.pid,
            "busy_poll": self.desc.busy_poll,
            "shared_memory": bool(getattr(self.channel, "shared_memory", False)),
            "channel": _where(getattr(self.channel, "address", None)) if family is not None else None,
            "address": _where(tuple(address)) if address else None,
            "socket_path": self.desc.unix_path or None,
            "encrypted": family == "tls" or (family is None and self.worker.startswith("tls://")),
        }

    @property
    def transport(self) -> str:
        """``"direct/unix"``, ``"direct/tcp"`` or ``"actor"``."""
        family = getattr(self.channel, "family", None)
        return self.channel.kind if family is None else f"{self.channel.kind}/{family}"


def _where(address: tuple[Any, ...] | str | None) -> str | None:
    """``("10.0.0.2", 40123)`` -> ``"10.0.0.2:40123"``; a socket path as it is."""
    if address is None or isinstance(address, str):
        return address
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


@dataclass
class StepOutcome:
    """What one collection found: every group's reply recorded as it was handed out.

    Attributes
    ----------
    groups : list of Group
        Every group whose reply (or loss) was recorded, in that order.
    errors : list of (Group, RemoteError)
        Groups whose envs raised (with ``on_env_error="raise"``).
    lost : dict of Group to exception
        Groups that did not answer: ``ChannelError`` (worker gone) or ``TimeoutError``.
    env_restarts : list of (Group, dict)
        Step replies of groups that rebuilt envs after their errors (``on_env_error="restart"``):
        the group and the reply's ``restarted`` markers, for the restart ledger.
    env_seconds : float
        The longest time a group spent in its envs.
    """

    groups: list[Group] = field(default_factory=list)
    errors: list[tuple[Group, RemoteError]] = field(default_factory=list)
    lost: dict[Group, BaseException] = field(default_factory=dict)
    env_restarts: list[tuple[Group, dict[int, dict[str, Any]]]] = field(default_factory=list)
    env_seconds: float = 0.0

    def record(self, g: Group, reply: Any, kind: type = StepReply) -> bool:
        """Record ``g``'s reply: True for a ``kind`` reply (its env time counted), else an error or a loss."""
        self.groups.append(g)
        if answers(reply, kind):
            self.env_seconds = max(self.env_seconds, getattr(reply, "env_seconds", 0.0))
            if type(reply) is StepReply and reply.restarted:
                self.env_restarts.append((g, reply.restarted))
            return True
        if isinstance(reply, RemoteError):
            self.errors.append((g, reply))
        elif isinstance(reply, BaseException):
            self.lost[g] = reply
        else:
            raise RuntimeError(f"daskvec internal error: unexpected reply {type(reply).__name__}")
        return False


def answers(reply: Any, kind: type) -> bool:
    """Whether ``reply`` is the answer a request expected (``kind``: ``object`` for any value), not an error."""
    return isinstance(reply, kind) and not isinstance(reply, (RemoteError, BaseException))


class WorkerFrozen(TimeoutError):
    """What stands for the reply of a group whose worker left another group's request unanswered.

    Such a group is given up without being asked anything (:meth:`GroupPool.doom
    <daskvec._core.pool.GroupPool.doom>`): its worker is frozen, or stuck in a hung
    step, and waiting for it again would cost another ``step_timeout``. A timeout
    (``reason="timeout"``) like any other, except that it does not doom the groups
    rebuilt since on the same worker.
    """


#: The reply of a group in flight that has not been read yet.
WAITING: Any = object()


@dataclass(eq=False)
class PendingRequest:
    """A request sent to one group whose reply was not handed out yet.

    Attributes
    ----------
    group : Group
        Where it went.
    sent : float
        When (``time.monotonic()``); a partial-batch step times out from then.
    batch : bool
        One of the requests sent to several groups at once and collected as one outcome
        (:meth:`daskvec._core.pool.GroupPool.collect`); otherwise a group stepping on its own
        (:meth:`daskvec._core.pool.GroupPool.collect_ready`).
    reply : object
        The reply, the exception that stands for it, or ``WAITING`` until it is read.
    """

    group: Group
    sent: float
    batch: bool
    reply: Any = WAITING

    @property
    def waiting(self) -> bool:
        """Whether its reply has not been read yet."""
        return self.reply is WAITING
