"""Wire-level helpers shared by the transport tests: frames as a peer sees them, sample messages, socket reads."""

from __future__ import annotations

import os
import socket
import stat
from typing import Any

import numpy as np

from daskvec.protocol.messages import EMPTY, Command, RemoteError, StepReply, StepRequest


def same(a: object, b: object) -> bool:
    """Equal values of equal types, arrays by dtype, shape and content, dicts in key order.

    A decoded reply's empty columns may be the shared read-only :data:`EMPTY`: equal to any empty dict.
    """
    if a is EMPTY or b is EMPTY:
        return isinstance(a, dict) and isinstance(b, dict) and not a and not b
    if type(a) is not type(b):
        return False
    if isinstance(a, StepReply):
        assert isinstance(b, StepReply)
        return all(same(getattr(a, f), getattr(b, f)) for f in StepReply.__slots__)
    if isinstance(a, StepRequest):
        assert isinstance(b, StepRequest)
        return same(a.actions, b.actions)
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray)
        return a.dtype == b.dtype and a.shape == b.shape and bool(np.array_equal(a, b))
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple))
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def step_reply(obs: np.ndarray, /, **changes: object) -> StepReply:
    """A step reply as :meth:`daskvec.worker.EnvGroup.step` builds it: env 1 finished an episode."""
    n = len(obs)
    fields: dict[str, object] = {
        "obs": obs,
        "rewards": np.arange(n, dtype=np.float64) / 2,
        "terminated": np.arange(n) == 1,
        "truncated": np.zeros(n, dtype=bool),
        "final_obs": {1: obs[1] + 1},
        "infos": {},
        "reset_infos": {1: {}},
        "restarted": {},
        "env_seconds": 0.004,
    }
    fields.update(changes)
    return StepReply(**fields)  # type: ignore[arg-type]


def wire(frames: list[bytes | memoryview]) -> list[bytearray]:
    """What the receiving side of a socket gets for ``encode``'s frames (without the header)."""
    return [bytearray(memoryview(f).cast("B")) for f in frames[1:]]


COMPACT = [
    StepRequest(np.array([1, 0, 1], dtype=np.int64)),
    StepRequest(np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)),
    step_reply(np.arange(12, dtype=np.float32).reshape(3, 4)),
    step_reply(np.zeros((4, 32, 32, 3), dtype=np.uint8) + 7),  # large: observations out of band
    step_reply(np.ones((2, 3)), terminated=np.zeros(2, dtype=bool), final_obs={}, reset_infos={}),
    step_reply(  # truncated (time limit) and terminated in the same step
        np.ones((3, 2)),
        terminated=np.array([True, False, False]),
        truncated=np.array([False, True, True]),
        final_obs={0: np.zeros(2), 1: np.full(2, 5.0), 2: np.full(2, 6.0)},
        reset_infos={0: {}, 1: {}, 2: {}},
    ),
]


PICKLED = [
    StepRequest([1, 0, 1]),  # actions not in an array
    StepRequest(np.array([{}, {}], dtype=object)),
    ("step", (np.array([1, 0, 1], dtype=np.int64),)),  # a tuple is never taken for a step request
    (Command.RESET, ([None, 1], [None, None])),
    step_reply(np.zeros((3, 2)), infos={0: {"episode": {"r": 1.0}}}),  # keys of the env's own
    step_reply(np.zeros((3, 2)), reset_infos={1: {"level": 2}}),
    step_reply(np.zeros((3, 2)), reset_infos={5: {}}),  # not a position of this group
    # a final observation of another dtype than the observations
    step_reply(np.zeros((3, 2), dtype=np.float32), final_obs={1: np.zeros(2)}),
    step_reply(np.zeros((3, 2)), obs={"a": np.zeros((3, 2))}),
    step_reply(np.zeros((3, 2)), restarted={1: {"reason": "env_error", "restarts": 1}}),
    RemoteError(type="ValueError", message="boom", traceback="", env_index=1, worker="w"),
]


def recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {n} bytes")
        data += chunk
    return data


def read_to_end(sock: socket.socket) -> bytes:
    """Everything the peer sends until it closes (a reset, when it dropped our unread bytes, ends it too)."""
    data = b""
    try:
        while chunk := sock.recv(4096):
            data += chunk
    except ConnectionResetError:
        pass
    return data


def check_channel(group: dict[str, Any]) -> None:
    """That a group's entry (``env.groups``) names its channel truly: it listens where it says.

    Connects to each address and socket path the entry names (then leaves without a
    handshake, which the group refuses, as it refuses any stranger).
    """
    if group["transport"] == "actor":
        assert group["channel"] is None, group
        assert group["encrypted"] == group["worker"].startswith("tls://"), group
        return
    family = group["transport"].split("/")[-1] if "/" in group["transport"] else group["socket"]
    assert group["encrypted"] == (family == "tls"), group
    assert group["channel"] == (group["socket_path"] if family == "unix" else group["address"]), group
    if group["socket_path"] is not None:
        assert stat.S_ISSOCK(os.stat(group["socket_path"]).st_mode), group
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(30)
            s.connect(group["socket_path"])
            assert len(recv_exact(s, 32)) == 32  # the server's nonce: a channel server answers there
    if group["address"] is not None:
        host, _, port = group["address"].rpartition(":")
        with socket.create_connection((host.strip("[]"), int(port)), timeout=30) as s:
            if not group["encrypted"]:  # TLS speaks first from the client's side
                assert len(recv_exact(s, 32)) == 32
