"""Client side: :class:`DaskVectorEnv`, a Gymnasium 1.x ``VectorEnv`` on Dask actors.

The second face of daskvec, beside :class:`~daskvec.sb3.vec_env.DaskVecEnv`: both own an
:class:`~daskvec._core.engine.Engine` (options, client, worker directory, group pool,
recovery), so groups, transports, fault handling and the dashboard are the same. This
module holds the Gymnasium API and its state; :mod:`daskvec.gymnasium.buffers` builds
Gymnasium's results and infos, and :mod:`daskvec.gymnasium.layout` checks its arguments and
lays its batches out.

It is a drop-in for ``gymnasium.vector.AsyncVectorEnv`` (and ``SyncVectorEnv``): the
same results, spaces (``observation_mode``, per-env tuples for spaces that do not
batch into arrays), seeding (``np_random_seed``), exception types and the split calls
``reset_async``/``reset_wait``, ``step_async``/``step_wait``, ``call_async``/``call_wait``
with AsyncVectorEnv's state rules. Besides, it offers EnvPool's partial-batch pair:
:meth:`DaskVectorEnv.send` sends actions to some envs and :meth:`DaskVectorEnv.recv`
returns the first ``batch_size`` envs (whole groups) to finish, with their ids in
``info["env_id"]``. See docs/gymnasium.md.
"""

from __future__ import annotations

import contextlib
import copy
import enum
import functools
import logging
import math
import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from daskvec._core.engine import Engine, EngineViews
from daskvec._core.handles import Group, StepOutcome
from daskvec._core.options import Options, check_env_fns, ignore_async_keywords
from daskvec._core.pool import GroupPool
from daskvec._core.user_errors import short_errors
from daskvec.errors import AlreadySteppingError, ClosedEnvError, NoAsyncCallError
from daskvec.gymnasium import layout
from daskvec.gymnasium.buffers import VectorBuffers
from daskvec.protocol.messages import Autoreset, Command, ResetReply

logger = logging.getLogger(__name__)

__all__ = ["DaskVectorEnv", "make_vec"]


class _State(enum.Enum):
    """Where a :class:`DaskVectorEnv` is; the values name the pending call, as ``AsyncVectorEnv``'s ``AsyncState``."""

    IDLE = "default"
    WAITING_RESET = "reset"  # reset_async() sent a reset that reset_wait() has not collected
    WAITING_STEP = "step"  # step_async() sent a step that step_wait() has not collected
    WAITING_CALL = "call"  # call_async() sent a call that call_wait() has not collected
    ASYNC = "recv"  # send() sent steps (or async_reset() queued observations) not yet handed out by recv()
    CLOSED = "closed"


#: The states in which a call of AsyncVectorEnv's split API is pending.
_WAITING = (_State.WAITING_RESET, _State.WAITING_STEP, _State.WAITING_CALL)


class DaskVectorEnv(EngineViews, gym.vector.VectorEnv):
    """A Gymnasium ``VectorEnv`` whose envs live as Dask actors on a cluster.

    It behaves like ``gymnasium.vector.SyncVectorEnv`` and ``AsyncVectorEnv`` (same
    observations, rewards, terminations, truncations and infos for the same seeded envs
    and actions, in each autoreset mode; the same spaces, errors and split calls), with
    the envs spread over the workers of a ``dask.distributed`` cluster in groups, as
    :class:`~daskvec.DaskVecEnv` spreads them. docs/gymnasium.md lists what still differs
    from ``AsyncVectorEnv``, and why.

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument callables that each create one environment (called on the workers).
    client : distributed.Client, str, Cluster or None, optional
        Where the envs run, as for :class:`~daskvec.DaskVecEnv`.
    autoreset_mode : gymnasium.vector.AutoresetMode or str
        ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (reset finished envs with
        ``reset(options={"reset_mask": mask})``), as in Gymnasium.
    observation_mode : {"same", "different"} or tuple of Space
        How the envs' observation spaces are batched, as in Gymnasium: ``"same"``
        (default: every env has env 0's space), ``"different"`` (spaces of one shape
        and dtype, e.g. other bounds), or ``(observation_space, single_observation_space)``.
    copy : bool
        Whether ``reset`` and ``step`` return copies of the observations (default), or
        the vec env's own buffers, which the next call overwrites (as in Gymnasium).
    batch_size : int, optional
        How many envs :meth:`recv` returns at least (default: all). A batch is made of
        whole groups: unless ``envs_per_actor`` is given, groups then hold
        ``gcd(batch_size, num_envs)`` envs, so that batches are exactly ``batch_size``.
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.
    shared_memory, context, daemon, worker, max_concurrency : optional
        ``AsyncVectorEnv``'s choices about its subprocesses: accepted, so that code
        written for it runs unchanged, and ignored (one INFO log line says so); Dask
        starts and feeds the processes here.
    **options
        The options of :class:`~daskvec.DaskVecEnv` (``envs_per_actor``, ``workers``,
        ``resources``, ``transport``, ``env_process``, ``busy_poll``, ``timeout``,
        ``step_timeout``, ``on_worker_lost``, ``on_env_error``, ``max_restarts``,
        ``worker_wait_timeout``, ``migrate_before``, ``auto_rebalance``,
        ``rebalance_interval``), with the same meaning.

    Attributes
    ----------
    single_observation_space, single_action_space : gymnasium.spaces.Space
        One env's spaces.
    observation_space, action_space : gymnasium.spaces.Space
        The batched spaces (``gymnasium.vector.utils.batch_space``; a ``Tuple`` of
        per-env spaces for spaces that do not batch into arrays, such as ``Text``).
    metadata : dict
        Env 0's metadata, with ``"autoreset_mode"``.
    render_mode : str or None
        Env 0's render mode.
    spec : gymnasium.envs.registration.EnvSpec or None
        Set by :func:`make_vec`.

    Raises
    ------
    TypeError, ValueError
        Bad factories or options (naming the option), an invalid ``observation_mode``.
    RuntimeError
        Envs whose spaces differ (as ``observation_mode`` allows them not to).

    Examples
    --------
    >>> import daskvec
    >>> envs = daskvec.make_vec("CartPole-v1", num_envs=8)  # doctest: +SKIP
    >>> obs, infos = envs.reset(seed=0)  # doctest: +SKIP
    >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())  # doctest: +SKIP
    >>> envs.close()  # doctest: +SKIP
    """

    @short_errors
    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        client: Any = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
        copy: bool = True,
        batch_size: int | None = None,
        cluster_kwargs: dict[str, Any] | None = None,
        shared_memory: bool | None = None,
        context: str | None = None,
        daemon: bool | None = None,
        worker: Callable[..., Any] | None = None,
        max_concurrency: int | None = None,
        **options: Any,
    ) -> None:
        self._state = _State.CLOSED  # until construction succeeds; makes close()/__del__ safe
        self.closed = True
        mode = layout.autoreset_mode(autoreset_mode)
        spaces = layout.ObservationMode(observation_mode)
        n_envs = len(check_env_fns(env_fns))
        self.batch_size = layout.batch_size(batch_size, n_envs)
        if self.batch_size < n_envs and options.get("envs_per_actor") is None:
            options["envs_per_actor"] = math.gcd(self.batch_size, n_envs)
        checked = Options.create(**options)
        ignore_async_keywords(
            shared_memory=shared_memory, context=context, daemon=daemon, worker=worker, max_concurrency=max_concurrency
        )
        engine = Engine(
            env_fns,
            client,
            checked,
            cluster_kwargs,
            autoreset=mode.value,
            always_pass_options=True,  # Gymnasium's reset(seed=..., options=...), options or not
            check_spaces=spaces,
        )
        self._attach(engine, mode, spaces, observation_mode, copy)

    @classmethod
    @short_errors
    def from_vector_envs(
        cls,
        vector_env_fns: Sequence[Callable[[], Any]],
        client: Any = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
        copy: bool = True,
        batch_size: int | None = None,
        cluster_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> DaskVectorEnv:
        """A DaskVectorEnv whose groups are vectorized envs: one per factory, stepped with one call.

        As :meth:`daskvec.DaskVecEnv.from_vector_envs`, with Gymnasium's API: each factory
        returns a Gymnasium ``VectorEnv`` or an EnvPool, built on a worker as one group.
        Each vector env must reset finished envs as ``autoreset_mode`` says: with the
        same mode (``NEXT_STEP``: Gymnasium's default and EnvPool's), or, for
        ``SAME_STEP``, with ``DISABLED`` (the group resets them by mask) or as an EnvPool.
        A partial batch (``batch_size``, :meth:`send`/:meth:`recv`) is made of whole
        vector envs.

        Parameters
        ----------
        vector_env_fns : list of callable
            Zero-argument callables that each create one vectorized env (called on the workers).
        client : distributed.Client, str, Cluster or None, optional
            Where the envs run.
        autoreset_mode, observation_mode, copy, batch_size, cluster_kwargs, **options
            As for the constructor (``envs_per_actor`` is ignored). ``observation_mode``
            batches the envs of all the vector envs together: ``"different"`` when their
            spaces differ in bounds (a vector env's envs as its ``SyncVectorEnv.envs`` hold
            them; a vector env that does not hold its envs gives every env its
            ``single_observation_space``).

        Returns
        -------
        DaskVectorEnv

        Raises
        ------
        TypeError, ValueError
            As for :meth:`daskvec.DaskVecEnv.from_vector_envs`, and a ``batch_size``
            larger than the number of envs.
        """
        self = cls.__new__(cls)
        self._state = _State.CLOSED  # until construction succeeds; makes close()/__del__ safe
        self.closed = True
        mode = layout.autoreset_mode(autoreset_mode)
        checked = Options.create(**options)
        spaces = layout.ObservationMode(observation_mode)
        engine = Engine(
            vector_env_fns,
            client,
            checked,
            cluster_kwargs,
            autoreset=mode.value,
            always_pass_options=True,
            check_spaces=spaces,
            vector=True,
        )
        try:
            self.batch_size = layout.batch_size(batch_size, engine.n_envs)
        except ValueError:
            engine.close()
            raise
        self._attach(engine, mode, spaces, observation_mode, copy)
        return self

    def _attach(
        self,
        engine: Engine,
        mode: AutoresetMode,
        spaces: layout.ObservationMode,
        observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]],
        copy: bool,
    ) -> None:
        """Take ``engine`` (built) as this face's: spaces, buffers, state, the envs' metadata."""
        self._engine = engine
        n_envs = engine.n_envs
        self.client, self.options = engine.client, engine.options
        self.num_envs = n_envs
        self.autoreset_mode = mode
        self.observation_mode = observation_mode
        self.copy = bool(copy)
        self.single_observation_space = engine.observation_space
        self.single_action_space = engine.action_space
        assert spaces.batched is not None
        self.observation_space = spaces.batched
        self.action_space = batch_space(self.single_action_space, n_envs)
        self._buffers = VectorBuffers(self.single_observation_space, n_envs, Autoreset(mode.value), self.copy)
        self._ready: list[Group] = []  # async_reset(): groups whose first observations recv() hands out
        self._reset_mask: np.ndarray | None = None  # of the reset reset_async() sent
        self._state = _State.IDLE
        self.closed = False
        try:
            metadata, self.render_mode = self.call_one("metadata"), self.call_one("render_mode")
        except BaseException:
            self.close()
            raise
        self.metadata = {**dict(metadata or {}), "autoreset_mode": mode}
        self.spec = None
        logger.info("DaskVectorEnv: %s", engine.summary())

    # ------------------------------------------------------------------ state
    @property
    def _pool(self) -> GroupPool:
        if self._engine.pool is None or self._state is _State.CLOSED:
            raise ClosedEnvError("Trying to operate on `DaskVectorEnv`, after a call to `close()`.")
        return self._engine.pool

    def _check_running(self) -> None:
        """Raise if the vec env is closed, or broken (the engine lost envs or its scheduler for good)."""
        if self._state is _State.CLOSED:
            raise ClosedEnvError("Trying to operate on `DaskVectorEnv`, after a call to `close()`.")
        if self._engine.broken is not None:
            self._engine.check()

    def _check_idle(self, call: str, end: str = ".") -> None:
        """Raise ``AlreadyPendingCallError`` (daskvec's ``AlreadySteppingError``) unless no call is pending.

        The message is ``AsyncVectorEnv``'s, whose ``reset_async`` ends it without a period (``end``).
        """
        self._check_running()
        state = self._state
        if state is _State.IDLE:
            return
        if state is _State.ASYNC:
            raise AlreadySteppingError("envs have steps in flight: call recv() until none is left first", state.value)
        raise AlreadySteppingError(
            f"Calling `{call}` while waiting for a pending call to `{state.value}` to complete{end}", state.value
        )

    def _check_waiting(self, state: _State, call: str, start: str) -> None:
        """Raise ``NoAsyncCallError`` unless ``state`` is pending (``call`` waits for what ``start`` sent)."""
        self._check_running()
        if self._state is not state:
            raise NoAsyncCallError(f"Calling `{call}` without any prior call to `{start}`.", state.value)

    def _wait_ready(self, timeout: float | None, call: str) -> None:
        """Wait up to ``timeout`` seconds for every reply to be in (``None``: no wait here), else raise.

        The exception is ``AsyncVectorEnv``'s, ``multiprocessing.TimeoutError``. Unlike
        there, the call stays pending: wait again for its results, or close.
        """
        if timeout is not None and not self._engine.ready(timeout):
            raise multiprocessing.TimeoutError(f"The call to `{call}` has timed out after {timeout} second(s).")

    def _done_waiting(self) -> None:
        """After a wait: back to idle, unless it was interrupted (Ctrl-C) and is still pending."""
        if not self._engine.stepping:
            self._state = _State.IDLE

    def _on_lost_deferred(self, lost: dict[Group, BaseException], waited: float) -> None:
        self._engine.lost_handler(self._buffers, "deferred")(lost, waited)

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """Each env's ``np_random_seed`` (after ``reset(seed=42)``: ``(42, 43, ...)``), as in Gymnasium."""
        return self.get_attr("np_random_seed")

    # Gymnasium's vector envs replace the base class's one generator (settable) with the
    # envs' own, read-only: so does this one
    @property  # type: ignore[misc]
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """A copy of each env's random number generator (``np_random``), as in Gymnasium."""
        return self.get_attr("np_random")

    # ------------------------------------------------------------------ reset
    def reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs (those of ``options["reset_mask"]`` only, if given); see ``SyncVectorEnv.reset``.

        Parameters
        ----------
        seed : int, list of int or None, optional
            ``int``: env ``i`` gets ``seed + i``; a list: one seed (or ``None``) per env.
        options : dict, optional
            Given to every env's ``reset`` (``env.reset(seed=..., options=...)``); its
            ``"reset_mask"`` (a boolean array of shape ``(num_envs,)``) selects the envs
            to reset, the others keep their observation (needed with
            ``autoreset_mode=DISABLED``). A mask of only ``True`` is a full reset, also
            the first one.

        Returns
        -------
        observations, infos
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send the envs their reset without waiting (``AsyncVectorEnv.reset_async``); :meth:`reset_wait` collects it.

        Parameters are those of :meth:`reset`.

        Raises
        ------
        gymnasium.error.AlreadyPendingCallError
            Another call is pending (daskvec's :class:`~daskvec.errors.AlreadySteppingError`).
        gymnasium.error.ClosedEnvironmentError
            After ``close()`` (daskvec's :class:`~daskvec.errors.ClosedEnvError`).
        """
        self._check_running()
        seeds = layout.seeds(seed, self.num_envs)
        self._check_idle("reset_async", end="")
        env_options, mask = layout.reset_options(options, self.num_envs, self._buffers.has_obs)
        engine = self._engine
        if mask is None and engine.recovery.moves_planned:
            engine.report(self._buffers, "reset", engine.recovery.migrate)
        self._buffers.forget_deferred(None if mask is None else np.flatnonzero(mask).tolist())
        engine.send_reset(seeds, [env_options] * self.num_envs, None if mask is None else mask.tolist())
        self._reset_mask = mask
        self._state = _State.WAITING_RESET

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset :meth:`reset_async` sent and return ``(observations, infos)``.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait for every env's reply (``None``: the ``timeout`` option bounds
            the wait, after which envs that did not answer are rebuilt elsewhere).

        Raises
        ------
        gymnasium.error.NoAsyncCallError
            No :meth:`reset_async` is pending.
        multiprocessing.TimeoutError
            Not every reply came within ``timeout``; the reset stays pending (call again).
        """
        self._check_waiting(_State.WAITING_RESET, "reset_wait", "reset_async")
        self._wait_ready(timeout, "reset_wait")
        mask, engine = self._reset_mask, self._engine
        try:
            engine.collect_reset(
                functools.partial(self._take_reset, mask=mask), engine.lost_handler(self._buffers, "reset")
            )
        finally:
            self._done_waiting()
        self._buffers.has_obs = True
        return self._buffers.reset_result(None if mask is None else mask.tolist())

    def _take_reset(self, group: Group, reply: ResetReply, mask: np.ndarray | None) -> None:
        self._buffers.take_reset(group, reply, None if mask is None else mask.tolist())

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action and wait for all of them; see ``SyncVectorEnv.step``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Send every env its action without waiting (``AsyncVectorEnv.step_async``); :meth:`step_wait` collects.

        Raises
        ------
        gymnasium.error.AlreadyPendingCallError
            Another call is pending (daskvec's :class:`~daskvec.errors.AlreadySteppingError`).
        """
        self._check_idle("step_async")
        rows = layout.action_rows(actions, self.num_envs, self.single_action_space, self.action_space)
        self._engine.send_step(rows)
        self._state = _State.WAITING_STEP

    def step_wait(self, timeout: float | None = None) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step :meth:`step_async` sent; ``(obs, rewards, terminations, truncations, infos)``.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait for every env's reply (``None``: the ``step_timeout`` option
            bounds the wait, after which envs that did not answer are rebuilt elsewhere
            and report a truncation).

        Raises
        ------
        gymnasium.error.NoAsyncCallError
            No :meth:`step_async` is pending.
        multiprocessing.TimeoutError
            Not every reply came within ``timeout``; the step stays pending (call again).
        """
        self._check_waiting(_State.WAITING_STEP, "step_wait", "step_async")
        self._wait_ready(timeout, "step_wait")
        engine, buffers = self._engine, self._buffers
        outcome = StepOutcome()
        try:
            with contextlib.closing(engine.collect_step(outcome)) as replies:
                for group, reply in replies:  # each as soon as it is read
                    buffers.take_step(group, reply)
        finally:
            self._done_waiting()  # collected, or given up after a reply that did not fit
        buffers.apply_deferred()
        engine.finish(outcome, buffers)
        return buffers.result()

    # ------------------------------------------------------------------ partial batches
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send actions to the envs ``env_ids`` (default: all) without waiting (EnvPool's ``send``).

        ``env_ids`` must be made of whole groups with no step in flight: in practice the
        ``info["env_id"]`` of a batch :meth:`recv` returned. Row ``k`` of ``actions`` is
        the action of env ``env_ids[k]``.
        """
        if self._state is not _State.ASYNC:
            self._check_idle("send")
        self._check_running()
        pool = self._pool
        ids = self._engine.positions(None if env_ids is None else [int(i) for i in np.asarray(env_ids).ravel()])
        rows = layout.action_rows(actions, len(ids), self.single_action_space)
        busy = {g.gid for g in pool.in_flight()} | {g.gid for g in self._ready}
        sends = layout.group_rows(pool.groups, ids, rows, busy)
        self._engine.timer.sent()
        pool.send_groups(sends)
        self._state = _State.ASYNC

    def recv(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the first envs to finish (whole groups, ``batch_size`` envs or more) and return them.

        Returns ``(obs, rewards, terminations, truncations, infos)`` for those envs only,
        their ids in ``infos["env_id"]`` (row ``k`` is env ``infos["env_id"][k]``).
        Rows are per env, in the order their groups answered: keep trajectories per
        env id, never in a fixed ``(T, num_envs)`` layout.
        """
        self._check_running()
        if self._state is _State.IDLE:
            raise NoAsyncCallError("recv() called with no step in flight: call send() first", "recv")
        if self._state is not _State.ASYNC:
            self._check_idle("recv")
        if self._ready:
            return self._recv_ready()
        pool, engine, buffers = self._pool, self._engine, self._buffers
        outcome = StepOutcome()
        for group, reply in engine.collect_ready(self.batch_size, outcome):
            buffers.take_step(group, reply)
        ids = [i for g in outcome.groups for i in g.env_indices]
        if not pool.in_flight():
            self._state = _State.IDLE
        buffers.apply_deferred(ids)
        # moves only among the groups handed out now: the others may have a step in flight
        engine.finish(outcome, buffers, migrate=outcome.groups)
        return buffers.batch(ids)

    def _recv_ready(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        taken: list[int] = []
        while self._ready and len(taken) < self.batch_size:
            taken += self._ready.pop(0).env_indices
        if not self._ready and not self._pool.in_flight():
            self._state = _State.IDLE
        return self._buffers.batch(taken)

    def async_reset(
        self, *, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env; :meth:`recv` then hands out their first observations in batches (EnvPool's)."""
        self.reset(seed=seed, options=options)
        self._ready = list(self._pool.groups)
        self._state = _State.ASYNC

    # ------------------------------------------------------------------ per-env calls
    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of every env (or read attribute ``name``); results in env order."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Send every env the call without waiting (``AsyncVectorEnv.call_async``); :meth:`call_wait` collects.

        Raises
        ------
        gymnasium.error.AlreadyPendingCallError
            Another call is pending (daskvec's :class:`~daskvec.errors.AlreadySteppingError`).
        """
        self._check_idle("call_async")
        self._engine.send_per_env(Command.CALL, lambda _g, p: (name, args, kwargs, p), list(range(self.num_envs)))
        self._state = _State.WAITING_CALL

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call :meth:`call_async` sent; each env's result, in env order.

        Parameters
        ----------
        timeout : float, optional
            Seconds to wait for every env's reply (``None``: the ``timeout`` option).

        Raises
        ------
        gymnasium.error.NoAsyncCallError
            No :meth:`call_async` is pending.
        multiprocessing.TimeoutError
            Not every reply came within ``timeout``; the call stays pending (call again).
        """
        self._check_waiting(_State.WAITING_CALL, "call_wait", "call_async")
        self._wait_ready(timeout, "call_wait")
        try:
            return tuple(self._engine.collect_per_env(self._on_lost_deferred))
        finally:
            self._done_waiting()

    def call_one(self, name: str) -> Any:
        """Env 0's ``name`` (called when it is a method)."""
        return self._engine.per_env(Command.CALL, lambda _g, p: (name, (), {}, p), [0], self._on_lost_deferred)[0]

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (see ``SyncVectorEnv.get_attr``)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of every env: one value each (a list or tuple), or the same for all."""
        self._check_running()
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        self._check_idle("set_attr")
        by_env = list(values)

        def args(group: Group, positions: list[int]) -> tuple[Any, ...]:
            return (name, [by_env[group.env_indices[p]] for p in positions], positions)

        self._engine.per_env(Command.SET_WRAPPER_ATTR, args, list(range(self.num_envs)), self._on_lost_deferred)

    def render(self) -> tuple[Any, ...]:
        """Each env's ``render()``."""
        self._check_idle("render")
        return tuple(
            self._engine.per_env(Command.RENDER, lambda _g, p: (p,), list(range(self.num_envs)), self._on_lost_deferred)
        )

    # ------------------------------------------------------------------ views and close
    @property
    def pending(self) -> list[int]:
        """Ids of the envs sent a step (or queued by :meth:`async_reset`) that :meth:`recv` has not returned."""
        if self._state is _State.CLOSED:
            return []
        groups = [*self._ready, *self._pool.in_flight()]
        return sorted(i for g in groups for i in g.env_indices)

    @property
    def groups(self) -> list[dict[str, Any]]:
        """One entry per env group, as ``DaskVecEnv.groups`` gives it (env indices, worker, ``shared_memory``,
        the channel: ``channel``, ``address``, ``socket_path``, ``encrypted``, ...), except that
        ``transport`` names the socket too (``"direct/unix"``, ``"direct/tcp"``, ``"direct/tls"``, ``"actor"``)."""
        return [{**g.describe(), "transport": g.transport} for g in self._engine.groups]

    def close_extras(self, **kwargs: Any) -> None:
        """Shut the env groups down and close what this vec env created (safe with calls in flight).

        ``AsyncVectorEnv``'s keywords (``timeout``, ``terminate``) are accepted; what is
        in flight is collected (bounded by ``step_timeout``) or abandoned, as for
        :class:`~daskvec.DaskVecEnv`. As ``AsyncVectorEnv`` does, a pending split call
        is warned about.
        """
        if self._state in _WAITING:
            gym.logger.warn(f"Calling `close` while waiting for a pending call to `{self._state.value}` to complete.")
        self._state = _State.CLOSED
        if hasattr(self, "_engine"):
            self._engine.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._engine.groups)} groups"
        return f"<DaskVectorEnv: {getattr(self, 'num_envs', 0)} envs, {state}, autoreset {self.autoreset_mode.name}>"


def _make_one(env_spec: Any, kwargs: dict[str, Any], wrappers: Sequence[Callable[..., Any]]) -> gym.Env[Any, Any]:
    env = gym.make(env_spec, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


@short_errors
def make_vec(
    id: str | gym.envs.registration.EnvSpec,
    num_envs: int = 1,
    client: Any = None,
    vector_kwargs: dict[str, Any] | None = None,
    wrappers: Sequence[Callable[[gym.Env[Any, Any]], gym.Wrapper[Any, Any, Any, Any]]] | None = None,
    **kwargs: Any,
) -> DaskVectorEnv:
    """Create a :class:`DaskVectorEnv` of a registered env, like ``gymnasium.make_vec``.

    Parameters
    ----------
    id : str or EnvSpec
        The env's id (e.g. ``"CartPole-v1"``) or spec.
    num_envs : int
        Number of envs.
    client : distributed.Client, str, Cluster or None, optional
        Where the envs run (see :class:`DaskVectorEnv`).
    vector_kwargs : dict, optional
        Arguments of :class:`DaskVectorEnv` (``autoreset_mode``, ``batch_size`` and the
        options of :class:`~daskvec.DaskVecEnv`).
    wrappers : list of callable, optional
        Wrappers applied to each env, in order, on the workers.
    **kwargs
        Arguments of the env itself (given to ``gymnasium.make``).

    Returns
    -------
    DaskVectorEnv
        With ``spec`` set as ``gymnasium.make_vec`` sets it.
    """
    if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs must be a positive int, not {num_envs!r}")
    if "vectorization_mode" in kwargs:  # gymnasium.make_vec's, which would reach the env's constructor here
        raise TypeError(
            "daskvec.make_vec always makes a DaskVectorEnv: drop vectorization_mode (gymnasium.make_vec"
            "'s Sync or Async choice); pass DaskVectorEnv's options as vector_kwargs"
        )
    env_spec = gym.spec(id) if isinstance(id, str) else id
    factory = functools.partial(_make_one, env_spec, dict(kwargs), list(wrappers or ()))
    envs = DaskVectorEnv([factory] * num_envs, client, **dict(vector_kwargs or {}))
    spec = copy.deepcopy(env_spec)
    spec.kwargs = {**spec.kwargs, **kwargs, "num_envs": num_envs}
    if vector_kwargs:
        spec.kwargs["vector_kwargs"] = dict(vector_kwargs)
    envs.spec = spec
    return envs
