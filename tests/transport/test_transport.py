"""The transport on its own: message encoding, Unix and TCP sockets, the handshake and the busy poll.

These run a real :class:`ChannelServer` on threads of the test process and talk to it
through :class:`DirectChannel`, or through raw sockets that speak the handshake
themselves. The busy-poll tests check the server's decision to poll (its ``polls`` and
``poll_hits`` counts), not CPU time, so that a loaded machine does not change the result.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import hmac
import os
import secrets
import select
import socket
import stat
import struct
import subprocess
import sys
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from waiting import wait_until
from wire_frames import COMPACT, PICKLED, read_to_end, recv_exact, same, step_reply, wire

from daskvec.protocol.messages import EMPTY, ColumnInfos, Command, GroupSpec, RemoteError, StepReply, StepRequest
from daskvec.protocol.rollout_records import RolloutReply
from daskvec.transport import (
    ChannelError,
    ChannelServer,
    DirectChannel,
    ProtocolError,
    codec,
    decode,
    encode,
    machine_id,
    pack,
    unpack,
)
from daskvec.transport.window import supported as window_supported
from daskvec.transport.wire import FrameReader, write_frames
from daskvec.worker import EnvGroup

TOKEN = secrets.token_bytes(32)


def echo(request: object) -> object:
    return ("ok", request)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ChannelServer]:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, name="test", busy_poll=getattr(request, "param", 0.0))
    yield srv
    srv.close()


@pytest.mark.parametrize("message", COMPACT)
def test_step_messages_travel_as_raw_arrays(message: object) -> None:
    frames = encode(message)
    assert memoryview(frames[1])[0] in (0x01, 0x02)  # a compact tag, not a pickle
    got = decode(wire(frames))
    assert same(got, message)
    via_actor = unpack(pack(message))  # immutable bytes: arrays must still be writable
    assert same(via_actor, message)
    values = (got.actions, via_actor.actions) if isinstance(message, StepRequest) else (got.obs, via_actor.obs)
    for value in values:
        assert isinstance(value, np.ndarray) and value.flags.writeable


@pytest.mark.parametrize("message", PICKLED)
def test_other_messages_stay_pickles(message: object) -> None:
    frames = encode(message)
    assert memoryview(frames[1])[0] == 0x80
    assert same(decode(wire(frames)), message)


@pytest.mark.parametrize(
    "actions",
    [np.array([1, 0, 1], dtype=np.int64), np.zeros((2, 3), dtype=np.float32), [1, 0], np.array([{}, {}], dtype=object)],
    ids=["int64", "float32 rows", "list", "objects"],
)
def test_a_step_request_comes_back_as_a_step_request(actions: Any) -> None:
    """A StepRequest round-trips as itself by either channel: raw bytes when its actions allow, else a pickle."""
    request = StepRequest(actions)
    raw = isinstance(actions, np.ndarray) and not actions.dtype.hasobject
    for _ in range(2):  # the second time, a small raw request's layout is cached
        frames = encode(request)
        assert memoryview(frames[1])[0] == (0x01 if raw else 0x80)
        for got in (decode(wire(frames)), unpack(pack(request))):
            assert type(got) is StepRequest and same(got, request)


def test_only_a_step_request_is_encoded_as_a_step() -> None:
    """The codec looks at the message's type, never inside a tuple: ``("step", (actions,))`` is a pickle
    that decodes to the same tuple, and the raw form decodes to a StepRequest only."""
    actions = np.array([1, 0, 1], dtype=np.int64)
    for message in [("step", (actions,)), (Command.ROLLOUT, (actions,)), [actions]]:
        frames = encode(message)
        assert memoryview(frames[1])[0] == 0x80
        got = decode(wire(frames))
        assert type(got) is type(message) and same(got, message)
    assert type(decode(wire(encode(StepRequest(actions))))) is StepRequest


def test_a_group_steps_on_a_step_request_and_refuses_a_step_tuple() -> None:
    """EnvGroup.dispatch takes the typed request; a step written as a command tuple is no command of its."""
    factories = cloudpickle.dumps([functools.partial(InfoEnv, {}, {}, False) for _ in range(2)])
    group = EnvGroup(factories, GroupSpec((0, 1), token=None), worker_address="test")
    try:
        group.dispatch((Command.RESET, ([0, 1], [{}, {}])))
        assert isinstance(group.dispatch(StepRequest(np.array([0, 1]))), StepReply)
        refused = group.dispatch(("step", (np.array([0, 1]),)))
        assert isinstance(refused, RemoteError) and refused.type == "builtins.KeyError"
        assert isinstance(unpack(group.handle(pack(StepRequest(np.array([1, 0]))))), StepReply)  # the actor's way
    finally:
        group.shutdown()


def test_a_compact_reply_with_0d_arrays_is_a_protocol_error() -> None:
    """Hostile bytes: observations of no env axis are refused as a ProtocolError, not a TypeError."""
    zero_d = struct.pack("<BdI", 2, 0.0, 1) + b"\0" + struct.pack("<d", 1.0) + struct.pack("<BBB", 3, 0, 0) + b"<f4"
    with pytest.raises(ProtocolError, match="malformed compact message"):
        decode([bytearray(zero_d + b"\0" * 4)])


def test_malformed_compact_messages_fail_clearly() -> None:
    frames = wire(encode(COMPACT[2]))
    with pytest.raises(ChannelError, match="malformed"):
        decode([frames[0][:20]])
    with pytest.raises(ChannelError, match=r"malformed message \(payload starts with byte 9\)"):
        decode([bytearray(b"\x09rest")])
    with pytest.raises(ChannelError, match="malformed"):
        decode([bytearray()])


def test_a_huge_env_count_in_a_compact_reply_is_a_protocol_error() -> None:
    """Hostile bytes: a reply that claims 2**32 - 1 envs is refused without allocating for them."""
    head = struct.pack("<BdI", 2, 0.0, 2**32 - 1) + b"\0" * 64
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError, match="malformed compact"):
            decode([bytearray(head)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"a reply claiming 2**32 - 1 envs allocated {peak} bytes"


def quieted(reply: StepReply) -> StepReply:
    """``reply`` with no episode ended, nothing sparse and no masks: the most common reply, the short way's."""
    n = len(reply.rewards)
    no = np.zeros(n, dtype=bool)
    return dataclasses.replace(reply, terminated=no, truncated=no.copy(), final_obs={}, reset_infos={}, masks=None)


def test_the_short_ways_write_the_bytes_of_the_long_ways_and_read_them_back_the_same() -> None:
    """300 seeded replies, half of them the common kind, each sent twice (the second time its layout
    is known): the bytes are those the general encoder writes, and the short decoder (taken for the
    common ones) reads back the same reply as the general one."""
    rng = np.random.default_rng(31)
    short = 0
    for k in range(300):
        reply = random_step_reply(rng)
        if rng.random() < 0.5:
            reply = quieted(reply)
        common = not (reply.terminated.any() or reply.truncated.any() or reply.final_obs or reply.reset_infos)
        common = common and reply.masks is None and not reply.infos
        long_way = codec._framed(*codec._encode_step_reply(reply, None))  # type: ignore[misc]
        for _ in range(2):
            frames = encode(reply)
            assert [bytes(memoryview(f).cast("B")) for f in frames] == [bytes(f) for f in long_way], f"reply {k}"
            payload = wire(frames)[0]
            shortcut = codec._decode_common_reply(payload, None)
            assert (shortcut is not None) <= common, f"reply {k}: read the short way, but is not the common kind"
            short += shortcut is not None
            for got in (decode(wire(frames)), unpack(pack(reply))):
                assert same(got, reply), f"reply {k}: a field differs"
                assert got.rewards.flags.writeable and (got.obs.flags.writeable or not common)
    assert short >= 100  # the draw covers the common replies (about 150 of them, the second send of each)


def test_flags_of_another_shape_or_a_huge_group_take_the_general_way() -> None:
    """End flags that are not one per env stay off the short way (the general encoder pickles them);
    a group of more envs than the flag cache holds is written and read the general way, and comes back."""
    reply = quieted(step_reply(np.arange(6, dtype=np.float32).reshape(3, 2)))
    column = dataclasses.replace(reply, terminated=np.zeros((3, 1), dtype=bool))
    assert memoryview(encode(reply)[1])[0] == 0x02  # the layout is known now: the short way is open
    assert memoryview(encode(column)[1])[0] == 0x80
    n = codec._ZERO_FLAGS_MAX_ENVS + 1
    big = quieted(step_reply(np.zeros((n, 1), dtype=np.float32), rewards=np.ones(n)))
    for _ in range(2):
        frames = encode(big)
        assert memoryview(frames[1])[0] == 0x02
        got = decode(wire(frames))
        assert same(got, big)
    assert n not in codec._ZERO_FLAGS


@pytest.mark.parametrize("flag", ["terminated", "truncated"])
@pytest.mark.parametrize("pos", [0, 2])
def test_an_episode_end_alone_is_never_written_or_read_the_short_way(flag: str, pos: int) -> None:
    """An env that ended with no final observation, reset or infos sent (a group that does not
    reset at once): the flag alone must keep the reply off the short ways."""
    ended = np.arange(3) == pos
    reply = quieted(step_reply(np.arange(6, dtype=np.float32).reshape(3, 2)))
    reply = dataclasses.replace(reply, **{flag: ended})
    for _ in range(2):  # the second time the layout is known
        frames = wire(encode(reply))
        assert codec._decode_common_reply(frames[0], None) is None
        got = decode(frames)
        assert getattr(got, flag).tolist() == ended.tolist() and same(got, reply)


@pytest.mark.parametrize(
    "actions",
    [
        np.array([1, 0, 1]),
        np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        np.zeros(0, dtype=np.int64),
        np.arange(4, dtype=">i4"),
        np.arange(12)[::3],
    ],
    ids=["int64", "float32 rows", "empty", "big-endian", "strided"],
)
def test_a_step_request_of_a_known_layout_is_the_bytes_of_the_long_way(actions: np.ndarray) -> None:
    """The first request of a layout fills the cache; later ones, other values too, are written from it."""
    codec._REQUEST_HEAD.clear()
    for values in (actions, actions + 1, actions * 3):
        request = StepRequest(values)
        long_way = codec._framed(*codec._encode_step_request(values))
        frames = encode(request)
        assert [bytes(f) for f in frames] == [bytes(f) for f in long_way]
        assert same(decode(wire(frames)), request)
    assert (actions.dtype, actions.shape) in codec._REQUEST_HEAD


# --------------------------------------------------------------- compact replies: info columns
def info_reply(infos: dict[int, dict[str, Any]], n: int = 4, masks: bool = False) -> StepReply:
    return step_reply(
        np.arange(n * 2, dtype=np.float32).reshape(n, 2),
        rewards=np.ones(n),
        terminated=np.zeros(n, dtype=bool),
        truncated=np.zeros(n, dtype=bool),
        final_obs={},
        reset_infos={},
        infos=infos,
        masks=np.eye(n, 3, dtype=bool) if masks else None,
    )


SCALARS: list[Callable[[np.random.Generator], Any]] = [
    lambda r: bool(r.random() < 0.5),
    lambda r: int(r.integers(-(2**62), 2**62)),
    lambda r: float(r.standard_normal()),
    lambda r: np.float64(r.standard_normal()),
    lambda r: np.float32(r.standard_normal()),
    lambda r: np.int64(r.integers(-100, 100)),
    lambda r: np.int32(r.integers(-100, 100)),
    lambda r: np.uint8(r.integers(0, 255)),
    lambda r: np.bool_(r.random() < 0.5),
    lambda r: r.integers(0, 255, size=5).astype(np.uint8),  # arrays of one dtype and shape (EnvPool's ram)
    lambda r: r.standard_normal((2, 3)),
]


def test_scalar_infos_travel_as_columns_and_come_back_exact() -> None:
    """200 seeded replies: Python and NumPy scalars, any subset of envs; values, types and key order come back."""
    rng = np.random.default_rng(7)
    for k in range(200):
        n = int(rng.integers(2, 9))
        keys = [f"k{j}-é" for j in rng.permutation(int(rng.integers(1, 6)))]
        makers = {key: SCALARS[int(rng.integers(len(SCALARS)))] for key in keys}
        at = sorted(int(p) for p in rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))
        reply = info_reply({p: {key: makers[key](rng) for key in keys} for p in at}, n, masks=bool(k % 2))
        frames = encode(reply)
        assert memoryview(frames[1])[0] == (0x07 if k % 2 else 0x06), f"reply {k} was not sent as columns"
        for got in (decode(wire(frames)), unpack(pack(reply))):
            assert same(got, reply), f"reply {k}: {got.infos} != {reply.infos}"
            for p in at:
                assert [type(v) for v in got.infos[p].values()] == [type(v) for v in reply.infos[p].values()]
            again = decode(wire(frames))  # two decodes of one message share nothing
            got.infos[at[0]]["added"] = 1
            assert "added" not in again.infos[at[0]]
            rows = [v for p in at for v in got.infos[p].values() if isinstance(v, np.ndarray)]
            assert all(v.base is None and v.flags.writeable for v in rows), "an env's info array is not its own"


def test_a_vector_groups_column_infos_travel_as_their_own_columns() -> None:
    """The columns a vector group's infos were built from are sent as they are: the bytes the rows would give."""
    n = 6
    columns = [np.arange(n, dtype="<i8"), np.linspace(0, 1, n), np.arange(n) % 2 == 0, np.ones((n, 3), np.uint8)]
    infos = ColumnInfos(("steps", "x-é", "ok", "ram"), columns)
    frames, rows = encode(info_reply(infos, n)), encode(info_reply(dict(infos), n))
    assert memoryview(frames[1])[0] == 0x06, "not sent as columns"
    assert wire(frames) == wire(rows)
    assert same(decode(wire(frames)), info_reply(dict(infos), n))
    # columns of a dtype that is none of Python's three kinds', or of another length: a pickle, still exact
    for odd in (
        ColumnInfos(("x",), [np.linspace(0, 1, n, dtype=np.float32)]),
        ColumnInfos(("x",), [np.ones(n - 1)]),
        ColumnInfos(("ram",), [np.ones((n, 2), dtype=">i4")]),
        ColumnInfos((np.str_("x"),), [np.ones(n)]),  # a str subclass as a key, which columns would make a str
    ):
        frames = encode(info_reply(odd, n))
        assert memoryview(frames[1])[0] == 0x80
        assert same(decode(wire(frames)), info_reply(dict(odd), n))


@pytest.mark.parametrize(
    "infos",
    [
        {0: {"a": 1}, 1: {"b": 1}},  # other keys
        {0: {"a": 1, "b": 2}, 1: {"b": 2, "a": 1}},  # other key order
        {0: {"a": 1}, 1: {"a": 1.0}},  # other types under one key
        {0: {"a": True}, 1: {"a": np.bool_(True)}},
        {0: {"a": 2**70}},  # beyond int64
        {0: {"a": "text"}},
        {0: {"a": None}},
        {0: {"a": np.zeros(2)}, 1: {"a": np.zeros(3)}},  # arrays of other shapes
        {0: {"a": np.zeros(2)}, 1: {"a": np.zeros(2, dtype=np.float32)}},  # or dtypes
        {0: {"a": np.array(1.0)}},  # a 0-d array
        {0: {"a": np.array(["x"])}},
        {0: {"a": {"r": 1.0}}},
        {0: {"a": np.complex64(1j)}},
        {0: {1: 1.0}},  # a key that is not a str
        {1: {"a": 1}, 0: {"a": 2}, 2: {"a": 3}},  # positions out of order
        {0: {"k" * 70_000: 1}},  # a key longer than the schema's two-byte length allows
        {0: {"a": np.arange(3, dtype=">i4")}},  # a non-native byte order, which stacking would lose
        {0: {"a": 1}, 1: {np.str_("a"): 2}},  # a key equal to row 0's but of another type
        {9: {"a": 1}},  # not a position of this group
    ],
)
def test_infos_that_do_not_fit_the_columns_stay_pickles(infos: dict[int, dict[Any, Any]]) -> None:
    reply = info_reply(infos)
    frames = encode(reply)
    assert memoryview(frames[1])[0] == 0x80
    assert same(decode(wire(frames)), reply)


def test_malformed_info_columns_fail_clearly() -> None:
    frames = wire(encode(info_reply({0: {"a": 1.5}, 2: {"a": 2.5}})))
    payload = frames[0]
    schema_at = payload.index(b"\x01f\x01\x00a")  # one key, kind f, the key's length and the key
    for broken in (
        payload[:schema_at] + b"\x01z" + payload[schema_at + 2 :],  # an unknown kind
        payload[: schema_at + 2] + b"\x05\x00" + payload[schema_at + 4 :],  # a key longer than the schema
        payload[:-3],  # a column cut short
        payload[: schema_at - 2] + b"\x01\x00\x00" + payload[schema_at + 5 :],  # no keys, yet envs with infos
    ):
        with pytest.raises(ProtocolError, match="malformed compact message"):
            decode([broken, *frames[1:]])


# --------------------------------------------------------------- compact replies: end flags
def ended_reply(n: int, pos: int, how: str, masks: bool = False) -> StepReply:
    """A compact step reply of ``n`` envs in which only env ``pos`` ends (``how``), as a group builds it."""
    obs = np.arange(n * 2, dtype=np.float32).reshape(n, 2)
    return StepReply(
        obs,
        np.linspace(0.5, 1.5, n),
        np.arange(n) == pos if how == "terminated" else np.zeros(n, dtype=bool),
        np.arange(n) == pos if how == "truncated" else np.zeros(n, dtype=bool),
        final_obs={pos: np.full(2, -7.0, dtype=np.float32)},
        reset_infos={pos: {}},
        env_seconds=0.25,
        masks=np.arange(n * 3).reshape(n, 3) % 2 == 0 if masks else None,
    )


@pytest.mark.parametrize("masks", [False, True], ids=["no-masks", "masks"])
@pytest.mark.parametrize("how", ["terminated", "truncated"])
@pytest.mark.parametrize("n", [1, 2, 5])
def test_compact_reply_in_which_only_the_last_env_ends(n: int, how: str, masks: bool) -> None:
    """The last env's flag byte alone says that an episode ended in the step: it must not be skipped."""
    reply = ended_reply(n, n - 1, how, masks)
    frames = encode(reply)
    assert memoryview(frames[1])[0] == (0x03 if masks else 0x02)  # compact, not a pickle
    for got in (decode(wire(frames)), unpack(pack(reply))):
        assert isinstance(got, StepReply)
        expected = [i == n - 1 for i in range(n)]
        assert getattr(got, how).tolist() == expected, f"the last env's {how} flag was lost: {getattr(got, how)}"
        assert sorted(got.final_obs) == [n - 1], f"the last env's final observation was lost: {got.final_obs}"
        np.testing.assert_array_equal(got.final_obs[n - 1], np.full(2, -7.0, dtype=np.float32))
        assert got.reset_infos == {n - 1: {}}, f"the last env's reset was lost: {got.reset_infos}"
        assert same(got, reply)


def random_step_reply(rng: np.random.Generator) -> StepReply:
    """A step reply that fits the compact form, with random end flags, final observations and resets."""
    n = int(rng.integers(1, 10))
    row_shape = [(1,), (3,), (2, 2), (32, 32, 3)][int(rng.integers(4))]  # the last one travels out of band
    dtype = np.dtype([np.float32, np.float64, np.uint8, np.int64][int(rng.integers(4))])
    obs = rng.integers(0, 200, size=(n, *row_shape)).astype(dtype)
    terminated = rng.random(n) < 0.25
    truncated = rng.random(n) < 0.2
    ended = terminated | truncated
    # a group sends a final observation and a reset for each env that ended (and for an env it
    # restarted); the codec takes each flag on its own, so any mix is drawn
    final_at = [i for i in range(n) if (ended[i] and rng.random() < 0.9) or rng.random() < 0.05]
    reset_at = [i for i in range(n) if (ended[i] and rng.random() < 0.9) or rng.random() < 0.05]
    masks = rng.random((n, int(rng.integers(1, 5)))) < 0.5 if rng.random() < 0.3 else None
    return StepReply(
        obs,
        rng.standard_normal(n) * 10,
        terminated,
        truncated,
        final_obs={i: rng.integers(0, 200, size=row_shape).astype(dtype) for i in final_at},
        reset_infos={i: {} for i in reset_at},
        env_seconds=float(rng.random()),
        masks=masks,
    )


def test_random_compact_step_replies_round_trip() -> None:
    """300 seeded random replies (1-9 envs, any end flags): every field comes back equal."""
    rng = np.random.default_rng(24)
    lone_last = 0
    for k in range(300):
        reply = random_step_reply(rng)
        n = len(reply.rewards)
        flags = (reply.terminated | reply.truncated).tolist()
        lone_last += n > 1 and flags[-1] and not any(flags[:-1])
        frames = encode(reply)
        assert memoryview(frames[1])[0] in (0x02, 0x03), f"reply {k} was not sent compact"
        for how, got in (("socket", decode(wire(frames))), ("actor", unpack(pack(reply)))):
            where = (
                f"reply {k} ({how}, {n} envs, terminated {reply.terminated.tolist()}, "
                f"truncated {reply.truncated.tolist()}, final obs {sorted(reply.final_obs)})"
            )
            assert isinstance(got, StepReply), where
            assert got.terminated.tolist() == reply.terminated.tolist(), f"{where}: terminated {got.terminated}"
            assert got.truncated.tolist() == reply.truncated.tolist(), f"{where}: truncated {got.truncated}"
            assert sorted(got.final_obs) == sorted(reply.final_obs), f"{where}: final obs of {sorted(got.final_obs)}"
            assert sorted(got.reset_infos) == sorted(reply.reset_infos), f"{where}: resets {sorted(got.reset_infos)}"
            assert same(got, reply), f"{where}: a field differs"
    assert lone_last >= 10  # the draw covers steps in which only the last env ends


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


def test_wrong_token_and_missing_socket_fail_clearly() -> None:
    calls: list[object] = []

    def recording(request: object) -> object:
        calls.append(request)
        return ("ok", request)

    server = ChannelServer("127.0.0.1", TOKEN, recording, name="test")
    try:
        assert server.unix_path is not None
        for address in (server.unix_path, server.address):
            with pytest.raises(ChannelError, match=r"handshake with .* failed"):
                DirectChannel(address, secrets.token_bytes(32), connect_timeout=5)
        # the server itself refused both: the client's own check of the server never came into it
        wait_until(lambda: server.refused == 2, 10, lambda: f"2 refused connections, not {server.refused}")
        # a stranger that answers the challenge wrongly and sends a request anyway gets nothing back
        with socket.create_connection(server.address, timeout=10) as sock:
            nonce = recv_exact(sock, 32)
            proof = hmac.new(secrets.token_bytes(32), b"client" + nonce, hashlib.sha256).digest()
            sock.sendall(proof + secrets.token_bytes(32))
            sock.sendall(b"".join(bytes(memoryview(f).cast("B")) for f in encode(("step", (1,)))))
            assert read_to_end(sock) == b"", "the server answered a peer that failed its challenge"
        wait_until(lambda: server.refused == 3, 10, lambda: f"3 refused connections, not {server.refused}")
        assert calls == []  # no request of a refused peer reached the handler
        good = DirectChannel(server.address, TOKEN)
        good.send(("step", (1,)))
        assert good.recv(10) == ("ok", ("step", (1,))) and len(calls) == 1
        good.close()
        path = server.unix_path
    finally:
        server.close()
    assert not os.path.exists(os.path.dirname(path))  # the private directory goes with the server
    with pytest.raises(ChannelError, match=r"cannot connect to .*channel"):
        DirectChannel(path, TOKEN, connect_timeout=5)


class FakeServer:
    """A listener that speaks the server's side of the handshake by hand, with a proof chosen by the test.

    The handshake, byte for byte: the server sends a 32-byte nonce; the client answers
    with HMAC-SHA256(token, b"client" + server nonce) and a 32-byte nonce of its own;
    the server proves itself with HMAC-SHA256(token, b"server" + client nonce). The
    fake records whether the client's proof was right and every byte the client sent
    after the handshake, until the client closes.
    """

    def __init__(self, prove: Callable[[bytes, bytes], bytes]) -> None:
        self.prove = prove
        self.client_proof_ok: bool | None = None
        self.after_handshake = b""
        self.error: BaseException | None = None
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.address: tuple[str, int] = self._sock.getsockname()[:2]
        self._thread = threading.Thread(target=self._serve, name="fake-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            self._sock.settimeout(20)
            conn, _ = self._sock.accept()
            with conn:
                conn.settimeout(20)
                server_nonce = secrets.token_bytes(32)
                conn.sendall(server_nonce)
                answer = recv_exact(conn, 64)
                proof, client_nonce = answer[:32], answer[32:]
                expected = hmac.new(TOKEN, b"client" + server_nonce, hashlib.sha256).digest()
                self.client_proof_ok = hmac.compare_digest(proof, expected)
                conn.sendall(self.prove(proof, client_nonce))
                self.after_handshake = read_to_end(conn)
        except BaseException as e:  # reported by join()
            self.error = e

    def join(self) -> None:
        self._thread.join(timeout=30)
        self._sock.close()
        assert not self._thread.is_alive(), "the fake server never saw the client close"
        assert self.error is None, f"fake server failed: {self.error!r}"


def _right_proof(client_proof: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(TOKEN, b"server" + client_nonce, hashlib.sha256).digest()


def _other_token(client_proof: bytes, client_nonce: bytes) -> bytes:
    return hmac.new(secrets.token_bytes(32), b"server" + client_nonce, hashlib.sha256).digest()


def _reflected(client_proof: bytes, client_nonce: bytes) -> bytes:
    return client_proof  # the client's own proof sent back: right length, right token, wrong role


def test_fake_server_speaks_the_handshake() -> None:
    """The fake server below, given the right proof, is a server DirectChannel accepts."""
    fake = FakeServer(_right_proof)
    ch = DirectChannel(fake.address, TOKEN, connect_timeout=10)
    ch.send(("step", (1,)))
    ch.close()
    fake.join()
    assert fake.client_proof_ok is True
    assert fake.after_handshake == b"".join(bytes(memoryview(f).cast("B")) for f in encode(("step", (1,))))


@pytest.mark.parametrize("prove", [_other_token, _reflected], ids=["other-token", "reflected"])
def test_client_refuses_a_server_that_cannot_prove_the_token(prove: Callable[[bytes, bytes], bytes]) -> None:
    fake = FakeServer(prove)
    host, port = fake.address
    with pytest.raises(ChannelError, match=rf"peer at {host}:{port} failed authentication"):
        DirectChannel(fake.address, TOKEN, connect_timeout=10)
    fake.join()
    assert fake.client_proof_ok is True  # the client did its part of the handshake
    assert fake.after_handshake == b"", "the client sent a request to a server that failed its proof"


def test_no_unix_socket_when_not_wanted() -> None:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, unix_dir=None)
    try:
        assert srv.unix_path is None
    finally:
        srv.close()


BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


@pytest.mark.skipif(not BOOT_ID.exists(), reason="Linux only: the kernel's boot id")
def test_machine_id_is_the_host_name_and_the_boot_id() -> None:
    assert machine_id() == f"{socket.gethostname()}/{BOOT_ID.read_text().strip()}"


@pytest.mark.processes
def test_machine_id_differs_on_another_host() -> None:
    """A process whose host name differs (another container, another node) gets another id."""
    code = "from daskvec.transport import machine_id; print(machine_id())"
    # a new UTS namespace: the same kernel, another host name (unprivileged via a user namespace)
    cmd = [
        "unshare",
        "--user",
        "--map-root-user",
        "--uts",
        "sh",
        "-c",
        'hostname daskvec-elsewhere && exec "$0" -c "$1"',
        sys.executable,
        code,
    ]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        pytest.skip("no unshare(1)")
    if out.returncode != 0:
        pytest.skip(f"cannot make a UTS namespace here: {out.stderr.strip()}")
    here = machine_id()
    there = out.stdout.strip()
    assert there.startswith("daskvec-elsewhere/") and there != here
    assert there.split("/", 1)[1] == here.split("/", 1)[1]  # the same kernel: the same boot id


def test_bad_busy_poll() -> None:
    with pytest.raises(ValueError, match="busy_poll"):
        ChannelServer("127.0.0.1", TOKEN, echo, busy_poll=-1)


def _rounds(server: ChannelServer, channels: list[DirectChannel], n: int, gap: float) -> tuple[int, int]:
    """Step ``channels`` ``n`` times, pausing ``gap`` s between replies and the next
    requests; return how many times the server busy-polled meanwhile, and how many of
    those polls found the request."""
    polls, hits = server.polls, server.poll_hits
    for _ in range(n):
        for ch in channels:
            ch.send(("step", (1,)))
        for ch in channels:
            ch.recv(10)
        if gap:
            time.sleep(gap)  # the client's "think time", not synchronisation
    return server.polls - polls, server.poll_hits - hits


#: The server's poll budget in these tests (the largest allowed). Slow rounds pause
#: longer than this, so the server sees each of their requests arrive late whatever the
#: load; quick rounds pause a fifth of it, long enough that only a poll that waits finds
#: the request, and need the request to come within the budget only most times.
BUDGET = 0.1
QUICK = BUDGET / 5
SLOW = 2 * BUDGET
N = 20


@pytest.fixture
def idle_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """Polls never judge their core contended (a loaded test machine would make them pause)."""
    from daskvec.transport import server as server_module

    monkeypatch.setattr(server_module, "CONTENDED_YIELD", float("inf"))


@pytest.fixture
def contended_core(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every ``sched_yield`` keeps its thread off the CPU for 5 ms, as on a core others wait for; their count."""
    from daskvec.transport import server as server_module

    yields = [0]

    def slow_yield() -> None:
        yields[0] += 1
        time.sleep(5 * server_module.CONTENDED_YIELD)

    monkeypatch.setattr(server_module.os, "sched_yield", slow_yield)
    return yields


def test_a_poll_on_a_contended_core_ends_after_one_yield(
    contended_core: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from daskvec.transport import server as server_module
    from daskvec.transport.server import _poll_readable

    a, b = socket.socketpair()
    try:
        # nothing arrives: a budget of 0.1 s would allow about 20 such yields; one is enough to judge
        assert _poll_readable(a, BUDGET) == (False, True)
        assert contended_core[0] == 1
        # the request that came while the thread was off the CPU is still found
        monkeypatch.setattr(server_module.os, "sched_yield", lambda: (b.send(b"x"), time.sleep(0.005)))
        assert _poll_readable(a, BUDGET) == (True, True)
    finally:
        a.close()
        b.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [BUDGET], indirect=True)
def test_a_connection_pauses_polling_while_its_core_is_contended(
    server: ChannelServer, contended_core: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    from daskvec.transport import server as server_module

    monkeypatch.setattr(server_module, "CONTENDED_PAUSE", 60.0)
    k = server_module.CONTENDED_POLLS
    ch = DirectChannel(server.address, TOKEN)
    _rounds(server, [ch], 2, 0.0)  # quick: the connection would poll before each request
    polls, hits = _rounds(server, [ch], N, QUICK)
    # every yield is slow, so every poll finds the core contended; after k of them in a
    # row the connection stops polling for the rest of the rounds (a poll counted here
    # may be one that started before them)
    assert server.polls_contended == k and polls <= k + 1, (polls, hits, server.polls_contended)
    ch.close()
    # with no pause, a new connection polls again after each k judgements (not for good)
    monkeypatch.setattr(server_module, "CONTENDED_PAUSE", 0.0)
    ch = DirectChannel(server.address, TOKEN)
    _rounds(server, [ch], 2, 0.0)  # the closed connection is no longer hot; this one is
    before = server.polls_contended
    polls, hits = _rounds(server, [ch], N, QUICK)
    assert server.polls_contended - before >= N // 2, (polls, hits, server.polls_contended - before)
    ch.close()
    # a contended poll now and then (a virtual machine's CPU taken away for a moment) is
    # no contention: with every other poll's yields quick, polling never pauses. The
    # threshold is raised for this part: the "quick" polls really spin, and on a loaded
    # test machine (the other xdist worker's cluster) a thread is sometimes preempted for
    # over 1 ms, which is a contended core by the default threshold.
    monkeypatch.setattr(server_module, "CONTENDED_PAUSE", 60.0)
    monkeypatch.setattr(server_module, "CONTENDED_YIELD", 3 * QUICK)

    def slow_in_every_other_poll() -> None:
        if server.polls % 2:
            time.sleep(1.2 * server_module.CONTENDED_YIELD)

    monkeypatch.setattr(server_module.os, "sched_yield", slow_in_every_other_poll)
    ch = DirectChannel(server.address, TOKEN)
    _rounds(server, [ch], 2, 0.0)
    polls, hits = _rounds(server, [ch], N, QUICK)
    assert polls >= N // 2, (polls, hits)  # half of them end early, without the request
    ch.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [BUDGET], indirect=True)
def test_busy_poll_only_while_the_client_is_quick(server: ChannelServer, idle_cores: None) -> None:
    from daskvec.transport.server import _POLL_MISSES

    assert server.unix_path is not None
    ch = DirectChannel(server.unix_path, TOKEN)
    assert _rounds(server, [ch], 2, 0.0)[0] <= 1  # no poll before the first quick request
    # the client answers within the budget: the server polls for (nearly) every request,
    # and the poll, not the blocking receive, picks it up
    polls, hits = _rounds(server, [ch], N, QUICK)
    assert polls >= N // 2 and hits >= N // 2, f"{polls} polls, {hits} found the request, in {N} quick rounds"
    # a slow client: every request after the first of these rounds comes late, and after
    # _POLL_MISSES of them polling stops
    polls, _ = _rounds(server, [ch], _POLL_MISSES + 2, SLOW)
    assert 1 <= polls <= _POLL_MISSES + 1, f"{polls} polls in {_POLL_MISSES + 2} slow rounds"
    polls, _ = _rounds(server, [ch], 5, SLOW)
    assert polls == 0, f"the server kept polling for a slow client ({polls} polls in 5 slow rounds)"
    # quick again: polling resumes
    polls, hits = _rounds(server, [ch], N, QUICK)
    assert polls >= N // 2 and hits >= N // 2, f"polling did not resume: {polls} polls, {hits} hits in {N} rounds"
    ch.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [0.0], indirect=True)
def test_no_busy_poll_when_off(server: ChannelServer, idle_cores: None) -> None:
    ch = DirectChannel(server.address, TOKEN)
    assert _rounds(server, [ch], N + 2, QUICK) == (0, 0)
    ch.close()
    # the same client on a server with a budget: there it polls (the test can see a poll)
    on = ChannelServer("127.0.0.1", TOKEN, echo, name="test", busy_poll=BUDGET)
    try:
        ch = DirectChannel(on.address, TOKEN)
        polls, hits = _rounds(on, [ch], N + 2, QUICK)
        assert polls >= N // 2 and hits >= N // 2, f"{polls} polls, {hits} hits with busy_poll={BUDGET}"
        ch.close()
    finally:
        on.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("server", [BUDGET], indirect=True)
def test_two_quick_connections_do_not_poll(server: ChannelServer, idle_cores: None) -> None:
    # two groups stepping in one process would fight each other for the GIL while polling
    assert server.unix_path is not None
    one = DirectChannel(server.unix_path, TOKEN)
    _rounds(server, [one], 2, 0.0)
    polls, _ = _rounds(server, [one], N, QUICK)
    assert polls >= N // 2, f"one quick connection alone: only {polls} polls in {N} rounds"
    two = DirectChannel(server.address, TOKEN)
    _rounds(server, [one, two], 3, 0.0)  # both become hot
    polls, _ = _rounds(server, [one, two], N, QUICK)
    # each connection would poll before each of its N requests; allow a few polls for
    # rounds in which the machine held one connection's request past the budget
    assert polls <= N // 4, f"{polls} polls in {N} rounds of two quick connections"
    two.close()
    _rounds(server, [one], 2, 0.0)  # the closed connection is no longer hot
    polls, _ = _rounds(server, [one], N, QUICK)
    assert polls >= N // 2, f"alone again: only {polls} polls in {N} rounds"
    one.close()


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
        ({"lives": 1, "x": 0.5}, {}, False, True),  # scalar infos travel as columns
        ({"episode": {"r": 1.0}}, {}, False, False),  # a nested info stays a pickle
        ({}, {"seeded": 1}, False, False),  # a reset info to pass on
        ({}, {}, True, False),  # a restarted env: the reply carries daskvec's marker
    ],
)
def test_group_replies_are_compact_when_the_flags_say_all(
    info: dict[str, Any], reset_info: dict[str, Any], fail: bool, compact: bool
) -> None:
    factories = cloudpickle.dumps([functools.partial(InfoEnv, info, reset_info, fail) for _ in range(3)])
    group = EnvGroup(factories, GroupSpec((0, 1, 2), token=None, on_env_error="restart"), worker_address="test")
    try:
        group.dispatch((Command.RESET, ([0, 1, 2], [{}, {}, {}])))
        for step in (1, 2):  # the second step ends every episode
            reply = group.dispatch(StepRequest(np.array([0, 1, 0])))
            assert isinstance(reply, StepReply)
            if not fail:
                ended = step == 2
                assert reply.terminated.tolist() == [ended] * 3
                assert sorted(reply.final_obs) == ([0, 1, 2] if ended else [])
            # a reply without finished episodes carries no reset infos, so it fits
            frames = encode(reply)
            tag = 0x06 if info else 0x02
            assert memoryview(frames[1])[0] == (tag if compact or (step == 1 and not info and not fail) else 0x80)
            assert same(decode(wire(frames)), reply)
    finally:
        group.shutdown()


# --------------------------------------------------------------------------- the client's reads and writes
def test_compact_replies_with_no_episode_end_share_one_read_only_empty_mapping() -> None:
    """No fresh empty dicts per reply in which no episode ended, and no reader can fill the shared one by mistake."""
    quiet = step_reply(np.zeros((3, 2)), terminated=np.zeros(3, dtype=bool), final_obs={}, reset_infos={})
    first, second = decode(wire(encode(quiet))), decode(wire(encode(quiet)))
    for got in (first, second):
        assert got.final_obs is got.infos is got.reset_infos is got.restarted is EMPTY
    with pytest.raises(TypeError, match="read-only"):
        first.infos[0] = {"leak": True}
    with pytest.raises(TypeError, match="read-only"):
        first.reset_infos.setdefault(0, {})
    assert EMPTY == {} and dict(EMPTY) == {} and type(dict(EMPTY)) is dict
    ended = decode(wire(encode(step_reply(np.zeros((3, 2))))))  # env 1 ended: its columns are its own
    assert ended.final_obs is not EMPTY and ended.reset_infos is not EMPTY and list(ended.final_obs) == [1]
    ended.final_obs[2] = np.ones(2)  # the decoder's fresh dicts stay ordinary dicts


def test_a_rollout_step_without_episode_ends_shares_the_empty_mapping() -> None:
    frag = RolloutReply(
        obs=np.zeros((3, 2, 1)),
        actions=np.zeros((2, 2)),
        values=np.zeros((2, 2)),
        log_probs=np.zeros((2, 2)),
        rewards=np.zeros((2, 2)),
        terminated=np.zeros((2, 2), dtype=bool),
        truncated=np.zeros((2, 2), dtype=bool),
        final_obs={1: {0: np.ones(1)}},
        reset_infos={1: {0: {}}},
    )
    quiet, ended = frag.step(0), frag.step(1)
    assert quiet.final_obs is quiet.infos is quiet.reset_infos is quiet.restarted is EMPTY
    assert list(ended.final_obs) == [0] and list(ended.reset_infos) == [0] and ended.infos is EMPTY


class CountingPoll:
    """A stand-in for a ``select.poll`` object that counts its waits."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.calls = inner, 0

    def poll(self, *args: Any) -> Any:
        self.calls += 1
        return self.inner.poll(*args)


def test_a_round_trip_is_one_send_one_poll_one_recv(server: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The client's socket stays in one mode: per request one sendmsg, per reply one poll and one recv."""
    assert server.unix_path is not None
    ch = DirectChannel(server.unix_path, TOKEN)  # a Unix socket: a reply arrives whole
    sock = ch._sock
    calls: dict[str, int] = {}

    def counting(name: str) -> Callable[..., Any]:
        real = getattr(socket.socket, name)

        def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if self is sock:
                calls[name] = calls.get(name, 0) + 1
            return real(self, *args, **kwargs)

        return call

    for name in ("settimeout", "setblocking", "recv", "recv_into", "recvmsg_into", "send", "sendall", "sendmsg"):
        monkeypatch.setattr(socket.socket, name, counting(name))
    waits = ch._reader._readable = CountingPoll(ch._reader._readable)
    actions = np.array([1, 0, 1, 1], dtype=np.int64)
    for k in range(50):
        ch.send(StepRequest(actions + k))
        status, echoed = ch.recv(10)
        assert status == "ok" and echoed.actions.tolist() == (actions + k).tolist()
    ch.close()
    # on Linux a Unix channel reads with recvmsg, to take a shared window's descriptor with the bytes
    assert calls == {"sendmsg": 50, "recvmsg_into" if window_supported() else "recv_into": 50}
    assert waits.calls == 50


def test_a_worker_reads_each_request_with_one_recv(server: ChannelServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serving side: its connection blocks, so a request is one receive, with no poll and no mode switch."""
    calls: dict[str, int] = {}

    def counting(name: str) -> Callable[..., Any]:
        real = getattr(socket.socket, name)

        def call(self: socket.socket, *args: Any, **kwargs: Any) -> Any:
            if threading.get_ident() != client_thread:
                calls[name] = calls.get(name, 0) + 1
            return real(self, *args, **kwargs)

        return call

    real_poll = select.poll
    polls = [0]

    class CountingPollFactory:
        def __init__(self) -> None:
            self.inner = real_poll()

        def register(self, *args: Any) -> None:
            self.inner.register(*args)

        def poll(self, *args: Any) -> Any:
            if threading.get_ident() != client_thread:
                polls[0] += 1
            return self.inner.poll(*args)

    monkeypatch.setattr(select, "poll", CountingPollFactory)
    assert server.unix_path is not None
    client_thread = threading.get_ident()
    ch = DirectChannel(server.unix_path, TOKEN)  # the serving loop's reader is made with the counting poll
    ch.send(StepRequest(np.zeros(3)))  # the serving loop has begun: its next receive is counted
    assert ch.recv(10)[0] == "ok"
    for name in ("settimeout", "setblocking", "recv", "recv_into", "recvmsg_into", "sendmsg", "sendall"):
        monkeypatch.setattr(socket.socket, name, counting(name))
    for k in range(50):
        ch.send(StepRequest(np.full(3, float(k))))
        status, echoed = ch.recv(10)
        assert status == "ok" and echoed.actions.tolist() == [float(k)] * 3
    ch.close()
    # the receive waiting when the counting began, or the one waiting after the last request, may be left out
    assert calls.get("sendmsg", 0) == 50 and 49 <= calls.get("recv_into", 0) <= 51, calls
    assert not ({"settimeout", "setblocking", "recv", "recvmsg_into"} & set(calls)), calls
    assert polls[0] == 0


def test_a_reply_cut_by_a_timeout_is_finished_by_the_next_receive() -> None:
    """What arrived before a timeout is kept: the stream never falls out of step."""
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        reader = FrameReader(b)
        first = b"".join(bytes(memoryview(f).cast("B")) for f in encode(("first", np.arange(5))))
        second = b"".join(bytes(memoryview(f).cast("B")) for f in encode(("second", [1, 2])))
        for cut in (3, 12, len(first) - 1):  # inside the header, right after it, one byte short
            a.sendall(first[:cut])
            with pytest.raises(TimeoutError):
                reader.read(0.05)
            a.sendall(first[cut:] + second)  # the rest, and the next message in the same write
            got = decode(reader.read(10))
            assert got[0] == "first" and got[1].tolist() == [0, 1, 2, 3, 4]
            assert decode(reader.read(10)) == ("second", [1, 2])
        a.sendall(second + second)  # two whole messages in one read: the second waits for the next call
        assert decode(reader.read(10)) == ("second", [1, 2]) and decode(reader.read(10)) == ("second", [1, 2])
        a.sendall(first[:20])
        a.close()
        with pytest.raises(ChannelError, match="closed by peer"):
            reader.read(10)


def test_the_reader_allocates_only_what_arrived_and_takes_large_messages_whole() -> None:
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        a.sendall(struct.pack("!IQ", 1, 1 << 30) + b"x" * 1000)  # claims a GiB, sends a thousand bytes
        a.close()
        tracemalloc.start()
        try:
            with pytest.raises(ChannelError, match="closed by peer"):
                FrameReader(b).read(10)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"reading a 1 GiB header that sent 1000 bytes allocated {peak} bytes"
    payload = np.random.default_rng(1).integers(0, 255, size=(3 << 20) + 17, dtype=np.uint8)
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        sender = threading.Thread(target=lambda: [a.sendall(f) for f in encode(("big", payload, [np.ones(3)]))])
        sender.start()
        reader = FrameReader(b)
        got = decode(reader.read(30))
        sender.join(30)
        assert got[0] == "big" and np.array_equal(got[1], payload) and got[2][0].tolist() == [1.0, 1.0, 1.0]
        a.sendall(b"".join(bytes(memoryview(f).cast("B")) for f in encode("small")))
        assert decode(reader.read(10)) == "small"  # the buffer shrinks back for the next, small message


@pytest.mark.parametrize(
    "header",
    [
        struct.pack("!I", 0) + struct.pack("!Q", 1),
        struct.pack("!I", 1 << 20) + struct.pack("!Q", 8),
        struct.pack("!IQ", 1, 1 << 40),
    ],
    ids=["no frames", "too many frames", "more than the size cap"],
)
def test_the_reader_refuses_malformed_headers(header: bytes) -> None:
    a, b = socket.socketpair()
    with a, b:
        b.setblocking(False)
        a.sendall(header)
        with pytest.raises(ProtocolError, match=r"malformed|too large"):
            FrameReader(b).read(10)


def test_a_send_to_a_peer_that_reads_nothing_is_bounded() -> None:
    """A group that stops reading holds a request at most ``send_timeout``; a closed one fails at once."""
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        big = np.zeros(64 << 20, dtype=np.uint8)  # far more than a socket buffer holds
        with pytest.raises(TimeoutError):
            write_frames(a, encode(StepRequest(big)), timeout=0.05)
    a, b = socket.socketpair()
    with a:
        b.close()
        a.setblocking(False)
        with pytest.raises(OSError):
            write_frames(a, encode("hello"), timeout=10)
