"""Client side: :class:`DaskVecEnv`, a Stable-Baselines3 ``VecEnv`` on Dask actors.

This module is the SB3 face and the state machine; the work is done by the parts
(see docs/architecture.md):

- :mod:`daskvec.options` -- the options, checked once;
- :mod:`daskvec.directory` -- which workers may take envs, and where envs go;
- :mod:`daskvec.pool` -- the env-group actors: create, call, step, collect, tear down;
- :mod:`daskvec.buffers` -- replies into SB3's observations, rewards, dones and infos;
- :mod:`daskvec.recovery` -- lost, hung and moved groups, and the restart ledger.

A step goes one way: :meth:`DaskVecEnv.step_async` sends each group its actions
through the pool; :meth:`DaskVecEnv.step_wait` collects the replies into the buffers
as they arrive, has recovery rebuild what was lost (the buffers report it as
truncations), and only then raises an env's error, if one raised.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnv, VecEnvIndices, VecEnvObs, VecEnvStepReturn

from daskvec import _dask
from daskvec import cluster as _cluster
from daskvec.buffers import StepBuffers
from daskvec.directory import WorkerDirectory
from daskvec.display import notebook_html
from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
    NoAsyncCallError,
    WorkerLostError,
)
from daskvec.metrics import CLIENT_TOPIC, ClientTimer, client_message
from daskvec.options import Options, check_env_fns
from daskvec.pool import Group, GroupPool, StepOutcome
from daskvec.protocol import Command, unwrap
from daskvec.recovery import Rebuild, Recovery, RestartLedger

if TYPE_CHECKING:
    from daskvec.rollout import PolicyShipment, Rollout

logger = logging.getLogger(__name__)

__all__ = ["DaskVecEnv", "State"]

#: Seconds between two reports of the vec env's figures to the dashboard.
_STATS_INTERVAL = 2.0


class State(enum.Enum):
    """Where a :class:`DaskVecEnv` is in its life; checked at every entry."""

    IDLE = "idle"  # ready for any call
    STEPPING = "stepping"  # step_async() sent a step that step_wait() has not collected
    BROKEN = "broken"  # envs were lost for good (on_worker_lost="raise"): only close() is left
    CLOSED = "closed"


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
        self._state = State.CLOSED  # until construction succeeds; makes close()/__del__ safe
        self.env_fns = check_env_fns(env_fns)
        options = Options.create(
            envs_per_actor=envs_per_actor, workers=workers, resources=resources, transport=transport,
            env_process=env_process, busy_poll=busy_poll, timeout=timeout, step_timeout=step_timeout,
            on_worker_lost=on_worker_lost, on_env_error=on_env_error, max_restarts=max_restarts,
            worker_wait_timeout=worker_wait_timeout, migrate_before=migrate_before,
            auto_rebalance=auto_rebalance, rebalance_interval=rebalance_interval,
        )  # fmt: skip
        n_envs = len(self.env_fns)
        self._resolved = _cluster.resolve_client(
            client, connect_timeout=min(options.timeout, 30.0), cluster_kwargs=cluster_kwargs
        )
        self.client = self._resolved.client
        self._pool: GroupPool | None = None
        try:
            self.options = replace(options, transport=self._choose_transport(options.transport))
            self._directory = WorkerDirectory(self.client, self.options)
            self._pool = GroupPool(self.client, self.env_fns, self.options, self._directory)
            self._ledger = RestartLedger(n_envs)
            self._recovery = Recovery(self._pool, self._directory, self._ledger, self.options)
            _cluster.keep_env_workers(self.client)
            workers_now = self._directory.wait_for_workers()
            layout = _cluster.plan_groups(n_envs, len(workers_now), self.options.envs_per_actor)
            self._pool.spawn(self._directory.assign(layout, workers_now, {}), self._ledger)
            observation_space, action_space = self._check_spaces()
        except BaseException:
            if self._pool is not None:
                self._pool.teardown(list(self._pool.groups), graceful=False)
            self._resolved.close()
            raise
        self._buffers = StepBuffers(observation_space, n_envs)
        self.timer = ClientTimer()
        self._last_stats = time.monotonic()
        self._state = State.IDLE
        super().__init__(n_envs, observation_space, action_space)  # asks the envs for render_mode
        self.reset_infos = self._buffers.reset_infos
        logger.info(
            "DaskVecEnv: %d envs in %d groups over %d workers (%s transport)",
            n_envs, len(self._pool.groups), len(self._pool.load()), self._pool.summary(),
        )  # fmt: skip

    def _choose_transport(self, transport: str) -> str:
        if not _cluster.uses_tls(self.client):
            return transport
        if transport == "direct":
            raise ValueError(
                "transport='direct' is not available on a TLS-secured cluster (the direct "
                "channel is not encrypted); use transport='auto' or 'actor'"
            )
        return "actor"

    def _check_spaces(self) -> tuple[gym.Space[Any], gym.Space[Any]]:
        """The envs' spaces, after checking that every env has those of env 0."""
        assert self._pool is not None
        first = self._pool.groups[0].desc
        obs0, act0 = first["observation_space"], first["action_space"]
        for g in self._pool.groups:
            for pos, (o, a) in enumerate(zip(g.desc["observation_spaces"], g.desc["action_spaces"], strict=True)):
                if o != obs0 or a != act0:
                    raise ValueError(
                        f"env {g.env_indices[pos]} has observation space {o} and action space {a}, but env 0 has "
                        f"{obs0} and {act0}; all envs of a vec env must share their spaces"
                    )
        return obs0, act0

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> State:
        """Where the vec env is in its life (see :class:`State`)."""
        return self._state

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (or construction failed)."""
        return getattr(self, "_state", State.CLOSED) is State.CLOSED

    @property
    def waiting(self) -> bool:
        """Whether a step was sent with :meth:`step_async` and not collected yet."""
        return self._state is State.STEPPING

    def _enter(self, *allowed: State) -> None:
        """Check that the vec env may be called now; raise the typed error that says why not."""
        if self._state in allowed:
            return
        if self._state is State.CLOSED:
            raise ClosedEnvError("this DaskVecEnv is closed; create a new one")
        if self._state is State.BROKEN:
            raise DaskVecEnvError(
                f"this DaskVecEnv lost envs earlier ({type(self._broken).__name__}: {self._broken}); "
                "close it and create a new one, or use on_worker_lost='restart'"
            )
        if self._state is State.STEPPING:
            raise AlreadySteppingError("a step is pending: call step_wait() before any other call")
        raise NoAsyncCallError("step_wait() called without a pending step_async()")

    def _break(self, err: BaseException) -> None:
        self._broken = err
        self._state = State.BROKEN

    @property
    def _groups(self) -> list[Group]:
        return [] if self._pool is None else self._pool.groups

    # ------------------------------------------------------------------ reset / step
    def reset(self) -> VecEnvObs:
        """Reset all environments, applying pending seeds and options once (see base class)."""
        self._enter(State.IDLE)
        if self._recovery.moves_planned:
            self._rebuilt("reset", self._recovery.migrate)
        self._buffers.forget_deferred()
        seeds, options = list(self._seeds), list(self._options)
        self._ledger.set_seeds(seeds)
        for attempt in range(4):
            requests = {
                g: (Command.RESET, ([seeds[i] for i in g.env_indices], [options[i] for i in g.env_indices]))
                for g in self._groups
            }
            replies = self._pool_call(requests)
            lost = {g: r for g, r in replies.items() if isinstance(r, BaseException)}
            for g, reply in replies.items():
                if g not in lost:
                    self._buffers.take_reset(g, unwrap(reply))
                    self._ledger.env_errors(g, reply.restarted, self._recovery.steps)
            if not lost:
                break
            if attempt == 3:
                indices = sorted(i for g in lost for i in g.env_indices)
                raise WorkerLostError(
                    f"reset() kept losing the workers of envs {indices}; check the cluster's health",
                    env_indices=indices,
                    worker=next(iter(lost)).worker,
                )
            # rebuilt groups come back reset with restart seeds; the next pass resets
            # every group again with the user's seeds and options
            self._rebuilt("reset", self._recovery.handle_lost, lost, self.options.timeout)
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
        self.timer.sent()
        self._state = State.STEPPING
        self._pool_or_raise().send_step(actions)

    def step_wait(self) -> VecEnvStepReturn:
        """Wait once for all groups' results and return them (see base class)."""
        self._enter(State.STEPPING)
        pool, buffers = self._pool_or_raise(), self._buffers
        try:
            outcome = pool.collect_step(self.options.step_timeout, self._take_step)
        finally:
            if not pool.stepping:  # collected (or given up); an interrupted wait stays pending
                self._state = State.IDLE
        buffers.apply_deferred()
        self.timer.received(outcome.env_seconds)
        self._recovery.steps += 1
        # lost groups first, so that none is left behind with a reply in flight; if an
        # env raised, the step is not handed out, and the rebuilt envs report in the next
        during = "deferred" if outcome.errors else "step"
        if outcome.lost:
            self._rebuilt(during, self._recovery.handle_lost, outcome.lost, self.options.step_timeout)
        self._raise_env_error(outcome)
        self._rebuilt("step", self._recovery.migrate)
        self._maybe_publish()
        return buffers.result()

    def collect_rollout(
        self, shipment: PolicyShipment, n_steps: int, obs_norm: dict[str, Any] | None = None
    ) -> Rollout:
        """Run every env for ``n_steps`` on its worker with the shipped policy (issue 13).

        Each group runs its envs with a CPU copy of the policy and returns its fragment
        in one reply; a group whose worker is lost is rebuilt elsewhere and its envs
        report a truncation at the first step, the rest of the rollout recollected from
        the rebuilt envs. The rollout is then replayed step by step with
        :meth:`Rollout.feed <daskvec.rollout.Rollout.feed>`, which updates this vec env
        as ``step_wait`` would. :class:`daskvec.sb3.DaskPPO` does all of this; see
        docs/rollouts.md.

        Parameters
        ----------
        shipment : PolicyShipment
            The policy, updated with the learner's current weights.
        n_steps : int
            Vec-steps to collect.
        obs_norm : dict, optional
            Frozen ``VecNormalize`` observation statistics (``mean``, ``var``,
            ``epsilon``, ``clip``) that the policy's inputs are normalised with.

        Returns
        -------
        Rollout
            Waiting at most ``step_timeout * n_steps`` for the fragments.
        """
        from daskvec.rollout import collect_rollout

        self._enter(State.IDLE)
        if not self._buffers.has_obs:
            raise DaskVecEnvError("reset() the vec env before collecting a rollout")
        if int(n_steps) < 1:
            raise ValueError(f"n_steps must be a positive number of vec-steps, not {n_steps!r}")
        pool = self._pool_or_raise()
        try:
            rollout = collect_rollout(self, shipment, int(n_steps), obs_norm, self.options.step_timeout * n_steps)
        except BaseException as e:
            if pool.stepping:  # interrupted while fragments were on their way: they cannot be matched up
                self._break(e)
            raise
        self._maybe_publish()
        return rollout

    def _take_step(self, group: Group, reply: Any) -> None:
        self._buffers.take_step(group, reply)
        if reply.restarted:
            self._ledger.env_errors(group, reply.restarted, self._recovery.steps)

    @staticmethod
    def _raise_env_error(outcome: StepOutcome) -> None:
        if outcome.errors:
            outcome.errors[0][1].raise_()

    def _rebuilt(self, during: str, rebuild: Callable[..., list[Rebuild]], *args: Any) -> None:
        """Run a recovery action and report what it rebuilt; a recovery that fails breaks the vec env."""
        try:
            rebuilds = rebuild(*args)
        except WorkerLostError as e:  # includes StepTimeoutError
            self._break(e)
            raise
        self._buffers.report_rebuilds(rebuilds, during)

    def _pool_or_raise(self) -> GroupPool:
        if self._pool is None:
            raise ClosedEnvError("this DaskVecEnv is closed; create a new one")
        return self._pool

    def _pool_call(self, requests: dict[Group, Any]) -> dict[Group, Any]:
        return self._pool_or_raise().call(requests, self.options.timeout)

    # ------------------------------------------------------------------ per-env calls
    def _per_env(
        self, cmd: Command, make_args: Callable[[list[int]], tuple[Any, ...]], indices: VecEnvIndices
    ) -> list[Any]:
        """Run an attribute-style command on the selected envs; results in the requested order."""
        self._enter(State.IDLE)
        wanted = self._positions(indices)
        for _attempt in range(3):
            where = self._pool_or_raise().by_env()
            per_group: dict[Group, list[int]] = {}
            for i in wanted:
                g, pos = where[i]
                per_group.setdefault(g, []).append(pos)
            replies = self._pool_call({g: (cmd, make_args(p)) for g, p in per_group.items()})
            lost = {g: r for g, r in replies.items() if isinstance(r, BaseException)}
            if not lost:
                break
            self._rebuilt("deferred", self._recovery.handle_lost, lost, self.options.timeout)
        else:
            raise WorkerLostError(f"{cmd} failed repeatedly because workers were lost", env_indices=wanted, worker="")
        values = {g: list(unwrap(r) or []) for g, r in replies.items()}
        cursor = dict.fromkeys(values, 0)
        out = []
        for i in wanted:
            g, _ = where[i]
            out.append(values[g][cursor[g]] if values[g] else None)
            cursor[g] += 1
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

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute from vectorized environment (see base class)."""
        return self._per_env(Command.GET_ATTR, lambda p: (attr_name, p), indices)

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute inside vectorized environments (see base class)."""
        self._per_env(Command.SET_ATTR, lambda p: (attr_name, value, p), indices)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **method_kwargs: Any
    ) -> list[Any]:
        """Call instance methods of vectorized environments (see base class)."""
        return self._per_env(Command.ENV_METHOD, lambda p: (method_name, method_args, method_kwargs, p), indices)

    def env_is_wrapped(
        self, wrapper_class: type[gym.Wrapper[Any, Any, Any, Any]], indices: VecEnvIndices = None
    ) -> list[bool]:
        """Check if worker environments are wrapped with a given wrapper (see base class)."""
        return self._per_env(Command.IS_WRAPPED, lambda p: (wrapper_class, p), indices)

    def has_attr(self, attr_name: str) -> bool:
        """Whether every env has the attribute (see base class)."""
        try:
            self.get_attr(attr_name)
        except AttributeError:
            return False
        return True

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
        moved = self._recovery.plan_rebalance()
        if moved and not self._buffers.has_obs:
            self._rebuilt("reset", self._recovery.migrate)
        return moved

    @property
    def restart_counts(self) -> np.ndarray:
        """How many times each env was rebuilt (lost worker, hang, move or env error)."""
        return self._ledger.restart_counts

    @property
    def error_restarts(self) -> np.ndarray:
        """How many of each env's rebuilds were caused by its own exceptions."""
        return self._ledger.error_restarts

    @property
    def restart_log(self) -> list[dict[str, Any]]:
        """One entry per rebuilt env: index, reason, worker, step."""
        return self._ledger.log

    @property
    def transport(self) -> str:
        """The transport asked for (``"actor"`` on a TLS cluster); see :meth:`transport_summary`."""
        return self.options.transport

    def transport_summary(self) -> str:
        """How many groups use each transport and socket, e.g. ``"direct/unix x2"``."""
        return "" if self._pool is None else self._pool.summary()

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
                "env_pid": g.env_pid,
                "pid": g.desc.get("pid"),
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

    # ------------------------------------------------------------------ telemetry
    def _maybe_publish(self) -> None:
        now = time.monotonic()
        if now - self._last_stats >= _STATS_INTERVAL:
            self._last_stats = now
            msg = client_message(self.timer, self.num_envs, int(self._ledger.restart_counts.sum()))
            _dask.log_event_nowait(self.client, CLIENT_TOPIC, msg)

    # ------------------------------------------------------------------ close
    def close(self) -> None:
        """Shut the env groups down and close what this vec env created (see base class).

        Safe to call twice and while a step is in flight (its replies are drained,
        with ``step_timeout`` (at most 30 s) as the bound).
        """
        if self.closed:
            return
        self._state = State.CLOSED
        # tell the dashboard (bounded wait; the scheduler may be gone)
        msg = client_message(self.timer, self.num_envs, int(self._ledger.restart_counts.sum()), closed=True)
        _dask.log_event(self.client, CLIENT_TOPIC, msg, timeout=5)
        if self._pool is not None:
            self._pool.close()
        self._resolved.close()

    def __del__(self) -> None:
        if not self.closed:
            warnings.warn("DaskVecEnv was not closed; call env.close()", ResourceWarning, stacklevel=1)
            for g in self._groups:
                with contextlib.suppress(Exception):
                    g.channel.close()

    def __enter__(self) -> DaskVecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _repr_html_(self) -> str:
        """Notebook view: the dashboard link, and the workers with the envs each holds."""
        n_envs = getattr(self, "num_envs", 0)
        if self.closed:
            return f"<div><strong>DaskVecEnv</strong>: {n_envs} envs, closed</div>"
        return notebook_html(self.groups, n_envs, self.dashboard_link)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self._pool.load()) if self._pool else 0} workers"
        return f"<DaskVecEnv: {getattr(self, 'num_envs', 0)} envs, {len(self._groups)} groups, {state}>"
