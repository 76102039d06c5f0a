"""Protocol: the commands and replies that client and worker exchange.

A step request is a :class:`StepRequest`; every other request is ``(Command, args)``. A
reply is the request's value (a :class:`StepReply`, a :class:`ResetReply`, a list of
per-env results, ...) or a :class:`RemoteError`.
The records of worker-side rollouts and off-policy collections (``RolloutRequest``,
``RolloutReply``, ``ObsPipeline``, ``ExplorationPlan``) are in :mod:`daskvec.protocol.rollout_records`.
The transport (:mod:`daskvec.transport`) moves them; the worker side
(:mod:`daskvec.worker`) answers them; the client side (:mod:`daskvec._core.pool`) sends
them and :mod:`daskvec.sb3.buffers` turns the replies into what Stable-Baselines3 reads.

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
import enum
import re
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, NoReturn

import numpy as np

__all__ = [
    "EMPTY",
    "INFO_KEY",
    "MASK_METHOD",
    "Autoreset",
    "ColumnInfos",
    "Command",
    "GroupDesc",
    "GroupSpec",
    "PerEnv",
    "RemoteError",
    "Request",
    "ResetReply",
    "StepReply",
    "StepRequest",
    "format_traceback",
    "group_actors_on",
    "restart_seed",
    "strip_markers",
    "unwrap",
]

#: Marker key that daskvec adds to an env's ``info`` when it was restarted or moved.
INFO_KEY = "daskvec"

#: Every env-group actor's Dask key starts with this (the dashboard and the
#: scale-down plugin recognise daskvec actors by it).
GROUP_KEY_PREFIX = "daskvec-group-"

#: States of a scheduler task whose actor exists or is being made on its worker.
_LIVE_ACTOR_STATES = frozenset({"processing", "memory"})


def group_actors_on(ws: Any) -> int:
    """How many env-group actors a scheduler's ``WorkerState`` holds (scheduler side).

    Counts the entries of ``ws.actors`` whose task is still live: Dask's scheduler adds
    an actor task to ``ws.actors`` when it starts processing it, and does not remove it
    when the task is released while still processing (a vec env closed, or a placement
    given up, before the actor was made), so such entries stay there for good.
    """
    return sum(
        1
        for ts in getattr(ws, "actors", ())
        if str(ts.key).startswith(GROUP_KEY_PREFIX) and getattr(ts, "state", None) in _LIVE_ACTOR_STATES
    )


#: The env method whose results travel with every step and reset reply (
#: sb3-contrib's ``MaskablePPO`` asks every env for its action masks before every step).
MASK_METHOD = "action_masks"


class Command(enum.StrEnum):
    """What a request other than a step asks an env group to do; the first item of the request.

    ``(Command.RESET, (seeds, options))`` concerns every env of the group; the per-env
    commands take the positions of the envs within the group as their last argument.
    A step is a :class:`StepRequest` of its own.
    """

    RESET = "reset"  # (seeds, options[, user[, mask]]) -> ResetReply; user=False: restart seeds
    GET_ATTR = "get_attr"  # (name, positions) -> list
    SET_ATTR = "set_attr"  # (name, value, positions) -> None
    ENV_METHOD = "env_method"  # (name, args, kwargs, positions) -> list
    IS_WRAPPED = "is_wrapped"  # (wrapper_class, positions) -> list of bool
    RENDER = "render"  # (positions,) -> list
    STATS = "stats"  # () -> the group's step figures (GroupStats.snapshot)
    REFUSED = "refused"  # () -> connections the direct channel refused
    # has_attr without sending the attribute's value back
    HAS_ATTR = "has_attr"  # (name, positions) -> list of bool
    # the Gymnasium face:
    CALL = "call"  # (name, args, kwargs, positions) -> list: the method's results, or the attribute's values
    SET_WRAPPER_ATTR = "set_wrapper_attr"  # (name, values, positions) -> None: one value per position
    # worker-side rollouts
    ROLLOUT = "rollout"  # (RolloutRequest,) -> RolloutReply
    # vector envs as groups: a vector group learns its envs' vec-env indices once its size is known
    NUMBER = "number"  # (env_indices,) -> None
    # off-policy collections (DaskSAC, DaskTD3, DaskDQN): a rollout whose actions explore as planned
    OFF_POLICY = "off_policy"  # (RolloutRequest with an ExplorationPlan,) -> RolloutReply


class Autoreset(enum.StrEnum):
    """When an env group resets an env whose episode ended; set at group creation.

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
    shared_memory : bool or None
        Whether the group may write large step observations into a memory file shared
        with a client on its machine (:mod:`daskvec.transport.window`). ``False`` (the
        default: what the spec of a client that cannot read a window carries, an older
        daskvec's included): never. ``None``: the client can read one, and the worker's
        own Dask config ``daskvec.shared-memory`` decides. ``True``: decided (an env
        process gets its worker's answer).
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
    shared_memory: bool | None = False
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


class _ReadOnlyDict(dict[Any, Any]):
    """A dict that refuses new, changed or removed entries; ``_WHAT`` names it in the error. A pickle is a dict."""

    __slots__ = ()
    _WHAT = "this mapping"

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError(f"daskvec internal error: {self._WHAT} is read-only (copy it with dict())")

    __setitem__ = __delitem__ = __ior__ = _refuse
    setdefault = update = pop = popitem = clear = _refuse

    def __reduce__(self) -> tuple[Any, ...]:
        return dict, (dict(self),)  # a copy elsewhere is an ordinary dict


class _ReadOnlyEmpty(_ReadOnlyDict):
    """An empty dict that refuses to be filled (see :data:`EMPTY`)."""

    __slots__ = ()
    _WHAT = "the shared empty mapping of a reply"


class ColumnInfos(_ReadOnlyDict):
    """Every env's info of a vector env's step, built from its batched columns.

    To every reader it is what :attr:`StepReply.infos` always is: a dict by position of
    each env's info (here every env has one, with the same keys). It also keeps the
    columns it was built from, so the compact step reply
    (:func:`daskvec.transport.encode`) sends them as they are instead of walking 64
    rows back into columns. The worker's vector groups build it
    (:class:`daskvec.worker.VectorEnvs`) and nothing changes it after: like :data:`EMPTY`
    it refuses new or removed rows (its row dicts, and its columns, which may be the
    vector env's own arrays, are only read, not guarded). A pickle of it is a plain dict.
    Its 1-D columns have the dtypes of :attr:`SCALAR_DTYPES` (by NumPy kind).

    Parameters
    ----------
    names : tuple of str
        The info keys, in the order the vector env gave them.
    columns : sequence of numpy.ndarray
        One array per key, a row per env: 1-D ``bool``, ``int64`` or ``float64`` (each
        env's value a Python ``bool``, ``int`` or ``float``, which hold them exactly), or
        of more dimensions (each env's value its row, as EnvPool's ``ram``).
    """

    __slots__ = ("columns", "names")
    _WHAT = "a step's column infos"
    #: The dtype a 1-D column of each NumPy kind is kept (and sent) as.
    SCALAR_DTYPES: ClassVar[dict[str, np.dtype[Any]]] = {
        "b": np.dtype(np.bool_),
        "i": np.dtype("<i8"),
        "u": np.dtype("<i8"),
        "f": np.dtype("<f8"),
    }

    def __init__(self, names: tuple[str, ...], columns: Sequence[np.ndarray]) -> None:
        rows = zip(*(column.tolist() if column.ndim == 1 else list(column) for column in columns), strict=True)
        super().__init__(enumerate(dict(zip(names, row, strict=True)) for row in rows))
        self.names = names
        self.columns = tuple(columns)


#: The one empty mapping that every client-side reply without entries shares, in place of
#: fresh empty dicts (a step reply in which no episode ended has four sparse columns, all empty). Readers only
#: read a reply's columns; filling this one raises ``TypeError`` instead of leaking into
#: every other reply.
EMPTY: dict[Any, Any] = _ReadOnlyEmpty()


@dataclass(frozen=True, slots=True, eq=False)
class StepRequest:
    """A step of every env of a group: the request answered by a :class:`StepReply`.

    Attributes
    ----------
    actions : numpy.ndarray or list
        One action per env of the group, in the group's env order. An array of plain
        dtype travels as raw bytes (:func:`daskvec.transport.encode`); anything else
        is pickled.
    """

    actions: Any


#: What a client sends an env group: a step, or ``(Command, args)``.
Request = StepRequest | tuple[Command, tuple[Any, ...]]


@dataclass(slots=True, eq=False)
class StepReply:
    """What one env group returns for a step, as columns over its envs.

    The worker (:meth:`daskvec.worker.EnvGroup.step`) builds it, the transport may
    send it in a compact form (:func:`daskvec.transport.encode`), and the client's
    step buffers (:class:`daskvec.sb3.buffers.StepBuffers`) build SB3's info dicts from it.

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
        By position: the info dict an env returned, where it was not empty (a
        :class:`ColumnInfos` when a vector group's envs all had the same numeric keys).
    reset_infos : dict of int to dict
        By position: the reset info of every env reset after its episode ended.
    restarted : dict of int to dict
        By position: the marker of every env rebuilt after an error in this step
        (``on_env_error="restart"``); see :class:`daskvec._core.recovery.RestartLedger`.
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


#: A line of position markers that Python 3.11+ prints under a traceback's code line (``^^^^``, ``~~~^^~~``).
_MARKER_LINE = re.compile(r"^\s*[~^]+\s*$")


def strip_markers(text: str) -> str:
    """``text``, a traceback, without its lines of position markers (``^^^^``).

    They point at columns of the source as the process that formatted them read it;
    in a traceback sent from a worker, or in frames rebuilt on the client (where
    Python computes them from the wrong code), they stand under the wrong code lines.
    """
    return "".join(line for line in text.splitlines(keepends=True) if not _MARKER_LINE.match(line))


def format_traceback(exc: BaseException) -> str:
    """``exc``'s traceback and chained causes, as Python prints them, without position markers."""
    return strip_markers("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))


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

        It carries ``env_index``, ``worker``, a note saying where it was raised, and
        the remote traceback as ``remote_traceback`` (not printed with it: see
        :func:`daskvec._core.user_errors.shorten`).
        """
        from daskvec._core.user_errors import shorten
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
        with contextlib.suppress(Exception):
            exc.env_index = self.env_index  # type: ignore[attr-defined]
            exc.worker = self.worker  # type: ignore[attr-defined]
        return shorten(exc, f"raised by {where} on worker {self.worker}", self.traceback)

    def raise_(self) -> NoReturn:
        """Raise :meth:`exception`."""
        raise self.exception()


def unwrap(reply: Any) -> Any:
    """The value of a reply, or raise the error it carries."""
    if isinstance(reply, RemoteError):
        reply.raise_()
    return reply
