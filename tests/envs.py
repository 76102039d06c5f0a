"""Test environments, deliberately in a module the workers cannot import."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class CountingEnv(gym.Env[np.ndarray, int]):
    """Observation counts steps; episode ends after ``horizon`` steps; can fail on demand."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(self, horizon: int = 10, fail_at: int | None = None, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.horizon = horizon
        self.fail_at = fail_at
        self.render_mode = render_mode
        self.t = 0
        self.total_steps = 0
        self.offset = 0.0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.offset = float(self.np_random.integers(0, 1000))
        if options and "offset" in options:
            self.offset = float(options["offset"])
        return np.array([self.t, self.offset], dtype=np.float32), {"seeded": seed}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.total_steps += 1
        if self.fail_at is not None and self.total_steps == self.fail_at:
            raise ValueError(f"boom at step {self.total_steps}")
        obs = np.array([self.t, self.offset], dtype=np.float32)
        return obs, float(action), False, self.t >= self.horizon, {"t": self.t}

    def render(self) -> np.ndarray:
        return np.full((4, 4, 3), self.t, dtype=np.uint8)

    def double(self, x: float, scale: float = 1.0) -> float:
        return 2 * x * scale
