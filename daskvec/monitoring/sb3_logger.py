"""daskvec's figures in Stable-Baselines3's logger.

:class:`DaskVecEnvMetrics` is an SB3 callback. It finds the :class:`~daskvec.DaskVecEnv`
under any ``VecEnvWrapper`` of the model's env and, at the end of every rollout (and
every ``log_freq`` steps if asked), records into the model's logger, so that the figures
land wherever SB3 writes: stdout, CSV, TensorBoard (``tensorboard_log=``), W&B...

Every key starts with ``daskvec/``:

=================================  ==========================================================
``env_steps_per_s``                env-steps per second since the previous record, learner's
                                   time included
``step_client_ms``                 mean time per vec-step on the client (the learner's work
                                   between ``step_wait`` and the next ``step_async``)
``step_transit_ms``                mean time per vec-step waiting for replies, less the envs'
``step_env_ms``                    mean time per vec-step inside the slowest group's envs
``share_client``, ``share_transit``,  the same three as fractions of their sum
``share_env``
``workers``                        workers holding envs now
``envs_per_worker_min``, ``_max``  the fewest and most envs a worker holds
``restarts``                       envs rebuilt so far, for any reason (counter)
``restarts/<reason>``              of which for each reason: ``env_error``, ``worker_lost``,
                                   ``timeout`` (a hung step), ``moved`` (walltime, rebalance)
``lost_workers``                   workers whose envs were lost or hung so far (counter)
=================================  ==========================================================

The times come from the vec env's :class:`~daskvec.monitoring.metrics.ClientTimer` (the same
split as the dashboard's); restarts from its restart log. Nothing is asked of the
cluster: recording costs no round trip.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import VecEnvWrapper

from daskvec.sb3.vec_env import DaskVecEnv

logger = logging.getLogger(__name__)

__all__ = ["PREFIX", "RESTART_REASONS", "DaskVecEnvMetrics", "RestartTally", "find_dask_vec_env"]

#: Every key the callback records starts with this.
PREFIX = "daskvec/"

#: The reasons a DaskVecEnv rebuilds an env (``restart_log`` entries' ``"reason"``).
RESTART_REASONS = ("env_error", "worker_lost", "timeout", "moved")

#: Keys also shown by SB3's stdout and log formats; the others go to CSV, TensorBoard, ...
_SHOWN = frozenset(
    {"env_steps_per_s", "step_client_ms", "step_transit_ms", "step_env_ms", "workers", "restarts", "lost_workers"}
)


def find_dask_vec_env(env: Any) -> DaskVecEnv:
    """The :class:`~daskvec.DaskVecEnv` under ``env``'s ``VecEnvWrapper`` layers.

    Raises
    ------
    TypeError
        ``env`` is not a DaskVecEnv, nor wraps one.
    """
    current, layers = env, []
    while isinstance(current, VecEnvWrapper):
        layers.append(type(current).__name__)
        current = current.venv
    if not isinstance(current, DaskVecEnv):
        under = f" (under {', '.join(layers)})" if layers else ""
        raise TypeError(
            f"DaskVecEnvMetrics records the figures of a DaskVecEnv, but the model's env is "
            f"{type(current).__name__}{under}; train on a DaskVecEnv or leave this callback out"
        )
    return current


class RestartTally:
    """Counts of a vec env's restart log, by reason, and the workers lost.

    The log only grows: :meth:`update` reads the entries added since its last call.
    """

    def __init__(self) -> None:
        self.read = 0
        self.by_reason: dict[str, int] = dict.fromkeys(RESTART_REASONS, 0)
        self.lost_workers: set[str] = set()

    def update(self, log: list[dict[str, Any]]) -> None:
        """Count the entries of ``log`` not seen yet."""
        for entry in log[self.read :]:
            reason = str(entry.get("reason"))
            self.by_reason[reason] = self.by_reason.get(reason, 0) + 1
            if reason in ("worker_lost", "timeout"):
                self.lost_workers.add(str(entry.get("from_worker", entry.get("worker"))))
        self.read = len(log)

    def figures(self) -> dict[str, float]:
        """``restarts``, ``restarts/<reason>`` for every reason, and ``lost_workers``."""
        out = {"restarts": float(sum(self.by_reason.values()))}
        out.update({f"restarts/{reason}": float(n) for reason, n in self.by_reason.items()})
        out["lost_workers"] = float(len(self.lost_workers))
        return out


@dataclass(frozen=True)
class _Mark:
    """The vec env's cumulative times at one moment."""

    wall: float
    vec_steps: int
    client_s: float
    transit_s: float
    env_s: float

    @classmethod
    def of(cls, env: DaskVecEnv) -> _Mark:
        t = env.timer
        return cls(time.perf_counter(), t.vec_steps, t.client_s, t.transit_s, t.env_s)


def timing_figures(before: _Mark, after: _Mark, num_envs: int) -> dict[str, float]:
    """Rate and time split between two marks (zeros when no step happened in between)."""
    steps = after.vec_steps - before.vec_steps
    wall = after.wall - before.wall
    parts = {
        "client": after.client_s - before.client_s,
        "transit": after.transit_s - before.transit_s,
        "env": after.env_s - before.env_s,
    }
    total = sum(parts.values())
    out = {"env_steps_per_s": steps * num_envs / wall if wall > 0 else 0.0}
    for name, seconds in parts.items():
        out[f"step_{name}_ms"] = seconds / steps * 1e3 if steps > 0 else 0.0
        out[f"share_{name}"] = seconds / total if total > 0 else 0.0
    return out


def layout_figures(groups: Iterable[dict[str, Any]]) -> dict[str, float]:
    """``workers``, ``envs_per_worker_min`` and ``envs_per_worker_max`` of a vec env's groups."""
    load: dict[str, int] = {}
    for g in groups:
        load[g["worker"]] = load.get(g["worker"], 0) + len(g["envs"])
    return {
        "workers": float(len(load)),
        "envs_per_worker_min": float(min(load.values(), default=0)),
        "envs_per_worker_max": float(max(load.values(), default=0)),
    }


class DaskVecEnvMetrics(BaseCallback):
    """Record a DaskVecEnv's throughput, time split, layout and restarts in SB3's logger.

    Parameters
    ----------
    log_freq : int, optional
        Also record every ``log_freq`` vec-steps (calls of the callback). By default
        the figures are recorded at the end of every rollout, which is when on-policy
        algorithms write their logs.
    verbose : int
        SB3's verbosity level.

    Attributes
    ----------
    vec_env : DaskVecEnv or None
        The vec env found under the model's env, once training started.
    last : dict of str to float
        The figures recorded last, keyed with the ``daskvec/`` prefix.

    Raises
    ------
    ValueError
        ``log_freq`` is not a positive int.
    TypeError
        At the start of training, when the model's env is not a DaskVecEnv, nor wraps one.

    Examples
    --------
    >>> from stable_baselines3 import PPO
    >>> from daskvec import DaskVecEnvMetrics
    >>> model = PPO("MlpPolicy", dask_vec_env, tensorboard_log="runs")  # doctest: +SKIP
    >>> model.learn(100_000, callback=DaskVecEnvMetrics(), progress_bar=True)  # doctest: +SKIP
    """

    def __init__(self, log_freq: int | None = None, verbose: int = 0) -> None:
        if log_freq is not None and (isinstance(log_freq, bool) or not isinstance(log_freq, int) or log_freq < 1):
            raise ValueError(f"log_freq must be a positive int (vec-steps) or None, not {log_freq!r}")
        super().__init__(verbose)
        self.log_freq = log_freq
        self.vec_env: DaskVecEnv | None = None
        self.last: dict[str, float] = {}
        self._mark: _Mark | None = None
        self._tally = RestartTally()

    def _init_callback(self) -> None:
        self.vec_env = find_dask_vec_env(self.training_env)
        self._mark = _Mark.of(self.vec_env)

    def _on_step(self) -> bool:
        if self.log_freq is not None and self.n_calls % self.log_freq == 0:
            self.record()
        return True

    def _on_rollout_end(self) -> None:
        self.record()

    def record(self) -> dict[str, float]:
        """Record the figures now; returns them (keys with the ``daskvec/`` prefix)."""
        env = self.vec_env
        if env is None or self._mark is None:
            raise RuntimeError("DaskVecEnvMetrics.record() called before training started")
        mark = _Mark.of(env)
        figures = timing_figures(self._mark, mark, env.num_envs)
        self._mark = mark
        if not env.closed:
            figures.update(layout_figures(env.groups))
        self._tally.update(env.restart_log)
        figures.update(self._tally.figures())
        for key, value in figures.items():
            exclude = None if key in _SHOWN else ("stdout", "log")
            self.logger.record(PREFIX + key, value, exclude=exclude)
        self.last = {PREFIX + k: v for k, v in figures.items()}
        return self.last
