"""Client side: the action masks that came with the last replies.

sb3-contrib's ``MaskablePPO`` calls ``env_method("action_masks")`` before every step:
without help, one more round trip per group per step. An env group whose envs all
have an ``action_masks`` method sends the masks with every step and reset reply
(:attr:`daskvec.protocol.messages.StepReply.masks`); :class:`ActionMaskCache` keeps them, and
:class:`~daskvec.DaskVecEnv` answers ``env_method("action_masks")`` from it as long as
nothing may have changed the envs since:

- sending a step forgets every mask until its replies bring the new ones;
- ``set_attr`` and any other ``env_method`` forget the masks of the envs they touch;
- a rebuilt env (lost worker, move, env error) brings its mask with its reset reply;
- a reply without masks (envs without the method, masks that are not arrays of one
  shape, an ``action_masks`` that raised) leaves its envs without a cached mask, so the
  call goes to the envs as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["ActionMaskCache"]


class ActionMaskCache:
    """The last known action mask of every env, or ``None`` where it is not known.

    Parameters
    ----------
    n_envs : int
        Envs of the vec env.

    Attributes
    ----------
    hits : int
        ``env_method("action_masks")`` calls answered from the cache.
    misses : int
        Such calls that had to go to the envs.
    """

    def __init__(self, n_envs: int) -> None:
        self._rows: list[np.ndarray | None] = [None] * n_envs
        self._any = False  # whether a row may be known: envs without masks cost nothing per step
        self.hits = 0
        self.misses = 0

    def take(self, env_indices: Sequence[int], masks: Any) -> None:
        """Keep the masks a group's reply brought (``None``: its envs' masks are unknown)."""
        if masks is None:
            self.forget(env_indices)
            return
        self._any = True
        owned = np.array(masks, copy=True)  # the reply's buffer may be reused
        for pos, i in enumerate(env_indices):
            self._rows[i] = owned[pos]

    def forget(self, indices: Iterable[int] | None = None) -> None:
        """Forget the masks of ``indices`` (all envs when ``None``)."""
        if not self._any:
            return
        if indices is None:
            self._rows = [None] * len(self._rows)
            self._any = False
            return
        for i in indices:
            self._rows[i] = None

    def lookup(self, indices: Sequence[int]) -> list[np.ndarray] | None:
        """Copies of the masks of ``indices``, or ``None`` if one of them is not known."""
        rows = [self._rows[i] for i in indices]
        if any(row is None for row in rows):
            self.misses += 1
            return None
        self.hits += 1
        return [np.array(row, copy=True) for row in rows if row is not None]
