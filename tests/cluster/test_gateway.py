"""DaskVecEnv on a real dask-gateway: a gateway server with its proxy, a cluster made through it.

The gateway runs as its own process (``python -m dask_gateway_server``) with the local
backend, which starts each cluster's scheduler and workers as local processes with the
cluster's own TLS certificate; the client reaches the scheduler through the gateway's
proxy at a ``gateway://`` address, as on JupyterHub or Pangeo deployments.
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from daskvec import DaskVecEnv

#: Every test here starts processes (scripts, `dask` commands, clusters).
pytestmark = pytest.mark.processes

gateway_server = pytest.importorskip("dask_gateway_server")
dask_gateway = pytest.importorskip("dask_gateway")

PROXY = Path(gateway_server.__file__).parent / "proxy" / "dask-gateway-proxy"


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _config(api_port: int, proxy_port: int) -> str:
    python = sys.executable
    return f"""
c.DaskGateway.address = "127.0.0.1:{api_port}"
c.Proxy.address = "127.0.0.1:{proxy_port}"
c.DaskGateway.backend_class = "dask_gateway_server.backends.local.UnsafeLocalBackend"
c.DaskGateway.authenticator_class = "dask_gateway_server.auth.SimpleAuthenticator"
c.LocalClusterConfig.scheduler_cmd = [{python!r}, "-m", "distributed.cli.dask_scheduler"]
c.LocalClusterConfig.worker_cmd = [{python!r}, "-m", "distributed.cli.dask_worker"]
c.LocalClusterConfig.worker_threads = 1
c.LocalClusterConfig.worker_memory = "1 G"
c.LocalClusterConfig.environment = {{"DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED": "False", "OMP_NUM_THREADS": "1"}}
"""


def _close_for_good(gateway: Any) -> None:
    """Close a dask_gateway ``Gateway`` so that its ``__del__`` does not close it again.

    dask-gateway's ``__del__`` closes the client once more and, with this distributed, then
    touches the stopped event loop and raises during some later test's garbage collection.
    """
    gateway.close()
    with contextlib.suppress(AttributeError):
        del gateway._loop_runner  # __del__ closes only while this is there


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A running gateway server and a ``dask_gateway.Gateway`` client of it."""
    if not PROXY.exists():
        pytest.skip(f"dask-gateway-server ships no proxy binary here ({PROXY})")
    work = tmp_path_factory.mktemp("gateway")
    api_port, proxy_port = _free_port(), _free_port()
    (work / "dask_gateway_config.py").write_text(_config(api_port, proxy_port))
    log = work / "gateway.log"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "dask_gateway_server", "-f", "dask_gateway_config.py"],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    address = f"http://127.0.0.1:{proxy_port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{address}/api/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log.read_text(errors="replace")[-2000:]
                pytest.skip(f"the dask-gateway server did not start (exit {proc.poll()}): {tail}")
            time.sleep(0.3)
        client = dask_gateway.Gateway(address, auth=dask_gateway.BasicAuth("daskvec"))
        try:
            yield client
        finally:
            _close_for_good(client)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.mark.timeout(300)
def test_daskvec_on_a_dask_gateway_cluster(gateway: Any) -> None:
    from stable_baselines3 import PPO

    cluster = gateway.new_cluster()
    try:
        cluster.scale(2)
        with cluster.get_client(set_as_default=False) as client:
            client.wait_for_workers(2, timeout=120)
            assert client.scheduler.address.startswith("gateway://")
            with DaskVecEnv([cartpole] * 4, client=client, timeout=120) as env:
                # detected as secured: the direct channel is TLS with the cluster's certificate
                assert env.encrypted
                assert {(g["transport"], g["socket"]) for g in env.groups} == {("direct", "tls")}
                for g in env._groups:
                    assert isinstance(g.channel._sock, ssl.SSLSocket)
                    # a plaintext connection to the channel gets nothing, not even the token challenge
                    with socket.create_connection(tuple(g.desc.address), timeout=30) as plain:
                        plain.sendall(b"\0" * 64)
                        plain.settimeout(30)
                        with contextlib.suppress(ConnectionResetError):  # a reset is a refusal too
                            assert plain.recv(64) == b""
                model = PPO("MlpPolicy", env, n_steps=256, batch_size=256, n_epochs=1, device="cpu", seed=0)
                model.learn(2048)
                assert model.num_timesteps == 2048
                assert np.isfinite(env.step(np.zeros(4, dtype=np.int64))[1]).all()
    finally:
        cluster.shutdown()  # also closes the cluster's own Gateway client
        with contextlib.suppress(AttributeError):
            del cluster.gateway._loop_runner  # see _close_for_good
