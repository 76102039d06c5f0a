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

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np

from daskvec import _dask
from daskvec import cluster as _cluster
from daskvec.directory import WorkerDirectory
from daskvec.errors import WorkerLostError
from daskvec.metrics import CLIENT_TOPIC, ClientTimer, client_message
from daskvec.options import Options, check_env_fns
from daskvec.pool import Group, GroupPool
from daskvec.protocol import Command, ResetReply, unwrap
from daskvec.recovery import Recovery, RestartLedger

logger = logging.getLogger(__name__)

__all__ = ["Engine", "LostHandler"]

#: Seconds between two reports of the vec env's figures to the dashboard.
_STATS_INTERVAL = 2.0

#: What a face does with groups that did not answer: ``(lost groups, seconds waited)``.
#: It has them rebuilt (``Engine.recovery.handle_lost``) and reports the rebuilds its way.
LostHandler = Callable[[dict[Group, BaseException], float], None]


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
    ) -> None:
        self.env_fns = check_env_fns(env_fns)
        self.n_envs = len(self.env_fns)
        self.closed = False
        self.resolved = _cluster.resolve_client(
            client, connect_timeout=min(options.timeout, 30.0), cluster_kwargs=cluster_kwargs
        )
        self.client = self.resolved.client
        self.pool: GroupPool | None = None
        try:
            transport, encrypted = _cluster.choose_transport(self.client, options.transport)
            self.options = replace(options, transport=transport, encrypted=encrypted)
            self.directory = WorkerDirectory(self.client, self.options)
            self.pool = GroupPool(self.client, self.env_fns, self.options, self.directory, autoreset)
            self.ledger = RestartLedger(self.n_envs)
            self.recovery = Recovery(self.pool, self.directory, self.ledger, self.options)
            _cluster.keep_env_workers(self.client)
            workers_now = self.directory.wait_for_workers()
            layout = _cluster.plan_groups(self.n_envs, len(workers_now), self.options.envs_per_actor)
            self.pool.spawn(self.directory.assign(layout, workers_now, {}), self.ledger)
            self.observation_space, self.action_space = self._check_spaces()
        except BaseException:
            if self.pool is not None:
                self.pool.teardown(list(self.pool.groups), graceful=False)
            self.resolved.close()
            self.closed = True
            raise
        self.timer = ClientTimer()
        self._last_stats = time.monotonic()

    def _check_spaces(self) -> tuple[gym.Space[Any], gym.Space[Any]]:
        """The envs' spaces, after checking that every env has those of env 0."""
        assert self.pool is not None
        first = self.pool.groups[0].desc
        obs0, act0 = first["observation_space"], first["action_space"]
        for g in self.pool.groups:
            for pos, (o, a) in enumerate(zip(g.desc["observation_spaces"], g.desc["action_spaces"], strict=True)):
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
        msg = client_message(self.timer, self.n_envs, int(self.ledger.restart_counts.sum()), closed=True)
        _dask.log_event(self.client, CLIENT_TOPIC, msg, timeout=5)  # bounded: the scheduler may be gone
        if self.pool is not None:
            self.pool.close()
        self.resolved.close()

    def summary(self) -> str:
        """Envs, groups and workers, for log lines."""
        assert self.pool is not None
        return (
            f"{self.n_envs} envs in {len(self.pool.groups)} groups over {len(self.pool.load())} workers "
            f"({self.pool.summary()} transport)"
        )
