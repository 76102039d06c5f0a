"""GroupPool's collections, in process: replies handed out as they are read, and what a stopped loop leaves."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from daskvec._core.handles import Group, StepOutcome
from daskvec._core.pool import GroupPool
from daskvec.protocol.messages import RemoteError, StepReply, StepRequest
from daskvec.transport import ChannelError


class FakeChannel:
    """A channel whose one reply is set beforehand; ``recv`` may raise instead (a Ctrl-C, once)."""

    kind = "fake"

    def __init__(self) -> None:
        self.sent: list[Any] = []
        self.reply: Any = None
        self.interrupt = False
        self.reads = 0

    def send(self, request: Any) -> None:
        self.sent.append(request)

    def recv(self, timeout: float | None = None) -> Any:
        if self.interrupt:
            self.interrupt = False
            raise KeyboardInterrupt
        self.reads += 1
        return self.reply

    def close(self) -> None:
        pass


def step_reply(n: int, restarted: dict[int, dict[str, Any]] | None = None) -> StepReply:
    return StepReply(np.zeros((n, 2)), np.ones(n), np.zeros(n, bool), np.zeros(n, bool), restarted=restarted or {})


def make_pool(n_groups: int) -> tuple[GroupPool, list[Group]]:
    pool = GroupPool(None, [], SimpleNamespace(transport="direct"), None)  # type: ignore[arg-type]
    groups = [
        Group(f"g{k}", [2 * k, 2 * k + 1], "w", None, None, FakeChannel(), None)  # type: ignore[arg-type]
        for k in range(n_groups)
    ]
    pool.groups = groups
    return pool, groups


def channel(g: Group) -> FakeChannel:
    assert isinstance(g.channel, FakeChannel)
    return g.channel


def test_a_step_is_one_typed_request_per_group_with_its_rows() -> None:
    pool, groups = make_pool(2)
    pool.send_step(np.arange(4))
    for g in groups:
        (request,) = channel(g).sent
        assert type(request) is StepRequest and request.actions.tolist() == g.env_indices
    assert pool.stepping


def test_replies_are_handed_out_in_order_and_the_outcome_records_every_group() -> None:
    pool, groups = make_pool(3)
    error = RemoteError("ValueError", "boom", "", 2, "w")
    marker = {"reason": "env_error"}
    channel(groups[0]).reply = step_reply(2, restarted={1: marker})
    channel(groups[1]).reply = error
    channel(groups[2]).reply = ChannelError("gone")
    pool.send_step(np.arange(6))
    outcome = StepOutcome()
    handed = [(g, r) for g, r in pool.collect(5.0, outcome)]
    assert [g for g, _ in handed] == [groups[0]]
    assert outcome.groups == groups and outcome.errors == [(groups[1], error)]
    assert list(outcome.lost) == [groups[2]] and outcome.env_restarts == [(groups[0], {1: marker})]
    assert not pool.stepping


def test_a_loop_that_raises_leaves_no_reply_unread() -> None:
    """The taking loop fails on the first reply (say, observations that do not fit): closing the
    iterator reads the others, so that the channels stay in step, and the step is over."""
    pool, groups = make_pool(3)
    for g in groups:
        channel(g).reply = step_reply(2)
    pool.send_step(np.arange(6))
    outcome = StepOutcome()
    with pytest.raises(ValueError), contextlib.closing(pool.collect(5.0, outcome)) as replies:
        for _ in replies:
            raise ValueError("does not fit")
    assert [channel(g).reads for g in groups] == [1, 1, 1]
    assert not pool.stepping and outcome.groups == []


def test_an_interrupted_wait_keeps_the_replies_read_before() -> None:
    """Ctrl-C while waiting for the second group: the first reply was handed out; the step stays
    pending, and the next collection reads only the second group, then records both."""
    pool, groups = make_pool(2)
    for g in groups:
        channel(g).reply = step_reply(2)
    channel(groups[1]).interrupt = True
    pool.send_step(np.arange(4))
    first = StepOutcome()
    handed: list[Group] = []
    with pytest.raises(KeyboardInterrupt), contextlib.closing(pool.collect(5.0, first)) as replies:
        for g, _ in replies:
            handed.append(g)
    assert handed == [groups[0]] and pool.stepping
    again = StepOutcome()
    assert [g for g, _ in pool.collect(5.0, again)] == [groups[1]]
    assert [channel(g).reads for g in groups] == [1, 1]
    assert again.groups == groups and not again.lost and not pool.stepping


def test_a_partial_batch_hands_out_the_groups_that_answered() -> None:
    pool, groups = make_pool(2)
    for g in groups:
        channel(g).reply = step_reply(2)
    pool.send_groups({groups[0]: np.array([0, 1])})
    (request,) = channel(groups[0]).sent
    assert type(request) is StepRequest and not channel(groups[1]).sent
    pool._pending[groups[0].gid].reply = channel(groups[0]).recv()  # answered: nothing to wait for
    outcome = StepOutcome()
    assert [g for g, _ in pool.collect_ready(2, 5.0, outcome)] == [groups[0]]
    assert outcome.groups == [groups[0]] and not pool.in_flight()
