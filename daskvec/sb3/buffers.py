"""Step buffers: where replies become what Stable-Baselines3 reads.

:class:`StepBuffers` holds the vec env's observation, reward, done and info buffers,
laid out as ``DummyVecEnv`` lays them out, and is the one place where SB3's ``info``
dicts are built from the replies' columns (:mod:`daskvec.protocol.messages`):

- ``info["TimeLimit.truncated"] = truncated and not terminated``;
- ``info["terminal_observation"]``: the last observation of an episode that ended
  (the returned observation is already the first of the next one);
- ``info["daskvec"]``: the marker of an env that was rebuilt, with ``reason``,
  ``worker`` and ``seed``; a rebuilt env reports a truncation (``done=True``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs, VecEnvStepReturn
from stable_baselines3.common.vec_env.util import dict_to_obs, obs_space_info

from daskvec._core.handles import Group
from daskvec._core.recovery import Rebuild
from daskvec.protocol.messages import INFO_KEY, ResetReply, StepReply
from daskvec.worker import obs_shape

__all__ = ["StepBuffers"]


class StepBuffers:
    """The buffers of one vec env's steps.

    Parameters
    ----------
    observation_space : gymnasium.spaces.Space
        One env's observation space.
    n_envs : int
        Number of envs.

    Attributes
    ----------
    reset_infos : list of dict
        Each env's last reset info (the vec env's ``reset_infos``; updated in place).
    has_obs : bool
        Whether the envs were reset once (before that there is no observation to
        report as the end of an episode).
    """

    def __init__(self, observation_space: gym.Space[Any], n_envs: int) -> None:
        self.observation_space = observation_space
        self.keys, shapes, dtypes = obs_space_info(observation_space)
        self._single = self.keys == [None]  # one array, not a Dict or Tuple space
        # keyed like SB3's DummyVecEnv: None for a single array, names for Dict, ints for Tuple
        self.obs: dict[Any, np.ndarray] = {k: np.zeros((n_envs, *tuple(shapes[k])), dtype=dtypes[k]) for k in self.keys}
        self.rewards = np.zeros(n_envs, dtype=np.float32)
        self.dones = np.zeros(n_envs, dtype=bool)
        self.infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]
        self.reset_infos: list[dict[str, Any]] = [{} for _ in range(n_envs)]
        self.has_obs = False
        # envs rebuilt outside a step (e.g. during env_method): their truncation is
        # reported in the next step, whose result comes from the rebuilt env
        self._deferred: dict[int, tuple[dict[str, Any], Any]] = {}
        # envs rebuilt during the reset in progress: the reset sent again to them keeps the marker
        self._reset_markers: dict[int, dict[str, Any]] = {}

    # ------------------------------------------------------------------ writing replies
    def write_obs(self, group: Group, stacked: Any) -> None:
        """Write a group's stacked observations into its rows, or explain why they do not fit."""
        try:
            if self._single:
                self.obs[None][group.index] = stacked
            else:
                for k in self.keys:
                    self.obs[k][group.index] = stacked[k]
        except (ValueError, TypeError, KeyError, IndexError) as e:
            raise ValueError(
                f"envs {group.env_indices} on {group.worker} returned observations that do not fit the observation "
                f"space {self.observation_space} (got shape {obs_shape(stacked)}): {e}; "
                "make each env's observations match its observation_space"
            ) from e

    def take_reset(self, group: Group, reply: ResetReply) -> None:
        """Write a group's reset reply."""
        self.write_obs(group, reply.obs)
        for pos, i in enumerate(group.env_indices):
            info = dict(reply.reset_infos[pos])
            if pos in reply.restarted:
                info[INFO_KEY] = reply.restarted[pos]
            elif i in self._reset_markers:
                info[INFO_KEY] = self._reset_markers[i]
            self.reset_infos[i] = info

    def take_step(self, group: Group, reply: StepReply) -> None:
        """Write a group's step reply: observations, rewards, dones, and the SB3 infos."""
        self.write_obs(group, reply.obs)
        self.rewards[group.index] = reply.rewards
        terminated, truncated = reply.terminated, reply.truncated
        indices = group.env_indices
        own, final, restarted = reply.infos, reply.final_obs, reply.restarted
        infos = self.infos
        reset_infos = reply.reset_infos
        # (count_nonzero: a fraction of the cost of any() on arrays of a few envs)
        if not (own or final or restarted or reset_infos or np.count_nonzero(truncated)):
            # most steps: no env returned infos, was truncated, reset or rebuilt: every info is the same
            self.dones[group.index] = terminated
            for i in indices:
                infos[i] = {"TimeLimit.truncated": False}
            return
        self.dones[group.index] = terminated | truncated
        time_limit = (truncated & ~terminated).tolist()
        for pos, i in enumerate(indices):
            info = dict(own[pos]) if pos in own else {}
            info["TimeLimit.truncated"] = time_limit[pos]
            if pos in final:
                info["terminal_observation"] = final[pos]
            if pos in restarted:
                info[INFO_KEY] = restarted[pos]
            infos[i] = info
        for pos, reset_info in reset_infos.items():
            info = dict(reset_info)
            if pos in restarted:
                info[INFO_KEY] = restarted[pos]
            self.reset_infos[indices[pos]] = info

    # ------------------------------------------------------------------ rebuilt envs
    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        """Write the first observations of rebuilt envs, and tell the learner.

        Parameters
        ----------
        rebuilds : sequence of Rebuild
            What :class:`~daskvec._core.recovery.Recovery` rebuilt.
        during : {"step", "deferred", "reset"}
            ``"step"``: this step's rows become truncations (``done=True``,
            ``info["TimeLimit.truncated"]=True``, the observation the learner last
            saw or the one a moved env reached as ``info["terminal_observation"]``).
            Lost and hung envs get reward 0 (their step never happened); moved envs
            keep the reward and info of the step they just made. ``"deferred"``: the
            step's result is not handed out (an error is raised, or the vec env is not
            stepping): the truncation is reported in the next step. ``"reset"``: only
            the reset infos get the marker.
        """
        for rebuild in rebuilds:
            for i in rebuild.group.env_indices:
                marker = rebuild.markers[i]
                terminal = self.obs_row(i) if self.has_obs else None
                if during == "step":
                    self._truncate(i, marker, terminal, keep_step=rebuild.moved(i))
                elif during == "deferred" and terminal is not None:
                    self._deferred[i] = (marker, terminal)
            self.take_reset(rebuild.group, rebuild.reply)
            for i in rebuild.group.env_indices:
                self.reset_infos[i][INFO_KEY] = rebuild.markers[i]
                if during == "reset":
                    self._reset_markers[i] = rebuild.markers[i]

    def _truncate(self, i: int, marker: dict[str, Any], terminal: Any, keep_step: bool) -> None:
        if keep_step:  # moved after a step it made: its reward and info stand
            info = self.infos[i]
            if not self.dones[i]:
                info["terminal_observation"] = terminal
                info["TimeLimit.truncated"] = True
        else:
            info = {"TimeLimit.truncated": True}
            if terminal is not None:
                info["terminal_observation"] = terminal
            self.rewards[i] = 0.0
            self.infos[i] = info
        info[INFO_KEY] = marker
        self.dones[i] = True

    def apply_deferred(self) -> None:
        """Report, in the step just written, the envs rebuilt since the previous step."""
        for i, (marker, terminal) in self._deferred.items():
            self._truncate(i, marker, terminal, keep_step=False)
        self._deferred.clear()

    def deferred_envs(self) -> list[int]:
        """The envs whose truncation the next step reports (rebuilt since the last step)."""
        return sorted(self._deferred)

    def forget_deferred(self) -> None:
        """Drop deferred reports (a reset starts new episodes everywhere), and the markers of the last reset."""
        self._deferred.clear()
        self._reset_markers.clear()

    # ------------------------------------------------------------------ reading
    def obs_row(self, i: int) -> Any:
        """A copy of env ``i``'s observation."""
        if self._single:
            return self.obs[None][i].copy()
        if isinstance(self.observation_space, gym.spaces.Tuple):
            return tuple(self.obs[k][i].copy() for k in self.keys)
        return {k: self.obs[k][i].copy() for k in self.keys}

    def observations(self) -> VecEnvObs:
        """A copy of the observations, as SB3 expects them."""
        if self._single:  # what dict_to_obs would return, without its checks
            return self.obs[None].copy()
        return dict_to_obs(self.observation_space, {k: np.copy(v) for k, v in self.obs.items()})

    def result(self) -> VecEnvStepReturn:
        """The step's ``(obs, rewards, dones, infos)``; the arrays are copies."""
        # the info dicts are fresh objects built for this step, so a shallow list copy is enough
        return self.observations(), np.copy(self.rewards), np.copy(self.dones), list(self.infos)
