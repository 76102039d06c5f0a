"""The benchmark's envs and seeded actions; light (numpy, gymnasium), as workers import it to build them."""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "BusyEnv",
    "ImageEnv",
    "action_cycle",
    "burn_cpu",
    "busy_loop",
    "grey_frames",
    "make_atari",
    "make_envpool",
]


def _spin(iterations: int) -> int:
    total = 0
    for i in range(iterations):
        total += i
    return total


#: Loop iterations of :func:`_spin` per CPU second, updated as :func:`burn_cpu` runs.
_SPIN_RATE = [2e7]


def burn_cpu(seconds: float, since: float | None = None) -> None:
    """Compute until the calling thread has used ``seconds`` of CPU time.

    This thread's CPU time (not the process's, not the wall clock): a step costs the same
    beside a Dask worker's event loop, and a preempted step is not cut short. The clock (a
    system call) is read after chunks of half the time left, not in a tight loop.

    Parameters
    ----------
    seconds : float
        CPU seconds to use.
    since : float, optional
        A ``time.thread_time()`` reading to count from (default: now), so that work
        done since then is part of the ``seconds``.
    """
    now = time.thread_time()
    end = (now if since is None else since) + seconds
    while now < end:
        chunk = max(int(_SPIN_RATE[0] * (end - now) * 0.5), 64)
        _spin(chunk)
        later = time.thread_time()
        if later > now:
            _SPIN_RATE[0] = 0.8 * _SPIN_RATE[0] + 0.2 * chunk / (later - now)
        now = later


class BusyEnv(gym.Env[np.ndarray, np.int64]):
    """An env whose ``step`` burns ``step_cpu_s`` seconds of CPU (a busy loop, not a sleep).

    Parameters
    ----------
    step_cpu_s : float
        CPU seconds each step costs (default 1 ms).
    horizon : int
        Steps before the episode is truncated.
    """

    def __init__(self, step_cpu_s: float = 1e-3, horizon: int = 200) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.step_cpu_s = float(step_cpu_s)
        self.horizon = int(horizon)
        self.t = 0
        self.state = np.zeros(4, dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """See ``gymnasium.Env.reset``."""
        super().reset(seed=seed)
        self.t = 0
        self.state = self.np_random.uniform(-1.0, 1.0, size=4).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move the state with the action, then burn the rest of ``step_cpu_s`` (ideal: ``cores / step_cpu_s``)."""
        start = time.thread_time()
        self.t += 1
        shift = 0.01 if int(action) == 1 else -0.01
        self.state = np.clip(np.roll(self.state, 1) + shift, -1.0, 1.0).astype(np.float32)
        obs = self.state.copy()
        burn_cpu(self.step_cpu_s, since=start)
        return obs, 1.0, False, self.t >= self.horizon, {}


class ImageEnv(gym.Env[np.ndarray, np.int64]):
    """An env with fresh 84x84x3 ``uint8`` observations each step (Atari-sized frames) and a cheap step."""

    def __init__(self, size: int = 84, horizon: int = 100) -> None:
        self.observation_space = gym.spaces.Box(0, 255, shape=(size, size, 3), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.size = int(size)
        self.horizon = int(horizon)
        self.t = 0
        self.base = np.zeros((size, size, 3), dtype=np.uint8)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """See ``gymnasium.Env.reset``."""
        super().reset(seed=seed)
        self.t = 0
        self.base = self.np_random.integers(0, 256, size=(self.size, self.size, 3), dtype=np.uint8)
        return self.base.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Return the next frame; reward is the action, truncation at ``horizon``."""
        self.t += 1
        obs = np.bitwise_xor(self.base, np.uint8((self.t + int(action)) & 0xFF))
        return obs, float(action), False, self.t >= self.horizon, {}


def grey_frames() -> gym.Env[Any, Any]:
    """84x84x1 ``uint8`` grey frames with a cheap step (Atari-sized after ``AtariWrapper``): ``ImageEnv`` through
    ``GrayscaleObservation``."""
    return gym.wrappers.GrayscaleObservation(ImageEnv(84, horizon=200), keep_dim=True)


def action_cycle(space: gym.Space[Any], n_envs: int, length: int, seed: int) -> np.ndarray:
    """Pre-generate ``length`` seeded batches of random actions for ``n_envs`` envs (every vec env of a case's)."""
    rng = np.random.default_rng(seed)
    if isinstance(space, gym.spaces.Discrete):
        return rng.integers(int(space.start), int(space.start) + int(space.n), size=(length, n_envs), dtype=np.int64)
    if isinstance(space, gym.spaces.Box):
        low = np.where(np.isfinite(space.low), space.low, -1.0)
        high = np.where(np.isfinite(space.high), space.high, 1.0)
        return rng.uniform(low, high, size=(length, n_envs, *space.shape)).astype(space.dtype)
    space.seed(seed)
    return np.stack([np.stack([space.sample() for _ in range(n_envs)]) for _ in range(length)])


# The real workloads' factories, unpickled by reference; their packages are imported when an env is made.
def make_atari(env_id: str = "PongNoFrameskip-v4", frame_stack: int = 0) -> gym.Env[Any, Any]:
    """An Atari env as SB3's ``make_atari_env`` makes it, stacking ``frame_stack`` frames itself if > 0."""
    import ale_py
    from stable_baselines3.common.atari_wrappers import AtariWrapper

    gym.register_envs(ale_py)
    env: gym.Env[Any, Any] = AtariWrapper(gym.make(env_id))
    if frame_stack:
        env = gym.wrappers.FrameStackObservation(env, frame_stack)
    return env


def make_envpool(task: str, num_envs: int, seed: int, num_threads: int = 0) -> Any:
    """An EnvPool vector env with Gymnasium's API (``envpool.make_gymnasium``)."""
    import envpool

    return envpool.make_gymnasium(task, num_envs=num_envs, seed=seed, num_threads=num_threads)


def busy_loop() -> None:
    """Spin forever: a process competing for a core (the ``contention`` scenario)."""
    x = 0
    while True:
        x = (x + 1) & 0xFFFF
