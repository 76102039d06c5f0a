"""PPO and A2C that collect their rollouts on the Dask workers: :class:`DaskPPO`, :class:`DaskA2C`.

They are Stable-Baselines3's ``PPO`` and ``A2C`` with the same constructor and
``learn()``; only ``collect_rollouts`` differs, and only when the env is a
:class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor`` and ``VecNormalize``).
Then each rollout ships the policy's weights to every env group once, each group runs
its envs for ``n_steps`` on its worker with a CPU copy of the policy, and the client
fills the ``RolloutBuffer`` from the fragments as ``OnPolicyAlgorithm.collect_rollouts``
would: the same buffer contents, the truncation bootstrap
``reward += gamma * V(terminal_obs)``, ``num_timesteps``, ``ep_info_buffer``, a
``callback.on_step()`` per vec-step with ``locals`` updated (returning ``False`` stops
training), ``on_rollout_end``, and the progress bar. A network round trip is then paid
once per rollout instead of once per vec-step.

Anything else falls back to SB3's own loop: a non-daskvec env silently (the classes
are then exactly PPO and A2C); with ``use_sde``, a Dict or Tuple observation space, or
another VecEnv wrapper (``VecFrameStack``, ``VecTransposeImage``, ...), with one warning.
See docs/rollouts.md.

The off-policy learners :class:`DaskSAC`, :class:`DaskTD3`, :class:`DaskDDPG` and
:class:`DaskDQN` (:mod:`daskvec.offpolicy`, docs/offpolicy.md) are exported here too.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecMonitor, VecNormalize

from daskvec.rollout import PolicyShipment, Rollout
from daskvec.sb3_logger import DaskVecEnvMetrics
from daskvec.vec_env import DaskVecEnv
from daskvec.worker.rollout import normalize_obs

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from daskvec.offpolicy import DaskDDPG, DaskDQN, DaskSAC, DaskTD3

__all__ = [
    "DaskA2C",
    "DaskDDPG",
    "DaskDQN",
    "DaskPPO",
    "DaskSAC",
    "DaskTD3",
    "DaskVecEnvMetrics",
    "RolloutPlan",
    "plan_rollouts",
]

#: The off-policy learners, defined in :mod:`daskvec.offpolicy` (which builds on this module).
_OFF_POLICY = ("DaskDDPG", "DaskDQN", "DaskSAC", "DaskTD3")


def __getattr__(name: str) -> Any:
    # imported when first asked for: daskvec.offpolicy imports this module
    if name in _OFF_POLICY:
        from daskvec import offpolicy

        return getattr(offpolicy, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: Wrappers whose effect is reproduced faithfully around worker-side rollouts.
SUPPORTED_WRAPPERS = (VecMonitor, VecNormalize)


@dataclass
class RolloutPlan:
    """How a learner's env is laid out for worker-side rollouts.

    Attributes
    ----------
    venv : DaskVecEnv
        The vec env at the bottom.
    wrappers : list of VecEnvWrapper
        From the outermost to the one directly on ``venv``.
    normalize : VecNormalize or None
        The ``VecNormalize``, if any (always the outermost wrapper).
    """

    venv: DaskVecEnv
    wrappers: list[VecEnvWrapper]
    normalize: VecNormalize | None


def plan_rollouts(env: VecEnv, model: Any) -> tuple[RolloutPlan | None, str]:
    """Whether ``model`` can collect rollouts on ``env``'s workers; if not, why.

    Returns
    -------
    (RolloutPlan or None, str)
        The plan, or ``None`` and the reason (``""`` when ``env`` is not a DaskVecEnv
        at all: no warning is due).
    """
    wrappers: list[VecEnvWrapper] = []
    inner: Any = env
    while isinstance(inner, VecEnvWrapper):
        wrappers.append(inner)
        inner = inner.venv
    if not isinstance(inner, DaskVecEnv):
        return None, ""
    odd = [type(w).__name__ for w in wrappers if type(w) not in SUPPORTED_WRAPPERS]
    if odd:
        return None, f"the VecEnv wrappers {odd} are not supported (only VecMonitor and VecNormalize)"
    norms = [w for w in wrappers if isinstance(w, VecNormalize)]
    if len(norms) > 1 or (norms and wrappers[0] is not norms[0]):
        return None, "a VecNormalize is supported only as the single, outermost wrapper"
    if getattr(model, "use_sde", False):
        return None, "use_sde=True (state-dependent exploration noise is sampled on the client)"
    if isinstance(inner.observation_space, (spaces.Dict, spaces.Tuple)):
        return None, f"the observation space {type(inner.observation_space).__name__} is not supported"
    return RolloutPlan(inner, wrappers, norms[0] if norms else None), ""


class _Frozen:
    """A ``VecNormalize``'s statistics as they stand at the start of a rollout."""

    def __init__(self, vn: VecNormalize | None) -> None:
        self.obs: dict[str, Any] | None = None
        self.ret_var: np.ndarray | None = None
        self.vn = vn
        if vn is None:
            return
        if vn.norm_obs:
            rms: Any = vn.obs_rms
            self.obs = {"mean": np.copy(rms.mean), "var": np.copy(rms.var), "epsilon": vn.epsilon,
                        "clip": vn.clip_obs}  # fmt: skip
        if vn.norm_reward:
            self.ret_var = np.copy(vn.ret_rms.var)

    def obs_of(self, raw: np.ndarray) -> np.ndarray:
        return normalize_obs(raw, self.obs)

    def rewards_of(self, raw: np.ndarray) -> np.ndarray:
        if self.vn is None:
            return raw
        if self.ret_var is None:
            return raw.astype(np.float32)
        scaled = np.clip(raw / np.sqrt(self.ret_var + self.vn.epsilon), -self.vn.clip_reward, self.vn.clip_reward)
        return scaled.astype(np.float32)


class _Replay:
    """Pass each fed step through the VecEnv wrappers, as if the vec env had returned it."""

    def __init__(self, plan: RolloutPlan) -> None:
        self.plan = plan
        self._step: Any = None

    def step_wait(self) -> Any:
        return self._step

    def __call__(self, result: Any) -> Any:
        if not self.plan.wrappers:
            return result
        bottom = self.plan.wrappers[-1]
        obs, rewards, dones, infos = result
        # wrappers may change infos in place (VecNormalize normalises terminal observations)
        self._step = (obs, rewards, dones, [dict(info) for info in infos])
        bottom.venv = self  # type: ignore[assignment]
        try:
            return self.plan.wrappers[0].step_wait()
        finally:
            bottom.venv = self.plan.venv
            self._step = None


class _WorkerRollouts(OnPolicyAlgorithm):
    """``collect_rollouts`` on the workers when the env allows it (see the module doc)."""

    _daskvec_shipment: PolicyShipment | None = None
    _daskvec_warned: bool = False

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_daskvec_shipment", "_daskvec_warned"]

    def collect_rollouts(
        self, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer, n_rollout_steps: int
    ) -> bool:
        """Collect experiences with the current policy and fill a ``RolloutBuffer``.

        As ``OnPolicyAlgorithm.collect_rollouts``, with the envs run on the workers when
        ``env`` is a :class:`~daskvec.DaskVecEnv` (see :mod:`daskvec.sb3`).
        """
        plan, reason = plan_rollouts(env, self)
        if plan is None:
            if reason and not self._daskvec_warned:
                self._daskvec_warned = True
                warnings.warn(f"{type(self).__name__}: collecting rollouts with SB3's own loop because {reason}; "
                              "every vec-step then pays a round trip to the workers", stacklevel=2)  # fmt: skip
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        return self._collect_on_workers(plan, env, callback, rollout_buffer, n_rollout_steps)

    def _collect_on_workers(
        self, plan: RolloutPlan, env: VecEnv, callback: BaseCallback, rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:  # fmt: skip
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        rollout_buffer.reset()
        callback.on_rollout_start()
        if self._daskvec_shipment is None:
            self._daskvec_shipment = PolicyShipment()
        frozen = _Frozen(plan.normalize)
        # the workers' sampling seed, drawn from the learner's torch stream (seeded by ``seed=``)
        seed = int(th.randint(0, 2**31 - 1, (1,)).item())
        shipment = self._daskvec_shipment.update(self.policy, seed)
        rollout = plan.venv.collect_rollout(shipment, n_rollout_steps, frozen.obs)
        self._fill_missing(rollout)
        replay = _Replay(plan)
        n_steps = 0
        while n_steps < n_rollout_steps:
            t = n_steps
            obs = frozen.obs_of(rollout.obs[t])
            if t == 0 and rollout.missing.size:
                obs = np.array(obs, dtype=np.asarray(self._last_obs).dtype)
                obs[rollout.missing] = np.asarray(self._last_obs)[rollout.missing]
            obs_tensor = obs_as_tensor(obs, self.device)  # for callbacks reading locals, as in SB3's loop
            actions = rollout.actions[t].copy()
            values = th.as_tensor(rollout.values[t]).reshape(-1, 1)
            log_probs = th.as_tensor(rollout.log_probs[t])
            clipped_actions = self._env_actions(actions)
            fed = plan.venv.replay(rollout, t)
            raw_obs, raw_rewards, _, raw_infos = np.asarray(fed[0]), fed[1], fed[2], fed[3]
            new_obs, rewards, dones, infos = replay(fed)
            if plan.normalize is not None:  # the stats the policy saw, frozen for the rollout
                new_obs, rewards = frozen.obs_of(raw_obs), frozen.rewards_of(raw_rewards)
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            self._bootstrap(rollout, t, dones, infos, raw_infos, rewards, frozen)
            rollout_buffer.add(obs, actions, rewards, self._last_episode_starts, values, log_probs)  # type: ignore[arg-type]
            self._last_obs = new_obs
            self._last_episode_starts = dones
        with th.no_grad():
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        return True

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The actions the envs were given (as SB3's loop computes them; for ``locals``)."""
        if isinstance(self.action_space, spaces.Box):
            if self.policy.squash_output:
                return self.policy.unscale_action(actions)
            return np.clip(actions, self.action_space.low, self.action_space.high)
        return actions

    def _fill_missing(self, rollout: Rollout) -> None:
        """The first step of envs whose worker was lost: the policy's outputs, computed here."""
        if not rollout.missing.size:
            return
        with th.no_grad():
            obs_tensor = obs_as_tensor(np.asarray(self._last_obs)[rollout.missing], self.device)
            actions, values, log_probs = self.policy(obs_tensor)
        rollout.fill_first(actions.cpu().numpy(), values.cpu().numpy(), log_probs.cpu().numpy())

    def _bootstrap(
        self, rollout: Rollout, t: int, dones: np.ndarray, infos: list[dict[str, Any]],
        raw_infos: list[dict[str, Any]], rewards: np.ndarray, frozen: _Frozen,
    ) -> None:  # fmt: skip
        """``reward += gamma * V(terminal_obs)`` for truncated episodes (SB3 issue 633)."""
        for idx, done in enumerate(dones):
            if not (
                done
                and infos[idx].get("terminal_observation") is not None
                and infos[idx].get("TimeLimit.truncated", False)
            ):
                continue
            value = rollout.terminal_value(t, idx)
            if value is not None:
                terminal_value = th.tensor([value], dtype=th.float32)
            else:  # a truncation the worker did not see (a lost or moved env)
                last = frozen.obs_of(np.asarray(raw_infos[idx]["terminal_observation"]))
                with th.no_grad():
                    terminal_value = self.policy.predict_values(self.policy.obs_to_tensor(last)[0])[0]
            rewards[idx] += self.gamma * terminal_value


class DaskPPO(_WorkerRollouts, PPO):
    """Stable-Baselines3's ``PPO``, collecting its rollouts on the Dask workers.

    Same constructor, ``learn()``, saving and loading as ``PPO``. When the env is a
    :class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor`` and an outermost
    ``VecNormalize``), each rollout ships the policy's weights once to every env group,
    which runs its envs for ``n_steps`` on its worker (one torch thread); the rollout
    buffer is then filled on the client exactly as PPO's own loop fills it. Otherwise
    it is PPO (with one warning when a DaskVecEnv is under unsupported wrappers or
    ``use_sde=True``). See :mod:`daskvec.sb3` and docs/rollouts.md.

    Examples
    --------
    >>> from stable_baselines3.common.env_util import make_vec_env
    >>> from daskvec import DaskVecEnv
    >>> from daskvec.sb3 import DaskPPO
    >>> env = make_vec_env("CartPole-v1", n_envs=64, vec_env_cls=DaskVecEnv)  # doctest: +SKIP
    >>> DaskPPO("MlpPolicy", env, device="cpu").learn(100_000)  # doctest: +SKIP
    """


class DaskA2C(_WorkerRollouts, A2C):
    """Stable-Baselines3's ``A2C``, collecting its rollouts on the Dask workers (see :class:`DaskPPO`)."""
