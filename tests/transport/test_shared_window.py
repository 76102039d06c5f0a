"""Large observations in shared memory for groups on the client's machine (transport/window.py).

The unit tests pass real descriptors over a real Unix socket pair. The end-to-end tests
run an embedded cluster's worker processes, check each step against a witness env
whose every pixel says which env, episode and step it is, look for the mapped window in
the client's own ``/proc/self/maps``, and SIGKILL a worker under stepping.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from daskvec.protocol.messages import StepReply, StepRequest
from daskvec.transport import ProtocolError, decode, encode
from daskvec.transport.window import SEALS, WINDOW_MIN_BYTES, WindowReader, WindowWriter, supported
from daskvec.transport.wire import FrameReader, send_frames

pytestmark = pytest.mark.skipif(not supported(), reason="shared windows need memfd_create and SCM_RIGHTS (Linux)")

SHAPE = (128, 128, 3)  # 48 KiB an env: a group of 4 shares its window, a group of 2 does not
HORIZON = 7


def window_maps() -> int:
    """How many mappings of a daskvec window this process holds."""
    with open("/proc/self/maps", encoding="ascii", errors="replace") as f:
        return sum("memfd:daskvec-obs" in line for line in f)


def reply_of(obs: np.ndarray) -> StepReply:
    n = len(obs)
    return StepReply(obs, np.arange(n, dtype=np.float64), np.zeros(n, bool), np.zeros(n, bool))


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    worker, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    client.setblocking(False)
    yield worker, client
    worker.close()
    client.close()


def send(worker: socket.socket, reply: StepReply, writer: WindowWriter) -> int:
    """Send ``reply`` as a group's server does; return the bytes that crossed the socket."""
    frames = encode(reply, writer)
    fd = writer.take_fd()
    try:
        send_frames(worker, frames, () if fd is None else (fd,))
    finally:
        if fd is not None:
            os.close(fd)
    return sum(memoryview(f).nbytes for f in frames)


def receive(reader: FrameReader, window: WindowReader) -> tuple[StepReply, int]:
    """Read a reply as ``DirectChannel.recv`` does; return it and how many descriptors came with it."""
    frames = reader.read(5.0)
    passed = len(reader.fds)
    if passed:
        window.adopt(reader.fds)  # as the channel does: emptied as its descriptors are closed
    assert not reader.has_fds
    return decode(frames, window), passed


def test_observations_cross_in_the_window_and_only_a_new_window_passes_a_descriptor(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    worker, client = pair
    writer, window, reader = WindowWriter(), WindowReader(), FrameReader(client, fds=True)
    rng = np.random.default_rng(0)
    big = rng.integers(0, 255, size=(4, *SHAPE), dtype=np.uint8)
    assert big.nbytes >= WINDOW_MIN_BYTES
    sent = send(worker, reply_of(big), writer)
    got, fds = receive(reader, window)
    assert fds == 1 and sent < 1024  # the observations did not cross the socket
    assert np.array_equal(got.obs, big) and not got.obs.flags.writeable
    assert np.array_equal(got.rewards, np.arange(4))
    # the same window serves the next replies: no descriptor, the new contents
    for k in range(3):
        nxt = (big + k + 1).astype(np.uint8)
        send(worker, reply_of(nxt), writer)
        got, fds = receive(reader, window)
        assert fds == 0 and np.array_equal(got.obs, nxt)
    # a larger batch makes a larger window, passed with its reply
    larger = rng.integers(0, 255, size=(8, *SHAPE), dtype=np.uint8)
    send(worker, reply_of(larger), writer)
    got, fds = receive(reader, window)
    assert fds == 1 and np.array_equal(got.obs, larger)
    # a small batch stays on the socket, whatever the window
    small = rng.integers(0, 255, size=(2, 8, 8), dtype=np.uint8)
    assert send(worker, reply_of(small), writer) > small.nbytes
    got, fds = receive(reader, window)
    assert fds == 0 and np.array_equal(got.obs, small) and got.obs.flags.writeable
    writer.close()
    # the client's mapping outlives the group's side: the memory goes with the last mapping
    assert window_maps() == 1
    window.close()
    del got
    gc.collect()
    assert window_maps() == 0


def test_an_array_in_a_window_that_is_missing_or_too_small_is_a_protocol_error(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    worker, client = pair
    writer, reader = WindowWriter(), FrameReader(client, fds=True)
    big = np.ones((4, *SHAPE), dtype=np.uint8)
    send(worker, reply_of(big), writer)
    frames = reader.read(5.0)
    fds = reader.take_fds()
    with pytest.raises(ProtocolError, match="shared window where none can be"):
        decode(frames)  # a channel that has no window (TCP, the actor channel)
    with pytest.raises(ProtocolError, match="none was shared"):
        decode(frames, WindowReader())
    too_small = WindowReader()
    too_small.adopt([sealed_memfd(4096)])
    with pytest.raises(ProtocolError, match="in a window of 4096"):
        decode(frames, too_small)
    right = WindowReader()
    right.adopt(fds)
    assert np.array_equal(decode(frames, right).obs, big)
    writer.close()


def open_memfds(name: str) -> int:
    """How many of this process's descriptors are memory files called ``name`` (other threads' files do not count)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith(f"/memfd:{name} ")
        except OSError:  # closed meanwhile
            continue
    return count


def sealed_memfd(size: int) -> int:
    fd = os.memfd_create("test", os.MFD_ALLOW_SEALING)
    os.ftruncate(fd, size)
    fcntl.fcntl(fd, fcntl.F_ADD_SEALS, SEALS)
    return fd


def test_a_window_is_sealed_at_its_size_and_an_unsealed_one_is_refused(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """A peer that could shrink the file under the client's mapping would kill it with SIGBUS."""
    writer = WindowWriter()
    assert writer.put(np.ones((4, *SHAPE), dtype=np.uint8))
    fd = writer.take_fd()
    assert fd is not None
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)
        writer.close()
    unsealed = os.memfd_create("test")
    os.ftruncate(unsealed, 1 << 20)
    with pytest.raises(ValueError, match="not a memory file sealed at its size"):
        WindowReader().adopt([unsealed])
    with pytest.raises(OSError):
        os.fstat(unsealed)  # closed all the same
    # through a channel: the hostile reply is a ProtocolError, nothing is mapped
    worker, client = pair
    reader = FrameReader(client, fds=True)
    frames = encode(reply_of(np.zeros((2, 4), dtype=np.uint8)))
    unsealed = os.memfd_create("test")
    send_frames(worker, frames, (unsealed,))
    os.close(unsealed)
    reader.read(5.0)
    window = WindowReader()
    with pytest.raises(ValueError):
        window.adopt(reader.take_fds())
    assert not window.mapped


def test_more_than_one_descriptor_with_a_message_is_refused(pair: tuple[socket.socket, socket.socket]) -> None:
    worker, client = pair
    reader = FrameReader(client, fds=True)
    fds = [sealed_memfd(4096) for _ in range(3)]
    send_frames(worker, encode(reply_of(np.zeros((2, 4), dtype=np.uint8))), fds)
    assert open_memfds("test") == 3  # ours; the ones in flight are the kernel's
    with pytest.raises(ProtocolError, match="more than one descriptor"):
        reader.read(5.0)
    assert reader.take_fds() == []
    assert open_memfds("test") == 3  # the ones received are closed
    for fd in fds:
        os.close(fd)


def test_a_window_that_cannot_be_made_leaves_the_observations_on_the_socket(
    pair: tuple[socket.socket, socket.socket], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_more_descriptors(*args: Any) -> int:
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(os, "memfd_create", no_more_descriptors)
    worker, client = pair
    writer, window, reader = WindowWriter(), WindowReader(), FrameReader(client, fds=True)
    big = np.arange(4 * int(np.prod(SHAPE)), dtype=np.uint32).astype(np.uint8).reshape(4, *SHAPE)
    for _ in range(2):
        assert send(worker, reply_of(big), writer) > big.nbytes  # on the socket
        got, fds = receive(reader, window)
        assert fds == 0 and np.array_equal(got.obs, big)
    assert writer.failed and not window.mapped
    assert sum("no shared window" in r.getMessage() for r in caplog.records) == 1  # logged once


def test_descriptors_never_taken_are_closed(pair: tuple[socket.socket, socket.socket]) -> None:
    worker, client = pair
    writer, reader = WindowWriter(), FrameReader(client, fds=True)
    send(worker, reply_of(np.ones((4, *SHAPE), dtype=np.uint8)), writer)
    reader.read(5.0)
    (fd,) = reader._fds
    os.fstat(fd)  # open
    reader.close()
    with pytest.raises(OSError):
        os.fstat(fd)
    writer.close()


def open_descriptors_of(inode: int) -> int:
    """How many of this process's descriptors refer to the file with ``inode``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.stat(f"/proc/self/fd/{fd}").st_ino == inode
        except OSError:  # closed meanwhile
            continue
    return count


def test_a_channel_interrupted_while_taking_a_window_leaks_no_descriptor(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ctrl-C between reading a reply and mapping its window leaves the descriptor with the
    reader, which closes it with the channel (it was lost when the channel took a copy)."""
    from daskvec.transport import ChannelServer, DirectChannel

    token = b"t" * 32
    name = f"interrupted-{uuid.uuid4().hex[:8]}"
    server = ChannelServer(
        "127.0.0.1", token, lambda request: reply_of(np.ones((4, *SHAPE), np.uint8)), name=name, shared_memory=True
    )
    inodes = []

    def interrupt(self: WindowReader, fds: list[int]) -> None:
        inodes.append(os.fstat(fds[-1]).st_ino)
        raise KeyboardInterrupt

    try:
        assert server.unix_path is not None
        ch = DirectChannel(server.unix_path, token)
        monkeypatch.setattr(WindowReader, "adopt", interrupt)
        ch.send(StepRequest(np.zeros(4, np.int64)))
        with pytest.raises(KeyboardInterrupt):
            ch.recv(10)
        serving = [t for t in threading.enumerate() if t.name == f"{name}-conn"]
        assert len(serving) == 1, serving
        ch.close()
    finally:
        server.close()
    # The server, in this process too, holds the window until its connection thread ends: the
    # descriptor it passed (closed once the send returns) and its mapping's. On a loaded machine
    # that thread may run seconds later, so wait for it to end, not for a fixed time; then
    # every descriptor of the window must be gone, the client's first of all.
    serving[0].join()  # bounded by the test's timeout
    assert open_descriptors_of(inodes[0]) == 0, "the window's descriptor outlived the channel"


# ------------------------------------------------------------------ end to end
class PixelWitness(gym.Env[np.ndarray, int]):
    """Every pixel is ``(index, episode, step)``-derived: a stale, shifted or foreign row shows."""

    def __init__(self, index: int) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=SHAPE, dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(2)
        self.index, self.episode, self.t = index, -1, 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        return expected(self.index, self.episode, self.t), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        return expected(self.index, self.episode, self.t), float(action), False, self.t >= HORIZON, {}


def expected(index: int, episode: int, t: int) -> np.ndarray:
    obs = np.empty(SHAPE, dtype=np.uint8)
    obs[..., 0], obs[..., 1], obs[..., 2] = index, episode % 256, t
    obs[0, 0, 0] = (index * 31 + episode * 7 + t) % 256  # one odd pixel: the whole array is compared
    return obs


def factory(i: int) -> Any:
    return lambda: PixelWitness(i)


def check(obs: np.ndarray, dones: np.ndarray, infos: list[dict], last: list[tuple[int, int]]) -> None:
    """Each env's row is its next step, or after an end (a truncation or a rebuild) a first observation."""
    for i, row in enumerate(obs):
        episode, t = int(row[1, 1, 1]), int(row[1, 1, 2])
        if dones[i]:
            assert t == 0, f"env {i}: an episode ended but the row is step {t}"
            final = infos[i]["terminal_observation"]
            assert int(final[1, 1, 0]) == i and int(final[1, 1, 1]) == last[i][0] % 256
        else:
            assert (episode, t) == (last[i][0] % 256, last[i][1] + 1), f"env {i}: {(episode, t)} after {last[i]}"
        assert np.array_equal(row, expected(i, episode, t)), f"env {i}: a row that is not its own"
        last[i] = (episode, t)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as c,
    ):
        yield c


def set_shared_memory(value: bool) -> bool:
    import dask

    dask.config.set({"daskvec.shared-memory": value})
    return value


@pytest.mark.processes
def test_sb3_face_steps_through_the_window_and_survives_a_killed_worker(client: Any) -> None:
    from daskvec import DaskVecEnv

    n = 8  # two groups of 4, each 192 KiB of observations a step
    env = DaskVecEnv([factory(i) for i in range(n)], client=client, step_timeout=30)
    try:
        obs = env.reset()
        last = [(0, 0)] * n
        assert all(np.array_equal(obs[i], expected(i, 0, 0)) for i in range(n))
        for _ in range(3 * HORIZON):
            obs, _, dones, infos = env.step(np.zeros(n, dtype=np.int64))
            check(obs, dones, infos, last)
        assert window_maps() == 2, "each group on this machine shares one window"
        assert [g["shared_memory"] for g in env.groups] == [True, True]
        victim = env.groups[0]["worker"]
        pid = client.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        marked: set[int] = set()
        for _ in range(4 * HORIZON):
            obs, _, dones, infos = env.step(np.zeros(n, dtype=np.int64))
            marked |= {i for i, info in enumerate(infos) if "daskvec" in info}
            check(obs, dones, infos, last)
        lost = {entry["env"] for entry in env.restart_log}
        assert len(lost) == 4 and marked == lost, "the killed worker's 4 envs were rebuilt, each reported once"
        assert env.restart_counts.sum() == 4
        # the rebuilt group shares a window of its own; the lost one's mapping is gone
        gc.collect()
        assert window_maps() == 2
    finally:
        env.close()
    gc.collect()
    assert window_maps() == 0, "close() leaves no window mapped"


def test_gymnasium_face_and_the_worker_config_that_turns_it_off(client: Any) -> None:
    from daskvec import DaskVectorEnv

    n = 8
    try:
        for shared in (True, False):
            client.run(set_shared_memory, shared)
            vec = DaskVectorEnv([factory(i) for i in range(n)], client=client)
            sync = gym.vector.SyncVectorEnv([factory(i) for i in range(n)])
            try:
                a, _ = vec.reset(seed=1)
                b, _ = sync.reset(seed=1)
                assert np.array_equal(a, b)
                for _ in range(2 * HORIZON):
                    a = vec.step(np.zeros(n, dtype=np.int64))
                    b = sync.step(np.zeros(n, dtype=np.int64))
                    assert np.array_equal(a[0], b[0]) and np.array_equal(a[3], b[3])
                assert window_maps() == (2 if shared else 0)
                assert [g["shared_memory"] for g in vec.groups] == [shared, shared]
            finally:
                vec.close()
                sync.close()
            gc.collect()
    finally:
        client.run(set_shared_memory, True)


def test_a_group_shares_no_window_unless_its_client_said_it_can_read_one() -> None:
    """A spec without the client's word (an older daskvec's) gets no window: that client could not map it."""
    import cloudpickle

    from daskvec.protocol.messages import Command, GroupSpec
    from daskvec.transport import DirectChannel
    from daskvec.worker import EnvGroup

    token = os.urandom(32)
    factories = cloudpickle.dumps([factory(i) for i in range(4)])
    for asked, shared in ((False, False), (None, True)):
        group = EnvGroup(factories, GroupSpec((0, 1, 2, 3), token=token, shared_memory=asked), worker_address="test")
        try:
            channel = DirectChannel(group.describe().unix_path, token)
            channel.send((Command.RESET, ([0, 1, 2, 3], [{}] * 4)))
            channel.recv(10)
            channel.send(StepRequest(np.zeros(4, dtype=np.int64)))
            reply = channel.recv(10)
            assert np.array_equal(reply.obs[2], expected(2, 0, 1))
            assert channel.shared_memory is shared
            channel.close()
        finally:
            group.shutdown()
    assert GroupSpec((0,)).shared_memory is False


def test_a_worker_config_that_is_not_a_bool_is_named(client: Any) -> None:
    from daskvec import DaskVecEnv

    client.run(set_shared_memory, "yes")
    try:
        with pytest.raises(Exception, match=r"daskvec.shared-memory on worker .* must be true or false, not 'yes'"):
            DaskVecEnv([factory(i) for i in range(2)], client=client, timeout=30)
    finally:
        client.run(set_shared_memory, True)


def test_the_benchmark_alternates_the_window_on_and_off() -> None:
    pytest.importorskip("envpool")
    from benchmarks import shared_window

    result = shared_window.run("envpool", rounds=2, seconds=0.2, threshold=WINDOW_MIN_BYTES)
    assert [row["round"] for row in result["rounds"]] == [0, 1]
    for row in result["rounds"]:
        assert row["on"] > 0 and row["off"] > 0 and row["ratio"] == row["on"] / row["off"]
    assert result["median_ratio"] == (result["rounds"][0]["ratio"] + result["rounds"][1]["ratio"]) / 2
