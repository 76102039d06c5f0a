"""daskvec: Stable-Baselines3 vectorized environments on Dask clusters.

The package is laid out by role:

- :mod:`daskvec.vec_env` -- client side, :class:`DaskVecEnv`;
- :mod:`daskvec.worker` -- worker side, the env-group actor;
- :mod:`daskvec.transport` -- how requests and replies travel between them;
- :mod:`daskvec.cluster` -- client/cluster resolution, placement, pickling;
- :mod:`daskvec.metrics` and :mod:`daskvec.dashboard` -- figures and the dashboard page;
- :mod:`daskvec.cli` -- the ``daskvec`` command.

``DaskVecEnv`` is imported lazily so that worker processes, which only need
:mod:`daskvec.worker`, never import Stable-Baselines3 or torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from daskvec.errors import (
    AlreadySteppingError,
    ClosedEnvError,
    DaskVecEnvError,
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
    "EnvRestartBudgetExceeded",
    "NoAsyncCallError",
    "RemoteEnvError",
    "StepTimeoutError",
    "WorkerLostError",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name == "DaskVecEnv":
        from daskvec.vec_env import DaskVecEnv

        return DaskVecEnv
    raise AttributeError(f"module 'daskvec' has no attribute {name!r}")
