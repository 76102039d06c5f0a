"""Security: DaskVecEnv on a TLS-secured cluster, and strangers on the direct channel."""

from __future__ import annotations

import functools
import os
import pickle
import socket
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv

from daskvec import DaskVecEnv
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
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, protocol="tls", security=security,
                      dashboard_address=":0", silence_logs=40) as cluster:
        yield cluster


@pytest.mark.timeout(180)
def test_daskvec_end_to_end_on_a_tls_cluster(tls_cluster: Any) -> None:
    from stable_baselines3 import PPO

    assert tls_cluster.scheduler_address.startswith("tls://")
    with DaskVecEnv([cartpole] * 4, client=tls_cluster, timeout=60) as env:
        # the direct channel is not encrypted: on TLS every group uses Dask's (encrypted) actor calls
        assert env.transport == "actor"
        assert {g["transport"] for g in env.groups} == {"actor"}
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


def test_direct_transport_is_refused_on_tls(tls_cluster: Any) -> None:
    with pytest.raises(ValueError, match=r"transport='direct' is not available on a TLS-secured cluster"):
        DaskVecEnv([cartpole] * 2, client=tls_cluster, transport="direct", timeout=60)


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

    with DaskVecEnv([functools.partial(CountingEnv, horizon=5)] * 2, client=client2, transport="direct",
                    envs_per_actor=2, timeout=60, env_process=env_process) as env:
        (group,) = env._groups
        desc = group.desc
        address = tuple(desc["address"]) if sock == "tcp" else desc["unix_path"]
        if sock == "unix":  # only this user may even reach the socket
            assert stat.S_IMODE(os.stat(os.path.dirname(address)).st_mode) == 0o700
        # with env_process, the channel is the env process's and the actor forwards the count
        assert ("env_pid" in desc) == env_process  # only an EnvHost reports a separate env process
        refused_before = group.actor.refused_connections().result(timeout=30)
        request = ("step", ([evil, evil],))
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
