"""What counts as a secured cluster, plain mistakes with clear errors, and bad env factories.

Detection is asked of a stand-in client for the cases no cluster here can be (a
``gateway://`` address, TLS workers behind a plain-looking scheduler address), with the
real ``distributed.security.Security`` class, and of a real plain cluster. The bad
factories run on real worker processes: one hangs, one ends its process.
"""

from __future__ import annotations

import functools
import logging
import os
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import psutil
import pytest
from waiting import wait_until

from daskvec import DaskVecEnv
from daskvec._core import dask_internals as _dask
from daskvec._core.options import TRANSPORTS, Options
from daskvec.cluster.clients import choose_transport, client_ssl_context, security_reasons, uses_tls
from daskvec.errors import EnvBuildError, EnvBuildTimeoutError


def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def stand_in(scheduler: str, security: Any) -> Any:
    """What detection reads of a client: its scheduler's address and its security object."""
    return SimpleNamespace(scheduler=SimpleNamespace(address=scheduler), security=security)


class GatewayLikeSecurity:
    """Says it is encrypted only through ``get_connection_args``, as dask-gateway's does."""

    def get_connection_args(self, role: str) -> dict[str, Any]:
        return {"ssl_context": ssl.create_default_context(), "require_encryption": True}


class BrokenSecurity:
    def get_connection_args(self, role: str) -> dict[str, Any]:
        raise RuntimeError("certificate file missing")


# --------------------------------------------------------------------------- detection
def test_plain_tcp_is_not_secured(client2: Any) -> None:
    assert security_reasons(client2) == []
    assert not uses_tls(client2)


def test_tls_scheduler_address_is_secured() -> None:
    from distributed.security import Security

    reasons = security_reasons(stand_in("tls://10.0.0.1:8786", Security()), worker_addresses=[])
    assert reasons == ["scheduler address tls://10.0.0.1:8786"]


def test_tls_workers_behind_a_tcp_looking_scheduler_are_secured(monkeypatch: pytest.MonkeyPatch) -> None:
    from distributed.security import Security

    workers = {"tcp://10.0.0.2:4000": {}, "tls://10.0.0.3:4000": {}, "tls://10.0.0.4:4000": {}}
    monkeypatch.setattr(_dask, "scheduler_workers", lambda client, timeout=30.0: workers)
    reasons = security_reasons(stand_in("tcp://10.0.0.1:8786", Security()))
    assert reasons == ["worker address tls://10.0.0.3:4000 and 1 more"]


def test_gateway_address_and_gateway_security_are_secured() -> None:
    reasons = security_reasons(stand_in("gateway://proxy:443/cluster-1", GatewayLikeSecurity()), worker_addresses=[])
    assert reasons == [
        "scheduler address gateway://proxy:443/cluster-1",
        "GatewayLikeSecurity has a TLS context",
        "GatewayLikeSecurity requires encryption",
    ]
    # any scheme other than tcp and inproc counts, even one daskvec has never heard of
    assert security_reasons(stand_in("wss://somewhere:443", None), worker_addresses=[])


def test_require_encryption_is_secured() -> None:
    from distributed.security import Security

    reasons = security_reasons(stand_in("tcp://10.0.0.1:8786", Security(require_encryption=True)), [])
    assert reasons == ["Security requires encryption"]


def test_a_security_object_that_cannot_be_asked_counts_as_secured() -> None:
    reasons = security_reasons(stand_in("tcp://10.0.0.1:8786", BrokenSecurity()), worker_addresses=[])
    assert len(reasons) == 1 and "could not be asked" in reasons[0] and "certificate file missing" in reasons[0]


# --------------------------------------------------------------------------- the transport chosen
class ContextOnly:
    """A security object with a client TLS context (what a TLS cluster's client has)."""

    def get_connection_args(self, role: str) -> dict[str, Any]:
        return {"ssl_context": ssl.create_default_context(), "require_encryption": False}


@pytest.fixture
def clusters(monkeypatch: pytest.MonkeyPatch) -> dict[str, tuple[Any, str]]:
    """Stand-in clients, ``{name: (client, kind)}``, kind ``"plain"``, ``"context"`` or ``"no-context"``.

    ``"context"``: a secured cluster whose client has a TLS context; ``"no-context"``: a
    secured cluster whose client has none. The scheduler's worker list is each one's own.
    """
    from distributed.security import Security

    tls, tcp = ["tls://10.0.0.2:4000"], ["tcp://10.0.0.2:4000"]
    table = {
        "plain": ("tcp://10.0.0.1:8786", Security(), tcp, "plain"),
        "tls-scheduler-with-context": ("tls://10.0.0.1:8786", ContextOnly(), tls, "context"),
        "gateway-with-context": ("gateway://proxy:443/c", GatewayLikeSecurity(), tls, "context"),
        "tls-scheduler-no-context": ("tls://10.0.0.1:8786", Security(), tls, "no-context"),
        "tls-workers-no-context": ("tcp://10.0.0.1:8786", Security(), tls, "no-context"),
        "require-encryption-no-context": ("tcp://10.0.0.1:8786", Security(require_encryption=True), tcp, "no-context"),
        "unaskable-security": ("tcp://10.0.0.1:8786", BrokenSecurity(), tcp, "no-context"),
        "no-security-object": ("wss://somewhere:443", None, tcp, "no-context"),
    }
    clients = {name: (stand_in(address, security), kind) for name, (address, security, _, kind) in table.items()}
    workers = {id(clients[name][0]): addresses for name, (_, _, addresses, _) in table.items()}
    monkeypatch.setattr(_dask, "scheduler_workers", lambda client, timeout=30.0: {w: {} for w in workers[id(client)]})
    return clients


def test_secured_cluster_without_a_client_tls_context_uses_actor_calls(clusters: dict[str, tuple[Any, str]]) -> None:
    """``"auto"`` falls back to actor calls, ``"direct"`` says what to pass, ``"actor"`` stays."""
    for name, (client, kind) in clusters.items():
        assert bool(security_reasons(client)) == (kind != "plain"), name
        assert (client_ssl_context(client) is not None) == (kind == "context"), name
        if kind != "no-context":
            continue
        chosen = choose_transport(client, "auto")
        assert chosen == ("actor", False), (
            f"{name}: transport='auto' without a client TLS context must fall back to actor calls, not {chosen}"
        )
        with pytest.raises(ValueError, match=r"transport='direct' needs TLS on this secured cluster .* no TLS context"):
            choose_transport(client, "direct")
        assert choose_transport(client, "actor") == ("actor", False), name


def test_no_transport_choice_is_plaintext_on_a_secured_cluster_unasked(
    clusters: dict[str, tuple[Any, str]], caplog: pytest.LogCaptureFixture
) -> None:
    """Every transport on every kind of cluster: a plain direct channel only on a plain one, or when asked for."""
    for name, (client, kind) in clusters.items():
        for transport in TRANSPORTS:
            where = f"{name} ({kind}), transport={transport!r}"
            caplog.clear()
            try:
                with caplog.at_level(logging.WARNING, logger="daskvec"):
                    chosen, encrypted = choose_transport(client, transport)
            except ValueError:
                assert (kind, transport) == ("no-context", "direct"), f"{where}: unexpected ValueError"
                continue
            assert (kind, transport) != ("no-context", "direct"), f"{where}: no ValueError but {chosen, encrypted}"
            if kind == "plain":
                assert (chosen, encrypted) == (transport, False), where
            elif transport == "direct-insecure":  # asked for: allowed, with a warning
                assert (chosen, encrypted) == ("direct-insecure", False), where
                assert any("UNENCRYPTED" in r.getMessage() for r in caplog.records), f"{where}: no warning"
            else:
                assert chosen == "actor" or encrypted, f"{where}: a plaintext direct channel on a secured cluster"
                expected = (transport, True) if kind == "context" and transport != "actor" else ("actor", False)
                assert (chosen, encrypted) == expected, where


# --------------------------------------------------------------------------- plain mistakes
@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"timeout": "5"}, TypeError, r"timeout must be a number of seconds .* pass timeout=5, not the string '5'"),
        ({"step_timeout": [1]}, TypeError, r"step_timeout must be a number of seconds \(int or float\), not list"),
        (
            {"migrate_before": "2m"},
            TypeError,
            r"migrate_before must be a number of seconds.* pass migrate_before=120, ",
        ),
        ({"timeout": " 30s"}, TypeError, r"pass timeout=30, not the string ' 30s'$"),
        (
            {"worker_wait_timeout": "soon"},
            TypeError,
            r"worker_wait_timeout must be a number of seconds \(int or float\), not str 'soon'$",
        ),
        ({"rebalance_interval": True}, TypeError, r"rebalance_interval must be a number of seconds"),
        ({"timeout": -1}, ValueError, r"timeout must be a positive number of seconds"),
        ({"transport": "tls"}, ValueError, r"transport must be one of .*direct-insecure"),
    ],
)
def test_options_of_the_wrong_type_say_what_to_pass(kwargs: dict[str, Any], error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        Options.create(**kwargs)


def test_tls_address_without_certificates_says_what_to_pass() -> None:
    # no scheduler listens there: the error must come before any connection attempt
    with pytest.raises(ValueError, match=r"TLS address, but no certificates .* security=Security\(tls_ca_file="):
        DaskVecEnv([cartpole], client="tls://127.0.0.1:9", timeout=5)


# --------------------------------------------------------------------------- bad factories
def _wait_for_file(path: str, limit: float = 120.0) -> gym.Env[Any, Any]:
    """A factory that hangs until ``path`` exists (the test releases it at the end)."""
    end = time.monotonic() + limit
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
    return gym.make("CartPole-v1")


def _build_threads() -> int:
    import threading

    return sum(t.name == "daskvec-build" and t.is_alive() for t in threading.enumerate())


def _env_processes() -> int:
    import psutil

    return sum("host_main" in " ".join(p.cmdline()) for p in psutil.Process().children())


@pytest.fixture
def release(tmp_path: Path) -> Iterator[str]:
    flag = str(tmp_path / "release")
    yield flag
    Path(flag).touch()  # hung factories return, their abandoned threads end


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_process", [False, True], ids=["in-worker", "env-process"])
def test_a_hanging_factory_is_a_build_timeout_and_frees_the_cluster(
    client2: Any, release: str, env_process: bool
) -> None:
    hang = functools.partial(_wait_for_file, release)
    start = time.monotonic()
    with pytest.raises(EnvBuildTimeoutError, match=r"within 2s") as info:
        DaskVecEnv([hang, cartpole], client=client2, timeout=2, worker_wait_timeout=5, env_process=env_process)
    elapsed = time.monotonic() - start
    assert elapsed < 2 + 10 + 15, f"the build timeout took {elapsed:.0f}s"  # timeout, client margin, a loaded machine
    if env_process:
        assert info.value.env_indices == [0] and "env process was killed" in str(info.value)
        # the env process of the hung build is gone, and the other group's goes with its group
        wait_until(lambda: sum(client2.run(_env_processes).values()) == 0, 30, "no env process on any worker")
    else:
        assert info.value.env_indices == [0] and "env 0 (_wait_for_file)" in str(info.value)
        # built once, on one worker: not retried on the other
        assert sum(client2.run(_build_threads).values()) == 1
    # the next vec env on the same cluster builds and steps
    with DaskVecEnv([cartpole] * 2, client=client2, timeout=60, env_process=env_process) as env:
        env.reset()
        _, rewards, _, _ = env.step(np.zeros(2, dtype=np.int64))
        assert rewards.tolist() == [1.0, 1.0]


def _start_child_then_hang(pid_file: str, release: str) -> gym.Env[Any, Any]:
    """A factory that starts a process of its own (as an AsyncVectorEnv does), then hangs."""
    child = subprocess.Popen(["sleep", "300"])
    Path(pid_file + ".part").write_text(str(child.pid))
    os.replace(pid_file + ".part", pid_file)  # whole or absent, even if the process is killed meanwhile
    return _wait_for_file(release)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(120)
def test_killing_an_env_process_kills_what_its_envs_started(client2: Any, release: str, tmp_path: Path) -> None:
    """The env process leads a process group of its own: a hung build's kill takes its envs' children along."""
    pid_file = tmp_path / "child.pid"
    hang = functools.partial(_start_child_then_hang, str(pid_file), release)
    # The build must time out after the factory started its child: an env process takes seconds
    # to import what it needs on a loaded machine, so a timeout that fired before the factory ran
    # proves nothing, and the test tries again with twice the timeout.
    for timeout in (3.0, 6.0, 12.0, 24.0):
        with pytest.raises(EnvBuildTimeoutError, match="env process was killed"):
            DaskVecEnv([hang], client=client2, timeout=timeout, worker_wait_timeout=timeout, env_process=True)
        if pid_file.exists():
            break
    else:
        pytest.fail("the env process never reached its factory, with a build timeout of up to 24 s")
    child = int(pid_file.read_text())
    wait_until(lambda: not _running(child), 20, f"process {child}, started by an env, to end with its group")


@pytest.mark.timeout(120)
def test_an_env_process_does_not_outlive_its_worker_during_a_build(dask_processes: Any, release: str) -> None:
    import psutil
    from distributed import Client

    from daskvec.cluster.clients import dumps_factories
    from daskvec.protocol.messages import GroupSpec
    from daskvec.worker import EnvHost

    procs = dask_processes(1)
    (worker,) = procs.workers
    factories = dumps_factories([functools.partial(_wait_for_file, release)], [0])
    with Client(procs.address, timeout=30, set_as_default=False) as client:
        client.submit(EnvHost, factories, GroupSpec((0,), build_timeout=120), actor=True, pure=False)
        building: list[psutil.Process] = []

        def env_process_started() -> bool:
            building[:] = [p for p in psutil.Process(worker.pid).children() if "host_main" in " ".join(p.cmdline())]
            return bool(building)

        wait_until(env_process_started, 60, "the env process to start")
        procs.kill_worker(worker)  # SIGKILL: the worker cannot clean anything up
        (env_proc,) = building
        wait_until(
            lambda: not env_proc.is_running() or env_proc.status() == psutil.STATUS_ZOMBIE,
            15,
            lambda: f"env process {env_proc.pid} to end with its worker (parent now {env_proc.ppid()})",
        )


def _exit_now() -> gym.Env[Any, Any]:
    os._exit(3)


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_a_factory_that_ends_its_process_is_named_after_one_retry() -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
    ):
        with pytest.raises(EnvBuildError, match=r"factory _exit_now\) ended the process .* on 2 workers") as info:
            DaskVecEnv([_exit_now], client=client, timeout=60, worker_wait_timeout=60)
        assert not isinstance(info.value, EnvBuildTimeoutError) and info.value.env_indices == [0]


@pytest.mark.parametrize(("transport", "kind"), [("auto", "actor"), ("direct", "actor"), ("direct-insecure", "direct")])
def test_a_secured_worker_joining_a_plain_looking_cluster_gets_no_plaintext_unasked(transport: str, kind: str) -> None:
    """The pool's choice per group: a ``tls://`` worker gets actor calls unless plaintext was asked for."""
    from daskvec._core.pool import GroupPool
    from daskvec.protocol.messages import GroupDesc
    from daskvec.transport import ChannelServer

    token = b"k" * 32
    server = ChannelServer("127.0.0.1", token, lambda r: r, name="joiner", unix_dir=None)
    try:
        pool = GroupPool(None, [cartpole], Options.create(transport=transport), directory=None)  # type: ignore[arg-type]
        desc = GroupDesc("tls://10.0.0.9:4000", 1, "elsewhere", (), (), address=tuple(server.address))
        channel = pool._channel(SimpleNamespace(), desc, token)
        assert channel.kind == kind
        channel.close()
    finally:
        server.close()


@pytest.mark.timeout(120)
def test_a_factory_that_ends_its_env_process_is_named_at_once(client2: Any) -> None:
    with pytest.raises(RuntimeError, match=r"exited with code 3 before they were built") as info:
        DaskVecEnv([_exit_now], client=client2, timeout=60, env_process=True)
    assert any("factory _exit_now" in note for note in getattr(info.value, "__notes__", []))
    assert len(client2.scheduler_info()["workers"]) == 2  # only the env process died


# --------------------------------------------------------------------------- the trust model
def test_another_client_of_the_cluster_can_drive_a_group(dclient: Any, client2: Any) -> None:
    """docs/security.md: the token keeps out strangers who reach the port, not the cluster's other clients."""
    from distributed import Actor

    from daskvec.protocol.messages import StepReply, StepRequest
    from daskvec.transport import DirectChannel, pack, unpack
    from daskvec.worker import EnvGroup

    env = DaskVecEnv([cartpole, cartpole], client=dclient, envs_per_actor=2, transport="direct")
    try:
        env.reset()
        key, worker = env.groups[0]["key"], env.groups[0]["worker"]

        def task_arguments(dask_scheduler: Any, key: str = key) -> list[Any]:
            return list(dask_scheduler.tasks[key].run_spec.args)

        # the scheduler holds the token among the arguments of the group's task (in its GroupSpec)
        args = client2.run_on_scheduler(task_arguments)
        tokens = [getattr(a, "token", a) for a in args]
        tokens = [t for t in tokens if isinstance(t, bytes) and len(t) == 32]
        assert len(tokens) == 1, "no 32-byte token among the group task's arguments"
        step = StepRequest(np.zeros(2, dtype=np.int64))
        with client2.as_current():
            actor = Actor(EnvGroup, worker, key)
            address = tuple(actor.describe().result(timeout=30).address)
            assert isinstance(unpack(actor.handle(pack(step)).result(timeout=30)), StepReply)  # no token asked
        channel = DirectChannel(address, tokens[0], connect_timeout=10)
        try:
            channel.send(step)
            assert isinstance(channel.recv(10), StepReply)
        finally:
            channel.close()
    finally:
        env.close()
