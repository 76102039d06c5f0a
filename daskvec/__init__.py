"""daskvec: Stable-Baselines3 vectorized environments on Dask clusters.

The package is laid out by role:

- client side: :mod:`daskvec.vec_env` (:class:`DaskVecEnv`, the SB3 face and its
  state), :mod:`daskvec.vector_env` (:class:`DaskVectorEnv` and :func:`make_vec`, the
  Gymnasium face), :mod:`daskvec.engine` (what both faces share), :mod:`daskvec.options`,
  :mod:`daskvec.pool` (the env groups),
  :mod:`daskvec.directory` (workers and placement), :mod:`daskvec.buffers` (SB3's
  step results), :mod:`daskvec.recovery` (lost and moved envs, restarts);
- :mod:`daskvec.protocol` -- the commands and replies shared by client and worker
  (:mod:`daskvec.rollout_protocol`: those of worker-side rollouts);
- :mod:`daskvec.transport` -- how requests and replies travel between them;
- :mod:`daskvec.worker` -- worker side, the env-group actor and the env process;
- :mod:`daskvec.cluster` and :mod:`daskvec.jobqueue` -- clients, clusters, batch jobs;
- :mod:`daskvec.metrics` and :mod:`daskvec.dashboard` -- figures and the dashboard page;
- :mod:`daskvec.cli` and :mod:`daskvec.bench` -- the ``daskvec`` command and benchmarks;
- :mod:`daskvec.config` -- the ``daskvec.*`` keys of Dask's config, registered on import.
- :mod:`daskvec.sb3_logger` (:class:`DaskVecEnvMetrics`, figures in SB3's logger),
  :mod:`daskvec.masks` (action masks with the replies) and :mod:`daskvec.zoo` (RL Zoo).

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
    from daskvec.sb3_logger import DaskVecEnvMetrics
    from daskvec.vec_env import DaskVecEnv
    from daskvec.vector_env import DaskVectorEnv, make_vec

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
        from daskvec.cluster import install_dashboard_page
        from daskvec.vec_env import DaskVecEnv

        # The one thing that reaching for DaskVecEnv does besides importing it: schedulers
        # this process starts afterwards (a LocalCluster made in a notebook, say) serve
        # the daskvec dashboard page. Workers never get here (they import daskvec.worker).
        install_dashboard_page()
        return DaskVecEnv
    if name == "DaskVecEnvMetrics":  # issue 14: the SB3 logger callback (imports Stable-Baselines3)
        from daskvec.sb3_logger import DaskVecEnvMetrics

        return DaskVecEnvMetrics
    if name in ("DaskVectorEnv", "make_vec"):  # the Gymnasium face (issue 16)
        from daskvec import vector_env
        from daskvec.cluster import install_dashboard_page

        install_dashboard_page()
        return getattr(vector_env, name)
    raise AttributeError(f"module 'daskvec' has no attribute {name!r}")
