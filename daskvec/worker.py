"""Worker side: the env-group actors that hold a slice of environments.

An :class:`EnvGroup` builds its environments from their pickled factories (never on
the client), steps all of them for one request, and answers requests arriving on
either transport (see :mod:`daskvec.transport`): a direct authenticated socket served
by its own threads, or ordinary Dask actor calls to :meth:`EnvGroup.handle`. One lock
serialises the two.

By default the client creates the :class:`EnvGroup` itself as the actor on a worker
(``client.submit(EnvGroup, ..., actor=True)``). With ``DaskVecEnv(env_process=True)``
the actor is an :class:`EnvHost` instead: it starts a child process of the worker
(:func:`host_main`) that holds the :class:`EnvGroup` and serves its direct channel, and
forwards actor calls to it.

Step semantics are those of Stable-Baselines3's vec envs: ``done = terminated or
truncated``, ``info["TimeLimit.truncated"] = truncated and not terminated``, and on
``done`` the last observation goes to ``info["terminal_observation"]`` before the env
is reset.

This module must stay light: it is imported by every worker process, so it does not
import Stable-Baselines3 or torch.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import queue
import secrets
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from daskvec import metrics
from daskvec.errors import EnvRestartBudgetExceeded
from daskvec.transport import ChannelError, ChannelServer, DirectChannel, StepReply, machine_id, pack, unpack

logger = logging.getLogger(__name__)

__all__ = ["EnvGroup", "EnvHost", "host_main", "kill_env_process", "restart_seed", "stack_obs"]

#: Marker key that daskvec adds to an env's ``info`` when it was restarted or moved.
INFO_KEY = "daskvec"


def restart_seed(env_index: int, restarts: int, base_seed: int | None = None) -> int:
    """Seed used to reset env ``env_index`` after its ``restarts``-th rebuild.

    It is ``SeedSequence([base_seed or 0, env_index, restarts])`` reduced to 31 bits:
    the same env restarted the same number of times always gets the same seed, and
    different envs or restart counts get independent streams.

    Parameters
    ----------
    env_index : int
        Index of the env in the vec env.
    restarts : int
        How many times this env has been rebuilt, including this rebuild.
    base_seed : int, optional
        The seed the user last gave this env, if any.

    Returns
    -------
    int
    """
    entropy = [0 if base_seed is None else int(base_seed) & 0xFFFFFFFF, int(env_index), int(restarts)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def stack_obs(obs_list: Sequence[Any], space: gym.Space[Any]) -> Any:
    """Stack per-env observations along a new first axis, following ``space``.

    Dict spaces give a dict of arrays, Tuple spaces a tuple of arrays, anything else
    one array. Each result is one contiguous buffer, sent out of band.
    """
    if isinstance(space, gym.spaces.Dict):
        return {k: stack_obs([o[k] for o in obs_list], sub) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stack_obs([o[i] for o in obs_list], sub) for i, sub in enumerate(space.spaces))
    try:
        # one C call; np.stack does the same in Python, which costs a step of a heavy env
        # (run right after the env code, with cold caches) about 70 us more
        stacked = np.array(obs_list)
    except ValueError:
        stacked = None
    if stacked is None or stacked.dtype.hasobject or stacked.shape[:1] != (len(obs_list),):
        # ragged or odd observations: np.stack stacks what it can and explains the rest
        return np.stack([np.asarray(o) for o in obs_list])
    return stacked


def obs_shape(obs: Any) -> Any:
    """The shape of one env's observation (per key or entry for dict and tuple ones)."""
    if isinstance(obs, dict):
        return {k: obs_shape(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(obs_shape(v) for v in obs)
    return np.shape(obs)


def _row(stacked: Any, pos: int) -> Any:
    if isinstance(stacked, dict):
        return {k: _row(v, pos) for k, v in stacked.items()}
    if isinstance(stacked, tuple):
        return tuple(_row(v, pos) for v in stacked)
    return stacked[pos].copy()


def _is_wrapped(env: gym.Env[Any, Any], wrapper_class: type) -> bool:
    current: Any = env
    while isinstance(current, gym.Wrapper):
        if isinstance(current, wrapper_class):
            return True
        current = current.env
    return False


def _current_worker() -> Any:
    try:
        from distributed import get_worker

        return get_worker()
    except ValueError:
        return None


def profiler_hazard(worker: Any) -> bool:
    """Whether ``worker`` samples thread stacks on a Python that can deadlock doing so.

    On CPython 3.11 ``sys._current_frames()``, which Dask's worker profiler calls every
    few milliseconds while a task runs, can deadlock the whole process against a thread
    that starts or ends at the same moment (python/cpython#106883; not seen on 3.12).
    An env group starts threads when it is created, so such a worker can freeze while
    envs are placed on it or moved to it.
    """
    callbacks = getattr(worker, "periodic_callbacks", None) or {}
    return sys.version_info < (3, 12) and "profile" in callbacks


def _slurm_end_time() -> float | None:
    job = os.environ.get("SLURM_JOB_ID")
    squeue = shutil.which("squeue")
    if not job or not squeue:
        return None
    try:
        out = subprocess.run(
            [squeue, "-h", "-j", job, "-o", "%e"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
        if not out or out in ("N/A", "NONE", "Unknown"):
            return None
        return datetime.fromisoformat(out).timestamp()
    except (OSError, ValueError, subprocess.SubprocessError):
        return None


def worker_deadline(worker: Any) -> float | None:
    """Wall-clock time (epoch seconds) at which this worker is expected to go away.

    The earlier of the worker's ``--lifetime`` (counted from the process start) and,
    inside a SLURM job, the job's end time. ``None`` when neither is known.
    """
    deadlines: list[float] = []
    lifetime = getattr(worker, "lifetime", None)
    if lifetime:
        try:
            import psutil

            started = psutil.Process().create_time()
        except Exception:  # psutil missing or process gone: fall back to now
            started = time.time()
        deadlines.append(started + float(lifetime))
    slurm = _slurm_end_time()
    if slurm is not None:
        deadlines.append(slurm)
    return min(deadlines) if deadlines else None


class _EnvFailure(Exception):
    """Internal: carries an error payload out of a command."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__(payload.get("message", ""))
        self.payload = payload


def _error_payload(exc: BaseException, env_index: int | None, worker: str) -> dict[str, Any]:
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: bytes | None = cloudpickle.dumps(exc)
        cloudpickle.loads(blob)
    except Exception:
        blob = None
    return {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": tb,
        "env_index": env_index,
        "worker": worker,
        "exc": blob,
    }


class _WorkerDirectory:
    """Default of ``EnvGroup(unix_dir=...)``: the worker's local directory (see :func:`_unix_dir`)."""

    def __repr__(self) -> str:
        return "<the worker's local directory>"


WORKER_DIRECTORY = _WorkerDirectory()


class EnvGroup:
    """A slice of environments living on one Dask worker, as a stateful actor.

    Parameters
    ----------
    factories : bytes
        cloudpickled list of zero-argument callables, one per env.
    env_indices : list of int
        The vec-env index of each env, for error messages and restart seeds.
    token : bytes or None
        Secret for the direct channel; ``None`` serves Dask actor calls only.
    on_env_error : {"raise", "restart"}
        What to do when an env raises in ``step`` or ``reset``.
    max_restarts : int
        Per-env budget of restarts after env errors.
    restarts : list of int, optional
        Restart counts carried over from an earlier life of these envs.
    worker_address : str, optional
        Address reported in errors and infos; by default the current worker's.
    listen_host : str, optional
        Interface of the direct channel; by default the current worker's host.
    unix_dir : str, optional
        Where the direct channel's Unix socket goes; by default
        (``WORKER_DIRECTORY``) the worker's local directory, which Dask cleans up after
        the worker, or the system's temporary directory outside a worker (``None``: no
        Unix socket).
    busy_poll : float, optional
        Seconds the direct channel polls for the next request after each reply
        (see :class:`daskvec.transport.ChannelServer`).
    """

    def __init__(
        self,
        factories: bytes,
        env_indices: list[int],
        token: bytes | None = None,
        on_env_error: str = "raise",
        max_restarts: int = 10,
        restarts: list[int] | None = None,
        *,
        worker_address: str | None = None,
        listen_host: str | None = None,
        unix_dir: str | _WorkerDirectory | None = WORKER_DIRECTORY,
        busy_poll: float = 0.0,
    ) -> None:
        self._worker = _current_worker()
        self.worker_address: str = worker_address or str(getattr(self._worker, "address", "local"))
        self.env_indices = list(env_indices)
        self.on_env_error = on_env_error
        self.max_restarts = max_restarts
        self.restarts = list(restarts) if restarts is not None else [0] * len(env_indices)
        self._lock = threading.Lock()
        self._closed = False
        self._factories: list[Callable[[], gym.Env[Any, Any]]] = cloudpickle.loads(factories)
        self.envs: list[gym.Env[Any, Any]] = []
        try:
            for pos, fn in enumerate(self._factories):
                self.envs.append(self._build(pos, fn))
            seen: dict[int, int] = {}
            for pos, env in enumerate(self.envs):
                if id(env) in seen:
                    raise ValueError(
                        f"env factories {self.env_indices[seen[id(env)]]} and "
                        f"{self.env_indices[pos]} returned the same environment instance; "
                        "each factory must create a new env (e.g. `lambda: gym.make(...)`)"
                    )
                seen[id(env)] = pos
        except BaseException:
            _close_envs(self.envs, self.worker_address)
            raise
        n = len(self.envs)
        self._returns = np.zeros(n, dtype=np.float64)
        self._last_obs: Any = None
        self._seeds: list[int | None] = [None] * n
        self.stats = metrics.GroupStats(n)
        metrics.install_worker_metrics(self._worker, self.stats)
        self.deadline = worker_deadline(self._worker)
        self._server: ChannelServer | None = None
        if token is not None:
            host = listen_host or _listen_host(self._worker)
            # the server's threads must not keep the group alive: see _release below
            self._server = ChannelServer(
                host, token, _weak_dispatch(weakref.ref(self)), name="daskvec-group",
                unix_dir=_unix_dir(self._worker) if isinstance(unix_dir, _WorkerDirectory) else unix_dir,
                busy_poll=busy_poll,
            )
        # Closes the channel and the envs once: from shutdown(), or when the group is
        # garbage collected because Dask dropped the actor without a shutdown (its client
        # died, e.g. a notebook kernel killed mid-run). Without it the envs, the sockets
        # and the listening threads of such a group would stay on the worker for good.
        # The collector can run anywhere, even inside a lock this work needs, so the
        # finalizer only queues the work for the reaper thread.
        self._release_job = functools.partial(_release_group, self._server, self.envs, self.stats, self.worker_address)
        _start_reaper()
        self._finalizer = weakref.finalize(self, _RELEASES.put, self._release_job)
        self._finalizer.atexit = False
        self._commands: dict[str, Callable[..., Any]] = {
            "step": self._step,
            "reset": self._reset,
            "get_attr": self._get_attr,
            "set_attr": self._set_attr,
            "env_method": self._env_method,
            "is_wrapped": self._is_wrapped,
            "render": self._render,
            "stats": self.stats.snapshot,
            "refused": self.refused_connections,
        }

    # ---------------------------------------------------------------- lifecycle
    def _build(self, pos: int, fn: Callable[[], gym.Env[Any, Any]]) -> gym.Env[Any, Any]:
        index = self.env_indices[pos]
        try:
            env = fn()
        except Exception as e:
            e.add_note(f"daskvec: raised by the factory of env {index} on worker {self.worker_address}")
            raise
        if not (hasattr(env, "step") and hasattr(env, "reset")):
            raise TypeError(
                f"the factory of env {index} returned {type(env).__name__!r}, not a gymnasium.Env; "
                "env_fns must be callables that create an environment"
            )
        return env

    def describe(self) -> dict[str, Any]:
        """Spaces, worker, process and channel address of this group."""
        env = self.envs[0]
        return {
            "observation_spaces": [e.observation_space for e in self.envs],
            "action_spaces": [e.action_space for e in self.envs],
            "observation_space": env.observation_space,
            "action_space": env.action_space,
            "address": None if self._server is None else self._server.address,
            "unix_path": None if self._server is None else self._server.unix_path,
            "machine": machine_id(),
            "worker": self.worker_address,
            "pid": os.getpid(),
            "deadline": self.deadline,
            "profiler_hazard": profiler_hazard(self._worker),
        }

    def refused_connections(self) -> int:
        """How many peers the direct channel refused (failed authentication)."""
        return 0 if self._server is None else self._server.refused

    def shutdown(self) -> bool:
        """Close the channel and the envs; safe to call twice.

        The channel's connections drop first, so that a client still stepping sees
        the group gone (and rebuilds it) rather than an error reply; then the envs
        close once the call in progress, if any, has returned.
        """
        if self._server is not None:
            self._server.close()
        with self._lock:
            if self._closed:
                return False
            self._closed = True
        if self._finalizer.detach() is not None:  # not released by the collector already
            self._release_job()
        return True

    # ---------------------------------------------------------------- dispatch
    def handle(self, data: bytes) -> bytes:
        """Entry point of the Dask-actor transport: encoded request in, encoded reply out."""
        return pack(self.dispatch(unpack(data)))

    def dispatch(self, request: Any) -> Any:
        """Run one ``(command, args)`` request and return ``("ok", value)`` or ``("err", error)``."""
        with self._lock:
            try:
                cmd, args = request
                if self._closed:
                    raise RuntimeError("this env group was shut down")
                return ("ok", self._commands[cmd](*args))
            except _EnvFailure as f:
                return ("err", f.payload)
            except Exception as e:
                return ("err", _error_payload(e, None, self.worker_address))

    # ---------------------------------------------------------------- commands
    def _fail(self, pos: int, exc: BaseException) -> _EnvFailure:
        return _EnvFailure(_error_payload(exc, self.env_indices[pos], self.worker_address))

    def _recover(self, pos: int, exc: Exception) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """Handle an env's exception by the group's policy: raise it, or rebuild the env.

        Returns the rebuilt env's first observation, the step info reporting the
        truncation, and its reset info.
        """
        self.stats.errors += 1
        if self.on_env_error != "restart":
            raise self._fail(pos, exc) from exc
        last_obs = None if self._last_obs is None else _row(self._last_obs, pos)
        return self._restart(pos, exc, last_obs)

    def _restart(self, pos: int, exc: BaseException, last_obs: Any) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        index = self.env_indices[pos]
        self.restarts[pos] += 1
        count = self.restarts[pos]
        self.stats.restarts += 1
        if count > self.max_restarts:
            err = EnvRestartBudgetExceeded(
                f"env {index} crashed {count} times, more than max_restarts={self.max_restarts}; "
                f"last error: {type(exc).__name__}: {exc}",
                env_index=index,
                restarts=count,
            )
            err.__cause__ = exc
            raise self._fail(pos, err)
        logger.warning("env %d raised %s: %s; rebuilding it (restart %d)", index, type(exc).__name__, exc, count)
        try:
            self.envs[pos].close()
        except Exception:
            logger.debug("closing crashed env %d failed", index, exc_info=True)
        seed = restart_seed(index, count, self._seeds[pos])
        try:
            self.envs[pos] = self._build(pos, self._factories[pos])
            obs, reset_info = self.envs[pos].reset(seed=seed)
        except Exception as e:
            raise self._fail(pos, e) from e
        marker = {
            "restarted": True,
            "reason": "env_error",
            "error": f"{type(exc).__name__}: {exc}",
            "restarts": count,
            "seed": seed,
            "worker": self.worker_address,
        }
        info: dict[str, Any] = {"TimeLimit.truncated": True, INFO_KEY: marker}
        if last_obs is not None:
            info["terminal_observation"] = last_obs
        reset_info = dict(reset_info)
        reset_info[INFO_KEY] = marker
        self._returns[pos] = 0.0
        return obs, info, reset_info

    def _step(self, actions: Any) -> StepReply:
        n = len(self.envs)
        obs_list: list[Any] = [None] * n
        rewards = np.zeros(n, dtype=np.float64)
        dones = np.zeros(n, dtype=bool)
        infos: list[dict[str, Any]] = [{}] * n
        reset_infos: dict[int, dict[str, Any]] = {}
        plain = True  # nothing in the infos but what this loop adds (see StepReply.plain)
        t0 = time.perf_counter()
        for pos, env in enumerate(self.envs):
            try:
                obs, rew, terminated, truncated, info = env.step(actions[pos])
                done = bool(terminated or truncated)
                if info:
                    plain = False
                    info = dict(info) if not isinstance(info, dict) else info
                else:
                    info = {}
                info["TimeLimit.truncated"] = bool(truncated and not terminated)
                self._returns[pos] += float(rew)
                if done:
                    info["terminal_observation"] = obs
                    self.stats.record_episode(self._returns[pos])
                    self._returns[pos] = 0.0
                    obs, reset_info = self._reset_one(pos, None, None)
                    reset_infos[pos] = reset_info
                    if reset_info:
                        plain = False
            except _EnvFailure:
                raise
            except Exception as e:
                obs, info, reset_infos[pos] = self._recover(pos, e)
                rew, done, plain = 0.0, True, False
            obs_list[pos] = obs
            rewards[pos] = rew
            dones[pos] = done
            infos[pos] = info
        elapsed = time.perf_counter() - t0
        self.stats.record_step(n, elapsed)
        stacked = self._stack(obs_list)
        self._last_obs = stacked
        return StepReply(stacked, rewards, dones, infos, reset_infos, elapsed, list(self.restarts), plain)

    def _stack(self, obs_list: list[Any]) -> Any:
        try:
            return stack_obs(obs_list, self.envs[0].observation_space)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            shapes = ", ".join(f"env {i}: {obs_shape(o)}" for i, o in zip(self.env_indices, obs_list, strict=True))
            raise ValueError(
                f"the observations of envs {self.env_indices} do not stack ({shapes}): {e}; "
                "make each env's observations match its observation_space"
            ) from e

    def _reset_one(self, pos: int, seed: int | None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
        env = self.envs[pos]
        try:
            if options:
                return env.reset(seed=seed, options=options)
            return env.reset(seed=seed)
        except Exception as e:
            obs, _, reset_info = self._recover(pos, e)
            return obs, reset_info

    def _reset(self, seeds: list[int | None], options: list[dict[str, Any]]) -> dict[str, Any]:
        obs_list = []
        reset_infos = []
        for pos in range(len(self.envs)):
            if seeds[pos] is not None:
                self._seeds[pos] = seeds[pos]
            obs, info = self._reset_one(pos, seeds[pos], options[pos])
            self._returns[pos] = 0.0
            obs_list.append(obs)
            reset_infos.append(info)
        stacked = self._stack(obs_list)
        self._last_obs = stacked
        return {"obs": stacked, "reset_infos": reset_infos, "restarts": list(self.restarts)}

    def _each(self, positions: Sequence[int], fn: Callable[[gym.Env[Any, Any]], Any]) -> list[Any]:
        out = []
        for pos in positions:
            try:
                out.append(fn(self.envs[pos]))
            except Exception as e:
                raise self._fail(pos, e) from e
        return out

    def _get_attr(self, name: str, positions: Sequence[int]) -> list[Any]:
        return self._each(positions, lambda env: env.get_wrapper_attr(name))

    def _set_attr(self, name: str, value: Any, positions: Sequence[int]) -> None:
        self._each(positions, lambda env: setattr(env, name, value))

    def _env_method(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], positions: Sequence[int]
    ) -> list[Any]:
        return self._each(positions, lambda env: env.get_wrapper_attr(name)(*args, **kwargs))

    def _is_wrapped(self, wrapper_class: type, positions: Sequence[int]) -> list[bool]:
        return self._each(positions, lambda env: _is_wrapped(env, wrapper_class))

    def _render(self, positions: Sequence[int]) -> list[Any]:
        return self._each(positions, lambda env: env.render())

    def __repr__(self) -> str:
        return f"EnvGroup(envs={self.env_indices}, worker={self.worker_address!r})"


def _close_envs(envs: Sequence[gym.Env[Any, Any]], where: str) -> None:
    for env in envs:
        try:
            env.close()
        except Exception:  # an env that fails to close must not stop the others
            logger.exception("closing an env on %s failed", where)


def _release_group(
    server: ChannelServer | None, envs: list[gym.Env[Any, Any]], stats: metrics.GroupStats, where: str
) -> None:
    """Close what an :class:`EnvGroup` holds (its finalizer: must not refer to the group)."""
    if server is not None:
        server.close()
    _close_envs(envs, where)
    metrics.forget(stats)


#: Releases of collected groups and env processes, queued by their finalizers (a
#: SimpleQueue's ``put`` is safe in a finalizer) and carried out by one reaper thread
#: per process.
_RELEASES: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
_reaper: threading.Thread | None = None
_reaper_lock = threading.Lock()


def _reaper_loop() -> None:
    while True:
        job = _RELEASES.get()
        try:
            job()
        except Exception:
            logger.exception("a queued release (env group or env process) failed")


def _start_reaper() -> None:
    global _reaper
    with _reaper_lock:
        if _reaper is None or not _reaper.is_alive():
            _reaper = threading.Thread(target=_reaper_loop, name="daskvec-reaper", daemon=True)
            _reaper.start()


def _weak_dispatch(ref: weakref.ref[EnvGroup]) -> Callable[[Any], Any]:
    """The direct channel's handler: the group's ``dispatch``, without keeping the group alive."""

    def dispatch(request: Any) -> Any:
        group = ref()
        if group is None:
            raise ChannelError("the env group was released")
        return group.dispatch(request)

    return dispatch


def _listen_host(worker: Any) -> str:
    """Host of the worker's own listening address; loopback for in-process workers."""
    address = getattr(worker, "address", None)
    if not address or "://" not in address:
        return "127.0.0.1"
    from distributed.comm import get_address_host

    scheme = address.split("://", 1)[0]
    if scheme not in ("tcp", "tls", "ws", "wss"):
        return "127.0.0.1"
    return str(get_address_host(address))


def _unix_dir(worker: Any) -> str:
    """The worker's local directory (Dask removes it after the worker), else the temp dir."""
    directory = getattr(worker, "local_directory", None)
    return str(directory) if directory and os.path.isdir(directory) else tempfile.gettempdir()


# --------------------------------------------------------------------------- env process
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
    factories, env_indices, token
        As for :class:`EnvGroup`.
    *group_options
        :class:`EnvGroup`'s further positional arguments (``on_env_error``,
        ``max_restarts``, ``restarts``), handed to it unchanged in the env process.
    build_timeout : float
        Seconds the envs may take to build before the process is killed and
        ``TimeoutError`` is raised.
    busy_poll : float
        As for :class:`EnvGroup`.
    """

    def __init__(
        self,
        factories: bytes,
        env_indices: list[int],
        token: bytes | None = None,
        *group_options: Any,
        build_timeout: float = 300.0,
        busy_poll: float = 0.0,
    ) -> None:
        worker = _current_worker()
        self.worker_address = getattr(worker, "address", "local")
        self.env_indices = list(env_indices)
        self._lock = threading.Lock()
        self._closed = False
        # the actor's own link to the process: loopback, with a token of its own when the
        # client does not use the direct path (then nothing but the actor can reach the envs)
        local_token = token if token is not None else secrets.token_bytes(32)
        config = {
            "group_args": (factories, self.env_indices, local_token, *group_options),
            "group_kwargs": {
                "worker_address": self.worker_address,
                "listen_host": _listen_host(worker) if token is not None else "127.0.0.1",
                "unix_dir": _unix_dir(worker),
                "busy_poll": busy_poll,
            },
            "sys_path": list(sys.path),
        }
        _start_reaper()
        self._proc, desc = _start_env_process(config, self.env_indices, build_timeout)
        # released without shutdown() (a lost or hung group is dropped by the client): stop it then
        self._finalizer = weakref.finalize(self, _stop_env_process, self._proc, False)
        try:
            address = desc["unix_path"] or tuple(desc["address"])  # same machine: Unix if it has one
            self._channel = DirectChannel(address, local_token, connect_timeout=10.0)
            self._stats_channel = DirectChannel(address, local_token, connect_timeout=10.0)
        except BaseException:
            self._finalizer()
            raise
        self._desc = dict(desc)
        self._desc.update(
            worker=self.worker_address,
            pid=os.getpid(),
            env_pid=self._proc.pid,
            deadline=worker_deadline(worker),
            profiler_hazard=profiler_hazard(worker),
            address=desc["address"] if token is not None else None,
            unix_path=desc["unix_path"] if token is not None else None,
        )
        self.stats = metrics.GroupStats(len(self.env_indices))
        metrics.install_worker_metrics(worker, self.stats)
        poller = threading.Thread(
            target=_poll_stats, args=(weakref.ref(self),), name="daskvec-env-stats", daemon=True
        )
        poller.start()

    def describe(self) -> dict[str, Any]:
        """As :meth:`EnvGroup.describe`, plus ``env_pid``, the env process's id."""
        return dict(self._desc)

    def refused_connections(self) -> int:
        """How many peers the env process's direct channel refused."""
        status, value = self._forward(("refused", ()))
        if status != "ok":
            raise RuntimeError(f"{value.get('type')}: {value.get('message')}")
        return int(value)

    def handle(self, data: bytes) -> bytes:
        """Entry point of the Dask-actor transport: forwarded to the env process."""
        return pack(self._forward(unpack(data)))

    def _forward(self, request: Any) -> Any:
        with self._lock:
            if self._closed:
                raise ChannelError(f"the env group {self.env_indices} on {self.worker_address} was shut down")
            self._channel.send(request)
            return self._channel.recv(None)

    def _refresh_stats(self, timeout: float = _STATS_INTERVAL_S * 10) -> bool:
        """Copy the env process's step figures into this worker's metrics (False once closed)."""
        try:
            self._stats_channel.send(("stats", ()))
            status, value = self._stats_channel.recv(timeout)
        except (ChannelError, TimeoutError, OSError):
            return False  # the process is gone or stuck: the client finds out on its own channel
        if status == "ok":
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
        self._finalizer.detach()
        _stop_env_process(self._proc, wait=True)
        metrics.forget(self.stats)
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
) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    """Start the env process, send it ``config`` and wait for its description."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = f"import sys; sys.path.insert(0, {package_root!r}); from daskvec.worker import host_main; host_main()"
    read_fd, write_fd = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", code, str(write_fd)], stdin=subprocess.PIPE, pass_fds=(write_fd,)
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
        raise TimeoutError(f"the envs {env_indices} were not built within {timeout:.0f}s")
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


def _stop_env_process(proc: subprocess.Popen[bytes], wait: bool = True) -> None:
    """Ask the env process to stop (its stdin closes), then kill it if it does not.

    With ``wait=False`` (the actor was released, possibly on the worker's event loop
    or inside the garbage collector) the waiting and killing happen on the reaper
    thread.
    """
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if not wait:  # possibly inside the garbage collector: no thread starts here
        _RELEASES.put(functools.partial(_reap, proc))
    else:
        _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        logger.warning("env process %d did not stop within %.0fs; killing it", proc.pid, _STOP_GRACE_S)
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=_STOP_GRACE_S)


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
    os.kill(int(pid), signal.SIGKILL)
    logger.warning("killed env process %d, which the client dropped (a step hung)", pid)
    return True


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
    group: EnvGroup | None = None
    try:
        group = EnvGroup(*config["group_args"], **config["group_kwargs"])
        reply: tuple[str, Any] = ("ok", group.describe())
    except BaseException as e:  # sent to the actor, which raises it on the worker
        reply = ("err", _portable_exception(e))
    blob = cloudpickle.dumps(reply)
    with os.fdopen(out_fd, "wb") as out:
        out.write(struct.pack("!Q", len(blob)) + blob)
    if group is None:
        os._exit(1)
    while stdin.read(1 << 16):
        continue  # nothing more is sent: this returns when the worker closes the pipe or dies
    closer = threading.Thread(target=group.shutdown, name="daskvec-env-close", daemon=True)
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
