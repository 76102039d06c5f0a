"""The env-group actor: a slice of environments on one Dask worker.

An :class:`EnvGroup` builds its environments from their pickled factories (never on
the client), steps all of them for one request, and answers requests arriving on
either transport (see :mod:`daskvec.transport`): a direct authenticated socket served
by its own threads, or ordinary Dask actor calls to :meth:`EnvGroup.handle`. One lock
serialises the two.

Step semantics are those of Stable-Baselines3's vec envs: an env whose episode ended
(``terminated or truncated``) is reset at once, and its last observation is kept for
the reply's ``final_obs``. The replies are columns (:class:`daskvec.protocol.StepReply`);
the client builds SB3's info dicts from them.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from daskvec import metrics
from daskvec.errors import EnvRestartBudgetExceeded
from daskvec.protocol import Command, RemoteError, ResetReply, RolloutReply, RolloutRequest, StepReply, restart_seed
from daskvec.transport import ChannelError, ChannelServer, machine_id, pack, unpack
from daskvec.worker import probes
from daskvec.worker.reaper import queue_release, start_reaper
from daskvec.worker.rollout import run_rollout

logger = logging.getLogger(__name__)

__all__ = ["WORKER_DIRECTORY", "EnvGroup", "obs_shape", "stack_obs"]


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
        stacked = np.array(obs_list)  # one C call; np.stack does the same in Python
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


class _EnvFailure(Exception):
    """Internal: carries a :class:`RemoteError` out of a command."""

    def __init__(self, error: RemoteError) -> None:
        super().__init__(error.message)
        self.error = error


def remote_error(exc: BaseException, env_index: int | None, worker: str) -> RemoteError:
    """``exc`` as a :class:`~daskvec.protocol.RemoteError` (with the exception itself when it pickles)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: bytes | None = cloudpickle.dumps(exc)
        cloudpickle.loads(blob)
    except Exception:
        blob = None
    return RemoteError(
        type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback=tb,
        env_index=env_index,
        worker=worker,
        exc=blob,
    )


class _WorkerDirectory:
    """Default of ``EnvGroup(unix_dir=...)``: the worker's local directory (see :func:`probes.unix_dir`)."""

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
        Error restarts of these envs in an earlier life (they count against the budget).
    rebuilds : list of int, optional
        How many times each env was rebuilt so far, for any reason: the restart count
        its next restart seed derives from (see :func:`daskvec.protocol.restart_seed`).
    base_seeds : list of int or None, optional
        The seed the user last gave each env, which restart seeds derive from.
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
        rebuilds: list[int] | None = None,
        base_seeds: list[int | None] | None = None,
        worker_address: str | None = None,
        listen_host: str | None = None,
        unix_dir: str | _WorkerDirectory | None = WORKER_DIRECTORY,
        busy_poll: float = 0.0,
    ) -> None:
        self._worker = probes.current_worker()
        self.worker_address: str = worker_address or str(getattr(self._worker, "address", "local"))
        self.env_indices = list(env_indices)
        self.on_env_error = on_env_error
        self.max_restarts = max_restarts
        self.restarts = list(restarts) if restarts is not None else [0] * len(env_indices)
        self.rebuilds = list(rebuilds) if rebuilds is not None else list(self.restarts)
        self._lock = threading.Lock()
        self._closed = False
        self._factories: list[Callable[[], gym.Env[Any, Any]]] = cloudpickle.loads(factories)
        self.envs = self._build_all()
        n = len(self.envs)
        self._returns = np.zeros(n, dtype=np.float64)
        self._last_obs: Any = None
        self._seeds: list[int | None] = list(base_seeds) if base_seeds is not None else [None] * n
        self.stats = metrics.GroupStats(n)
        metrics.install_worker_metrics(self._worker, self.stats)
        self.deadline = probes.worker_deadline(self._worker)
        self._server: ChannelServer | None = None
        if token is not None:
            # the server's threads must not keep the group alive: see the finalizer below
            self._server = ChannelServer(
                listen_host or probes.listen_host(self._worker),
                token,
                _weak_dispatch(weakref.ref(self)),
                name="daskvec-group",
                unix_dir=probes.unix_dir(self._worker) if isinstance(unix_dir, _WorkerDirectory) else unix_dir,
                busy_poll=busy_poll,
            )
        # Closes the channel and the envs once: from shutdown(), or when the group is
        # garbage collected because Dask dropped the actor without a shutdown (its client
        # died, e.g. a notebook kernel killed mid-run). Without it the envs, the sockets
        # and the listening threads of such a group would stay on the worker for good.
        self._release_job = functools.partial(_release_group, self._server, self.envs, self.stats, self.worker_address)
        start_reaper()
        self._finalizer = weakref.finalize(self, queue_release, self._release_job)
        self._finalizer.atexit = False
        self._commands: dict[str, Callable[..., Any]] = {
            Command.STEP: self.step,
            Command.RESET: self.reset,
            Command.GET_ATTR: self._get_attr,
            Command.SET_ATTR: self._set_attr,
            Command.ENV_METHOD: self._env_method,
            Command.IS_WRAPPED: self._is_wrapped,
            Command.RENDER: self._render,
            Command.STATS: self.stats.snapshot,
            Command.REFUSED: self.refused_connections,
            Command.ROLLOUT: self.rollout,  # issue 13
        }

    # ---------------------------------------------------------------- lifecycle
    def _build_all(self) -> list[gym.Env[Any, Any]]:
        envs: list[gym.Env[Any, Any]] = []
        try:
            for pos, fn in enumerate(self._factories):
                env = self._build(pos, fn)
                for other_pos, other in enumerate(envs):
                    if other is env:
                        raise ValueError(
                            f"env factories {self.env_indices[other_pos]} and {self.env_indices[pos]} returned "
                            "the same environment instance; each factory must create a new env "
                            "(e.g. `lambda: gym.make(...)`)"
                        )
                envs.append(env)
        except BaseException:
            _close_envs(envs, self.worker_address)
            raise
        return envs

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
            "profiler_hazard": probes.profiler_hazard(self._worker),
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
        """Run one ``(command, args)`` request; return its value or a :class:`RemoteError`."""
        with self._lock:
            try:
                cmd, args = request
                if self._closed:
                    raise RuntimeError("this env group was shut down")
                return self._commands[cmd](*args)
            except _EnvFailure as f:
                return f.error
            except Exception as e:
                return remote_error(e, None, self.worker_address)

    # ---------------------------------------------------------------- errors and restarts
    def _fail(self, pos: int, exc: BaseException) -> _EnvFailure:
        return _EnvFailure(remote_error(exc, self.env_indices[pos], self.worker_address))

    def _recover(self, pos: int, exc: Exception) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        """Handle an env's exception by the group's policy: raise it, or rebuild the env.

        Returns the rebuilt env's first observation, its reset info and the restart marker.
        """
        self.stats.errors += 1
        if self.on_env_error != "restart":
            raise self._fail(pos, exc) from exc
        return self._restart(pos, exc)

    def _restart(self, pos: int, exc: BaseException) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        index = self.env_indices[pos]
        self.restarts[pos] += 1
        self.rebuilds[pos] += 1
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
        seed = restart_seed(index, self.rebuilds[pos], self._seeds[pos])
        try:
            self.envs[pos] = self._build(pos, self._factories[pos])
            obs, reset_info = self.envs[pos].reset(seed=seed)
        except Exception as e:
            raise self._fail(pos, e) from e
        marker = {
            "restarted": True,
            "reason": "env_error",
            "error": f"{type(exc).__name__}: {exc}",
            "restarts": self.rebuilds[pos],
            "seed": seed,
            "worker": self.worker_address,
        }
        self._returns[pos] = 0.0
        return obs, dict(reset_info), marker

    # ---------------------------------------------------------------- step and reset
    @property
    def last_obs(self) -> Any:
        """The envs' current observations, stacked (``None`` before the first reset)."""
        return self._last_obs

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        """Run the envs for a whole rollout with the shipped policy (see :mod:`daskvec.worker.rollout`)."""
        return run_rollout(self, request)

    def step(self, actions: Any) -> StepReply:
        """Step every env with its action; reset those whose episode ended."""
        n = len(self.envs)
        obs_list: list[Any] = [None] * n
        rewards = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=bool)
        truncated = np.zeros(n, dtype=bool)
        reply = StepReply(None, rewards, terminated, truncated)
        t0 = time.perf_counter()
        for pos, env in enumerate(self.envs):
            try:
                obs, rew, term, trunc, info = env.step(actions[pos])
                if info:
                    reply.infos[pos] = info
                rewards[pos] = rew
                self._returns[pos] += float(rew)
                if term or trunc:
                    terminated[pos], truncated[pos] = bool(term), bool(trunc)
                    reply.final_obs[pos] = obs
                    self.stats.record_episode(self._returns[pos])
                    self._returns[pos] = 0.0
                    obs, reply.reset_infos[pos] = self._reset_one(pos, None, None, reply.restarted)
            except _EnvFailure:
                raise
            except Exception as e:
                obs, reply.reset_infos[pos], reply.restarted[pos] = self._recover(pos, e)
                rewards[pos], terminated[pos], truncated[pos] = 0.0, False, True
                reply.infos.pop(pos, None)
                if self._last_obs is not None:
                    reply.final_obs[pos] = _row(self._last_obs, pos)
            obs_list[pos] = obs
        reply.env_seconds = time.perf_counter() - t0
        self.stats.record_step(n, reply.env_seconds)
        reply.obs = self._last_obs = self._stack(obs_list)
        return reply

    def _stack(self, obs_list: list[Any]) -> Any:
        try:
            return stack_obs(obs_list, self.envs[0].observation_space)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            shapes = ", ".join(f"env {i}: {obs_shape(o)}" for i, o in zip(self.env_indices, obs_list, strict=True))
            raise ValueError(
                f"the observations of envs {self.env_indices} do not stack ({shapes}): {e}; "
                "make each env's observations match its observation_space"
            ) from e

    def _reset_one(
        self, pos: int, seed: int | None, options: dict[str, Any] | None, restarted: dict[int, dict[str, Any]]
    ) -> tuple[Any, dict[str, Any]]:
        env = self.envs[pos]
        try:
            if options:
                return env.reset(seed=seed, options=options)
            return env.reset(seed=seed)
        except Exception as e:
            obs, reset_info, restarted[pos] = self._recover(pos, e)
            return obs, reset_info

    def reset(self, seeds: list[int | None], options: list[dict[str, Any]], user: bool = True) -> ResetReply:
        """Reset every env, with its seed and options (``None``/empty: none).

        Seeds of a ``user`` reset become the envs' base seeds (restart seeds derive from
        them); those of a rebuilt group's first reset (restart seeds) do not.
        """
        obs_list = []
        reply = ResetReply(None, [])
        for pos in range(len(self.envs)):
            if user and seeds[pos] is not None:
                self._seeds[pos] = seeds[pos]
            obs, info = self._reset_one(pos, seeds[pos], options[pos], reply.restarted)
            self._returns[pos] = 0.0
            obs_list.append(obs)
            reply.reset_infos.append(info)
        reply.obs = self._last_obs = self._stack(obs_list)
        return reply

    # ---------------------------------------------------------------- per-env commands
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


def _weak_dispatch(ref: weakref.ref[EnvGroup]) -> Callable[[Any], Any]:
    """The direct channel's handler: the group's ``dispatch``, without keeping the group alive."""

    def dispatch(request: Any) -> Any:
        group = ref()
        if group is None:
            raise ChannelError("the env group was released")
        return group.dispatch(request)

    return dispatch
