"""A helper module: the env in :mod:`localmod.gridworld` uses it, so it must travel too."""

from __future__ import annotations

import numpy as np

GRID = 5


def clip_position(pos: np.ndarray) -> np.ndarray:
    """Keep a position on the grid."""
    return np.clip(pos, 0, GRID - 1)
