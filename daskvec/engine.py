"""The engine: what every face of daskvec shares (issue 16).

A *face* is the API a learner sees: :class:`~daskvec.vec_env.DaskVecEnv` (Stable-Baselines3's
``VecEnv``) or :class:`~daskvec.vector_env.DaskVectorEnv` (Gymnasium's ``VectorEnv``).
Both own one :class:`Engine`, which owns the rest:

- the validated :class:`~daskvec.options.Options` and the resolved client (and the
  embedded cluster it may have started);
- the :class:`~daskvec.directory.WorkerDirectory`, the :class:`~daskvec.pool.GroupPool`,
  the :class:`~daskvec.recovery.Recovery` and its :class:`~daskvec.recovery.RestartLedger`;
- the calls that do not depend on a face's layout: resetting the groups while workers
  may be lost, per-env attribute calls, the dashboard figures, closing.

A face keeps its own buffers and info format, its state machine, and decides how a
rebuilt env is reported (it passes a ``rebuilt`` callback wherever groups may be lost).
"""

from __future__ import annotations

import contextlib
import logging
import time
import warnings
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from daskvec import _dask
from daskvec import cluster as _cluster
from daskvec.dashboard_link import DashboardLinks, check_dashboard
from daskvec.directory import WorkerDirectory
from daskvec.errors import DaskVecEnvError, SchedulerLostError, WorkerLostError
from daskvec.metrics import CLIENT_TOPIC, ClientTimer, client_message
from daskvec.options import Options, check_env_fns
from daskvec.pool import Group, GroupPool, StepOutcome
from daskvec.protocol import Command, ResetReply, StepReply, unwrap
from daskvec.recovery import Rebuild, Recovery, RestartLedger

logger = logging.getLogger(__name__)

__all__ = ["Engine", "EngineViews", "LostHandler", "Sink"]

#: Seconds between two reports of the vec env's figures to the dashboard.
_STATS_INTERVAL = 2.0

#: What a face does with groups that did not answer: ``(lost groups, seconds waited)``.
#: It has them rebuilt (``Engine.recovery.handle_lost``) and reports the rebuilds its way.
LostHandler = Callable[[dict[Group, BaseException], float], None]


class Sink(Protocol):
    """Where a face takes a step's replies and hears of rebuilt envs (its buffers, in its own format)."""

    def take_step(self, group: Group, reply: StepReply) -> None:
        """Write ``group``'s step reply into the face's rows of its envs."""

    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        """Report rebuilt envs: ``"step"`` (truncations in this step), ``"deferred"`` (in the next) or ``"reset"``."""


class Engine:
    """The env groups of one vec env, with their workers, recovery and options.

    Parameters
    ----------
    env_fns : list of callable
        Zero-argument env factories (checked by :func:`~daskvec.options.check_env_fns`).
    client : distributed.Client, str, Cluster or None
        Where the envs run (see :class:`~daskvec.vec_env.DaskVecEnv`).
    options : Options
        The validated options; the transport is chosen for the cluster (:func:`daskvec.cluster.choose_transport`).
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.
    autoreset : str
        When the groups reset finished envs (:class:`daskvec.protocol.Autoreset`):
        ``"SameStep"`` for Stable-Baselines3, the chosen mode for Gymnasium.
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
        vector: bool = False,
    ) -> None:
        self.env_fns = check_env_fns(env_fns, "vector_env_fns" if vector else "env_fns")
        self.vector = vector
        self.n_envs = len(self.env_fns)  # a vector engine counts its envs once they are built
        self.closed = False
        self.broken: BaseException | None = None
        self.resolved = _cluster.resolve_client(
            client, connect_timeout=min(options.timeout, 30.0), cluster_kwargs=cluster_kwargs
        )
        self.client = self.resolved.client
        _dask.scheduler_address(self.client)  # remembered now, for errors after the scheduler is gone
        self.pool: GroupPool | None = None
        try:
            transport, encrypted = _cluster.choose_transport(self.client, options.transport)
            self.options = replace(options, transport=transport, encrypted=encrypted)
            self.directory = WorkerDirectory(self.client, self.options)
            self.pool = GroupPool(self.client, self.env_fns, self.options, self.directory, autoreset, vector)
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
            self.observation_space, self.action_space = self._check_spaces()
        except BaseException:
            if self.pool is not None:
                self.pool.teardown(list(self.pool.groups), graceful=False)
            self.resolved.close()
            self.closed = True
            raise
        self.timer = ClientTimer()
        self._last_stats = time.monotonic()
        self._seeds_warned = False

    def _check_spaces(self) -> tuple[gym.Space[Any], gym.Space[Any]]:
        """The envs' spaces, after checking that every env has those of env 0."""
        assert self.pool is not None
        first = self.pool.groups[0].desc
        obs0, act0 = first.observation_space, first.action_space
        for g in self.pool.groups:
            for pos, (o, a) in enumerate(zip(g.desc.observation_spaces, g.desc.action_spaces, strict=True)):
                if o != obs0 or a != act0:
                    raise ValueError(
                        f"env {g.env_indices[pos]} has observation space {o} and action space {a}, but env 0 has "
                        f"{obs0} and {act0}; all envs of a vec env must share their spaces"
                    )
        return obs0, act0

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
        failed rebuild leaves groups half placed) a :class:`~daskvec.errors.DaskVecEnvError`.
        Once broken, no call hands out observations again (:meth:`check`).
        """
        try:
            yield
        except BaseException as e:
            err = self._failure(e)
            self.broken = err
            if err is e:
                raise
            raise err from e

    def _failure(self, e: BaseException) -> BaseException:
        if isinstance(e, (WorkerLostError, SchedulerLostError)):
            return e
        if getattr(self.client, "status", "running") not in ("running", "newly-created"):
            return _dask.scheduler_lost(self.client, e)
        if isinstance(e, KeyboardInterrupt):
            return e
        return DaskVecEnvError(
            f"daskvec could not recover its env groups ({type(e).__name__}: {e}); this vec env is broken: "
            "close() it and create a new one"
        )

    def taker(self, sink: Sink) -> Callable[[Group, StepReply], None]:
        """``take(group, reply)`` for :meth:`GroupPool.collect`: into ``sink``, env-error restarts counted."""

        def take(group: Group, reply: StepReply) -> None:
            sink.take_step(group, reply)
            if reply.restarted:
                self.ledger.env_errors(group, reply.restarted, self.recovery.steps)

        return take

    def send_step(self, actions: Any) -> None:
        """Send every group its rows of ``actions``; do not wait (:meth:`collect_step` reads the replies)."""
        assert self.pool is not None
        self.timer.sent()
        self.pool.send_step(actions)

    def collect_step(self, sink: Sink) -> StepOutcome:
        """Read the replies of the step :meth:`send_step` sent into ``sink`` (``step_timeout`` bounds the wait).

        Interrupted (Ctrl-C), the step stays pending: call again. The outcome is then
        for :meth:`finish`, after the face has written what its sink deferred.
        """
        assert self.pool is not None
        outcome = self.pool.collect(self.options.step_timeout, self.taker(sink))
        self.timer.received(outcome.env_seconds)
        return outcome

    @property
    def stepping(self) -> bool:
        """Whether a step (or a rollout) was sent to every group and not collected yet."""
        return self.pool is not None and self.pool.stepping

    def collect_ready(self, min_envs: int, sink: Sink) -> tuple[list[Group], StepOutcome]:
        """The partial batch of the groups that answer first (:meth:`GroupPool.collect_ready`), taken into ``sink``."""
        assert self.pool is not None
        groups, outcome = self.pool.collect_ready(min_envs, self.options.step_timeout, self.taker(sink))
        self.timer.received(outcome.env_seconds)
        return groups, outcome

    def finish(
        self, outcome: StepOutcome, sink: Sink, *, migrate: Collection[Group] | None = None, steps: int = 1
    ) -> None:
        """Finish a collected outcome: the one place where every face and rollouts do it.

        In this order: count ``steps`` vec-steps; rebuild the lost groups and report them to
        ``sink`` (as truncations of this step, or of the next if an env raised, so that
        no group is left with a reply in flight); raise the first env's error; carry
        out the moves that are due (of the groups in ``migrate`` only, if given) and
        report them; send the dashboard its figures when due. A recovery that fails
        breaks the engine (:meth:`fail_stop`).
        """
        self.recovery.steps += steps
        if outcome.lost:
            during = "deferred" if outcome.errors else "step"
            self.report(sink, during, self.recovery.handle_lost, outcome.lost, self.options.step_timeout)
        if outcome.errors:
            outcome.errors[0][1].raise_()
        if self.recovery.migration_due and (migrate is None or migrate):
            self.report(sink, "step", self.recovery.migrate, migrate)
        self.maybe_publish()

    def report(self, sink: Sink, during: str, rebuild: Callable[..., list[Rebuild]], *args: Any) -> None:
        """Run a recovery action (fail-stop) and report what it rebuilt to ``sink``."""
        with self.fail_stop():
            rebuilds = rebuild(*args)
        if rebuilds:
            sink.report_rebuilds(rebuilds, during)

    def lost_handler(self, sink: Sink, during: str) -> LostHandler:
        """The :data:`LostHandler` of calls outside a step: rebuilds reported to ``sink`` as ``during`` says."""

        def on_lost(lost: dict[Group, BaseException], waited: float) -> None:
            self.report(sink, during, self.recovery.handle_lost, lost, waited)

        return on_lost

    # ------------------------------------------------------------------ calls
    def call(self, requests: dict[Group, Any]) -> dict[Group, Any]:
        """One request per group, waited for once with ``timeout`` (values or exceptions)."""
        assert self.pool is not None
        return self.pool.call(requests, self.options.timeout)

    def reset_groups(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any]],
        take: Callable[[Group, ResetReply], None],
        on_lost: LostHandler,
        mask: Sequence[bool] | None = None,
    ) -> None:
        """Reset the envs with the user's seeds and options, rebuilding lost groups and trying again.

        ``take(group, reply)`` receives each group's reply. With ``mask`` only the
        selected envs are reset (groups with none selected are not asked). A group lost
        on the way is handed to ``on_lost``; every group is then reset again, so that
        the rebuilt ones start from the user's seeds too.
        """
        self.ledger.set_seeds([s if mask is None or mask[i] else None for i, s in enumerate(seeds)])
        self._warn_fixed_seeds(seeds)
        for attempt in range(4):
            requests = {}
            for g in self.groups:
                sub = None if mask is None else [bool(mask[i]) for i in g.env_indices]
                if sub is not None and not any(sub):
                    continue
                args: tuple[Any, ...] = ([seeds[i] for i in g.env_indices], [options[i] for i in g.env_indices])
                requests[g] = (Command.RESET, args if sub is None else (*args, True, sub))
            replies = self.call(requests)
            lost = {g: r for g, r in replies.items() if isinstance(r, BaseException)}
            for g, reply in replies.items():
                if g not in lost:
                    take(g, unwrap(reply))
                    self.ledger.env_errors(g, reply.restarted, self.recovery.steps)
            if not lost:
                return
            if attempt == 3:
                indices = sorted(i for g in lost for i in g.env_indices)
                raise WorkerLostError(
                    f"reset() kept losing the workers of envs {indices}; check the cluster's health",
                    env_indices=indices,
                    worker=next(iter(lost)).worker,
                )
            # rebuilt groups come back reset with restart seeds; the next pass resets
            # them again with the user's seeds and options
            on_lost(lost, self.options.timeout)

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
        """Run an attribute-style command on the envs ``wanted``; results in that order.

        ``make_args(group, positions)`` gives the command's arguments for the envs at
        ``positions`` within ``group``.
        """
        assert self.pool is not None
        for _attempt in range(3):
            where = self.pool.by_env()
            per_group: dict[Group, list[int]] = {}
            for i in wanted:
                g, pos = where[i]
                per_group.setdefault(g, []).append(pos)
            replies = self.call({g: (cmd, make_args(g, p)) for g, p in per_group.items()})
            lost = {g: r for g, r in replies.items() if isinstance(r, BaseException)}
            if not lost:
                break
            on_lost(lost, self.options.timeout)
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

    # ------------------------------------------------------------------ telemetry and close
    def maybe_publish(self) -> None:
        """Send the vec env's figures to the dashboard, at most every ``_STATS_INTERVAL`` seconds."""
        now = time.monotonic()
        if now - self._last_stats >= _STATS_INTERVAL:
            self._last_stats = now
            msg = client_message(self.timer, self.n_envs, int(self.ledger.restart_counts.sum()))
            _dask.log_event_nowait(self.client, CLIENT_TOPIC, msg)

    def close(self) -> None:
        """Tell the dashboard, shut the groups down, close what was created here; idempotent."""
        if self.closed:
            return
        self.closed = True
        gone = isinstance(self.broken, SchedulerLostError)  # then ask the cluster nothing: return at once
        if not gone:
            msg = client_message(self.timer, self.n_envs, int(self.ledger.restart_counts.sum()), closed=True)
            _dask.log_event(self.client, CLIENT_TOPIC, msg, timeout=5)  # bounded: the scheduler may be gone
        if self.pool is not None:
            self.pool.close(abandon=gone)
        self.resolved.close(timeout=2 if gone else 10)

    def summary(self) -> str:
        """Envs, groups and workers, for log lines."""
        assert self.pool is not None
        return (
            f"{self.n_envs} envs in {len(self.pool.groups)} groups over {len(self.pool.load())} workers "
            f"({self.pool.summary()} transport)"
        )


class EngineViews:
    """What every face shows of its engine: restarts, transport, dashboard links (a mixin)."""

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
        """One entry per rebuilt env: index, reason, worker, step."""
        return self._engine.ledger.log

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
