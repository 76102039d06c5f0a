"""The soak's witness (``benchmarks.soak.Witness``) on hand-made Gymnasium rows, as docs/gymnasium.md describes them."""

from __future__ import annotations

import numpy as np

from benchmarks.soak import MARKER, Witness

HORIZON = 3


def batch(rows: list[tuple[int, int, int]], rewards: list[float], trunc: list[bool], moved: list[bool]) -> tuple:
    info = {"_" + MARKER: np.array(moved), MARKER: {"reason": np.array(["moved" if m else "" for m in moved])}}
    obs = np.array(rows, dtype=np.float32)
    return obs, np.array(rewards), np.zeros(len(rows), dtype=bool), np.array(trunc), info


def stepped_to_the_horizon() -> Witness:
    w = Witness(n_envs=1, horizon=HORIZON)
    w.first(np.array([[0, 0, 0]], dtype=np.float32))
    for t in range(1, HORIZON + 1):
        w.gym(*batch([(0, 0, t)], [1.0], [t == HORIZON], [False]))
    assert w.n_wrong == 0, w.wrong
    return w


def test_an_env_moved_at_its_next_step_reset_row_made_that_reset() -> None:
    """NEXT_STEP: the step after a truncation is the reset; a move then keeps that row, reward 0."""
    w = stepped_to_the_horizon()
    w.gym(*batch([(0, 1, 0)], [0.0], [True], [True]))  # the reset row, truncated by the move
    w.gym(*batch([(0, 0, 0)], [0.0], [False], [False]))  # the rebuilt env's first observation
    w.gym(*batch([(0, 0, 1)], [1.0], [False], [False]))
    assert w.n_wrong == 0, w.wrong


def test_a_moved_row_that_is_not_the_step_the_env_made_is_wrong() -> None:
    w = stepped_to_the_horizon()
    w.gym(*batch([(0, 0, HORIZON + 1)], [1.0], [True], [True]))  # a step past the horizon: never made
    assert w.n_wrong == 1, w.wrong
