"""The env process: an env group in a process of its own beside the worker.

With ``DaskVecEnv(env_process=True)`` the actor is an :class:`EnvHost`: it starts a
child process of the worker (:func:`host_main`) that holds the :class:`EnvGroup` and
serves its direct channel, and forwards actor calls to it. Stepping then never
competes with the worker's event loop for the GIL, a step that hangs can be ended by
killing the process, and an env that crashes the interpreter takes only its group down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
import weakref
from collections.abc import Callable
from typing import Any, cast

import cloudpickle

from daskvec.config import worker_busy_poll, worker_shared_memory
from daskvec.errors import EnvBuildTimeoutError
from daskvec.monitoring import metrics
from daskvec.protocol.messages import Command, GroupDesc, GroupSpec, RemoteError
from daskvec.transport import ChannelError, DirectChannel, pack, unpack
from daskvec.worker import probes
from daskvec.worker.env_group import EnvGroup
from daskvec.worker.reaper import Release

logger = logging.getLogger(__name__)

__all__ = ["EnvHost", "host_main", "kill_env_process"]

#: Seconds the env process gets to close its envs when asked to stop, before it is killed.
_STOP_GRACE_S = 5.0
#: Seconds between two reads of the env process's step figures, for the worker's metrics.
_STATS_INTERVAL_S = 1.0


class EnvHost:
    """The env-group actor when the envs run in a process of their own (``env_process=True``).

    It takes the same arguments as :class:`EnvGroup` and answers the same calls, but
    builds the envs in a child process of the worker (``python -c`` running
    :func:`host_main`) that holds an :class:`EnvGroup` and serves its direct channel.
    The client talks to that process directly; Dask actor calls to :meth:`handle` are
    forwarded to it over a loopback channel. Stepping then never competes with the
    worker's event loop for the GIL, a step that hangs can be ended by killing the
    process, and an env that crashes the interpreter takes only its own group down.
    The process ends when the actor is shut down or released, and when the worker
    process dies (it watches a pipe from the worker and exits when the pipe closes).

    Parameters
    ----------
    factories, spec
        As for :class:`EnvGroup`. ``spec.build_timeout`` (default 300 s) bounds the
        build, after which the process is killed; with ``spec.tls`` the env process's
        TCP channel is TLS, with this worker's certificates (its Unix socket, this
        actor's own link, stays private to this user).
    """

    def __init__(self, factories: bytes, spec: GroupSpec) -> None:
        worker = probes.current_worker()
        self.worker_address = getattr(worker, "address", "local")
        self.env_indices = list(spec.env_indices)
        self._lock = threading.Lock()
        self._closed = False
        token, tls = spec.token, spec.tls
        # the actor's own link to the process: loopback, with a token of its own when the
        # client does not use the direct path (then nothing but the actor can reach the envs)
        local_token = token if token is not None else secrets.token_bytes(32)
        build_timeout = 300.0 if spec.build_timeout is None else spec.build_timeout
        inner = dataclasses.replace(
            spec,
            token=local_token,
            # read here, in the worker, whose Dask config the env process may not share
            busy_poll=worker_busy_poll(spec.busy_poll, self.worker_address),
            shared_memory=worker_shared_memory(spec.shared_memory, self.worker_address),
            build_timeout=None,  # bounded here, by killing the process
        )
        config = {
            "factories": factories,
            "spec": inner,
            "local": {
                "worker_address": self.worker_address,
                "listen_host": probes.listen_host(worker) if token is not None else "127.0.0.1",
                "unix_dir": probes.unix_dir(worker),
                # the certificates travel to the env process in the pipe (contexts do not pickle)
                "security": getattr(worker, "security", None) if tls else None,
            },
            "sys_path": list(sys.path),
        }
        self._proc, desc = _start_env_process(config, self.env_indices, build_timeout)
        # stops the env process once: from shutdown(), or when Dask dropped the actor
        # without one (the client gave the group up after a timeout, or died), or when
        # the actor is garbage collected
        self._release = Release(self, functools.partial(_stop_env_process, self._proc))
        try:
            address = desc.unix_path or tuple(desc.address or ())  # same machine: Unix if it has one
            link_tls = None
            if tls and not desc.unix_path:  # only the TLS port: connect as the worker does to its peers
                link_tls = worker.security.get_connection_args("worker")["ssl_context"]
            self._channel = DirectChannel(address, local_token, connect_timeout=10.0, ssl_context=link_tls)
            self._stats_channel = DirectChannel(address, local_token, connect_timeout=10.0, ssl_context=link_tls)
        except BaseException:
            self._release.now()
            raise
        self._desc = dataclasses.replace(
            desc,
            worker=self.worker_address,
            pid=os.getpid(),
            env_pid=self._proc.pid,
            deadline=probes.worker_deadline(worker),
            profiler_hazard=probes.profiler_hazard(worker),
            address=desc.address if token is not None else None,
            unix_path=desc.unix_path if token is not None else None,
        )
        self.stats = metrics.GroupStats(len(desc.observation_spaces))  # a vector group is numbered later
        metrics.install_worker_metrics(worker, self.stats)
        poller = threading.Thread(target=_poll_stats, args=(weakref.ref(self),), name="daskvec-env-stats", daemon=True)
        poller.start()
        self._release.watch(worker, probes.actor_key(worker))  # last: release_dropped may run now

    def describe(self) -> GroupDesc:
        """As :meth:`EnvGroup.describe`, with ``env_pid``, the env process's id."""
        return self._desc

    def refused_connections(self) -> int:
        """How many peers the env process's direct channel refused."""
        value = self._forward((Command.REFUSED, ()))
        if isinstance(value, RemoteError):
            raise RuntimeError(f"{value.type}: {value.message}")
        return int(value)

    def handle(self, data: bytes) -> bytes:
        """Entry point of the Dask-actor transport: forwarded to the env process."""
        return cast(bytes, self._forward(unpack(data), then=pack))

    def _forward(self, request: Any, then: Callable[[Any], Any] | None = None) -> Any:
        """Send ``request`` to the env process; its reply (passed through ``then`` before the next request may go).

        The reply's observations may be a view of the env process's shared window, valid
        only until the next request: ``then`` (packing it for the actor's caller) runs
        under the lock.
        """
        with self._lock:
            if self._closed:
                raise ChannelError(f"the env group {self.env_indices} on {self.worker_address} was shut down")
            self._channel.send(request)
            reply = self._channel.recv(None)
            return reply if then is None else then(reply)

    def _refresh_stats(self, timeout: float = _STATS_INTERVAL_S * 10) -> bool:
        """Copy the env process's step figures into this worker's metrics (False once closed)."""
        try:
            self._stats_channel.send((Command.STATS, ()))
            value = self._stats_channel.recv(timeout)
        except (ChannelError, TimeoutError, OSError):
            return False  # the process is gone or stuck: the client finds out on its own channel
        if not isinstance(value, RemoteError):
            self.stats.mirror(value)
        return True

    def shutdown(self) -> bool:
        """Stop the env process (its envs are closed first); safe to call twice."""
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        self._refresh_stats(timeout=1.0)  # the counters keep what the envs did last
        self._channel.close()
        self._stats_channel.close()
        self._release.now()
        metrics.forget(self.stats)
        return True

    def release_dropped(self) -> bool:
        """Stop the env process as :meth:`shutdown` does, without waiting for a call in progress.

        The reaper calls this once Dask dropped the actor without a shutdown: nobody
        will call it again. A call forwarded to a hung env process ends when its
        channel closes, so nothing here waits for the lock.
        """
        self._closed = True
        self._channel.close()
        self._stats_channel.close()
        if self._release.now():
            metrics.forget(self.stats)
            logger.info("%r: Dask dropped the actor without a shutdown; its env process is stopped", self)
        return True

    def __repr__(self) -> str:
        return f"EnvHost(envs={self.env_indices}, worker={self.worker_address!r}, pid={self._proc.pid})"


def _poll_stats(ref: weakref.ref[EnvHost]) -> None:
    while True:
        time.sleep(_STATS_INTERVAL_S)
        host = ref()
        if host is None or host._closed or not host._refresh_stats():
            return
        del host


def _start_env_process(
    config: dict[str, Any], env_indices: list[int], timeout: float
) -> tuple[subprocess.Popen[bytes], GroupDesc]:
    """Start the env process, send it ``config`` and wait for its description."""
    package_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = f"import sys; sys.path.insert(0, {package_root!r}); from daskvec.worker.host import host_main; host_main()"
    read_fd, write_fd = os.pipe()
    try:
        # a process group of its own: killing it kills what its envs started too (an
        # AsyncVectorEnv's workers), and a terminal's Ctrl-C reaches the client, not the envs
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(write_fd)], stdin=subprocess.PIPE, pass_fds=(write_fd,), process_group=0
        )
    finally:
        os.close(write_fd)
    try:
        assert proc.stdin is not None
        blob = cloudpickle.dumps(config)
        proc.stdin.write(struct.pack("!Q", len(blob)) + blob)
        proc.stdin.flush()
        reply = _read_message(read_fd, timeout)
    except BaseException:
        _stop_env_process(proc)
        raise
    finally:
        os.close(read_fd)
    if reply is None:
        _stop_env_process(proc)
        raise EnvBuildTimeoutError(
            f"the envs {env_indices} were not built within {timeout:g}s (a factory hung); their env "
            "process was killed. Check what the factory waits for, or pass a larger timeout=",
            env_indices=list(env_indices),
        )
    if reply == b"":
        code_ = proc.wait(timeout=10)
        raise RuntimeError(
            f"the process building envs {env_indices} exited with code {code_} before they were built "
            "(see the worker's log); a factory may have crashed the interpreter"
        )
    status, value = cloudpickle.loads(reply)
    if status != "ok":
        proc.wait(timeout=_STOP_GRACE_S)
        raise value
    return proc, value


def _read_message(fd: int, timeout: float) -> bytes | None:
    """Read one length-prefixed message from ``fd``: ``b""`` at EOF, ``None`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    buf = b""
    need = 8
    header_done = False
    while len(buf) < need:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
            return None
        chunk = os.read(fd, max(need - len(buf), 1 << 16))
        if not chunk:
            return b""
        buf += chunk
        if not header_done and len(buf) >= 8:
            need = 8 + struct.unpack("!Q", buf[:8])[0]
            header_done = True
    return buf[8:need]


def _stop_env_process(proc: subprocess.Popen[bytes]) -> None:
    """Ask the env process to stop (its stdin closes), kill it if it does not, and kill what its envs started.

    The process is not reaped before its group is killed, so that the group id is still
    its own (an exited, unreaped process keeps its pid).
    """
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    deadline = time.monotonic() + _STOP_GRACE_S
    while _running(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    if _running(proc.pid):
        logger.warning("env process %d did not stop within %.0fs; killing it", proc.pid, _STOP_GRACE_S)
    _kill_group(proc.pid)  # it, if still running, and any process its envs started (an AsyncVectorEnv's)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=_STOP_GRACE_S)


def _running(pid: int) -> bool:
    """Whether the child ``pid`` has not exited yet (an exited one is left unreaped)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
    except ChildProcessError:  # reaped already
        return False


def kill_env_process(pid: int) -> bool:
    """Kill the env process ``pid`` if it is a child of the calling (worker) process.

    The client runs this on a worker, with ``Client.run``, for groups it dropped
    without a shutdown (a hung step). Returns whether a process was killed.
    """
    import psutil  # a dependency of distributed

    try:
        if psutil.Process(int(pid)).ppid() != os.getpid():
            return False
    except psutil.Error:
        return False
    _kill_group(int(pid))
    logger.warning("killed env process %d, which the client dropped (a step or a build hung)", pid)
    return True


def _kill_group(pid: int) -> None:
    """SIGKILL the env process ``pid`` and every process in its group (what its envs started)."""
    try:
        if os.getpgid(pid) == pid:  # it leads its own group (see _start_env_process)
            os.killpg(pid, signal.SIGKILL)
            return
    except ProcessLookupError:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def host_main() -> None:
    """Entry point of an env process (see :class:`EnvHost`); not for direct use.

    Reads its configuration from stdin, builds an :class:`EnvGroup` serving the
    direct channel, writes the group's description (or the error that stopped it)
    to the file descriptor given as ``argv[1]``, then waits for stdin to close.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the user's terminal is for the client
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s - %(name)s - %(levelname)s - %(message)s")
    out_fd = int(sys.argv[1])
    stdin = sys.stdin.buffer
    (size,) = struct.unpack("!Q", stdin.read(8))
    config = cloudpickle.loads(stdin.read(size))
    for entry in reversed(config.pop("sys_path")):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    built: list[EnvGroup] = []
    # the worker closes the pipe to stop this process, and it closes by itself when the
    # worker dies: watched from now on, during the build too, so that no env process
    # outlives its worker
    watcher = threading.Thread(target=_exit_when_closed, args=(stdin, built), name="daskvec-parent", daemon=True)
    watcher.start()
    try:
        group = EnvGroup(config["factories"], config["spec"], **config["local"])
        reply: tuple[str, Any] = ("ok", group.describe())
        built.append(group)
    except BaseException as e:  # sent to the actor, which raises it on the worker
        reply = ("err", _portable_exception(e))
    blob = cloudpickle.dumps(reply)
    with os.fdopen(out_fd, "wb") as out:
        out.write(struct.pack("!Q", len(blob)) + blob)
    if not built:
        os._exit(1)
    watcher.join()


def _exit_when_closed(stdin: Any, built: list[EnvGroup]) -> None:
    """Wait for stdin to close (worker gone, or asking us to stop), shut the group down, exit."""
    with contextlib.suppress(OSError, ValueError):
        while stdin.read1(1 << 16):
            continue  # nothing more is sent
    if built:
        closer = threading.Thread(target=built[0].shutdown, name="daskvec-env-close", daemon=True)
        closer.start()
        closer.join(_STOP_GRACE_S)
    os._exit(0)


def _portable_exception(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else a ``RuntimeError`` carrying its traceback."""
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
        return exc
    except Exception:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{tb}")
