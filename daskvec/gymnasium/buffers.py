"""Gymnasium-style buffers: where replies become what a Gymnasium ``VectorEnv`` returns.

:class:`VectorBuffers` is to :class:`~daskvec.gymnasium.vector_env.DaskVectorEnv` what
:class:`~daskvec.sb3.buffers.StepBuffers` is to the Stable-Baselines3 face: it holds the
batched observations (laid out by ``gymnasium.vector.utils.create_empty_array``, as
``SyncVectorEnv`` lays them out; spaces that Gymnasium batches as a tuple of per-env
values, such as ``Text`` or ``Graph``, are held as lists and handed out as tuples), the
rewards, terminations and truncations, and each env's info parts, and is the one place
where Gymnasium's info dicts are built.

The infos are built by Gymnasium's own code (``VectorEnv._add_info``): a dict of arrays,
each with a ``_key`` boolean mask, the envs' info dicts folded in in env order exactly as
``SyncVectorEnv`` folds them, so that the dtypes chosen for each key are the same. Per
autoreset mode:

- ``NEXT_STEP`` and ``DISABLED``: an env's info is the dict its ``step`` returned (at a
  next-step reset, the dict its ``reset`` returned);
- ``SAME_STEP``: where an episode ended, ``{"final_obs": ..., "final_info": ...}`` and
  then the reset info, as ``SyncVectorEnv`` adds them.

An env rebuilt by daskvec (lost worker, hang, move, env error) reports a truncation,
with the marker ``info["daskvec"]`` (reason, worker, seed).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

from daskvec._core.handles import Group
from daskvec._core.recovery import Rebuild
from daskvec.protocol.messages import INFO_KEY, Autoreset, PerEnv, ResetReply, StepReply
from daskvec.worker import obs_shape
from daskvec.worker.envs import ARRAY_SPACES

__all__ = ["VectorBuffers", "build_infos"]

#: One env's info, as the dicts Gymnasium folds in one after the other.
InfoParts = list[dict[str, Any]]


class _InfoBatch:
    """A stand-in with ``num_envs`` on which Gymnasium's own ``_add_info`` runs, for any batch size."""

    _add_info = gym.vector.VectorEnv._add_info  # its code only reads num_envs

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


def build_infos(per_env: Sequence[InfoParts]) -> dict[str, Any]:
    """Fold per-env info parts into a Gymnasium vector info dict (arrays with ``_key`` masks).

    Parameters
    ----------
    per_env : sequence of list of dict
        For each row of the batch, in order, the dicts to add for that env.

    Returns
    -------
    dict
        What ``SyncVectorEnv`` would return for those envs' infos.
    """
    batch = _InfoBatch(len(per_env))
    infos: dict[str, Any] = {}
    for k, parts in enumerate(per_env):
        for part in parts:
            if part:
                infos = batch._add_info(infos, part, k)  # type: ignore[misc]
    return infos


def _empty(space: gym.Space[Any], n: int) -> Any:
    """Buffers for ``n`` observations of ``space``: arrays where they stack, lists of values elsewhere.

    Laid out as ``SyncVectorEnv`` lays out its observations (``create_empty_array``),
    except that spaces Gymnasium batches as a tuple of values (Graph, Text, Sequence,
    OneOf, custom spaces) get a list, written one env at a time and handed out as a tuple.
    """
    if isinstance(space, gym.spaces.Dict):
        return {key: _empty(sub, n) for key, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_empty(sub, n) for sub in space.spaces)
    if isinstance(space, ARRAY_SPACES):
        return create_empty_array(space, n=n, fn=np.zeros)
    values = create_empty_array(space, n=n, fn=np.zeros)
    return list(values) if isinstance(values, tuple) else [None] * n


def _write(buf: Any, index: Any, value: Any) -> None:
    """Write ``value`` into rows ``index`` (an int: one env's observation; a slice or array: a group's)."""
    if isinstance(buf, dict):
        for key, sub in buf.items():
            _write(sub, index, value[key])
    elif isinstance(buf, tuple):
        for sub, val in zip(buf, value, strict=True):
            _write(sub, index, val)
    elif isinstance(buf, list):
        if isinstance(index, (int, np.integer)):
            buf[int(index)] = value
        else:
            rows = range(len(buf))[index] if isinstance(index, slice) else index
            if len(rows) != len(value):
                raise ValueError(f"{len(value)} observations for {len(rows)} envs")
            for i, v in zip(rows, value, strict=True):
                buf[int(i)] = v
    else:
        buf[index] = value


def _take(buf: Any, index: Any) -> Any:
    """Rows ``index`` (an int: one env's observation; an array: a batch), copied.

    ``buf`` is either these buffers or what a group sent (:class:`~daskvec.protocol.messages.PerEnv`
    tuples where these buffers hold lists).
    """
    if isinstance(buf, dict):
        return type(buf)((key, _take(sub, index)) for key, sub in buf.items())
    if isinstance(buf, (list, PerEnv)):
        if isinstance(index, (int, np.integer)):
            return copy.deepcopy(buf[int(index)])
        return tuple(copy.deepcopy(buf[int(i)]) for i in index)
    if isinstance(buf, tuple):
        return tuple(_take(sub, index) for sub in buf)
    return np.array(buf[index], copy=True)


def _export(buf: Any, copied: bool) -> Any:
    """The observations of every env, as ``SyncVectorEnv`` returns them (copied unless ``copied`` is False)."""
    if isinstance(buf, dict):
        return type(buf)((key, _export(sub, copied)) for key, sub in buf.items())
    if isinstance(buf, tuple):
        return tuple(_export(sub, copied) for sub in buf)
    if isinstance(buf, list):
        return tuple(copy.deepcopy(buf) if copied else buf)
    return buf.copy() if copied else buf


class VectorBuffers:
    """The buffers of a Gymnasium-style vec env's steps.

    Parameters
    ----------
    observation_space : gymnasium.spaces.Space
        One env's observation space.
    n_envs : int
        Number of envs.
    autoreset : Autoreset
        The vec env's autoreset mode (how finished episodes are reported).
    copy : bool
        Whether results hand out copies of the observations (``SyncVectorEnv(copy=...)``);
        otherwise the buffers' own arrays, which the next step overwrites.

    Attributes
    ----------
    has_obs : bool
        Whether the envs were reset once.
    """

    def __init__(self, observation_space: gym.Space[Any], n_envs: int, autoreset: Autoreset, copy: bool = True) -> None:
        self.observation_space = observation_space
        self.autoreset = autoreset
        self.copy = copy
        self.obs = _empty(observation_space, n_envs)
        self.rewards = np.zeros(n_envs, dtype=np.float64)
        self.terminations = np.zeros(n_envs, dtype=np.bool_)
        self.truncations = np.zeros(n_envs, dtype=np.bool_)
        self.infos: list[InfoParts] = [[] for _ in range(n_envs)]
        self.has_obs = False
        # envs rebuilt outside a step: their truncation is reported in their next step
        self._deferred: dict[int, tuple[dict[str, Any], Any]] = {}

    # ------------------------------------------------------------------ writing replies
    def write_obs(self, group: Group, stacked: Any) -> None:
        """Write a group's stacked observations into its rows, or explain why they do not fit."""
        try:
            _write(self.obs, group.index, stacked)
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(
                f"envs {group.env_indices} on {group.worker} returned observations that do not fit the observation "
                f"space {self.observation_space} (got shape {obs_shape(stacked)}): {e}; "
                "make each env's observations match its observation_space"
            ) from e

    def take_reset(self, group: Group, reply: ResetReply, mask: Sequence[bool] | None = None) -> None:
        """Write a group's reset reply (``mask``: the vec env's reset mask; other envs keep their rows)."""
        self.write_obs(group, reply.obs)
        for pos, i in enumerate(group.env_indices):
            if mask is not None and not mask[i]:
                continue
            info = dict(reply.reset_infos[pos])
            if pos in reply.restarted:
                info[INFO_KEY] = reply.restarted[pos]
            self.infos[i] = [info]
            self.rewards[i] = 0.0
            self.terminations[i] = self.truncations[i] = False

    def take_step(self, group: Group, reply: StepReply) -> None:
        """Write a group's step reply: observations, rewards, terminations, truncations and info parts."""
        self.write_obs(group, reply.obs)
        index = group.index
        self.rewards[index] = reply.rewards
        self.terminations[index] = reply.terminated
        self.truncations[index] = reply.truncated
        own, final, restarted = reply.infos, reply.final_obs, reply.restarted
        infos = self.infos
        if not (own or final or restarted):  # most steps: no env has an info to report
            for i in group.env_indices:
                infos[i] = []
            return
        same_step = self.autoreset is Autoreset.SAME_STEP
        for pos, i in enumerate(group.env_indices):
            if same_step and pos in final:
                parts = [
                    {"final_obs": final[pos], "final_info": dict(own.get(pos, {}))},
                    dict(reply.reset_infos.get(pos, {})),
                ]
            else:  # the reply's info dicts are its own (decoded for this step): no copy needed
                parts = [own[pos]] if pos in own else []
            if pos in restarted:
                parts = [*parts[:-1], {**(parts[-1] if parts else {}), INFO_KEY: restarted[pos]}]
            infos[i] = parts

    # ------------------------------------------------------------------ rebuilt envs
    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        """Report the envs daskvec rebuilt (see :meth:`daskvec.sb3.buffers.StepBuffers.report_rebuilds`).

        ``"step"``: their rows in the step just written become truncations. With
        ``SAME_STEP`` the row holds the rebuilt env's first observation and the info its
        ``final_obs`` (the observation last seen, or reached by a moved env); with
        ``NEXT_STEP`` the row keeps the last observation and the next step hands out the
        first one (the group holds it); with ``DISABLED`` the learner resets the env
        itself. Lost envs get reward 0; moved envs keep the step they made.
        ``"deferred"``: reported in the env's next step. ``"reset"``: nothing to report.
        """
        for rebuild in rebuilds:
            group, reply = rebuild.group, rebuild.reply
            for pos, i in enumerate(group.env_indices):
                marker = rebuild.markers[i]
                if during == "step":
                    first = _take(reply.obs, pos)
                    self._truncate(i, marker, rebuild.moved(i), first, dict(reply.reset_infos[pos]))
                elif during == "deferred" and self.has_obs:
                    self._deferred[i] = (marker, self.row(i))
            if not self.has_obs:
                self.write_obs(group, reply.obs)

    def _truncate(self, i: int, marker: dict[str, Any], moved: bool, first: Any, reset_info: dict[str, Any]) -> None:
        ended = bool(self.terminations[i] or self.truncations[i])
        step_info = self.infos[i][0] if moved and self.infos[i] else {}
        if not moved:  # its step never happened
            self.rewards[i] = 0.0
            self.terminations[i] = False
        if not (moved and ended):
            self.truncations[i] = True
        if self.autoreset is Autoreset.SAME_STEP:
            if moved and ended:  # already reset in its step: the rebuilt env's reset replaces that one
                parts = [self.infos[i][0], reset_info]
            else:
                parts = [{"final_obs": self.row(i), "final_info": dict(step_info)}, reset_info]
            _write(self.obs, i, first)
        else:
            parts = list(self.infos[i]) if moved else [{}]
            parts = parts or [{}]
        parts[-1] = {**parts[-1], INFO_KEY: marker}
        self.infos[i] = parts

    def apply_deferred(self, ids: Sequence[int] | None = None) -> None:
        """Report, in the step just written for ``ids`` (default: all), the envs rebuilt since their last step."""
        for i in list(self._deferred) if ids is None else [i for i in ids if i in self._deferred]:
            marker, last = self._deferred.pop(i)
            self.rewards[i] = 0.0
            self.terminations[i], self.truncations[i] = False, True
            if self.autoreset is Autoreset.SAME_STEP:
                self.infos[i] = [{"final_obs": last, "final_info": {}}, {INFO_KEY: marker}]
            else:
                self.infos[i] = [{INFO_KEY: marker}]

    def forget_deferred(self, ids: Sequence[int] | None = None) -> None:
        """Drop deferred reports of ``ids`` (default: all), whose envs a reset starts anew."""
        if ids is None:
            self._deferred.clear()
        for i in ids or ():
            self._deferred.pop(i, None)

    # ------------------------------------------------------------------ reading
    def row(self, i: int) -> Any:
        """A copy of env ``i``'s observation."""
        return _take(self.obs, i)

    def reset_result(self, mask: Sequence[bool] | None = None) -> tuple[Any, dict[str, Any]]:
        """``(observations, infos)`` of a reset (``mask``: only those envs' infos)."""
        parts = [p if mask is None or mask[i] else [] for i, p in enumerate(self.infos)]
        return _export(self.obs, self.copy), build_infos(parts)

    def result(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The step's ``(obs, rewards, terminations, truncations, infos)``, copied."""
        return (
            _export(self.obs, self.copy),
            self.rewards.copy(),
            self.terminations.copy(),
            self.truncations.copy(),
            build_infos(self.infos),
        )

    def batch(self, ids: Sequence[int]) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The rows of envs ``ids`` (a partial batch), with ``info["env_id"]``."""
        idx = np.asarray(ids, dtype=np.intp)
        infos = build_infos([[*self.infos[i], {"env_id": int(i)}] for i in ids])
        return _take(self.obs, idx), self.rewards[idx], self.terminations[idx], self.truncations[idx], infos
