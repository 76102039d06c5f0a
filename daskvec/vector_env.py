"""Client side: :class:`DaskVectorEnv`, a Gymnasium 1.x ``VectorEnv`` on Dask actors (issue 16).

The second face of daskvec, beside :class:`~daskvec.vec_env.DaskVecEnv`: both own an
:class:`~daskvec.engine.Engine` (options, client, worker directory, group pool,
recovery), so groups, transports, fault handling and the dashboard are the same. This
module holds the Gymnasium API and its state; :mod:`daskvec.vector_buffers` builds
Gymnasium's results and infos.

Besides the synchronous :meth:`DaskVectorEnv.step`, it offers EnvPool's partial-batch
pair: :meth:`DaskVectorEnv.send` sends actions to some envs and :meth:`DaskVectorEnv.recv`
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
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, iterate

from daskvec.engine import Engine, EngineViews
from daskvec.errors import AlreadySteppingError, ClosedEnvError, NoAsyncCallError
from daskvec.options import Options, check_env_fns
from daskvec.pool import Group, GroupPool
from daskvec.protocol import Autoreset, Command, ResetReply
from daskvec.vector_buffers import VectorBuffers

logger = logging.getLogger(__name__)

__all__ = ["DaskVectorEnv", "make_vec"]


class _State(enum.Enum):
    IDLE = "idle"  # no step in flight
    ASYNC = "async"  # send() sent steps (or async_reset() queued observations) not yet handed out by recv()
    STEPPING = "stepping"  # a step() was interrupted while waiting; only close() is left
    CLOSED = "closed"


def _autoreset_mode(value: Any) -> AutoresetMode:
    if isinstance(value, AutoresetMode):
        return value
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return AutoresetMode(value) if value in {m.value for m in AutoresetMode} else AutoresetMode[str(value)]
    raise ValueError(
        f"autoreset_mode must be a gymnasium.vector.AutoresetMode or one of "
        f"{[m.value for m in AutoresetMode]}, not {value!r}"
    )


def _batch_size(value: Any, n_envs: int) -> int:
    if value is None:
        return n_envs
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= n_envs:
        raise ValueError(f"batch_size must be an int from 1 to num_envs={n_envs}, not {value!r}")
    return int(value)


class DaskVectorEnv(EngineViews, gym.vector.VectorEnv):
    """A Gymnasium ``VectorEnv`` whose envs live as Dask actors on a cluster.

    It behaves like ``gymnasium.vector.SyncVectorEnv`` (same observations, rewards,
    terminations, truncations and infos for the same seeded envs and actions, in each
    autoreset mode), with the envs spread over the workers of a ``dask.distributed``
    cluster in groups, as :class:`~daskvec.DaskVecEnv` spreads them.

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument callables that each create one environment (called on the workers).
    client : distributed.Client, str, Cluster or None, optional
        Where the envs run, as for :class:`~daskvec.DaskVecEnv`.
    autoreset_mode : gymnasium.vector.AutoresetMode or str
        ``NEXT_STEP`` (default), ``SAME_STEP`` or ``DISABLED`` (reset finished envs with
        ``reset(options={"reset_mask": mask})``), as in Gymnasium.
    batch_size : int, optional
        How many envs :meth:`recv` returns at least (default: all). A batch is made of
        whole groups: unless ``envs_per_actor`` is given, groups then hold
        ``gcd(batch_size, num_envs)`` envs, so that batches are exactly ``batch_size``.
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.
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
        The batched spaces (``gymnasium.vector.utils.batch_space``).
    metadata : dict
        Env 0's metadata, with ``"autoreset_mode"``.
    render_mode : str or None
        Env 0's render mode.
    spec : gymnasium.envs.registration.EnvSpec or None
        Set by :func:`make_vec`.

    Raises
    ------
    TypeError, ValueError
        Bad factories or options (naming the option), envs whose spaces differ.

    Examples
    --------
    >>> import daskvec
    >>> envs = daskvec.make_vec("CartPole-v1", num_envs=8)  # doctest: +SKIP
    >>> obs, infos = envs.reset(seed=0)  # doctest: +SKIP
    >>> obs, rewards, terminations, truncations, infos = envs.step(envs.action_space.sample())  # doctest: +SKIP
    >>> envs.close()  # doctest: +SKIP
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        client: Any = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        batch_size: int | None = None,
        cluster_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        self._state = _State.CLOSED  # until construction succeeds; makes close()/__del__ safe
        self.closed = True
        mode = _autoreset_mode(autoreset_mode)
        n_envs = len(check_env_fns(env_fns))
        self.batch_size = _batch_size(batch_size, n_envs)
        if self.batch_size < n_envs and options.get("envs_per_actor") is None:
            options["envs_per_actor"] = math.gcd(self.batch_size, n_envs)
        checked = Options.create(**options)
        self._attach(Engine(env_fns, client, checked, cluster_kwargs, autoreset=mode.value), mode)

    @classmethod
    def from_vector_envs(
        cls,
        vector_env_fns: Sequence[Callable[[], Any]],
        client: Any = None,
        *,
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
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
        autoreset_mode, batch_size, cluster_kwargs, **options
            As for the constructor (``envs_per_actor`` is ignored).

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
        mode = _autoreset_mode(autoreset_mode)
        checked = Options.create(**options)
        engine = Engine(vector_env_fns, client, checked, cluster_kwargs, autoreset=mode.value, vector=True)
        try:
            self.batch_size = _batch_size(batch_size, engine.n_envs)
        except ValueError:
            engine.close()
            raise
        self._attach(engine, mode)
        return self

    def _attach(self, engine: Engine, mode: AutoresetMode) -> None:
        """Take ``engine`` (built) as this face's: spaces, buffers, state, the envs' metadata."""
        self._engine = engine
        n_envs = engine.n_envs
        self.client, self.options = engine.client, engine.options
        self.num_envs = n_envs
        self.autoreset_mode = mode
        self.single_observation_space = engine.observation_space
        self.single_action_space = engine.action_space
        self.observation_space = batch_space(self.single_observation_space, n_envs)
        self.action_space = batch_space(self.single_action_space, n_envs)
        self._buffers = VectorBuffers(self.single_observation_space, n_envs, Autoreset(mode.value))
        self._ready: list[Group] = []  # async_reset(): groups whose first observations recv() hands out
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
            raise ClosedEnvError("this DaskVectorEnv is closed; create a new one")
        return self._engine.pool

    def _enter(self, *allowed: _State) -> None:
        """Check that the vec env may be called now; raise the typed error that says why not."""
        state = self._state
        if state is not _State.CLOSED and self._engine.broken is not None:
            self._engine.check()
        if state in allowed:
            return
        if state is _State.CLOSED:
            raise ClosedEnvError("this DaskVectorEnv is closed; create a new one")
        if state is _State.STEPPING:
            raise AlreadySteppingError("a step() was interrupted while waiting for its replies; close this vec env")
        if self._state is _State.ASYNC:
            raise AlreadySteppingError("envs have steps in flight: call recv() until none is left first")
        raise NoAsyncCallError("recv() called with no step in flight: call send() first")

    def _on_lost_deferred(self, lost: dict[Group, BaseException], waited: float) -> None:
        self._engine.lost_handler(self._buffers, "deferred")(lost, waited)

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
            Given to every env's ``reset``; its ``"reset_mask"`` (a boolean array of
            shape ``(num_envs,)``) selects the envs to reset, the others keep their
            observation (needed with ``autoreset_mode=DISABLED``).

        Returns
        -------
        observations, infos
        """
        self._enter(_State.IDLE)
        seeds = self._seeds(seed)
        env_options = dict(options) if options is not None else None
        mask = self._reset_mask(env_options.pop("reset_mask")) if env_options and "reset_mask" in env_options else None
        if mask is not None and not self._buffers.has_obs:
            raise ValueError("options['reset_mask'] needs a full reset first: call reset() without it once")
        engine = self._engine
        if mask is None and engine.recovery.moves_planned:
            engine.report(self._buffers, "reset", engine.recovery.migrate)
        self._buffers.forget_deferred(None if mask is None else np.flatnonzero(mask).tolist())
        engine.reset_groups(
            seeds,
            [env_options or {}] * self.num_envs,
            functools.partial(self._take_reset, mask=mask),
            engine.lost_handler(self._buffers, "reset"),
            mask=None if mask is None else mask.tolist(),
        )
        self._buffers.has_obs = True
        return self._buffers.reset_result(None if mask is None else mask.tolist())

    def _take_reset(self, group: Group, reply: ResetReply, mask: np.ndarray | None) -> None:
        self._buffers.take_reset(group, reply, None if mask is None else mask.tolist())

    def _seeds(self, seed: Any) -> list[int | None]:
        if seed is None:
            return [None] * self.num_envs
        if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
            return [int(seed) + i for i in range(self.num_envs)]
        seeds = list(seed)
        if len(seeds) != self.num_envs:
            raise ValueError(
                f"If seeds are passed as a list the length must match num_envs={self.num_envs} "
                f"but got length={len(seeds)}."
            )
        return seeds

    def _reset_mask(self, mask: Any) -> np.ndarray:
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
        if mask.shape != (self.num_envs,):
            raise ValueError(f"`options['reset_mask']` must have shape `({self.num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
        if not mask.any():
            raise ValueError(f"`options['reset_mask']` must contain at least one True value, got reset_mask={mask}")
        return mask

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action and wait for all of them; see ``SyncVectorEnv.step``."""
        self._enter(_State.IDLE)
        engine = self._engine
        rows = self._action_rows(actions, self.num_envs)
        self._state = _State.STEPPING
        engine.send_step(rows)
        try:
            outcome = engine.collect_step(self._buffers)
        finally:
            if not engine.stepping:  # collected, or given up after a reply that did not fit
                self._state = _State.IDLE
        self._buffers.apply_deferred()
        engine.finish(outcome, self._buffers)
        return self._buffers.result()

    def _action_rows(self, actions: Any, n: int) -> Any:
        """The actions as something indexable by row (an array, or a list for Dict/Tuple spaces)."""
        if isinstance(actions, np.ndarray):
            rows: Any = actions
        elif isinstance(self.single_action_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            rows = list(iterate(batch_space(self.single_action_space, n), actions))
        else:
            rows = np.asarray(actions)
        if len(rows) != n:
            raise ValueError(
                f"got {len(rows)} actions for {n} envs; pass one action per env (first axis of length {n})"
            )
        return rows

    # ------------------------------------------------------------------ partial batches
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Send actions to the envs ``env_ids`` (default: all) without waiting (EnvPool's ``send``).

        ``env_ids`` must be made of whole groups with no step in flight: in practice the
        ``info["env_id"]`` of a batch :meth:`recv` returned. Row ``k`` of ``actions`` is
        the action of env ``env_ids[k]``.
        """
        self._enter(_State.IDLE, _State.ASYNC)
        pool = self._pool
        ids = self._engine.positions(None if env_ids is None else [int(i) for i in np.asarray(env_ids).ravel()])
        rows = self._action_rows(actions, len(ids))
        row_of = {i: k for k, i in enumerate(ids)}
        if len(row_of) != len(ids):
            raise ValueError(f"env_ids {ids} name an env twice; name each env once")
        busy = {g.gid for g in pool.in_flight()} | {g.gid for g in self._ready}
        sends: dict[Group, Any] = {}
        for g in pool.groups:
            wanted = [i in row_of for i in g.env_indices]
            if not any(wanted):
                continue
            if not all(wanted) or g.gid in busy:
                why = "has a step in flight" if all(wanted) else "is only partly named"
                raise ValueError(
                    f"the group of envs {g.env_indices} {why}; send() takes whole groups with no step in "
                    "flight: pass the info['env_id'] of a batch that recv() returned"
                )
            positions = [row_of[i] for i in g.env_indices]
            sends[g] = rows[np.asarray(positions)] if isinstance(rows, np.ndarray) else [rows[k] for k in positions]
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
        self._enter(_State.ASYNC)
        if self._ready:
            return self._recv_ready()
        pool, engine = self._pool, self._engine
        groups, outcome = engine.collect_ready(self.batch_size, self._buffers)
        ids = [i for g in groups for i in g.env_indices]
        if not pool.in_flight():
            self._state = _State.IDLE
        self._buffers.apply_deferred(ids)
        # moves only among the groups handed out now: the others may have a step in flight
        engine.finish(outcome, self._buffers, migrate=groups)
        return self._buffers.batch(ids)

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
        self._enter(_State.IDLE)
        return tuple(
            self._engine.per_env(
                Command.CALL, lambda _g, p: (name, args, kwargs, p), list(range(self.num_envs)), self._on_lost_deferred
            )
        )

    def call_one(self, name: str) -> Any:
        """Env 0's ``name`` (called when it is a method)."""
        return self._engine.per_env(Command.CALL, lambda _g, p: (name, (), {}, p), [0], self._on_lost_deferred)[0]

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (see ``SyncVectorEnv.get_attr``)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of every env: one value each (a list or tuple), or the same for all."""
        self._enter(_State.IDLE)
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(
                "Values must be a list or tuple with length equal to the number of environments. "
                f"Got `{len(values)}` values for {self.num_envs} environments."
            )
        by_env = list(values)

        def args(group: Group, positions: list[int]) -> tuple[Any, ...]:
            return (name, [by_env[group.env_indices[p]] for p in positions], positions)

        self._engine.per_env(Command.SET_WRAPPER_ATTR, args, list(range(self.num_envs)), self._on_lost_deferred)

    def render(self) -> tuple[Any, ...]:
        """Each env's ``render()``."""
        self._enter(_State.IDLE)
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
        """One entry per env group: its env indices, worker and transport."""
        return [
            {"envs": list(g.env_indices), "worker": g.worker, "transport": g.transport} for g in self._engine.groups
        ]

    def close_extras(self, **kwargs: Any) -> None:
        """Shut the env groups down and close what this vec env created (safe with steps in flight)."""
        self._state = _State.CLOSED
        if hasattr(self, "_engine"):
            self._engine.close()

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            warnings.warn("DaskVectorEnv was not closed; call envs.close()", ResourceWarning, stacklevel=1)
            for g in self._engine.groups:
                with contextlib.suppress(Exception):
                    g.channel.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._engine.groups)} groups"
        return f"<DaskVectorEnv: {getattr(self, 'num_envs', 0)} envs, {state}, autoreset {self.autoreset_mode.name}>"


def _make_one(env_spec: Any, kwargs: dict[str, Any], wrappers: Sequence[Callable[..., Any]]) -> gym.Env[Any, Any]:
    env = gym.make(env_spec, **kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return env


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
    env_spec = gym.spec(id) if isinstance(id, str) else id
    factory = functools.partial(_make_one, env_spec, dict(kwargs), list(wrappers or ()))
    envs = DaskVectorEnv([factory] * num_envs, client, **dict(vector_kwargs or {}))
    spec = copy.deepcopy(env_spec)
    spec.kwargs = {**spec.kwargs, **kwargs, "num_envs": num_envs}
    if vector_kwargs:
        spec.kwargs["vector_kwargs"] = dict(vector_kwargs)
    envs.spec = spec
    return envs
