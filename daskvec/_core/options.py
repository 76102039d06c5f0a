"""Options: what a :class:`~daskvec.sb3.vec_env.DaskVecEnv` is asked to do, checked once.

:class:`Options` is a frozen dataclass built by :meth:`Options.create`, which turns
every invalid value into a ``ValueError`` or ``TypeError`` naming the option and what
to pass instead. An option not given is read from Dask's config (``daskvec.*``, see
:mod:`daskvec.config`) and checked the same way, naming the config key. The other
client modules read it and never check again.
:func:`check_env_fns` does the same for the list of env factories.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from daskvec import config
from daskvec.transport import check_busy_poll

__all__ = ["Options", "check_env_fns", "ignore_async_keywords", "ignore_subproc_keywords"]

logger = logging.getLogger(__name__)

TRANSPORTS = ("auto", "direct", "actor", "direct-insecure")
ON_WORKER_LOST = ("restart", "raise")
ON_ENV_ERROR = ("raise", "restart")


def _number(name: str, value: Any) -> float:
    """``value`` as a float, or a ``TypeError`` naming ``name`` if it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = ""
        if isinstance(value, str) and not name.startswith("the Dask config"):  # config: see config.get
            seconds = _duration(value)
            hint = f"; pass {name}={seconds:g}, not the string {value!r}" if seconds is not None else ""
        kind = type(value).__name__
        raise TypeError(f"{name} must be a number of seconds (int or float), not {kind} {value!r}{hint}")
    return float(value)


def _duration(text: str) -> float | None:
    """Seconds in ``text`` ("30", "30s", "2 minutes"), or None if it says none."""
    from dask.utils import parse_timedelta

    try:
        return float(parse_timedelta(text.strip()))
    except (ValueError, KeyError, TypeError):
        return None


def _seconds(name: str, value: Any) -> float:
    if not _number(name, value) > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, not {value!r}")
    return str(value)


def _positive_int_or_none(name: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be a positive int or None, not {value!r}")
    return value


def _workers(name: str, value: Any) -> tuple[str, ...] | None:
    if isinstance(value, str):
        raise TypeError(f"{name} must be a list of worker addresses or names, not the string {value!r}")
    return tuple(value) if value else None


def _non_negative_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, not {value!r}")
    return value


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, not {value!r}")
    return value


def _non_negative_seconds(name: str, value: Any) -> float:
    if not _number(name, value) >= 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, not {value!r}")
    return float(value)


#: Every option and its check: ``check(name, value)`` returns the value to keep or
#: raises naming ``name``. ``None`` means "not given": the option's Dask config key
#: (:mod:`daskvec.config`) is read instead, when it has one.
_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "envs_per_actor": _positive_int_or_none,
    "workers": _workers,
    "resources": lambda name, value: dict(value) if value else None,
    "transport": lambda name, value: _choice(name, value, TRANSPORTS),
    "env_process": _flag,
    "busy_poll": lambda name, value: None if value is None else check_busy_poll(value, name),
    "timeout": _seconds,
    "connect_timeout": _seconds,
    "step_timeout": lambda name, value: None if value is None else _seconds(name, value),
    "on_worker_lost": lambda name, value: _choice(name, value, ON_WORKER_LOST),
    "on_env_error": lambda name, value: _choice(name, value, ON_ENV_ERROR),
    "max_restarts": _non_negative_int,
    "worker_wait_timeout": _seconds,
    "migrate_before": _non_negative_seconds,
    "auto_rebalance": _flag,
    "rebalance_interval": _seconds,
    "cache_action_masks": _flag,
}
#: Options a worker reads from its own config when not given (see :func:`daskvec.config.worker_busy_poll`).
_WORKER_SIDE = frozenset({"busy_poll"})


@dataclass(frozen=True)
class Options:
    """The validated options of a vec env (see :class:`~daskvec.sb3.vec_env.DaskVecEnv`).

    The defaults are those of ``daskvec/daskvec.yaml`` (a test keeps them equal).
    ``busy_poll`` is ``None`` when each worker reads its own ``daskvec.busy-poll``.
    """

    envs_per_actor: int | None = None
    workers: tuple[str, ...] | None = None
    resources: dict[str, float] | None = None
    transport: str = "auto"
    env_process: bool = False
    busy_poll: float | None = None
    timeout: float = 300.0
    connect_timeout: float = 5.0
    step_timeout: float = 60.0
    on_worker_lost: str = "restart"
    on_env_error: str = "raise"
    max_restarts: int = 10
    worker_wait_timeout: float = 300.0
    migrate_before: float = 120.0
    auto_rebalance: bool = False
    rebalance_interval: float = 10.0
    cache_action_masks: bool = True
    #: Set by the vec env, not by the user: the direct channel is TLS (a secured cluster).
    encrypted: bool = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names (the keyword arguments :meth:`create` takes)."""
        return tuple(_CHECKS)

    @classmethod
    def create(cls, **given: Any) -> Options:
        """Check every option and return them.

        Parameters
        ----------
        **given
            Options by name (see :meth:`names` and ``DaskVecEnv``). One not given, or
            ``None``, takes its value from Dask's config (``daskvec.*``, see
            :mod:`daskvec.config`), except ``busy_poll``, which the workers read from
            theirs. ``step_timeout`` that is ``None`` in both follows ``timeout``.

        Raises
        ------
        ValueError, TypeError
            Naming the first invalid option (or config key) and what it accepts; a
            ``TypeError`` also for an unknown option name.
        """
        unknown = sorted(set(given) - set(_CHECKS))
        if unknown:
            raise TypeError(f"unknown option(s) {unknown}; the options are {sorted(_CHECKS)}")
        values: dict[str, Any] = {}
        for name, check in _CHECKS.items():
            value = given.get(name)
            if value is not None or name not in config.KEYS or name in _WORKER_SIDE:
                values[name] = check(name, value)
                continue
            try:
                values[name] = check(f"the Dask config {config.key(name)}", config.get(name))
            except (ValueError, TypeError) as e:
                raise type(e)(f"{e}{config.hint(name)}") from None
        if values["step_timeout"] is None:
            values["step_timeout"] = values["timeout"]
        values["env_process"] = values["env_process"] and os.name == "posix"
        return cls(**values)


def ignore_subproc_keywords(**given: Any) -> None:
    """Log, once per call, the ``SubprocVecEnv`` keywords that a vec env accepts and ignores.

    Code written for ``SubprocVecEnv`` passes ``start_method`` (e.g. through
    ``make_vec_env(..., vec_env_kwargs=...)``); there is nothing for it to choose here.
    Keywords left at ``None`` are not mentioned.
    """
    _log_ignored(
        "DaskVecEnv",
        "SubprocVecEnv's process start method has no counterpart here",
        given,
    )


def ignore_async_keywords(**given: Any) -> None:
    """Log, once per call, the ``AsyncVectorEnv`` keywords that ``DaskVectorEnv`` accepts and ignores.

    Code written for Gymnasium's ``AsyncVectorEnv`` passes ``shared_memory``,
    ``context``, ``daemon``, ``worker`` or ``max_concurrency`` (directly, or through
    ``make_vec(..., vector_kwargs=...)``): they choose how its subprocesses are started
    and fed, which Dask does here. Keywords left at ``None`` are not mentioned.
    """
    _log_ignored(
        "DaskVectorEnv",
        "these choices of AsyncVectorEnv's subprocesses (shared memory, start method, daemon flag, "
        "worker function, concurrency limit) have no counterpart here",
        given,
    )


def _log_ignored(face: str, why: str, given: dict[str, Any]) -> None:
    ignored = {name: value for name, value in given.items() if value is not None}
    if ignored:
        listed = ", ".join(f"{name}={value!r}" for name, value in ignored.items())
        logger.info(
            "%s ignores %s: its envs live in Dask workers, whose processes Dask starts, so %s", face, listed, why
        )


def check_env_fns(env_fns: Any, name: str = "env_fns") -> list[Callable[[], Any]]:
    """``env_fns`` as a list of factories, or a clear error.

    Parameters
    ----------
    env_fns : sequence of callable
        The factories.
    name : str
        What the caller calls them, for the messages (``"vector_env_fns"`` for
        factories of vectorized envs).

    Raises
    ------
    TypeError
        Not a sequence of callables (e.g. a single factory, or env instances).
    ValueError
        Empty, or two factories that return the same env instance.
    """
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
        if callable(env_fns):
            raise TypeError(f"{name} must be a list of env factories, not a single callable; wrap it: [make_env]")
        raise TypeError(f"{name} must be a list of callables that create envs, not {type(env_fns).__name__}")
    fns = list(env_fns)
    if not fns:
        raise ValueError(f"{name} is empty: pass at least one callable that creates an env")
    owner: dict[int, int] = {}
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(
                f"{name}[{i}] is a {type(fn).__name__}, not a callable; pass factories such as "
                "`lambda: gym.make('CartPole-v1')`"
                + (
                    " (or functools.partial(gym.make, ...)), not env ids"
                    if isinstance(fn, str)
                    else ", not env instances"
                )
            )
        for captured in _captured_envs(fn):
            if id(captured) in owner and owner[id(captured)] != i:
                raise ValueError(
                    f"{name}[{owner[id(captured)]}] and {name}[{i}] return the same env instance; "
                    "each factory must create a new env"
                )
            owner[id(captured)] = i
    return fns


def _captured_envs(fn: Any) -> list[Any]:
    """Env instances a factory closes over (to catch factories sharing one env)."""
    found = []
    seen: list[Any] = []
    stack = [fn]
    while stack and len(seen) < 32:
        obj = stack.pop()
        if any(obj is s for s in seen):
            continue
        seen.append(obj)
        if isinstance(obj, gym.Env):
            found.append(obj)
            continue
        func = getattr(obj, "func", None)
        if func is not None:  # functools.partial
            stack.extend([func, *getattr(obj, "args", ()), *getattr(obj, "keywords", {}).values()])
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):
                stack.append(cell.cell_contents)
        defaults = getattr(obj, "__defaults__", None) or ()
        stack.extend(defaults)
    return found
