"""PPO and A2C that collect their rollouts on the Dask workers: :class:`DaskPPO`, :class:`DaskA2C`.

They are Stable-Baselines3's ``PPO`` and ``A2C`` with the same constructor and
``learn()``; only ``collect_rollouts`` differs, and only when the env is a
:class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor``, ``VecFrameStack`` and
``VecTransposeImage`` in any order, and one ``VecNormalize`` above them, under
``VecTransposeImage`` at most, as SB3 puts it). Then each rollout ships the
policy's weights (``MlpPolicy``, ``CnnPolicy``, ``MultiInputPolicy`` alike) to every env
group once, with the frame stacks the client's wrappers hold; each group runs its envs
for ``n_steps`` on its worker with a CPU copy of the policy, stacking and transposing
their frames as the wrappers would; and the client replays the fragments' raw steps
through its own wrappers and fills the ``RolloutBuffer`` as
``OnPolicyAlgorithm.collect_rollouts`` would: the same buffer contents, the truncation
bootstrap ``reward += gamma * V(terminal_obs)``, ``num_timesteps``, ``ep_info_buffer``,
a ``callback.on_step()`` per vec-step with ``locals`` updated (returning ``False`` stops
training), ``on_rollout_end``, the progress bar, and the wrappers' own state. A network
round trip is then paid once per rollout instead of once per vec-step.

Anything else falls back to SB3's own loop: a non-daskvec env silently (the classes
are then exactly PPO and A2C); with ``use_sde``, a Tuple observation space, another
VecEnv wrapper, or a ``VecNormalize`` under another wrapper, with one warning. See
docs/rollouts.md.

Users import the learners from :mod:`daskvec.sb3`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import (
    VecEnv,
    VecEnvWrapper,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn
from stable_baselines3.common.vec_env.stacked_observations import StackedObservations

from daskvec._core.rollouts import PolicyShipment, Rollout
from daskvec.learners.ahead import Ahead, CollectAhead
from daskvec.protocol.rollout_records import FrameStack, ObsPipeline, TransposeImage
from daskvec.sb3.vec_env import DaskVecEnv
from daskvec.worker.obs import normalize_obs

logger = logging.getLogger(__name__)

__all__ = ["DaskA2C", "DaskPPO", "RolloutPlan", "obs_stages", "plan_rollouts"]

#: Rows of the rollout buffer valued in one forward pass when a rollout collected ahead is revalued.
REVALUE_BATCH = 2048
#: Wrappers whose effect is reproduced faithfully around worker-side rollouts.
SUPPORTED_WRAPPERS = (VecMonitor, VecNormalize, VecFrameStack, VecTransposeImage)


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
        The ``VecNormalize``, if any (only ``VecTransposeImage`` wrappers above it).
    stages : tuple of FrameStack or TransposeImage
        What the wrappers do to the observations, from the vec env up, for the
        workers to repeat (see :func:`obs_stages`).
    norm_at : int
        How many of the stages are below the ``VecNormalize``.
    """

    venv: DaskVecEnv
    wrappers: list[VecEnvWrapper]
    normalize: VecNormalize | None
    stages: tuple[FrameStack | TransposeImage, ...] = ()
    norm_at: int = 0

    @classmethod
    def of(cls, venv: DaskVecEnv, wrappers: list[VecEnvWrapper]) -> RolloutPlan:
        """The plan of ``wrappers`` (outermost first) on ``venv``, as they are (see :func:`plan_rollouts`)."""
        normalize = next((w for w in wrappers if isinstance(w, VecNormalize)), None)
        stages = obs_stages(wrappers)
        norm_at = len(obs_stages(wrappers[wrappers.index(normalize) + 1 :])) if normalize else len(stages)
        return cls(venv, wrappers, normalize, stages, norm_at)

    def pipeline(self, first: Any) -> ObsPipeline:
        """The stages with the frame stacks the wrappers hold now, and the policy's input ``first``."""
        stacks = tuple(_stacked(w.stacked_obs) for w in reversed(self.wrappers) if isinstance(w, VecFrameStack))
        return ObsPipeline(self.stages, stacks, first, norm_at=self.norm_at)

    def seen(self, below: Any, frozen: _NormalizeSnapshot) -> Any:
        """Observations from below the ``VecNormalize`` as the policy sees them (frozen statistics)."""
        obs = frozen.obs_of(below)
        above = self.wrappers[: self.wrappers.index(self.normalize)] if self.normalize is not None else []
        for w in reversed(above):
            assert isinstance(w, VecTransposeImage), "plan_rollouts allows only VecTransposeImage above VecNormalize"
            obs = w.transpose_observations(obs)
        return obs


def _stacked(stacked: StackedObservations[Any]) -> Any:
    """A ``StackedObservations``' current stacks: an array, or a dict by key."""
    if hasattr(stacked, "sub_stacked_observations"):
        return {k: sub.stacked_obs for k, sub in stacked.sub_stacked_observations.items()}
    return stacked.stacked_obs


def obs_stages(wrappers: Sequence[VecEnvWrapper]) -> tuple[FrameStack | TransposeImage, ...]:
    """What the ``VecFrameStack`` and ``VecTransposeImage`` among ``wrappers`` do to the observations.

    Parameters
    ----------
    wrappers : sequence of VecEnvWrapper
        From the outermost to the innermost. Other wrappers have no stage: they leave
        the observations as they are (``VecMonitor``) or are the caller's to handle
        (``VecNormalize``).

    Returns
    -------
    tuple of FrameStack or TransposeImage
        The stages from the vec env up.
    """
    stages: list[FrameStack | TransposeImage] = []
    for w in reversed(wrappers):
        if isinstance(w, VecFrameStack):
            so: Any = w.stacked_obs
            subs = getattr(so, "sub_stacked_observations", {None: so})
            stages.append(
                FrameStack(
                    so.n_stack,
                    tuple(subs),
                    tuple(bool(sub.channels_first) for sub in subs.values()),
                    tuple(sub.stacked_obs.dtype.str for sub in subs.values()),
                )
            )
        elif isinstance(w, VecTransposeImage) and not w.skip:
            if isinstance(w.venv.observation_space, spaces.Dict):
                if w.image_space_keys:
                    stages.append(TransposeImage(tuple(w.image_space_keys)))
            else:
                stages.append(TransposeImage((None,)))
    return tuple(stages)


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
        names = ", ".join(c.__name__ for c in SUPPORTED_WRAPPERS)
        return None, f"the VecEnv wrappers {odd} are not supported (only {names})"
    norms = [n for n, w in enumerate(wrappers) if isinstance(w, VecNormalize)]
    # above a VecNormalize its frozen statistics must be what the policy sees: only transpositions may follow
    if len(norms) > 1 or (norms and any(not isinstance(w, VecTransposeImage) for w in wrappers[: norms[0]])):
        return None, "a VecNormalize is supported only as the single, outermost wrapper (or under VecTransposeImage)"
    if getattr(model, "use_sde", False):
        return None, "use_sde=True (state-dependent exploration noise is sampled on the client)"
    space = inner.observation_space
    subspaces = space.spaces.values() if isinstance(space, spaces.Dict) else ()
    if isinstance(space, spaces.Tuple) or any(isinstance(s, (spaces.Dict, spaces.Tuple)) for s in subspaces):
        return None, f"the observation space {space} is not supported (a Tuple, or a Dict of Dict or Tuple spaces)"
    return RolloutPlan.of(inner, wrappers), ""


class _NormalizeSnapshot:
    """A ``VecNormalize``'s statistics as they stand at the start of a rollout."""

    def __init__(self, vn: VecNormalize | None) -> None:
        self.obs: dict[str, Any] | None = None
        self.ret_var: np.ndarray | None = None
        self.vn = vn
        if vn is None:
            return
        if vn.norm_obs:
            rms: Any = vn.obs_rms
            if isinstance(rms, dict):  # a Dict space: the norm_obs_keys
                mean: Any = {k: np.copy(r.mean) for k, r in rms.items()}
                var: Any = {k: np.copy(r.var) for k, r in rms.items()}
            else:
                mean, var = np.copy(rms.mean), np.copy(rms.var)
            self.obs = {"mean": mean, "var": var, "epsilon": vn.epsilon, "clip": vn.clip_obs}
        if vn.norm_reward:
            self.ret_var = np.copy(vn.ret_rms.var)

    def obs_of(self, raw: Any) -> Any:
        return normalize_obs(raw, self.obs)

    def rewards_of(self, raw: np.ndarray) -> np.ndarray:
        if self.vn is None:
            return raw
        if self.ret_var is None:
            return raw.astype(np.float32)
        scaled = np.clip(raw / np.sqrt(self.ret_var + self.vn.epsilon), -self.vn.clip_reward, self.vn.clip_reward)
        return scaled.astype(np.float32)


class _FixedStepVecEnv:
    """A stand-in vec env under a wrapper, whose ``step_wait`` returns the step it was given."""

    def __init__(self, step: VecEnvStepReturn) -> None:
        self.step = step

    def step_wait(self) -> VecEnvStepReturn:
        return self.step


@dataclass
class _Replayed:
    """One fed step after the wrappers: what the learner's loop sees, and what the policy sees."""

    new_obs: Any
    rewards: np.ndarray
    dones: np.ndarray
    infos: list[dict[str, Any]]
    #: the observations and info dicts below the VecNormalize (the top's, without one)
    below: Any
    below_infos: list[dict[str, Any]]
    plan: RolloutPlan
    frozen: _NormalizeSnapshot

    def seen(self) -> Any:
        """The observations as the workers' policy saw them (frame stacks, frozen normalisation)."""
        return self.plan.seen(self.below, self.frozen) if self.plan.normalize is not None else self.new_obs

    def terminal_seen(self, idx: int) -> Any:
        """Env ``idx``'s ``terminal_observation`` as the workers' policy would see it."""
        terminal = self.below_infos[idx]["terminal_observation"]
        return self.plan.seen(terminal, self.frozen) if self.plan.normalize is not None else terminal


class _Replay:
    """Pass each fed step through the VecEnv wrappers, as if the vec env had returned it.

    Each wrapper's ``step_wait`` runs on the step from the one below, so that their
    state (frame stacks, episode counters, running statistics) moves as in SB3's loop.
    """

    def __init__(self, plan: RolloutPlan, frozen: _NormalizeSnapshot) -> None:
        self.plan = plan
        self.frozen = frozen

    def __call__(self, fed: VecEnvStepReturn) -> _Replayed:
        step = fed
        below: tuple[Any, list[dict[str, Any]]] | None = None
        for w in reversed(self.plan.wrappers):
            if w is self.plan.normalize:
                # VecNormalize normalises the terminal observations in place: keep them as they came
                below = (step[0], [_copy_info(i) for i in step[3]])
            inner = w.venv
            w.venv = _FixedStepVecEnv(step)  # type: ignore[assignment]
            try:
                step = w.step_wait()
            finally:
                w.venv = inner
        obs, rewards, dones, infos = step
        if below is None:
            below = (obs, infos)
        return _Replayed(obs, rewards, dones, infos, below[0], below[1], self.plan, self.frozen)


def _flat(steps: np.ndarray) -> np.ndarray:
    """Rows of a buffer's ``(steps, n_envs, ...)`` block as one batch of ``steps * n_envs``."""
    return steps.reshape(-1, *steps.shape[2:])


def _copy_info(info: dict[str, Any]) -> dict[str, Any]:
    out = dict(info)
    if isinstance(out.get("terminal_observation"), dict):
        out["terminal_observation"] = dict(out["terminal_observation"])
    return out


class _WorkerRollouts(CollectAhead, OnPolicyAlgorithm):
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
        ``env`` is a :class:`~daskvec.DaskVecEnv` (see :mod:`daskvec.learners.on_policy`).
        """
        plan, reason = plan_rollouts(env, self)
        if plan is None:
            self._drop_ahead("the env is no longer one daskvec collects on")
            if reason and not self._daskvec_warned:
                self._daskvec_warned = True
                warnings.warn(
                    f"{type(self).__name__}: collecting rollouts with SB3's own loop because {reason}; "
                    "every vec-step then pays a round trip to the workers",
                    stacklevel=2,
                )
            return super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
        try:
            return self._collect_on_workers(plan, env, callback, rollout_buffer, n_rollout_steps)
        finally:
            self._returned()

    def _send_rollout(self, plan: RolloutPlan, n_steps: int) -> Ahead:
        """Ship the current weights and start a rollout on the workers, from the learner's last observations."""
        if self._daskvec_shipment is None:
            self._daskvec_shipment = PolicyShipment()
        frozen = _NormalizeSnapshot(plan.normalize)
        # the policy's input before step 0; with a VecNormalize, the observations below it
        # normalised with this rollout's frozen statistics
        obs: Any = self._last_obs if plan.normalize is None else plan.seen(plan.normalize.old_obs, frozen)
        # the workers' sampling seed, drawn from the learner's torch stream (seeded by ``seed=``)
        seed = int(th.randint(0, 2**31 - 1, (1,)).item())
        shipment = self._daskvec_shipment.update(self.policy, seed)
        pending = plan.venv.start_rollout(shipment, n_steps, frozen.obs, plan.pipeline(obs))
        return Ahead(plan.venv, n_steps, pending, frozen, obs=obs, updates=self._n_updates)

    def _collect_on_workers(
        self,
        plan: RolloutPlan,
        env: VecEnv,
        callback: BaseCallback,
        rollout_buffer: RolloutBuffer,
        n_rollout_steps: int,
    ) -> bool:
        assert self._last_obs is not None, "No previous observation was provided"
        self.policy.set_training_mode(False)
        rollout_buffer.reset()
        callback.on_rollout_start()
        arrived = self._arrive(plan.venv, n_rollout_steps, lambda: self._send_rollout(plan, n_rollout_steps))
        rollout, lag = arrived.rollout, arrived.lag
        frozen, obs = arrived.ahead.frozen, arrived.ahead.obs
        self._fill_missing(rollout, obs)
        replay = _Replay(plan, frozen)
        n_steps = 0
        while n_steps < n_rollout_steps:
            t = n_steps
            obs_tensor = obs_as_tensor(obs, self.device)  # for callbacks reading locals, as in SB3's loop
            actions = rollout.actions[t].copy()
            values = th.as_tensor(rollout.values[t]).reshape(-1, 1)
            log_probs = th.as_tensor(rollout.log_probs[t])
            clipped_actions = self._env_actions(actions)
            step = replay(plan.venv.replay(rollout, t))
            new_obs, rewards, dones, infos = step.seen(), step.rewards, step.dones, step.infos
            if plan.normalize is not None:  # the stats the policy saw, frozen for the rollout
                rewards = frozen.rewards_of(plan.normalize.get_original_reward())
            self.num_timesteps += env.num_envs
            callback.update_locals(locals())
            if not callback.on_step():
                return False
            self._update_info_buffer(infos, dones)
            n_steps += 1
            if isinstance(self.action_space, spaces.Discrete):
                actions = actions.reshape(-1, 1)
            self._bootstrap(rollout, t, step, rewards, workers_values=not lag)
            rollout_buffer.add(obs, actions, rewards, self._last_episode_starts, values, log_probs)  # type: ignore[arg-type]
            self._last_obs = obs = new_obs
            self._last_episode_starts = dones
        with th.no_grad():
            values = self.policy.predict_values(obs_as_tensor(new_obs, self.device))
        if lag:
            # advantages from the value function being trained, as the last step's bootstrap
            # is (docs/rollouts.md, "Collecting ahead"); the ratio stays against the behaviour
            # policy's own log-probabilities, which the workers recorded
            self._revalue(rollout_buffer)
        rollout_buffer.compute_returns_and_advantage(last_values=values, dones=dones)
        callback.update_locals(locals())
        callback.on_rollout_end()
        # after on_rollout_end, which may still use the env (a curriculum's env_method) or
        # change the policy for the next rollout, as in the synchronous mode
        self._send_ahead(lag, lambda: self._send_rollout(plan, n_rollout_steps))
        return True

    def _revalue(self, buffer: RolloutBuffer) -> None:
        """Replace the buffer's values with the learner's current value function's.

        In batches of whole vec-steps (at least one; at most :data:`REVALUE_BATCH` rows, and
        no more than PPO's ``batch_size``, which training already holds at once): one forward
        pass per vec-step cost as much as the rest of the replay.
        """
        obs: Any = buffer.observations
        rows_at_once = min(REVALUE_BATCH, getattr(self, "batch_size", None) or REVALUE_BATCH)
        steps = max(1, rows_at_once // buffer.n_envs)
        with th.no_grad():
            for t in range(0, buffer.buffer_size, steps):
                rows = slice(t, t + steps)
                chunk = {k: _flat(v[rows]) for k, v in obs.items()} if isinstance(obs, dict) else _flat(obs[rows])
                values = self.policy.predict_values(obs_as_tensor(chunk, self.device))
                buffer.values[rows] = values.cpu().numpy().reshape(-1, buffer.n_envs)

    def _env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The actions the envs were given (as SB3's loop computes them; for ``locals``)."""
        if isinstance(self.action_space, spaces.Box):
            if self.policy.squash_output:
                return self.policy.unscale_action(actions)
            return np.clip(actions, self.action_space.low, self.action_space.high)
        return actions

    def _fill_missing(self, rollout: Rollout, obs: Any) -> None:
        """The first step of envs whose worker was lost: the policy's outputs for ``obs``, computed here."""
        if not rollout.missing.size:
            return
        rows = rollout.missing
        lost = {k: np.asarray(v)[rows] for k, v in obs.items()} if isinstance(obs, dict) else np.asarray(obs)[rows]
        with th.no_grad():
            actions, values, log_probs = self.policy(obs_as_tensor(lost, self.device))
        rollout.fill_first(actions.cpu().numpy(), values.cpu().numpy(), log_probs.cpu().numpy())

    def _bootstrap(
        self, rollout: Rollout, t: int, step: _Replayed, rewards: np.ndarray, workers_values: bool = True
    ) -> None:
        """``reward += gamma * V(terminal_obs)`` for truncated episodes (as SB3 does since its #633).

        ``workers_values``: use the value the worker computed with the shipped policy;
        otherwise (a rollout collected ahead) the learner's current value function's.
        """
        infos = step.infos
        for idx, done in enumerate(step.dones):
            if not (
                done
                and infos[idx].get("terminal_observation") is not None
                and infos[idx].get("TimeLimit.truncated", False)
            ):
                continue
            value = rollout.terminal_value(t, idx) if workers_values else None
            if value is not None:
                terminal_value = th.tensor([value], dtype=th.float32)
            else:  # a truncation the worker did not see (a lost or moved env)
                with th.no_grad():
                    terminal = self.policy.obs_to_tensor(step.terminal_seen(idx))[0]
                    terminal_value = self.policy.predict_values(terminal)[0]
            rewards[idx] += self.gamma * terminal_value


class DaskPPO(_WorkerRollouts, PPO):
    """Stable-Baselines3's ``PPO``, collecting its rollouts on the Dask workers.

    Same constructor, ``learn()``, saving and loading as ``PPO``. When the env is a
    :class:`~daskvec.DaskVecEnv` (possibly under ``VecMonitor``, ``VecFrameStack``,
    ``VecTransposeImage`` and a ``VecNormalize`` above them), each rollout ships the
    policy's weights once to every env group, which runs its envs for ``n_steps`` on its
    worker (one torch thread); the rollout buffer is then filled on the client exactly
    as PPO's own loop fills it, and the wrappers are left as PPO's loop leaves them.
    Otherwise it is PPO (with one warning when a DaskVecEnv is under unsupported
    wrappers or ``use_sde=True``). See :mod:`daskvec.learners.on_policy` and docs/rollouts.md.

    Parameters
    ----------
    *args, **kwargs
        ``PPO``'s own.
    collect_ahead : {0, 1}, default 0
        ``1``: the workers collect the next rollout while the learner trains on this
        one, with the weights shipped before that training (the learner trains
        pi_{k+1} on data of pi_k: a policy lag of one version, never
        more). The importance ratio is taken against the log-probabilities the workers
        recorded, and the advantages are computed with the learner's current value
        function. ``0``: each rollout is collected after training on the one before,
        as PPO does (docs/rollouts.md, "Collecting ahead").

    Examples
    --------
    >>> from stable_baselines3.common.env_util import make_vec_env
    >>> from daskvec import DaskVecEnv
    >>> from daskvec.learners.on_policy import DaskPPO
    >>> env = make_vec_env("CartPole-v1", n_envs=64, vec_env_cls=DaskVecEnv)  # doctest: +SKIP
    >>> DaskPPO("MlpPolicy", env, device="cpu").learn(100_000)  # doctest: +SKIP
    """


class DaskA2C(_WorkerRollouts, A2C):
    """Stable-Baselines3's ``A2C``, collecting its rollouts on the Dask workers (see :class:`DaskPPO`)."""
