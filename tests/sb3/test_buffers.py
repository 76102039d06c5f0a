"""StepBuffers: the one place SB3's info dicts are built from a reply's columns."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from wire_frames import wire

from daskvec._core.handles import Group
from daskvec.gymnasium.buffers import VectorBuffers
from daskvec.protocol.messages import INFO_KEY, Autoreset, StepReply
from daskvec.sb3.buffers import StepBuffers
from daskvec.transport import decode, encode


def group(indices: list[int]) -> Group:
    return Group(gid="g", env_indices=indices, worker="w", future=None, actor=None, channel=None, desc={})  # type: ignore[arg-type]


def reply(n: int, **columns: Any) -> StepReply:
    r = StepReply(
        np.arange(n * 2, dtype=np.float32).reshape(n, 2),
        np.arange(n, dtype=np.float64),
        np.zeros(n, dtype=bool),
        np.zeros(n, dtype=bool),
    )
    for k, v in columns.items():
        setattr(r, k, v)
    return r


def buffers(n: int) -> StepBuffers:
    return StepBuffers(gym.spaces.Box(-10, 10, (2,), np.float32), n)


def test_a_step_that_ends_no_episode_gives_plain_infos() -> None:
    b = buffers(3)
    b.take_step(group([0, 1, 2]), reply(3))
    _, rewards, dones, infos = b.result()
    assert infos == [{"TimeLimit.truncated": False}] * 3
    assert rewards.tolist() == [0, 1, 2] and not dones.any()


#: Replies in which no env returned an info or was rebuilt: the buffers' short way (``{}``), and an env's
#: empty info that sends the same reply the general way (``{0: {}}``).
ENDS = {
    "none": {},
    "terminated": {"terminated": np.array([False, True, False])},
    "truncated": {"truncated": np.array([True, False, False])},
    "both": {"terminated": np.array([False, True, False]), "truncated": np.array([False, True, True])},
}


def decoded(r: StepReply) -> StepReply:
    """``r`` as the client reads it off the wire (the codec's short forms, shared empty mappings)."""
    got = decode(wire(encode(r)))
    assert isinstance(got, StepReply)
    return got


@pytest.mark.parametrize("ends", list(ENDS))
def test_a_reply_without_infos_is_written_as_the_same_reply_the_general_way(ends: str) -> None:
    """The short way for replies with no infos, final observations or rebuilt envs (derived from the
    reply itself) writes what the general way writes, whatever the end flags, as sent or as decoded."""
    written = []
    for r in (reply(3, **ENDS[ends]), reply(3, infos={0: {}}, **ENDS[ends])):
        for as_read in (r, decoded(r), decoded(r)):  # the second decoding takes the codec's short way
            b = buffers(5)
            b.dones[:] = True  # the previous step's, to be overwritten
            b.infos[3] = {"terminal_observation": 1, "TimeLimit.truncated": True}
            b.take_step(group([1, 3, 4]), as_read)
            obs, rewards, dones, infos = b.result()
            written.append((obs.tolist(), rewards.tolist(), dones.tolist(), infos))
    assert all(w == written[0] for w in written)
    done = (ENDS[ends].get("terminated", np.zeros(3, bool)) | ENDS[ends].get("truncated", np.zeros(3, bool))).tolist()
    assert written[0][2] == [True, done[0], True, done[1], done[2]]
    if ends in ("none", "terminated"):
        assert written[0][3][3] == {"TimeLimit.truncated": False}


@pytest.mark.parametrize("ends", list(ENDS))
@pytest.mark.parametrize("autoreset", list(Autoreset))
def test_the_gymnasium_buffers_write_a_reply_without_infos_as_the_same_reply_the_general_way(
    autoreset: Autoreset, ends: str
) -> None:
    written = []
    for r in (reply(3, **ENDS[ends]), reply(3, infos={0: {}}, **ENDS[ends])):
        for as_read in (r, decoded(r), decoded(r)):
            b = VectorBuffers(gym.spaces.Box(-10, 10, (2,), np.float32), 5, autoreset)
            b.terminations[:] = b.truncations[:] = True  # the previous step's, to be overwritten
            b.infos[3] = [{"final_obs": 1}]
            b.take_step(group([1, 3, 4]), as_read)
            obs, rewards, terminations, truncations, infos = b.result()
            written.append((obs.tolist(), rewards.tolist(), terminations.tolist(), truncations.tolist(), repr(infos)))
    assert all(w == written[0] for w in written)
    terminated = ENDS[ends].get("terminated", np.zeros(3, bool)).tolist()
    assert written[0][2] == [True, terminated[0], True, terminated[1], terminated[2]]


def test_info_rules_for_ended_truncated_and_restarted_envs() -> None:
    b = buffers(4)
    final = np.array([9, 9], dtype=np.float32)
    r = reply(
        4,
        terminated=np.array([True, False, True, False]),
        truncated=np.array([False, True, True, True]),
        final_obs={0: final},
        infos={1: {"own": 7}},
        restarted={3: {"restarted": True}},
    )
    b.take_step(group([0, 1, 2, 3]), r)
    _, _, dones, infos = b.result()
    assert dones.tolist() == [True, True, True, True]
    # truncated and not terminated -> TimeLimit.truncated; a truncation with no final
    # observation in the reply still counts (env 1)
    assert [i["TimeLimit.truncated"] for i in infos] == [False, True, False, True]
    assert infos[0]["terminal_observation"] is final
    assert infos[1]["own"] == 7 and "terminal_observation" not in infos[1]
    assert infos[3][INFO_KEY] == {"restarted": True}


def test_a_truncation_alone_is_reported() -> None:
    b = buffers(2)
    b.take_step(group([0, 1]), reply(2, truncated=np.array([False, True])))
    assert [i["TimeLimit.truncated"] for i in b.result()[3]] == [False, True]
