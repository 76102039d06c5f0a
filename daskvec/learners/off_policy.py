"""Off-policy learners that collect on the Dask workers: :class:`DaskSAC`, :class:`DaskTD3`, :class:`DaskDQN`.

Stable-Baselines3's off-policy loop (``OffPolicyAlgorithm.collect_rollouts``) keeps the
policy fixed while it collects ``train_freq`` vec-steps, as the on-policy loop does for
``n_steps``. These classes are SAC, TD3, DDPG and DQN with the same constructor and
``learn()``; when the env is a :class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor``
and an outermost ``VecNormalize``) and ``train_freq`` is ``(k, "step")`` with ``k > 1``,
each collection is one :attr:`~daskvec.protocol.messages.Command.OFF_POLICY` request per env
group, through the same machinery as :class:`~daskvec.learners.on_policy.DaskPPO`'s rollouts
(:class:`~daskvec._core.rollouts.PolicyShipment`, :func:`~daskvec._core.rollouts.collect_rollout`,
:meth:`DaskVecEnv.replay <daskvec.DaskVecEnv.replay>`):

1. the client draws, with the same calls in the same order as SB3's loop, everything
   random that loop draws on the client for the ``k`` steps (the uniform actions before
   ``learning_starts``, DQN's epsilon draws at the rate its schedule gives at each step
   and its uniform actions, the action noise's normal draws) into an
   :class:`~daskvec.protocol.rollout_records.ExplorationPlan`;
2. the actor (SAC's and TD3's ``policy.actor``, DQN's ``policy.q_net``) is shipped and
   each group runs its envs for ``k`` steps (:mod:`daskvec.worker.off_policy`);
3. the client replays the ``k`` steps as SB3's loop would have taken them: the VecEnv
   wrappers, ``num_timesteps``, ``callback.on_step()`` (``False`` stops), the episode
   infos, ``_store_transition`` (terminal observations as ``next_obs``, timeouts,
   VecNormalize's original observations and rewards), the progress, ``_on_step``
   (DQN's target updates and exploration rate), the noise resets at episode ends and
   ``dump_logs``: SB3's own methods, called in SB3's order.

A network round trip is then paid once per collection instead of once per vec-step.
Anything else is SB3's own loop: a non-daskvec env or ``train_freq`` of one step
silently; an ``"episode"`` unit, ``use_sde``, ``HerReplayBuffer``, a Dict or Tuple
observation space, an action noise other than Normal or Ornstein-Uhlenbeck, another
VecEnv wrapper, or an overridden ``_sample_action``/``predict`` with one warning. See
docs/offpolicy.md.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import DDPG, DQN, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.noise import (
    ActionNoise,
    NormalActionNoise,
    OrnsteinUhlenbeckActionNoise,
    VectorizedActionNoise,
)
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import RolloutReturn, TrainFreq, TrainFrequencyUnit
from stable_baselines3.common.vec_env import VecEnv, VecMonitor, VecNormalize
from stable_baselines3.dqn.policies import DQNPolicy
from stable_baselines3.her.her_replay_buffer import HerReplayBuffer
from stable_baselines3.sac.policies import SACPolicy
from stable_baselines3.td3.policies import TD3Policy

from daskvec._core.rollouts import PolicyShipment, Rollout
from daskvec.learners.ahead import Ahead, CollectAhead
from daskvec.learners.on_policy import RolloutPlan, _NormalizeSnapshot, _Replay, plan_rollouts
from daskvec.protocol.rollout_records import ExplorationPlan, OUNoise
from daskvec.worker.off_policy import explore_actions

logger = logging.getLogger(__name__)

__all__ = ["DaskDDPG", "DaskDQN", "DaskSAC", "DaskTD3", "plan_off_policy"]

#: The only wrappers replayed around an off-policy collection (the workers stack no frames).
OFF_POLICY_WRAPPERS = (VecMonitor, VecNormalize)

#: Action noises whose draws and state the workers reproduce exactly.
SUPPORTED_NOISES = (NormalActionNoise, OrnsteinUhlenbeckActionNoise)

#: ``_predict`` of the policies whose actor (or Q-network) alone decides the actions.
_KNOWN_PREDICTS = (SACPolicy._predict, TD3Policy._predict, DQNPolicy._predict)


def _base_noises(action_noise: ActionNoise | None) -> list[ActionNoise]:
    """Each env's noise object (one when not vectorized)."""
    if action_noise is None:
        return []
    if isinstance(action_noise, VectorizedActionNoise):
        return list(action_noise.noises)
    return [action_noise]


def plan_off_policy(
    env: VecEnv, model: Any, train_freq: TrainFreq, action_noise: ActionNoise | None
) -> tuple[RolloutPlan | None, str]:
    """Whether ``model`` can collect on ``env``'s workers; if not, why.

    Parameters
    ----------
    env : VecEnv
        The learner's env.
    model : OffPolicyAlgorithm
        The learner.
    train_freq : TrainFreq
        How much each collection gathers.
    action_noise : ActionNoise or None
        The learner's (vectorized) action noise.

    Returns
    -------
    (RolloutPlan or None, str)
        The plan, or ``None`` and the reason (``""``: no warning is due, because
        ``env`` is not a DaskVecEnv or a collection is one vec-step, where SB3's loop
        pays the same one round trip).
    """
    plan, reason = plan_rollouts(env, model)
    if plan is None and not reason:  # not a DaskVecEnv
        return None, ""
    if train_freq.unit == TrainFrequencyUnit.STEP and train_freq.frequency == 1:
        return None, ""
    if plan is None:
        return None, reason
    odd = [type(w).__name__ for w in plan.wrappers if type(w) not in OFF_POLICY_WRAPPERS]
    if odd:
        return None, f"the VecEnv wrappers {odd} are not supported (only VecMonitor and VecNormalize)"
    if train_freq.unit != TrainFrequencyUnit.STEP:
        return None, f'train_freq counts {train_freq.unit.value}s (only "step" is collected on the workers)'
    if isinstance(model.replay_buffer, HerReplayBuffer):
        return None, "HerReplayBuffer relabels goals on the client as the episodes go"
    noises = _base_noises(action_noise)
    if noises and (
        len(noises) != env.num_envs
        or type(noises[0]) not in SUPPORTED_NOISES
        or any(type(n) is not type(noises[0]) for n in noises)
    ):
        return (
            None,
            f"the action noise {action_noise!r} is not one NormalActionNoise or OrnsteinUhlenbeckActionNoise per env",
        )
    cls = type(model)
    if cls._sample_action is not OffPolicyAlgorithm._sample_action or cls.predict not in (
        BaseAlgorithm.predict,
        DQN.predict,
    ):
        return None, f"{cls.__name__} overrides _sample_action or predict"
    if type(model.policy)._predict not in _KNOWN_PREDICTS:
        return None, f"the policy {type(model.policy).__name__} overrides _predict"
    return plan, ""


class _NoiseTrack:
    """The client's action noise during a collection, kept as SB3's loop leaves it after each step."""

    def __init__(self, noises: list[ActionNoise], explore: ExplorationPlan) -> None:
        self.noises = noises
        self.explore = explore

    def _next(self, t: int) -> list[tuple[np.ndarray, np.ndarray]]:
        ou, z = self.explore.ou, self.explore.noise
        assert ou is not None and z is not None
        return [ou[i].next(noise.noise_prev, z[t, i]) for i, noise in enumerate(self.noises)]  # type: ignore[attr-defined]

    def value(self, t: int) -> np.ndarray | None:
        """Every env's noise value at step ``t``, from the current states."""
        if self.explore.noise is None:
            return None
        if self.explore.ou is None:
            return self.explore.noise[t]
        return np.stack([value for _, value in self._next(t)])

    def drawn(self, t: int) -> None:
        """Advance each Ornstein-Uhlenbeck state by step ``t``'s draw, as SB3's ``__call__`` does."""
        if self.explore.ou is not None and self.explore.noise is not None:
            for noise, (state, _) in zip(self.noises, self._next(t), strict=True):
                noise.noise_prev = state  # type: ignore[attr-defined]


class _WorkerCollection(CollectAhead, OffPolicyAlgorithm):
    """``collect_rollouts`` on the workers when the env allows it (see the module doc)."""

    _daskvec_shipment: PolicyShipment | None = None
    _daskvec_warned: bool = False
    #: Whether the actor samples its actions (SAC): the workers' torch streams are then seeded.
    _daskvec_samples: bool = False

    def _excluded_save_params(self) -> list[str]:
        return [*super()._excluded_save_params(), "_daskvec_shipment", "_daskvec_warned"]

    def _daskvec_actor(self) -> BasePolicy:
        """The part of the policy that acts: shipped to the workers."""
        actor: BasePolicy = self.policy.actor  # type: ignore[assignment]
        return actor

    def _daskvec_epsilon(self, t: int, timesteps: int) -> float | None:
        """The epsilon-greedy rate at step ``t`` of a collection (``timesteps`` by then); ``None``: no epsilon."""
        return None

    def collect_rollouts(
        self,
        env: VecEnv,
        callback: BaseCallback,
        train_freq: TrainFreq,
        replay_buffer: ReplayBuffer,
        action_noise: ActionNoise | None = None,
        learning_starts: int = 0,
        log_interval: int | None = None,
    ) -> RolloutReturn:
        """Collect experiences and store them into a ``ReplayBuffer``.

        As ``OffPolicyAlgorithm.collect_rollouts``, with the envs run on the workers when
        ``env`` is a :class:`~daskvec.DaskVecEnv` (see :mod:`daskvec.learners.off_policy`).
        """
        plan, reason = plan_off_policy(env, self, train_freq, action_noise)
        if plan is None:
            if reason and not self._daskvec_warned:
                self._daskvec_warned = True
                warnings.warn(
                    f"{type(self).__name__}: collecting with SB3's own loop because {reason}; "
                    "every vec-step then pays a round trip to the workers",
                    stacklevel=2,
                )
            self._drop_ahead("the env is no longer one daskvec collects on")
            return super().collect_rollouts(
                env, callback, train_freq, replay_buffer, action_noise, learning_starts, log_interval
            )
        try:
            return self._collect_on_workers(
                plan, env, callback, train_freq, replay_buffer, action_noise, learning_starts, log_interval
            )
        finally:
            self._returned()

    def _explore(self, n_steps: int, n_envs: int, learning_starts: int, noises: list[ActionNoise]) -> ExplorationPlan:
        """Draw the collection's random actions and noise as SB3's ``_sample_action`` would, step after step."""
        random_actions: dict[int, np.ndarray] = {}
        draws = []
        box = isinstance(self.action_space, spaces.Box)
        ou = bool(noises) and isinstance(noises[0], OrnsteinUhlenbeckActionNoise)
        for t in range(n_steps):
            timesteps = self.num_timesteps + t * n_envs
            if timesteps < learning_starts:  # the warm-up
                random_actions[t] = np.array([self.action_space.sample() for _ in range(n_envs)])
            else:
                epsilon = self._daskvec_epsilon(t, timesteps)
                if epsilon is not None and np.random.rand() < epsilon:
                    random_actions[t] = np.array([self.action_space.sample() for _ in range(n_envs)])
            if box and noises:
                # Ornstein-Uhlenbeck's state depends on episode ends, which only the workers
                # see as they come: its normal draws travel, and each side runs the process
                step: list[Any] = [np.random.normal(size=n._mu.shape) if ou else n() for n in noises]  # type: ignore[attr-defined]
                draws.append(np.stack(step))
        records = None
        if ou:
            records = tuple(
                OUNoise(n._theta, n._mu, n._sigma, n._dt, n.initial_noise, n.noise_prev, n._dtype)  # type: ignore[attr-defined]
                for n in noises
            )
        return ExplorationPlan(n_steps, random_actions, np.stack(draws) if draws else None, records)

    def _collect_on_workers(
        self,
        plan: RolloutPlan,
        env: VecEnv,
        callback: BaseCallback,
        train_freq: TrainFreq,
        replay_buffer: ReplayBuffer,
        action_noise: ActionNoise | None,
        learning_starts: int,
        log_interval: int | None,
    ) -> RolloutReturn:
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        num_collected_steps, num_collected_episodes = 0, 0
        callback.on_rollout_start()
        continue_training = True
        n_envs, n_steps = env.num_envs, train_freq.frequency
        noises = _base_noises(action_noise)

        def send() -> Ahead:
            return self._send_collection(plan, n_steps, n_envs, learning_starts, noises)

        arrived = self._arrive(plan.venv, n_steps, send)
        rollout, frozen, explore = arrived.rollout, arrived.ahead.frozen, arrived.ahead.explore
        assert explore is not None
        noise = _NoiseTrack(noises, explore)
        self._fill_missing(rollout, explore, noise)
        replay = _Replay(plan, frozen)
        for t in range(n_steps):
            noise.drawn(t)
            buffer_actions = rollout.actions[t].copy()
            actions = self._env_actions(buffer_actions)
            step = replay(plan.venv.replay(rollout, t))
            new_obs, rewards, dones, infos = step.new_obs, step.rewards, step.dones, step.infos
            self.num_timesteps += n_envs
            num_collected_steps += 1
            callback.update_locals(locals())
            if not callback.on_step():
                return RolloutReturn(num_collected_steps * n_envs, num_collected_episodes, continue_training=False)
            self._update_info_buffer(infos, dones)
            self._store_transition(replay_buffer, buffer_actions, new_obs, rewards, dones, infos)
            self._update_current_progress_remaining(self.num_timesteps, self._total_timesteps)
            self._on_step()
            for idx, done in enumerate(dones):
                if done:
                    num_collected_episodes += 1
                    self._episode_num += 1
                    if action_noise is not None:
                        kwargs = {"indices": [idx]} if n_envs > 1 else {}
                        action_noise.reset(**kwargs)
                    if log_interval is not None and self._episode_num % log_interval == 0:
                        self.dump_logs()
        callback.on_rollout_end()
        self._send_ahead(arrived.lag, send)
        return RolloutReturn(num_collected_steps * n_envs, num_collected_episodes, continue_training)

    def _send_collection(
        self, plan: RolloutPlan, n_steps: int, n_envs: int, learning_starts: int, noises: list[ActionNoise]
    ) -> Ahead:
        """Draw what SB3 draws on the client for ``n_steps``, ship the actor and start the collection."""
        explore = self._explore(n_steps, n_envs, learning_starts, noises)
        if self._daskvec_shipment is None:
            self._daskvec_shipment = PolicyShipment()
        # SAC's sampling seed, drawn from the learner's torch stream (seeded by ``seed=``);
        # TD3's and DQN's actors sample nothing, so their learner's stream stays SB3's
        seed = int(th.randint(0, 2**31 - 1, (1,)).item()) if self._daskvec_samples else None
        shipment = self._daskvec_shipment.update(self._daskvec_actor(), seed)
        frozen = _NormalizeSnapshot(plan.normalize)
        pending = plan.venv.start_rollout(shipment, n_steps, frozen.obs, explore=explore)
        return Ahead(plan.venv, n_steps, pending, frozen, explore=explore, updates=self._n_updates)

    def _env_actions(self, buffer_actions: np.ndarray) -> np.ndarray:
        """The actions the envs were given (as SB3's ``_sample_action`` computes them; for ``locals``)."""
        if isinstance(self.action_space, spaces.Box):
            return self.policy.unscale_action(buffer_actions)
        return buffer_actions

    def _fill_missing(self, rollout: Rollout, explore: ExplorationPlan, noise: _NoiseTrack) -> None:
        """The first step of envs whose worker was lost: their buffer actions, computed here as SB3's loop would."""
        missing = rollout.missing
        if not missing.size:
            return
        random = explore.random_actions.get(0)
        if random is None:  # the policy alone: DQN's epsilon draw was made with the others
            unscaled, _ = self.policy.predict(np.asarray(self._last_obs)[missing], deterministic=False)
        else:
            unscaled = random[missing]
        values = noise.value(0)
        box = isinstance(self.action_space, spaces.Box)
        _, buffer_actions = explore_actions(self.policy, unscaled, None if values is None else values[missing], box)
        zeros = np.zeros(len(missing), dtype=np.float32)
        rollout.fill_first(np.asarray(buffer_actions), zeros, zeros)


class DaskSAC(_WorkerCollection, SAC):
    """Stable-Baselines3's ``SAC``, collecting on the Dask workers.

    Same constructor, ``learn()``, saving and loading as ``SAC``. When the env is a
    :class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor`` and an outermost
    ``VecNormalize``) and ``train_freq=(k, "step")`` with ``k > 1``, each collection
    ships the actor's weights once to every env group, which runs its envs for ``k``
    vec-steps (one torch thread, sampling from a stream seeded by the learner's); the
    replay buffer is then filled on the client as SAC's own loop fills it. Otherwise it
    is SAC (with one warning when a DaskVecEnv cannot be collected on). See
    :mod:`daskvec.learners.off_policy` and docs/offpolicy.md.

    Examples
    --------
    >>> from stable_baselines3.common.env_util import make_vec_env
    >>> from daskvec import DaskVecEnv
    >>> from daskvec.sb3 import DaskSAC
    >>> env = make_vec_env("Pendulum-v1", n_envs=16, vec_env_cls=DaskVecEnv)  # doctest: +SKIP
    >>> model = DaskSAC("MlpPolicy", env, train_freq=(16, "step"), gradient_steps=16)  # doctest: +SKIP
    >>> model.learn(20_000)  # doctest: +SKIP
    """

    _daskvec_samples = True


class DaskTD3(_WorkerCollection, TD3):
    """Stable-Baselines3's ``TD3``, collecting on the Dask workers (see :class:`DaskSAC`).

    The actor is deterministic: with the same seeds and envs, a run trains exactly as
    ``TD3``'s (action noise included).
    """


class DaskDDPG(_WorkerCollection, DDPG):
    """Stable-Baselines3's ``DDPG``, collecting on the Dask workers (see :class:`DaskTD3`)."""


class DaskDQN(_WorkerCollection, DQN):
    """Stable-Baselines3's ``DQN``, collecting on the Dask workers (see :class:`DaskSAC`).

    The Q-network is shipped; the epsilon-greedy draws are made on the client at the
    rate the exploration schedule gives at each vec-step of the collection, so that a
    seeded run explores exactly as ``DQN``'s.
    """

    def _daskvec_actor(self) -> BasePolicy:
        return self.policy.q_net

    def _daskvec_epsilon(self, t: int, timesteps: int) -> float | None:
        # SB3's loop acts at step t with the rate that _on_step set after step t - 1,
        # from the progress at its num_timesteps
        if t == 0:
            return float(self.exploration_rate)
        return float(self.exploration_schedule(1.0 - float(timesteps) / float(self._total_timesteps)))
