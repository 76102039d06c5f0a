"""Worker side of a rollout: run a group's envs for ``n_steps`` with a copy of the policy.

A :class:`~daskvec.protocol.rollout_records.RolloutRequest` carries the learner's policy (class and
constructor arguments, pickled once per version, and its weights as NumPy arrays).
:func:`run_rollout` keeps one CPU copy of the policy per group, rebuilt only when the
version changes, loads the weights, and then does on the worker what
``OnPolicyAlgorithm.collect_rollouts`` does on the client for each step: the policy's
actions, values and log-probabilities for the current observations, actions clipped to
a Box space (or unscaled for a squashed policy) before the envs step, the raw actions
kept. The envs are stepped by the group's own :meth:`~daskvec.worker.EnvGroup.step`, so
episode ends, resets and restarts after env errors are exactly those of a synchronous
step. For every truncated (not terminated) episode the value of its last observation is
computed with the same policy, for the learner's bootstrap. Frame stacks and image
transpositions of the learner's VecEnv wrappers are repeated on the way from the envs
to the policy (:mod:`daskvec.worker.obs`); the fragment carries the envs' own
observations, which the client replays through its wrappers.

torch and Stable-Baselines3 are imported when the first rollout arrives, never when the
worker imports :mod:`daskvec.worker`; torch then runs on one thread.
"""

from __future__ import annotations

import logging
import time
import weakref
from typing import TYPE_CHECKING, Any

import cloudpickle
import gymnasium as gym
import numpy as np

from daskvec.protocol.messages import StepReply
from daskvec.protocol.rollout_records import RolloutReply, RolloutRequest
from daskvec.worker.obs import ObsChain

if TYPE_CHECKING:
    from daskvec.worker.env_group import EnvGroup

logger = logging.getLogger(__name__)

__all__ = ["run_rollout"]

#: Each group's copy of the policy: (version, policy).
_POLICIES: weakref.WeakKeyDictionary[Any, tuple[int, Any]] = weakref.WeakKeyDictionary()


class _Untrained:
    """Stands in for the optimizer of a worker's copy of the policy, which is never trained.

    SB3's policies build their optimizer in their constructor. Building a torch optimizer
    imports ``torch._dynamo`` and with it ``sympy`` (about 800 modules): seconds on the
    first rollout of every worker process, a replacement worker's included, for an object a
    worker never uses. It keeps the arguments it was given, for a reader.
    """

    def __init__(self, params: Any, lr: float = 0.0, **kwargs: Any) -> None:
        self.lr = lr
        self.kwargs = kwargs
        self.param_groups: list[dict[str, Any]] = []


def _policy(group: EnvGroup, request: RolloutRequest) -> Any:
    """The group's copy of the policy at ``request.version``, with ``request.state`` loaded."""
    import torch as th

    cached = _POLICIES.get(group)
    if cached is None or cached[0] != request.version:
        th.set_num_threads(1)
        cls, kwargs = cloudpickle.loads(request.policy)
        if "optimizer_class" in kwargs:  # an on-policy ActorCriticPolicy; off-policy actors have none
            kwargs = {**kwargs, "optimizer_class": _Untrained}
        policy = cls(**kwargs).to("cpu")
        policy.set_training_mode(False)
        _POLICIES[group] = cached = (request.version, policy)
        logger.info("env group %s built policy %s (version %d)", group.env_indices, cls.__name__, request.version)
    policy = cached[1]
    state = {k: th.from_numpy(np.array(v, copy=True)) for k, v in request.state.items()}
    policy.load_state_dict(state)
    return policy


def _env_actions(policy: Any, actions: np.ndarray, space: gym.Space[Any]) -> np.ndarray:
    """What the envs are given, as ``OnPolicyAlgorithm.collect_rollouts`` computes it."""
    if isinstance(space, gym.spaces.Box):
        if policy.squash_output:
            return np.asarray(policy.unscale_action(actions))
        return np.clip(actions, space.low, space.high)
    return actions


def _stack(seq: list[Any]) -> Any:
    if isinstance(seq[0], dict):
        return {k: np.stack([o[k] for o in seq]) for k in seq[0]}
    return np.stack(seq)


class _Fragment:
    """The columns of a rollout as it is run, step by step."""

    def __init__(self, first_obs: Any) -> None:
        self.obs = [first_obs]
        self.actions: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.log_probs: list[np.ndarray] = []
        self.rewards: list[np.ndarray] = []
        self.terminated: list[np.ndarray] = []
        self.truncated: list[np.ndarray] = []
        empty = np.empty(0)
        self.reply = RolloutReply(None, empty, empty, empty, empty, empty, empty)

    def sparse(self, t: int, name: str, values: dict[int, Any]) -> None:
        if values:
            getattr(self.reply, name)[t] = values

    def finish(self) -> RolloutReply:
        r = self.reply
        r.obs = _stack(self.obs)
        r.actions = np.stack(self.actions)
        r.values = np.stack(self.values).astype(np.float32, copy=False)
        r.log_probs = np.stack(self.log_probs).astype(np.float32, copy=False)
        r.rewards = np.stack(self.rewards)
        r.terminated = np.stack(self.terminated)
        r.truncated = np.stack(self.truncated)
        return r


def run_rollout(group: EnvGroup, request: RolloutRequest) -> RolloutReply:
    """Run ``group``'s envs for ``request.n_steps`` vec-steps with the shipped policy.

    Parameters
    ----------
    group : EnvGroup
        The group, reset at least once (its envs continue from where they are).
    request : RolloutRequest
        The policy, its weights, the number of steps and any frozen observation
        statistics.

    Returns
    -------
    RolloutReply
        The fragment; raw observations (before normalisation) and raw actions.

    Raises
    ------
    RuntimeError
        The group's envs were never reset.
    ValueError
        ``n_steps`` is not positive.
    """
    if group.last_obs is None:
        raise RuntimeError("the env group was never reset; call reset() on the vec env before collecting a rollout")
    if request.n_steps < 1:
        raise ValueError(f"a rollout needs n_steps >= 1, not {request.n_steps}")
    import torch as th
    from stable_baselines3.common.utils import obs_as_tensor

    policy = _policy(group, request)
    if request.seed is not None:
        # a seeded learner gets the same samples run after run; groups sharing a worker
        # each get a stream of their own
        th.manual_seed(int(np.random.SeedSequence([request.seed, group.env_indices[0]]).generate_state(1)[0]))
    space = group.envs[0].action_space
    frag = _Fragment(group.last_obs)
    pipeline = request.obs_pipeline
    chain = ObsChain(pipeline, group.last_obs, request.obs_norm)
    # the learner's own step-0 input when it sent one: the envs' buffer rows begin with it
    seen = pipeline.first if pipeline is not None and pipeline.first is not None else chain.seen
    restack = pipeline.restack if pipeline is not None else ()
    for t in range(request.n_steps):
        t0 = time.perf_counter()
        with th.no_grad():
            actions, values, log_probs = policy(obs_as_tensor(seen, th.device("cpu")))
        raw = actions.numpy()
        frag.reply.policy_seconds += time.perf_counter() - t0
        step = group.step(_env_actions(policy, raw, space))
        frag.reply.env_seconds += step.env_seconds
        frag.actions.append(raw)
        frag.values.append(values.numpy().reshape(-1))
        frag.log_probs.append(log_probs.numpy().reshape(-1))
        frag.rewards.append(step.rewards)
        frag.terminated.append(step.terminated)
        frag.truncated.append(step.truncated)
        frag.obs.append(step.obs)
        for name in ("final_obs", "infos", "reset_infos", "restarted"):
            frag.sparse(t, name, getattr(step, name))
        t0 = time.perf_counter()
        terminals = chain.step(step.obs, step.dones, step.final_obs, restack if t == 0 else ())
        seen = chain.seen
        frag.sparse(t, "terminal_values", _terminal_values(policy, step, terminals))
        frag.reply.policy_seconds += time.perf_counter() - t0
    return frag.finish()


def _terminal_values(policy: Any, step: StepReply, terminals: dict[int, Any]) -> dict[int, float]:
    """``V(last observation)`` of each episode of ``step`` that was truncated, not terminated.

    ``terminals``: by position, the episodes' last observations as the policy sees them.
    """
    import torch as th

    out: dict[int, float] = {}
    for pos in np.flatnonzero(step.truncated & ~step.terminated).tolist():
        if terminals.get(pos) is None:
            continue
        obs = policy.obs_to_tensor(terminals[pos])[0]
        with th.no_grad():
            out[pos] = float(policy.predict_values(obs)[0].item())
    return out
