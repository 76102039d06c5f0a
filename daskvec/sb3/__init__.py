"""Stable-Baselines3: the ``VecEnv`` face and the public home of the learners.

- :mod:`daskvec.sb3.vec_env`: :class:`~daskvec.DaskVecEnv`, SB3's ``VecEnv`` API and its
  state machine;
- :mod:`daskvec.sb3.buffers`: :class:`~daskvec.sb3.buffers.StepBuffers`, the one place
  replies become SB3's observations, rewards, dones and info dicts;
- :mod:`daskvec.sb3.replay`: the vec env's worker-side collections
  (``collect_rollout``) and ``replay``, which the learners call.

The learners live in :mod:`daskvec.learners` and are imported from here, the path the
docs show: ``from daskvec.sb3 import DaskPPO, DaskA2C, DaskSAC, DaskTD3, DaskDDPG, DaskDQN``.
They are imported when first asked for, so that importing the face does not import the
learners (which import the face).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskvec.learners.off_policy import DaskDDPG, DaskDQN, DaskSAC, DaskTD3
    from daskvec.learners.on_policy import DaskA2C, DaskPPO
    from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics
    from daskvec.sb3.vec_env import DaskVecEnv

__all__ = ["DaskA2C", "DaskDDPG", "DaskDQN", "DaskPPO", "DaskSAC", "DaskTD3", "DaskVecEnv", "DaskVecEnvMetrics"]

#: Where each public name is defined.
_HOMES = {
    "DaskPPO": "daskvec.learners.on_policy",
    "DaskA2C": "daskvec.learners.on_policy",
    "DaskSAC": "daskvec.learners.off_policy",
    "DaskTD3": "daskvec.learners.off_policy",
    "DaskDDPG": "daskvec.learners.off_policy",
    "DaskDQN": "daskvec.learners.off_policy",
    "DaskVecEnvMetrics": "daskvec.monitoring.sb3_logger",
    "DaskVecEnv": "daskvec.sb3.vec_env",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
