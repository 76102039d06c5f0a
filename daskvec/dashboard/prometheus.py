"""The daskvec figures on the scheduler's ``/metrics``: :class:`PrometheusCollector`.

The collector reads the scheduler whose ``/metrics`` is being served (see :func:`_served_schedulers`)
through :func:`~daskvec.dashboard.data.snapshot`; :data:`PROMETHEUS_METRICS` lists the names it serves.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from daskvec.dashboard.data import _PARTS, snapshot

logger = logging.getLogger(__name__)

__all__ = ["PROMETHEUS_METRICS", "PrometheusCollector"]


def _running(server: Any) -> bool:
    from distributed.core import Status

    return getattr(server, "status", None) in (Status.running, Status.init)


def _running_schedulers() -> list[Any]:
    from distributed.scheduler import Scheduler

    return [s for s in list(Scheduler._instances) if _running(s)]


def _served_schedulers() -> list[Any]:
    """The scheduler whose ``/metrics`` page is being built; every running one if unknown.

    ``prometheus_client`` keeps one registry per process, and a process may run several
    schedulers (a notebook with two ``LocalCluster``, a test session). Dask's own
    ``/metrics`` handler points its collectors at the scheduler it serves before it reads
    the registry; daskvec's figures follow the same scheduler, so that one cluster's page
    never counts another's envs.
    """
    try:
        from distributed.http.scheduler.prometheus.core import PrometheusHandler

        server = PrometheusHandler._collectors[0].server  # type: ignore[index]
    except Exception:  # not served yet, or a Dask without this handler
        return _running_schedulers()
    return [server] if _running(server) else _running_schedulers()


class PrometheusCollector:
    """``prometheus_client`` collector of the daskvec figures of a scheduler in this process.

    Served on the scheduler's ``/metrics`` with the names listed in
    :data:`PROMETHEUS_METRICS` (``dask`` is the ``distributed.dashboard.prometheus.namespace``).

    Parameters
    ----------
    schedulers : callable, optional
        Returns the schedulers to read. By default the one whose ``/metrics`` is being
        served (every running scheduler of the process when none is).
    """

    def __init__(self, schedulers: Any = _served_schedulers) -> None:
        self._schedulers = schedulers

    @staticmethod
    def _name(name: str) -> str:
        import dask.config

        namespace = dask.config.get("distributed.dashboard.prometheus.namespace", "dask")
        return f"{namespace}_daskvec_{name}" if namespace else f"daskvec_{name}"

    def collect(self) -> Iterator[Any]:
        """Yield one metric family per figure (see :data:`PROMETHEUS_METRICS`)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snaps = []
        for s in self._schedulers():
            try:
                snaps.append(snapshot(s))
            except Exception:  # a scheduler shutting down while we read it
                logger.debug("daskvec metrics: could not read a scheduler", exc_info=True)
        gauges = {
            "envs": ("envs", "Environments held by the worker"),
            "env_steps_per_second": ("steps_per_s", "Env-steps per second over the last few seconds"),
            "mean_episode_return": ("mean_return", "Mean return of the last 100 episodes finished on the worker"),
        }
        counters = {
            "env_steps": ("steps", "Env-steps taken on the worker"),
            "episodes": ("episodes", "Episodes finished on the worker"),
            "env_errors": ("errors", "Exceptions raised by envs on the worker"),
            "env_restarts": ("restarts", "Envs rebuilt on the worker"),
        }
        families: tuple[tuple[Any, dict[str, tuple[str, str]]], ...] = (
            (GaugeMetricFamily, gauges),
            (CounterMetricFamily, counters),
        )
        for family, specs in families:
            for name, (col, doc) in specs.items():
                fam = family(self._name(name), doc, labels=["worker"])
                for snap in snaps:
                    for addr, v in zip(snap.workers["address"], snap.workers[col], strict=True):
                        fam.add_metric([addr], float(v))
                yield fam
        lat = GaugeMetricFamily(
            self._name("step_latency_seconds"),
            "Time of one env-group step inside the envs, by quantile over a recent window",
            labels=["worker", "quantile"],
        )
        for snap in snaps:
            for addr, p50, p99 in zip(
                snap.workers["address"], snap.workers["step_p50_ms"], snap.workers["step_p99_ms"], strict=True
            ):
                lat.add_metric([addr, "0.5"], p50 / 1e3)
                lat.add_metric([addr, "0.99"], p99 / 1e3)
        yield lat
        yield GaugeMetricFamily(
            self._name("env_groups"), "Env-group actors alive on the cluster", value=float(sum(s.groups for s in snaps))
        )
        yield GaugeMetricFamily(
            self._name("vec_envs"),
            "DaskVecEnvs reporting to the scheduler",
            value=float(sum(s.vec_envs for s in snaps)),
        )
        share = GaugeMetricFamily(
            self._name("client_time_share"),
            "Share of the vec-env step time spent on the client, in transit and inside the envs (recent)",
            labels=["part"],
        )
        if snaps:
            seconds = {p: sum(s.split_seconds[p] for s in snaps) for p in _PARTS}
            total = sum(seconds.values())
            for p in _PARTS:
                share.add_metric([p], seconds[p] / total if total > 0 else 0.0)
        yield share


#: Names daskvec serves on the scheduler's ``/metrics`` (default namespace ``dask``).
PROMETHEUS_METRICS: tuple[str, ...] = (
    "dask_daskvec_envs",
    "dask_daskvec_env_steps_per_second",
    "dask_daskvec_mean_episode_return",
    "dask_daskvec_env_steps_total",
    "dask_daskvec_episodes_total",
    "dask_daskvec_env_errors_total",
    "dask_daskvec_env_restarts_total",
    "dask_daskvec_step_latency_seconds",
    "dask_daskvec_env_groups",
    "dask_daskvec_vec_envs",
    "dask_daskvec_client_time_share",
)
