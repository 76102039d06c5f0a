"""Envs whose figures are known in advance, for the metrics and dashboard tests.

Like ``envs.py``, a module the workers cannot import: DaskVecEnv ships it by value.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np


class ScriptedEnv(gym.Env[np.ndarray, int]):
    """Every episode lasts one step; episode ``j`` pays ``returns[j % len(returns)]``.

    ``fail_at``: the env's ``fail_at``-th step (counted over this instance's life) raises
    ``ValueError``. ``slow_every``: every ``slow_every``-th step sleeps ``slow_s`` seconds
    first, so that the group's step-time percentiles have a known lower bound.
    """

    def __init__(
        self,
        returns: tuple[float, ...] = (1.0, 2.0, 3.0, 10.0),
        fail_at: int | None = None,
        slow_every: int | None = None,
        slow_s: float = 0.0,
    ) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(1,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.returns = tuple(float(r) for r in returns)
        self.fail_at = fail_at
        self.slow_every = slow_every
        self.slow_s = slow_s
        self.steps = 0
        self.episodes = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.array([self.episodes], dtype=np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.steps += 1
        if self.fail_at is not None and self.steps == self.fail_at:
            raise ValueError(f"scripted failure at step {self.steps}")
        if self.slow_every is not None and self.steps % self.slow_every == 0:
            time.sleep(self.slow_s)
        reward = self.returns[self.episodes % len(self.returns)]
        self.episodes += 1
        return np.array([self.episodes], dtype=np.float32), reward, True, False, {}


def random_cartpole_return(episodes: int = 100, seed: int = 0) -> float:
    """Mean return of uniformly random actions on CartPole-v1 (about 23): the no-skill baseline."""
    env = gym.make("CartPole-v1")
    env.action_space.seed(seed)
    total = 0.0
    for i in range(episodes):
        env.reset(seed=seed + i)
        done = False
        while not done:
            _, r, terminated, truncated, _ = env.step(env.action_space.sample())
            total += float(r)
            done = terminated or truncated
    env.close()
    return total / episodes
