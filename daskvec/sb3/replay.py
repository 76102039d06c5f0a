"""The SB3 face's worker-side rollouts: :meth:`DaskVecEnv.collect_rollout` and :meth:`DaskVecEnv.replay`.

:class:`RolloutMethods` is the part of :class:`~daskvec.DaskVecEnv` that the learners of
:mod:`daskvec.learners.on_policy` and :mod:`daskvec.learners.off_policy` call, a mixin: it has the engine collect a
rollout (:func:`daskvec._core.rollouts.collect_rollout`), stitched into a
:class:`~daskvec._core.rollouts.Rollout` that starts from the face's observations, and replays
the rollout's steps into the face's buffers through its reply writer, as ``step_wait``
writes a step. The face's state check, buffers and writer stay its own
(:class:`RolloutFace` names what a face lends the mixin).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Protocol

import gymnasium as gym
from stable_baselines3.common.vec_env.base_vec_env import VecEnvStepReturn

from daskvec._core.engine import Engine, RebuildReporter
from daskvec._core.handles import Group
from daskvec._core.options import Options
from daskvec._core.rollouts import PendingCollection, PolicyShipment, Rollout, finish_collection, send_collection
from daskvec.errors import DaskVecEnvError
from daskvec.protocol.messages import Command, StepReply
from daskvec.protocol.rollout_records import ExplorationPlan, ObsPipeline
from daskvec.sb3.buffers import StepBuffers

__all__ = ["PendingRollout", "ReplyWriter", "RolloutFace", "RolloutMethods"]


@dataclass(eq=False)
class PendingRollout:
    """A collection that :meth:`RolloutMethods.start_rollout` sent and `finish_rollout` has not read."""

    collection: PendingCollection
    n_steps: int


class ReplyWriter(RebuildReporter, Protocol):
    """Where a face writes step replies (its buffers, and the action-mask cache) and hears of rebuilt envs."""

    def take_step(self, group: Group, reply: StepReply) -> None:
        """Write ``group``'s step reply into the face's rows of its envs."""


class RolloutFace(Protocol):
    """What a face lends :class:`RolloutMethods`: engine, buffers, reply writer, options, action space, state check."""

    @property
    def _engine(self) -> Engine:
        """The face's engine."""

    @property
    def _buffers(self) -> StepBuffers:
        """The face's step buffers (its observations, and the envs whose truncation is deferred)."""

    @property
    def _writer(self) -> ReplyWriter:
        """Where the face writes step replies and hears of rebuilt envs."""

    @property
    def options(self) -> Options:
        """The face's options (``step_timeout`` bounds a rollout)."""

    @property
    def action_space(self) -> gym.Space[Any]:
        """One env's action space (the rollout's actions are clipped to it)."""

    def _enter_idle(self) -> None:
        """Raise the typed error that says why the face may not be called now, unless it is idle."""

    def _start_collecting(self, pending: PendingRollout) -> None:
        """Note that ``pending`` is in flight: every other call raises until it is finished."""

    def _stop_collecting(self, pending: PendingRollout) -> None:
        """Check that ``pending`` is the collection in flight, and let other calls in again."""


class RolloutMethods:
    """Worker-side rollouts of a Stable-Baselines3 face (a mixin of :class:`~daskvec.DaskVecEnv`)."""

    def collect_rollout(
        self: RolloutFace,
        shipment: PolicyShipment,
        n_steps: int,
        obs_norm: dict[str, Any] | None = None,
        obs_pipeline: ObsPipeline | None = None,
        explore: ExplorationPlan | None = None,
    ) -> Rollout:
        """Run every env for ``n_steps`` on its worker with the shipped policy.

        Each group runs its envs with a CPU copy of the policy and returns its fragment
        in one reply; a group whose worker is lost is rebuilt elsewhere and its envs
        report a truncation at the first step, the rest of the rollout recollected from
        the rebuilt envs. The rollout is then replayed step by step with
        :meth:`replay`, which updates this vec env as ``step_wait`` would.
        :class:`daskvec.sb3.DaskPPO` does all of this; see docs/rollouts.md. The same as
        :meth:`start_rollout` then :meth:`finish_rollout`.

        Parameters
        ----------
        shipment : PolicyShipment
            The policy, updated with the learner's current weights.
        n_steps : int
            Vec-steps to collect.
        obs_norm : dict, optional
            Frozen ``VecNormalize`` observation statistics (``mean``, ``var``,
            ``epsilon``, ``clip``) that the policy's inputs are normalised with.
        obs_pipeline : ObsPipeline, optional
            The frame stacks and transpositions of the VecEnv wrappers between this vec
            env and the policy, with their state (a row per env), for the workers to
            repeat.
        explore : ExplorationPlan, optional
            An off-policy collection (:class:`daskvec.sb3.DaskSAC` and the others): the
            shipped policy is the learner's actor, and the actions explore as the plan
            says (see :mod:`daskvec.worker.off_policy` and docs/offpolicy.md).

        Returns
        -------
        Rollout
            Waiting at most ``step_timeout * n_steps`` for the fragments.
        """
        return RolloutMethods.finish_rollout(
            self, RolloutMethods.start_rollout(self, shipment, n_steps, obs_norm, obs_pipeline, explore)
        )

    def start_rollout(
        self: RolloutFace,
        shipment: PolicyShipment,
        n_steps: int,
        obs_norm: dict[str, Any] | None = None,
        obs_pipeline: ObsPipeline | None = None,
        explore: ExplorationPlan | None = None,
    ) -> PendingRollout:
        """Send a worker-side collection to every group and return at once (see :meth:`collect_rollout`).

        The workers run it while the caller does something else (a learner trains on
        the rollout before); until :meth:`finish_rollout` collects it, every other call
        of this vec env raises :class:`~daskvec.errors.AlreadySteppingError`, and
        :meth:`close` abandons it without waiting.
        """
        self._enter_idle()
        if not self._buffers.has_obs:
            raise DaskVecEnvError("reset() the vec env before collecting a rollout")
        if int(n_steps) < 1:
            raise ValueError(f"n_steps must be a positive number of vec-steps, not {n_steps!r}")
        if explore is not None and explore.n_steps != int(n_steps):
            raise ValueError(f"an exploration plan of {explore.n_steps} steps for a collection of {n_steps}")
        if obs_pipeline is not None:
            # envs rebuilt since the last step report their truncation in the first one: their stacks restart there
            obs_pipeline = dataclasses.replace(obs_pipeline, restack=tuple(self._buffers.deferred_envs()))
        request = shipment.request(int(n_steps), obs_norm, obs_pipeline, explore)
        command = Command.ROLLOUT if explore is None else Command.OFF_POLICY
        pending = PendingRollout(send_collection(self._engine, request, command), int(n_steps))
        self._start_collecting(pending)
        return pending

    def finish_rollout(self: RolloutFace, pending: PendingRollout) -> Rollout:
        """Collect the collection :meth:`start_rollout` sent; see :meth:`collect_rollout`."""
        self._stop_collecting(pending)
        engine, n_steps = self._engine, pending.n_steps
        collected = finish_collection(engine, pending.collection, self.options.step_timeout * n_steps)
        rollout = Rollout.stitch(collected, self._buffers.observations(), self.action_space)
        engine.timer.rollout(n_steps, rollout.wall_seconds, rollout.env_seconds + rollout.policy_seconds)
        engine.maybe_publish()
        return rollout

    def replay(self: RolloutFace, rollout: Rollout, t: int) -> VecEnvStepReturn:
        """Write step ``t`` of a rollout into this vec env and return what ``step_wait`` would have.

        Steps must be replayed in order, once each: the envs rebuilt during the
        rollout report their truncation at step 0, those moved at its end at the last.
        """
        self._enter_idle()
        engine, writer = self._engine, self._writer
        for fragment in rollout.fragments:
            if t >= fragment.offset:
                reply = fragment.reply.step(t - fragment.offset)
                writer.take_step(fragment.group, reply)
                if reply.restarted:
                    engine.ledger.env_errors(fragment.group, reply.restarted, engine.recovery.steps)
        if t == 0:
            self._buffers.apply_deferred()
            writer.report_rebuilds(rollout.rebuilds, "step")
        if t == rollout.n_steps - 1:
            writer.report_rebuilds(rollout.moved, "step")
        engine.recovery.steps += 1
        return self._buffers.result()
