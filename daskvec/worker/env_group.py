"""The env-group actor: a slice of environments on one Dask worker.

An :class:`EnvGroup` builds its environments from their pickled factories (never on
the client), steps all of them for one request, and answers requests arriving on
either transport (see :mod:`daskvec.transport`): a direct authenticated socket served
by its own threads, or ordinary Dask actor calls to :meth:`EnvGroup.handle`. One lock
serialises the two.

Step semantics are by default those of Stable-Baselines3's vec envs: an env whose
episode ended (``terminated or truncated``) is reset at once, and its last observation
is kept for the reply's ``final_obs``. Gymnasium's other autoreset modes (reset at the
next step, or only when asked) are chosen at creation (``autoreset``). The replies are
columns (:class:`daskvec.protocol.messages.StepReply`); the client builds the info dicts from them.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from daskvec import config
from daskvec.errors import EnvRestartBudgetExceeded
from daskvec.monitoring import metrics
from daskvec.protocol.messages import (
    MASK_METHOD,
    Autoreset,
    Command,
    GroupDesc,
    GroupSpec,
    Request,
    ResetReply,
    StepReply,
    StepRequest,
    restart_seed,
)
from daskvec.protocol.rollout_records import RolloutReply, RolloutRequest
from daskvec.transport import ChannelError, ChannelServer, machine_id, pack_reply, unpack
from daskvec.transport.server import LOG_INTERVAL
from daskvec.transport.wire import RateLimitedLog
from daskvec.worker import probes
from daskvec.worker.build import build_env, build_group, build_vector, close_envs
from daskvec.worker.envs import (
    EnvFailure,
    action_masks,
    factory_name,
    has_method,
    has_wrapper_attr,
    is_wrapped,
    obs_shape,
    remote_error,
    row,
    stack_obs,
    stack_rows,
)
from daskvec.worker.off_policy import run_off_policy
from daskvec.worker.on_policy import run_rollout
from daskvec.worker.reaper import Release
from daskvec.worker.vector import VectorEnvs

logger = logging.getLogger(__name__)
#: An env that fails at every step is restarted at every step: one warning per restart
#: would flood the worker's log (the restarts are counted in the replies and the
#: dashboard anyway), so restart warnings go out at most once per interval per process.
_restart_log = RateLimitedLog(logger, LOG_INTERVAL)

__all__ = ["EnvGroup", "factory_name", "obs_shape", "stack_obs"]


class EnvGroup:
    """A slice of environments living on one Dask worker, as a stateful actor.

    Parameters
    ----------
    factories : bytes
        cloudpickled list of zero-argument callables, one per env.
    spec : GroupSpec
        What the client asks of the group (:class:`daskvec.protocol.messages.GroupSpec`): env
        indices, channel token, error policy and restart history, busy polling, action
        masks, autoreset mode, TLS and the build timeout. A ``busy_poll`` of ``None``
        is this worker's Dask config ``daskvec.busy-poll`` (see
        :func:`daskvec.config.worker_busy_poll`). With ``tls`` there is no Unix socket
        unless ``unix_dir`` names a directory (an env process's link to its actor,
        private to this user). Without a ``build_timeout`` the factories run on the
        calling thread; with one, on a thread of their own that is abandoned when they
        take longer (the worker's task thread is freed and
        :class:`~daskvec.errors.EnvBuildTimeoutError` names the env whose factory hung).
    worker_address : str, optional
        Address reported in errors and infos; by default the current worker's.
    listen_host : str, optional
        Interface of the direct channel; by default the current worker's host.
    unix_dir : str, optional
        Where the direct channel's Unix socket goes; by default
        (``WORKER_LOCAL_DIR``) the worker's local directory, which Dask cleans up after
        the worker, or the system's temporary directory outside a worker (``None``: no
        Unix socket).
    security : distributed.security.Security, optional
        Certificates of a TLS channel when not the current worker's (an env process
        gets its worker's).
    """

    def __init__(
        self,
        factories: bytes,
        spec: GroupSpec,
        *,
        worker_address: str | None = None,
        listen_host: str | None = None,
        unix_dir: str | probes.WorkerLocalDir | None = probes.WORKER_LOCAL_DIR,
        security: Any = None,
    ) -> None:
        self._worker = probes.current_worker()
        self.autoreset = Autoreset(spec.autoreset)
        self.always_pass_options = spec.always_pass_options
        # NEXT_STEP: envs whose next step request resets them (None), or hands out the
        # first observation and reset info of their rebuild
        self._pending: dict[int, tuple[Any, dict[str, Any]] | None] = {}
        self.worker_address: str = worker_address or str(getattr(self._worker, "address", "local"))
        token = spec.token
        # the direct channel's budget (checked before any env is built): given, or this worker's config
        self.busy_poll = None if token is None else config.worker_busy_poll(spec.busy_poll, self.worker_address)
        self.shared_memory = token is not None and config.worker_shared_memory(spec.shared_memory, self.worker_address)
        self.env_indices = list(spec.env_indices)
        self.on_env_error = spec.on_env_error
        self.max_restarts = spec.max_restarts
        self._lock = threading.Lock()
        self._closed = False
        self._factories: list[Callable[[], Any]] = cloudpickle.loads(factories)
        ssl_context = None
        if token is not None and spec.tls:  # before the build: a missing certificate fails fast
            ssl_context = probes.listen_ssl_context(self._worker, security)
        #: the group's one vectorized env (``spec.vector``), stepped with one call per request
        self.vector: VectorEnvs | None = None
        built = build_group(
            self._factories, self.env_indices, self.worker_address, self.autoreset, spec.vector, spec.build_timeout
        )
        if isinstance(built, VectorEnvs):
            self.vector = built
            self.envs: list[Any] = built.slots()  # what the per-env commands reach
            self.env_indices = self.env_indices or list(range(built.n))  # until Command.NUMBER
        else:
            self.envs = built
        # what the group closes on release; a restart replaces its entries in place
        self._owned: list[Any] = [self.vector] if self.vector is not None else self.envs
        n = len(self.envs)
        self.restarts = list(spec.error_restarts or [0] * n)
        self.rebuilds = list(spec.rebuilds) if spec.rebuilds is not None else list(self.restarts)
        self._send_masks = bool(spec.send_masks)
        self._masks_on = self._detect_masks()
        self._returns = np.zeros(n, dtype=np.float64)
        self._last_obs: Any = None
        self._seeds: list[int | None] = list(spec.base_seeds) if spec.base_seeds is not None else [None] * n
        self.stats = metrics.GroupStats(n)
        metrics.install_worker_metrics(self._worker, self.stats)
        self.deadline = probes.worker_deadline(self._worker)
        self._server = None if token is None else self._serve(token, spec.tls, listen_host, unix_dir, ssl_context)
        # Closes the channel and the envs once: from shutdown(), or when Dask dropped the
        # actor without one (the client gave the group up after a timeout, or died), or
        # when the group is garbage collected. Without it the envs, the sockets and the
        # listening threads of such a group would stay on the worker for good.
        self._release = Release(
            self, functools.partial(_release_group, self._server, self._owned, self.stats, self.worker_address)
        )
        self._commands = self._command_table()
        self._release.watch(self._worker, probes.actor_key(self._worker))  # last: release_dropped may run now

    # ---------------------------------------------------------------- lifecycle
    def _serve(
        self,
        token: bytes,
        tls: bool,
        listen_host: str | None,
        unix_dir: str | probes.WorkerLocalDir | None,
        ssl_context: Any,
    ) -> ChannelServer:
        """The group's direct channel: a server on ``listen_host`` (and a Unix socket in ``unix_dir``)."""
        if isinstance(unix_dir, probes.WorkerLocalDir):
            unix_dir = None if tls else probes.unix_dir(self._worker)
        # the server's threads must not keep the group alive: see the release in __init__
        return ChannelServer(
            listen_host or probes.listen_host(self._worker),
            token,
            _weak_dispatch(weakref.ref(self)),
            name="daskvec-group",
            unix_dir=unix_dir,
            busy_poll=self.busy_poll or 0.0,
            ssl_context=ssl_context,
            shared_memory=self.shared_memory,
            worker=self.worker_address,
        )

    def _command_table(self) -> dict[str, Callable[..., Any]]:
        """The method that answers each :class:`~daskvec.protocol.messages.Command` (:meth:`dispatch`)."""
        return {
            Command.RESET: self.reset,
            Command.GET_ATTR: self._get_attr,
            Command.SET_ATTR: self._set_attr,
            Command.ENV_METHOD: self._env_method,
            Command.IS_WRAPPED: self._is_wrapped,
            Command.RENDER: self._render,
            Command.STATS: self.stats.snapshot,
            Command.REFUSED: self.refused_connections,
            Command.HAS_ATTR: self._has_attr,
            Command.CALL: self._call,
            Command.SET_WRAPPER_ATTR: self._set_wrapper_attr,
            Command.ROLLOUT: self.rollout,
            Command.NUMBER: self._number,
            Command.OFF_POLICY: self.off_policy,
        }

    def describe(self) -> GroupDesc:
        """Spaces, worker, process and channel address of this group."""
        server = self._server
        vec = self.vector
        return GroupDesc(
            worker=self.worker_address,
            pid=os.getpid(),
            machine=machine_id(),
            observation_spaces=tuple(e.observation_space for e in self.envs),
            action_spaces=tuple(e.action_space for e in self.envs),
            vector=None if vec is None else vec.describe(),
            reseeds=vec is None or vec.reseeds,
            address=None if server is None else tuple(server.address),
            unix_path=None if server is None else server.unix_path,
            tls=server is not None and server.tls,
            deadline=self.deadline,
            profiler_hazard=probes.profiler_hazard(self._worker),
            busy_poll=self.busy_poll,
        )

    def busy_for(self) -> float:
        """Seconds in the step of the envs in progress (0 between steps): a hung env, to a client awaiting a rollout."""
        return self.stats.busy_for()

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
        self._release.now()  # unless the reaper released the group already
        return True

    def release_dropped(self) -> bool:
        """Release the group as :meth:`shutdown` does, without waiting for a call in progress.

        The reaper calls this once Dask dropped the actor without a shutdown: nobody will call the
        group again. Its channel closes at once; its envs close when no call is running (one that
        hung keeps them until it returns). Returns ``False`` while a call runs: the reaper asks again.
        """
        if self._server is not None:
            self._server.close()
        if not self._lock.acquire(blocking=False):
            return False
        self._closed = True  # cannot raise: no try needed around the lock
        self._lock.release()
        if self._release.now():
            logger.info("%r: Dask dropped the actor without a shutdown; its envs and channel are closed", self)
        return True

    # ---------------------------------------------------------------- dispatch
    def handle(self, data: bytes) -> bytes:
        """Entry point of the Dask-actor transport: encoded request in, encoded reply (or why it cannot be sent) out."""
        return pack_reply(self.dispatch(unpack(data)), self.worker_address)

    def dispatch(self, request: Request) -> Any:
        """Run one request, a :class:`StepRequest` or ``(command, args)``: its value or a :class:`RemoteError`."""
        with self._lock:
            try:
                if self._closed:
                    raise RuntimeError("this env group was shut down")
                if isinstance(request, StepRequest):
                    return self.step(request.actions)
                cmd, args = request
                return self._commands[cmd](*args)
            except EnvFailure as f:
                return f.error
            except Exception as e:
                return remote_error(e, None, self.worker_address)

    # ---------------------------------------------------------------- errors and restarts
    def _fail(self, pos: int, exc: BaseException) -> EnvFailure:
        return EnvFailure(remote_error(exc, self.env_indices[pos], self.worker_address))

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
        _restart_log(
            "restart",
            logging.WARNING,
            "env %d raised %s: %s; rebuilding it (restart %d)",
            index,
            type(exc).__name__,
            exc,
            count,
        )
        try:
            self.envs[pos].close()
        except Exception:
            logger.debug("closing crashed env %d failed", index, exc_info=True)
        seed = restart_seed(index, self.rebuilds[pos], self._seeds[pos])
        try:
            self.envs[pos] = build_env(self._factories[pos], index, self.worker_address)
            obs, reset_info = self._env_reset(self.envs[pos], seed, None)
        except Exception as e:
            raise self._fail(pos, e) from e
        self._masks_on = self._detect_masks()
        self._returns[pos] = 0.0
        return obs, dict(reset_info), self._marker(exc, pos, seed)

    def _marker(self, exc: BaseException, pos: int, seed: int) -> dict[str, Any]:
        """The restart marker of the env at ``pos``, rebuilt after ``exc`` and reset with ``seed``."""
        return {
            "restarted": True,
            "reason": "env_error",
            "error": f"{type(exc).__name__}: {exc}",
            "restarts": self.rebuilds[pos],
            "seed": seed,
            "worker": self.worker_address,
        }

    # ---------------------------------------------------------------- step and reset
    @property
    def last_obs(self) -> Any:
        """The envs' current observations, stacked (``None`` before the first reset)."""
        return self._last_obs

    def rollout(self, request: RolloutRequest) -> RolloutReply:
        """Run the envs for a whole rollout with the shipped policy (see :mod:`daskvec.worker.on_policy`)."""
        return run_rollout(self, request)

    def off_policy(self, request: RolloutRequest) -> RolloutReply:
        """Run the envs for an off-policy collection with the shipped actor (see :mod:`daskvec.worker.off_policy`)."""
        return run_off_policy(self, request)

    def step(self, actions: Any) -> StepReply:
        """Step every env with its action; an episode's end is handled as ``autoreset`` says."""
        self.stats.busy_since = time.monotonic()  # for busy_for, called from the actor's thread
        try:
            return self._step_vector(actions) if self.vector is not None else self._step_envs(actions)
        finally:
            self.stats.busy_since = None

    def _step_envs(self, actions: Any) -> StepReply:
        n = len(self.envs)
        obs_list: list[Any] = [None] * n
        reply = StepReply(None, np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        t0 = time.perf_counter()
        for pos in range(n):
            try:
                if pos in self._pending:  # NEXT_STEP: this request resets the env instead
                    obs_list[pos] = self._deliver_reset(pos, reply)
                else:
                    obs_list[pos] = self._step_one(pos, actions[pos], reply)
            except EnvFailure:
                raise
            except Exception as e:
                obs_list[pos] = self._step_failed(pos, e, reply)
        reply.masks = self._masks()
        reply.env_seconds = time.perf_counter() - t0
        self.stats.record_step(n, reply.env_seconds)
        reply.obs = self._last_obs = self._stack(obs_list)
        return reply

    def _step_one(self, pos: int, action: Any, reply: StepReply) -> Any:
        obs, rew, term, trunc, info = self.envs[pos].step(action)
        if info:
            reply.infos[pos] = info
        reply.rewards[pos] = rew
        self._returns[pos] += float(rew)
        if term or trunc:
            reply.terminated[pos], reply.truncated[pos] = bool(term), bool(trunc)
            self.stats.record_episode(self._returns[pos])
            self._returns[pos] = 0.0
            if self.autoreset is Autoreset.SAME_STEP:
                reply.final_obs[pos] = obs
                obs, reply.reset_infos[pos] = self._reset_one(pos, None, None, reply.restarted)
            elif self.autoreset is Autoreset.NEXT_STEP:
                self._pending[pos] = None
        return obs

    def _deliver_reset(self, pos: int, reply: StepReply) -> Any:
        """NEXT_STEP: reset an env whose episode ended (or hand out its rebuilt first observation)."""
        ready = self._pending.pop(pos)
        obs, info = self._reset_one(pos, None, None, reply.restarted) if ready is None else ready
        if info:
            reply.infos[pos] = info
        return obs

    def _step_failed(self, pos: int, exc: Exception, reply: StepReply) -> Any:
        """An env raised in its step: rebuild it (or raise), and report a truncation."""
        return self._report_restart(pos, *self._recover(pos, exc), reply)

    def _report_restart(
        self, pos: int, obs: Any, reset_info: dict[str, Any], marker: dict[str, Any], reply: StepReply
    ) -> Any:
        """Write a truncation for the env at ``pos``, rebuilt in this step; return the observation it shows."""
        reply.restarted[pos] = marker
        reply.rewards[pos], reply.terminated[pos], reply.truncated[pos] = 0.0, False, True
        reply.infos.pop(pos, None)
        last = None if self._last_obs is None else row(self._last_obs, pos)
        if self.autoreset is Autoreset.SAME_STEP:
            reply.reset_infos[pos] = reset_info
            if last is not None:
                reply.final_obs[pos] = last
            return obs
        # the truncation shows the observation the learner had; the rebuilt env's comes next
        if self.autoreset is Autoreset.NEXT_STEP:
            self._pending[pos] = (obs, reset_info)
        return obs if last is None else last

    def _stack(self, obs_list: list[Any]) -> Any:
        return stack_rows(obs_list, self.envs[0].observation_space, self.env_indices)

    def _reset_one(
        self, pos: int, seed: int | None, options: dict[str, Any] | None, restarted: dict[int, dict[str, Any]]
    ) -> tuple[Any, dict[str, Any]]:
        try:
            return self._env_reset(self.envs[pos], seed, options)
        except Exception as e:
            obs, reset_info, restarted[pos] = self._recover(pos, e)
            return obs, reset_info

    def _env_reset(
        self, env: gym.Env[Any, Any], seed: int | None, options: dict[str, Any] | None
    ) -> tuple[Any, dict[str, Any]]:
        """``env.reset`` as the group's face calls it (see ``GroupSpec.always_pass_options``)."""
        if options or self.always_pass_options:
            return env.reset(seed=seed, options=options)
        return env.reset(seed=seed)

    def reset(
        self,
        seeds: list[int | None],
        options: list[dict[str, Any] | None],
        user: bool = True,
        mask: Sequence[bool] | None = None,
    ) -> ResetReply:
        """Reset every env (or those ``mask`` selects), with its seed and options (``None``/empty: none).

        Seeds of a ``user`` reset become the envs' base seeds (restart seeds derive from
        them); those of a rebuilt group's first reset (restart seeds) do not. Envs left
        out by ``mask`` keep their observation and get an empty reset info. With
        ``autoreset=NEXT_STEP``, the envs of a rebuilt group's first reset hand their
        first observation out at their next step request.
        """
        if mask is not None and self._last_obs is None:
            raise ValueError("a reset with a mask needs a full reset first; call reset() without reset_mask")
        if self.vector is not None:
            return self._reset_vector(seeds, options, user, mask)
        obs_list = []
        reply = ResetReply(None, [])
        for pos in range(len(self.envs)):
            if mask is not None and not mask[pos]:
                obs_list.append(row(self._last_obs, pos))
                reply.reset_infos.append({})
                continue
            if user and seeds[pos] is not None:
                self._seeds[pos] = seeds[pos]
            self._pending.pop(pos, None)
            obs, info = self._reset_one(pos, seeds[pos], options[pos], reply.restarted)
            self._returns[pos] = 0.0
            obs_list.append(obs)
            reply.reset_infos.append(info)
            if not user and self.autoreset is Autoreset.NEXT_STEP:
                self._pending[pos] = (obs, info)
        reply.obs = self._last_obs = self._stack(obs_list)
        reply.masks = self._masks()
        return reply

    # ---------------------------------------------------------------- one vectorized env
    def _number(self, env_indices: Sequence[int]) -> None:
        """Take the vec-env indices of this group's envs (a vector group learns them once built)."""
        if len(env_indices) != len(self.envs):
            raise ValueError(f"{len(env_indices)} indices for a group of {len(self.envs)} envs")
        self.env_indices = [int(i) for i in env_indices]

    def _step_vector(self, actions: Any) -> StepReply:
        """:meth:`step` for a group made of one vectorized env: one call steps them all."""
        vec = self.vector
        assert vec is not None
        n = vec.n
        t0 = time.perf_counter()
        if self._pending:  # NEXT_STEP after a rebuild: hand out the first observations, step nothing
            reply = self._deliver_pending(n)
        else:
            try:
                out = vec.step(actions)
            except Exception as e:
                reply = self._vector_failed(e)
            else:
                reply = StepReply(
                    out.obs, out.rewards, out.terminated, out.truncated, out.final_obs, out.infos, out.reset_infos
                )
                self._count_returns(reply)
        reply.masks = self._masks()
        reply.env_seconds = time.perf_counter() - t0
        self.stats.record_step(n, reply.env_seconds)
        self._last_obs = reply.obs
        return reply

    def _count_returns(self, reply: StepReply) -> None:
        self._returns += reply.rewards
        done = reply.terminated | reply.truncated
        for pos in np.flatnonzero(done):
            self.stats.record_episode(self._returns[pos])
            self._returns[pos] = 0.0

    def _deliver_pending(self, n: int) -> StepReply:
        """NEXT_STEP: the step after a vector group's rebuild returns its first observations (reward 0)."""
        reply = StepReply(None, np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        rows = []
        for pos in range(n):
            ready = self._pending.pop(pos, None)
            rows.append(row(self._last_obs, pos) if ready is None else ready[0])
            if ready is not None and ready[1]:
                reply.infos[pos] = ready[1]
        reply.obs = self._stack(rows)
        return reply

    def _vector_failed(self, exc: Exception) -> StepReply:
        """The vector env raised in its step: rebuild it (or raise); every env reports a truncation."""
        n = len(self.envs)
        obs, infos, markers = self._recover_vector(exc)
        reply = StepReply(None, np.zeros(n, dtype=np.float64), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool))
        rows = [self._report_restart(pos, row(obs, pos), infos[pos], markers[pos], reply) for pos in range(n)]
        reply.obs = self._stack(rows)
        return reply

    def _recover_vector(self, exc: Exception) -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
        """Handle the vector env's exception by the group's policy: raise it, or rebuild the vector env.

        Returns the rebuilt envs' first observations, their reset infos and restart markers.
        """
        self.stats.errors += 1
        if self.on_env_error != "restart":
            raise self._fail_vector(exc) from exc
        n = len(self.envs)
        for pos in range(n):
            self.restarts[pos] += 1
            self.rebuilds[pos] += 1
        self.stats.restarts += n
        worst = int(np.argmax(self.restarts))
        if self.restarts[worst] > self.max_restarts:
            err = EnvRestartBudgetExceeded(
                f"the vector env of envs {self.env_indices} crashed {self.restarts[worst]} times, more than "
                f"max_restarts={self.max_restarts}; last error: {type(exc).__name__}: {exc}",
                env_index=self.env_indices[worst],
                restarts=self.restarts[worst],
            )
            err.__cause__ = exc
            raise self._fail_vector(err)
        _restart_log(
            "restart",
            logging.WARNING,
            "the vector env of envs %s raised %s: %s; rebuilding it (restart %d)",
            self.env_indices,
            type(exc).__name__,
            exc,
            self.restarts[worst],
        )
        with contextlib.suppress(Exception):
            self._owned[0].close()
        seeds = [restart_seed(i, self.rebuilds[pos], self._seeds[pos]) for pos, i in enumerate(self.env_indices)]
        try:
            vec = build_vector(self._factories[0], self.env_indices, self.worker_address, self.autoreset)
            self.vector, self._owned[0], self.envs[:] = vec, vec, vec.slots()
            obs, infos = vec.reset(seeds, [{}] * n)
        except Exception as e:
            raise self._fail_vector(e) from e
        self._masks_on = self._detect_masks()
        self._returns[:] = 0.0
        return obs, infos, [self._marker(exc, pos, seeds[pos]) for pos in range(n)]

    def _fail_vector(self, exc: BaseException) -> EnvFailure:
        exc.add_note(f"daskvec: raised by the vector env of envs {self.env_indices} on {self.worker_address}")
        return EnvFailure(remote_error(exc, None, self.worker_address))

    def _reset_vector(
        self, seeds: list[int | None], options: list[dict[str, Any] | None], user: bool, mask: Sequence[bool] | None
    ) -> ResetReply:
        """:meth:`reset` for a group made of one vectorized env."""
        vec = self.vector
        assert vec is not None
        chosen = range(vec.n) if mask is None else [pos for pos in range(vec.n) if mask[pos]]
        for pos in chosen:
            if user and seeds[pos] is not None:
                self._seeds[pos] = seeds[pos]
            self._pending.pop(pos, None)
            self._returns[pos] = 0.0
        vec.check_options(options, mask)  # a caller's mistake: raised as it is, never "recovered"
        reply = ResetReply(None, [])
        try:
            reply.obs, reply.reset_infos = vec.reset(seeds, options, mask, self._last_obs)
        except Exception as e:
            reply.obs, reply.reset_infos, markers = self._recover_vector(e)
            reply.restarted = dict(enumerate(markers))
        if not user and self.autoreset is Autoreset.NEXT_STEP:
            for pos in chosen:
                self._pending[pos] = (row(reply.obs, pos), reply.reset_infos[pos])
        self._last_obs = reply.obs
        reply.masks = self._masks()
        return reply

    # ---------------------------------------------------------------- action masks
    def _detect_masks(self) -> bool:
        """Whether the masks travel with the replies: asked for, and every env has the method."""
        if self.vector is not None and self.vector.sub_envs is None:
            return False  # asking a vector env for a method of each env would act on all of them
        return self._send_masks and all(has_method(env, MASK_METHOD) for env in self.envs)

    def _masks(self) -> np.ndarray | None:
        """Every env's action mask, stacked (:func:`~daskvec.worker.envs.action_masks`), when they travel."""
        return action_masks(self.envs, self.env_indices) if self._masks_on else None

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

    def _has_attr(self, name: str, positions: Sequence[int]) -> list[bool]:
        return self._each(positions, lambda env: has_wrapper_attr(env, name))

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], positions: Sequence[int]) -> list[Any]:
        def call(env: gym.Env[Any, Any]) -> Any:
            attr = env.get_wrapper_attr(name)
            return attr(*args, **kwargs) if callable(attr) else attr

        return self._each(positions, call)

    def _set_wrapper_attr(self, name: str, values: Sequence[Any], positions: Sequence[int]) -> None:
        todo = iter(values)
        self._each(positions, lambda env: env.set_wrapper_attr(name, next(todo)))

    def _is_wrapped(self, wrapper_class: type, positions: Sequence[int]) -> list[bool]:
        return self._each(positions, lambda env: is_wrapped(env, wrapper_class))

    def _render(self, positions: Sequence[int]) -> list[Any]:
        return self._each(positions, lambda env: env.render())

    def __repr__(self) -> str:
        return f"EnvGroup(envs={self.env_indices}, worker={self.worker_address!r})"


def _release_group(
    server: ChannelServer | None, envs: list[gym.Env[Any, Any]], stats: metrics.GroupStats, where: str
) -> None:
    """Close what an :class:`EnvGroup` holds (its :class:`Release` job: must not refer to the group)."""
    if server is not None:
        server.close()
    close_envs(envs, where)
    metrics.forget(stats)


def _weak_dispatch(ref: weakref.ref[EnvGroup]) -> Callable[[Any], Any]:
    """The direct channel's handler: the group's ``dispatch``, without keeping the group alive."""

    def dispatch(request: Any) -> Any:
        group = ref()
        if group is None:
            raise ChannelError("the env group was released")
        return group.dispatch(request)

    return dispatch
