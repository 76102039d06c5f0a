"""The transport on its own: message encoding, Unix and TCP sockets, and the busy poll.

These run a real :class:`ChannelServer` on threads of the test process and talk to it
through :class:`DirectChannel`, so CPU time spent polling shows in the CPU clocks of
the server's connection threads. Bounds are on CPU seconds with wide margins, not on
wall-clock speed.
"""

from __future__ import annotations

import functools
import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest

from daskvec.protocol import Command, RemoteError, StepReply
from daskvec.transport import (
    ChannelError,
    ChannelServer,
    DirectChannel,
    decode,
    encode,
    machine_id,
    pack,
    unpack,
)
from daskvec.worker import EnvGroup

TOKEN = secrets.token_bytes(32)


def echo(request: object) -> object:
    return ("ok", request)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ChannelServer]:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, name="test", busy_poll=getattr(request, "param", 0.0))
    yield srv
    srv.close()


def same(a: object, b: object) -> bool:
    """Equal values of equal types, arrays by dtype, shape and content, dicts in key order."""
    if type(a) is not type(b):
        return False
    if isinstance(a, StepReply):
        assert isinstance(b, StepReply)
        return all(same(getattr(a, f), getattr(b, f)) for f in StepReply.__slots__)
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
    ("step", (np.array([1, 0, 1], dtype=np.int64),)),
    ("step", (np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),)),
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
    ("step", ([1, 0, 1],)),  # actions not in an array
    ("step", (np.array([{}, {}], dtype=object),)),
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


@pytest.mark.parametrize("message", COMPACT)
def test_step_messages_travel_as_raw_arrays(message: object) -> None:
    frames = encode(message)
    assert memoryview(frames[1])[0] in (0x01, 0x02)  # a compact tag, not a pickle
    got = decode(wire(frames))
    assert same(got, message)
    via_actor = unpack(pack(message))  # immutable bytes: arrays must still be writable
    assert same(via_actor, message)
    values = (got[1][0], via_actor[1][0]) if isinstance(message, tuple) else (got.obs, via_actor.obs)
    for value in values:
        assert isinstance(value, np.ndarray) and value.flags.writeable


@pytest.mark.parametrize("message", PICKLED)
def test_other_messages_stay_pickles(message: object) -> None:
    frames = encode(message)
    assert memoryview(frames[1])[0] == 0x80
    assert same(decode(wire(frames)), message)


def test_malformed_compact_messages_fail_clearly() -> None:
    frames = wire(encode(COMPACT[2]))
    with pytest.raises(ChannelError, match="malformed"):
        decode([frames[0][:20]])
    with pytest.raises(ChannelError, match=r"malformed message \(payload starts with byte 7\)"):
        decode([bytearray(b"\x07rest")])
    with pytest.raises(ChannelError, match="malformed"):
        decode([bytearray()])


@pytest.mark.parametrize("family", ["tcp", "unix"])
def test_both_sockets_carry_arrays(server: ChannelServer, family: str) -> None:
    assert server.unix_path is not None
    assert stat.S_IMODE(os.stat(os.path.dirname(server.unix_path)).st_mode) == 0o700
    ch = DirectChannel(server.unix_path if family == "unix" else server.address, TOKEN)
    assert ch.family == family
    big = np.arange(100_000, dtype=np.float32).reshape(100, 1000)  # travels out of band
    ch.send(("step", (big, [1, 2])))
    status, (cmd, (got, extra)) = ch.recv(10)
    assert status == "ok" and cmd == "step" and extra == [1, 2]
    np.testing.assert_array_equal(got, big)
    ch.close()


def test_wrong_token_and_missing_socket_fail_clearly(server: ChannelServer) -> None:
    assert server.unix_path is not None
    with pytest.raises(ChannelError, match=r"failed authentication|handshake"):
        DirectChannel(server.unix_path, secrets.token_bytes(32), connect_timeout=5)
    path = server.unix_path
    server.close()
    assert not os.path.exists(os.path.dirname(path))  # the private directory goes with the server
    with pytest.raises(ChannelError, match=r"cannot connect to .*channel"):
        DirectChannel(path, TOKEN, connect_timeout=5)


def test_no_unix_socket_when_not_wanted() -> None:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, unix_dir=None)
    try:
        assert srv.unix_path is None
    finally:
        srv.close()
    assert machine_id() == machine_id() and "/" in machine_id()


def test_bad_busy_poll() -> None:
    with pytest.raises(ValueError, match="busy_poll"):
        ChannelServer("127.0.0.1", TOKEN, echo, busy_poll=-1)


def _server_cpu() -> float:
    """CPU seconds used so far by the test server's connection threads (and only them:
    the test process may also hold a Dask cluster with busy threads of its own)."""
    threads = [t for t in threading.enumerate() if t.name == "test-conn" and t.ident is not None]
    return sum(time.clock_gettime(time.pthread_getcpuclockid(t.ident)) for t in threads)  # type: ignore[arg-type]


def _rounds(channels: list[DirectChannel], n: int, gap: float) -> float:
    """Step ``channels`` ``n`` times, pausing ``gap`` s between replies and the next
    requests; return the CPU seconds the server's connection threads used meanwhile."""
    cpu = _server_cpu()
    for _ in range(n):
        for ch in channels:
            ch.send(("step", (1,)))
        for ch in channels:
            ch.recv(10)
        time.sleep(gap)
    return _server_cpu() - cpu


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [0.05], indirect=True)
def test_busy_poll_only_while_the_client_is_quick(server: ChannelServer) -> None:
    assert server.unix_path is not None
    ch = DirectChannel(server.unix_path, TOKEN)
    _rounds([ch], 2, 0.0)
    # the client answers within the budget: the server polls through each pause
    quick = _rounds([ch], 20, 0.03)
    assert quick > 0.25 * 20 * 0.03, f"only {quick:.3f} CPU s: the server did not poll"
    # a slow client (gaps past the budget): polling stops after a few misses
    _rounds([ch], 10, 0.2)
    slow = _rounds([ch], 10, 0.2)
    assert slow < 0.1, f"{slow:.3f} CPU s over 10 slow rounds: the server kept polling"
    # quick again: polling resumes
    again = _rounds([ch], 20, 0.03)
    assert again > 0.25 * 20 * 0.03, f"only {again:.3f} CPU s: polling did not resume"
    ch.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [0.0], indirect=True)
def test_no_busy_poll_when_off(server: ChannelServer) -> None:
    ch = DirectChannel(server.address, TOKEN)
    _rounds([ch], 2, 0.0)
    assert _rounds([ch], 20, 0.03) < 0.1
    ch.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [0.05], indirect=True)
def test_two_quick_connections_do_not_poll(server: ChannelServer) -> None:
    # two groups stepping in one process would fight each other for the GIL while polling
    assert server.unix_path is not None
    chs = [DirectChannel(server.unix_path, TOKEN), DirectChannel(server.address, TOKEN)]
    _rounds(chs, 3, 0.0)
    assert _rounds(chs, 20, 0.03) < 0.15
    for ch in chs:
        ch.close()


class InfoEnv(gym.Env[np.ndarray, int]):
    """Episodes of two steps; what its step and reset infos hold is up to the test."""

    def __init__(self, info: dict[str, Any], reset_info: dict[str, Any], fail: bool = False) -> None:
        self.observation_space = gym.spaces.Box(-10, 10, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.info, self.reset_info, self.fail, self.t = info, reset_info, fail, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, dtype=np.float32), dict(self.reset_info)

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.fail:
            raise RuntimeError("step failed")
        self.t += 1
        return np.full(2, self.t, dtype=np.float32), 1.0, self.t == 2, False, dict(self.info)


@pytest.mark.parametrize(
    ("info", "reset_info", "fail", "compact"),
    [
        ({}, {}, False, True),
        ({"episode": 1}, {}, False, False),  # a key of the env's own
        ({}, {"seeded": 1}, False, False),  # a reset info to pass on
        ({}, {}, True, False),  # a restarted env: the reply carries daskvec's marker
    ],
)
def test_group_replies_are_compact_when_the_flags_say_all(
    info: dict[str, Any], reset_info: dict[str, Any], fail: bool, compact: bool
) -> None:
    factories = cloudpickle.dumps([functools.partial(InfoEnv, info, reset_info, fail) for _ in range(3)])
    group = EnvGroup(factories, [0, 1, 2], token=None, on_env_error="restart", worker_address="test")
    try:
        group.dispatch((Command.RESET, ([0, 1, 2], [{}, {}, {}])))
        for step in (1, 2):  # the second step ends every episode
            reply = group.dispatch((Command.STEP, (np.array([0, 1, 0]),)))
            assert isinstance(reply, StepReply)
            if not fail:
                ended = step == 2
                assert reply.terminated.tolist() == [ended] * 3
                assert sorted(reply.final_obs) == ([0, 1, 2] if ended else [])
            # a reply without finished episodes carries no reset infos, so it fits
            frames = encode(reply)
            assert memoryview(frames[1])[0] == (0x02 if compact or (step == 1 and not info and not fail) else 0x80)
            assert same(decode(wire(frames)), reply)
    finally:
        group.shutdown()
