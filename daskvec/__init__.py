"""daskvec: Stable-Baselines3 vectorized environments on Dask clusters.

The package is laid out by role:

- client side: :mod:`daskvec.sb3.vec_env` (:class:`DaskVecEnv`, the SB3 face and its
  state), :mod:`daskvec.gymnasium.vector_env` (:class:`DaskVectorEnv` and :func:`make_vec`, the
  Gymnasium face), :mod:`daskvec._core.engine` (what both faces share), :mod:`daskvec._core.options`,
  :mod:`daskvec._core.pool` (the env groups),
  :mod:`daskvec._core.directory` (workers and placement), :mod:`daskvec.sb3.buffers` (SB3's
  step results), :mod:`daskvec._core.recovery` (lost and moved envs, restarts);
- :mod:`daskvec.protocol.messages` -- the commands and replies shared by client and worker
  (:mod:`daskvec.protocol.rollout_records`: those of worker-side rollouts);
- :mod:`daskvec.transport` -- how requests and replies travel between them;
- :mod:`daskvec.worker` -- worker side, the env-group actor and the env process;
- :mod:`daskvec.cluster.clients` and :mod:`daskvec.jobqueue` -- clients, clusters, batch jobs;
- :mod:`daskvec.monitoring.metrics` and :mod:`daskvec.dashboard` -- figures and the dashboard page;
- :mod:`daskvec.cli` and :mod:`daskvec.bench` -- the ``daskvec`` command and benchmarks;
- :mod:`daskvec.config` -- the ``daskvec.*`` keys of Dask's config, registered on import.
- :mod:`daskvec.monitoring.sb3_logger` (:class:`DaskVecEnvMetrics`, figures in SB3's logger),
  :mod:`daskvec._core.masks` (action masks with the replies) and :mod:`daskvec.learners.zoo` (RL Zoo).

See docs/architecture.md. ``DaskVecEnv`` is imported lazily so that worker processes,
which only need :mod:`daskvec.worker`, never import Stable-Baselines3 or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# registers the daskvec.* defaults in Dask's config, in every process that imports daskvec
from daskvec import config as config
from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
    EnvBuildError,
    EnvBuildTimeoutError,
    EnvRestartBudgetExceeded,
    NoAsyncCallError,
    RemoteEnvError,
    SchedulerLostError,
    StepTimeoutError,
    WorkerLostError,
)

if TYPE_CHECKING:
    from daskvec.gymnasium.vector_env import DaskVectorEnv, make_vec
    from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics
    from daskvec.sb3.vec_env import DaskVecEnv

__version__ = "0.1.0"

__all__ = [
    "AlreadySteppingError",
    "ClosedEnvError",
    "DaskVecEnv",
    "DaskVecEnvError",
    "DaskVecEnvMetrics",
    "DaskVectorEnv",
    "EnvBuildError",
    "EnvBuildTimeoutError",
    "EnvRestartBudgetExceeded",
    "NoAsyncCallError",
    "RemoteEnvError",
    "SchedulerLostError",
    "StepTimeoutError",
    "WorkerLostError",
    "__version__",
    "make_vec",
]


def __getattr__(name: str) -> Any:
    if name == "DaskVecEnv":
        from daskvec.cluster.clients import install_dashboard_page
        from daskvec.sb3.vec_env import DaskVecEnv

        # The one thing that reaching for DaskVecEnv does besides importing it: schedulers
        # this process starts afterwards (a LocalCluster made in a notebook, say) serve
        # the daskvec dashboard page. Workers never get here (they import daskvec.worker).
        install_dashboard_page()
        return DaskVecEnv
    if name == "DaskVecEnvMetrics":  # the SB3 logger callback (imports Stable-Baselines3)
        from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics

        return DaskVecEnvMetrics
    if name in ("DaskVectorEnv", "make_vec"):  # the Gymnasium face
        from daskvec.cluster.clients import install_dashboard_page
        from daskvec.gymnasium import vector_env

        install_dashboard_page()
        return getattr(vector_env, name)
    raise AttributeError(f"module 'daskvec' has no attribute {name!r}")
