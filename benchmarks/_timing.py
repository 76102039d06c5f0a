"""What the in-process A/B benchmarks share: a timed window of stepping, and the JSON they write."""

from __future__ import annotations

import json
import time
from typing import Any

import numpy as np


def rate(venv: Any, actions: np.ndarray, seconds: float, warmup: int = 10) -> float:
    """Env-steps per second of ``venv`` over a window of ``seconds``, after ``warmup`` untimed steps."""
    n = actions.shape[1]
    for k in range(warmup):
        venv.step(actions[k % len(actions)])
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        venv.step(actions[k % len(actions)])
        k += 1
    return k * n / (time.perf_counter() - t0)


def write_json(result: Any, path: str | None) -> None:
    """Write ``result`` as JSON to ``path`` (nothing when ``path`` is None)."""
    if path:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
