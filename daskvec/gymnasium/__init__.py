"""Gymnasium: the ``VectorEnv`` face.

- :mod:`daskvec.gymnasium.vector_env`: :class:`~daskvec.DaskVectorEnv` and
  :func:`~daskvec.make_vec`, Gymnasium's ``VectorEnv`` API with ``AsyncVectorEnv``'s split
  calls and state rules, and EnvPool's partial batches (``send``/``recv``);
- :mod:`daskvec.gymnasium.buffers`: :class:`~daskvec.gymnasium.buffers.VectorBuffers`,
  the one place replies become Gymnasium's batched observations and infos;
- :mod:`daskvec.gymnasium.layout`: the face's arguments, checked with Gymnasium's own
  errors, and how a batch maps to envs and groups.

Import the face from the top level, ``from daskvec import DaskVectorEnv, make_vec``, or from
here, as ``daskvec.sb3`` gives the SB3 face. They are imported when first asked for, so that
importing one of the modules above does not import the face.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from daskvec.gymnasium.vector_env import DaskVectorEnv, make_vec

__all__ = ["DaskVectorEnv", "make_vec"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module("daskvec.gymnasium.vector_env"), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
