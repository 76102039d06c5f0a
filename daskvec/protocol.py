"""Protocol: the commands and replies that client and worker exchange.

A request is ``(Command, args)``; a reply is the command's value (a :class:`StepReply`,
a :class:`ResetReply`, a list of per-env results, ...) or a :class:`RemoteError`.
The transport (:mod:`daskvec.transport`) moves them; the worker side
(:mod:`daskvec.worker`) answers them; the client side (:mod:`daskvec.pool`) sends
them and :mod:`daskvec.buffers` turns the replies into what Stable-Baselines3 reads.

Replies carry columns, not Stable-Baselines3's info dicts: which envs terminated,
which were truncated, the last observation of every finished episode, and the env's
own info keys where it had any. The client's step buffers are the one place where
SB3's ``info`` dicts (``"TimeLimit.truncated"``, ``"terminal_observation"``, the
``"daskvec"`` marker) are built.

This module is imported by every worker process: it stays free of
Stable-Baselines3, torch and Dask.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import numpy as np

__all__ = [
    "EMPTY",
    "INFO_KEY",
    "MASK_METHOD",
    "Autoreset",
    "Command",
    "ExplorationPlan",
    "GroupDesc",
    "OUNoise",
    "GroupSpec",
    "PerEnv",
    "RemoteError",
    "FrameStack",
    "ObsPipeline",
    "ResetReply",
    "RolloutReply",
    "RolloutRequest",
    "StepReply",
    "TransposeImage",
    "restart_seed",
    "unwrap",
]

#: Marker key that daskvec adds to an env's ``info`` when it was restarted or moved.
INFO_KEY = "daskvec"

#: Every env-group actor's Dask key starts with this (the dashboard and the
#: scale-down plugin recognise daskvec actors by it).
GROUP_KEY_PREFIX = "daskvec-group-"

#: The env method whose results travel with every step and reset reply (issue 14:
#: sb3-contrib's ``MaskablePPO`` asks every env for its action masks before every step).
MASK_METHOD = "action_masks"


class Command(enum.StrEnum):
    """What a request asks an env group to do; the first item of every request.

    ``(Command.STEP, (actions,))`` and ``(Command.RESET, (seeds, options))`` concern
    every env of the group; the per-env commands take the positions of the envs
    within the group as their last argument.
    """

    STEP = "step"  # (actions,) -> StepReply
    RESET = "reset"  # (seeds, options[, user[, mask]]) -> ResetReply; user=False: restart seeds
    GET_ATTR = "get_attr"  # (name, positions) -> list
    SET_ATTR = "set_attr"  # (name, value, positions) -> None
    ENV_METHOD = "env_method"  # (name, args, kwargs, positions) -> list
    IS_WRAPPED = "is_wrapped"  # (wrapper_class, positions) -> list of bool
    RENDER = "render"  # (positions,) -> list
    STATS = "stats"  # () -> the group's step figures (GroupStats.snapshot)
    REFUSED = "refused"  # () -> connections the direct channel refused
    # issue 14 (sb3x): has_attr without sending the attribute's value back
    HAS_ATTR = "has_attr"  # (name, positions) -> list of bool
    # issue 16 (the Gymnasium face):
    CALL = "call"  # (name, args, kwargs, positions) -> list: the method's results, or the attribute's values
    SET_WRAPPER_ATTR = "set_wrapper_attr"  # (name, values, positions) -> None: one value per position
    # issue 13: worker-side rollouts
    ROLLOUT = "rollout"  # (RolloutRequest,) -> RolloutReply
    # vector envs as groups: a vector group learns its envs' vec-env indices once its size is known
    NUMBER = "number"  # (env_indices,) -> None
    # off-policy collections (DaskSAC, DaskTD3, DaskDQN): a rollout whose actions explore as planned
    OFF_POLICY = "off_policy"  # (RolloutRequest with an ExplorationPlan,) -> RolloutReply


class Autoreset(enum.StrEnum):
    """When an env group resets an env whose episode ended (issue 16); set at group creation.

    The values are those of Gymnasium's ``AutoresetMode``, so that one converts to
    the other by value.
    """

    #: Reset at once in the step that ended the episode; the reply carries the last
    #: observation in ``final_obs`` (Stable-Baselines3's semantics; the default).
    SAME_STEP = "SameStep"
    #: Keep the last observation; the env's next step request resets it instead of
    #: stepping it (reward 0, not done, the reset info as the step's info).
    NEXT_STEP = "NextStep"
    #: Never reset on its own: the client resets chosen envs (``RESET`` with a mask).
    DISABLED = "Disabled"


class PerEnv(tuple[Any, ...]):
    """A group's observations one env at a time, for spaces that do not stack into arrays.

    Gymnasium batches ``Graph``, ``Text``, ``Sequence``, ``OneOf`` and custom spaces as a
    tuple of per-env values (``gymnasium.vector.utils.concatenate``); a group sends
    theirs as this tuple, whose own type keeps it apart from the entries of a ``Tuple``
    space's observations.
    """

    __slots__ = ()


def restart_seed(env_index: int, restarts: int, base_seed: int | None = None) -> int:
    """Seed used to reset env ``env_index`` after its ``restarts``-th rebuild.

    It is ``SeedSequence([base_seed or 0, env_index, restarts])`` reduced to 31 bits:
    the same env restarted the same number of times always gets the same seed, and
    different envs or restart counts get independent streams. Client (rebuilds after
    a lost worker) and worker (rebuilds after an env error) both use it.

    Parameters
    ----------
    env_index : int
        Index of the env in the vec env.
    restarts : int
        How many times this env has been rebuilt, including this rebuild.
    base_seed : int, optional
        The seed the user last gave this env, if any.

    Returns
    -------
    int
    """
    entropy = [0 if base_seed is None else int(base_seed) & 0xFFFFFFFF, int(env_index), int(restarts)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """Everything the client tells a new env group, in one record (pool to worker).

    Attributes
    ----------
    env_indices : tuple of int
        The vec-env index of each env, for error messages and restart seeds.
    token : bytes or None
        Secret of the direct channel; ``None`` serves Dask actor calls only.
    on_env_error : {"raise", "restart"}
        What to do when an env raises in ``step`` or ``reset``.
    max_restarts : int
        Per-env budget of restarts after env errors.
    error_restarts : tuple of int, optional
        Error restarts of these envs in an earlier life (they count against the budget).
    rebuilds : tuple of int, optional
        How many times each env was rebuilt so far, for any reason: the restart count
        its next restart seed derives from (see :func:`restart_seed`).
    base_seeds : tuple of int or None, optional
        The seed the user last gave each env, which restart seeds derive from.
    busy_poll : float or None
        Seconds the direct channel polls for the next request after each reply;
        ``None``: the worker's own Dask config ``daskvec.busy-poll``.
    send_masks : bool
        Send the envs' action masks with every reply when they all have some.
    autoreset : str
        When a finished env is reset (an :class:`Autoreset` value).
    tls : bool
        Make the direct channel's TCP socket TLS, with the worker's certificates.
    build_timeout : float or None
        Seconds the factories may take in all (``None``: no limit).
    vector : bool
        The factories are one callable that returns a vectorized env (a Gymnasium
        ``VectorEnv`` or an EnvPool instance), stepped with one call per request
        (:mod:`daskvec.worker.vector`). Its ``env_indices`` may be empty when the group
        is first built: its size is known only then, and ``Command.NUMBER`` gives them.
    always_pass_options : bool
        Call every env's ``reset`` with both ``seed=`` and ``options=`` (``None`` when
        none were given), as Gymnasium's vector envs call it on ``reset()``; autoresets
        and restarts too, so that an env whose ``options`` parameter has no default
        never meets a reset without it. Otherwise (Stable-Baselines3's vec envs)
        ``options=`` is passed only when there are some.
    """

    env_indices: tuple[int, ...]
    token: bytes | None = None
    on_env_error: str = "raise"
    max_restarts: int = 10
    error_restarts: tuple[int, ...] | None = None
    rebuilds: tuple[int, ...] | None = None
    base_seeds: tuple[int | None, ...] | None = None
    busy_poll: float | None = 0.0
    send_masks: bool = True
    autoreset: str = "SameStep"
    tls: bool = False
    build_timeout: float | None = None
    vector: bool = False
    always_pass_options: bool = False


@dataclass(frozen=True, slots=True)
class GroupDesc:
    """What an env group says about itself once built (worker to client).

    Attributes
    ----------
    worker : str
        Address of the worker holding it.
    pid : int
        Id of the worker's process.
    machine : str
        :func:`daskvec.transport.machine_id` of its host (a Unix socket is usable
        only from the same machine).
    observation_spaces, action_spaces : tuple of gymnasium.spaces.Space
        Each env's spaces.
    address : tuple or None
        ``(host, port)`` of the direct channel's TCP socket (``None``: actor calls only).
    unix_path : str or None
        Path of its Unix socket, if it has one.
    tls : bool
        Whether the TCP socket speaks TLS.
    deadline : float or None
        When the worker is expected to leave (epoch seconds), if known.
    profiler_hazard : bool
        Whether the worker samples thread stacks on CPython 3.11 (see ``probes.profiler_hazard``).
    busy_poll : float or None
        The busy-poll budget the channel applies.
    env_pid : int or None
        Id of the env process (``env_process=True``), else ``None``.
    vector : str or None
        For a group made of one vectorized env, what it is (its class and how it
        resets finished envs); ``None`` for a group of single envs.
    reseeds : bool
        Whether ``reset`` applies the seeds it is given (EnvPool takes its seed once,
        when it is made).
    """

    worker: str
    pid: int
    machine: str
    observation_spaces: tuple[Any, ...]
    action_spaces: tuple[Any, ...]
    address: tuple[Any, ...] | None = None
    unix_path: str | None = None
    tls: bool = False
    deadline: float | None = None
    profiler_hazard: bool = False
    busy_poll: float | None = None
    env_pid: int | None = None
    vector: str | None = None
    reseeds: bool = True

    @property
    def observation_space(self) -> Any:
        """The first env's observation space."""
        return self.observation_spaces[0]

    @property
    def action_space(self) -> Any:
        """The first env's action space."""
        return self.action_spaces[0]


class _ReadOnlyEmpty(dict[Any, Any]):
    """An empty dict that refuses to be filled (see :data:`EMPTY`)."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("daskvec internal error: the shared empty mapping of a reply is read-only")

    __setitem__ = __delitem__ = __ior__ = _refuse
    setdefault = update = pop = popitem = clear = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, ()  # a copy elsewhere is an ordinary empty dict


#: The one empty mapping that every client-side reply without entries shares, in place of
#: fresh empty dicts (a quiet step reply has four sparse columns, all empty). Readers only
#: read a reply's columns; filling this one raises ``TypeError`` instead of leaking into
#: every other reply.
EMPTY: dict[Any, Any] = _ReadOnlyEmpty()


@dataclass(slots=True, eq=False)
class StepReply:
    """What one env group returns for a step, as columns over its envs.

    The worker (:meth:`daskvec.worker.EnvGroup.step`) builds it, the transport may
    send it in a compact form (:func:`daskvec.transport.encode`), and the client's
    step buffers (:class:`daskvec.buffers.StepBuffers`) build SB3's info dicts from it.

    Attributes
    ----------
    obs : array, dict or tuple of arrays
        The group's observations stacked along a first axis (after any automatic reset).
    rewards : numpy.ndarray
        ``float64``, one per env.
    terminated, truncated : numpy.ndarray
        ``bool``, one per env, as the envs returned them. An env rebuilt after an
        error counts as truncated.
    final_obs : dict of int to observation
        By position in the group: the last observation of each episode that ended in
        this step (before the automatic reset).
    infos : dict of int to dict
        By position: the info dict an env returned, where it was not empty.
    reset_infos : dict of int to dict
        By position: the reset info of every env reset after its episode ended.
    restarted : dict of int to dict
        By position: the marker of every env rebuilt after an error in this step
        (``on_env_error="restart"``); see :class:`daskvec.recovery.RestartLedger`.
    env_seconds : float
        Wall time the group spent in its envs' ``step`` and ``reset`` calls.
    masks : numpy.ndarray or None
        The envs' action masks after this step (and any automatic reset), stacked,
        when every env of the group has an ``action_masks`` method; ``None``
        otherwise. The client answers ``env_method("action_masks")`` from them.
    """

    obs: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: dict[int, Any] = field(default_factory=dict)
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    reset_infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    restarted: dict[int, dict[str, Any]] = field(default_factory=dict)
    env_seconds: float = 0.0
    masks: Any = None

    @property
    def dones(self) -> np.ndarray:
        """``terminated | truncated``."""
        return self.terminated | self.truncated


@dataclass(slots=True, eq=False)
class ResetReply:
    """What one env group returns for a reset.

    Attributes
    ----------
    obs : array, dict or tuple of arrays
        The group's first observations, stacked.
    reset_infos : list of dict
        One per env.
    restarted : dict of int to dict
        By position: markers of envs rebuilt because their ``reset`` raised.
    masks : numpy.ndarray or None
        The envs' action masks after the reset, as in :class:`StepReply`.
    """

    obs: Any
    reset_infos: list[dict[str, Any]]
    restarted: dict[int, dict[str, Any]] = field(default_factory=dict)
    masks: Any = None


@dataclass(frozen=True, slots=True)
class RemoteError:
    """An exception raised on a worker, as it travels to the client.

    Attributes
    ----------
    type : str
        Qualified name of the exception's class.
    message : str
        ``str(exc)``.
    traceback : str
        The remote traceback.
    env_index : int or None
        The env that raised, when one did.
    worker : str
        Address of the worker.
    exc : bytes or None
        The exception itself, cloudpickled, when it survives pickling.
    """

    type: str
    message: str
    traceback: str
    env_index: int | None
    worker: str
    exc: bytes | None = None

    def exception(self) -> BaseException:
        """The exception to raise on the client: the original type when it unpickles.

        It carries ``env_index``, ``worker`` and, as a note, the remote traceback.
        """
        from daskvec.errors import RemoteEnvError

        exc: BaseException | None = None
        if self.exc is not None:
            import cloudpickle

            try:
                exc = cloudpickle.loads(self.exc)
            except Exception:
                exc = None
        if not isinstance(exc, BaseException):
            exc = RemoteEnvError(f"{self.type}: {self.message}", remote_type=self.type)
        where = f"env {self.env_index}" if self.env_index is not None else "an env group"
        exc.add_note(f"daskvec: raised by {where} on worker {self.worker}\n--- remote traceback ---\n{self.traceback}")
        with contextlib.suppress(Exception):
            exc.env_index = self.env_index  # type: ignore[attr-defined]
            exc.worker = self.worker  # type: ignore[attr-defined]
        return exc

    def raise_(self) -> NoReturn:
        """Raise :meth:`exception`."""
        raise self.exception()


@dataclass(slots=True, eq=False)
class RolloutRequest:
    """Ask a group to run its envs for ``n_steps`` with a copy of the learner's policy.

    Built by :class:`daskvec.rollout.PolicyShipment`; answered by
    :func:`daskvec.worker.rollout.run_rollout`.

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

    def shorter(self, by: int) -> RolloutRequest:
        """The same request for ``by`` fewer steps (the rest of a rollout, recollected).

        The rest starts from rebuilt envs, which the client reports done in the step
        before: their frame stacks start afresh, as ``VecFrameStack`` restarts them.
        """
        pipeline = None if self.obs_pipeline is None else self.obs_pipeline.afresh()
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

    def afresh(self) -> ObsPipeline:
        """The same stages with every stack started afresh from the envs' current observations."""
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
    envs' rows (:meth:`rows`, :func:`daskvec.worker.offpolicy.run_off_policy`).

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


def unwrap(reply: Any) -> Any:
    """The value of a reply, or raise the error it carries."""
    if isinstance(reply, RemoteError):
        reply.raise_()
    return reply
