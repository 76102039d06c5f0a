"""The engine: what every face of daskvec shares.

A *face* is the API a learner sees: :class:`~daskvec.sb3.vec_env.DaskVecEnv` (Stable-Baselines3's
``VecEnv``) or :class:`~daskvec.gymnasium.vector_env.DaskVectorEnv` (Gymnasium's ``VectorEnv``).
Both own one :class:`Engine`, which owns the rest:

- the validated :class:`~daskvec._core.options.Options` and the resolved client (and the
  embedded cluster it may have started);
- the :class:`~daskvec._core.directory.WorkerDirectory`, the :class:`~daskvec._core.pool.GroupPool`,
  the :class:`~daskvec._core.recovery.Recovery` and its :class:`~daskvec._core.recovery.RestartLedger`;
- the calls that do not depend on a face's layout: resetting the groups and per-env
  attribute calls, each a send and a collect (which a face may split, as Gymnasium's
  ``reset_async``/``reset_wait`` do) sent again while workers are lost, the dashboard
  figures, closing.

A face keeps its own buffers and info format and its state machine: it writes each step
reply the engine hands out (:meth:`Engine.collect_step` is an iterator) into its buffers,
and is told of rebuilt envs through a :class:`RebuildReporter` (its buffers).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Collection, Generator, Iterator, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from daskvec._core import dask_internals as _dask
from daskvec._core.directory import WorkerDirectory
from daskvec._core.handles import Group, StepOutcome
from daskvec._core.options import Options, check_env_fns
from daskvec._core.pool import GroupPool
from daskvec._core.recovery import Rebuild, Recovery, RestartLedger
from daskvec.cluster import clients as _cluster
from daskvec.errors import DaskVecEnvError, SchedulerLostError, WorkerLostError
from daskvec.monitoring.links import DashboardLinks, check_dashboard
from daskvec.monitoring.metrics import CLIENT_TOPIC, ClientTimer, client_message
from daskvec.protocol.messages import Command, Request, ResetReply, StepReply

logger = logging.getLogger(__name__)

__all__ = ["Engine", "EngineViews", "LostHandler", "RebuildReporter", "SpaceCheck", "same_spaces"]

#: Seconds between two reports of the vec env's figures to the dashboard.
_STATS_INTERVAL = 2.0

#: What a face does with groups that did not answer: ``(lost groups, seconds waited)``.
#: It has them rebuilt (``Engine.recovery.handle_lost``) and reports the rebuilds its way.
LostHandler = Callable[[dict[Group, BaseException], float], None]

#: How a face checks its envs' spaces: ``(observation spaces, action spaces)``, one each
#: per env in env order, to the spaces the face is to show as one env's (or an error).
SpaceCheck = Callable[[list[gym.Space[Any]], list[gym.Space[Any]]], tuple[gym.Space[Any], gym.Space[Any]]]

#: One request per group, as sent to it.
Requests = dict[Group, Request]


def same_spaces(observation_spaces: list[gym.Space[Any]], action_spaces: list[gym.Space[Any]]) -> tuple[Any, Any]:
    """The default :data:`SpaceCheck`: every env must have env 0's spaces (else ``ValueError``)."""
    obs0, act0 = observation_spaces[0], action_spaces[0]
    for i, (o, a) in enumerate(zip(observation_spaces, action_spaces, strict=True)):
        if o != obs0 or a != act0:
            raise ValueError(
                f"env {i} has observation space {o} and action space {a}, but env 0 has "
                f"{obs0} and {act0}; all envs of a vec env must share their spaces"
            )
    return obs0, act0


@dataclass
class _Batch:
    """A reset or per-env call sent to the groups and not collected yet.

    Attributes
    ----------
    command : Command
        What was asked.
    kind : type
        The type of the answers expected (``object``: any value).
    build : callable
        The requests, for the groups of the moment: called again when the call is sent
        anew after groups were lost.
    wanted : list of int
        The envs whose results a per-env call returns, in order.
    """

    command: Command
    kind: type
    build: Callable[[], Requests]
    wanted: list[int]


class RebuildReporter(Protocol):
    """Where a face hears of rebuilt envs (its buffers, which report them in its own format)."""

    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        """Report rebuilt envs: ``"step"`` (truncations in this step), ``"deferred"`` (in the next) or ``"reset"``."""


class Engine:
    """The env groups of one vec env, with their workers, recovery and options.

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument env factories (checked by :func:`~daskvec._core.options.check_env_fns`).
    client : distributed.Client, str, Cluster or None
        Where the envs run (see :class:`~daskvec.sb3.vec_env.DaskVecEnv`).
    options : Options
        The validated options; the transport is chosen for the cluster
        (:func:`daskvec.cluster.clients.choose_transport`).
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.
    autoreset : str
        When the groups reset finished envs (:class:`daskvec.protocol.messages.Autoreset`):
        ``"SameStep"`` for Stable-Baselines3, the chosen mode for Gymnasium.
    always_pass_options : bool
        Whether the groups call every env's ``reset`` with ``options=`` (Gymnasium) or
        only when some are given (Stable-Baselines3); see :class:`daskvec.protocol.messages.GroupSpec`.
    check_spaces : SpaceCheck, optional
        How the envs' spaces are checked (default :func:`same_spaces`).
    vector : bool
        ``env_fns`` make vectorized envs (a Gymnasium ``VectorEnv``, an EnvPool): one
        group each, stepped with one call (:mod:`daskvec.worker.vector`). The number of
        envs is known once they are built; ``envs_per_actor`` does not apply.

    Attributes
    ----------
    observation_space, action_space : gymnasium.spaces.Space
        One env's spaces (every env was checked to share them).
    timer : ClientTimer
        The client's time split, reported to the dashboard.

    Raises
    ------
    TypeError, ValueError
        Bad factories or options, envs whose spaces differ, an unreachable scheduler.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        client: Any,
        options: Options,
        cluster_kwargs: Any = None,
        autoreset: str = "SameStep",
        always_pass_options: bool = False,
        check_spaces: SpaceCheck = same_spaces,
        vector: bool = False,
    ) -> None:
        self.env_fns = check_env_fns(env_fns, "vector_env_fns" if vector else "env_fns")
        self.vector = vector
        self.n_envs = len(self.env_fns)  # a vector engine counts its envs once they are built
        self.closed = False
        self.broken: BaseException | None = None
        self._batch: _Batch | None = None
        # a factory that cannot travel is known now, before a cluster starts or is asked anything
        _cluster.dumps_factories(self.env_fns, range(self.n_envs))
        self.resolved = _cluster.resolve_client(
            client, connect_timeout=min(options.connect_timeout, options.timeout), cluster_kwargs=cluster_kwargs
        )
        self.client = self.resolved.client
        _dask.scheduler_address(self.client)  # remembered now, for errors after the scheduler is gone
        self.pool: GroupPool | None = None
        _dask.quiet_released_actor_calls(True)  # until close: the groups' calls can outlive their actors
        try:
            transport, encrypted = _cluster.choose_transport(self.client, options.transport, options.timeout)
            self.options = replace(options, transport=transport, encrypted=encrypted)
            self.directory = WorkerDirectory(self.client, self.options, fixed=self.resolved.own_cluster)
            self.pool = GroupPool(
                self.client, self.env_fns, self.options, self.directory, autoreset, always_pass_options, vector
            )
            _cluster.keep_env_workers(self.client, self.options.timeout)
            workers_now = self.directory.wait_for_workers()
            if vector:
                self.pool.spawn_vectors(workers_now, RestartLedger(0))
                self.n_envs = sum(len(g.env_indices) for g in self.pool.groups)
                self.ledger = RestartLedger(self.n_envs)
            else:
                self.ledger = RestartLedger(self.n_envs)
                layout = _cluster.plan_groups(self.n_envs, len(workers_now), self.options.envs_per_actor)
                self.pool.spawn(self.directory.assign(layout, workers_now, {}), self.ledger)
            self.recovery = Recovery(self.pool, self.directory, self.ledger, self.options)
            self.observation_space, self.action_space = self._check_spaces(check_spaces)
        except BaseException:
            if self.pool is not None:
                self.pool.teardown(list(self.pool.groups), graceful=False)
            self.resolved.close()
            self.closed = True
            _dask.quiet_released_actor_calls(False)
            raise
        self.timer = ClientTimer()
        self._last_stats = time.monotonic()
        self._seeds_warned = False

    def _check_spaces(self, check: SpaceCheck) -> tuple[gym.Space[Any], gym.Space[Any]]:
        """The envs' spaces, as ``check`` accepts them."""
        assert self.pool is not None
        obs: list[Any] = [None] * self.n_envs
        act: list[Any] = [None] * self.n_envs
        for g in self.pool.groups:
            for pos, i in enumerate(g.env_indices):
                obs[i], act[i] = g.desc.observation_spaces[pos], g.desc.action_spaces[pos]
        return check(obs, act)

    # ------------------------------------------------------------------ views
    @property
    def groups(self) -> list[Group]:
        """The current env groups (empty once closed)."""
        return [] if self.pool is None else self.pool.groups

    def positions(self, indices: Any) -> list[int]:
        """Env indices (``None``: all; an int; a sequence of ints, negatives counted from the end) as a list."""
        if indices is None:
            return list(range(self.n_envs))
        raw = [indices] if isinstance(indices, (int, np.integer)) else list(indices)
        out = []
        for i in raw:
            if not isinstance(i, (int, np.integer)):
                raise TypeError(f"env indices must be ints, got {type(i).__name__}")
            j = int(i)
            if not -self.n_envs <= j < self.n_envs:
                raise IndexError(f"env index {j} is out of range for {self.n_envs} envs")
            out.append(j % self.n_envs)
        return out

    # ------------------------------------------------------------------ the step lifecycle
    def check(self) -> None:
        """Raise if the engine is broken: a lost scheduler again as itself, anything else as ``DaskVecEnvError``."""
        err = self.broken
        if err is None:
            return
        if isinstance(err, SchedulerLostError):
            raise SchedulerLostError(str(err), err.address) from err
        hint = " or use on_worker_lost='restart'" if isinstance(err, WorkerLostError) else ""
        raise DaskVecEnvError(
            f"this vec env lost envs earlier ({type(err).__name__}: {err}); close it and create a new one{hint}"
        ) from err

    @contextlib.contextmanager
    def fail_stop(self) -> Iterator[None]:
        """Break the engine on any exception in the block (recovery, scheduler calls), then raise.

        A lost or unreachable scheduler becomes :class:`~daskvec.errors.SchedulerLostError`;
        a failure that is neither a lost worker nor a lost scheduler (an interrupted or
        failed rebuild leaves groups half placed) a :class:`~daskvec.errors.DaskVecEnvError`;
        the caller's own stop (``KeyboardInterrupt``, ``SystemExit``) is raised as itself
        (the engine is broken all the same, by a lost scheduler if the client says so).
        Once broken, no call hands out observations again (:meth:`check`).
        """
        try:
            yield
        except BaseException as e:
            err = self._failure(e)
            self.broken = err
            if err is e or not isinstance(e, Exception):  # the caller's own stop, as itself
                raise
            raise err from e

    def _failure(self, e: BaseException) -> BaseException:
        if isinstance(e, (WorkerLostError, SchedulerLostError)):
            return e
        if getattr(self.client, "status", "running") not in ("running", "newly-created"):
            return _dask.scheduler_lost(self.client, e)
        if not isinstance(e, Exception):  # Ctrl-C, a signal handler's sys.exit()
            return e
        return DaskVecEnvError(
            f"daskvec could not recover its env groups ({type(e).__name__}: {e}); this vec env is broken: "
            "close() it and create a new one"
        )

    def send_step(self, actions: Any) -> None:
        """Send every group its rows of ``actions``; do not wait (:meth:`collect_step` reads the replies)."""
        assert self.pool is not None
        self.drop_interrupted_call()
        self.timer.sent()
        self.pool.send_step(actions)

    def ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every reply of what was sent to all groups (a step,
        a reset, a call) to be in; read nothing. ``False`` if some are still missing."""
        assert self.pool is not None
        return self.pool.all_ready(timeout)

    def collect_step(self, outcome: StepOutcome) -> Generator[tuple[Group, StepReply], None, None]:
        """The replies of the step :meth:`send_step` sent, ``(group, reply)`` each as soon as it is read.

        ``step_timeout`` bounds the wait; what every group answered goes into ``outcome``
        for :meth:`finish` (see :meth:`GroupPool.collect`, and close the iterator, as
        ``contextlib.closing`` does, when the loop over it may raise). Interrupted
        (Ctrl-C), the step stays pending: collect again.
        """
        assert self.pool is not None
        yield from self.pool.collect(self.options.step_timeout, outcome)
        self.timer.received(outcome.env_seconds)

    @property
    def stepping(self) -> bool:
        """Whether a step (or a rollout) was sent to every group and not collected yet."""
        return self.pool is not None and self.pool.stepping

    def collect_ready(self, min_envs: int, outcome: StepOutcome) -> Generator[tuple[Group, StepReply], None, None]:
        """The step replies of the partial batch of groups that answer first (:meth:`GroupPool.collect_ready`)."""
        assert self.pool is not None
        yield from self.pool.collect_ready(min_envs, self.options.step_timeout, outcome)
        self.timer.received(outcome.env_seconds)

    def finish(
        self,
        outcome: StepOutcome,
        reporter: RebuildReporter,
        *,
        migrate: Collection[Group] | None = None,
        steps: int = 1,
        waited: float | None = None,
    ) -> None:
        """Finish a collected outcome: the one place where every face and rollouts do it.

        In this order: record the envs rebuilt after their own errors in the restart ledger;
        count ``steps`` vec-steps; rebuild the lost groups and report them to ``reporter``
        (as truncations of this step, or of the next if an env raised, so that no group is
        left with a reply in flight); raise the first env's error; carry
        out the moves that are due (of the groups in ``migrate`` only, if given) and
        report them; send the dashboard its figures when due. A recovery that fails
        breaks the engine (:meth:`fail_stop`). ``waited``: how long the replies were
        waited for, for the messages (default ``step_timeout``, a step's bound).
        """
        for group, restarted in outcome.env_restarts:
            self.ledger.env_errors(group, restarted, self.recovery.steps)
        self.recovery.steps += steps
        if outcome.lost:
            during = "deferred" if outcome.errors else "step"
            waited = self.options.step_timeout if waited is None else waited
            self.report(reporter, during, self.recovery.handle_lost, outcome.lost, waited)
        if outcome.errors:
            raise outcome.errors[0][1].exception()
        if self.recovery.migration_due and (migrate is None or migrate):
            self.report(reporter, "step", self.recovery.migrate, migrate)
        self.maybe_publish()

    def report(self, reporter: RebuildReporter, during: str, rebuild: Callable[..., list[Rebuild]], *args: Any) -> None:
        """Run a recovery action (fail-stop) and report what it rebuilt to ``reporter``."""
        with self.fail_stop():
            rebuilds = rebuild(*args)
        if rebuilds:
            reporter.report_rebuilds(rebuilds, during)

    def lost_handler(self, reporter: RebuildReporter, during: str) -> LostHandler:
        """The :data:`LostHandler` of calls outside a step: rebuilds reported to ``reporter`` as ``during`` says."""

        def on_lost(lost: dict[Group, BaseException], waited: float) -> None:
            self.report(reporter, during, self.recovery.handle_lost, lost, waited)

        return on_lost

    # ------------------------------------------------------------------ resets and calls
    def call(self, requests: dict[Group, Any]) -> dict[Group, Any]:
        """One request per group, waited for once with ``timeout`` (values or exceptions)."""
        assert self.pool is not None
        return self.pool.call(requests, self.options.timeout)

    def _start(self, batch: _Batch, answered: AbstractSet[int] = frozenset()) -> None:
        """Send a reset or per-env call to its groups; do not wait.

        Sent once more after losses, it goes only to groups holding envs not in ``answered``
        (the rebuilt ones): the others already did it, and a call with side effects
        (``env_method``) or a reset must not run twice on them.
        """
        assert self.pool is not None
        requests = batch.build()
        if answered:
            requests = {g: r for g, r in requests.items() if not set(g.env_indices) <= answered}
        self._batch = batch
        self.pool.send(requests.__getitem__, list(requests))

    def drop_interrupted_call(self) -> None:
        """Read and drop the replies of a reset or call that an interrupt (Ctrl-C) left in flight.

        A face whose wait was interrupted may resume it (``reset_wait()`` again); one that
        moves on to another request (a step, a reset, a call, a rollout) gives it up here,
        so that its channels stay in step.
        """
        assert self.pool is not None
        if self._batch is not None and self.pool.stepping:
            logger.info("dropping the replies of an interrupted %s call", self._batch.command)
            for _ in self.pool.collect(self.options.timeout, StepOutcome(), object):
                continue
        self._batch = None

    def _collect(
        self,
        take: Callable[[Group, Any], None],
        on_lost: LostHandler,
        attempts: int,
        gave_up: Callable[[dict[Group, BaseException]], BaseException],
    ) -> None:
        """Collect the pending reset or call; groups lost on the way are rebuilt and it is sent to them again.

        ``take(group, reply)`` receives each answer. After ``attempts`` tries that each lost
        groups, ``gave_up(lost)`` is raised (the groups rebuilt); an env's exception is
        raised once the lost groups (if any) were rebuilt. Interrupted (Ctrl-C), the call stays pending: call
        again to resume.
        """
        assert self.pool is not None and self._batch is not None
        batch = self._batch
        answered: set[int] = set()
        try:
            for attempt in range(attempts):
                if attempt:
                    self._start(batch, answered)
                outcome = StepOutcome()
                with contextlib.closing(self.pool.collect(self.options.timeout, outcome, batch.kind)) as replies:
                    for group, reply in replies:
                        take(group, reply)
                        answered.update(group.env_indices)
                if outcome.lost:
                    on_lost(outcome.lost, self.options.timeout)  # rebuilt, so that no group stays lost
                    if attempt == attempts - 1:
                        raise gave_up(outcome.lost)
                if outcome.errors or not outcome.lost:
                    break
        finally:
            if not self.pool.stepping:  # collected; an interrupted wait stays pending
                self._batch = None
        if outcome.errors:
            raise outcome.errors[0][1].exception()

    def send_reset(
        self, seeds: Sequence[int | None], options: Sequence[dict[str, Any] | None], mask: Sequence[bool] | None = None
    ) -> None:
        """Send the envs their reset with the user's seeds and options; do not wait (:meth:`collect_reset`).

        With ``mask`` only the selected envs are reset (groups with none selected are
        not asked).
        """
        self.drop_interrupted_call()
        chosen = [s if mask is None or mask[i] else None for i, s in enumerate(seeds)]
        self.ledger.set_seeds(chosen)
        self._warn_fixed_seeds(chosen)  # the seeds of the envs being reset only

        def build() -> Requests:
            requests: Requests = {}
            for g in self.groups:
                sub = None if mask is None else [bool(mask[i]) for i in g.env_indices]
                if sub is not None and not any(sub):
                    continue
                args: tuple[Any, ...] = ([seeds[i] for i in g.env_indices], [options[i] for i in g.env_indices])
                requests[g] = (Command.RESET, args if sub is None else (*args, True, sub))
            return requests

        self._start(_Batch(Command.RESET, ResetReply, build, []))

    def collect_reset(self, take: Callable[[Group, ResetReply], None], on_lost: LostHandler) -> None:
        """Collect the reset :meth:`send_reset` sent: ``take(group, reply)`` receives each group's reply.

        A group lost on the way is handed to ``on_lost``; the rebuilt groups are then
        reset again, so that they start from the user's seeds and options too (the
        others are not reset twice).
        """

        def take_reply(group: Group, reply: ResetReply) -> None:
            take(group, reply)
            self.ledger.env_errors(group, reply.restarted, self.recovery.steps)

        def gave_up(lost: dict[Group, BaseException]) -> BaseException:
            indices = sorted(i for g in lost for i in g.env_indices)
            return WorkerLostError(
                f"reset() kept losing the workers of envs {indices}; check the cluster's health",
                env_indices=indices,
                worker=next(iter(lost)).worker,
            )

        self._collect(take_reply, on_lost, 4, gave_up)

    def reset_groups(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        take: Callable[[Group, ResetReply], None],
        on_lost: LostHandler,
        mask: Sequence[bool] | None = None,
    ) -> None:
        """Reset the envs and wait: :meth:`send_reset` then :meth:`collect_reset`."""
        self.send_reset(seeds, options, mask)
        self.collect_reset(take, on_lost)

    def send_per_env(
        self, cmd: Command, make_args: Callable[[Group, list[int]], tuple[Any, ...]], wanted: list[int]
    ) -> None:
        """Send an attribute-style command to the envs ``wanted``; do not wait (:meth:`collect_per_env`).

        ``make_args(group, positions)`` gives the command's arguments for the envs at
        ``positions`` within ``group``.
        """
        assert self.pool is not None
        self.drop_interrupted_call()
        pool = self.pool

        def build() -> Requests:
            where = pool.by_env()
            per_group: dict[Group, list[int]] = {}
            for i in wanted:
                g, pos = where[i]
                per_group.setdefault(g, []).append(pos)
            return {g: (cmd, make_args(g, p)) for g, p in per_group.items()}

        self._start(_Batch(cmd, object, build, list(wanted)))

    def collect_per_env(self, on_lost: LostHandler) -> list[Any]:
        """The results of the command :meth:`send_per_env` sent, in the order of its ``wanted``."""
        assert self.pool is not None and self._batch is not None
        cmd, wanted = self._batch.command, self._batch.wanted
        values: dict[Group, list[Any]] = {}

        def take(group: Group, reply: Any) -> None:
            values[group] = list(reply or [])

        def gave_up(lost: dict[Group, BaseException]) -> BaseException:
            return WorkerLostError(f"{cmd} failed repeatedly because workers were lost", env_indices=wanted, worker="")

        self._collect(take, on_lost, 3, gave_up)
        where = self.pool.by_env()
        cursor = dict.fromkeys(values, 0)
        out = []
        for i in wanted:
            g, _ = where[i]
            out.append(values[g][cursor[g]] if values[g] else None)
            cursor[g] += 1
        return out

    def _warn_fixed_seeds(self, seeds: Sequence[int | None]) -> None:
        """Warn, once, that seeds were given to envs that take theirs only when made (EnvPool)."""
        if self._seeds_warned or all(s is None for s in seeds):
            return
        fixed = [g for g in self.groups if not g.desc.reseeds and any(seeds[i] is not None for i in g.env_indices)]
        if fixed:
            self._seeds_warned = True
            warnings.warn(
                f"the vector envs of envs {fixed[0].env_indices} ({fixed[0].desc.vector}) take their seed when they "
                "are made and ignore the seeds given to reset(); seed them in their factories "
                "(e.g. envpool.make_gymnasium(..., seed=s))",
                UserWarning,
                stacklevel=4,
            )

    def per_env(
        self,
        cmd: Command,
        make_args: Callable[[Group, list[int]], tuple[Any, ...]],
        wanted: list[int],
        on_lost: LostHandler,
    ) -> list[Any]:
        """Run an attribute-style command on the envs ``wanted`` and wait; results in that order."""
        self.send_per_env(cmd, make_args, wanted)
        return self.collect_per_env(on_lost)

    # ------------------------------------------------------------------ telemetry and close
    def maybe_publish(self) -> None:
        """Send the vec env's figures to the dashboard, at most every ``_STATS_INTERVAL`` seconds."""
        now = time.monotonic()
        if now - self._last_stats >= _STATS_INTERVAL:
            self._last_stats = now
            msg = client_message(self.timer, self.n_envs, int(self.ledger.restart_counts.sum()))
            _dask.log_event_nowait(self.client, CLIENT_TOPIC, msg)

    def close(self, abandon_in_flight: bool = False) -> None:
        """Tell the dashboard, shut the groups down, close what was created here; idempotent.

        ``abandon_in_flight``: groups running a request (a worker-side collection, which
        may last a whole rollout) are dropped without waiting for their replies; their
        workers release them once the request ends.
        """
        if self.closed:
            return
        self.closed = True
        gone = isinstance(self.broken, SchedulerLostError)  # then ask the cluster nothing: return at once
        if not gone:
            msg = client_message(self.timer, self.n_envs, int(self.ledger.restart_counts.sum()), closed=True)
            _dask.log_event(self.client, CLIENT_TOPIC, msg, timeout=5)  # bounded: the scheduler may be gone
        if self.pool is not None:
            self.pool.close(abandon=gone, abandon_in_flight=abandon_in_flight)
        self.resolved.close(timeout=2 if gone else 10)
        _dask.quiet_released_actor_calls(False)

    def summary(self) -> str:
        """Envs, groups and workers, for log lines."""
        assert self.pool is not None
        return (
            f"{self.n_envs} envs in {len(self.pool.groups)} groups over {len(self.pool.load())} workers "
            f"({self.pool.summary()} transport)"
        )


class EngineViews:
    """What every face shows of its engine: restarts, time split, transport, dashboard links (a mixin).

    A face dropped without ``close()`` warns (``ResourceWarning``) and closes its channels.
    """

    _engine: Engine

    @property
    def restart_counts(self) -> np.ndarray:
        """How many times each env was rebuilt (lost worker, hang, move or env error)."""
        return self._engine.ledger.restart_counts

    @property
    def error_restarts(self) -> np.ndarray:
        """How many of each env's rebuilds were caused by its own exceptions."""
        return self._engine.ledger.error_restarts

    @property
    def restart_log(self) -> list[dict[str, Any]]:
        """One entry per rebuilt env: its index (``env``), ``reason``, ``worker``, ``from_worker`` and ``step``."""
        return self._engine.ledger.log

    @property
    def timer(self) -> ClientTimer:
        """The client's time split, for the dashboard and SB3's logger."""
        return self._engine.timer

    @property
    def transport(self) -> str:
        """The transport in use: ``"auto"``, ``"direct"``, ``"actor"`` (also on a secured cluster
        without a client TLS context) or ``"direct-insecure"``; see :meth:`transport_summary`
        and :attr:`encrypted`."""
        return self._engine.options.transport

    @property
    def encrypted(self) -> bool:
        """Whether the direct channels are TLS (a secured cluster; see docs/security.md)."""
        return self._engine.options.encrypted

    def transport_summary(self) -> str:
        """How many groups use each transport and socket, e.g. ``"direct/unix x2"``."""
        return "" if self._engine.closed or self._engine.pool is None else self._engine.pool.summary()

    @property
    def dashboard(self) -> DashboardLinks:
        """The dashboard links of the cluster, checked now: only pages its scheduler serves, and why not."""
        return check_dashboard(self._engine.client)

    @property
    def dashboard_link(self) -> str | None:
        """Link to the Dask dashboard of the cluster holding the envs; ``None`` (and
        :attr:`dashboard` says why) when its scheduler serves no dashboard pages."""
        return self.dashboard.status

    def __del__(self) -> None:
        # a face dropped unclosed: say so, and close its channels (the workers release the groups)
        if not getattr(self, "closed", True):
            warnings.warn(f"{type(self).__name__} was not closed; call its close()", ResourceWarning, stacklevel=1)
            for g in self._engine.groups:
                with contextlib.suppress(Exception):
                    g.channel.close()
