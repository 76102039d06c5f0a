"""Client side of worker-side rollouts: the policy shipped, and the fragments brought back.

:meth:`daskvec.DaskVecEnv.collect_rollout` sends every env group one
:class:`~daskvec.protocol.rollout_records.RolloutRequest` (built by :class:`PolicyShipment`), collects
the groups' fragments as one outcome of the pool, recollects the fragment of a group
whose worker was lost (from the rebuilt envs), and returns a :class:`Rollout`: the
fragments stitched into ``(n_steps, n_envs)`` arrays in env order. Collecting is the
engine's step lifecycle (:meth:`daskvec._core.engine.Engine.finish`), with the rebuilt and
moved groups recorded instead of written. The learner (:mod:`daskvec.learners.on_policy`) then has
the vec env replay the rollout step by step (:meth:`daskvec.DaskVecEnv.replay`),
which writes each step into its buffers exactly as a synchronous ``step_wait`` would:
SB3's info dicts, truncations of rebuilt envs and the vec env's state come from the
same code.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from daskvec._core.directory import HeartbeatWatch
from daskvec._core.engine import Engine
from daskvec._core.handles import Group, StepOutcome
from daskvec._core.recovery import Rebuild
from daskvec.cluster.clients import dumps_by_value
from daskvec.errors import DaskVecEnvError, WorkerLostError
from daskvec.protocol.messages import Command
from daskvec.protocol.rollout_records import ExplorationPlan, ObsPipeline, RolloutReply, RolloutRequest

logger = logging.getLogger(__name__)

__all__ = [
    "Collected",
    "Fragment",
    "PendingCollection",
    "PolicyShipment",
    "Rollout",
    "collect_rollout",
    "finish_collection",
    "send_collection",
]

#: Policy versions: unique across learners and client processes (a random start).
_VERSIONS = itertools.count(secrets.randbits(40) << 16)

#: How many times a lost fragment is recollected before the rollout gives up.
_ATTEMPTS = 4
#: Seconds between two looks at the heartbeats of the workers a rollout still waits for:
#: a quarter of ``step_timeout``, within these bounds.
_LOOK_MIN, _LOOK_MAX = 0.5, 5.0


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
        # copies on the CPU, whatever the learner's device: the workers get CPU weights, and a
        # collection sent ahead is not changed by the training that runs while it travels
        self.state = {k: v.detach().to("cpu", copy=True).numpy() for k, v in policy.state_dict().items()}
        return self

    def request(
        self,
        n_steps: int,
        obs_norm: dict[str, Any] | None = None,
        obs_pipeline: ObsPipeline | None = None,
        explore: ExplorationPlan | None = None,
    ) -> RolloutRequest:
        """The request for a rollout of ``n_steps`` (with a frame-stack pipeline, or off-policy exploration)."""
        if self.version < 0:
            raise RuntimeError("PolicyShipment.update(policy) must be called before request()")
        return RolloutRequest(
            self.version, self.blob, self.state, int(n_steps), obs_norm, self.seed, obs_pipeline, explore
        )


@dataclass(eq=False)
class Fragment:
    """One group's part of a rollout (its :class:`RolloutReply`) and the vec-step of its first step.

    That is 0, or 1 for the rest of a rollout recollected from rebuilt envs.
    """

    group: Group
    reply: RolloutReply
    offset: int


class _Recorder:
    """Where a rollout hears of rebuilt groups: rebuilt after a loss (reported at step 0) and moved at the end."""

    def __init__(self) -> None:
        self.rebuilds: list[Rebuild] = []
        self.moved: list[Rebuild] = []

    def report_rebuilds(self, rebuilds: Sequence[Rebuild], during: str) -> None:
        for r in rebuilds:
            moved = all(r.moved(i) for i in r.group.env_indices)
            (self.moved if moved else self.rebuilds).append(r)


@dataclass(eq=False)
class Collected:
    """What :func:`collect_rollout` brings back: plain data for the face to stitch and replay."""

    n_steps: int
    fragments: list[Fragment]
    rebuilds: list[Rebuild]
    moved: list[Rebuild]
    wall_seconds: float


@dataclass(eq=False)
class Rollout:
    """A rollout collected on the workers, in env order.

    Attributes
    ----------
    n_steps, n_envs : int
        Vec-steps collected, and envs.
    obs : numpy.ndarray or dict of numpy.ndarray
        ``(n_steps + 1, n_envs, ...)``: the envs' own observations (below any VecEnv
        wrapper) before each step, then the last (before any move at the end of the
        rollout); a dict of such arrays for a Dict space.
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
    fragments : list of Fragment
        The groups' fragments, as they came (what :meth:`daskvec.DaskVecEnv.replay` reads).
    rebuilds, moved : list of Rebuild
        Groups rebuilt after a loss (reported at step 0) and moved at the end
        (reported at the last step), as on the synchronous path.
    env_seconds, policy_seconds, wall_seconds : float
        The slowest group's time in its envs and in the policy; the collection's wall time.
    """

    n_steps: int
    n_envs: int
    obs: Any
    actions: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    rewards: np.ndarray
    missing: np.ndarray
    terminal_values: dict[tuple[int, int], float] = field(default_factory=dict)
    fragments: list[Fragment] = field(default_factory=list, repr=False)
    rebuilds: list[Rebuild] = field(default_factory=list)
    moved: list[Rebuild] = field(default_factory=list)
    env_seconds: float = 0.0
    policy_seconds: float = 0.0
    wall_seconds: float = 0.0

    def terminal_value(self, t: int, i: int) -> float | None:
        """The worker's ``V(terminal observation)`` of env ``i`` truncated at step ``t``, if it computed one."""
        return self.terminal_values.get((t, i))

    def fill_first(self, actions: np.ndarray, values: np.ndarray, log_probs: np.ndarray) -> None:
        """Set the step-0 policy outputs of the :attr:`missing` envs (rows in that order)."""
        self.actions[0, self.missing] = actions
        self.values[0, self.missing] = np.asarray(values, dtype=np.float32).reshape(-1)
        self.log_probs[0, self.missing] = np.asarray(log_probs, dtype=np.float32).reshape(-1)

    @classmethod
    def stitch(cls, collected: Collected, obs0: Any, action_space: gym.Space[Any]) -> Rollout:
        """The fragments as ``(n_steps, n_envs)`` arrays in env order.

        ``obs0``: the observations before step 0 (an array, or a dict of arrays).
        """
        n_steps, fragments = collected.n_steps, collected.fragments
        n = len(next(iter(obs0.values()))) if isinstance(obs0, dict) else len(obs0)
        obs = _by_key(obs0, lambda o: np.zeros((n_steps + 1, *o.shape), dtype=o.dtype))
        _put(obs, 0, obs0)
        if fragments:
            ref = fragments[0].reply.actions
            actions = np.zeros((n_steps, n, *ref.shape[2:]), dtype=ref.dtype)
        else:
            actions = np.zeros((n_steps, n, *(action_space.shape or ())), dtype=np.float32)
        rollout = cls(
            n_steps,
            n,
            obs,
            actions,
            values=np.zeros((n_steps, n), dtype=np.float32),
            log_probs=np.zeros((n_steps, n), dtype=np.float32),
            rewards=np.zeros((n_steps, n), dtype=np.float64),
            missing=np.array(sorted(i for r in collected.rebuilds for i in r.group.env_indices), dtype=np.intp),
            fragments=fragments,
            rebuilds=collected.rebuilds,
            moved=collected.moved,
            wall_seconds=collected.wall_seconds,
        )
        for r in collected.rebuilds:
            _put(rollout.obs, (1, r.group.index), r.reply.obs)
        for fragment in fragments:
            rollout._place(fragment)
        return rollout

    def _place(self, fragment: Fragment) -> None:
        """Copy one fragment into the rollout's rows of its envs, from step ``fragment.offset`` on."""
        rows, k, reply = fragment.group.index, fragment.offset, fragment.reply
        steps = reply.n_steps
        if k + steps != self.n_steps:
            raise DaskVecEnvError(
                f"daskvec internal error: a fragment of {steps} steps from step {k} in a rollout of {self.n_steps}"
            )
        _put(self.obs, (slice(k, k + steps + 1), rows), reply.obs)
        self.actions[k:, rows] = reply.actions
        self.values[k:, rows] = reply.values
        self.log_probs[k:, rows] = reply.log_probs
        self.rewards[k:, rows] = reply.rewards
        self.env_seconds = max(self.env_seconds, reply.env_seconds)
        self.policy_seconds = max(self.policy_seconds, reply.policy_seconds)
        indices = fragment.group.env_indices
        for t, by_pos in reply.terminal_values.items():
            for pos, value in by_pos.items():
                self.terminal_values[(t + k, indices[pos])] = value


def _by_key(obs: Any, fn: Any) -> Any:
    """``fn`` of an array, or of each array of a dict (a Dict space's observations)."""
    return {k: fn(v) for k, v in obs.items()} if isinstance(obs, dict) else fn(obs)


def _put(dst: Any, where: Any, src: Any) -> None:
    """``dst[where] = src``, key by key for a dict."""
    if isinstance(dst, dict):
        for k, v in dst.items():
            v[where] = src[k]
    else:
        dst[where] = src


# --------------------------------------------------------------------------- collecting
@dataclass(eq=False)
class PendingCollection:
    """A worker-side collection sent to every group and not collected yet (:func:`send_collection`).

    The workers run it while the client does something else (a learner trains); the
    collection is read, and lost fragments recollected, by :func:`finish_collection`.
    """

    request: RolloutRequest
    command: Command
    groups: list[Group]
    #: ``time.perf_counter()`` when it was sent: the collection's wall time starts here
    sent: float


def send_collection(engine: Engine, request: RolloutRequest, command: Command = Command.ROLLOUT) -> PendingCollection:
    """Send ``request`` to every group of ``engine`` without waiting (see :func:`collect_rollout`)."""
    assert engine.pool is not None
    groups = list(engine.groups)
    with engine.fail_stop():
        engine.drop_interrupted_call()
        _send(engine, groups, request, command)
    return PendingCollection(request, command, groups, time.perf_counter())


def finish_collection(engine: Engine, pending: PendingCollection, timeout: float) -> Collected:
    """Collect a collection sent by :func:`send_collection`; recollect lost fragments from rebuilt envs.

    Each pass is finished by :meth:`Engine.finish <daskvec._core.engine.Engine.finish>`: lost
    groups rebuilt, an env's error raised, moves carried out on the last pass; a lost
    fragment is recollected from its rebuilt envs for the rest of the rollout. ``timeout``
    bounds each pass (``step_timeout * n_steps``), counted from when the pass was sent.
    """
    request, command = pending.request, pending.command
    n_steps = request.n_steps
    fragments: dict[Group, Fragment] = {}
    recorder = _Recorder()
    groups = pending.groups
    for attempt in range(_ATTEMPTS + 1):
        offset = 0 if attempt == 0 else 1
        waiting = time.monotonic()
        if attempt > 0:
            _send(engine, groups, request.with_fewer_steps(1), command)
        outcome = _collect(engine, fragments, offset, timeout)
        waited = time.monotonic() - waiting
        if outcome.lost and attempt == _ATTEMPTS:
            lost = sorted(i for g in outcome.lost for i in g.env_indices)
            with engine.fail_stop():
                raise WorkerLostError(
                    f"the rollout fragments of envs {lost} were lost {_ATTEMPTS + 1} times",
                    env_indices=lost,
                    worker=next(iter(outcome.lost)).worker,
                )
        last = not outcome.lost or n_steps == 1
        # a group lost again drops the rebuild that made it; the one replacing it reports at step 0
        recorder.rebuilds = [r for r in recorder.rebuilds if r.group not in outcome.lost]
        engine.finish(outcome, recorder, migrate=None if last else (), steps=0, waited=waited)
        if last:
            break
        groups = [r.group for r in recorder.rebuilds if r.group not in fragments]
    return Collected(
        n_steps, list(fragments.values()), recorder.rebuilds, recorder.moved, time.perf_counter() - pending.sent
    )


def collect_rollout(
    engine: Engine, request: RolloutRequest, timeout: float, command: Command = Command.ROLLOUT
) -> Collected:
    """Collect a rollout on ``engine``'s groups (see :meth:`daskvec.DaskVecEnv.collect_rollout`).

    :func:`send_collection` then :func:`finish_collection`. ``command`` is
    :attr:`Command.ROLLOUT` or, for an off-policy collection, :attr:`Command.OFF_POLICY`.
    """
    return finish_collection(engine, send_collection(engine, request, command), timeout)


def _send(engine: Engine, groups: list[Group], request: RolloutRequest, command: Command) -> None:
    """Send ``request`` to ``groups``, each for its own envs."""
    assert engine.pool is not None
    with engine.fail_stop():
        engine.pool.send(lambda g: (command, (request.for_envs(g.env_indices),)), groups)


def _collect(engine: Engine, fragments: dict[Group, Fragment], offset: int, timeout: float) -> StepOutcome:
    """Collect the fragments of the groups a collection was sent to into ``fragments``.

    Interrupted while fragments are on their way, the engine breaks: they could not be
    matched up with a later request.
    """
    assert engine.pool is not None
    outcome = StepOutcome()
    with engine.fail_stop():
        for g, reply in engine.pool.collect(_await_fragments(engine, timeout), outcome, RolloutReply):
            fragments[g] = Fragment(g, reply, offset)
    return outcome


def _await_fragments(engine: Engine, timeout: float) -> float:
    """Wait until every fragment is in, or those missing are all frozen or hung; the time left for them.

    A rollout may take ``timeout`` (``step_timeout * n_steps``: hours, with the
    defaults) on a healthy worker, so its reply alone cannot say when a worker froze or
    an env hung. While fragments are missing, they are checked every few seconds: a
    worker that has sent the scheduler no heartbeat for ``step_timeout``
    (:class:`~daskvec._core.directory.HeartbeatWatch`) is frozen, and a group on a live worker
    whose envs have been in one step for ``step_timeout`` (:class:`HungWatch`) hangs.
    Once every missing fragment is of such a worker or group, little more is waited for
    (one look's time is returned: the collection reads what is in and times out the
    rest, which are rebuilt as a step's hung groups are). Nothing is read here.
    """
    assert engine.pool is not None
    step_timeout = engine.options.step_timeout
    watch, hung = HeartbeatWatch(engine.directory, quiet=step_timeout), HungWatch(step_timeout)
    look = min(max(step_timeout / 4, _LOOK_MIN), _LOOK_MAX)
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        missing = engine.pool.unanswered(max(min(look, remaining), 0.0))
        if not missing or remaining <= look:
            return max(deadline - time.monotonic(), 0.0)
        workers = {g.worker for g in missing}
        frozen = watch.silent(workers)
        stuck = hung.hung([g for g in missing if g.worker not in frozen])
        if all(g.worker in frozen or g in stuck for g in missing):
            if frozen:
                logger.warning(
                    "worker%s %s sent no heartbeat for %.3gs or more while collecting a rollout: giving up on %s "
                    "fragments",
                    "s" if len(frozen) > 1 else "",
                    ", ".join(sorted(frozen)),
                    step_timeout,
                    "their" if len(frozen) > 1 else "its",
                )
            for g in stuck:
                logger.warning(
                    "envs %s on %s have been in one step for %.3gs or more (step_timeout) while collecting a "
                    "rollout: giving up on their fragment",
                    g.env_indices,
                    g.worker,
                    step_timeout,
                )
            # a last look's time, not 0: a healthy fragment still arriving (a large one, a slow link) gets it
            return min(look, max(deadline - time.monotonic(), 0.0))


class HungWatch:
    """Which groups have been inside one step of their envs for ``quiet`` seconds: an env that hangs.

    Asked of each group's actor (``EnvGroup.busy_for``), which answers from the actor's
    thread while the group's channel thread runs the rollout. Never waits: a question
    is read at the next call, and a group whose actor cannot answer (its worker frozen
    or gone, an ``env_process`` group, the actor transport, whose one thread is the one
    that steps) is not judged.
    """

    def __init__(self, quiet: float) -> None:
        self.quiet = quiet
        self._asked: dict[str, Any] = {}

    def hung(self, groups: Sequence[Group]) -> set[Group]:
        """Those of ``groups`` whose last answer said they have been in one step for ``quiet`` seconds."""
        out = set()
        for g in groups:
            asked = self._asked.get(g.gid)
            if asked is not None and not asked.done():
                continue
            try:
                if asked is not None and float(asked.result(timeout=1.0)) >= self.quiet:
                    out.add(g)
                    continue  # hung is for good: no need to ask again
            except Exception:  # the actor could not answer: not judged
                logger.debug("no answer from %s on whether its envs hang", g.gid, exc_info=True)
            try:
                self._asked[g.gid] = g.actor.busy_for()
            except Exception:  # an actor without busy_for (an EnvHost), or its worker gone
                self._asked.pop(g.gid, None)
        return out
