"""Worker side of an off-policy collection: a group's envs run ``n_steps`` with the shipped actor.

A :class:`~daskvec.protocol.rollout_records.RolloutRequest` with an
:class:`~daskvec.protocol.rollout_records.ExplorationPlan` (:attr:`Command.OFF_POLICY
<daskvec.protocol.messages.Command.OFF_POLICY>`) carries the learner's actor (SAC's and TD3's
``policy.actor``, DQN's ``policy.q_net``: class and constructor arguments pickled once
per version, weights with every collection) and what the learner drew at random for
every step, the group's rows only. :func:`run_off_policy` then does for the group's envs what
``OffPolicyAlgorithm._sample_action`` and ``collect_rollouts`` do on the client at
every vec-step: the plan's random action where it has one, otherwise the actor's
``predict(obs, deterministic=False)``; for a Box space the action scaled to [-1, 1],
the plan's noise added and clipped (Ornstein-Uhlenbeck noise advanced per env and
reset when its episode ends), and unscaled for the envs (:func:`explore_actions`,
which the client uses too). The envs are stepped by the group's own
:meth:`~daskvec.worker.EnvGroup.step`, as in an on-policy rollout, and the fragment
comes back as a :class:`~daskvec.protocol.rollout_records.RolloutReply` whose ``actions`` are what
the replay buffer stores (the scaled, noisy actions).

torch and Stable-Baselines3 are imported only when a collection arrives, as for
:mod:`daskvec.worker.on_policy`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from daskvec.protocol.rollout_records import ExplorationPlan, RolloutReply, RolloutRequest
from daskvec.worker.obs import normalize_obs
from daskvec.worker.on_policy import _Fragment, _policy

if TYPE_CHECKING:
    from daskvec.worker.env_group import EnvGroup

__all__ = ["explore_actions", "run_off_policy"]


def explore_actions(policy: Any, unscaled: np.ndarray, noise: np.ndarray | None, box: bool) -> tuple[Any, Any]:
    """``(env actions, buffer actions)`` as ``OffPolicyAlgorithm._sample_action`` computes them.

    Parameters
    ----------
    policy : stable_baselines3.common.policies.BasePolicy
        Anything with SB3's ``scale_action``/``unscale_action`` for the action space.
    unscaled : numpy.ndarray
        The actions in the space's own scale (the actor's ``predict``, or random).
    noise : numpy.ndarray or None
        Action noise, added to the scaled actions (Box spaces only).
    box : bool
        Whether the action space is a Box.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        What the envs are given, and what the replay buffer stores (scaled to [-1, 1]
        for a Box).
    """
    if not box:
        return unscaled, unscaled
    scaled = policy.scale_action(unscaled)
    if noise is not None:
        scaled = np.clip(scaled + noise, -1, 1)
    return policy.unscale_action(scaled), scaled


def _seed(group: EnvGroup, seed: int | None) -> None:
    """Seed the worker's torch stream: a seeded learner samples the same actions run after run."""
    if seed is None:
        return
    import torch as th

    # groups sharing a worker each get a stream of their own
    th.manual_seed(int(np.random.SeedSequence([seed, group.env_indices[0]]).generate_state(1)[0]))


class _Noise:
    """The plan's action noise for one group's envs, step by step."""

    def __init__(self, plan: ExplorationPlan, first: int) -> None:
        self.draws = plan.noise
        self.ou = None if plan.ou is None else list(plan.ou)
        self.state: list[np.ndarray] = []
        if self.ou is not None:
            # a fragment recollected from step ``first`` > 0 runs envs rebuilt after their
            # worker was lost: their episode ended at the step before, so their noise restarts
            self.state = [n.prev if first == 0 else n.reset_state() for n in self.ou]

    def at(self, t: int) -> np.ndarray | None:
        """The noise values of step ``t`` (advancing the Ornstein-Uhlenbeck states)."""
        if self.draws is None:
            return None
        if self.ou is None:
            return np.asarray(self.draws[t])
        values = []
        for pos, n in enumerate(self.ou):
            self.state[pos], value = n.next(self.state[pos], self.draws[t, pos])
            values.append(value)
        return np.stack(values)

    def episodes_ended(self, dones: np.ndarray) -> None:
        """Reset the states of the envs whose episode ended (SB3 resets their noise then)."""
        if self.ou is not None:
            for pos in np.flatnonzero(dones).tolist():
                self.state[pos] = self.ou[pos].reset_state()


def run_off_policy(group: EnvGroup, request: RolloutRequest) -> RolloutReply:
    """Run ``group``'s envs for ``request.n_steps`` vec-steps, exploring as ``request.explore`` says.

    Parameters
    ----------
    group : EnvGroup
        The group, reset at least once (its envs continue from where they are).
    request : RolloutRequest
        The actor, its weights, the steps to run (the last ``n_steps`` of the plan's)
        and any frozen observation statistics (the actor sees normalised observations).

    Returns
    -------
    RolloutReply
        The fragment: raw observations, the buffer's actions (scaled and noisy for a
        Box space), rewards and episode ends; values and log-probabilities are zeros.

    Raises
    ------
    RuntimeError
        The group's envs were never reset.
    ValueError
        No exploration plan, or ``n_steps`` not in ``1..plan.n_steps``.
    """
    plan = request.explore
    if plan is None:
        raise ValueError("an off-policy collection needs an ExplorationPlan (RolloutRequest.explore)")
    if group.last_obs is None:
        raise RuntimeError("the env group was never reset; call reset() on the vec env before collecting")
    if not 1 <= request.n_steps <= plan.n_steps:
        raise ValueError(f"an off-policy collection of {request.n_steps} steps from a plan of {plan.n_steps}")
    n = len(group.envs)
    if any(len(a) != n for a in plan.random_actions.values()) or (plan.noise is not None and plan.noise.shape[1] != n):
        raise ValueError(f"an exploration plan of other envs than the group's {n} (RolloutRequest.for_envs)")
    actor = _policy(group, request)
    _seed(group, request.seed)
    box = isinstance(group.envs[0].action_space, gym.spaces.Box)
    first = plan.n_steps - request.n_steps
    noise = _Noise(plan, first)
    frag = _Fragment(group.last_obs)
    zeros = np.zeros(n, dtype=np.float32)
    norm = request.obs_norm
    for t in range(first, plan.n_steps):
        t0 = time.perf_counter()
        random = plan.random_actions.get(t)
        if random is None:
            unscaled, _ = actor.predict(normalize_obs(frag.obs[-1], norm), deterministic=False)
        else:
            unscaled = np.asarray(random)
        actions, buffer_actions = explore_actions(actor, unscaled, noise.at(t), box)
        frag.reply.policy_seconds += time.perf_counter() - t0
        step = group.step(actions)
        noise.episodes_ended(step.dones)
        frag.reply.env_seconds += step.env_seconds
        frag.actions.append(np.asarray(buffer_actions))
        frag.values.append(zeros)
        frag.log_probs.append(zeros)
        frag.rewards.append(step.rewards)
        frag.terminated.append(step.terminated)
        frag.truncated.append(step.truncated)
        frag.obs.append(step.obs)
        for name in ("final_obs", "infos", "reset_infos", "restarted"):
            frag.sparse(t - first, name, getattr(step, name))
    return frag.finish()
