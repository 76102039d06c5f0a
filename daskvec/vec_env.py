"""Client side: :class:`DaskVecEnv`, a Stable-Baselines3 ``VecEnv`` on Dask actors.

The vec env splits its environments into groups; each group is one
:class:`~daskvec.worker.EnvGroup` actor on a Dask worker. A step sends one request
per group (see :mod:`daskvec.transport`), waits once for all replies, and writes
them into preallocated buffers, exactly as ``DummyVecEnv`` lays them out.

Fault tolerance lives here too: a group whose worker died, hung past the timeout,
is about to reach its walltime or is moved by :meth:`DaskVecEnv.rebalance` is
rebuilt from its factories on another worker, and each of its envs reports a
truncation (``done=True``, ``info["TimeLimit.truncated"]=True``) with the last
observation as ``info["terminal_observation"]`` and a ``info["daskvec"]`` marker.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import secrets
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)
from stable_baselines3.common.vec_env.util import dict_to_obs, obs_space_info

from daskvec import cluster as _cluster
from daskvec import recovery
from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
    NoAsyncCallError,
    RemoteEnvError,
    StepTimeoutError,
    WorkerLostError,
)
from daskvec.metrics import CLIENT_TOPIC, ClientTimer, client_message
from daskvec.transport import (
    ActorChannel,
    Channel,
    ChannelError,
    DirectChannel,
    StepReply,
    check_busy_poll,
    iter_replies,
    machine_id,
    recv_many,
)
from daskvec.worker import INFO_KEY, EnvGroup, EnvHost, kill_env_process, obs_shape, restart_seed

logger = logging.getLogger(__name__)

try:  # the dashboard page, for every scheduler this process starts from now on
    from daskvec import dashboard as _dashboard

    _dashboard.install()
except ImportError as _e:  # Bokeh missing or too old for Dask's dashboard
    logger.debug("daskvec dashboard page not installed: %s", _e)

__all__ = ["DaskVecEnv"]

_TRANSPORTS = ("auto", "direct", "actor")
_POLICIES_LOST = ("restart", "raise")
_POLICIES_ERROR = ("raise", "restart")
_STATS_INTERVAL = 2.0
#: Seconds a worker that failed to create an env group in time, or left a step
#: unanswered, gets no new envs while other workers can take them: placing on a frozen
#: worker costs a full ``timeout`` every time.
QUARANTINE_S = 600.0


@dataclass(eq=False)  # identity semantics: groups are compared and looked up as handles
class _Group:
    """Client-side handle of one env-group actor."""

    gid: str
    env_indices: list[int]
    worker: str
    future: Any
    actor: Any
    channel: Channel
    deadline: float | None = None
    index: Any = None  # slice or index array into the vec env's buffers
    failed: BaseException | None = None
    last_restarts: list[int] | None = None  # the worker's crash-restart counts last synced

    def __post_init__(self) -> None:
        idx = self.env_indices
        if idx == list(range(idx[0], idx[0] + len(idx))):
            self.index = slice(idx[0], idx[0] + len(idx))
        else:
            self.index = np.asarray(idx, dtype=np.intp)


#: Groups to tear down, and the (env indices, worker) groups that replace them.
_Moves = tuple[list[_Group], list[tuple[list[int], str]]]


def _raise_remote(payload: dict[str, Any]) -> None:
    """Re-raise an error reported by a worker with its original type and context."""
    exc: BaseException | None = None
    if payload.get("exc") is not None:
        import cloudpickle

        try:
            exc = cloudpickle.loads(payload["exc"])
        except Exception:
            exc = None
    if not isinstance(exc, BaseException):
        exc = RemoteEnvError(f"{payload['type']}: {payload['message']}", remote_type=payload["type"])
    index = payload.get("env_index")
    where = f"env {index}" if index is not None else "an env group"
    note = (
        f"daskvec: raised by {where} on worker {payload.get('worker')}\n"
        f"--- remote traceback ---\n{payload.get('traceback', '')}"
    )
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    with contextlib.suppress(Exception):
        exc.env_index = index  # type: ignore[attr-defined]
        exc.worker = payload.get("worker")  # type: ignore[attr-defined]
    raise exc


def _unwrap(reply: Any) -> Any:
    status, value = reply
    if status == "err":
        _raise_remote(value)
    return value


class DaskVecEnv(VecEnv):
    """A vectorized environment whose envs live as Dask actors on a cluster.

    A drop-in replacement for ``SubprocVecEnv``: the same step, reset, seeding and
    auto-reset semantics, and the same ``get_attr``/``set_attr``/``env_method``
    interface, with the environments spread over the workers of a
    ``dask.distributed`` cluster in groups (one actor holds a slice of envs, and
    a step costs one round trip per actor).

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument callables that each create one environment. They are pickled
        and called on the workers, never on the client. Functions and classes from
        ``__main__``, notebooks or local modules are sent by value.
    client : distributed.Client, str, Cluster or None, optional
        Where the envs run. A ``Client``; a scheduler address such as
        ``"tcp://10.0.0.1:8786"``; a cluster object (``LocalCluster``,
        ``SLURMCluster``, ...); or ``None``: the current default client if there is
        one, else an embedded multi-process ``LocalCluster`` sized to this machine,
        which :meth:`close` shuts down. DaskVecEnv never closes a client or cluster
        it did not create.
    envs_per_actor : int, optional
        Envs per actor. Default: one actor per eligible worker, envs spread evenly.
    workers : list of str, optional
        Addresses or names of the workers that may hold envs.
    resources : dict, optional
        Worker resources (e.g. ``{"envs": 1}``) a worker must have to hold envs.
    transport : {"auto", "direct", "actor"}
        ``"direct"``: a dedicated authenticated socket to each actor (fast);
        ``"actor"``: plain Dask actor calls; ``"auto"`` (default): direct where the
        worker can be reached and the cluster does not use TLS, else actor calls.
    env_process : bool
        Run each group's envs in a process of their own beside its worker (POSIX
        systems only). An env that crashes the interpreter then takes only its group
        down (it is rebuilt like a lost one), a hung step can be ended by killing that
        process, and stepping never competes with the worker's event loop for the GIL.
        It costs one Python interpreter per group and 1-4 s more to build the envs
        (each process imports what the factories need). Default ``False``: the envs
        live inside the worker process.
    busy_poll : float
        Seconds a group's direct channel keeps polling for the next step after each
        reply before it sleeps (default 0.002). While the client steps quickly, the
        next request is then picked up without waking a sleeping thread, which costs
        tens to hundreds of microseconds per round trip on virtual machines. It spends
        at most this much worker CPU per step, only when one group is stepping in the
        worker's process, and stops while the client is slow (e.g. during training
        updates). ``0`` turns it off; it has no effect on the actor transport.
    timeout : float
        Seconds any single wait may take (creating envs, attribute calls, reset).
    step_timeout : float, optional
        Seconds a step may take before its envs are treated as hung; defaults to
        ``timeout``.
    on_worker_lost : {"restart", "raise"}
        When a worker holding envs dies or hangs: rebuild its envs on live workers
        and report truncations (default), or raise :class:`~daskvec.errors.WorkerLostError`.
    on_env_error : {"raise", "restart"}
        When an env raises in ``step``/``reset``: re-raise it on the client
        (default, like ``SubprocVecEnv``), or rebuild that env and report a
        truncation with the error in its info.
    max_restarts : int
        Per-env budget of restarts after env errors (``on_env_error="restart"``);
        past it, :class:`~daskvec.errors.EnvRestartBudgetExceeded` is raised.
    worker_wait_timeout : float
        Seconds to wait for an eligible worker when none is left.
    migrate_before : float
        Envs on a worker expected to leave within this many seconds (its
        ``--lifetime`` or batch-job walltime) are moved off it beforehand.
    auto_rebalance : bool
        Check every ``rebalance_interval`` seconds whether workers joined and move
        envs onto them (each moved env reports a truncation).
    rebalance_interval : float
        See ``auto_rebalance``.
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.

    Attributes
    ----------
    restart_counts : numpy.ndarray
        How many times each env was rebuilt (lost worker, hang, move or env error).
    error_restarts : numpy.ndarray
        How many of those were caused by the env's own exceptions.
    restart_log : list of dict
        One entry per rebuilt env: index, reason, worker, step.

    Raises
    ------
    TypeError
        ``env_fns`` is not a list of callables, or a factory cannot be pickled.
    ValueError
        ``env_fns`` is empty, the envs' spaces differ, two factories share one env
        instance, an option has an invalid value, or the scheduler cannot be reached.

    Examples
    --------
    >>> from stable_baselines3 import PPO
    >>> from stable_baselines3.common.env_util import make_vec_env
    >>> from daskvec import DaskVecEnv
    >>> env = make_vec_env("CartPole-v1", n_envs=8, vec_env_cls=DaskVecEnv)  # doctest: +SKIP
    >>> model = PPO("MlpPolicy", env, device="cpu").learn(25_000)  # doctest: +SKIP
    >>> env.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        client: Any = None,
        *,
        envs_per_actor: int | None = None,
        workers: Sequence[str] | None = None,
        resources: dict[str, float] | None = None,
        transport: str = "auto",
        env_process: bool = False,
        busy_poll: float = 2e-3,
        timeout: float = 300.0,
        step_timeout: float | None = None,
        on_worker_lost: str = "restart",
        on_env_error: str = "raise",
        max_restarts: int = 10,
        worker_wait_timeout: float = 300.0,
        migrate_before: float = 120.0,
        auto_rebalance: bool = False,
        rebalance_interval: float = 10.0,
        cluster_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.closed = True  # until construction succeeds; makes close()/__del__ safe
        self.waiting = False
        env_fns = self._check_env_fns(env_fns)
        if transport not in _TRANSPORTS:
            raise ValueError(f"transport must be one of {_TRANSPORTS}, not {transport!r}")
        if on_worker_lost not in _POLICIES_LOST:
            raise ValueError(f"on_worker_lost must be one of {_POLICIES_LOST}, not {on_worker_lost!r}")
        if on_env_error not in _POLICIES_ERROR:
            raise ValueError(f"on_env_error must be one of {_POLICIES_ERROR}, not {on_env_error!r}")
        if envs_per_actor is not None and (not isinstance(envs_per_actor, int) or envs_per_actor < 1):
            raise ValueError(f"envs_per_actor must be a positive int or None, not {envs_per_actor!r}")
        for name, value in (("timeout", timeout), ("worker_wait_timeout", worker_wait_timeout)):
            if not value or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
        if step_timeout is not None and step_timeout <= 0:
            raise ValueError(f"step_timeout must be a positive number of seconds, not {step_timeout!r}")
        if not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be a non-negative int, not {max_restarts!r}")

        if not isinstance(env_process, bool):
            raise TypeError(f"env_process must be True or False, not {env_process!r}")

        self.env_fns = list(env_fns)
        n_envs = len(self.env_fns)
        self.env_process = env_process and os.name == "posix"
        self.timeout = float(timeout)
        self.busy_poll = check_busy_poll(busy_poll)
        self.step_timeout = float(step_timeout) if step_timeout is not None else self.timeout
        self.on_worker_lost = on_worker_lost
        self.on_env_error = on_env_error
        self.max_restarts = max_restarts
        self.worker_wait_timeout = float(worker_wait_timeout)
        self.migrate_before = float(migrate_before)
        self.auto_rebalance = auto_rebalance
        self.rebalance_interval = float(rebalance_interval)
        self.envs_per_actor = envs_per_actor
        self.workers_filter = list(workers) if workers else None
        self.resources = dict(resources) if resources else None
        self.restart_counts = np.zeros(n_envs, dtype=np.int64)
        self.error_restarts = np.zeros(n_envs, dtype=np.int64)
        self.restart_log: list[dict[str, Any]] = []
        self.timer = ClientTimer()
        self._base_seeds: list[int | None] = [None] * n_envs
        self._groups: list[_Group] = []
        self._steps = 0
        self._last_stats = time.monotonic()
        self._last_rebalance_check = time.monotonic()
        # fault tolerance (see the "fault tolerance" section)
        self._broken: BaseException | None = None
        self._worker_deadlines: dict[str, float | None] = {}
        self._quarantine: dict[str, float] = {}  # worker -> time.monotonic() it may take envs again
        self._profiler_warned: set[str] = set()
        self._pending_moves: _Moves | None = None
        self._pending_reports: dict[int, tuple[dict[str, Any], Any]] = {}
        self._arrived: dict[str, Any] = {}  # replies of the pending step already read, by group id
        self._next_migrate_check = 0.0

        self._resolved = _cluster.resolve_client(
            client, connect_timeout=min(self.timeout, 30.0), cluster_kwargs=cluster_kwargs
        )
        self.client = self._resolved.client
        if transport == "direct" and _cluster.uses_tls(self.client):
            self._resolved.close()
            raise ValueError(
                "transport='direct' is not available on a TLS-secured cluster (the direct "
                "channel is not encrypted); use transport='auto' or 'actor'"
            )
        self.transport = "actor" if _cluster.uses_tls(self.client) else transport
        try:
            self._register_scheduler_plugin()
            workers_now = self._wait_for_workers(exclude=())
            layout = _cluster.plan_groups(n_envs, len(workers_now), envs_per_actor)
            placement = _cluster.assign_workers(layout, workers_now)
            self._groups = self._spawn(list(zip(layout, placement, strict=True)))
            self._check_spaces()
        except BaseException:
            self._teardown_groups(self._groups, graceful=False)
            self._resolved.close()
            raise
        self.closed = False
        first = self._describe[self._groups[0].gid]
        super().__init__(n_envs, first["observation_space"], first["action_space"])
        self.keys, shapes, dtypes = obs_space_info(self.observation_space)
        self._single_obs = self.keys == [None]  # one array, not a Dict or Tuple space
        # keyed like SB3's DummyVecEnv: None for a single array, names for Dict, ints for Tuple
        self.buf_obs: dict[Any, np.ndarray] = {
            k: np.zeros((n_envs, *tuple(shapes[k])), dtype=dtypes[k]) for k in self.keys
        }
        self.buf_rews = np.zeros(n_envs, dtype=np.float32)
        self.buf_dones = np.zeros(n_envs, dtype=bool)
        self.buf_infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]
        self._has_obs = False
        logger.info(
            "DaskVecEnv: %d envs in %d groups over %d workers (%s transport)",
            n_envs,
            len(self._groups),
            len({g.worker for g in self._groups}),
            self.transport_summary(),
        )

    # ------------------------------------------------------------------ checks
    @staticmethod
    def _check_env_fns(env_fns: Any) -> list[Callable[[], Any]]:
        if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
            if callable(env_fns):
                raise TypeError("env_fns must be a list of env factories, not a single callable; wrap it: [make_env]")
            raise TypeError(f"env_fns must be a list of callables that create envs, not {type(env_fns).__name__}")
        fns = list(env_fns)
        if not fns:
            raise ValueError("env_fns is empty: pass at least one callable that creates an env")
        owner: dict[int, int] = {}
        for i, fn in enumerate(fns):
            if not callable(fn):
                raise TypeError(
                    f"env_fns[{i}] is a {type(fn).__name__}, not a callable; pass factories such as "
                    "`lambda: gym.make('CartPole-v1')`, not env instances"
                )
            for captured in _captured_envs(fn):
                if id(captured) in owner and owner[id(captured)] != i:
                    raise ValueError(
                        f"env_fns[{owner[id(captured)]}] and env_fns[{i}] return the same env instance; "
                        "each factory must create a new env"
                    )
                owner[id(captured)] = i
        return fns

    def _check_spaces(self) -> None:
        first = self._describe[self._groups[0].gid]
        obs0, act0 = first["observation_space"], first["action_space"]
        for g in self._groups:
            d = self._describe[g.gid]
            for pos, (o, a) in enumerate(zip(d["observation_spaces"], d["action_spaces"], strict=True)):
                if o != obs0 or a != act0:
                    i = g.env_indices[pos]
                    raise ValueError(
                        f"env {i} has observation space {o} and action space {a}, but env 0 has "
                        f"{obs0} and {act0}; all envs of a vec env must share their spaces"
                    )

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvError("this DaskVecEnv is closed; create a new one")
        if self._broken is not None:
            raise DaskVecEnvError(
                f"this DaskVecEnv lost envs earlier ({type(self._broken).__name__}: {self._broken}); "
                "close it and create a new one, or use on_worker_lost='restart'"
            )

    def _check_idle(self) -> None:
        self._check_open()
        if self.waiting:
            raise AlreadySteppingError("a step is pending: call step_wait() before any other call")

    # ------------------------------------------------------------------ groups
    def _register_scheduler_plugin(self) -> None:
        try:
            self.client.register_plugin(_cluster.KeepEnvWorkers(), name=_cluster.KeepEnvWorkers.name)
        except Exception as e:  # e.g. a scheduler that cannot import daskvec
            logger.warning(
                "could not register the scale-down plugin on the scheduler (%s); "
                "adaptive scale-down may close workers holding envs",
                e,
            )

    def _eligible(self) -> list[str]:
        info = {"workers": _cluster.scheduler_workers(self.client)}
        return _cluster.eligible_workers(info, self.workers_filter, self.resources)

    def _quarantine_worker(self, worker: str, why: str) -> None:
        """Place no envs on ``worker`` for :data:`QUARANTINE_S` while other workers can take them."""
        if worker not in self._quarantined():
            logger.warning(
                "worker %s %s; placing no envs on it for the next %.0f s unless no other worker is left",
                worker, why, QUARANTINE_S,
            )
        self._quarantine[worker] = time.monotonic() + QUARANTINE_S

    def _quarantined(self) -> set[str]:
        now = time.monotonic()
        for worker, until in list(self._quarantine.items()):
            if until <= now:
                del self._quarantine[worker]
        return set(self._quarantine)

    def _wait_for_workers(self, exclude: Sequence[str]) -> list[str]:
        """Eligible workers not in ``exclude``, waiting up to ``worker_wait_timeout`` for one.

        Quarantined workers come back only when no other worker is found.
        """
        deadline = time.monotonic() + self.worker_wait_timeout
        while True:
            found = [w for w in self._eligible() if w not in exclude]
            if found:
                quarantined = self._quarantined()
                return [w for w in found if w not in quarantined] or found
            if time.monotonic() > deadline:
                what = (
                    "workers"
                    if not (self.workers_filter or self.resources)
                    else (f"workers matching workers={self.workers_filter} resources={self.resources}")
                )
                raise WorkerLostError(
                    f"no eligible {what} appeared within worker_wait_timeout={self.worker_wait_timeout:.0f}s; "
                    "start workers or relax the placement options",
                    env_indices=[],
                    worker="",
                )
            time.sleep(0.2)

    def _blob(self, indices: list[int]) -> bytes:
        return _cluster.dumps_factories(self.env_fns, indices)

    def _spawn(self, layout: list[tuple[list[int], str]], exclude: Sequence[str] = ()) -> list[_Group]:
        """Create one group per ``(env_indices, worker)``; retry on other workers if one vanishes."""
        if not hasattr(self, "_describe"):
            self._describe: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + max(self.timeout, self.worker_wait_timeout)
        pending = list(layout)
        created: list[_Group] = []
        bad: set[str] = set(exclude)
        try:
            while pending:
                attempt = []
                for indices, worker in pending:
                    token = secrets.token_bytes(32) if self.transport != "actor" else None
                    key = f"{_cluster.GROUP_KEY_PREFIX}{uuid.uuid4().hex}"
                    options: dict[str, Any] = {"busy_poll": self.busy_poll}
                    if self.env_process:
                        options["build_timeout"] = self.timeout
                    fut = self.client.submit(
                        EnvHost if self.env_process else EnvGroup,
                        self._blob(indices),
                        indices,
                        token,
                        self.on_env_error,
                        self.max_restarts,
                        [int(self.error_restarts[i]) for i in indices],
                        **options,
                        actor=True,
                        workers=[worker],
                        allow_other_workers=False,
                        key=key,
                        pure=False,
                    )
                    attempt.append((indices, worker, token, key, fut))
                retry: list[tuple[list[int], str]] = []
                for indices, worker, token, key, fut in attempt:
                    remaining = max(deadline - time.monotonic(), 1.0)
                    try:
                        # as_current: the Actor proxy binds to the client current when it is
                        # unpickled; without it a client made with set_as_default=False is not found
                        with self.client.as_current():
                            actor = self._await_actor(fut, worker, min(self.timeout, remaining))
                        desc = actor.describe().result(timeout=min(self.timeout, remaining))
                    except Exception as e:
                        if not _is_placement_failure(e):
                            for *_, other in attempt:  # a factory raised: drop every group of this attempt
                                with contextlib.suppress(Exception):
                                    other.cancel()
                            raise
                        logger.warning(
                            "could not create env group %s on %s (%s); trying another worker", indices, worker, e
                        )
                        with contextlib.suppress(Exception):
                            fut.cancel()
                        bad.add(worker)
                        if isinstance(e, TimeoutError):  # alive but not answering: do not try it again soon
                            self._quarantine_worker(worker, f"did not create an env group within {self.timeout:.0f}s")
                        retry.append((indices, ""))
                        continue
                    channel = self._connect(actor, desc, token)
                    g = _Group(key, list(indices), desc["worker"], fut, actor, channel, desc.get("deadline"))
                    self._worker_deadlines[desc["worker"]] = desc.get("deadline")
                    self._warn_profiler(desc)
                    self._describe[key] = desc
                    created.append(g)
                if retry:
                    if time.monotonic() > deadline:
                        raise WorkerLostError(
                            f"could not place envs {[i for r in retry for i in r[0]]} on any worker",
                            env_indices=[i for r in retry for i in r[0]],
                            worker="",
                        )
                    workers_now = self._wait_for_workers(exclude=sorted(bad))
                    load = self._load()
                    placement = _cluster.assign_workers([r[0] for r in retry], workers_now, load)
                    retry = [(r[0], w) for r, w in zip(retry, placement, strict=True)]
                pending = retry
        except BaseException:
            self._teardown_groups(created, graceful=False)
            raise
        return created

    def _warn_profiler(self, desc: dict[str, Any]) -> None:
        """Warn once per worker that runs Dask's profiler on CPython 3.11 (see ``profiler_hazard``)."""
        worker = desc["worker"]
        if not desc.get("profiler_hazard") or worker in self._profiler_warned:
            return
        self._profiler_warned.add(worker)
        logger.warning(
            "worker %s runs Dask's profiler on Python 3.11, where sampling thread stacks can "
            "deadlock a worker while env groups start their threads (python/cpython#106883); "
            "start the workers with the config distributed.worker.profile.enabled: false "
            "(env var DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False) or use Python 3.12+",
            worker,
        )

    def _await_actor(self, fut: Any, worker: str, timeout: float) -> Any:
        """Wait for an actor to be created on ``worker``, giving up early if the worker leaves.

        A task pinned to a worker that dies stays pending forever; checking once a
        second that the worker is still known to the scheduler turns that into an
        ``OSError`` (a placement failure, so the group is tried elsewhere).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=max(min(1.0, deadline - time.monotonic()), 0.01))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            if worker not in _cluster.scheduler_workers(self.client):
                raise OSError(f"worker {worker} left before the env group was created on it")

    def _connect(self, actor: Any, desc: dict[str, Any], token: bytes | None) -> Channel:
        if self.transport == "actor" or token is None or desc.get("address") is None:
            return ActorChannel(actor)
        timeout = min(self.timeout, 5.0)
        if desc.get("unix_path") and desc.get("machine") == machine_id():
            try:
                return DirectChannel(desc["unix_path"], token, connect_timeout=timeout)
            except ChannelError as e:  # e.g. a container that shares the host name, not the files
                logger.debug("Unix socket of the env group on %s unusable (%s); using TCP", desc["worker"], e)
        try:
            return DirectChannel(tuple(desc["address"]), token, connect_timeout=timeout)
        except ChannelError as e:
            if self.transport == "direct":
                raise DaskVecEnvError(
                    f"cannot open a direct channel to the env group on {desc['worker']} ({e}); "
                    "use transport='auto' to fall back to Dask actor calls"
                ) from e
            logger.warning("direct channel to %s unavailable (%s); using Dask actor calls", desc["worker"], e)
            return ActorChannel(actor)

    def _load(self) -> dict[str, int]:
        load: dict[str, int] = {}
        for g in self._groups:
            if g.failed is None:
                load[g.worker] = load.get(g.worker, 0) + len(g.env_indices)
        return load

    def _teardown_groups(self, groups: Sequence[_Group], graceful: bool) -> None:
        """Release ``groups``: ask their actors to shut down (``graceful``), or drop them.

        Dropped groups (lost, hung) are not asked anything: a hung group's actor may be
        stuck in the call that hung. Instead their env processes, if their workers
        still run, are killed by the worker itself (a plain ``Client.run``, which does
        not queue behind actor calls).
        """
        described = getattr(self, "_describe", {})
        doomed = [] if graceful else [
            (g.worker, described[g.gid]["env_pid"]) for g in groups if "env_pid" in described.get(g.gid, {})
        ]
        if doomed:
            with contextlib.suppress(Exception):
                alive = _cluster.scheduler_workers(self.client)
                for worker, env_pid in doomed:
                    if worker in alive:
                        self.client.run(kill_env_process, env_pid, workers=[worker], callback_timeout=10)
        if graceful:
            futs = []
            for g in groups:
                g.channel.close()
                with contextlib.suppress(Exception):
                    futs.append(g.actor.shutdown())
            for f in futs:
                with contextlib.suppress(Exception):
                    f.result(timeout=min(self.timeout, 10.0))
        for g in groups:
            g.channel.close()
            with contextlib.suppress(Exception):
                g.future.cancel()
            if hasattr(self, "_describe"):
                self._describe.pop(g.gid, None)

    def transport_summary(self) -> str:
        """How many groups use each transport and socket, e.g. ``"direct/unix x2"``."""
        kinds: dict[str, int] = {}
        for g in self._groups:
            kind = _channel_name(g.channel)
            kinds[kind] = kinds.get(kind, 0) + 1
        return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))

    @property
    def groups(self) -> list[dict[str, Any]]:
        """One entry per env-group actor: its env indices, worker, transport, the
        worker's ``deadline`` (epoch seconds at which its lifetime or batch job ends, or
        ``None``) and ``env_pid``, the id of the process stepping the envs on the
        worker's host (the worker's own with ``env_process=False``). ``socket`` says
        how a direct channel is connected: ``"unix"`` when the group runs on the
        client's machine, ``"tcp"`` otherwise (``None`` for the actor transport)."""
        return [
            {
                "envs": list(g.env_indices),
                "worker": g.worker,
                "transport": g.channel.kind,
                "socket": getattr(g.channel, "family", None),
                "key": g.gid,
                "deadline": g.deadline,
                "env_pid": self._describe[g.gid].get("env_pid", self._describe[g.gid].get("pid")),
            }
            for g in self._groups
        ]

    @property
    def dashboard_link(self) -> str | None:
        """Link to the Dask dashboard of the cluster holding the envs."""
        try:
            return str(self.client.dashboard_link)
        except Exception:
            return None

    # ------------------------------------------------------------------ calls
    def _call_groups(self, requests: dict[str, tuple[str, tuple[Any, ...]]], timeout: float) -> dict[str, Any]:
        """Send one request per group id and wait once for all replies (values or exceptions)."""
        targets = [g for g in self._groups if g.gid in requests]
        sent: list[_Group] = []
        out: dict[str, Any] = {}
        for g in targets:
            try:
                g.channel.send(requests[g.gid])
                sent.append(g)
            except ChannelError as e:
                out[g.gid] = e
        for g, rep in zip(sent, recv_many([g.channel for g in sent], timeout), strict=True):
            out[g.gid] = rep
        return out

    def _positions(self, indices: VecEnvIndices) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        raw = [indices] if isinstance(indices, (int, np.integer)) else list(indices)
        out = []
        for i in raw:
            if not isinstance(i, (int, np.integer)):
                raise TypeError(f"env indices must be ints, got {type(i).__name__}")
            j = int(i)
            if not -self.num_envs <= j < self.num_envs:
                raise IndexError(f"env index {j} is out of range for {self.num_envs} envs")
            out.append(j % self.num_envs)
        return out

    def _per_env(
        self, cmd: str, make_args: Callable[[list[int]], tuple[Any, ...]], indices: VecEnvIndices
    ) -> list[Any]:
        """Run an attribute-style command on the selected envs; results in the requested order."""
        self._check_idle()
        wanted = self._positions(indices)
        where: dict[int, tuple[_Group, int]] = {}
        for g in self._groups:
            for pos, i in enumerate(g.env_indices):
                where[i] = (g, pos)
        per_group: dict[str, list[int]] = {}
        for i in wanted:
            g, pos = where[i]
            per_group.setdefault(g.gid, []).append(pos)
        for _attempt in range(3):
            replies = self._call_groups({gid: (cmd, make_args(p)) for gid, p in per_group.items()}, self.timeout)
            lost = [g for g in self._groups if isinstance(replies.get(g.gid), BaseException)]
            if not lost:
                break
            self._handle_lost(lost, replies, during="call")
            where = {i: (g, pos) for g in self._groups for pos, i in enumerate(g.env_indices)}
            per_group = {}
            for i in wanted:
                g, pos = where[i]
                per_group.setdefault(g.gid, []).append(pos)
        else:
            raise WorkerLostError(f"{cmd} failed repeatedly because workers were lost", env_indices=wanted, worker="")
        values: dict[str, list[Any]] = {gid: list(_unwrap(r) or []) for gid, r in replies.items()}
        cursor = {gid: 0 for gid in values}
        out = []
        for i in wanted:
            g, _ = where[i]
            vals = values[g.gid]
            out.append(vals[cursor[g.gid]] if vals else None)
            cursor[g.gid] += 1
        return out

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute from vectorized environment (see base class)."""
        return self._per_env("get_attr", lambda p: (attr_name, p), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute inside vectorized environments (see base class)."""
        self._per_env("set_attr", lambda p: (attr_name, value, p), indices)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call instance methods of vectorized environments (see base class)."""
        return self._per_env("env_method", lambda p: (method_name, method_args, method_kwargs, p), indices)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Check if worker environments are wrapped with a given wrapper (see base class)."""
        return self._per_env("is_wrapped", lambda p: (wrapper_class, p), indices)

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has the attribute (see base class)."""
        try:
            self.get_attr(attr_name)
        except AttributeError:
            return False
        return True

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Return RGB images from each environment (see base class)."""
        self._check_idle()
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return self._per_env("render", lambda p: (p,), None)

    # ------------------------------------------------------------------ reset / step
    def _write_obs(self, g: _Group, stacked: Any) -> None:
        try:
            if self._single_obs:
                self.buf_obs[None][g.index] = stacked
            else:
                for k in self.keys:
                    self.buf_obs[k][g.index] = stacked[k]
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(
                f"envs {g.env_indices} on {g.worker} returned observations that do not fit the observation "
                f"space {self.observation_space} (got shape {obs_shape(stacked)}): {e}; "
                "make each env's observations match its observation_space"
            ) from e

    def _write_obs_row(self, i: int, obs: Any) -> None:
        if self._single_obs:
            self.buf_obs[None][i] = obs
        else:
            for k in self.keys:
                self.buf_obs[k][i] = obs[k]

    def _obs_row(self, i: int) -> Any:
        if self._single_obs:
            return self.buf_obs[None][i].copy()
        if isinstance(self.observation_space, gym.spaces.Tuple):
            return tuple(self.buf_obs[k][i].copy() for k in self.keys)
        return {k: self.buf_obs[k][i].copy() for k in self.keys}

    def _obs_from_buf(self) -> VecEnvObs:
        if self._single_obs:  # what dict_to_obs would return, without its checks
            return self.buf_obs[None].copy()
        return dict_to_obs(self.observation_space, {k: np.copy(v) for k, v in self.buf_obs.items()})

    def reset(self) -> VecEnvObs:
        """Reset all environments, applying pending seeds and options once (see base class)."""
        self._check_idle()
        if self._pending_moves is not None:
            self._maybe_migrate(during="reset")
        self._pending_reports = {}
        seeds, options = list(self._seeds), list(self._options)
        for i, s in enumerate(seeds):
            if s is not None:
                self._base_seeds[i] = int(s)
        for attempt in range(4):
            requests = {
                g.gid: ("reset", ([seeds[i] for i in g.env_indices], [options[i] for i in g.env_indices]))
                for g in self._groups
            }
            replies = self._call_groups(requests, self.timeout)
            lost = [g for g in self._groups if isinstance(replies.get(g.gid), BaseException)]
            for g in self._groups:
                rep = replies.get(g.gid)
                if g in lost or rep is None:
                    continue
                value = _unwrap(rep)
                self._write_obs(g, value["obs"])
                for pos, i in enumerate(g.env_indices):
                    self.reset_infos[i] = value["reset_infos"][pos]
                self._sync_error_restarts(g, value["restarts"])
            if not lost:
                break
            if attempt == 3:
                indices = [i for g in lost for i in g.env_indices]
                raise WorkerLostError(
                    f"reset() kept losing the workers of envs {indices}; check the cluster's health",
                    env_indices=indices,
                    worker=lost[0].worker,
                )
            # rebuilt groups come back reset with restart seeds; the next pass resets
            # every group again with the user's seeds and options
            self._handle_lost(lost, replies, during="reset")
        self._reset_seeds()
        self._reset_options()
        self._has_obs = True
        return self._obs_from_buf()

    def step_async(self, actions: np.ndarray) -> None:
        """Send the actions to every group without waiting (see base class)."""
        self._check_idle()
        n = len(actions) if hasattr(actions, "__len__") else -1
        if n != self.num_envs:
            raise ValueError(
                f"got {n if n >= 0 else 'a non-sequence of'} actions for {self.num_envs} envs; "
                "pass one action per env (an array whose first axis has length num_envs)"
            )
        arr = actions if isinstance(actions, np.ndarray) else None
        self.timer.sent()
        self._arrived.clear()
        for g in self._groups:
            if arr is not None:
                group_actions: Any = arr[g.index]
            else:
                group_actions = [actions[i] for i in g.env_indices]
            try:
                g.channel.send(("step", (group_actions,)))
            except ChannelError as e:
                g.failed = e
        self.waiting = True

    def step_wait(self) -> VecEnvStepReturn:
        """Wait once for all groups' results and return them (see base class)."""
        self._check_open()
        if not self.waiting:
            raise NoAsyncCallError("step_wait() called without a pending step_async()")
        live = [g for g in self._groups if g.failed is None]
        env_seconds = 0.0
        error: dict[str, Any] | None = None
        # Each reply is taken in as soon as it is read, while later groups may still be
        # stepping. Replies read before an interrupted wait (Ctrl-C) are not read again.
        replies = iter_replies([g.channel for g in live if g.gid not in self._arrived], self.step_timeout)
        try:
            for g in live:
                if g.gid not in self._arrived:
                    self._arrived[g.gid] = next(replies)
                rep = self._arrived[g.gid]
                if isinstance(rep, BaseException):
                    continue
                status, value = rep
                if status == "err":
                    error = error or value
                    continue
                reply: StepReply = value
                self._write_obs(g, reply.obs)
                self.buf_rews[g.index] = reply.rewards
                self.buf_dones[g.index] = reply.dones
                if isinstance(g.index, slice):
                    self.buf_infos[g.index] = reply.infos
                else:
                    for pos, i in enumerate(g.env_indices):
                        self.buf_infos[i] = reply.infos[pos]
                for pos, info in reply.reset_infos.items():
                    self.reset_infos[g.env_indices[pos]] = info
                if reply.restarts != g.last_restarts:
                    g.last_restarts = reply.restarts
                    self._sync_error_restarts(g, reply.restarts)
                env_seconds = max(env_seconds, reply.env_seconds)
        except BaseException:
            # Taking in a reply failed (say, observations that do not fit): read the other
            # replies, so that the channels stay in step. If the wait itself was interrupted
            # (Ctrl-C), the step stays pending: step_wait() or close() collects it.
            if inspect.getgeneratorstate(replies) != inspect.GEN_CLOSED:
                for _ in replies:
                    continue
                self.waiting = False
            raise
        self.waiting = False
        results: dict[str, Any] = {g.gid: g.failed for g in self._groups if g.failed is not None} | self._arrived
        lost = [g for g in self._groups if isinstance(results[g.gid], BaseException)]
        if self._pending_reports:
            self._report_pending()
        self.timer.received(env_seconds)
        self._steps += 1
        if error is not None:
            _raise_remote(error)
        if lost:
            self._handle_lost(lost, results, during="step")
        self._maybe_migrate()
        self._maybe_publish()
        # the info dicts are fresh objects decoded for this step, so a shallow list copy is enough
        return (self._obs_from_buf(), np.copy(self.buf_rews), np.copy(self.buf_dones), list(self.buf_infos))

    def _sync_error_restarts(self, g: _Group, restarts: list[int]) -> None:
        for pos, count in enumerate(restarts):
            i = g.env_indices[pos]
            new = int(count) - int(self.error_restarts[i])
            if new > 0:
                self.error_restarts[i] = count
                self.restart_counts[i] += new
                self.restart_log.append({"env": i, "reason": "env_error", "worker": g.worker, "step": self._steps})

    # ------------------------------------------------------------------ fault tolerance
    def _handle_lost(self, lost: list[_Group], results: dict[str, Any], during: str) -> None:
        """Rebuild the envs of ``lost`` groups elsewhere and report them as truncated.

        With ``on_worker_lost="raise"`` the groups are torn down and
        :class:`~daskvec.errors.WorkerLostError` (or :class:`~daskvec.errors.StepTimeoutError`
        for a hang) is raised instead; the vec env is then unusable and must be closed.
        """
        reasons = {}
        for g in lost:
            exc = results.get(g.gid)
            reasons[g.gid] = "timeout" if isinstance(exc, TimeoutError) else "worker_lost"
        if self.on_worker_lost == "raise":
            g = lost[0]
            exc = results.get(g.gid)
            indices = sorted(i for x in lost for i in x.env_indices)
            self._teardown_groups(lost, graceful=False)
            self._groups = [x for x in self._groups if x not in lost]
            cls = StepTimeoutError if reasons[g.gid] == "timeout" else WorkerLostError
            what = (
                f"did not answer within {self.step_timeout if during == 'step' else self.timeout:.1f}s"
                if cls is StepTimeoutError
                else f"was lost ({exc})"
            )
            err = cls(f"the worker {g.worker} holding envs {indices} {what}", env_indices=indices, worker=g.worker)
            self._broken = err
            raise err from (exc if isinstance(exc, BaseException) else None)
        for g in lost:
            if reasons[g.gid] == "timeout" and not self.env_process:
                # the step is still running in that worker (a hung env holds a thread there)
                self._quarantine_worker(g.worker, f"left a step unanswered for {self.step_timeout:.0f}s")
            logger.warning(
                "envs %s on worker %s %s (%s); rebuilding them",
                g.env_indices,
                g.worker,
                "timed out" if reasons[g.gid] == "timeout" else "were lost",
                results.get(g.gid),
            )
        self._relocate(lost, {g.gid: reasons[g.gid] for g in lost}, during=during)

    def _relocate(
        self, old: list[_Group], reasons: dict[str, str], during: str, layout: list[tuple[list[int], str]] | None = None
    ) -> None:
        """Replace the ``old`` groups by new ones holding the same envs, and report it.

        Each rebuilt env is reset with :func:`~daskvec.worker.restart_seed` and, when
        ``during == "step"``, its entry in the step's buffers becomes a truncation:
        ``done=True``, ``info["TimeLimit.truncated"]=True``, the last observation in
        ``info["terminal_observation"]``, the fresh observation in the obs buffer and a
        ``info["daskvec"]`` marker. Lost and hung envs get reward 0 (their step never
        happened); moved envs keep the reward and info of the step they just made.

        Parameters
        ----------
        old : list of _Group
            Groups to tear down (gracefully when all of them are being moved).
        reasons : dict
            ``"worker_lost"``, ``"timeout"`` or ``"moved"`` per group id.
        during : {"step", "reset", "call"}
            What the vec env was doing; only ``"step"`` writes truncations.
        layout : list of (env indices, worker), optional
            Where the envs go (must hold exactly the envs of ``old``); by default the
            old groups are placed again on the least-loaded live workers.
        """
        reason_of = {i: reasons[g.gid] for g in old for i in g.env_indices}
        worker_of = {i: g.worker for g in old for i in g.env_indices}
        lost_workers = {g.worker for g in old if reasons[g.gid] != "moved"}
        timed_out = {g.worker for g in old if reasons[g.gid] == "timeout"}
        terminal = {i: self._obs_row(i) for i in reason_of} if self._has_obs else {}
        was_done = {i: bool(self.buf_dones[i]) for i in reason_of}
        self._teardown_groups(old, graceful=all(reasons[g.gid] == "moved" for g in old))
        self._groups = [g for g in self._groups if g not in old]
        if layout is not None and sorted(i for ind, _ in layout for i in ind) != sorted(reason_of):
            raise RuntimeError(f"daskvec internal error: relocating envs {sorted(reason_of)} with layout {layout}")
        if layout is None:
            env_groups = [list(g.env_indices) for g in old]
            layout = self._place(env_groups, avoid=lost_workers, fallback=lost_workers - timed_out)
        for i in reason_of:
            self.restart_counts[i] += 1
        seeds = {i: restart_seed(i, int(self.restart_counts[i]), self._base_seeds[i]) for i in reason_of}
        new: list[_Group] = []
        bad = set(lost_workers)
        for attempt in range(4):
            spawned = self._spawn(layout, exclude=sorted(bad))
            self._groups.extend(spawned)
            requests: dict[str, tuple[str, tuple[Any, ...]]] = {
                g.gid: ("reset", ([seeds[i] for i in g.env_indices], [{} for _ in g.env_indices])) for g in spawned
            }
            replies = self._call_groups(requests, self.timeout)
            failed = [g for g in spawned if isinstance(replies[g.gid], BaseException)]
            for g in spawned:
                if g in failed:
                    continue
                new.append(g)
                value = _unwrap(replies[g.gid])
                self._write_obs(g, value["obs"])
                for pos, i in enumerate(g.env_indices):
                    self.reset_infos[i] = dict(value["reset_infos"][pos])
            if not failed:
                break
            # the worker died again while the envs were being rebuilt: place them once more
            logger.warning(
                "envs %s were lost again while being rebuilt on %s (%s); retrying",
                [i for g in failed for i in g.env_indices],
                sorted({g.worker for g in failed}),
                [replies[g.gid] for g in failed],
            )
            self._teardown_groups(failed, graceful=False)
            self._groups = [g for g in self._groups if g not in failed]
            bad |= {g.worker for g in failed}
            if attempt == 3:
                indices = sorted(i for g in failed for i in g.env_indices)
                err = WorkerLostError(
                    f"the envs {indices} were lost again each time they were rebuilt",
                    env_indices=indices,
                    worker=failed[0].worker,
                )
                self._broken = err
                raise err
            layout = self._place([list(g.env_indices) for g in failed], avoid=bad, fallback=set())
        self._groups.sort(key=lambda g: g.env_indices[0])
        for g in new:
            for i in g.env_indices:
                marker = {
                    "restarted": True,
                    "reason": reason_of[i],
                    "from_worker": worker_of[i],
                    "worker": g.worker,
                    "restarts": int(self.restart_counts[i]),
                    "seed": seeds[i],
                }
                self.reset_infos[i][INFO_KEY] = marker
                self.restart_log.append(
                    {
                        "env": i,
                        "reason": reason_of[i],
                        "worker": g.worker,
                        "from_worker": worker_of[i],
                        "step": self._steps,
                    }
                )
                if during == "call" and i in terminal:
                    # lost during get_attr/env_method: the learner sees the truncation at the next step
                    self._pending_reports[i] = (marker, terminal[i])
                if during != "step":
                    continue
                if reason_of[i] == "moved":
                    info = self.buf_infos[i]
                    if not was_done[i]:
                        info["terminal_observation"] = terminal[i]
                        info["TimeLimit.truncated"] = True
                    info[INFO_KEY] = marker
                else:
                    info = {"TimeLimit.truncated": True, INFO_KEY: marker}
                    if i in terminal:
                        info["terminal_observation"] = terminal[i]
                    self.buf_rews[i] = 0.0
                    self.buf_infos[i] = info
                self.buf_dones[i] = True
        logger.info("rebuilt envs %s on %s", sorted(reason_of), sorted({g.worker for g in new}))

    def _report_pending(self) -> None:
        """Report, in the step just collected, envs rebuilt outside a step (e.g. during ``env_method``).

        The learner last saw the old env's observation; this step's result comes from
        the rebuilt env, so it is reported as the end of the old episode.
        """
        for i, (marker, terminal) in self._pending_reports.items():
            self.buf_infos[i] = {"TimeLimit.truncated": True, "terminal_observation": terminal, INFO_KEY: marker}
            self.buf_rews[i] = 0.0
            self.buf_dones[i] = True
        self._pending_reports = {}

    def _place(self, env_groups: list[list[int]], avoid: set[str], fallback: set[str]) -> list[tuple[list[int], str]]:
        """Choose live workers for ``env_groups``, avoiding ``avoid`` (workers that failed).

        Workers about to leave are avoided too when others exist. If only workers in
        ``fallback`` (e.g. a worker that merely hung) are left, they are used.
        """
        now = time.time()
        try:
            candidates = self._wait_for_workers(exclude=sorted(avoid))
        except WorkerLostError:
            if not fallback:
                raise
            candidates = self._wait_for_workers(exclude=sorted(avoid - fallback))
        staying = [w for w in candidates if not self._leaving(w, now)]
        candidates = staying or candidates
        load = {w: k for w, k in self._load().items() if w in candidates}
        return list(zip(env_groups, _cluster.assign_workers(env_groups, candidates, load), strict=True))

    def _receivers(self, now: float) -> list[str]:
        """Eligible workers that may take envs moved on purpose: neither leaving soon nor quarantined."""
        quarantined = self._quarantined()
        return [w for w in self._eligible() if not self._leaving(w, now) and w not in quarantined]

    def _leaving(self, worker: str, now: float) -> bool:
        """Whether ``worker`` is expected to leave (lifetime, walltime) within ``migrate_before``."""
        deadline = self._worker_deadlines.get(worker)
        return deadline is not None and deadline - now < self.migrate_before

    def _maybe_migrate(self, during: str = "step") -> None:
        """Carry out pending moves: a planned rebalance, or groups near their worker's end."""
        now = time.time()
        if self.auto_rebalance and time.monotonic() - self._last_rebalance_check > self.rebalance_interval:
            self._last_rebalance_check = time.monotonic()
            self._plan_rebalance()
        moves = self._pending_moves
        if moves is not None and any(g not in self._groups for g in moves[0]):
            moves = None  # groups changed since the plan was made (e.g. a worker was lost): replan later
        if moves is None and time.monotonic() >= self._next_migrate_check:
            leaving = [g for g in self._groups if self._leaving(g.worker, now)]
            if leaving:
                moves = self._plan_migration(leaving, now)
        self._pending_moves = None
        if moves is None:
            return
        old, layout = moves
        logger.info(
            "moving envs %s off %s", sorted(i for g in old for i in g.env_indices), sorted({g.worker for g in old})
        )
        self._relocate(old, {g.gid: "moved" for g in old}, during=during, layout=layout)

    def _plan_migration(self, leaving: list[_Group], now: float) -> _Moves | None:
        """Where to move groups whose worker leaves soon; ``None`` if no worker can take them yet."""
        staying = self._receivers(now)
        if not staying:
            self._next_migrate_check = time.monotonic() + 5.0
            logger.warning(
                "envs %s are on workers that leave within %.0fs, and no other worker can take them yet",
                sorted(i for g in leaving for i in g.env_indices),
                self.migrate_before,
            )
            return None
        env_groups = [list(g.env_indices) for g in leaving]
        load = {w: k for w, k in self._load().items() if w in staying}
        return leaving, list(zip(env_groups, _cluster.assign_workers(env_groups, staying, load), strict=True))

    def _plan_rebalance(self) -> int:
        """Plan the moves that even out envs over the eligible workers (see :meth:`rebalance`)."""
        now = time.time()
        workers = self._receivers(now)
        groups = list(self._groups)
        plan = recovery.plan_rebalance([(g.env_indices, g.worker) for g in groups], workers, self.envs_per_actor)
        if not plan:
            self._pending_moves = None
            return 0
        self._pending_moves = ([groups[p] for p in plan.old], plan.layout)
        return plan.moved_envs

    def rebalance(self) -> int:
        """Spread the envs evenly over the eligible workers, e.g. after workers joined.

        The moves are planned now and carried out at the end of the next
        ``step_wait()``: each rebuilt env then reports a truncation (``done=True``,
        ``info["TimeLimit.truncated"]=True``, the observation it reached in
        ``info["terminal_observation"]``, its reward kept, and ``info["daskvec"]``
        with ``reason="moved"``), and the returned observation is the first of a
        new episode. Whole groups move when they can; when a group must be split,
        its remaining envs are rebuilt in place and report the same truncation.
        Before the first ``reset()``, or at ``reset()``, the moves happen at once.
        Calling it again replaces the previous plan. ``auto_rebalance=True`` does
        this every ``rebalance_interval`` seconds.

        Returns
        -------
        int
            How many envs will be rebuilt (0 when the envs are already balanced).
        """
        self._check_idle()
        moved = self._plan_rebalance()
        if moved and not self._has_obs:
            self._maybe_migrate(during="reset")
        return moved

    # ------------------------------------------------------------------ stats
    def _maybe_publish(self) -> None:
        now = time.monotonic()
        if now - self._last_stats < _STATS_INTERVAL:
            return
        self._last_stats = now
        msg = client_message(self.timer, self.num_envs, int(self.restart_counts.sum()))
        with contextlib.suppress(Exception):
            self.client.loop.add_callback(self.client.scheduler.log_event, topic=CLIENT_TOPIC, msg=msg)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Shut the env groups down and close what this vec env created (see base class).

        Safe to call twice and while a step is in flight (its replies are drained,
        with ``timeout`` as the bound).
        """
        if getattr(self, "closed", True):
            return
        self.closed = True
        stuck: list[_Group] = []
        if self.waiting:
            live = [g for g in self._groups if g.failed is None and g.gid not in self._arrived]
            replies = recv_many([g.channel for g in live], min(self.step_timeout, 30.0))
            # a group that did not answer (hung env, dead worker) is abandoned, not asked to shut down
            stuck = [g for g, r in zip(live, replies, strict=True) if isinstance(r, BaseException)]
            stuck += [g for g in self._groups if g.failed is not None]
            self.waiting = False
        with contextlib.suppress(Exception):  # tell the dashboard (bounded wait; the scheduler may be gone)
            msg = client_message(self.timer, self.num_envs, int(self.restart_counts.sum()), closed=True)
            self.client.sync(self.client.scheduler.log_event, topic=CLIENT_TOPIC, msg=msg, callback_timeout=5)
        self._teardown_groups(stuck, graceful=False)
        self._teardown_groups([g for g in self._groups if g not in stuck], graceful=True)
        self._groups = []
        self._resolved.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            warnings.warn("DaskVecEnv was not closed; call env.close()", ResourceWarning, stacklevel=1)
            for g in getattr(self, "_groups", []):
                with contextlib.suppress(Exception):
                    g.channel.close()

    def __enter__(self) -> DaskVecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_html_(self) -> str:
        """Notebook view: the dashboard link, and the workers with the envs each holds."""
        from html import escape

        n_envs = getattr(self, "num_envs", 0)
        if self.closed:
            return f"<div><strong>DaskVecEnv</strong>: {n_envs} envs, closed</div>"
        by_worker: dict[str, list[dict[str, Any]]] = {}
        for g in self.groups:
            by_worker.setdefault(g["worker"], []).append(g)
        link = self.dashboard_link
        page = None
        if link:
            base = link.rsplit("/", 1)[0] if link.rstrip("/").endswith("status") else link.rstrip("/")
            page = f"{base}/daskvec"
        links = (
            f'<a href="{escape(link)}" target="_blank">{escape(link)}</a>'
            f' (daskvec page: <a href="{escape(page or "")}" target="_blank">{escape(page or "")}</a>)'
            if link
            else "unknown"
        )
        rows = "".join(
            f"<tr><td style='text-align:left'>{escape(w)}</td><td>{sum(len(g['envs']) for g in gs)}</td>"
            f"<td>{len(gs)}</td><td style='text-align:left'>{escape(_ranges([i for g in gs for i in g['envs']]))}</td>"
            f"<td>{escape(', '.join(sorted({g['transport'] for g in gs})))}</td></tr>"
            for w, gs in sorted(by_worker.items())
        )
        return (
            "<div>"
            f"<p><strong>DaskVecEnv</strong>: {n_envs} envs in {len(self._groups)} groups on "
            f"{len(by_worker)} workers</p>"
            f"<p>Dashboard: {links}</p>"
            "<table><thead><tr><th style='text-align:left'>worker</th><th>envs</th><th>groups</th>"
            "<th style='text-align:left'>env indices</th><th>transport</th></tr></thead>"
            f"<tbody>{rows}</tbody></table></div>"
        )

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len({g.worker for g in self._groups})} workers"
        return f"<DaskVecEnv: {getattr(self, 'num_envs', 0)} envs, {len(getattr(self, '_groups', []))} groups, {state}>"


def _channel_name(channel: Channel) -> str:
    family = getattr(channel, "family", None)
    return channel.kind if family is None else f"{channel.kind}/{family}"


def _ranges(indices: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``."""
    parts: list[str] = []
    for i in sorted(indices):
        if parts and not parts[-1].endswith(",") and int(parts[-1].split("-")[-1]) == i - 1:
            head = parts[-1].split("-")[0]
            parts[-1] = f"{head}-{i}"
        else:
            parts.append(str(i))
    return ", ".join(parts)


def _is_placement_failure(exc: BaseException) -> bool:
    """Whether creating a group failed because of its worker (retry elsewhere), not the env."""
    from distributed.client import FutureCancelledError

    try:
        from distributed.scheduler import KilledWorker
    except ImportError:  # pragma: no cover - moved in some releases
        KilledWorker = ()  # type: ignore[assignment,misc]
    from distributed.comm.core import CommClosedError

    return isinstance(exc, (TimeoutError, OSError, CommClosedError, FutureCancelledError, KilledWorker)) or (
        isinstance(exc, RuntimeError) and "Worker holding Actor was lost" in str(exc)
    )


def _captured_envs(fn: Any) -> list[Any]:
    """Env instances a factory closes over (to catch factories sharing one env)."""
    found = []
    seen: list[Any] = []
    stack = [fn]
    while stack and len(seen) < 32:
        obj = stack.pop()
        if any(obj is s for s in seen):
            continue
        seen.append(obj)
        if isinstance(obj, gym.Env):
            found.append(obj)
            continue
        func = getattr(obj, "func", None)
        if func is not None:  # functools.partial
            stack.extend([func, *getattr(obj, "args", ()), *getattr(obj, "keywords", {}).values()])
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                stack.append(cell.cell_contents)
        defaults = getattr(obj, "__defaults__", None) or ()
        stack.extend(defaults)
    return found
