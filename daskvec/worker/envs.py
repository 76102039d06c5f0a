"""Single envs as an env group sees them.

Stacking their observations (and their action masks), describing their shapes, looking
up attributes through their wrappers, naming their factories, and turning their exceptions into
:class:`~daskvec.protocol.messages.RemoteError` replies. Used by :class:`~daskvec.worker.EnvGroup`
and, for the error messages about observation shapes, by the client's step buffers.
"""

from __future__ import annotations

import copy
import logging
import traceback
from collections.abc import Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from daskvec.protocol.messages import MASK_METHOD, PerEnv, RemoteError

logger = logging.getLogger(__name__)

__all__ = [
    "ARRAY_SPACES",
    "EnvFailure",
    "action_masks",
    "factory_name",
    "has_method",
    "has_wrapper_attr",
    "is_wrapped",
    "obs_shape",
    "remote_error",
    "row",
    "stack_obs",
    "stack_rows",
    "wrapper_attr",
]


#: The spaces whose observations stack into one array (Gymnasium's ``concatenate`` stacks them too).
ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def stack_obs(obs_list: Sequence[Any], space: gym.Space[Any]) -> Any:
    """Stack per-env observations along a new first axis, following ``space``.

    Dict spaces give a dict, Tuple spaces a tuple, of what their subspaces give; array
    spaces (Box, Discrete, MultiDiscrete, MultiBinary) one array, a contiguous buffer
    sent out of band; any other space (Graph, Text, Sequence, OneOf, custom spaces) a
    :class:`~daskvec.protocol.messages.PerEnv` tuple of the observations themselves, as
    Gymnasium's vector envs batch them.
    """
    if isinstance(space, gym.spaces.Dict):
        return {k: stack_obs([o[k] for o in obs_list], sub) for k, sub in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(stack_obs([o[i] for o in obs_list], sub) for i, sub in enumerate(space.spaces))
    if not isinstance(space, ARRAY_SPACES):
        return PerEnv(obs_list)
    try:
        stacked = np.array(obs_list)  # one C call; np.stack does the same in Python
    except ValueError:
        stacked = None
    if stacked is None or stacked.dtype.hasobject or stacked.shape[:1] != (len(obs_list),):
        # ragged or odd observations: np.stack stacks what it can and explains the rest
        return np.stack([np.asarray(o) for o in obs_list])
    return stacked


def stack_rows(obs_list: list[Any], space: gym.Space[Any], env_indices: Sequence[int]) -> Any:
    """:func:`stack_obs` for a group's envs ``env_indices``; the error names each env's observation shape."""
    try:
        return stack_obs(obs_list, space)
    except (ValueError, TypeError, KeyError, IndexError) as e:
        shapes = ", ".join(f"env {i}: {obs_shape(o)}" for i, o in zip(env_indices, obs_list, strict=True))
        raise ValueError(
            f"the observations of envs {list(env_indices)} do not stack ({shapes}): {e}; "
            "make each env's observations match its observation_space"
        ) from e


def obs_shape(obs: Any) -> Any:
    """The shape of one env's observation (per key or entry for dict and tuple ones)."""
    if isinstance(obs, PerEnv):
        return f"{len(obs)} values"
    if isinstance(obs, dict):
        return {k: obs_shape(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(obs_shape(v) for v in obs)
    return np.shape(obs)


def row(stacked: Any, pos: int) -> Any:
    """A copy of env ``pos``'s observation in what :func:`stack_obs` returned."""
    if isinstance(stacked, PerEnv):
        return copy.deepcopy(stacked[pos])
    if isinstance(stacked, dict):
        return {k: row(v, pos) for k, v in stacked.items()}
    if isinstance(stacked, tuple):
        return tuple(row(v, pos) for v in stacked)
    return stacked[pos].copy()


def wrapper_attr(env: Any, name: str) -> Any:
    """``env.get_wrapper_attr(name)``, or plain ``getattr`` for an env that is not a ``gymnasium.Env``."""
    getter = getattr(env, "get_wrapper_attr", None)
    return getter(name) if getter is not None else getattr(env, name)


def has_wrapper_attr(env: Any, name: str) -> bool:
    try:
        wrapper_attr(env, name)
    except AttributeError:
        return False
    return True


def has_method(env: Any, name: str) -> bool:
    try:
        return callable(wrapper_attr(env, name))
    except AttributeError:
        return False


def action_masks(envs: Sequence[Any], env_indices: Sequence[int]) -> np.ndarray | None:
    """Every env's action mask (its ``action_masks()``), stacked; ``None`` when they cannot travel as one array.

    An env whose ``action_masks`` raises, or masks that are not NumPy arrays of one
    dtype and shape, give ``None``: the client then calls ``action_masks`` itself and
    sees the same results (and the same exception) as without this shortcut.
    ``env_indices`` name the envs in the debug log line.
    """
    try:
        masks = [wrapper_attr(env, MASK_METHOD)() for env in envs]
    except Exception:
        logger.debug("action_masks() raised on %s; the client will call it", list(env_indices), exc_info=True)
        return None
    first = masks[0]
    if not isinstance(first, np.ndarray) or first.dtype.hasobject:
        return None
    for m in masks:
        if type(m) is not np.ndarray or m.dtype != first.dtype or m.shape != first.shape:
            return None
    return np.stack(masks)


def is_wrapped(env: gym.Env[Any, Any], wrapper_class: type) -> bool:
    current: Any = env
    while isinstance(current, gym.Wrapper):
        if isinstance(current, wrapper_class):
            return True
        current = current.env
    return False


def factory_name(fn: Any) -> str:
    """A readable name for an env factory (``functools.partial`` shows the function's)."""
    inner = getattr(fn, "func", fn)
    return str(getattr(inner, "__qualname__", None) or type(inner).__name__)


class EnvFailure(Exception):
    """Carries a :class:`RemoteError` out of a group's command (caught by its dispatch)."""

    def __init__(self, error: RemoteError) -> None:
        super().__init__(error.message)
        self.error = error


def remote_error(exc: BaseException, env_index: int | None, worker: str) -> RemoteError:
    """``exc`` as a :class:`~daskvec.protocol.messages.RemoteError` (with the exception itself when it pickles)."""
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        blob: bytes | None = cloudpickle.dumps(exc)
        cloudpickle.loads(blob)
    except Exception:
        blob = None
    return RemoteError(
        type=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback=tb,
        env_index=env_index,
        worker=worker,
        exc=blob,
    )
