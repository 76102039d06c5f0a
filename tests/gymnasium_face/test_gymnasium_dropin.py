"""DaskVectorEnv as a drop-in for Gymnasium's vector envs.

Each test runs the same assertions against ``SyncVectorEnv``, ``AsyncVectorEnv`` and
``DaskVectorEnv`` (those of AsyncVectorEnv's split calls against the last two only):
per-env tuples for spaces that do not batch into arrays, ``np_random_seed`` per env,
``observation_mode``, Gymnasium's exception types, ``options`` on every reset, a
``reset_mask`` on the first reset, ``reset_async``/``step_async``/``call_async`` and
their waits with AsyncVectorEnv's state rules, and AsyncVectorEnv's keywords.
Where results are compared, the reference is ``SyncVectorEnv`` on the same envs.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import multiprocessing
import re
import time
from collections.abc import Iterator
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gym_helpers import BoundsEnv
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.spaces import Box, Dict, Discrete, Graph, OneOf, Sequence, Text
from gymnasium.utils.env_checker import data_equivalence
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_differing_spaces

import daskvec
from daskvec.errors import AlreadySteppingError, ClosedEnvError, DaskVecEnvError
from daskvec.gymnasium.vector_env import DaskVectorEnv

pytestmark = pytest.mark.timeout(180)

KINDS = ["sync", "async", "dask"]
SPLIT = ["async", "dask"]  # the vec envs with AsyncVectorEnv's split calls


# --------------------------------------------------------------------------- envs
class EchoEnv(gym.Env[Any, Any]):
    """Observation and action space ``space``: a seeded sample at reset, each step's action echoed back.

    A step with an action outside the space raises, so that actions mixed up between
    envs, or mangled on the way (a string made a NumPy scalar), are seen.
    """

    def __init__(self, space: gym.Space[Any]) -> None:
        self.observation_space = self.action_space = space

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if type(action) is np.str_ or action not in self.action_space:
            raise ValueError(f"action {action!r} ({type(action).__name__}) is not in {self.action_space}")
        return action, 1.0, False, False, {}


class AnyOf(gym.Space[Any]):
    """A custom space, unknown to Gymnasium's batching: ints from 0 to 10."""

    def sample(self, mask: Any = None, probability: Any = None) -> Any:
        return int(self.np_random.integers(0, 11))

    def contains(self, x: Any) -> bool:
        return isinstance(x, int) and 0 <= x <= 10

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AnyOf)

    def __hash__(self) -> int:
        return hash(AnyOf)


class OptionsEnv(gym.Env[np.ndarray, Any]):
    """Its ``reset`` requires ``options`` (no default: Gymnasium always passes it) and reports what it got."""

    observation_space = Box(-1.0, 1.0, (1,), dtype=np.float32)
    action_space = Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:  # type: ignore[override]
        super().reset(seed=seed)
        return np.zeros(1, np.float32), {"options": None if options is None else dict(options)}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        return np.zeros(1, np.float32), 0.0, False, False, {}


class SlowEnv(gym.Env[np.ndarray, np.ndarray]):
    """A step sleeps as many seconds as its action says; a reset ``slow_reset`` seconds."""

    observation_space = Box(0.0, 1.0, (2,), dtype=np.float32)
    action_space = Box(0.0, 10.0, (), dtype=np.float32)

    def __init__(self, slow_reset: float = 0.0) -> None:
        self.slow_reset = slow_reset

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        time.sleep(self.slow_reset)
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(float(action))
        return np.ones(2, np.float32), float(action), False, False, {}


# --------------------------------------------------------------------------- the three vec envs
class Vectorizer:
    """Builds vec envs of one kind (``"sync"``, ``"async"`` or ``"dask"``) and closes them after the test."""

    def __init__(self, kind: str, client: Any) -> None:
        self.kind, self.client = kind, client
        self.made: list[Any] = []

    def make(self, env_fns: list[Any], **kwargs: Any) -> Any:
        """The vec env of this kind for ``env_fns`` (``kwargs``: Gymnasium's vec env keywords)."""
        if self.kind == "sync":
            envs: Any = SyncVectorEnv(env_fns, **kwargs)
        elif self.kind == "async":
            kwargs.setdefault("shared_memory", False)  # the spaces that need it are not what is compared
            envs = AsyncVectorEnv(env_fns, **kwargs)
        else:
            envs = DaskVectorEnv(env_fns, self.client, envs_per_actor=2, **kwargs)
        self.made.append(envs)
        return envs

    def make_vec(self, env_id: str, num_envs: int, vector_kwargs: dict[str, Any] | None = None) -> Any:
        """``gymnasium.make_vec`` (sync or async), or ``daskvec.make_vec``."""
        envs: Any
        if self.kind == "dask":
            envs = daskvec.make_vec(env_id, num_envs, client=self.client, vector_kwargs=vector_kwargs)
        else:
            envs = gym.make_vec(env_id, num_envs, vectorization_mode=self.kind, vector_kwargs=vector_kwargs)
        self.made.append(envs)
        return envs

    def close(self) -> None:
        for envs in self.made:
            if not envs.closed:
                with warnings_ignored():
                    envs.close(terminate=True) if self.kind == "async" else envs.close()


@contextlib.contextmanager
def warnings_ignored() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture(params=KINDS)
def vec(request: Any, client2: Any) -> Iterator[Vectorizer]:
    v = Vectorizer(request.param, client2)
    try:
        yield v
    finally:
        v.close()


@pytest.fixture(params=SPLIT)
def split_vec(request: Any, client2: Any) -> Iterator[Vectorizer]:
    v = Vectorizer(request.param, client2)
    try:
        yield v
    finally:
        v.close()


def reference(env_fns: list[Any], **kwargs: Any) -> Any:
    """``SyncVectorEnv`` on the same envs: the results every vec env must give."""
    return contextlib.closing(SyncVectorEnv(env_fns, **kwargs))


def assert_equivalent(got: Any, want: Any, where: str) -> None:
    assert type(got) is type(want), f"{where}: {type(got).__name__} vs {type(want).__name__}"
    assert data_equivalence(got, want, exact=True), f"{where}: {got!r} vs {want!r}"


# --------------------------------------------------------------------------- non-array spaces
NON_ARRAY_SPACES = {
    "text": Text(5),
    "graph": Graph(node_space=Box(0.0, 1.0, (2,), dtype=np.float32), edge_space=Discrete(3)),
    "sequence": Sequence(Discrete(4)),
    "oneof": OneOf((Discrete(3), Box(-1.0, 1.0, (2,), dtype=np.float32))),
    "custom": AnyOf(),
    "dict-with-text": Dict({"name": Text(4), "pos": Box(-1.0, 1.0, (2,), dtype=np.float32)}),
}


@pytest.mark.parametrize("space_id", list(NON_ARRAY_SPACES))
def test_spaces_that_do_not_batch_are_per_env_tuples(vec: Vectorizer, space_id: str) -> None:
    """Graph, Text, Sequence, OneOf and custom spaces (also inside a Dict): observations come as a
    tuple of per-env values and actions go as one, on the workers too."""
    space = NON_ARRAY_SPACES[space_id]
    fns = [functools.partial(EchoEnv, space)] * 3
    envs = vec.make(fns)
    with reference(fns) as ref:
        assert envs.observation_space == ref.observation_space and envs.action_space == ref.action_space
        obs, _ = envs.reset(seed=5)
        assert_equivalent(obs, ref.reset(seed=5)[0], "reset")
        assert obs in envs.observation_space
        leaf = obs["name"] if isinstance(obs, dict) else obs
        assert isinstance(leaf, tuple) and len(leaf) == 3
        ref.action_space.seed(1)
        for t in range(2):
            actions = ref.action_space.sample()
            got, want = envs.step(actions), ref.step(actions)
            assert_equivalent(got[0], want[0], f"step {t} observations")
            assert_equivalent(got[0], actions, f"step {t}: each env's action echoed back")
            np.testing.assert_array_equal(got[1], want[1])


# --------------------------------------------------------------------------- seeding
def test_np_random_seed_and_np_random_are_per_env(vec: Vectorizer) -> None:
    """After reset(seed=42): np_random_seed == (42, 43, 44), kept by reset(seed=None); np_random is
    each env's generator (make_vec)."""
    envs = vec.make_vec("CartPole-v1", 3)
    ref: Any = gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")
    try:
        envs.reset(seed=42), ref.reset(seed=42)
        assert envs.np_random_seed == (42, 43, 44)
        envs.reset(), ref.reset()
        assert envs.np_random_seed == (42, 43, 44)
        generators = envs.np_random
        assert isinstance(generators, tuple) and len(generators) == 3
        for got, want in zip(generators, ref.np_random, strict=True):
            assert isinstance(got, np.random.Generator)
            assert got.bit_generator.state == want.bit_generator.state
    finally:
        ref.close()


# --------------------------------------------------------------------------- observation_mode
def test_observation_mode(vec: Vectorizer) -> None:
    """``"different"`` batches spaces of one shape with other bounds; a (batched, single) pair is taken as
    given; "same" with such spaces, and an unknown mode, raise Gymnasium's errors."""
    spaces = [Box(0.0, float(i), (2,), dtype=np.float32) for i in (1, 2, 3)]
    fns = [functools.partial(BoundsEnv, float(i)) for i in (1, 2, 3)]
    envs = vec.make(fns, observation_mode="different")
    assert envs.observation_space == batch_differing_spaces(spaces)
    assert envs.single_observation_space == spaces[0]
    with reference(fns, observation_mode="different") as ref:
        assert_equivalent(envs.reset(seed=2)[0], ref.reset(seed=2)[0], "reset")
        assert_equivalent(envs.step(np.array([1, 0, 1]))[0], ref.step(np.array([1, 0, 1]))[0], "step")
    custom = (Box(0.0, 4.0, (3, 2), dtype=np.float32), Box(0.0, 4.0, (2,), dtype=np.float32))
    envs = vec.make(fns, observation_mode=custom)
    assert envs.observation_space == custom[0] and envs.single_observation_space == custom[1]
    envs.reset(seed=0)
    with pytest.raises(RuntimeError, match=re.escape("If this is intentional, use `observation_mode='different'`")):
        vec.make(fns, observation_mode="same")
    with pytest.raises(RuntimeError, match="do not share a common shape and dtype"):
        vec.make([functools.partial(BoundsEnv, 1.0, (k,)) for k in (2, 2, 3)], observation_mode=custom)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "Invalid `observation_mode`, expected: 'same' or 'different' or tuple of single and batch "
            "observation space, actual got invalid"
        ),
    ):
        vec.make(fns, observation_mode="invalid")


# --------------------------------------------------------------------------- exception types
def test_mismatched_sub_env_spaces_raise_runtime_error(vec: Vectorizer) -> None:
    with pytest.raises(RuntimeError):
        vec.make([functools.partial(BoundsEnv, 1.0, n_actions=n) for n in (2, 2, 3)])
    with pytest.raises(RuntimeError):
        vec.make([functools.partial(BoundsEnv, 1.0, (k,)) for k in (2, 3, 2)])


def test_use_after_close_raises_closed_environment_error(split_vec: Vectorizer) -> None:
    """As AsyncVectorEnv (SyncVectorEnv does not check)."""
    envs = split_vec.make([functools.partial(BoundsEnv, 1.0)] * 3)
    envs.reset(seed=0)
    envs.close()
    for call in (lambda: envs.reset(), lambda: envs.step(np.zeros(3, np.int64)), lambda: envs.get_attr("spec")):
        with pytest.raises(ClosedEnvironmentError):
            call()
    envs.close()  # a second close() is harmless


def test_daskvec_call_order_errors_are_gymnasium_errors() -> None:
    """Code written for AsyncVectorEnv catches daskvec's errors with Gymnasium's types, and code written
    for daskvec with daskvec's."""
    assert issubclass(ClosedEnvError, ClosedEnvironmentError) and issubclass(ClosedEnvError, DaskVecEnvError)
    assert issubclass(AlreadySteppingError, AlreadyPendingCallError) and issubclass(
        AlreadySteppingError, DaskVecEnvError
    )
    assert issubclass(daskvec.NoAsyncCallError, NoAsyncCallError) and issubclass(
        daskvec.NoAsyncCallError, DaskVecEnvError
    )
    err = AlreadySteppingError("pending", "step")
    assert err.name == "step" and str(err) == "pending"


# --------------------------------------------------------------------------- options and reset masks
def test_options_reach_every_reset(vec: Vectorizer) -> None:
    """Every reset calls env.reset(seed=..., options=...): None when none were given, the dict
    otherwise (without "reset_mask"), so that an env whose options parameter has no default works."""
    fns = [OptionsEnv] * 3
    envs = vec.make(fns)
    with reference(fns) as ref:
        for options in (None, {}, {"level": 2}):
            kwargs = {} if options is None else {"options": dict(options)}
            assert_equivalent(envs.reset(seed=1, **kwargs)[1], ref.reset(seed=1, **kwargs)[1], f"options={options}")
        masked = {"reset_mask": np.array([True, False, True]), "level": 3}
        assert_equivalent(envs.reset(options=dict(masked))[1], ref.reset(options=dict(masked))[1], "masked reset")


def test_reset_mask_of_only_true_is_a_first_reset(vec: Vectorizer) -> None:
    """reset(options={"reset_mask": all True}) works as the first reset; an all-False mask raises
    Gymnasium's error."""
    fns = [functools.partial(BoundsEnv, 1.0)] * 3
    envs = vec.make(fns, autoreset_mode=AutoresetMode.DISABLED)
    with reference(fns, autoreset_mode=AutoresetMode.DISABLED) as ref:
        mask = np.ones(3, dtype=bool)
        got = envs.reset(seed=[4, 5, 6], options={"reset_mask": mask.copy()})
        want = ref.reset(seed=[4, 5, 6], options={"reset_mask": mask.copy()})
        assert_equivalent(got, want, "first reset with a mask")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            "got reset_mask=[False False False]"
        ),
    ):
        envs.reset(options={"reset_mask": np.zeros(3, dtype=bool)})


# --------------------------------------------------------------------------- AsyncVectorEnv's split calls
def test_split_calls_give_the_results_of_the_plain_ones(split_vec: Vectorizer) -> None:
    fns = [functools.partial(gym.make, "CartPole-v1")] * 3
    envs = split_vec.make(fns)
    with reference(fns) as ref:
        envs.reset_async(seed=9)
        assert_equivalent(envs.reset_wait(), ref.reset(seed=9), "reset")
        for t in range(3):
            actions = np.array([t % 2, 1, 0])
            envs.step_async(actions)
            got, want = envs.step_wait(), ref.step(actions)
            for name, x, y in zip(("obs", "rewards", "terminations", "truncations", "infos"), got, want, strict=True):
                assert_equivalent(x, y, f"step {t} {name}")
        envs.call_async("np_random_seed")
        assert envs.call_wait() == ref.call("np_random_seed") == (9, 10, 11)


def test_split_calls_follow_async_vector_envs_state_rules(split_vec: Vectorizer) -> None:
    """AlreadyPendingCallError and NoAsyncCallError, with AsyncVectorEnv's messages; close() with a
    pending call warns as AsyncVectorEnv's does."""
    envs = split_vec.make([functools.partial(BoundsEnv, 1.0)] * 3)
    with pytest.raises(
        NoAsyncCallError, match=re.escape("Calling `reset_wait` without any prior call to `reset_async`.")
    ):
        envs.reset_wait()
    envs.reset_async(seed=0)
    with pytest.raises(
        AlreadyPendingCallError,
        match=re.escape("Calling `step_async` while waiting for a pending call to `reset` to complete."),
    ):
        envs.step_async(np.zeros(3, np.int64))
    envs.reset_wait()
    with pytest.raises(
        NoAsyncCallError, match=re.escape("Calling `step_wait` without any prior call to `step_async`.")
    ):
        envs.step_wait()
    with pytest.raises(
        NoAsyncCallError, match=re.escape("Calling `call_wait` without any prior call to `call_async`.")
    ):
        envs.call_wait()
    envs.step_async(np.zeros(3, np.int64))
    with pytest.raises(
        AlreadyPendingCallError,
        match=re.escape("Calling `reset_async` while waiting for a pending call to `step` to complete"),
    ):
        envs.reset_async()
    with pytest.raises(
        AlreadyPendingCallError,
        match=re.escape("Calling `call_async` while waiting for a pending call to `step` to complete."),
    ):
        envs.call_async("spec")
    envs.step_wait()
    envs.call_async("spec")
    with pytest.raises(AlreadyPendingCallError, match="pending call to `call`"):
        envs.step_async(np.zeros(3, np.int64))
    with pytest.warns(
        UserWarning, match=re.escape("Calling `close` while waiting for a pending call to `call` to complete.")
    ):
        envs.close()


def test_waits_with_a_timeout_raise_multiprocessing_timeout_error(split_vec: Vectorizer) -> None:
    """step_wait(timeout=...) and reset_wait(timeout=...) raise multiprocessing.TimeoutError when an env
    is slower than the timeout."""
    envs = split_vec.make([SlowEnv] * 3)
    envs.reset(seed=0)
    envs.step_async(np.array([0.0, 3.0, 0.0], dtype=np.float32))
    with pytest.raises(
        multiprocessing.TimeoutError, match=re.escape("The call to `step_wait` has timed out after 0.1 second(s).")
    ):
        envs.step_wait(timeout=0.1)
    slow = split_vec.make([functools.partial(SlowEnv, slow_reset=3.0)] * 2)
    slow.reset_async()
    with pytest.raises(multiprocessing.TimeoutError, match="The call to `reset_wait` has timed out"):
        slow.reset_wait(timeout=0.1)


def test_a_timed_out_wait_stays_pending(client2: Any) -> None:
    """daskvec's choice where AsyncVectorEnv leaves the replies in its pipes: after the timeout the step
    is still pending, and the next step_wait() returns it."""
    with contextlib.closing(DaskVectorEnv([SlowEnv] * 2, client2)) as envs:
        envs.reset(seed=0)
        envs.step_async(np.array([0.0, 1.5], dtype=np.float32))
        with pytest.raises(multiprocessing.TimeoutError):
            envs.step_wait(timeout=0.05)
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(np.zeros(2, np.float32))
        obs, rewards, *_ = envs.step_wait(timeout=60)
        assert rewards.tolist() == [0.0, 1.5] and obs.tolist() == [[1.0, 1.0], [1.0, 1.0]]


# --------------------------------------------------------------------------- AsyncVectorEnv's keywords
def test_async_vector_env_keywords_are_accepted(split_vec: Vectorizer, caplog: Any) -> None:
    """shared_memory, context, daemon, worker and max_concurrency: taken by both; DaskVectorEnv says once,
    at INFO, that it ignores them (make_vec's vector_kwargs too)."""
    fns = [functools.partial(BoundsEnv, 1.0)] * 2
    with caplog.at_level(logging.INFO, logger="daskvec"):
        envs = split_vec.make(fns, shared_memory=True, context="fork", daemon=True, worker=None, max_concurrency=2)
        envs.reset(seed=0)
        envs.step(np.zeros(2, np.int64))
        made = split_vec.make_vec("CartPole-v1", 2, vector_kwargs={"shared_memory": False})
        made.reset(seed=0)
    if split_vec.kind == "dask":
        said = [r for r in caplog.records if "ignores" in r.getMessage()]
        assert [r.levelno for r in said] == [logging.INFO, logging.INFO]
        assert "shared_memory=True, context='fork', daemon=True, max_concurrency=2" in said[0].getMessage()
        assert "shared_memory=False" in said[1].getMessage()


def test_copy_false_hands_out_the_vec_envs_own_buffer(vec: Vectorizer) -> None:
    envs = vec.make([functools.partial(BoundsEnv, 1.0)] * 3, copy=False)
    first, _ = envs.reset(seed=0)
    second, *_ = envs.step(np.zeros(3, np.int64))
    assert second is first  # overwritten in place, as Gymnasium's copy=False does
