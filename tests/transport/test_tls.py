"""Security: DaskVecEnv on a TLS-secured cluster, and strangers on the direct channel."""

from __future__ import annotations

import functools
import logging
import os
import pickle
import socket
import ssl
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv
from wire_frames import check_channel

from daskvec import DaskVecEnv
from daskvec.protocol.messages import StepRequest
from daskvec.transport import encode

pytest.importorskip("cryptography")  # Security.temporary() makes its certificates with it


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[Any]:
    """A 2-process LocalCluster whose scheduler, workers and clients all speak TLS."""
    from distributed import LocalCluster
    from distributed.security import Security

    security = Security.temporary()
    with LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        protocol="tls",
        security=security,
        dashboard_address=":0",
        silence_logs=40,
    ) as cluster:
        yield cluster


@pytest.mark.timeout(180)
def test_daskvec_end_to_end_on_a_tls_cluster(tls_cluster: Any) -> None:
    from stable_baselines3 import PPO

    assert tls_cluster.scheduler_address.startswith("tls://")
    with DaskVecEnv([cartpole] * 4, client=tls_cluster, timeout=60) as env:
        # transport="auto" on TLS: the direct channel, itself TLS with the cluster's certificates
        assert env.encrypted and env.transport == "auto"
        assert {(g["transport"], g["socket"]) for g in env.groups} == {("direct", "tls")}
        for g in env._groups:
            assert isinstance(g.channel._sock, ssl.SSLSocket)
            assert g.desc.tls and g.desc.unix_path is None  # no plaintext socket at all
        assert len({g["worker"] for g in env.groups}) == 2
        assert all(g["worker"].startswith("tls://") for g in env.groups)
        env.seed(3)
        obs = env.reset()
        assert obs.shape == (4, 4)
        obs, rews, _, infos = env.step(np.zeros(4, dtype=np.int64))
        assert rews.tolist() == [1.0] * 4 and len(infos) == 4
        assert env.get_attr("spec")[0].id == "CartPole-v1"
        model = PPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1, device="cpu", seed=0)
        model.learn(4 * 32 * 2)
        assert model.num_timesteps == 4 * 32 * 2


@pytest.mark.timeout(120)
@pytest.mark.processes
def test_transport_choices_on_tls(tls_cluster: Any, caplog: pytest.LogCaptureFixture) -> None:
    with DaskVecEnv([cartpole] * 2, client=tls_cluster, transport="direct", timeout=60) as env:
        assert env.encrypted and {(g["transport"], g["socket"]) for g in env.groups} == {("direct", "tls")}
        html = env._repr_html_()
        for g in env.groups:  # where each channel goes, and that it is encrypted, for env.groups and the notebook
            check_channel(g)
            assert g["encrypted"] and g["socket_path"] is None and g["channel"] == g["address"], g
            assert f"{g['channel']} (encrypted)" in html
    # envs in a process of their own: that process serves the TLS channel with the worker's certificate
    with DaskVecEnv([cartpole] * 2, client=tls_cluster, env_process=True, timeout=60) as env:
        assert env.encrypted and {(g["transport"], g["socket"]) for g in env.groups} == {("direct", "tls")}
        assert all(g["env_pid"] != g["pid"] for g in env.groups)
        env.reset()
        assert env.step(np.zeros(2, dtype=np.int64))[1].tolist() == [1.0, 1.0]
    with DaskVecEnv([cartpole] * 2, client=tls_cluster, transport="actor", timeout=60) as env:
        assert not env.encrypted and {g["transport"] for g in env.groups} == {"actor"}
        for g in env.groups:  # no channel of daskvec's own; Dask's comms are TLS on this cluster
            check_channel(g)
            assert g["encrypted"] and g["channel"] is None, g
        env.reset()
    with (
        caplog.at_level(logging.WARNING, logger="daskvec"),
        DaskVecEnv([cartpole] * 2, client=tls_cluster, transport="direct-insecure", timeout=60) as env,
    ):
        assert not env.encrypted
        assert {(g["transport"], g["socket"]) for g in env.groups} <= {("direct", "unix"), ("direct", "tcp")}
        for g in env.groups:
            check_channel(g)
            assert not g["encrypted"], g
        env.reset()
    assert any("UNENCRYPTED" in r.getMessage() for r in caplog.records)


class _CreateFile:
    """A pickle that, if anyone ever unpickled it, would create a file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.path, "w"))


def _connect(address: tuple[str, int] | str) -> socket.socket:
    if isinstance(address, str):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(30)
        sock.connect(address)
        return sock
    return socket.create_connection(address, timeout=30)


def _talk(address: tuple[str, int] | str, payload: list[bytes | memoryview], read_nonce: bool) -> bytes:
    """Connect as a stranger, send ``payload`` and return everything the server sends back."""
    got = b""
    with _connect(address) as sock:
        if read_nonce:
            got += sock.recv(32)
        for frame in payload:
            try:
                sock.sendall(frame)
            except OSError:  # refused before we finished: that is the point
                break
        try:
            sock.shutdown(socket.SHUT_WR)
            while chunk := sock.recv(4096):
                got += chunk
        except OSError:  # the server dropped us (reset, or already gone) with our bytes unread
            pass
    return got


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("sock", "env_process"),
    [("tcp", False), ("unix", False), ("tcp", True)],
    ids=["tcp", "unix", "tcp-env-process"],
)
def test_stranger_on_the_direct_channel_is_refused(client2: Any, tmp_path: Path, sock: str, env_process: bool) -> None:
    target = tmp_path / "pwned"
    evil = _CreateFile(str(target))
    # sanity: this pickle really creates the file when loaded
    pickle.loads(pickle.dumps(evil)).close()
    assert target.exists()
    target.unlink()

    with DaskVecEnv(
        [functools.partial(CountingEnv, horizon=5)] * 2,
        client=client2,
        transport="direct",
        envs_per_actor=2,
        timeout=60,
        env_process=env_process,
    ) as env:
        (group,) = env._groups
        desc = group.desc
        address = tuple(desc.address) if sock == "tcp" else desc.unix_path
        if sock == "unix":  # only this user may even reach the socket
            assert stat.S_IMODE(os.stat(os.path.dirname(address)).st_mode) == 0o700
        # with env_process, the channel is the env process's and the actor forwards the count
        assert (desc.env_pid is not None) == env_process  # only an EnvHost reports a separate env process
        refused_before = group.actor.refused_connections().result(timeout=30)
        request = StepRequest([evil, evil])
        # 1: a well-formed request straight away, as if the handshake did not exist
        _talk(address, encode(request), read_nonce=False)
        # 2: read the challenge, then answer it with a request instead of a proof
        reply = _talk(address, encode(request), read_nonce=True)
        assert len(reply) == 32  # only the server's nonce: no proof, no reply to the request
        # 3: a wrong proof of the right length, followed by the request
        _talk(address, [b"\0" * 64, *encode(request)], read_nonce=True)
        assert group.actor.refused_connections().result(timeout=30) == refused_before + 3
        assert not target.exists(), "a pickle sent by an unauthenticated peer was executed"
        # the group itself is unharmed and still answers its own client
        env.reset()
        obs, _, _, _ = env.step(np.ones(2, dtype=np.int64))
        assert obs[:, 0].tolist() == [1.0, 1.0]


def _tls_talk(address: tuple[str, int], context: ssl.SSLContext, payload: list[bytes | memoryview]) -> bytes:
    """Connect over TLS with ``context``, send ``payload`` raw and return what comes back (b"" if refused)."""
    got = b""
    with socket.create_connection(address, timeout=30) as raw:
        try:
            with context.wrap_socket(raw) as sock:
                got += sock.recv(32)  # the token challenge, once TLS is through
                for frame in payload:
                    sock.sendall(frame)
                while chunk := sock.recv(4096):
                    got += chunk
        except (ssl.SSLError, OSError):  # the server ended TLS or the connection: refused
            pass
    return got


@pytest.mark.timeout(120)
def test_strangers_and_plaintext_clients_are_refused_by_the_tls_channel(tls_cluster: Any, tmp_path: Path) -> None:
    target = tmp_path / "pwned"
    request = StepRequest([_CreateFile(str(target))] * 2)
    with DaskVecEnv(
        [functools.partial(CountingEnv, horizon=5)] * 2, client=tls_cluster, envs_per_actor=2, timeout=60
    ) as env:
        (group,) = env._groups
        address = tuple(group.desc.address)
        assert env.encrypted and group.desc.unix_path is None
        before = group.actor.refused_connections().result(timeout=30)
        # 1: a plaintext client sending a request (a pickle that would create a file)
        assert _talk(address, encode(request), read_nonce=False) == b""
        # 2: TLS, but without a certificate of the cluster (mutual TLS refuses it)
        no_cert = ssl.create_default_context()
        no_cert.check_hostname, no_cert.verify_mode = False, ssl.CERT_NONE
        assert _tls_talk(address, no_cert, encode(request)) == b""
        # 3: the cluster's own certificate, but not the token: only the challenge comes back
        cluster_ctx = tls_cluster.security.get_connection_args("client")["ssl_context"]
        reply = _tls_talk(address, cluster_ctx, [b"\0" * 64, *encode(request)])
        assert len(reply) == 32
        assert group.actor.refused_connections().result(timeout=30) == before + 3
        assert not target.exists(), "a pickle sent by an unauthenticated peer was executed"
        env.reset()
        obs, _, _, _ = env.step(np.ones(2, dtype=np.int64))
        assert obs[:, 0].tolist() == [1.0, 1.0]


def test_tls_channel_server_refuses_and_logs_plaintext_and_foreign_certificates(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """In one process: each failed TLS handshake is a clear client error and a refusal line on the server."""
    from distributed.security import Security

    from daskvec.transport import ChannelError, ChannelServer, DirectChannel

    cluster, foreign = Security.temporary(), Security.temporary()  # two CAs
    token = b"t" * 32
    server = ChannelServer(
        "127.0.0.1",
        token,
        lambda r: ("ok", r),
        name="tls-test",
        unix_dir=None,
        ssl_context=cluster.get_listen_args("worker")["ssl_context"],
    )
    try:
        with caplog.at_level(logging.WARNING, logger="daskvec.transport.server"):
            with pytest.raises(ChannelError, match=r"handshake with .* failed"):  # waits for a nonce that never comes
                DirectChannel(server.address, token, connect_timeout=1)
            foreign_ctx = foreign.get_connection_args("client")["ssl_context"]
            with pytest.raises(ChannelError, match=r"TLS handshake with .* failed: .*certificate verify failed"):
                DirectChannel(server.address, token, connect_timeout=10, ssl_context=foreign_ctx)
            ok = DirectChannel(
                server.address,
                token,
                connect_timeout=10,
                ssl_context=cluster.get_connection_args("client")["ssl_context"],
            )
            ok.send("ping")
            assert ok.recv(10) == ("ok", "ping") and ok.family == "tls"
            ok.close()
        refusals = [r.getMessage() for r in caplog.records if "refused a peer" in r.getMessage()]
        assert len(refusals) == 1 and "TLS handshake failed" in refusals[0]  # the second is rate-limited
        deadline = time.monotonic() + 10  # the server counts the second one on its own thread
        while server.refused < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.refused == 2
    finally:
        server.close()


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_the_tls_benchmark_measures_what_it_says() -> None:
    """``daskvec bench --tls``: each kind on the transport its name says (figures are not checked)."""
    from benchmarks.tls import KINDS, format_tls_table, run_tls_benchmark

    result = run_tls_benchmark(n_envs=2, seconds=0.2, warmup=0.05, rounds=2, n_workers=1)
    got = result["results"]
    assert list(got) == list(KINDS), got
    assert {k: (r["transport"], r["encrypted"]) for k, r in got.items()} == {
        "encrypted": ("direct/tls x1", True),
        "actor": ("actor x1", False),
        "plaintext": ("direct/unix x1", False),
        "plaintext-tcp": ("direct/tcp x1", False),
    }
    assert all(r["vec_steps"] > 0 and r["env_steps_per_s"] > 0 for r in got.values())
    assert set(result["ratios"]) == {"encrypted/actor", "encrypted/plaintext", "encrypted/plaintext-tcp"}
    table = format_tls_table(result)
    assert all(kind in table for kind in KINDS) and "encrypted/actor:" in table
