"""Gymnasium-face helpers shared across test modules."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from envs import assert_same
from gymnasium.spaces import Box, Discrete
from gymnasium.vector import AutoresetMode


def run_both(sync: Any, dask: Any, steps: int, mode: AutoresetMode, seed: int) -> int:
    """Step both vec envs alike and compare every result; return how many episodes ended."""
    assert_identical(dask.reset(seed=seed), sync.reset(seed=seed), "reset")
    space = sync.action_space
    space.seed(seed)
    ended = 0
    for t in range(steps):
        actions = space.sample()
        got, want = dask.step(actions), sync.step(actions)
        for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want, strict=True):
            assert_identical(x, y, f"step {t} {name}")
        done = want[2] | want[3]
        ended += int(done.sum())
        if mode is AutoresetMode.DISABLED and done.any():
            seeds = [seed + 100 * t + i if d else None for i, d in enumerate(done)]
            got = dask.reset(seed=seeds, options={"reset_mask": done.copy(), "base": t})
            want = sync.reset(seed=seeds, options={"reset_mask": done.copy(), "base": t})
            assert_identical(got, want, f"masked reset after step {t}")
    return ended


class BoundsEnv(gym.Env[np.ndarray, Any]):
    """Observations in ``Box(0, high, shape)``; actions ``Discrete(n_actions)``."""

    def __init__(self, high: float, shape: tuple[int, ...] = (2,), n_actions: int = 2) -> None:
        self.observation_space = Box(0.0, high, shape, dtype=np.float32)
        self.action_space = Discrete(n_actions)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return self.observation_space.sample(), float(action), False, False, {}


def assert_identical(a: Any, b: Any, where: str = "") -> None:
    """``assert_same``, also for object arrays (``final_obs``), element by element."""
    if isinstance(a, np.ndarray) and a.dtype == object:
        assert isinstance(b, np.ndarray) and b.dtype == object and a.shape == b.shape, f"{where}: {a!r} vs {b!r}"
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{k}]")
    elif isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            assert_identical(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, tuple) and isinstance(b, tuple):
        assert len(a) == len(b), where
        for k, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{k}]")
    else:
        assert_same(a, b, where)
