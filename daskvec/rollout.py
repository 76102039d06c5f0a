"""Client side of worker-side rollouts: the policy shipped, and the fragments brought back.

:meth:`daskvec.DaskVecEnv.collect_rollout` sends every env group one
:class:`~daskvec.protocol.RolloutRequest` (built by :class:`PolicyShipment`), collects
the groups' fragments as one outcome of the pool, recollects the fragment of a group
whose worker was lost (from the rebuilt envs), and returns a :class:`Rollout`: the
fragments stitched into ``(n_steps, n_envs)`` arrays in env order. The learner
(:mod:`daskvec.sb3`) then replays the rollout step by step with :meth:`Rollout.feed`,
which writes each step into the vec env's step buffers exactly as a synchronous
``step_wait`` would: SB3's info dicts, truncations of rebuilt envs and the vec env's
state come from the same code.

What a lost worker costs (see docs/rollouts.md): its fragment. Its envs are rebuilt
elsewhere and, as on the synchronous path, report a truncation at the rollout's first
step (reward 0, ``TimeLimit.truncated``, the last observation seen as
``terminal_observation``); the rest of the rollout is recollected from the rebuilt envs.
The learner computes the first step's actions, values and log-probabilities of those
envs itself (:attr:`Rollout.missing`), as SB3's loop would have before stepping.
"""

from __future__ import annotations

import itertools
import logging
import secrets
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from daskvec.cluster import dumps_by_value
from daskvec.errors import DaskVecEnvError, WorkerLostError
from daskvec.pool import Group, StepOutcome
from daskvec.protocol import Command, RolloutReply, RolloutRequest
from daskvec.recovery import Rebuild

if TYPE_CHECKING:
    from daskvec.vec_env import DaskVecEnv

logger = logging.getLogger(__name__)

__all__ = ["PolicyShipment", "Rollout", "collect_rollout"]

#: Policy versions: unique across learners and client processes (a random start).
_VERSIONS = itertools.count(secrets.randbits(40) << 16)

#: How many times a lost fragment is recollected before the rollout gives up.
_ATTEMPTS = 4


class PolicyShipment:
    """What a rollout ships of the learner's policy.

    The policy's class and constructor arguments are pickled once per version (a new
    version when the learner's policy object is replaced, e.g. by ``set_parameters``
    or ``load``); its ``state_dict`` is taken as NumPy arrays at every :meth:`update`.
    A worker rebuilds its copy only when the version changes.

    Attributes
    ----------
    version : int
        Current version (unique across learners).
    blob : bytes
        cloudpickled ``(policy class, constructor arguments)``.
    state : dict of str to numpy.ndarray
        The weights at the last :meth:`update`.
    seed : int or None
        The rollout's sampling seed given to the last :meth:`update`.
    """

    def __init__(self) -> None:
        self._policy: weakref.ref[Any] | None = None
        self.version = -1
        self.blob = b""
        self.state: dict[str, np.ndarray] = {}
        self.seed: int | None = None

    def update(self, policy: Any, seed: int | None = None) -> PolicyShipment:
        """Take ``policy``'s current weights (and, for a new policy object, its class and arguments).

        ``seed`` seeds the workers' action sampling for the next rollout (each group
        derives its own stream from it).
        """
        self.seed = seed
        if self._policy is None or self._policy() is not policy:
            params = policy._get_constructor_parameters()
            try:
                self.blob = dumps_by_value((type(policy), params))
            except Exception as e:
                raise TypeError(
                    f"the policy {type(policy).__name__} cannot be pickled for the workers ({e}); "
                    "worker-side rollouts need a policy class and policy_kwargs that cloudpickle can pickle"
                ) from e
            self.version = next(_VERSIONS)
            self._policy = weakref.ref(policy)
        self.state = {k: v.detach().cpu().numpy() for k, v in policy.state_dict().items()}
        return self

    def request(self, n_steps: int, obs_norm: dict[str, Any] | None = None) -> RolloutRequest:
        """The request every group gets for a rollout of ``n_steps``."""
        if self.version < 0:
            raise RuntimeError("PolicyShipment.update(policy) must be called before request()")
        return RolloutRequest(self.version, self.blob, self.state, int(n_steps), obs_norm, self.seed)


@dataclass(eq=False)
class _Part:
    """One group's fragment and the vec-step its first step is (0, or 1 when recollected)."""

    group: Group
    reply: RolloutReply
    offset: int


@dataclass(eq=False)
class Rollout:
    """A rollout collected on the workers, in env order.

    Attributes
    ----------
    n_steps, n_envs : int
        Vec-steps collected, and envs.
    obs : numpy.ndarray
        ``(n_steps + 1, n_envs, ...)``: raw observations before each step, then the last
        (before any move at the end of the rollout).
    actions : numpy.ndarray
        ``(n_steps, n_envs, ...)``: the policy's raw actions.
    values, log_probs : numpy.ndarray
        ``(n_steps, n_envs)``, ``float32``.
    rewards : numpy.ndarray
        ``(n_steps, n_envs)``: raw rewards (0 for a lost env's truncated first step).
    missing : numpy.ndarray
        Env indices whose first step was lost with their worker: their actions, values
        and log-probabilities at step 0 are for the learner to fill (:meth:`fill_first`).
    terminal_values : dict of (int, int) to float
        By ``(step, env index)``: the worker's value of the last observation of each
        episode truncated there (see :meth:`terminal_value`).
    rebuilds, moved : list of Rebuild
        Groups rebuilt after a loss (reported at step 0) and moved at the end
        (reported at the last step), as on the synchronous path.
    env_seconds, policy_seconds, wall_seconds : float
        The slowest group's time in its envs and in the policy; the collection's wall time.
    """

    n_steps: int
    n_envs: int
    obs: np.ndarray
    actions: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    missing: np.ndarray
    terminal_values: dict[tuple[int, int], float] = field(default_factory=dict)
    rebuilds: list[Rebuild] = field(default_factory=list)
    moved: list[Rebuild] = field(default_factory=list)
    env_seconds: float = 0.0
    policy_seconds: float = 0.0
    wall_seconds: float = 0.0
    _parts: list[_Part] = field(default_factory=list, repr=False)
    _venv: Any = field(default=None, repr=False)

    def terminal_value(self, t: int, i: int) -> float | None:
        """The worker's ``V(terminal observation)`` of env ``i`` truncated at step ``t``, if it computed one."""
        return self.terminal_values.get((t, i))

    def fill_first(self, actions: np.ndarray, values: np.ndarray, log_probs: np.ndarray) -> None:
        """Set the step-0 policy outputs of the :attr:`missing` envs (rows in that order)."""
        self.actions[0, self.missing] = actions
        self.values[0, self.missing] = np.asarray(values, dtype=np.float32).reshape(-1)
        self.log_probs[0, self.missing] = np.asarray(log_probs, dtype=np.float32).reshape(-1)

    def feed(self, t: int) -> VecEnvStepReturn:
        """Write step ``t`` into the vec env's buffers and return what ``step_wait`` would have.

        Steps must be fed in order, once each.
        """
        venv = self._venv
        for part in self._parts:
            if t >= part.offset:
                venv._take_step(part.group, part.reply.step(t - part.offset))
        if t == 0:
            venv._buffers.apply_deferred()
            venv._buffers.report_rebuilds(self.rebuilds, "step")
        if t == self.n_steps - 1:
            venv._buffers.report_rebuilds(self.moved, "step")
        venv._recovery.steps += 1
        return venv._buffers.result()


# --------------------------------------------------------------------------- collecting
def collect_rollout(
    venv: DaskVecEnv, shipment: PolicyShipment, n_steps: int, obs_norm: dict[str, Any] | None, timeout: float
) -> Rollout:
    """Collect a rollout on ``venv``'s groups (see :meth:`daskvec.DaskVecEnv.collect_rollout`)."""
    started = time.perf_counter()
    pool = venv._pool_or_raise()
    parts: dict[Group, _Part] = {}
    rebuilds: list[Rebuild] = []
    outcome = _run(pool, list(pool.groups), shipment.request(n_steps, obs_norm), parts, 0, timeout)
    for attempt in range(_ATTEMPTS + 1):
        if outcome.lost:
            if attempt == _ATTEMPTS:
                lost = sorted(i for g in outcome.lost for i in g.env_indices)
                raise WorkerLostError(f"the rollout fragments of envs {lost} were lost {_ATTEMPTS + 1} times",
                                      env_indices=lost, worker=next(iter(outcome.lost)).worker)  # fmt: skip
            new = _rebuild(venv, outcome.lost, timeout)
            rebuilds = [r for r in rebuilds if r.group not in outcome.lost] + new
        if outcome.errors:
            outcome.errors[0][1].raise_()
        if not outcome.lost or n_steps == 1:
            break
        # the rest of the rollout, from the rebuilt envs' first observations
        again = [r.group for r in new]
        outcome = _run(pool, again, shipment.request(n_steps - 1, obs_norm), parts, 1, timeout)
    try:
        moved = venv._recovery.migrate()
    except WorkerLostError as e:
        venv._break(e)
        raise
    rollout = _stitch(venv, n_steps, list(parts.values()), rebuilds)
    rollout.moved = moved
    rollout.wall_seconds = time.perf_counter() - started
    return rollout


def _run(
    pool: Any, groups: list[Group], request: RolloutRequest, parts: dict[Group, _Part], offset: int, timeout: float
) -> StepOutcome:
    """Send ``request`` to ``groups`` and collect their fragments into ``parts``."""

    def take(g: Group, reply: RolloutReply) -> None:
        parts[g] = _Part(g, reply, offset)

    pool.send(lambda g: (Command.ROLLOUT, (request,)), groups)
    outcome: StepOutcome = pool.collect(timeout, take, RolloutReply)
    return outcome


def _rebuild(venv: DaskVecEnv, lost: dict[Group, BaseException], timeout: float) -> list[Rebuild]:
    """Rebuild lost groups elsewhere, as a synchronous step would (or break the vec env)."""
    try:
        return venv._recovery.handle_lost(lost, timeout)
    except WorkerLostError as e:
        venv._break(e)
        raise


def _stitch(venv: DaskVecEnv, n_steps: int, parts: list[_Part], rebuilds: list[Rebuild]) -> Rollout:
    """The fragments as ``(n_steps, n_envs)`` arrays in env order."""
    n = venv.num_envs
    ref = parts[0].reply if parts else None
    obs0 = venv._buffers.obs[None]
    obs = np.zeros((n_steps + 1, *obs0.shape), dtype=obs0.dtype)
    obs[0] = obs0
    if ref is not None:
        actions = np.zeros((n_steps, n, *ref.actions.shape[2:]), dtype=ref.actions.dtype)
    else:
        actions = np.zeros((n_steps, n, *(venv.action_space.shape or ())), dtype=np.float32)
    rollout = Rollout(
        n_steps, n, obs, actions,
        values=np.zeros((n_steps, n), dtype=np.float32),
        log_probs=np.zeros((n_steps, n), dtype=np.float32),
        rewards=np.zeros((n_steps, n), dtype=np.float64),
        missing=np.array(sorted(i for r in rebuilds for i in r.group.env_indices), dtype=np.intp),
        rebuilds=rebuilds, _parts=parts, _venv=venv,
    )  # fmt: skip
    for r in rebuilds:
        rollout.obs[1, r.group.index] = r.reply.obs
    for part in parts:
        _place(rollout, part)
    return rollout


def _place(rollout: Rollout, part: _Part) -> None:
    """Copy one fragment into the rollout's rows of its envs, from step ``part.offset`` on."""
    rows, k, reply = part.group.index, part.offset, part.reply
    steps = reply.n_steps
    if k + steps != rollout.n_steps:
        raise DaskVecEnvError(
            f"daskvec internal error: a fragment of {steps} steps from step {k} in a rollout of {rollout.n_steps}"
        )
    rollout.obs[k : k + steps + 1, rows] = reply.obs
    rollout.actions[k:, rows] = reply.actions
    rollout.values[k:, rows] = reply.values
    rollout.log_probs[k:, rows] = reply.log_probs
    rollout.rewards[k:, rows] = reply.rewards
    rollout.env_seconds = max(rollout.env_seconds, reply.env_seconds)
    rollout.policy_seconds = max(rollout.policy_seconds, reply.policy_seconds)
    indices = part.group.env_indices
    for t, by_pos in reply.terminal_values.items():
        for pos, value in by_pos.items():
            rollout.terminal_values[(t + k, indices[pos])] = value
