"""The direct channel on its own: Unix and TCP sockets, and the busy poll after each reply.

These run a real :class:`ChannelServer` on threads of the test process and talk to it
through :class:`DirectChannel`, so CPU time spent polling shows in the CPU clocks of
the server's connection threads. Bounds are on CPU seconds with wide margins, not on
wall-clock speed.
"""

from __future__ import annotations

import os
import secrets
import stat
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from daskvec.transport import ChannelError, ChannelServer, DirectChannel, machine_id

TOKEN = secrets.token_bytes(32)


def echo(request: object) -> object:
    return ("ok", request)


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ChannelServer]:
    srv = ChannelServer("127.0.0.1", TOKEN, echo, name="test", busy_poll=getattr(request, "param", 0.0))
    yield srv
    srv.close()


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
