"""The Gymnasium face's arguments, checked, and how its batches are laid out.

:class:`~daskvec.gymnasium.vector_env.DaskVectorEnv` keeps the ``VectorEnv`` API and its state;
this module holds what it checks of its arguments with Gymnasium's (``SyncVectorEnv``'s)
errors and messages, and how a batch maps to envs and groups: the autoreset mode and
partial-batch size (:func:`autoreset_mode`, :func:`batch_size`), the observation mode
checked against the envs' spaces (:class:`ObservationMode`, the engine's ``SpaceCheck``),
seeds (:func:`seeds`), a reset's options and mask (:func:`reset_options`), actions as rows
(:func:`action_rows`) and a partial batch's actions split by group (:func:`group_rows`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces.utils import is_space_dtype_shape_equiv
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_differing_spaces, batch_space, iterate

from daskvec._core.handles import Group
from daskvec.worker.envs import ARRAY_SPACES

__all__ = ["ObservationMode", "action_rows", "autoreset_mode", "batch_size", "group_rows", "reset_options", "seeds"]


def autoreset_mode(value: Any) -> AutoresetMode:
    """``value`` as Gymnasium's ``AutoresetMode`` (a member, its value or its name)."""
    if isinstance(value, AutoresetMode):
        return value
    with contextlib.suppress(ValueError, KeyError, TypeError):
        return AutoresetMode(value) if value in {m.value for m in AutoresetMode} else AutoresetMode[str(value)]
    raise ValueError(
        f"autoreset_mode must be a gymnasium.vector.AutoresetMode or one of "
        f"{[m.value for m in AutoresetMode]}, not {value!r}"
    )


def batch_size(value: Any, n_envs: int) -> int:
    """How many envs a partial batch holds at least (``None``: all ``n_envs``)."""
    if value is None:
        return n_envs
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 1 <= value <= n_envs:
        raise ValueError(f"batch_size must be an int from 1 to num_envs={n_envs}, not {value!r}")
    return int(value)


class ObservationMode:
    """Gymnasium's ``observation_mode``, checked against the envs' spaces (an engine ``SpaceCheck``).

    ``"same"``: every env has env 0's observation space, batched with ``batch_space``;
    ``"different"``: spaces of one shape and dtype, batched with ``batch_differing_spaces``;
    ``(batched space, single space)``: given, each env's of the single one's shape and
    dtype. Action spaces must always be equal. The errors are ``SyncVectorEnv``'s.
    """

    def __init__(self, mode: Any) -> None:
        if isinstance(mode, tuple) and len(mode) == 2:
            if not isinstance(mode[0], gym.Space) or not isinstance(mode[1], gym.Space):
                raise TypeError(
                    f"Expected both elements of observation_mode to be Spaces, got {type(mode[0])} and {type(mode[1])}"
                )
        elif not (isinstance(mode, str) and mode in ("same", "different")):
            raise ValueError(
                "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
                f"observation space, actual got {mode}"
            )
        self.mode = mode
        self.batched: gym.Space[Any] | None = None  # the vec env's observation_space, once checked

    def __call__(
        self, observation_spaces: list[gym.Space[Any]], action_spaces: list[gym.Space[Any]]
    ) -> tuple[gym.Space[Any], gym.Space[Any]]:
        mode, n = self.mode, len(observation_spaces)
        if isinstance(mode, tuple):
            batched, single = mode
        elif mode == "same":
            single = observation_spaces[0]
            batched = batch_space(single, n)
        else:
            single = observation_spaces[0]
            batched = batch_differing_spaces(observation_spaces)
        for space in observation_spaces:
            if mode == "same":
                if space != single:
                    raise RuntimeError(
                        "DaskVectorEnv(..., observation_mode='same') however the sub-environments observation spaces "
                        f"are not equivalent. single_observation_space={single}, sub-environment "
                        f"observation_space={space}. If this is intentional, use `observation_mode='different'` "
                        "instead."
                    )
            elif not is_space_dtype_shape_equiv(space, single):
                raise RuntimeError(
                    "DaskVectorEnv(..., observation_mode='different' or custom space) however the sub-environments "
                    "observation spaces do not share a common shape and dtype, "
                    f"single_observation_space={single}, sub-environment observation space={space}"
                )
        for space in action_spaces:
            if space != action_spaces[0]:
                raise RuntimeError(
                    f"Sub-environment action space doesn't make the `single_action_space`, action_space={space}, "
                    f"single_action_space={action_spaces[0]}"
                )
        self.batched = batched
        return single, action_spaces[0]


def seeds(seed: Any, num_envs: int) -> list[int | None]:
    """One seed per env: ``None`` for none, ``seed + i`` for an int, else the list given (of ``num_envs``)."""
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [int(seed) + i for i in range(num_envs)]
    given = list(seed)
    if len(given) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} but got length={len(given)}."
        )
    return given


def reset_options(
    options: dict[str, Any] | None, num_envs: int, has_obs: bool
) -> tuple[dict[str, Any] | None, np.ndarray | None]:
    """A reset's ``options`` for the envs, and its ``"reset_mask"`` apart (``None``: every env).

    The mask is checked with ``SyncVectorEnv``'s errors; a mask of only ``True`` is a full
    reset (which the first one may be); a mask leaving envs out is refused before every
    env has an observation (``has_obs``).
    """
    env_options = dict(options) if options is not None else None
    if env_options is None or "reset_mask" not in env_options:
        return env_options, None
    mask = env_options.pop("reset_mask")
    if not isinstance(mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(mask)}")
    if mask.shape != (num_envs,):
        raise ValueError(f"`options['reset_mask']` must have shape `({num_envs},)`, got {mask.shape}")
    if mask.dtype != np.bool_:
        raise TypeError(f"`options['reset_mask']` must have `dtype=np.bool_`, got {mask.dtype}")
    if not mask.any():
        raise ValueError(
            f"`options['reset_mask']` must contain a boolean array with at least one True value, got reset_mask={mask}"
        )
    if mask.all():
        return env_options, None
    if not has_obs:
        raise ValueError(
            "options['reset_mask'] leaves envs out before their first reset, when they have no observation: "
            "reset every env once (no mask, or a mask of only True) first"
        )
    return env_options, mask


def action_rows(actions: Any, n: int, space: gym.Space[Any], batched: gym.Space[Any] | None = None) -> Any:
    """``n`` envs' actions as something indexable by row: an array for array spaces, else a list of per-env actions.

    ``space`` is one env's action space; ``batched``, the batched space of ``n`` envs if at hand.
    """
    if isinstance(space, ARRAY_SPACES):
        rows: Any = actions if isinstance(actions, np.ndarray) else np.asarray(actions)
    else:  # Dict, Tuple, and spaces Gymnasium batches as a tuple of per-env actions
        rows = list(iterate(batched if batched is not None else batch_space(space, n), actions))
    count = len(rows) if getattr(rows, "ndim", 1) else None  # a 0-d array (a bare number) has no len()
    if count != n:
        got = "a single action, not a batch of" if count is None else count
        raise ValueError(f"got {got} actions for {n} envs; pass one action per env (first axis of length {n})")
    return rows


def group_rows(groups: Sequence[Group], ids: Sequence[int], rows: Any, busy: set[str]) -> dict[Group, Any]:
    """A partial batch's actions split by group: row ``k`` of ``rows`` is env ``ids[k]``'s action.

    ``ids`` must name whole groups, none of them ``busy`` (gids of groups with a step in
    flight or a batch not handed out yet), each env once; the error says what to pass.
    """
    row_of = {i: k for k, i in enumerate(ids)}
    if len(row_of) != len(ids):
        raise ValueError(f"env_ids {list(ids)} name an env twice; name each env once")
    sends: dict[Group, Any] = {}
    for g in groups:
        wanted = [i in row_of for i in g.env_indices]
        if not any(wanted):
            continue
        if not all(wanted) or g.gid in busy:
            why = "has a step in flight" if all(wanted) else "is only partly named"
            raise ValueError(
                f"the group of envs {g.env_indices} {why}; send() takes whole groups with no step in "
                "flight: pass the info['env_id'] of a batch that recv() returned"
            )
        positions = [row_of[i] for i in g.env_indices]
        sends[g] = rows[np.asarray(positions)] if isinstance(rows, np.ndarray) else [rows[k] for k in positions]
    return sends
