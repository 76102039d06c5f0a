"""Hostile peers on the direct channel: floods, slow peers, malformed frames, fuzzed bytes.

Every test talks to a real :class:`ChannelServer` over real sockets: on threads of this
process, or inside a ``dask worker`` process whose descriptor limit the test lowers.
What is checked is what the server does (which connections it closes, what it logs,
whether the right client still gets in), never how fast.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import random
import resource
import secrets
import socket
import struct
import threading
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from envs import CountingEnv
from waiting import wait_until
from wire_frames import COMPACT, PICKLED, read_to_end, recv_exact, wire

from daskvec.cluster.clients import dumps_factories
from daskvec.protocol.messages import Command, GroupSpec, RemoteError, StepReply, StepRequest
from daskvec.transport import ChannelError, ChannelServer, DirectChannel, ProtocolError, decode, encode, pack, unpack
from daskvec.transport.wire import FrameReader, digest
from daskvec.worker import EnvGroup

TOKEN = secrets.token_bytes(32)


def echo(request: object) -> object:
    if request == "unpicklable":
        return threading.Lock()  # cannot be encoded
    return ("ok", request)


@pytest.fixture
def thread_crashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Names of the threads that die with an uncaught exception during the test."""
    crashed: list[str] = []
    previous = threading.excepthook

    def hook(args: Any) -> None:
        crashed.append(getattr(args.thread, "name", "?"))
        previous(args)

    monkeypatch.setattr(threading, "excepthook", hook)
    return crashed


@pytest.fixture
def server() -> Iterator[ChannelServer]:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, name="hostile", handshake_timeout=3.0)
    yield srv
    srv.close()


def closed_by_server(sock: socket.socket, timeout: float) -> bool:
    """Whether the server closes ``sock`` within ``timeout`` s (whatever it sent before)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            continue
    except TimeoutError:
        return False
    except OSError:  # reset: closed with our bytes unread
        return True
    return True


# --------------------------------------------------------------------------- malformed frames
def _header(*lengths: int, count: int | None = None) -> bytes:
    n = len(lengths) if count is None else count
    return struct.pack("!I", n) + struct.pack(f"!{len(lengths)}Q", *lengths)


MALFORMED = {
    "no frames": _header(0, count=0),
    "too many frames": _header(8, count=1 << 20),
    "more than the size cap": _header(1 << 40),
    "unknown tag": _header(5) + b"\x55abcd",
    "pickle that does not load": _header(6) + b"\x80\x05junk",
    "truncated compact request": _header(2) + b"\x01\x09",
    "compact reply with lengths that differ": _header(40) + struct.pack("<BdI", 2, 0.0, 1_000_000) + b"\0" * 27,
}


@pytest.mark.parametrize("name", list(MALFORMED))
def test_malformed_frame_ends_its_connection_with_one_log_line(
    server: ChannelServer, name: str, caplog: pytest.LogCaptureFixture, thread_crashes: list[str]
) -> None:
    ch = DirectChannel(server.address, TOKEN, connect_timeout=10)
    ch.send(("hello",))
    assert ch.recv(10) == ("ok", ("hello",))
    sock = ch._sock
    assert sock is not None
    with caplog.at_level(logging.WARNING, logger="daskvec.transport.server"):
        sock.sendall(MALFORMED[name])
        assert closed_by_server(sock, 10), f"the server kept a connection that sent {name!r}"
        wait_until(lambda: len(caplog.records) >= 1, 5, "a log record")
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert "dropped a connection" in lines[0] and ("malformed" in lines[0] or "too large" in lines[0])
    ch.close()
    assert thread_crashes == []
    # the server goes on serving the right client
    good = DirectChannel(server.address, TOKEN, connect_timeout=10)
    good.send(("step", (np.arange(3),)))
    got = good.recv(10)
    assert got[0] == "ok" and got[1][1][0].tolist() == [0, 1, 2]
    good.close()


def test_a_reply_that_cannot_be_sent_is_an_error_reply_not_a_dead_thread(
    server: ChannelServer, thread_crashes: list[str]
) -> None:
    ch = DirectChannel(server.address, TOKEN, connect_timeout=10)
    ch.send("unpicklable")
    reply = ch.recv(10)
    assert isinstance(reply, RemoteError) and "cannot be sent to the client" in reply.message
    ch.send("again")  # the same connection still works
    assert ch.recv(10) == ("ok", "again")
    ch.close()
    assert thread_crashes == []


def test_a_huge_header_allocates_only_what_arrived() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(_header(1 << 30) + b"x" * 1000)  # claims a GiB, sends a thousand bytes
        a.close()
        tracemalloc.start()
        try:
            with pytest.raises(ChannelError, match="closed by peer"):
                FrameReader(b).read(None)  # blocking, as a worker reads its requests
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert peak < 8 << 20, f"reading a 1 GiB header that sent 1000 bytes allocated {peak} bytes"


def test_large_frames_still_arrive_whole() -> None:
    """The chunked reader gives back exactly what was sent (frames larger than a chunk)."""
    payload = np.random.default_rng(1).integers(0, 255, size=(3 << 20) + 17, dtype=np.uint8)
    a, b = socket.socketpair()
    with a, b:
        sender = threading.Thread(target=lambda: [a.sendall(f) for f in encode(("big", payload))])
        sender.start()
        got = decode(FrameReader(b).read(None))
        sender.join(30)
    assert got[0] == "big" and np.array_equal(got[1], payload)


# --------------------------------------------------------------------------- fuzzing
def _mutants(frames: list[bytearray], rng: random.Random) -> Iterator[list[bytearray]]:
    """Damaged copies of a message's frames: flipped, cut, lengthened, dropped, replaced."""
    payload = frames[0]
    for _ in range(400):
        kind = rng.randrange(6)
        out = [bytearray(f) for f in frames]
        if kind == 0 and payload:  # flip a few bytes
            for _ in range(rng.randint(1, 4)):
                out[0][rng.randrange(len(payload))] = rng.randrange(256)
        elif kind == 1:  # cut
            out[0] = out[0][: rng.randrange(len(payload) + 1)]
        elif kind == 2:  # lengthen
            out[0] += rng.randbytes(rng.randint(1, 64))
        elif kind == 3:  # drop or add an out-of-band frame
            out = out[:1] if len(out) > 1 else [*out, bytearray(rng.randbytes(rng.randint(0, 64)))]
        elif kind == 4:  # random bytes behind a valid tag
            out[0] = bytearray([payload[0] if payload else 1]) + rng.randbytes(rng.randint(0, 80))
        else:  # nothing but random bytes
            out = [bytearray(rng.randbytes(rng.randint(0, 80))) for _ in range(rng.randint(1, 3))]
        yield out


def test_fuzzed_messages_raise_only_protocol_errors() -> None:
    rng = random.Random(20261201)
    tried = 0
    for message in [*COMPACT, *PICKLED]:
        for frames in _mutants(wire(encode(message)), rng):
            tried += 1
            try:
                decode(frames)
            except ProtocolError:
                pass
            except BaseException as e:  # anything else is the bug this test is about
                raise AssertionError(f"decode({frames!r}) raised {type(e).__name__}: {e}") from e
            packed = bytearray(pack(message))
            packed[rng.randrange(len(packed))] = rng.randrange(256)
            with contextlib.suppress(ProtocolError):  # and nothing else
                unpack(bytes(packed[: rng.randrange(len(packed) + 1)]))
    assert tried == 400 * (len(COMPACT) + len(PICKLED))


def test_fuzzed_headers_raise_only_channel_errors() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a, b = socket.socketpair()
        with a, b:
            lengths = [rng.randrange(1 << rng.randrange(1, 40)) for _ in range(3)]
            head = rng.choice([rng.randbytes(rng.randint(0, 40)), _header(*lengths)])
            a.sendall(head + rng.randbytes(rng.randint(0, 200)))
            a.close()
            with contextlib.suppress(ChannelError):  # and nothing else
                decode(FrameReader(b).read(None))


# --------------------------------------------------------------------------- slowloris
def _trickle(socks: list[socket.socket], stop: threading.Event) -> None:
    """Send one byte on every socket every 0.5 s: never done, never silent."""
    while not stop.wait(0.5):
        for s in socks:
            try:
                s.send(b"x", socket.MSG_DONTWAIT)
            except OSError:
                continue


def test_slowloris_neither_holds_threads_nor_locks_out_the_right_client(
    server: ChannelServer, thread_crashes: list[str]
) -> None:
    def handshakes() -> int:
        return sum(t.name == "hostile-conn" for t in threading.enumerate())

    socks = [socket.create_connection(server.address, timeout=10) for _ in range(200)]
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(socks, stop), daemon=True)
    trickler.start()
    try:
        # every one was taken in: waiting for its handshake, or pushed out by a newer one
        wait_until(lambda: len(server._pending) + server.refused >= 200, 10, "200 peers taken or refused")
        # at most MAX_PENDING (64) of them wait for a handshake; the threads of the rest end
        wait_until(
            lambda: handshakes() <= 64,
            10,
            lambda: f"at most 64 handshake threads for 200 slow peers, not {handshakes()}",
        )
        good = DirectChannel(server.address, TOKEN, connect_timeout=10)
        good.send(("step", (np.ones(2),)))
        assert good.recv(10)[0] == "ok"
        # one overall deadline (3 s here): trickling peers are cut although they keep sending
        t0 = time.monotonic()
        assert all(closed_by_server(s, max(t0 + 8 - time.monotonic(), 0.01)) for s in socks)
        wait_until(lambda: server.refused == 200, 5, lambda: f"200 slow peers refused, not {server.refused}")
        good.send(("still", "here"))  # the authenticated connection has no deadline
        assert good.recv(10) == ("ok", ("still", "here"))
        good.close()
    finally:
        stop.set()
        trickler.join(5)
        for s in socks:
            s.close()
    assert thread_crashes == []


def _flood(address: tuple[str, int], rate: float, stop: threading.Event, opened: list[int]) -> None:
    """Open ``rate`` connections a second that never handshake, each held 2 s, until ``stop``."""
    held: collections.deque[tuple[float, socket.socket]] = collections.deque()
    start = time.monotonic()
    try:
        while not stop.is_set():
            now = time.monotonic()
            while held and now - held[0][0] > 2.0:
                held.popleft()[1].close()
            with contextlib.suppress(OSError):
                held.append((now, socket.create_connection(address, timeout=1)))
                opened[0] += 1
            stop.wait(max(start + opened[0] / rate - time.monotonic(), 0.0))
    finally:
        for _, s in held:
            s.close()


def test_a_flood_of_silent_connections_does_not_lock_out_the_right_client(
    server: ChannelServer, thread_crashes: list[str]
) -> None:
    """Silent peers faster than the slots turn over (from the right client's own address): it still gets in."""
    stop, opened = threading.Event(), [0]
    flood = threading.Thread(target=_flood, args=(server.address, 200.0, stop, opened), daemon=True)
    flood.start()
    failures: list[str] = []
    try:
        wait_until(lambda: len(server._pending) >= 64, 10, "the flood to fill the handshake slots")
        for i in range(10):  # each bounded by its connect and receive timeouts
            try:
                ch = DirectChannel(server.address, TOKEN, connect_timeout=5)
            except ChannelError as e:
                failures.append(str(e))
            else:
                ch.send(("attempt", i))
                assert ch.recv(10) == ("ok", ("attempt", i))
                ch.close()
            time.sleep(0.2)  # spread the attempts over the flood
    finally:
        stop.set()
        flood.join(10)
    assert opened[0] >= 300, f"the flood opened only {opened[0]} connections"
    assert failures == [], f"{len(failures)} of 10 right handshakes refused during the flood: {failures[:2]}"
    assert thread_crashes == []


def test_a_flood_from_one_address_never_pushes_out_another_address(server: ChannelServer) -> None:
    """Only the busiest address loses slots: a slow right client elsewhere keeps its own."""
    mine = socket.create_connection(server.address, timeout=10, source_address=("127.0.0.1", 0))
    flood = [socket.create_connection(server.address, timeout=10, source_address=("127.0.0.2", 0)) for _ in range(100)]
    try:
        wait_until(lambda: len(server._pending) + server.refused >= 101, 10, "101 peers taken or refused")
        wait_until(lambda: server.refused >= 101 - 64, 10, "the flood's oldest pushed out")
        # still in its slot: it completes its handshake now, after 100 newer connections
        mine.settimeout(10)
        try:
            server_nonce = recv_exact(mine, 32)
        except ConnectionError:
            pytest.fail("a flood from 127.0.0.2 pushed 127.0.0.1's waiting connection out")
        client_nonce = secrets.token_bytes(32)
        mine.sendall(digest(TOKEN, b"client", server_nonce) + client_nonce)
        assert recv_exact(mine, 32) == digest(TOKEN, b"server", client_nonce)
    finally:
        mine.close()
        for s in flood:
            s.close()


def test_refusals_are_logged_rate_limited(server: ChannelServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="daskvec.transport.server"):
        for _ in range(20):
            with socket.create_connection(server.address, timeout=10) as s:
                recv_exact(s, 32)
                s.sendall(b"\0" * 64)  # a wrong proof
                read_to_end(s)
        wait_until(lambda: server.refused == 20, 10, lambda: f"20 refused, not {server.refused}")
    refusals = [r for r in caplog.records if "refused a peer" in r.getMessage()]
    assert len(refusals) == 1 and "wrong token" in refusals[0].getMessage()


def test_malformed_messages_after_the_handshake_are_logged_rate_limited(
    server: ChannelServer, caplog: pytest.LogCaptureFixture
) -> None:
    # a peer holding the token, reconnecting to send garbage again and again
    with caplog.at_level(logging.WARNING, logger="daskvec.transport.server"):
        for name in list(MALFORMED) * 3:
            ch = DirectChannel(server.address, TOKEN, connect_timeout=10)
            sock = ch._sock
            assert sock is not None
            sock.sendall(MALFORMED[name])
            # the server logs before it closes: every line is out once this returns
            assert closed_by_server(sock, 10), f"the server kept a connection that sent {name!r}"
            ch.close()
    dropped = [r for r in caplog.records if "dropped a connection" in r.getMessage()]
    assert len(dropped) == 1, [r.getMessage() for r in dropped]


def test_a_gone_handler_is_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    def gone(request: object) -> object:
        raise ChannelError("the group is closed")

    srv = ChannelServer("127.0.0.1", TOKEN, gone, name="gone", handshake_timeout=3.0)
    try:
        with caplog.at_level(logging.WARNING, logger="daskvec.transport.server"):
            for _ in range(10):
                ch = DirectChannel(srv.address, TOKEN, connect_timeout=10)
                ch.send(("hello",))
                with pytest.raises(ChannelError):
                    ch.recv(10)  # the server logs before it closes, so the line is out by now
                ch.close()
    finally:
        srv.close()
    dropped = [r for r in caplog.records if "dropped a connection" in r.getMessage()]
    assert len(dropped) == 1, [r.getMessage() for r in dropped]


# --------------------------------------------------------------------------- fd exhaustion
@pytest.mark.timeout(180)
def test_fd_exhaustion_in_a_worker_does_not_stop_its_accept_loop(dask_processes: Any, tmp_path: Path) -> None:
    from distributed import Client

    procs = dask_processes(0)
    log = tmp_path / "worker.log"
    worker = procs.add_worker(log=log)
    procs.wait_for_workers(1)
    token = secrets.token_bytes(32)
    factories = dumps_factories([functools.partial(CountingEnv, horizon=1000)], [0])
    with Client(procs.address, timeout=30, set_as_default=False) as client:
        fut = client.submit(EnvGroup, factories, GroupSpec((0,), token), actor=True, pure=False)
        with client.as_current():
            actor = fut.result(timeout=60)
            address = tuple(actor.describe().result(timeout=60).address)
        established = DirectChannel(address, token, connect_timeout=30)
        established.send((Command.RESET, ([0], [None])))
        established.recv(30)
        # the worker at a descriptor limit just above what it holds now
        held = len(os.listdir(f"/proc/{worker.pid}/fd"))
        _, hard = resource.prlimit(worker.pid, resource.RLIMIT_NOFILE)
        resource.prlimit(worker.pid, resource.RLIMIT_NOFILE, (held + 4, hard))
        flood: list[socket.socket] = []
        try:
            for _ in range(200):
                try:
                    flood.append(socket.create_connection(address, timeout=1))
                except OSError:
                    break  # the backlog is full too
            wait_until(
                lambda: "cannot accept connections" in log.read_text(errors="replace"),
                30,
                "the worker to run out of descriptors",
            )
            established.send(StepRequest(np.array([1])))  # stepping goes on during the flood
            assert isinstance(established.recv(30), StepReply)
        finally:
            for s in flood:
                s.close()
        # the same server, under the same limit: the right client gets in and steps
        late = DirectChannel(address, token, connect_timeout=60)
        late.send(StepRequest(np.array([2])))
        reply = late.recv(30)
        assert isinstance(reply, StepReply) and reply.obs[0, 0] == 2.0  # the second step of the same env
        late.close()
        established.close()
        assert worker.poll() is None
    procs.kill_worker(worker)  # at its low descriptor limit it may be slow to stop gracefully
