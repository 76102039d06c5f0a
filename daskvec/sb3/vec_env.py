"""Client side: :class:`DaskVecEnv`, a Stable-Baselines3 ``VecEnv`` on Dask actors.

This module is the SB3 face and the state machine; the work is done by the parts
(see docs/architecture.md):

- :mod:`daskvec._core.options` -- the options, checked once;
- :mod:`daskvec._core.directory` -- which workers may take envs, and where envs go;
- :mod:`daskvec._core.pool` -- the env-group actors: create, call, step, collect, tear down;
- :mod:`daskvec.sb3.buffers` -- replies into SB3's observations, rewards, dones and infos;
- :mod:`daskvec._core.recovery` -- lost, hung and moved groups, and the restart ledger.
- :mod:`daskvec.sb3.replay` -- worker-side rollouts (``collect_rollout``, ``replay``), a mixin.

A step goes one way: :meth:`DaskVecEnv.step_async` sends each group its actions
through the pool; :meth:`DaskVecEnv.step_wait` collects the replies into the buffers
as they arrive, has recovery rebuild what was lost (the buffers report it as
truncations), and only then raises an env's error, if one raised.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from daskvec._core.engine import Engine, EngineViews
from daskvec._core.handles import Group, StepOutcome
from daskvec._core.masks import ActionMaskCache
from daskvec._core.options import Options, ignore_subproc_keywords
from daskvec._core.recovery import Rebuild
from daskvec._core.user_errors import short_errors
from daskvec.errors import AlreadySteppingError, ClosedEnvError, NoAsyncCallError
from daskvec.monitoring.notebook import notebook_html
from daskvec.protocol.messages import MASK_METHOD, Command, ResetReply, StepReply
from daskvec.sb3.buffers import StepBuffers
from daskvec.sb3.replay import PendingRollout, RolloutMethods

logger = logging.getLogger(__name__)

__all__ = ["DaskVecEnv", "State"]


class State(enum.Enum):
    """Where a :class:`DaskVecEnv` is in its life; checked at every entry."""

    IDLE = "idle"  # ready for any call
    STEPPING = "stepping"  # step_async() sent a step that step_wait() has not collected
    COLLECTING = "collecting"  # start_rollout() sent a worker-side collection that finish_rollout() has not read
    BROKEN = "broken"  # envs or the scheduler were lost for good: only close() is left
    CLOSED = "closed"


class _BuffersAndMasks:
    """Writes replies and rebuilt envs into the step buffers and the action-mask cache, together.

    It is the :class:`~daskvec._core.engine.RebuildReporter` of :meth:`Engine.finish
    <daskvec._core.engine.Engine.finish>` too: a rebuilt env's reset reply brings its mask.
    """

    def __init__(self, buffers: StepBuffers, masks: ActionMaskCache) -> None:
        self.buffers, self.masks = buffers, masks

    def take_step(self, group: Group, reply: StepReply) -> None:
        self.buffers.take_step(group, reply)
        self.masks.take(group.env_indices, reply.masks)

    def take_reset(self, group: Group, reply: ResetReply) -> None:
        self.buffers.take_reset(group, reply)
        self.masks.take(group.env_indices, reply.masks)

    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        self.buffers.report_rebuilds(rebuilds, during)
        for r in rebuilds:
            self.masks.take(r.group.env_indices, r.reply.masks)


class DaskVecEnv(RolloutMethods, EngineViews, VecEnv):
    """A Stable-Baselines3 vec env whose envs live as Dask actors on a cluster.

    A drop-in replacement for ``SubprocVecEnv`` (the same step, reset, seeding and
    auto-reset semantics, and ``get_attr``/``set_attr``/``env_method``), with the envs
    spread over the workers of a ``dask.distributed`` cluster in groups: one actor holds
    a slice of envs, and a step costs one round trip per actor. How it fits SB3 and its
    ecosystem: docs/sb3.md; every option, its Dask config key and default:
    docs/configuration.md; lost workers, env errors and moves: docs/fault-tolerance.md.

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument callables that each create one env, pickled (by value, from
        ``__main__`` or notebooks too) and called on the workers, never here.
    client : distributed.Client, str, Cluster or None, optional
        Where the envs run: a ``Client``, a scheduler address, a cluster object, or
        ``None``: the default client, else an embedded ``LocalCluster`` that
        :meth:`close` shuts down. A client or cluster given here is never closed.
    envs_per_actor, transport, env_process, busy_poll : optional
        How envs are grouped into actors, how steps reach them (``"auto"``, ``"direct"``,
        ``"actor"``, ``"direct-insecure"``), whether each group's envs run in a process
        of their own, and how long a group polls for the next step. These options and
        all below (except ``workers``, ``resources``, ``cluster_kwargs``) default to
        ``None``: Dask's config ``daskvec.<name>`` (docs/configuration.md).
    timeout, connect_timeout, step_timeout, worker_wait_timeout : float, optional
        Seconds that any single wait, a scheduler address's answer, a step (then its
        envs count as hung and are rebuilt elsewhere) and an eligible worker may take.
    on_worker_lost, on_env_error, max_restarts : optional
        A lost or hung worker: ``"restart"`` its envs elsewhere or ``"raise"``. An env
        that raises: ``"raise"`` its error here or ``"restart"`` the env, at most
        ``max_restarts`` times per env. Either way a rebuilt env reports a truncation.
    migrate_before, auto_rebalance, rebalance_interval : optional
        Move envs off a worker this many seconds before its walltime ends; with
        ``auto_rebalance``, onto workers that joined, checked every ``rebalance_interval`` s.
    cache_action_masks : bool, optional
        Answer ``env_method("action_masks")`` from the masks sent with every reply.
    workers : list of str, optional
        Addresses or names of the workers that may hold envs.
    resources : dict, optional
        Worker resources (e.g. ``{"envs": 1}``) a worker must have to hold envs.
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.
    start_method : str, optional
        Accepted for code written for ``SubprocVecEnv``, and ignored (logged).

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

    @short_errors
    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env[Any, Any]]],
        client: Any = None,
        *,
        envs_per_actor: int | None = None,
        workers: Sequence[str] | None = None,
        resources: dict[str, float] | None = None,
        transport: str | None = None,
        env_process: bool | None = None,
        busy_poll: float | None = None,
        timeout: float | None = None,
        connect_timeout: float | None = None,
        step_timeout: float | None = None,
        on_worker_lost: str | None = None,
        on_env_error: str | None = None,
        max_restarts: int | None = None,
        worker_wait_timeout: float | None = None,
        migrate_before: float | None = None,
        auto_rebalance: bool | None = None,
        rebalance_interval: float | None = None,
        cache_action_masks: bool | None = None,
        cluster_kwargs: dict[str, Any] | None = None,
        start_method: str | None = None,
    ) -> None:
        self._state = State.CLOSED  # until construction succeeds; makes close()/__del__ safe
        # every keyword named like an option (None: from Dask's config, see daskvec.config)
        options = Options.create(**{k: v for k, v in locals().items() if k in Options.names()})
        ignore_subproc_keywords(start_method=start_method)
        self._attach(Engine(env_fns, client, options, cluster_kwargs))

    @classmethod
    @short_errors
    def from_vector_envs(
        cls,
        vector_env_fns: Sequence[Callable[[], Any]],
        client: Any = None,
        *,
        cluster_kwargs: dict[str, Any] | None = None,
        **options: Any,
    ) -> DaskVecEnv:
        """A DaskVecEnv whose groups are vectorized envs: one per factory, stepped with one call.

        Each factory returns a vectorized env (a Gymnasium ``VectorEnv`` such as
        ``SyncVectorEnv``, or an EnvPool made with ``envpool.make_gymnasium``), built on a
        worker, where it becomes one env group: a step sends it its rows of the actions
        and it steps all its envs in one call. Its envs are this vec env's envs, factory
        0's first. SB3's semantics are kept: finished envs are reset in the same step,
        with ``terminal_observation`` and ``TimeLimit.truncated`` in their infos.

        The vector env must be able to reset finished envs in the same step: a Gymnasium
        vector env made with ``autoreset_mode=AutoresetMode.SAME_STEP`` or ``DISABLED``
        (the group resets the finished envs with a mask), or an EnvPool (the group
        resets their ids; EnvPool takes its seed when it is made and ignores
        ``seed()``, with a warning). ``get_attr``/``env_method``/``set_attr``/
        ``env_is_wrapped``/``get_images`` reach each env when the vector env holds them
        (``SyncVectorEnv.envs``); otherwise attribute reads give the vector env's own
        attribute (or its ``get_attr`` value) and the rest raise a clear error.

        A lost worker's vector env is rebuilt elsewhere, whole; with
        ``on_env_error="restart"`` a vector env that raises is rebuilt, and all its envs
        report a truncation. Rebalancing moves whole vector envs.

        Parameters
        ----------
        vector_env_fns : list of callable
            Zero-argument callables that each create one vectorized env (called on the workers).
        client : distributed.Client, str, Cluster or None, optional
            Where the envs run, as for the constructor.
        cluster_kwargs : dict, optional
            Extra arguments for the embedded ``LocalCluster``.
        **options
            The constructor's options (``envs_per_actor`` is ignored: each vector env is a group).

        Returns
        -------
        DaskVecEnv

        Raises
        ------
        TypeError
            A factory returned something that is not a vectorized env, or an unknown option.
        ValueError
            A vector env that cannot reset finished envs in the same step (the message
            says how to make one), EnvPool in asynchronous mode, envs whose spaces differ.

        Examples
        --------
        >>> import gymnasium as gym
        >>> from gymnasium.vector import AutoresetMode
        >>> def make():
        ...     return gym.make_vec("CartPole-v1", num_envs=8, vectorization_mode="sync",
        ...                         vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP})
        >>> env = DaskVecEnv.from_vector_envs([make, make])  # doctest: +SKIP
        >>> env.num_envs  # doctest: +SKIP
        16
        """
        self = cls.__new__(cls)
        self._state = State.CLOSED  # until construction succeeds
        checked = Options.create(**options)
        self._attach(Engine(vector_env_fns, client, checked, cluster_kwargs, vector=True))
        return self

    def _attach(self, engine: Engine) -> None:
        """Take ``engine`` (built) as this face's: buffers, state, SB3's base class."""
        self._engine = engine
        self.env_fns, self.client, self.options = engine.env_fns, engine.client, engine.options
        self._buffers = StepBuffers(engine.observation_space, engine.n_envs)
        self._masks = ActionMaskCache(engine.n_envs)
        self._writer = _BuffersAndMasks(self._buffers, self._masks)
        self._state, self._interrupted = State.IDLE, False  # _interrupted: a step_wait() cut short by Ctrl-C
        self._collecting: PendingRollout | None = None  # the collection start_rollout() sent, in COLLECTING
        super().__init__(engine.n_envs, engine.observation_space, engine.action_space)  # asks the envs for render_mode
        self.reset_infos = self._buffers.reset_infos
        logger.info("DaskVecEnv: %s", engine.summary())

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> State:
        """Where the vec env is in its life (see :class:`State`)."""
        if self._state is not State.CLOSED and self._engine.broken is not None:
            return State.BROKEN
        return self._state

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or construction failed)."""
        return getattr(self, "_state", State.CLOSED) is State.CLOSED

    @property
    def waiting(self) -> bool:
        """Whether a step was sent with :meth:`step_async` and not collected yet."""
        return self._state is State.STEPPING

    def _enter_idle(self) -> None:
        """Raise unless the vec env is idle (the check of the rollout methods, :mod:`daskvec.sb3.replay`)."""
        self._enter(State.IDLE)

    def _start_collecting(self, pending: PendingRollout) -> None:
        self._collecting = pending
        self._state = State.COLLECTING

    def _stop_collecting(self, pending: PendingRollout) -> None:
        self._enter(State.COLLECTING)
        if pending is not self._collecting:
            raise ValueError("finish_rollout() was given a collection this vec env did not start, or finished already")
        self._collecting, self._state = None, State.IDLE

    def _enter(self, *allowed: State) -> None:
        """Check that the vec env may be called now; raise the typed error that says why not."""
        state = self.state
        if state in allowed:
            return
        if state is State.CLOSED:
            raise ClosedEnvError("this DaskVecEnv is closed; create a new one")
        if state is State.BROKEN:
            self._engine.check()
        if state is State.STEPPING:
            was = "the last step was interrupted (reset() drops it)" if self._interrupted else "a step is pending"
            raise AlreadySteppingError(f"{was}: call step_wait() before any other call")
        if state is State.COLLECTING:
            raise AlreadySteppingError(
                "a worker-side collection is in flight (a learner's collect_ahead): let the learner finish it "
                "(model.learn() again) or close() this vec env"
            )
        raise NoAsyncCallError("step_wait() called without a pending step_async()")

    @property
    def _groups(self) -> list[Group]:
        return [] if self.closed else self._engine.groups

    # ------------------------------------------------------------------ reset / step
    def reset(self) -> VecEnvObs:
        """Reset all environments, applying pending seeds and options once (see base class); a step
        whose ``step_wait()`` was interrupted (Ctrl-C, say in a notebook's ``learn()``) is collected and dropped."""
        if self._state is State.STEPPING and self._interrupted:
            self.step_wait()
        self._enter(State.IDLE)
        engine = self._engine
        if engine.recovery.moves_planned:
            engine.report(self._writer, "reset", engine.recovery.migrate)
        self._buffers.forget_deferred()
        engine.reset_groups(
            list(self._seeds), list(self._options), self._writer.take_reset, engine.lost_handler(self._writer, "reset")
        )
        self._reset_seeds()
        self._reset_options()
        self._buffers.has_obs = True
        return self._buffers.observations()

    def step_async(self, actions: np.ndarray) -> None:
        """Send the actions to every group without waiting (see base class)."""
        self._enter(State.IDLE)
        n = len(actions) if hasattr(actions, "__len__") else -1
        if n != self.num_envs:
            raise ValueError(
                f"got {n if n >= 0 else 'a non-sequence of'} actions for {self.num_envs} envs; "
                "pass one action per env (an array whose first axis has length num_envs)"
            )
        self._masks.forget()  # until the replies bring the new ones
        self._state = State.STEPPING
        self._engine.send_step(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """Wait once for all groups' results and return them (see base class)."""
        self._enter(State.STEPPING)
        engine, writer = self._engine, self._writer
        outcome = StepOutcome()
        try:
            with contextlib.closing(engine.collect_step(outcome)) as replies:
                for group, reply in replies:  # each as soon as it is read
                    writer.take_step(group, reply)
        finally:
            self._interrupted = engine.stepping  # an interrupted wait stays pending
            if not self._interrupted:
                self._state = State.IDLE
        self._buffers.apply_deferred()
        engine.finish(outcome, writer)
        return self._buffers.result()

    # ------------------------------------------------------------------ per-env calls
    def _per_env(
        self, cmd: Command, make_args: Callable[[list[int]], tuple[Any, ...]], indices: VecEnvIndices
    ) -> list[Any]:
        """Run an attribute-style command on the selected envs; results in the requested order."""
        self._enter(State.IDLE)
        engine = self._engine
        wanted = engine.positions(indices)
        return engine.per_env(cmd, lambda _g, p: make_args(p), wanted, engine.lost_handler(self._writer, "deferred"))

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute from vectorized environment (see base class)."""
        return self._per_env(Command.GET_ATTR, lambda p: (attr_name, p), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute inside vectorized environments (see base class)."""
        try:
            self._per_env(Command.SET_ATTR, lambda p: (attr_name, value, p), indices)
        finally:
            self._forget_masks(indices)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call instance methods of vectorized environments (see base class).

        ``env_method("action_masks")`` may be answered from the masks of the last replies
        (see ``cache_action_masks``); any other call forgets the masks of the envs it touches.
        """
        if method_name == MASK_METHOD and not method_args and not method_kwargs:
            self._enter(State.IDLE)
            cached = self._masks.lookup(self._engine.positions(indices))
            if cached is not None:
                return cached
        try:
            return self._per_env(Command.ENV_METHOD, lambda p: (method_name, method_args, method_kwargs, p), indices)
        finally:
            self._forget_masks(indices)

    def _forget_masks(self, indices: VecEnvIndices) -> None:
        with contextlib.suppress(TypeError, IndexError):  # bad indices: the call itself said so
            self._masks.forget(self._engine.positions(indices))

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Check if worker environments are wrapped with a given wrapper (see base class)."""
        return self._per_env(Command.IS_WRAPPED, lambda p: (wrapper_class, p), indices)

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has the attribute (see base class); its values stay on the workers."""
        return all(self._per_env(Command.HAS_ATTR, lambda p: (attr_name, p), None))

    def get_images(self) -> Sequence[np.ndarray | None]:
        """Return RGB images from each environment (see base class)."""
        self._enter(State.IDLE)
        if self.render_mode != "rgb_array":
            warnings.warn(
                f"The render mode is {self.render_mode}, but this method assumes it is `rgb_array` to obtain images.",
                stacklevel=2,
            )
            return [None for _ in range(self.num_envs)]
        return self._per_env(Command.RENDER, lambda p: (p,), None)

    # ------------------------------------------------------------------ workers and moves
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
        self._enter(State.IDLE)
        engine = self._engine
        moved = engine.recovery.plan_rebalance()
        if moved and not self._buffers.has_obs:
            engine.report(self._writer, "reset", engine.recovery.migrate)
        return moved

    @property
    def groups(self) -> list[dict[str, Any]]:
        """One entry per env-group actor: its env indices, worker, transport, the
        worker's ``deadline`` and ``env_pid``, ``socket``, ``busy_poll``, ``shared_memory``
        and its channel (``channel``: the address or socket path connected to;
        ``address``, ``socket_path``: where the group listens; ``encrypted``), as
        :meth:`daskvec._core.handles.Group.describe` tells them."""
        return [g.describe() for g in self._groups]

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Shut the env groups down and close what this vec env created (see base class).

        Safe to call twice and while a step is in flight (its replies are drained,
        with ``step_timeout`` (at most 30 s) as the bound). A worker-side collection in
        flight (``start_rollout``) is abandoned at once: its workers release its groups
        when it ends.
        """
        if self.closed:
            return
        collecting = self._state is State.COLLECTING
        self._state, self._collecting = State.CLOSED, None
        # a collection in flight may run for a whole rollout: its groups are abandoned, not waited for
        self._engine.close(abandon_in_flight=collecting)

    def __enter__(self) -> DaskVecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_html_(self) -> str:
        """Notebook view: the dashboard link, and the workers with the envs each holds."""
        n_envs = getattr(self, "num_envs", 0)
        if self.closed:
            return f"<div><strong>DaskVecEnv</strong>: {n_envs} envs, closed</div>"
        links = self.dashboard
        return notebook_html(self.groups, n_envs, links.status, links.daskvec, links.problem)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len({g.worker for g in self._groups})} workers"
        return f"<DaskVecEnv: {getattr(self, 'num_envs', 0)} envs, {len(self._groups)} groups, {state}>"
