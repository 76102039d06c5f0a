"""Options: what a :class:`~daskvec.vec_env.DaskVecEnv` is asked to do, checked once.

:class:`Options` is a frozen dataclass built by :meth:`Options.create`, which turns
every invalid value into a ``ValueError`` or ``TypeError`` naming the option and what
to pass instead. The other client modules read it and never check again.
:func:`check_env_fns` does the same for the list of env factories.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from daskvec.transport import check_busy_poll

__all__ = ["Options", "check_env_fns"]

TRANSPORTS = ("auto", "direct", "actor", "direct-insecure")
ON_WORKER_LOST = ("restart", "raise")
ON_ENV_ERROR = ("raise", "restart")


def _number(name: str, value: Any) -> float:
    """``value`` as a float, or a ``TypeError`` naming ``name`` if it is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        hint = f"; pass {name}={value.strip()}, not the string {value!r}" if isinstance(value, str) else ""
        kind = type(value).__name__
        raise TypeError(f"{name} must be a number of seconds (int or float), not {kind} {value!r}{hint}")
    return float(value)


def _seconds(name: str, value: Any) -> float:
    if not _number(name, value) > 0:
        raise ValueError(f"{name} must be a positive number of seconds, not {value!r}")
    return float(value)


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, not {value!r}")
    return str(value)


@dataclass(frozen=True)
class Options:
    """The validated options of a vec env (see :class:`~daskvec.vec_env.DaskVecEnv`)."""

    envs_per_actor: int | None = None
    workers: tuple[str, ...] | None = None
    resources: dict[str, float] | None = None
    transport: str = "auto"
    env_process: bool = False
    busy_poll: float = 2e-3
    timeout: float = 300.0
    step_timeout: float = 300.0
    on_worker_lost: str = "restart"
    on_env_error: str = "raise"
    max_restarts: int = 10
    worker_wait_timeout: float = 300.0
    migrate_before: float = 120.0
    auto_rebalance: bool = False
    rebalance_interval: float = 10.0
    #: Set by the vec env, not by the user: the direct channel is TLS (a secured cluster).
    encrypted: bool = False

    @classmethod
    def create(
        cls,
        *,
        envs_per_actor: int | None = None,
        workers: Sequence[str] | None = None,
        resources: dict[str, float] | None = None,
        transport: str = "auto",
        env_process: bool = False,
        busy_poll: float = 2e-3,
        timeout: float = 300.0,
        step_timeout: float | None = None,
        on_worker_lost: str = "restart",
        on_env_error: str = "raise",
        max_restarts: int = 10,
        worker_wait_timeout: float = 300.0,
        migrate_before: float = 120.0,
        auto_rebalance: bool = False,
        rebalance_interval: float = 10.0,
    ) -> Options:
        """Check every option and return them; ``step_timeout`` defaults to ``timeout``.

        Raises
        ------
        ValueError, TypeError
            Naming the first invalid option and what it accepts.
        """
        if envs_per_actor is not None and (
            isinstance(envs_per_actor, bool) or not isinstance(envs_per_actor, int) or envs_per_actor < 1
        ):
            raise ValueError(f"envs_per_actor must be a positive int or None, not {envs_per_actor!r}")
        if isinstance(workers, str):
            raise TypeError(f"workers must be a list of worker addresses or names, not the string {workers!r}")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts must be a non-negative int, not {max_restarts!r}")
        if not isinstance(env_process, bool):
            raise TypeError(f"env_process must be True or False, not {env_process!r}")
        if not _number("migrate_before", migrate_before) >= 0:
            raise ValueError(f"migrate_before must be a number of seconds >= 0, not {migrate_before!r}")
        timeout_s = _seconds("timeout", timeout)
        return cls(
            envs_per_actor=envs_per_actor,
            workers=tuple(workers) if workers else None,
            resources=dict(resources) if resources else None,
            transport=_choice("transport", transport, TRANSPORTS),
            env_process=env_process and os.name == "posix",
            busy_poll=check_busy_poll(busy_poll),
            timeout=timeout_s,
            step_timeout=timeout_s if step_timeout is None else _seconds("step_timeout", step_timeout),
            on_worker_lost=_choice("on_worker_lost", on_worker_lost, ON_WORKER_LOST),
            on_env_error=_choice("on_env_error", on_env_error, ON_ENV_ERROR),
            max_restarts=max_restarts,
            worker_wait_timeout=_seconds("worker_wait_timeout", worker_wait_timeout),
            migrate_before=float(migrate_before),
            auto_rebalance=bool(auto_rebalance),
            rebalance_interval=_seconds("rebalance_interval", rebalance_interval),
        )


def check_env_fns(env_fns: Any) -> list[Callable[[], Any]]:
    """``env_fns`` as a list of factories, or a clear error.

    Raises
    ------
    TypeError
        Not a sequence of callables (e.g. a single factory, or env instances).
    ValueError
        Empty, or two factories that return the same env instance.
    """
    if isinstance(env_fns, (str, bytes)) or not isinstance(env_fns, Sequence):
        if callable(env_fns):
            raise TypeError("env_fns must be a list of env factories, not a single callable; wrap it: [make_env]")
        raise TypeError(f"env_fns must be a list of callables that create envs, not {type(env_fns).__name__}")
    fns = list(env_fns)
    if not fns:
        raise ValueError("env_fns is empty: pass at least one callable that creates an env")
    owner: dict[int, int] = {}
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise TypeError(
                f"env_fns[{i}] is a {type(fn).__name__}, not a callable; pass factories such as "
                "`lambda: gym.make('CartPole-v1')`, not env instances"
            )
        for captured in _captured_envs(fn):
            if id(captured) in owner and owner[id(captured)] != i:
                raise ValueError(
                    f"env_fns[{owner[id(captured)]}] and env_fns[{i}] return the same env instance; "
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
