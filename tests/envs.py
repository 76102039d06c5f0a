"""Test environments, deliberately in a module the workers cannot import.

The witness env (:class:`WitnessEnv`, :func:`triple`) lives in :mod:`benchmarks.witness`, which
the soak shares; it is re-exported here for the tests.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.witness import WitnessEnv as WitnessEnv  # re-exported: the tests' one witness
from benchmarks.witness import triple as triple


class CountingEnv(gym.Env[np.ndarray, int]):
    """Observation counts steps; episode ends after ``horizon`` steps; can fail on demand.

    The reward is the action. ``reset_seeds`` records every seed the env was reset with
    (``None`` included), and the reset info repeats it as ``"seeded"``, so that tests see
    what the env itself was seeded with.
    """

    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012 (gymnasium's convention)

    def __init__(self, horizon: int = 10, fail_at: int | None = None, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(3)
        self.horizon = horizon
        self.fail_at = fail_at
        self.render_mode = render_mode
        self.t = 0
        self.total_steps = 0
        self.offset = 0.0
        self.reset_seeds: list[int | None] = []

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.reset_seeds.append(seed)
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


# --------------------------------------------------------------------------- contract-test envs
SPACE_KINDS = ("box", "image", "discrete", "multidiscrete", "multibinary", "dict", "tuple")


def _obs_space(kind: str) -> gym.Space[Any]:
    if kind == "box":
        return gym.spaces.Box(-10.0, 10.0, shape=(3,), dtype=np.float32)
    if kind == "image":
        return gym.spaces.Box(0, 255, shape=(8, 8, 3), dtype=np.uint8)
    if kind == "discrete":
        return gym.spaces.Discrete(7)
    if kind == "multidiscrete":
        return gym.spaces.MultiDiscrete([3, 5, 4])
    if kind == "multibinary":
        return gym.spaces.MultiBinary(4)
    if kind == "dict":
        return gym.spaces.Dict(
            {"pos": gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32), "mode": gym.spaces.Discrete(3)}
        )
    if kind == "tuple":
        return gym.spaces.Tuple((gym.spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32), gym.spaces.Discrete(3)))
    raise ValueError(kind)


def _action_space(kind: str) -> gym.Space[Any]:
    if kind == "box":
        return gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
    if kind == "multidiscrete":
        return gym.spaces.MultiDiscrete([2, 3])
    if kind == "multibinary":
        return gym.spaces.MultiBinary(3)
    return gym.spaces.Discrete(4)


class SpaceEnv(gym.Env[Any, Any]):
    """Deterministic env with the observation/action space ``kind`` (see ``SPACE_KINDS``).

    Observations depend on the seed, the step count and the actions, so any mix-up of
    envs, seeds or actions changes them. Episodes end by termination after
    ``terminate_at`` steps when ``terminate_at`` is set, else by truncation after
    ``horizon`` steps, so both kinds of ``done`` appear.
    """

    metadata = {"render_modes": ["rgb_array"]}  # noqa: RUF012 (gymnasium's convention)

    def __init__(
        self, kind: str = "box", horizon: int = 5, terminate_at: int | None = None, render_mode: str | None = None
    ) -> None:
        self.kind = kind
        self.observation_space = _obs_space(kind)
        self.action_space = _action_space(kind)
        self.horizon = horizon
        self.terminate_at = terminate_at
        self.render_mode = render_mode
        self.t = 0
        self.acc = 0.0
        self.base = 0

    def _obs(self) -> Any:
        k, t, base = self.kind, self.t, self.base
        v = float((base + 3 * t + self.acc) % 19) - 9.0
        if k == "box":
            return np.array([v, t, base % 10], dtype=np.float32)
        if k == "image":
            return np.full((8, 8, 3), (base + 17 * t + int(self.acc)) % 256, dtype=np.uint8)
        if k == "discrete":
            return int((base + t + int(self.acc)) % 7)
        if k == "multidiscrete":
            return np.array([(base + t) % 3, (t + int(self.acc)) % 5, base % 4], dtype=np.int64)
        if k == "multibinary":
            return np.array([(base >> i + t) & 1 for i in range(4)], dtype=np.int8)
        if k == "dict":
            return {"pos": np.array([v, t], dtype=np.float32), "mode": int((base + t) % 3)}
        return (np.array([v, t], dtype=np.float32), int((base + t) % 3))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.acc = 0.0
        self.base = int(self.np_random.integers(0, 1000))
        if options and "base" in options:
            self.base = int(options["base"])
        return self._obs(), {"seed": seed, "base": self.base, "options": dict(options or {})}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        a = float(np.sum(np.asarray(action, dtype=np.float64)))
        self.acc += a
        terminated = self.terminate_at is not None and self.t >= self.terminate_at
        truncated = self.t >= self.horizon
        return self._obs(), a + 0.5 * self.t, terminated, truncated, {"t": self.t, "acc": self.acc}

    def render(self) -> np.ndarray:
        return np.full((6, 5, 3), (self.base + self.t) % 256, dtype=np.uint8)

    def scaled(self, x: float, *, scale: float = 1.0) -> float:
        """An env method with positional and keyword arguments."""
        return (x + self.t) * scale


class ReshapingEnv(CountingEnv):
    """Returns an observation one element too long on its ``bad_at``-th step (counted over episodes)."""

    def __init__(self, bad_at: int) -> None:
        super().__init__()
        self.bad_at = bad_at

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        obs, *rest = super().step(action)
        if self.total_steps == self.bad_at:
            obs = np.append(obs, np.float32(0))
        return (obs, *rest)  # type: ignore[return-value]


class SlowAttrEnv(CountingEnv):
    """``env.slow`` (and ``step`` when ``step_delay`` is set) sleep: stand-ins for env calls that hang."""

    def __init__(self, delay: float = 30.0, step_delay: float = 0.0) -> None:
        super().__init__()
        self.delay = delay
        self.step_delay = step_delay

    @property
    def slow(self) -> float:
        import time

        time.sleep(self.delay)
        return self.delay

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.step_delay:
            import time

            time.sleep(self.step_delay)
        return super().step(action)


class BrokenStepEnv(CountingEnv):
    """Raises a user-defined exception type from ``step`` at step ``fail_at``."""

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.total_steps + 1 == self.fail_at:
            self.total_steps += 1
            raise EnvCrashed(f"env crashed at step {self.total_steps}")
        return super().step(action)

    def lookup(self) -> Any:
        """Raises AttributeError from inside the env's own code."""
        return self.no_such_field  # type: ignore[attr-defined]


class EnvCrashed(Exception):
    """A user-defined exception class, defined where the workers cannot import it."""


# --------------------------------------------------------------------------- comparison helpers
def assert_same(a: Any, b: Any, where: str = "") -> None:
    """Assert that two observations/infos/returns are exactly equal, recursively.

    Arrays must agree in shape, dtype and every value; dicts in their keys; scalars
    in value and in being int/float/bool alike.
    """
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{where}: {type(a)} vs {type(b)}"
        assert set(a) == set(b), f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            assert_same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        assert type(a) is type(b), f"{where}: {type(a)} vs {type(b)}"
        assert len(a) == len(b), f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), f"{where}: {type(a)} vs {type(b)}"
        assert a.shape == b.shape, f"{where}: shape {a.shape} vs {b.shape}"
        assert a.dtype == b.dtype, f"{where}: dtype {a.dtype} vs {b.dtype}"
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"
        assert isinstance(a, bool) == isinstance(b, bool), f"{where}: {type(a)} vs {type(b)}"
