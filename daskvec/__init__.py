"""daskvec: Stable-Baselines3 vectorized environments on Dask clusters.

The package is laid out by role:

- client side: :mod:`daskvec.vec_env` (:class:`DaskVecEnv`, the SB3 face and its
  state), :mod:`daskvec.options`, :mod:`daskvec.pool` (the env groups),
  :mod:`daskvec.directory` (workers and placement), :mod:`daskvec.buffers` (SB3's
  step results), :mod:`daskvec.recovery` (lost and moved envs, restarts);
- :mod:`daskvec.protocol` -- the commands and replies shared by client and worker;
- :mod:`daskvec.transport` -- how requests and replies travel between them;
- :mod:`daskvec.worker` -- worker side, the env-group actor and the env process;
- :mod:`daskvec.cluster` and :mod:`daskvec.jobqueue` -- clients, clusters, batch jobs;
- :mod:`daskvec.metrics` and :mod:`daskvec.dashboard` -- figures and the dashboard page;
- :mod:`daskvec.cli` and :mod:`daskvec.bench` -- the ``daskvec`` command and benchmarks.

See docs/architecture.md. ``DaskVecEnv`` is imported lazily so that worker processes,
which only need :mod:`daskvec.worker`, never import Stable-Baselines3 or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
    EnvBuildError,
    EnvBuildTimeoutError,
    EnvRestartBudgetExceeded,
    NoAsyncCallError,
    RemoteEnvError,
    StepTimeoutError,
    WorkerLostError,
)

if TYPE_CHECKING:
    from daskvec.vec_env import DaskVecEnv

__version__ = "0.1.0"

__all__ = [
    "AlreadySteppingError",
    "ClosedEnvError",
    "DaskVecEnv",
    "DaskVecEnvError",
    "EnvBuildError",
    "EnvBuildTimeoutError",
    "EnvRestartBudgetExceeded",
    "NoAsyncCallError",
    "RemoteEnvError",
    "StepTimeoutError",
    "WorkerLostError",
    "__version__",
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
    raise AttributeError(f"module 'daskvec' has no attribute {name!r}")
