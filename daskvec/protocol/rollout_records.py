"""Protocol, rollouts: the records of worker-side rollouts and off-policy collections.

A :attr:`~daskvec.protocol.messages.Command.ROLLOUT` or
:attr:`~daskvec.protocol.messages.Command.OFF_POLICY` request carries a :class:`RolloutRequest`
(the policy, how many steps, the observation pipeline of the client's VecEnv wrappers,
an off-policy collection's :class:`ExplorationPlan`); the group answers with a
:class:`RolloutReply`, a fragment of ``n_steps`` steps as columns, whose
:meth:`RolloutReply.step` gives back each step as the :class:`~daskvec.protocol.messages.StepReply`
a synchronous step would have given. :mod:`daskvec.protocol.messages` holds the commands and
the replies of single steps, resets and calls.

Like :mod:`daskvec.protocol.messages`, this module is imported by every worker process: it stays
free of Stable-Baselines3, torch and Dask.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from daskvec.protocol.messages import EMPTY, StepReply

__all__ = [
    "ExplorationPlan",
    "FrameStack",
    "OUNoise",
    "ObsPipeline",
    "RolloutReply",
    "RolloutRequest",
    "TransposeImage",
]


@dataclass(slots=True, eq=False)
class RolloutRequest:
    """Ask a group to run its envs for ``n_steps`` with a copy of the learner's policy.

    Built by :class:`daskvec._core.rollouts.PolicyShipment`; answered by
    :func:`daskvec.worker.on_policy.run_rollout`.

    Attributes
    ----------
    version : int
        The policy's version: the worker rebuilds its copy only when it changes.
    policy : bytes
        cloudpickled ``(policy class, constructor keyword arguments)``, pickled once
        per version on the client.
    state : dict of str to numpy.ndarray
        The policy's ``state_dict`` as arrays, sent with every rollout.
    n_steps : int
        Vec-steps to run.
    obs_norm : dict or None
        Frozen observation statistics of a ``VecNormalize`` on top of the vec env
        (``mean``, ``var``, ``epsilon``, ``clip``), or ``None``: the policy sees the
        raw observations.
    seed : int or None
        Seeds the worker's torch random stream for this rollout (with the group's first
        env index, so that groups sample independently); ``None`` leaves it alone.
    obs_pipeline : ObsPipeline or None
        What the VecEnv wrappers between the envs and the policy do to the
        observations (frame stacks, transpositions), with their state; ``None``: the
        policy sees the envs' observations (normalised with ``obs_norm``).
    explore : ExplorationPlan or None
        For an off-policy collection (:attr:`Command.OFF_POLICY`): the random actions
        and action noise of every step, decided on the client; ``policy`` is then the
        learner's actor (or Q-network).
    """

    version: int
    policy: bytes
    state: dict[str, np.ndarray]
    n_steps: int
    obs_norm: dict[str, Any] | None = None
    seed: int | None = None
    obs_pipeline: ObsPipeline | None = None
    explore: ExplorationPlan | None = None

    def with_fewer_steps(self, by: int) -> RolloutRequest:
        """The same request for ``by`` fewer steps (the rest of a rollout, recollected).

        The rest starts from rebuilt envs, which the client reports done in the step
        before: their frame stacks start again, as ``VecFrameStack`` restarts them.
        """
        pipeline = None if self.obs_pipeline is None else self.obs_pipeline.with_fresh_stacks()
        return dataclasses.replace(self, n_steps=self.n_steps - by, obs_pipeline=pipeline)

    def for_envs(self, env_indices: Sequence[int]) -> RolloutRequest:
        """The request for the group holding ``env_indices``: its rows of the pipeline's state and exploration plan."""
        if self.obs_pipeline is None and self.explore is None:
            return self
        return dataclasses.replace(
            self,
            obs_pipeline=None if self.obs_pipeline is None else self.obs_pipeline.rows(env_indices),
            explore=None if self.explore is None else self.explore.rows(env_indices),
        )


@dataclass(frozen=True, slots=True)
class FrameStack:
    """``VecFrameStack``'s frame stacking (SB3's ``StackedObservations``), for the workers to repeat.

    Attributes
    ----------
    n_stack : int
        Frames per stack.
    keys : tuple
        The observation's entries it stacks: ``(None,)`` for a single array, the names
        of a Dict space's entries (every entry is stacked).
    channels_first : tuple of bool
        Per key: stacked along an observation's first axis (else its last).
    dtypes : tuple of str
        Per key: the dtype of the stacked observations (the wrapped space's).
    """

    n_stack: int
    keys: tuple[str | None, ...]
    channels_first: tuple[bool, ...]
    dtypes: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TransposeImage:
    """``VecTransposeImage``: images from height x width x channels to channels x height x width.

    Attributes
    ----------
    keys : tuple
        The entries it transposes: ``(None,)`` for a single array, the image entries of a Dict space.
    """

    keys: tuple[str | None, ...]


@dataclass(frozen=True, slots=True, eq=False)
class ObsPipeline:
    """The VecEnv wrappers between a group's envs and the policy, as a rollout's workers repeat them.

    ``VecMonitor`` changes no observation and has no stage; a ``VecNormalize``
    normalises with :attr:`RolloutRequest.obs_norm` after :attr:`norm_at` stages.

    Attributes
    ----------
    stages : tuple of FrameStack or TransposeImage
        From the envs up: the wrapper nearest the vec env first.
    stacks : tuple
        One entry per :class:`FrameStack` stage: its stacked observations (an array,
        or a dict by key), a row per env, as the client's wrapper holds them before the
        rollout; ``()``: every stack starts afresh from the envs' current observations
        (zeros, then the observation), as ``VecFrameStack`` starts it after a reset.
    first : array, dict of arrays or None
        The policy's input before the first step, a row per env (after any
        ``VecNormalize``: what the learner's rollout buffer holds at step 0); ``None``:
        made from :attr:`stacks` and the envs' current observations.
    restack : tuple of int
        Rows whose stacks restart after the first step: envs rebuilt since the last
        step, which the client reports done in the first step.
    norm_at : int or None
        How many stages come before the ``VecNormalize`` (the others are above it);
        ``None``: after every stage.
    """

    stages: tuple[FrameStack | TransposeImage, ...] = ()
    stacks: tuple[Any, ...] = ()
    first: Any = None
    restack: tuple[int, ...] = ()
    norm_at: int | None = None

    def rows(self, env_indices: Sequence[int]) -> ObsPipeline:
        """The pipeline of the envs ``env_indices`` (rows of the state; :attr:`restack` as their positions)."""
        idx = np.asarray(env_indices, dtype=np.intp)
        wanted = set(self.restack)
        return dataclasses.replace(
            self,
            stacks=tuple(_rows(s, idx) for s in self.stacks),
            first=None if self.first is None else _rows(self.first, idx),
            restack=tuple(pos for pos, i in enumerate(env_indices) if i in wanted),
        )

    def with_fresh_stacks(self) -> ObsPipeline:
        """The same stages with every stack started again from the envs' current observations."""
        return ObsPipeline(self.stages, norm_at=self.norm_at)


def _rows(obs: Any, idx: np.ndarray) -> Any:
    if isinstance(obs, dict):
        return {k: v[idx] for k, v in obs.items()}
    return obs[idx]


@dataclass(slots=True, eq=False)
class RolloutReply:
    """A group's rollout fragment: ``n_steps`` steps of its envs, as columns.

    Arrays have the step first and the group's envs second. Episode ends, resets and
    infos are those of ``n_steps`` :class:`StepReply` objects, kept sparse by
    step, then by position; :meth:`step` gives them back one step at a time, so that the
    client builds SB3's info dicts exactly as for a synchronous step.

    Attributes
    ----------
    obs : array or dict of arrays
        ``(n_steps + 1, n)``: the raw observation before each step, then the last one.
    actions : numpy.ndarray
        ``(n_steps, n, ...)``: the policy's actions, before clipping to a Box space.
    values, log_probs : numpy.ndarray
        ``(n_steps, n)``, ``float32``: the policy's outputs for ``obs[t]``.
    rewards : numpy.ndarray
        ``(n_steps, n)``, ``float64``, as the envs returned them.
    terminated, truncated : numpy.ndarray
        ``(n_steps, n)``, ``bool``.
    final_obs, infos, reset_infos, restarted : dict of int to dict of int to object
        By step, then by position, as in :class:`StepReply`; steps with none are absent.
    terminal_values : dict of int to dict of int to float
        By step and position: ``V(final observation)`` of every episode truncated (not
        terminated), by the same policy, for the learner's bootstrap.
    env_seconds, policy_seconds : float
        Wall time in the envs and in the policy.
    """

    obs: Any
    actions: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, dict[int, Any]] = field(default_factory=dict)
    infos: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    reset_infos: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    restarted: dict[int, dict[int, dict[str, Any]]] = field(default_factory=dict)
    terminal_values: dict[int, dict[int, float]] = field(default_factory=dict)
    env_seconds: float = 0.0
    policy_seconds: float = 0.0

    @property
    def n_steps(self) -> int:
        """Steps in the fragment."""
        return len(self.rewards)

    @property
    def dones(self) -> np.ndarray:
        """``terminated | truncated``, ``(n_steps, n)``."""
        return self.terminated | self.truncated

    def step(self, t: int) -> StepReply:
        """Step ``t`` of the fragment as the :class:`StepReply` a synchronous step would have given."""
        obs = {k: v[t + 1] for k, v in self.obs.items()} if isinstance(self.obs, dict) else self.obs[t + 1]
        return StepReply(
            obs,
            self.rewards[t],
            self.terminated[t],
            self.truncated[t],
            final_obs=self.final_obs.get(t, EMPTY),
            infos=self.infos.get(t, EMPTY),
            reset_infos=self.reset_infos.get(t, EMPTY),
            restarted=self.restarted.get(t, EMPTY),
        )


@dataclass(frozen=True, slots=True)
class OUNoise:
    """One env's Ornstein-Uhlenbeck action noise, as Stable-Baselines3's ``OrnsteinUhlenbeckActionNoise`` holds it.

    Attributes
    ----------
    theta, dt : float
        Rate of mean reversion and time step.
    mu, sigma : numpy.ndarray
        Mean and scale, shaped as one action.
    initial : numpy.ndarray or None
        The state a reset returns to (``None``: zeros).
    prev : numpy.ndarray
        The state at the start of the collection.
    dtype : numpy.dtype
        The noise values' type.
    """

    theta: float
    mu: np.ndarray
    sigma: np.ndarray
    dt: float
    initial: np.ndarray | None
    prev: np.ndarray
    dtype: Any

    def next(self, prev: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(state, noise value)`` from state ``prev`` and standard normal draws ``z``.

        The same operations in the same order as SB3's ``__call__``, so that client and
        worker get the same bits.
        """
        noise = prev + self.theta * (self.mu - prev) * self.dt + self.sigma * np.sqrt(self.dt) * z
        return noise, noise.astype(self.dtype)

    def reset_state(self) -> np.ndarray:
        """The state after an episode's end (SB3's ``reset``)."""
        return self.initial if self.initial is not None else np.zeros_like(self.mu)


@dataclass(slots=True, eq=False)
class ExplorationPlan:
    """How an off-policy learner explores during one collection of ``n_steps`` vec-steps.

    Everything random that Stable-Baselines3's ``OffPolicyAlgorithm.collect_rollouts``
    draws on the client (the warm-up's and epsilon-greedy's uniform actions, the
    action noise's normal draws) is drawn on the client in advance, with the same
    calls in the same order, and travels with the request; each group is sent its
    envs' rows (:meth:`rows`, :func:`daskvec.worker.off_policy.run_off_policy`).

    Attributes
    ----------
    n_steps : int
        Vec-steps of the whole collection (a recollected fragment runs the last ones).
    random_actions : dict of int to numpy.ndarray
        By step: every env's action, in the action space's own scale, for the steps
        taken at random (before ``learning_starts``, or when DQN's epsilon draw says so);
        the policy acts at the other steps.
    noise : numpy.ndarray or None
        ``(n_steps, n_envs, *action shape)``: the Gaussian noise values, or, with
        :attr:`ou`, the standard normal draws of the Ornstein-Uhlenbeck process;
        ``None``: no action noise.
    ou : tuple of OUNoise or None
        One per env when the noise is Ornstein-Uhlenbeck.
    """

    n_steps: int
    random_actions: dict[int, np.ndarray] = field(default_factory=dict)
    noise: np.ndarray | None = None
    ou: tuple[OUNoise, ...] | None = None

    def rows(self, indices: Sequence[int]) -> ExplorationPlan:
        """The plan of the envs ``indices`` only, in that order."""
        idx = list(indices)
        return ExplorationPlan(
            self.n_steps,
            {t: np.asarray(a)[idx] for t, a in self.random_actions.items()},
            None if self.noise is None else self.noise[:, idx],
            None if self.ou is None else tuple(self.ou[i] for i in idx),
        )
