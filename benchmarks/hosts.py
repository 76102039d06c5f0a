"""Emulated worker hosts on one machine: network and UTS namespaces, a bridge, a delay relay.

Each host is a network namespace with its own address on a bridge the test creates, and
its own host name (``unshare --uts``), so daskvec's ``machine_id`` differs from the
client's and the direct channel uses TCP, as between real machines. One ``dask worker``
(``--nthreads 1``, no nanny) runs in each host; the scheduler listens on the bridge's
address in the root namespace and the client runs in the calling process.

Latency comes from a transparent delay relay per host (:mod:`benchmarks.relay`, run as a
script inside the host): an ``iptables -t nat ... REDIRECT`` rule in the host sends
every incoming TCP connection to it, it finds the original destination with
``SO_ORIGINAL_DST``, connects there and forwards each chunk after half the round trip,
in each direction, in order. The rule is installed before the worker starts: a REDIRECT
rule added under live connections breaks them (conntrack takes their packets as new).
A partition is ``iptables -j DROP`` on the host's interface, in both directions.

Everything the test starts (processes, namespaces, the bridge; the iptables rules live
inside the namespaces) is removed by :meth:`EmulatedHosts.close`, which the context
manager and the fixture call even when a test fails. Needs root, ``ip``, ``unshare`` and
``iptables`` (:func:`missing_requirements` says what is missing; the fixture skips).

Used by the tests (``tests/hosts.py`` adds the pytest fixture) and by the across-hosts
benchmark (:mod:`benchmarks.across`): :func:`emulated_hosts` is a context manager,
:func:`measure_relay_cost` measures the relay's own round-trip cost. Importing this
module needs only the standard library.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "EmulatedHosts",
    "checkout_env",
    "Host",
    "emulated_hosts",
    "measure_relay_cost",
    "missing_requirements",
    "recv_exactly",
    "recv_line",
]

#: The delay relay and the echo server, run as scripts inside a host.
RELAY = Path(__file__).resolve().with_name("relay.py")
IFACE = "eth0"  # the host's end of its veth pair, inside its namespace


def checkout_env() -> dict[str, str]:
    """The environment of dask processes that import from this checkout.

    This checkout's root on ``PYTHONPATH`` (the workers import this daskvec and the
    benchmarks' envs, not whatever daskvec the venv's editable install points at), one BLAS
    thread, and no Dask stack-sampling profiler, which can deadlock a worker on CPython
    3.11 (docs/fault-tolerance.md).
    """
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    env["OMP_NUM_THREADS"] = "1"
    env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"
    return env


# --------------------------------------------------------------------------- requirements
def missing_requirements() -> str | None:
    """Why emulated hosts cannot be built here, or ``None`` when they can."""
    if sys.platform != "linux":
        return "emulated hosts need Linux network namespaces"
    if os.geteuid() != 0:
        return "emulated hosts need root (network namespaces, veth, iptables)"
    for tool, package in (
        ("ip", "iproute2"),
        ("unshare", "util-linux"),
        ("iptables", "iptables"),
        ("hostname", "hostname"),
    ):
        if shutil.which(tool) is None:
            return f"emulated hosts need `{tool}` (Debian package {package})"
    probe = f"dvprobe{os.getpid()}"
    try:
        _run("ip", "netns", "add", probe)
    except RuntimeError as e:
        return f"cannot create a network namespace here: {e}"
    try:
        _run("ip", "netns", "exec", probe, "iptables", "-t", "nat", "-S")
    except RuntimeError as e:
        return f"iptables (with its nat table) does not work in a network namespace here: {e}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def _check_cpus(cpus: str) -> None:
    """``cpus`` as ``taskset -c`` takes it, naming this machine's CPUs; ``ValueError`` saying what is wrong."""
    wanted: set[int] = set()
    try:
        for part in cpus.split(","):
            low, _, high = part.partition("-")
            wanted.update(range(int(low), int(high or low) + 1))
    except ValueError:
        raise ValueError(f"cpus={cpus!r}: give CPU numbers as taskset -c takes them, e.g. '1' or '2-3,5'") from None
    have = os.sched_getaffinity(0)
    if not wanted or not wanted <= have:
        raise ValueError(f"cpus={cpus!r}: this process may run on CPUs {sorted(have)}; name some of those")
    if shutil.which("taskset") is None:
        raise RuntimeError("cpus= needs taskset (util-linux)")


def _run(*cmd: str, check: bool = True, timeout: float = 30.0) -> str:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}: {p.stderr.strip()}")
    return p.stdout


def _in_ns(ns: str, *cmd: str, check: bool = True) -> str:
    return _run("ip", "netns", "exec", ns, *cmd, check=check)


def _free_subnet() -> ipaddress.IPv4Network:
    """A private /24 that no interface or route on this machine uses."""
    used = []
    for line in _run("ip", "-4", "-o", "addr").splitlines() + _run("ip", "-4", "route").splitlines():
        for word in line.split():
            with contextlib.suppress(ValueError):
                if "/" in word or word[0].isdigit():
                    used.append(ipaddress.ip_network(word, strict=False))
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{secrets.choice(range(160, 250))}.{secrets.randbelow(256)}.0/24")
        if not any(net.overlaps(u) for u in used):
            return net
    raise RuntimeError("no free private /24 found for the emulated hosts' bridge")


def _kill_group(p: subprocess.Popen[Any], grace: float) -> None:
    """End a process we started (and its process group: it runs in a session of its own)."""
    if p.poll() is None and grace > 0:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=grace)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.wait(timeout=10)


def _read_port(p: subprocess.Popen[str], what: str, timeout: float = 30.0) -> int:
    """The first stdout line of a relay or echo process: ``port N``."""
    assert p.stdout is not None
    result: list[str] = []
    reader = threading.Thread(target=lambda: result.append(p.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    line = result[0] if result else ""
    if not line.startswith("port "):
        _kill_group(p, 0)
        raise RuntimeError(f"{what} did not start (said {line!r})")
    return int(line.split()[1])


# --------------------------------------------------------------------------- hosts
@dataclass
class Host:
    """One emulated machine: a network + UTS namespace named :attr:`name` (also its host name)."""

    name: str
    address: str
    veth: str  # root namespace's end, on the bridge
    rtt_ms: float | None  # round trip the relay adds; None: no relay
    relay: subprocess.Popen[str] | None = None
    relay_port: int | None = None
    relay_log: Path | None = None
    worker: subprocess.Popen[bytes] | None = None
    partitioned: bool = False
    processes: list[subprocess.Popen[Any]] = field(default_factory=list)

    def relayed(self) -> list[tuple[str, int]]:
        """Original destinations ``(ip, port)`` of every connection the relay has taken so far."""
        if self.relay_log is None or not self.relay_log.exists():
            return []
        out = []
        for line in self.relay_log.read_text().splitlines():
            ip, port = line.split()[-1].rsplit(":", 1)
            out.append((ip, int(port)))
        return out


class EmulatedHosts:
    """A scheduler on a bridge and worker hosts in network namespaces (see the module doc).

    Parameters
    ----------
    n : int
        Worker hosts to start.
    rtt_ms : float or sequence of float
        Round trip the relay adds on each host (one value for all, or one per host).
    relay : bool, optional
        Put a relay on each host; default: only when ``rtt_ms > 0``. ``relay=True`` with
        ``rtt_ms=0`` measures what the relay alone costs.
    tls : bool
        Scheduler, workers and client on ``tls://`` with a temporary certificate
        (``Security.temporary()``); :meth:`client` uses it.
    dask : bool
        Start the scheduler and the workers (``False``: bare hosts, e.g. to measure the relay).
    workdir : path, optional
        Where scheduler files, certificates and logs go (default: a temporary directory).
    cpus : str, optional
        The CPUs (``taskset -c`` syntax, e.g. ``"1"``) every process started here may run
        on: the scheduler, the relays and the workers, as machines of their own have
        cores of their own. Default: any.
    """

    def __init__(
        self,
        n: int,
        rtt_ms: float | Sequence[float] = 0.0,
        *,
        relay: bool | None = None,
        tls: bool = False,
        dask: bool = True,
        workdir: str | Path | None = None,
        worker_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = (),
        cpus: str | None = None,
    ) -> None:
        if cpus is not None:
            _check_cpus(cpus)
        self.cpus = cpus
        rtts = [float(rtt_ms)] * n if isinstance(rtt_ms, (int, float)) else [float(r) for r in rtt_ms]
        if len(rtts) != n or any(r < 0 for r in rtts):
            raise ValueError(f"rtt_ms must be >= 0, one value or one per host, not {rtt_ms!r}")
        self._initial = rtts
        self._relay = relay
        self.tls = tls
        self.dask = dask
        self.worker_args = list(worker_args)
        self.scheduler_args = list(scheduler_args)
        self._tmp = None if workdir is not None else tempfile.TemporaryDirectory(prefix="daskvec-hosts-")
        self.workdir = Path(workdir if workdir is not None else self._tmp.name)  # type: ignore[union-attr]
        self.tag = f"{os.getpid()}{secrets.token_hex(2)}"  # names of everything we create
        self.bridge = f"dvb{self.tag}"[:15]
        self.subnet: ipaddress.IPv4Network | None = None
        self.gateway = ""  # the bridge's address: the scheduler's host
        self.hosts: list[Host] = []
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.address = ""  # the scheduler's
        self.security: Any = None
        self._files: dict[str, str] = {}
        self._bridge_made = False
        self._namespaces: list[str] = []
        self._processes: list[subprocess.Popen[Any]] = []
        self.env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.env["OMP_NUM_THREADS"] = "1"
        self.env["DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"] = "False"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EmulatedHosts:
        """Create the bridge, the scheduler and the hosts; on any failure, remove what was made."""
        try:
            self._make_bridge()
            if self.dask:
                self._start_scheduler()
            for rtt in self._initial:
                self.add_host(rtt_ms=rtt, wait=False)
            if self.dask:
                self.wait_for_workers(len(self.hosts))
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Kill every process started, delete the namespaces and the bridge (safe to call twice)."""
        for host in self.hosts:
            # let the connections of a partitioned host close: orphaned sockets retransmitting
            # into a DROP rule would keep its namespace alive for minutes after deletion
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.heal(host)
        workers = [p for p in self._processes if p is not self.scheduler]
        for p in workers:  # workers first, while the scheduler can still hear them go
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGTERM)
        for p in workers:
            _kill_group(p, 5.0)
        if self.scheduler is not None:
            _kill_group(self.scheduler, 5.0)
        for ns in self._namespaces:
            # whatever still runs inside one of our namespaces is ours too
            for pid in _run("ip", "netns", "pids", ns, check=False).split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
            _run("ip", "netns", "del", ns, check=False)
        self._namespaces.clear()
        for host in self.hosts:  # a namespace the kernel frees later must not leave its veth behind
            if Path(f"/sys/class/net/{host.veth}").exists():
                _run("ip", "link", "del", host.veth, check=False)
        if self._bridge_made:
            _run("ip", "link", "del", self.bridge, check=False)
            self._bridge_made = False
        self._processes.clear()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> EmulatedHosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen[Any]:
        if self.cpus is not None:  # the affinity passes on through exec and to every thread started later
            cmd = ["taskset", "-c", self.cpus, *cmd]
        p: subprocess.Popen[Any] = subprocess.Popen(cmd, cwd=self.workdir, env=self.env, start_new_session=True, **kw)
        self._processes.append(p)
        return p

    # ------------------------------------------------------------------ network
    def _make_bridge(self) -> None:
        self.subnet = _free_subnet()
        self.gateway = str(self.subnet.network_address + 1)
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self._bridge_made = True
        _run("ip", "addr", "add", f"{self.gateway}/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")

    def _make_namespace(self, name: str, address: str, veth: str) -> None:
        _run("ip", "netns", "add", name)
        self._namespaces.append(name)
        _run("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}p")
        _run("ip", "link", "set", f"{veth}p", "netns", name)
        _in_ns(name, "ip", "link", "set", f"{veth}p", "name", IFACE)
        _in_ns(name, "ip", "addr", "add", f"{address}/24", "dev", IFACE)
        _in_ns(name, "ip", "link", "set", "lo", "up")
        _in_ns(name, "ip", "link", "set", IFACE, "up")
        _in_ns(name, "ip", "route", "add", "default", "via", self.gateway)
        _run("ip", "link", "set", veth, "master", self.bridge)
        _run("ip", "link", "set", veth, "up")

    def _start_relay(self, host: Host) -> None:
        host.relay_log = self.workdir / f"relay-{host.name}.log"
        cmd = [
            "ip",
            "netns",
            "exec",
            host.name,
            sys.executable,
            str(RELAY),
            "relay",
            "--rtt-ms",
            str(host.rtt_ms),
            "--log",
            str(host.relay_log),
        ]
        host.relay = self._popen(cmd, stdout=subprocess.PIPE, text=True)
        host.processes.append(host.relay)
        host.relay_port = _read_port(host.relay, f"the relay of {host.name}")
        # before anything listens in this host: rules added under live connections break them
        _in_ns(
            host.name,
            "iptables",
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-i",
            IFACE,
            "-p",
            "tcp",
            "-j",
            "REDIRECT",
            "--to-ports",
            str(host.relay_port),
        )

    # ------------------------------------------------------------------ dask
    def _tls_args(self, role: str) -> list[str]:
        if not self.tls:
            return []
        if not self._files:
            from distributed.security import Security

            temp = Security.temporary()
            for key, pem in (
                ("ca", temp.tls_ca_file),
                ("cert", temp.tls_scheduler_cert),
                ("key", temp.tls_scheduler_key),
            ):
                path = self.workdir / f"tls-{key}.pem"
                path.write_text(pem)
                path.chmod(0o600)
                self._files[key] = str(path)
            self.security = Security(
                tls_ca_file=self._files["ca"],
                tls_client_cert=self._files["cert"],
                tls_client_key=self._files["key"],
                require_encryption=True,
            )
        args = ["--tls-ca-file", self._files["ca"], "--tls-cert", self._files["cert"], "--tls-key", self._files["key"]]
        return ["--protocol", "tls", *args] if role == "scheduler" else args

    def _dask(self) -> list[str]:
        # this interpreter's own Dask, even where a copied venv's scripts name another python
        return [sys.executable, "-m", "dask"]

    def _start_scheduler(self) -> None:
        scheduler_file = self.workdir / f"scheduler-{self.tag}.json"
        cmd = [
            *self._dask(),
            "scheduler",
            "--host",
            self.gateway,
            "--port",
            "0",
            "--no-dashboard",
            "--scheduler-file",
            str(scheduler_file),
            *self._tls_args("scheduler"),
            *self.scheduler_args,
        ]
        log = open(self.workdir / "scheduler.log", "wb")  # noqa: SIM115 (the child keeps it)
        self.scheduler = self._popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + 60
        while True:
            try:
                self.address = str(json.loads(scheduler_file.read_text())["address"])
                return
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                if self.scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler did not start; see {self.workdir / 'scheduler.log'}") from None
                time.sleep(0.1)

    def start_worker(self, host: Host) -> subprocess.Popen[bytes]:
        """Start the ``dask worker`` of ``host`` (its host name set by ``unshare --uts``)."""
        proto = "tls" if self.tls else "tcp"
        worker = [
            *self._dask(),
            "worker",
            self.address,
            "--nthreads",
            "1",
            "--no-nanny",
            "--no-dashboard",
            "--protocol",
            proto,
            "--host",
            host.address,
            "--name",
            host.name,
            *self._tls_args("worker"),
            *self.worker_args,
        ]
        script = 'hostname "$0" && exec "$@"'
        cmd = ["ip", "netns", "exec", host.name, "unshare", "--uts", "sh", "-c", script, host.name, *worker]
        log = open(self.workdir / f"worker-{host.name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        p = self._popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        host.worker = p
        host.processes.append(p)
        return p

    def add_host(self, rtt_ms: float = 0.0, *, relay: bool | None = None, wait: bool = True) -> Host:
        """Create one more host (namespace, veth, relay if any, worker) and wait for its worker."""
        assert self.subnet is not None, "start() first"
        index = len(self.hosts)
        if index > 200:
            raise ValueError("at most 200 hosts on one bridge")
        wanted = relay if relay is not None else self._relay
        use_relay = rtt_ms > 0 if wanted is None else wanted
        host = Host(
            name=f"dvh{self.tag}-{index}",
            address=str(self.subnet.network_address + 10 + index),
            veth=f"dvv{self.tag}{index:x}"[:15],
            rtt_ms=float(rtt_ms) if use_relay else None,
        )
        self.hosts.append(host)
        self._make_namespace(host.name, host.address, host.veth)
        if use_relay:
            self._start_relay(host)
        if self.dask:
            self.start_worker(host)
            if wait:
                self.wait_for_workers(sum(1 for h in self.hosts if h.worker is not None and h.worker.poll() is None))
        return host

    def client(self, **kwargs: Any) -> Any:
        """A direct-to-workers ``distributed.Client`` to the scheduler (with the TLS security)."""
        from distributed import Client

        kwargs.setdefault("timeout", 60)
        kwargs.setdefault("direct_to_workers", True)
        kwargs.setdefault("set_as_default", False)
        if self.security is not None:
            kwargs.setdefault("security", self.security)
        return Client(self.address, **kwargs)

    def scheduler_workers(self, client: Any = None) -> dict[str, str]:
        """Worker address -> host name, as the scheduler lists them now."""
        own = client is None
        c = self.client() if own else client
        try:
            info = c.scheduler_info(n_workers=-1) if _takes_n_workers(c) else c.scheduler_info()
            return {addr: str(w.get("name")) for addr, w in info["workers"].items()}
        finally:
            if own:
                c.close()

    def wait_for_workers(self, n: int, timeout: float = 60.0) -> None:
        """Block until the scheduler lists exactly ``n`` workers."""
        with self.client(timeout=timeout) as c:
            deadline = time.monotonic() + timeout
            while len(self.scheduler_workers(c)) != n:
                dead = [h.name for h in self.hosts if h.worker is not None and h.worker.poll() is not None]
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the scheduler does not list {n} workers after {timeout:.0f}s "
                        f"(exited: {dead}; logs in {self.workdir})"
                    )
                time.sleep(0.1)

    def worker_address(self, host: Host) -> str:
        """The scheduler's address of ``host``'s worker."""
        (addr,) = [a for a, name in self.scheduler_workers().items() if name == host.name]
        return addr

    def host_of(self, worker_address: str) -> Host:
        """The host whose address appears in ``worker_address``."""
        ip = worker_address.split("://")[-1].rsplit(":", 1)[0]
        (host,) = [h for h in self.hosts if h.address == ip]
        return host

    # ------------------------------------------------------------------ faults
    def kill_worker(self, host: Host) -> None:
        """SIGKILL ``host``'s worker, like the machine dying (its relay stays)."""
        assert host.worker is not None
        os.kill(host.worker.pid, signal.SIGKILL)
        host.worker.wait(timeout=10)

    def partition(self, host: Host) -> None:
        """Drop every packet into and out of ``host`` (its connections hang, none is closed)."""
        if not host.partitioned:
            _in_ns(host.name, "iptables", "-I", "INPUT", "-i", IFACE, "-j", "DROP")
            _in_ns(host.name, "iptables", "-I", "OUTPUT", "-o", IFACE, "-j", "DROP")
            host.partitioned = True

    def heal(self, host: Host) -> None:
        """Undo :meth:`partition`."""
        if host.partitioned:
            _in_ns(host.name, "iptables", "-D", "INPUT", "-i", IFACE, "-j", "DROP")
            _in_ns(host.name, "iptables", "-D", "OUTPUT", "-o", IFACE, "-j", "DROP")
            host.partitioned = False

    # ------------------------------------------------------------------ measuring
    def start_echo(self, host: Host) -> tuple[subprocess.Popen[str], int]:
        """Start an echo server in ``host`` (:mod:`benchmarks.relay`'s ``echo``); returns it and its port.

        Each connection first gets one line, the peer address the server saw: the
        client's (the bridge's) when the connection was direct, the host's own when its
        relay carried it. Then everything is echoed back.
        """
        p = self._popen(
            ["ip", "netns", "exec", host.name, sys.executable, str(RELAY), "echo"], stdout=subprocess.PIPE, text=True
        )
        return p, _read_port(p, f"the echo server in {host.name}")

    def echo_rtt(self, host: Host, rounds: int = 1000, size: int = 64) -> tuple[float, str]:
        """Ping-pong ``rounds`` messages of ``size`` bytes with an echo server in ``host``.

        Returns the median round trip in seconds and the peer address the server saw
        (see :meth:`start_echo`).
        """
        p, port = self.start_echo(host)
        try:
            with socket.create_connection((host.address, port), timeout=30) as sock:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                peer = recv_line(sock)
                msg = b"x" * size
                times = []
                for _ in range(rounds):
                    t0 = time.perf_counter()
                    sock.sendall(msg)
                    recv_exactly(sock, size)
                    times.append(time.perf_counter() - t0)
            return statistics.median(times), peer
        finally:
            _kill_group(p, 0)


def _takes_n_workers(client: Any) -> bool:
    import inspect

    return "n_workers" in inspect.signature(client.scheduler_info).parameters


def recv_line(sock: socket.socket) -> str:
    """Read one ``\\n``-terminated line from ``sock``."""
    buf = b""
    while not buf.endswith(b"\n"):
        buf += recv_exactly(sock, 1)
    return buf.decode().strip()


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    """Read exactly ``n`` bytes from ``sock``."""
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


@contextlib.contextmanager
def emulated_hosts(n: int, rtt_ms: float | Sequence[float] = 0.0, **kwargs: Any) -> Iterator[EmulatedHosts]:
    """``n`` worker hosts and their scheduler, removed on exit (see :class:`EmulatedHosts`)."""
    hosts = EmulatedHosts(n, rtt_ms, **kwargs)
    with hosts:
        yield hosts


def measure_relay_cost(rounds: int = 2000, rtt_ms: float = 0.0) -> dict[str, float]:
    """What the relay itself adds to one round trip, in microseconds (medians).

    Two bare hosts (no Dask): one without a relay, one with a relay adding ``rtt_ms``.
    Returns ``direct_us``, ``relayed_us``, ``added_us`` (the wanted delay) and
    ``cost_us = relayed - direct - added``.
    """
    with emulated_hosts(0, dask=False) as hosts:
        direct_host = hosts.add_host(relay=False)
        relayed_host = hosts.add_host(rtt_ms, relay=True)
        direct, peer_d = hosts.echo_rtt(direct_host, rounds)
        relayed, peer_r = hosts.echo_rtt(relayed_host, rounds)
        if peer_d != hosts.gateway or peer_r != relayed_host.address:
            raise RuntimeError(f"the relay was not where expected (peers {peer_d}, {peer_r})")
    return {
        "direct_us": direct * 1e6,
        "relayed_us": relayed * 1e6,
        "added_us": rtt_ms * 1e3,
        "cost_us": (relayed - direct) * 1e6 - rtt_ms * 1e3,
    }


if __name__ == "__main__":
    print(json.dumps(measure_relay_cost(), indent=1))
