"""One vectorized env as an env group steps it: a Gymnasium ``VectorEnv`` or an EnvPool.

A group built from a vector factory (``GroupSpec.vector``) holds one :class:`VectorEnvs`
instead of a list of envs, and steps it with one call per request. This module turns
what the vector env returns (batched arrays, Gymnasium's ``_key``-masked infos) into
what a group replies (columns plus per-env info dicts), and gives the group the
reset semantics it was created with (:class:`~daskvec.protocol.messages.Autoreset`) out of the
vector env's own:

========================  =============================  ==============================
group wants               vector env resets              how
========================  =============================  ==============================
``SAME_STEP`` (SB3)       ``SAME_STEP``                  its ``final_obs``/``final_info``
``SAME_STEP`` (SB3)       ``DISABLED``                   a masked ``reset`` of the finished envs
``SAME_STEP`` (SB3)       EnvPool                        a ``reset`` of the finished envs' ids
``NEXT_STEP``             ``NEXT_STEP`` or EnvPool       as it is
``DISABLED``              ``DISABLED`` or EnvPool        as it is (the client resets by mask)
========================  =============================  ==============================

Other pairs cannot be emulated without stepping some envs and not others, which a
vector env does not allow; they are refused when the group is built, with the
``autoreset_mode`` to give the vector env instead.

Per-env calls (``get_attr``, ``env_method``, ...) reach the envs themselves when the
vector env holds them (``SyncVectorEnv.envs``); otherwise :class:`VectorSlot` stands
for each env, answering attribute reads from the vector env (``get_attr`` where it has
one) and refusing, with a clear error, what would need one env alone.

Imported by every worker: NumPy and Gymnasium only (EnvPool is recognised by its
module name, never imported here).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from daskvec.protocol.messages import Autoreset, ColumnInfos

logger = logging.getLogger(__name__)

__all__ = ["VectorEnvs", "VectorSlot", "VectorStep", "column_infos", "env_info"]

#: The vector env's own resets, as :class:`VectorEnvs` tells them apart.
_SAME, _NEXT, _DISABLED, _ENVPOOL = "SameStep", "NextStep", "Disabled", "EnvPool"

#: Which of its own reset modes a vector env may have for each group mode (see the table above).
_SERVES: dict[Autoreset, tuple[str, ...]] = {
    Autoreset.SAME_STEP: (_SAME, _DISABLED, _ENVPOOL),
    Autoreset.NEXT_STEP: (_NEXT, _ENVPOOL),
    Autoreset.DISABLED: (_DISABLED, _ENVPOOL),
}

#: EnvPool's own bookkeeping in every info: the env's position, which the group knows.
_ENVPOOL_BOOKKEEPING = frozenset({"env_id", "players"})


def _is_envpool(vec: Any) -> bool:
    return any(cls.__module__.split(".")[0] == "envpool" for cls in type(vec).__mro__)


def _mode_of(vec: Any) -> str:
    """The vector env's own reset behaviour: a Gymnasium ``AutoresetMode`` value, or ``"EnvPool"``."""
    if _is_envpool(vec):
        return _ENVPOOL
    mode = (getattr(vec, "metadata", None) or {}).get("autoreset_mode", _NEXT)
    return str(getattr(mode, "value", mode))


@dataclass(slots=True)
class VectorStep:
    """One step of a vector env, as a group replies it (positions within the group).

    Attributes
    ----------
    obs : array, dict or tuple of arrays
        The observations after any reset of finished envs.
    rewards : numpy.ndarray
        ``float64``.
    terminated, truncated : numpy.ndarray
        ``bool``.
    infos : dict of int to dict
        The step's infos, where an env had any.
    final_obs : dict of int to observation
        ``SAME_STEP``: the last observation of each episode that ended.
    reset_infos : dict of int to dict
        ``SAME_STEP``: the reset info of each env reset in this step.
    """

    obs: Any
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[int, dict[str, Any]] = field(default_factory=dict)
    final_obs: dict[int, Any] = field(default_factory=dict)
    reset_infos: dict[int, dict[str, Any]] = field(default_factory=dict)


def env_info(infos: dict[str, Any], i: int, skip: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Env ``i``'s info out of a vector env's batched infos (the inverse of ``VectorEnv._add_info``).

    A key with a ``_key`` mask belongs to the envs the mask selects; a key without one
    (EnvPool's) to every env. Nested dicts (``final_info``) are unbatched the same way.
    Numeric columns give Python scalars, as an env's own info usually holds.

    Parameters
    ----------
    infos : dict
        The batched infos.
    i : int
        The env's position.
    skip : frozenset of str
        Keys to leave out.
    """
    out: dict[str, Any] = {}
    for key, value, mask in _own_keys(infos, skip):
        if mask is not None and not mask[i]:
            continue
        if isinstance(value, dict):
            out[key] = env_info(value, i)
        elif isinstance(value, np.ndarray) and value.ndim == 1 and value.dtype.kind in "biuf":
            out[key] = value[i].item()
        else:
            out[key] = value[i]
    return out


def _own_keys(infos: dict[str, Any], skip: frozenset[str]) -> Iterator[tuple[str, Any, Any]]:
    """The keys of batched infos that are the envs' own (not ``_key`` masks, not in ``skip``): key, value, mask."""
    for key, value in infos.items():
        if key in skip or (key.startswith("_") and key[1:] in infos):
            continue
        yield key, value, infos.get(f"_{key}")


def column_infos(infos: dict[str, Any], n: int, skip: frozenset[str] = frozenset()) -> ColumnInfos | None:
    """Every env's info at once, when each key of ``infos`` is a numeric column for all ``n`` envs.

    What ``{i: env_info(infos, i, skip) for i in range(n)}`` gives, built from the columns
    (a tenth of the time for 64 envs); None where that does not apply: a nested dict
    (``final_info``), a column of objects, a mask that leaves an env out, an unsigned
    64-bit column, or no keys at all. A column of rows (EnvPool's ``ram``) gives each env
    its row, as ``env_info`` does.
    """
    names, columns = [], []
    scalar_dtypes = ColumnInfos.SCALAR_DTYPES
    for key, value, mask in _own_keys(infos, skip):
        if type(value) is not np.ndarray or value.ndim == 0 or len(value) != n:
            return None
        kind = value.dtype.kind
        if kind not in scalar_dtypes or not value.dtype.isnative or value.dtype.itemsize > (4 if kind == "u" else 8):
            return None  # objects, strings, a byte order the wire does not keep, beyond int64 or float64
        if mask is not None and not np.all(mask):
            return None
        names.append(key)
        columns.append(value.astype(scalar_dtypes[kind], copy=False) if value.ndim == 1 else value)
    return ColumnInfos(tuple(names), columns) if names else None


def _rows(obs: Any, idx: np.ndarray) -> Any:
    if isinstance(obs, dict):
        return {k: _rows(v, idx) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_rows(v, idx) for v in obs)
    return obs[idx]


def _row(obs: Any, i: int, space: Any) -> Any:
    """Env ``i``'s observation out of a batch, as an env of ``space`` returns it (a Discrete one as an int)."""
    if isinstance(obs, dict):
        return {k: _row(v, i, space[k]) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_row(v, i, space[j]) for j, v in enumerate(obs))
    if isinstance(space, gym.spaces.Discrete):
        return int(obs[i])
    return np.array(obs[i], copy=True)


def _copy(obs: Any) -> Any:
    if isinstance(obs, dict):
        return {k: _copy(v) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_copy(v) for v in obs)
    return np.array(obs, copy=True)


def _put_rows(obs: Any, idx: np.ndarray, rows: Any) -> Any:
    """``obs`` with rows ``idx`` replaced by ``rows`` (a copy when ``obs`` is not writable)."""
    if isinstance(obs, dict):
        return {k: _put_rows(v, idx, rows[k]) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(_put_rows(v, idx, r) for v, r in zip(obs, rows, strict=True))
    out = obs if obs.flags.writeable else obs.copy()
    out[idx] = rows
    return out


class VectorEnvs:
    """A vectorized env stepped by a group, with the group's reset semantics.

    Parameters
    ----------
    vec : gymnasium.vector.VectorEnv or EnvPool env
        What the group's factory returned.
    autoreset : Autoreset
        When the group resets finished envs.

    Raises
    ------
    TypeError
        ``vec`` is not a vectorized env.
    ValueError
        Its reset mode cannot give the group's (the message says which to use), or it is
        an EnvPool in asynchronous mode (``batch_size < num_envs``).
    """

    def __init__(self, vec: Any, autoreset: Autoreset) -> None:
        missing = [a for a in ("num_envs", "step", "reset", "single_observation_space") if not hasattr(vec, a)]
        if missing:
            raise TypeError(
                f"the vector env factory returned {type(vec).__name__!r}, which has no {', '.join(missing)}; "
                "from_vector_envs takes callables that return a vectorized env (a gymnasium.vector.VectorEnv "
                "such as SyncVectorEnv, or envpool.make_gymnasium(...)); for single envs use the constructor"
            )
        self.vec = vec
        self.n = int(vec.num_envs)
        self.autoreset = autoreset
        self.mode = _mode_of(vec)
        self.envpool = self.mode == _ENVPOOL
        if self.mode not in _SERVES[autoreset]:
            wanted = " or ".join(
                f"AutoresetMode.{m.upper().replace('STEP', '_STEP')}" for m in _SERVES[autoreset] if m != _ENVPOOL
            )
            raise ValueError(
                f"{type(vec).__name__} resets finished envs as autoreset_mode={self.mode!r}, but this vec env's "
                f"groups must reset them as {autoreset.value!r}; build the vector env with autoreset_mode="
                f"{wanted} (e.g. gymnasium.make_vec(..., vector_kwargs={{'autoreset_mode': ...}}))"
            )
        config = getattr(vec, "config", None)
        if self.envpool and isinstance(config, dict) and config.get("batch_size", self.n) not in (0, self.n):
            raise ValueError(
                f"this EnvPool has batch_size={config['batch_size']} < num_envs={self.n} (asynchronous mode); a "
                "group steps all its envs per call: make it with batch_size equal to num_envs (or leave it out)"
            )
        self.skip = _ENVPOOL_BOOKKEEPING if self.envpool else frozenset()
        self.observation_space = vec.single_observation_space
        self.action_space = vec.single_action_space
        subs = getattr(vec, "envs", None)
        #: the envs themselves when the vector env holds them (SyncVectorEnv), else ``None``
        self.sub_envs: list[Any] | None = (
            list(subs) if isinstance(subs, (list, tuple)) and len(subs) == self.n else None
        )

    @property
    def reseeds(self) -> bool:
        """Whether ``reset`` applies seeds (EnvPool takes its seed when it is made, and ignores them)."""
        return not self.envpool

    def describe(self) -> str:
        """What the vector env is, for ``GroupDesc.vector``."""
        return f"{type(self.vec).__name__} of {self.n} ({self.mode})"

    def slots(self) -> list[Any]:
        """What the group's per-env calls reach: the envs themselves, or a :class:`VectorSlot` each."""
        if self.sub_envs is not None:
            return list(self.sub_envs)
        return [VectorSlot(self, pos) for pos in range(self.n)]

    # ------------------------------------------------------------------ step
    def step(self, actions: Any) -> VectorStep:
        """Step every env once; finished envs reset as the group's mode says."""
        if isinstance(actions, list):
            actions = _stack_actions(actions)
        obs, rewards, terminated, truncated, infos = self.vec.step(actions)
        out = VectorStep(
            obs,
            np.asarray(rewards, dtype=np.float64),
            np.asarray(terminated, dtype=bool),
            np.asarray(truncated, dtype=bool),
        )
        done = out.terminated | out.truncated
        if self.autoreset is Autoreset.SAME_STEP and self.mode == _SAME:
            self._same_step_infos(out, infos, done)
            return out
        out.infos = self._infos(infos, range(self.n))
        if self.autoreset is Autoreset.SAME_STEP and done.any():
            finished = np.flatnonzero(done)
            out.final_obs = {int(i): _row(obs, int(i), self.observation_space) for i in finished}
            reset_obs, out.reset_infos = self._reset_rows(finished, None, None)
            out.obs = _put_rows(obs, finished, reset_obs)
        return out

    def _same_step_infos(self, out: VectorStep, infos: dict[str, Any], done: np.ndarray) -> None:
        """A ``SAME_STEP`` vector env: the step's infos of finished envs are in ``final_info``."""
        final_obs, final_info = infos.get("final_obs"), infos.get("final_info", {})
        rest = {k: v for k, v in infos.items() if k not in ("final_obs", "_final_obs", "final_info", "_final_info")}
        if not done.any():  # no episode ended: every env's info is in the columns
            columns = column_infos(rest, self.n, self.skip)
            if columns is not None:
                out.infos = columns
                return
        for i in range(self.n):
            info = env_info(rest, i, self.skip)
            if done[i]:
                out.final_obs[i] = final_obs[i] if final_obs is not None else None
                step_info = env_info(final_info, i, self.skip)
                if step_info:
                    out.infos[i] = step_info
                out.reset_infos[i] = info
            elif info:
                out.infos[i] = info

    def _infos(self, infos: dict[str, Any], positions: Sequence[int] | range) -> dict[int, dict[str, Any]]:
        if positions == range(self.n):
            columns = column_infos(infos, self.n, self.skip)
            if columns is not None:
                return columns
        out = {}
        for i in positions:
            info = env_info(infos, i, self.skip)
            if info:
                out[int(i)] = info
        return out

    # ------------------------------------------------------------------ reset
    def reset(
        self,
        seeds: Sequence[int | None],
        options: Sequence[dict[str, Any] | None],
        mask: Sequence[bool] | None = None,
        current: Any = None,
    ) -> tuple[Any, list[dict[str, Any]]]:
        """Reset every env (or those ``mask`` selects) with its seed; return the observations and reset infos.

        With ``mask``, the envs left out keep their row of ``current`` (the group's last
        observations) and get an empty reset info.

        Raises
        ------
        ValueError
            Options that differ between the envs (a vector env takes one dict for all).
        """
        opts = self.check_options(options, mask)
        if mask is not None and not all(mask):
            chosen = np.flatnonzero(np.asarray(mask, dtype=bool))
            rows, infos = self._reset_rows(chosen, [seeds[int(i)] for i in chosen], opts)
            return _put_rows(_copy(current), chosen, rows), [infos.get(i, {}) for i in range(self.n)]
        seed = self._seed_arg(list(seeds))
        kwargs: dict[str, Any] = {} if opts is None else {"options": dict(opts)}
        obs, infos = self.vec.reset(seed=seed, **kwargs) if seed is not None else self.vec.reset(**kwargs)
        return obs, [env_info(infos, i, self.skip) for i in range(self.n)]

    def check_options(
        self, options: Sequence[dict[str, Any] | None], mask: Sequence[bool] | None = None
    ) -> dict[str, Any] | None:
        """The one options dict a reset of the envs ``mask`` selects passes to the vector env.

        Raises
        ------
        ValueError
            The envs were given different options: a vector env takes one dict for all.
        """
        return _one_options([o for o, m in zip(options, mask or [True] * self.n, strict=True) if m])

    def _seed_arg(self, seeds: list[int | None]) -> list[int | None] | None:
        if all(s is None for s in seeds):
            return None
        if not self.reseeds:
            logger.debug("%s ignores reset seeds (EnvPool takes its seed when made)", type(self.vec).__name__)
            return None
        return seeds

    def _reset_rows(
        self, chosen: np.ndarray, seeds: Sequence[int | None] | None, opts: dict[str, Any] | None
    ) -> tuple[Any, dict[int, dict[str, Any]]]:
        """Reset the envs at ``chosen`` only; return their new rows (in ``chosen``'s order) and reset infos."""
        if self.envpool:
            obs, infos = self.vec.reset(np.asarray(chosen, dtype=np.int32))
            ids = np.asarray(infos.get("env_id", chosen)).tolist()
            order = np.argsort(ids)  # EnvPool answers in its own order: rows by env id
            by_pos = {int(chosen[k]): env_info(infos, int(order[k]), self.skip) for k in range(len(chosen))}
            return _rows(obs, order), by_pos
        mask = np.zeros(self.n, dtype=bool)
        mask[chosen] = True
        options = {**(opts or {}), "reset_mask": mask}
        seed = None
        if seeds is not None and any(s is not None for s in seeds):
            full: list[int | None] = [None] * self.n
            for i, s in zip(chosen, seeds, strict=True):
                full[int(i)] = s
            seed = full
        obs, infos = self.vec.reset(seed=seed, options=options)
        return _rows(obs, chosen), {int(i): env_info(infos, int(i), self.skip) for i in chosen}

    def close(self) -> None:
        """Close the vector env (and the envs it holds)."""
        self.vec.close()


def _one_options(options: Sequence[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The one options dict a vector env's ``reset`` takes, from the per-env ones."""
    given = [o for o in options if o]
    if not given:
        return None
    first = given[0]
    if len(given) != len(options) or any(o != first for o in given):
        raise ValueError(
            "reset options differ between the envs of one vector env, which takes one options dict for all "
            "its envs; pass the same options to each of them"
        )
    return dict(first)


def _stack_actions(actions: list[Any]) -> Any:
    """Rows of Dict or Tuple actions, as the vector env's batched action."""
    first = actions[0]
    if isinstance(first, dict):
        return {k: _stack_actions([a[k] for a in actions]) for k in first}
    if isinstance(first, tuple):
        return tuple(_stack_actions([a[j] for a in actions]) for j in range(len(first)))
    return np.stack([np.asarray(a) for a in actions])


class VectorSlot:
    """Env ``pos`` of a vector env that does not hold its envs where a group can reach them.

    Attribute reads go to the vector env's ``get_attr`` (one value per env) when it has
    one, else to the vector env itself (its value, the same for all its envs). Methods,
    attribute writes and rendering would act on every env at once, or are not
    reachable, so they raise a clear error rather than do that.
    """

    _owner: VectorEnvs
    _pos: int

    def __init__(self, owner: VectorEnvs, pos: int) -> None:
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_pos", pos)

    @property
    def observation_space(self) -> Any:
        """One env's observation space (the vector env's ``single_observation_space``)."""
        return self._owner.observation_space

    @property
    def action_space(self) -> Any:
        """One env's action space (the vector env's ``single_action_space``)."""
        return self._owner.action_space

    def _what(self) -> str:
        return f"{type(self._owner.vec).__name__} does not give access to its envs one by one"

    def get_wrapper_attr(self, name: str) -> Any:
        """The attribute ``name`` of this env (or of the vector env); methods are refused."""
        vec = self._owner.vec
        getter = getattr(vec, "get_attr", None)
        if callable(getter):
            return getter(name)[self._pos]
        value = getattr(vec, name)  # an AttributeError here is the answer
        if callable(value):
            raise AttributeError(
                f"{name!r} is a method of the vector env, not of env {self._pos} alone: {self._what()}; "
                "per-env methods need a vector env that holds its envs (gymnasium.vector.SyncVectorEnv)"
            )
        return value

    def set_wrapper_attr(self, name: str, value: Any) -> None:
        """Refused: setting an attribute would set it for every env of the vector env."""
        raise NotImplementedError(f"cannot set {name!r} on one env: {self._what()}")

    def __setattr__(self, name: str, value: Any) -> None:
        self.set_wrapper_attr(name, value)

    def render(self) -> Any:
        """Refused: render the vector env as a whole instead."""
        raise NotImplementedError(f"cannot render one env: {self._what()}")

    def __repr__(self) -> str:
        return f"VectorSlot({type(self._owner.vec).__name__}, {self._pos})"
