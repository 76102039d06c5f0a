"""The soak's checks on hand-made data: the witness (``benchmarks.soak.Witness``) on Gymnasium rows as
docs/gymnasium.md describes them, and the markers against the ledger as docs/rollouts.md describes them."""

from __future__ import annotations

import numpy as np

from benchmarks.soak import MARKER, Fault, Witness, kill_not_rebuilt, told_against_ledger

HORIZON = 3


def batch(rows: list[tuple[int, int, int]], rewards: list[float], trunc: list[bool], moved: list[bool]) -> tuple:
    marker = {"reason": np.array(["moved" if m else "" for m in moved]), "restarts": np.array(moved, dtype=int)}
    info = {"_" + MARKER: np.array(moved), MARKER: marker}
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


def entry(env: int, reason: str, step: int = 0) -> dict[str, object]:
    return {"env": env, "reason": reason, "from_worker": "tcp://a:1", "worker": "tcp://b:1", "step": step}


LOST_TWICE = [entry(0, "worker_lost"), entry(0, "worker_lost")]


def test_stepping_tells_every_rebuild_at_a_step_of_its_own() -> None:
    markers = [(0, "worker_lost", 1), (0, "worker_lost", 2), (1, "moved", 1)]
    log = [*LOST_TWICE, entry(1, "moved")]
    assert told_against_ledger(markers, log, [2, 1], each_at_its_own_step=True)["ok"]
    # one rebuild the caller never heard of
    told = told_against_ledger(markers[1:], log, [2, 1], each_at_its_own_step=True)
    assert not told["ok"] and "rebuild 1" in told["problems"][0] and not told["superseded"], told


def test_a_rollout_tells_a_rebuild_lost_again_by_the_next_marker_of_its_env() -> None:
    """docs/rollouts.md: one marker per env at the first step, ``restarts`` counting every rebuild."""
    told = told_against_ledger([(0, "worker_lost", 2)], LOST_TWICE, [2], each_at_its_own_step=False)
    assert told["ok"] and told["superseded"] == [(0, "worker_lost")], told
    # stepping, the same would be a rebuild never told
    assert not told_against_ledger([(0, "worker_lost", 2)], LOST_TWICE, [2], each_at_its_own_step=True)["ok"]


def test_markers_that_do_not_add_up_to_the_ledger_fail() -> None:
    rollout = {"each_at_its_own_step": False}
    # the last rebuild never told: the markers count to 1 of 2
    assert not told_against_ledger([(0, "worker_lost", 1)], LOST_TWICE, [2], **rollout)["ok"]
    # a marker the ledger does not hold
    assert not told_against_ledger([(0, "moved", 2)], LOST_TWICE, [2], **rollout)["ok"]
    # a ledger short of restart_counts
    assert not told_against_ledger([(0, "worker_lost", 2)], LOST_TWICE[:1], [2], **rollout)["ok"]
    # one rebuild told twice
    assert not told_against_ledger([(0, "worker_lost", 2), (0, "worker_lost", 2)], LOST_TWICE, [2], **rollout)["ok"]
    # a rebuild told with another reason than the ledger's
    log = [entry(0, "worker_lost"), entry(0, "moved", step=5)]
    assert not told_against_ledger([(0, "moved", 1), (0, "moved", 2)], log, [2], **rollout)["ok"]


def test_a_rollout_may_not_drop_the_marker_of_a_rebuild_that_stepped() -> None:
    """Two rebuilds in two collections (the ledger's step moved between them): both must be told."""
    log = [entry(0, "worker_lost", step=0), entry(0, "worker_lost", step=16)]
    told = told_against_ledger([(0, "worker_lost", 2)], log, [2], each_at_its_own_step=False)
    assert not told["ok"] and "rebuild 1" in told["problems"][0], told


def rebuild(env: int, from_worker: str, worker: str) -> dict[str, object]:
    return {"env": env, "reason": "worker_lost", "from_worker": from_worker, "worker": worker, "step": 0}


def killed(envs: list[int], ledger_at: int) -> Fault:
    return Fault(phase=0, at=0.0, kind="kill", worker="tcp://k:1", envs=envs, ledger_at=ledger_at)


def test_every_env_of_a_killed_worker_is_rebuilt_from_it() -> None:
    log = [
        rebuild(0, "tcp://a:1", "tcp://k:1"),
        rebuild(0, "tcp://k:1", "tcp://b:1"),
        rebuild(1, "tcp://k:1", "tcp://b:1"),
    ]
    assert kill_not_rebuilt(killed([0, 1], ledger_at=1), log) == []
    assert kill_not_rebuilt(killed([0, 1, 2], ledger_at=1), log) == [2]  # env 2 never rebuilt
    # a rebuild from the killed worker before the kill does not count for the kill
    assert kill_not_rebuilt(killed([0], ledger_at=1), [rebuild(0, "tcp://k:1", "tcp://b:1")]) == [0]


def test_an_env_on_its_way_to_the_killed_worker_counts_when_its_rebuild_ends_elsewhere() -> None:
    """env.groups lists a group still being built on a worker; killed, that rebuild ends on
    another worker and the ledger names the worker the env came from (seen in a 30-minute soak)."""
    log = [rebuild(1, "tcp://a:1", "tcp://b:1")]
    assert kill_not_rebuilt(killed([1], ledger_at=0), log) == []
    # but a rebuild that ended on the killed worker leaves the env there, lost with it
    assert kill_not_rebuilt(killed([1], ledger_at=0), [rebuild(1, "tcp://a:1", "tcp://k:1")]) == [1]
    assert kill_not_rebuilt(killed([1], ledger_at=0), [rebuild(1, "tcp://k:1", "tcp://k:1")]) == [1]
    # one that ended there just before the kill, and was rebuilt from it after
    log = [rebuild(1, "tcp://a:1", "tcp://k:1"), rebuild(1, "tcp://k:1", "tcp://b:1")]
    assert kill_not_rebuilt(killed([1], ledger_at=0), log) == []
