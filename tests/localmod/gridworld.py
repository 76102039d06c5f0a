"""A tiny grid world defined in a local package."""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from localmod.shapes import GRID, clip_position

MOVES = np.array([[0, 1], [1, 0], [0, -1], [-1, 0]])


class GridWorld(gym.Env[np.ndarray, int]):
    """Walk from a random cell to the corner ``(GRID-1, GRID-1)``."""

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(self, max_steps: int = 12) -> None:
        self.observation_space = gym.spaces.Box(0, GRID - 1, shape=(2,), dtype=np.int64)
        self.action_space = gym.spaces.Discrete(4)
        self.max_steps = max_steps
        self.pos = np.zeros(2, dtype=np.int64)
        self.t = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.pos = self.np_random.integers(0, GRID, size=2)
        self.t = 0
        return self.pos.copy(), {"module": __name__}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        self.t += 1
        self.pos = clip_position(self.pos + MOVES[int(action)])
        goal = bool(np.all(self.pos == GRID - 1))
        return self.pos.copy(), 1.0 if goal else -0.1, goal, self.t >= self.max_steps, {}


def make_grid(max_steps: int = 12) -> GridWorld:
    """A factory function defined next to the env."""
    return GridWorld(max_steps=max_steps)
