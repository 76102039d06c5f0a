"""Collecting ahead: the workers collect the next rollout while the learner trains on this one.

Both kinds of learner (:mod:`~daskvec.learners.on_policy`, :mod:`~daskvec.learners.off_policy`)
take ``collect_ahead``: ``0`` (the default) collects each rollout after training on the
one before, as Stable-Baselines3 does; ``1`` ships the weights and starts the next
collection at the end of ``collect_rollouts``, so that the envs step during ``train()``,
and reads it at the next ``collect_rollouts``. The learner then trains the policy of
version k+1 on data of version k (a lag of one version, never more: one collection per
group is in flight at most); :class:`CollectAhead` keeps that collection, the state its
replay needs from its start, and the figures of who waited for whom.

A run that ends (``num_timesteps`` reaches ``learn()``'s total) or a callback that stops
it leaves nothing in flight: the next collection is sent only when ``learn()`` will ask
for it. If ``train()`` fails with one in flight, the vec env refuses every call but
``close()`` (which does not wait for it) until a next ``learn()`` reads it (with
``reset_num_timesteps=False``) or drops it before resetting the env (by default).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from stable_baselines3.common.base_class import BaseAlgorithm

from daskvec._core.rollouts import Rollout
from daskvec.protocol.rollout_records import ExplorationPlan
from daskvec.sb3.replay import PendingRollout
from daskvec.sb3.vec_env import DaskVecEnv

logger = logging.getLogger(__name__)

__all__ = ["Ahead", "CollectAhead", "check_collect_ahead"]


def check_collect_ahead(collect_ahead: Any) -> int:
    """``collect_ahead`` checked: how many collections may run ahead of the learner (0 or 1)."""
    if isinstance(collect_ahead, bool) or not isinstance(collect_ahead, (int, np.integer)):
        raise TypeError(f"collect_ahead must be 0 or 1 (an int), not {type(collect_ahead).__name__}")
    if collect_ahead not in (0, 1):
        raise ValueError(
            f"collect_ahead={collect_ahead}: 0 collects each rollout after training on the one before, "
            "1 collects the next rollout while the learner trains; more than one rollout ahead is not supported"
        )
    return int(collect_ahead)


@dataclass(eq=False)
class Ahead:
    """A collection sent to the workers, and what its replay needs, kept from its start."""

    venv: DaskVecEnv
    n_steps: int
    pending: PendingRollout
    #: the ``VecNormalize`` statistics the workers' policy used (an on- or off-policy snapshot)
    frozen: Any
    #: the policy's input at the collection's first step (on-policy)
    obs: Any = None
    #: the random actions and noise drawn for it (off-policy)
    explore: ExplorationPlan | None = None
    #: the learner's gradient steps (``_n_updates``) when the weights were shipped
    updates: int = 0


@dataclass(eq=False)
class Arrived:
    """A collection read: the rollout, what was kept from its start, and its policy lag in versions."""

    ahead: Ahead
    rollout: Rollout
    lag: int


class CollectAhead(BaseAlgorithm):
    """The part of a learner that collects ahead (a mixin of the learners' ``collect_rollouts``)."""

    collect_ahead: int = 0
    #: the collection in flight while the learner trains
    _daskvec_ahead: Ahead | None = None
    #: when the last ``collect_rollouts`` returned, and when the last collection's fragments were all in
    _daskvec_returned: float | None = None
    _daskvec_envs_done: float | None = None
    #: the least and greatest policy lag of the run
    _daskvec_lags: tuple[int, int] | None = None

    def __init__(self, *args: Any, collect_ahead: int = 0, **kwargs: Any) -> None:
        self.collect_ahead = check_collect_ahead(collect_ahead)
        super().__init__(*args, **kwargs)

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_daskvec_ahead", "_daskvec_returned", "_daskvec_envs_done"]

    def _setup_learn(
        self,
        total_timesteps: int,
        callback: Any = None,
        reset_num_timesteps: bool = True,
        tb_log_name: str = "run",
        progress_bar: bool = False,
    ) -> tuple[int, Any]:
        """As SB3's; a collection left in flight (``train()`` failed) is dropped first if the env is to be reset."""
        if self._daskvec_ahead is not None and (reset_num_timesteps or self._last_obs is None):
            self._drop_ahead("learn() resets the env")
        return super()._setup_learn(total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar)

    def _arrive(self, venv: DaskVecEnv, n_steps: int, send: Callable[[], Ahead]) -> Arrived:
        """The collection to replay now: the one sent ahead, or one sent (with ``send``) and read now."""
        ahead = self._daskvec_ahead
        if ahead is not None and (ahead.venv is not venv or ahead.n_steps != n_steps):
            self._drop_ahead("the env or its size changed")
        ahead, self._daskvec_ahead = self._daskvec_ahead, None
        asked = time.perf_counter()
        if ahead is None:
            ahead = send()
        waiting = time.perf_counter()
        rollout = venv.finish_rollout(ahead.pending)
        now = time.perf_counter()
        idle = 0.0 if self._daskvec_envs_done is None else ahead.pending.collection.sent - self._daskvec_envs_done
        self.logger.record("daskvec/learner_wait_s", now - waiting)
        if self._daskvec_returned is not None:
            self.logger.record("daskvec/learner_busy_s", waiting - self._daskvec_returned)
        self.logger.record("daskvec/envs_busy_s", rollout.env_seconds + rollout.policy_seconds)
        self.logger.record("daskvec/envs_idle_s", max(idle, 0.0))
        self._draw(venv, ahead, rollout, asked, now)
        # the learner trained since the weights were shipped: one policy version behind
        return Arrived(ahead, rollout, int(self._n_updates > ahead.updates))

    def _draw(self, venv: DaskVecEnv, ahead: Ahead, rollout: Rollout, asked: float, now: float) -> None:
        """Add this rollout's intervals to the vec env's timeline, which the dashboard draws.

        The envs collect from the send for the busiest group's time in its envs and policy:
        a collection sent ahead is read only after training, however early it was done, and
        the picture must show the envs standing still then. The learner replayed the last
        rollout until ``collect_rollouts`` returned, trained until it asked for this one
        (at ``asked``), and waited from then on: for a collection not sent ahead, its
        sending too.
        """
        timeline = venv.timer.timeline
        sent = ahead.pending.collection.sent
        timeline.add("collecting", sent, min(now, sent + rollout.env_seconds + rollout.policy_seconds))
        done, returned = self._daskvec_envs_done, self._daskvec_returned
        if returned is not None:
            if done is not None and done <= returned:
                timeline.add("replaying", done, returned)
            timeline.add("training", returned, asked)
        timeline.add("waiting", asked, now)
        self._daskvec_envs_done = now

    def _send_ahead(self, lag: int, send: Callable[[], Ahead]) -> None:
        """Record the lag of the collection just replayed; send the next one if ``learn()`` will read it."""
        low, high = self._daskvec_lags or (lag, lag)
        self._daskvec_lags = (min(low, lag), max(high, lag))
        self.logger.record_mean("daskvec/policy_lag_mean", lag)
        self.logger.record("daskvec/policy_lag_min", self._daskvec_lags[0])
        self.logger.record("daskvec/policy_lag_max", self._daskvec_lags[1])
        if self.collect_ahead and self.num_timesteps < self._total_timesteps:
            self._daskvec_ahead = send()

    def _drop_ahead(self, why: str) -> None:
        """Read and drop a collection that will not be replayed, saying ``why`` in a warning."""
        ahead, self._daskvec_ahead = self._daskvec_ahead, None
        if ahead is None or ahead.venv.closed:
            return
        logger.warning("%s: dropping the collection made ahead: %s", type(self).__name__, why)
        ahead.venv.finish_rollout(ahead.pending)

    def _returned(self) -> None:
        """Note when ``collect_rollouts`` returned: the learner is busy from here until the next one."""
        self._daskvec_returned = time.perf_counter()
