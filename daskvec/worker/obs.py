"""What the VecEnv wrappers do to a group's observations, repeated on the worker during a rollout.

The learner's policy sees its envs' observations through the wrappers of its vec env:
``VecFrameStack`` stacks the last frames of each env (and restarts an env's stack when
its episode ends, stacking the episode's last frame onto the old stack as its
``terminal_observation``), ``VecTransposeImage`` turns height x width x channels images
into channels x height x width, ``VecNormalize`` normalises them (here with the
statistics frozen at the rollout's start, :func:`normalize_obs`). For a group to run the
policy on its own envs it must see what the learner would: :class:`ObsChain` repeats
each stage of an :class:`~daskvec.protocol.rollout_records.ObsPipeline` with NumPy alone, step for step
as SB3's ``StackedObservations``, ``VecTransposeImage`` and ``VecNormalize`` do, from the
stacks the client's wrappers held when the rollout started. The client then replays
the raw steps through its own wrappers, so theirs are the observations the learner
keeps; this module only has to agree with them (``tests/test_rollouts_images.py``
checks it against SB3's).

Observations are handled as dicts by key inside the chain (``None`` for a single array),
so that Dict spaces and plain ones take the same path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from daskvec.protocol.rollout_records import FrameStack, ObsPipeline, TransposeImage

__all__ = ["ObsChain", "normalize_obs"]

#: An observation by key (``{None: array}`` for a single array).
Keyed = dict[Any, np.ndarray]


def normalize_obs(obs: Any, norm: dict[str, Any] | None) -> Any:
    """Observations normalised as ``VecNormalize.normalize_obs`` does, with frozen statistics.

    Parameters
    ----------
    obs : numpy.ndarray or dict of numpy.ndarray
        Observations (a dict for a Dict space), a batch or a single one.
    norm : dict or None
        ``mean``, ``var``, ``epsilon`` and ``clip``; for a Dict space ``mean`` and
        ``var`` are dicts by the keys to normalise. ``None`` returns ``obs`` unchanged.

    Returns
    -------
    numpy.ndarray or dict of numpy.ndarray
        ``float32``, clipped to ``[-clip, clip]`` (for a Dict space, the normalised
        entries; the others as they were), or ``obs`` itself.
    """
    if norm is None:
        return obs
    if isinstance(obs, dict):  # a Dict space: the entries VecNormalize normalises (norm_obs_keys)
        out = dict(obs)
        for k, mean in norm["mean"].items():
            out[k] = _normalized(obs[k], mean, norm["var"][k], norm)
        return out
    return _normalized(obs, norm["mean"], norm["var"], norm)


def _normalized(obs: np.ndarray, mean: np.ndarray, var: np.ndarray, norm: dict[str, Any]) -> np.ndarray:
    scaled = (obs - mean) / np.sqrt(var + norm["epsilon"])
    return np.clip(scaled, -norm["clip"], norm["clip"]).astype(np.float32)


def _keyed(obs: Any) -> Keyed:
    return dict(obs) if isinstance(obs, dict) else {None: obs}


def _unkeyed(obs: Keyed) -> Any:
    return obs[None] if list(obs) == [None] else obs


class _Transpose:
    """``VecTransposeImage`` (a batch of images, or one image: the terminal observations)."""

    def __init__(self, stage: TransposeImage) -> None:
        self.keys = stage.keys

    def start(self, obs: Keyed) -> Keyed:
        return self._batch(obs)

    def step(self, obs: Keyed, dones: np.ndarray, terminals: dict[int, Keyed], restack: tuple[int, ...]) -> Keyed:
        for pos, term in terminals.items():
            terminals[pos] = {k: np.transpose(v, (2, 0, 1)) if k in self.keys else v for k, v in term.items()}
        return self._batch(obs)

    def _batch(self, obs: Keyed) -> Keyed:
        return {k: np.transpose(v, (0, 3, 1, 2)) if k in self.keys else v for k, v in obs.items()}


class _Normalize:
    """``VecNormalize``, with the statistics frozen at the rollout's start."""

    def __init__(self, norm: dict[str, Any]) -> None:
        self.norm = norm

    def start(self, obs: Keyed) -> Keyed:
        return _keyed(normalize_obs(_unkeyed(obs), self.norm))

    def step(self, obs: Keyed, dones: np.ndarray, terminals: dict[int, Keyed], restack: tuple[int, ...]) -> Keyed:
        for pos, term in terminals.items():
            terminals[pos] = _keyed(normalize_obs(_unkeyed(term), self.norm))
        return self.start(obs)


class _Stack:
    """``VecFrameStack``: each key's frames stacked as ``StackedObservations.update`` stacks them."""

    def __init__(self, stage: FrameStack, stacks: Any) -> None:
        self.n_stack = stage.n_stack
        self.first = dict(zip(stage.keys, stage.channels_first, strict=True))
        self.dtypes = dict(zip(stage.keys, stage.dtypes, strict=True))
        # a copy: the arrays that arrived may be read-only views of the received message
        self.stacked: Keyed | None = None if stacks is None else {k: np.array(v) for k, v in _keyed(stacks).items()}

    def start(self, obs: Keyed) -> Keyed:
        if self.stacked is None:  # as StackedObservations.reset
            self.stacked = {}
            for k, frames in obs.items():
                shape = list(frames.shape)
                shape[1 if self.first[k] else -1] *= self.n_stack
                stacked = np.zeros(shape, dtype=self.dtypes[k])
                self._put_last(k, stacked, frames)
                self.stacked[k] = stacked
        return dict(self.stacked)

    def step(self, obs: Keyed, dones: np.ndarray, terminals: dict[int, Keyed], restack: tuple[int, ...]) -> Keyed:
        assert self.stacked is not None, "start() first"
        ended = sorted({*np.flatnonzero(dones).tolist(), *restack})
        for k, frames in obs.items():
            first = self.first[k]
            axis = 1 if first else -1
            shift = -frames.shape[axis]
            stacked = np.roll(self.stacked[k], shift, axis=axis)
            for pos in ended:
                term = terminals.get(pos)
                if term is not None:  # the previous frames, then the episode's last one
                    previous = stacked[pos, :shift] if first else stacked[pos, ..., :shift]
                    term[k] = np.concatenate((previous, term[k]), axis=0 if first else -1)
                stacked[pos] = 0
            self._put_last(k, stacked, frames)
            self.stacked[k] = stacked
        return dict(self.stacked)

    def _put_last(self, k: Any, stacked: np.ndarray, frames: np.ndarray) -> None:
        shift = -frames.shape[1 if self.first[k] else -1]
        if self.first[k]:
            stacked[:, shift:, ...] = frames
        else:
            stacked[..., shift:] = frames


class ObsChain:
    """A group's observations through the stages of an :class:`~daskvec.protocol.rollout_records.ObsPipeline`.

    Parameters
    ----------
    pipeline : ObsPipeline or None
        The stages and their state at the rollout's start; ``None``: no stage but
        the normalisation.
    obs : array or dict of arrays
        The group's current observations (stacked over its envs).
    norm : dict or None
        A ``VecNormalize``'s frozen statistics (see :func:`normalize_obs`), applied
        after ``pipeline.norm_at`` stages; ``None``: no normalisation.

    Attributes
    ----------
    seen : array or dict of arrays
        The observations as the policy sees them, after every stage.
    """

    def __init__(self, pipeline: ObsPipeline | None, obs: Any, norm: dict[str, Any] | None = None) -> None:
        self._stages: list[_Stack | _Transpose | _Normalize] = []
        stages = pipeline.stages if pipeline is not None else ()
        stacks = iter(pipeline.stacks if pipeline is not None else ())
        for stage in stages:
            if isinstance(stage, FrameStack):
                self._stages.append(_Stack(stage, next(stacks, None)))
            else:
                self._stages.append(_Transpose(stage))
        if norm is not None:
            at = pipeline.norm_at if pipeline is not None and pipeline.norm_at is not None else len(stages)
            self._stages.insert(at, _Normalize(norm))
        keyed = _keyed(obs)
        for s in self._stages:
            keyed = s.start(keyed)
        self.seen: Any = _unkeyed(keyed)

    def step(
        self, obs: Any, dones: np.ndarray, final_obs: dict[int, Any], restack: tuple[int, ...] = ()
    ) -> dict[int, Any]:
        """Take one step's observations; return the ended episodes' last observations through the stages.

        Parameters
        ----------
        obs : array or dict of arrays
            The step's observations (after the automatic reset of finished envs).
        dones : numpy.ndarray
            Which envs' episodes ended (their stacks restart).
        final_obs : dict of int to observation
            By position: the last observation of each episode that ended.
        restack : tuple of int
            Positions whose stacks restart although the group saw no end (the client
            reports these envs done in this step).

        Returns
        -------
        dict of int to observation
            By position: ``final_obs`` as the policy sees it (a stacked
            ``terminal_observation``, ...); :attr:`seen` is updated.
        """
        keyed = _keyed(obs)
        terminals = {pos: _keyed(o) for pos, o in final_obs.items() if o is not None}
        for s in self._stages:
            keyed = s.step(keyed, dones, terminals, restack)
        self.seen = _unkeyed(keyed)
        return {pos: _unkeyed(t) for pos, t in terminals.items()}
