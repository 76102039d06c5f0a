"""Frame stacks and image transpositions around worker-side rollouts (DaskPPO, DaskA2C).

Images come from :class:`PixelEnv`, a small synthetic env whose pixels encode the env,
the episode and the step (so that a frame out of place, a stack not restarted or an
image transposed the wrong way shows), with episodes of random length that end both
ways. The workers' repetition of the wrappers (:class:`daskvec.worker.obs.ObsChain`) is
checked against SB3's own wrappers step by step, and the learner's buffer, callbacks,
``num_timesteps``, ``ep_info_buffer`` and the wrappers' state against SB3's loop on
``DummyVecEnv``, as in ``test_rollouts.py`` (whose helpers this module uses).
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import (
    DummyVecEnv,
    VecEnv,
    VecEnvWrapper,
    VecFrameStack,
    VecMonitor,
    VecNormalize,
    VecTransposeImage,
)
from test_rollouts import N_ENVS, Recorder, assert_same_buffers, assert_same_obs, assert_same_steps, fallbacks, train

from daskvec import DaskVecEnv
from daskvec.learners.on_policy import DaskA2C, DaskPPO, RolloutPlan, obs_stages, plan_rollouts
from daskvec.protocol.rollout_records import ObsPipeline
from daskvec.worker.obs import ObsChain

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: Frames of SIZE x SIZE pixels: the smallest NatureCNN (CnnPolicy's extractor) takes.
SIZE = 36


class PixelEnv(gym.Env[Any, int]):
    """One-channel uint8 frames whose pixels encode env, episode and step.

    Episodes last 3 to 11 steps (drawn at each reset from the env's seeded generator)
    and end by termination or truncation, also drawn; the reward depends on the step
    and the action.

    Parameters
    ----------
    ident : int
        Written into the frames (the env's index).
    channels_first : bool
        Frames of shape ``(1, SIZE, SIZE)`` instead of ``(SIZE, SIZE, 1)``.
    dict_obs : bool
        Observations ``{"image": frame, "vec": 3 floats}``.
    """

    def __init__(self, ident: int = 0, channels_first: bool = False, dict_obs: bool = False) -> None:
        self.ident, self.channels_first, self.dict_obs = ident, channels_first, dict_obs
        shape = (1, SIZE, SIZE) if channels_first else (SIZE, SIZE, 1)
        image = gym.spaces.Box(0, 255, shape, np.uint8)
        vec = gym.spaces.Box(-10.0, 10.0, (3,), np.float32)
        self.observation_space: gym.Space[Any] = gym.spaces.Dict({"image": image, "vec": vec}) if dict_obs else image
        self.action_space: gym.Space[Any] = gym.spaces.Discrete(2)
        self.episode, self.t, self.length, self.terminates = -1, 0, 1, True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.length = int(self.np_random.integers(3, 12))
        self.terminates = bool(self.np_random.integers(2))
        return self._obs(), {}

    def step(self, action: int) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        end = self.t >= self.length
        reward = float(self.t % 3) + 0.5 * int(action)
        return self._obs(), reward, end and self.terminates, end and not self.terminates, {}

    def _obs(self) -> Any:
        rows, cols = np.arange(SIZE)[:, None], np.arange(SIZE)[None, :]
        frame = (rows * 7 + cols * 3 + 31 * self.t + 13 * self.episode + 50 * self.ident) % 251
        frame[0, 0], frame[0, 1], frame[1, 0] = self.ident, self.episode % 256, self.t  # not symmetric
        image = frame.astype(np.uint8)[None] if self.channels_first else frame.astype(np.uint8)[:, :, None]
        if self.dict_obs:
            return {"image": image, "vec": np.array([self.t, self.ident, self.episode % 7], np.float32)}
        return image


def pixel_env(ident: int, channels_first: bool = False, dict_obs: bool = False) -> gym.Env[Any, int]:
    return Monitor(PixelEnv(ident, channels_first, dict_obs))


def pixel_fns(
    channels_first: bool = False, dict_obs: bool = False, monitor: bool = True
) -> list[Callable[[], gym.Env[Any, int]]]:
    return [functools.partial(pixel_env if monitor else PixelEnv, i, channels_first, dict_obs) for i in range(N_ENVS)]


#: How the wrappers are stacked: (name, frames channels first, wrap(venv, n_stack)); SB3 adds the
#: VecTransposeImage itself on top for CnnPolicy on channels-last frames ("stack"), or the user
#: transposes first ("transpose, stack").
LAYOUTS: dict[str, tuple[bool, Callable[[VecEnv, int], VecEnv]]] = {
    "stack": (False, lambda venv, n: VecFrameStack(venv, n)),
    "stack, transpose": (False, lambda venv, n: VecTransposeImage(VecFrameStack(venv, n))),
    "transpose, stack": (False, lambda venv, n: VecFrameStack(VecTransposeImage(venv), n)),
    "channels first": (True, lambda venv, n: VecFrameStack(venv, n)),
}


def chain_of(env: VecEnv) -> list[VecEnvWrapper]:
    """The wrappers of ``env`` from the outermost down."""
    out: list[VecEnvWrapper] = []
    inner: Any = env
    while isinstance(inner, VecEnvWrapper):
        out.append(inner)
        inner = inner.venv
    return out


class Tap(VecEnvWrapper):
    """Records what the vec env under the other wrappers returned (the workers' raw steps)."""

    def __init__(self, venv: VecEnv) -> None:
        super().__init__(venv)
        self.last: Any = None

    def reset(self) -> Any:
        self.last = self.venv.reset()
        return self.last

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        final = {i: info["terminal_observation"] for i, info in enumerate(infos) if "terminal_observation" in info}
        self.last = (obs, dones.copy(), {i: _copy(o) for i, o in final.items()})
        return obs, rewards, dones, infos


def _copy(obs: Any) -> Any:
    return {k: np.copy(v) for k, v in obs.items()} if isinstance(obs, dict) else np.copy(obs)


def frozen_stats(vn: VecNormalize | None) -> dict[str, Any] | None:
    """A VecNormalize's observation statistics as a rollout ships them."""
    if vn is None:
        return None
    rms: Any = vn.obs_rms
    if isinstance(rms, dict):
        return {
            "mean": {k: r.mean for k, r in rms.items()},
            "var": {k: r.var for k, r in rms.items()},
            "epsilon": vn.epsilon,
            "clip": vn.clip_obs,
        }
    return {"mean": rms.mean, "var": rms.var, "epsilon": vn.epsilon, "clip": vn.clip_obs}


# --------------------------------------------------------------------------- the workers' chain vs SB3's wrappers
@pytest.mark.parametrize("n_stack", [2, 4])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("norm", [False, True], ids=["raw", "normalized"])
def test_worker_chain_stacks_as_the_wrappers(layout: str, n_stack: int, norm: bool) -> None:
    """ObsChain, started from fresh stacks at the reset and again from the wrappers' stacks mid-way, gives
    every step's observations and stacked terminal observations exactly as SB3's wrappers do."""
    channels_first, wrap = LAYOUTS[layout]
    tap = Tap(DummyVecEnv(pixel_fns(channels_first, monitor=False)))
    env = wrap(VecMonitor(tap), n_stack)  # a wrapper that has no stage
    if norm:  # statistics frozen (training=False), as the workers have them during a rollout
        env = vn = VecNormalize(env, norm_reward=False, training=False)
        rms: Any = vn.obs_rms
        rms.mean = np.random.default_rng(0).uniform(0, 200, rms.mean.shape)
    env.seed(7)
    plan = RolloutPlan.of(None, chain_of(env))  # type: ignore[arg-type]  # no DaskVecEnv needed here
    norm_stats = frozen_stats(plan.normalize)
    obs: Any = env.reset()
    chains = [ObsChain(ObsPipeline(plan.stages, norm_at=plan.norm_at), tap.last, norm_stats)]
    assert_same_obs(chains[0].seen, obs, "reset")
    rng = np.random.default_rng(1)
    ends = {"terminated": 0, "truncated": 0}
    for t in range(40):
        if t == 17:  # a rollout starting here gets the wrappers' stacks
            chains.append(ObsChain(plan.pipeline(None), tap.last[0], norm_stats))
            assert_same_obs(chains[-1].seen, obs, f"step {t}: started from the wrappers' stacks")
        obs, _, _, infos = env.step(rng.integers(0, 2, N_ENVS))
        raw, raw_dones, final = tap.last
        for info in infos:
            if "terminal_observation" in info:
                ends["truncated" if info["TimeLimit.truncated"] else "terminated"] += 1
        for c, chain in enumerate(chains):
            terminals = chain.step(raw, raw_dones, final)
            assert_same_obs(chain.seen, obs, f"step {t} chain {c}")
            assert set(terminals) == {i for i, info in enumerate(infos) if "terminal_observation" in info}
            for i, term in terminals.items():
                assert_same_obs(term, infos[i]["terminal_observation"], f"step {t} chain {c} env {i} terminal")
    assert ends["terminated"] > 2 and ends["truncated"] > 2, ends


def test_worker_chain_dict_observations() -> None:
    """Dict observations: every entry stacked, only the image transposed, only the vector normalised
    (below the transposition, where SB3 puts it), as SB3's wrappers do."""
    tap = Tap(DummyVecEnv(pixel_fns(dict_obs=True)))
    vn = VecNormalize(VecFrameStack(tap, 3), norm_obs_keys=["vec"], norm_reward=False, training=False)
    vn.obs_rms["vec"].mean = np.array([1.0, -2.0, 3.0, 0.5, 0.0, 1.0, 2.0, 2.0, 2.0])
    env = VecTransposeImage(vn)
    env.seed(3)
    plan = RolloutPlan.of(None, chain_of(env))  # type: ignore[arg-type]
    assert (len(plan.stages), plan.norm_at) == (2, 1)
    obs: Any = env.reset()
    chain = ObsChain(plan.pipeline(None).with_fresh_stacks(), tap.last, frozen_stats(vn))
    assert_same_obs(chain.seen, obs, "reset")
    rng = np.random.default_rng(2)
    ended = 0
    for t in range(30):
        obs, _, _, infos = env.step(rng.integers(0, 2, N_ENVS))
        terminals = chain.step(*tap.last)
        assert_same_obs(chain.seen, obs, f"step {t}")
        for i, term in terminals.items():
            assert_same_obs(term, infos[i]["terminal_observation"], f"step {t} env {i} terminal")
            ended += 1
    assert ended > 4


def test_worker_chain_restack() -> None:
    """An env rebuilt since the last step is reported done at the next one: its stack restarts there
    even though the worker saw no end (as VecFrameStack restarts it on the client)."""
    tap = Tap(DummyVecEnv(pixel_fns()))
    env = VecFrameStack(tap, 3)
    env.seed(5)
    env.reset()
    env.step(np.zeros(N_ENVS, dtype=int))
    chain = ObsChain(ObsPipeline(obs_stages([env]), (env.stacked_obs.stacked_obs,)), tap.last[0])
    obs: Any
    obs, _, dones, _ = env.step(np.zeros(N_ENVS, dtype=int))
    assert not dones[2]
    chain.step(tap.last[0], tap.last[1], tap.last[2], restack=(2,))
    np.testing.assert_array_equal(chain.seen[[0, 1, 3]], obs[[0, 1, 3]])
    np.testing.assert_array_equal(chain.seen[2, ..., :-1], 0)
    np.testing.assert_array_equal(chain.seen[2, ..., -1:], obs[2, ..., -1:])
    assert obs[2, ..., :-1].any()  # without the restart the older frames would still be there


def test_worker_chain_vector_observations() -> None:
    """Frames that are not images (CartPole's 4 floats) stack along their last axis."""
    tap = Tap(DummyVecEnv([lambda: gym.make("CartPole-v1", max_episode_steps=7)] * N_ENVS))
    env = VecFrameStack(tap, 3)
    env.seed(0)
    obs: Any = env.reset()
    chain = ObsChain(ObsPipeline(obs_stages([env])), tap.last)
    assert_same_obs(chain.seen, obs, "reset")
    ended = 0
    for t in range(20):
        obs, _, _, infos = env.step(np.zeros(N_ENVS, dtype=int))
        terminals = chain.step(*tap.last)
        assert_same_obs(chain.seen, obs, f"step {t}")
        for i, term in terminals.items():
            assert_same_obs(term, infos[i]["terminal_observation"], f"step {t} env {i} terminal")
            ended += 1
    assert ended >= N_ENVS


# --------------------------------------------------------------------------- the learner: same data as SB3's loop
class ValueCalls(Recorder):
    """A :class:`Recorder` that also counts the learner's value calls during its rollouts."""

    def __init__(self) -> None:
        super().__init__()
        self.value_calls: list[Any] = []

    def _on_training_start(self) -> None:
        policy: Any = self.model.policy
        predict_values = policy.predict_values

        def counted(obs: Any) -> Any:
            if self.rollout_starts > self.rollout_ends:  # inside collect_rollouts
                shape = {k: tuple(v.shape) for k, v in obs.items()} if isinstance(obs, dict) else tuple(obs.shape)
                self.value_calls.append(shape)
            return predict_values(obs)

        policy.predict_values = counted


def count_step_waits(venv: DaskVecEnv) -> list[int]:
    """Count the vec env's own ``step_wait`` calls (one per vec-step in SB3's loop)."""
    calls: list[int] = []
    step_wait = venv.step_wait

    def counted() -> Any:
        calls.append(1)
        return step_wait()

    venv.step_wait = counted  # type: ignore[method-assign]
    return calls


def assert_same_run(got: Any, want: Any, got_cb: Recorder, want_cb: Recorder, rollouts: int) -> None:
    """Buffer, callbacks, ``num_timesteps`` and ``ep_info_buffer`` as SB3's loop; episodes ended both ways."""
    truncs = sum(i.get("TimeLimit.truncated", False) for s in want_cb.steps for i in s["infos"])
    assert truncs and sum(s["dones"].sum() for s in want_cb.steps) > truncs
    assert_same_steps(got_cb, want_cb)
    assert_same_buffers(got, want)
    assert got.num_timesteps == want.num_timesteps == rollouts * 16 * N_ENVS
    assert [(e["r"], e["l"]) for e in got.ep_info_buffer] == [(e["r"], e["l"]) for e in want.ep_info_buffer]
    assert len(got.ep_info_buffer) > 0


def assert_wrappers_go_on(got: Any, want: Any) -> None:
    """The learners' wrappers hold what SB3's loop left: stepping on through them (as ``predict`` and
    ``evaluate`` do) gives the same stacked observations."""
    a, b = got.get_env(), want.get_env()
    assert [type(w) for w in chain_of(a)] == [type(w) for w in chain_of(b)]
    for wa, wb in zip(chain_of(a), chain_of(b), strict=True):
        if isinstance(wa, VecFrameStack) and isinstance(wb, VecFrameStack):
            assert_same_obs(plan_stacks(wa), plan_stacks(wb), "the VecFrameStack's stacks after learn()")
    obs_a, obs_b = got._last_obs, want._last_obs
    for t in range(3):
        actions = got.predict(obs_a, deterministic=True)[0]
        np.testing.assert_array_equal(actions, want.predict(obs_b, deterministic=True)[0])
        obs_a, obs_b = a.step(actions)[0], b.step(actions)[0]
        assert_same_obs(obs_a, obs_b, f"step {t} after learn()")


def plan_stacks(w: VecFrameStack) -> Any:
    return RolloutPlan.of(None, [w]).pipeline(None).stacks[0]  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n_stack", "channels_first"),
    [(4, False), (2, False), (4, True), (2, True)],
    ids=["4-channels-last", "2-channels-last", "4-channels-first", "2-channels-first"],
)
def test_frame_stack_buffer_and_callbacks_as_sb3_loop(n_stack: int, channels_first: bool, client2: Any) -> None:
    """DaskPPO with CnnPolicy under VecFrameStack (+ the VecTransposeImage SB3 adds for channels-last
    frames): two rollouts, with no step_wait of the DaskVecEnv, fill the buffer as SB3's loop does."""
    want_cb, got_cb = ValueCalls(), ValueCalls()
    want = train(PPO, VecFrameStack(DummyVecEnv(pixel_fns(channels_first)), n_stack), 2, want_cb, "CnnPolicy")
    with DaskVecEnv(pixel_fns(channels_first), client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_waits = count_step_waits(venv)
        got = train(DaskPPO, VecFrameStack(venv, n_stack), 2, got_cb, "CnnPolicy")
        # during learn() the DaskVecEnv sees at most one step_wait per collection (worker-side rollouts: none)
        assert len(step_waits) <= got_cb.rollout_starts == 2, f"{len(step_waits)} step_wait calls in 2 rollouts"
        assert isinstance(got.get_env(), VecTransposeImage) is not channels_first  # SB3 added it
        assert_wrappers_go_on(got, want)
        assert venv.restart_log == []
    assert not fallbacks(caught), [str(w.message) for w in fallbacks(caught)]
    assert_same_run(got, want, got_cb, want_cb, 2)
    # the workers computed V(stacked terminal observation) of every truncation: the learner's only
    # value call per rollout is the last values
    assert got_cb.value_calls == [(N_ENVS, n_stack, SIZE, SIZE)] * 2, got_cb.value_calls
    assert len(want_cb.value_calls) > 2  # SB3's loop bootstrapped truncations itself


@pytest.mark.parametrize(("dask_cls", "sb3_cls"), [(DaskPPO, PPO), (DaskA2C, A2C)])
def test_dict_observations_multi_input_policy(dask_cls: Any, sb3_cls: Any, client2: Any) -> None:
    """MultiInputPolicy on Dict observations under VecFrameStack, VecNormalize (the vector entry, frozen
    statistics) and the VecTransposeImage SB3 puts on top of them: the same data as SB3's loop."""

    def wrap(venv: VecEnv) -> VecNormalize:
        vn = VecNormalize(VecFrameStack(venv, 3), norm_obs_keys=["vec"], training=False, gamma=0.9)
        vn.obs_rms["vec"].mean = np.arange(9, dtype=np.float64) / 3
        vn.obs_rms["vec"].var = np.full(9, 4.0)
        return vn

    want_cb, got_cb = ValueCalls(), ValueCalls()
    kw = {"gamma": 0.9}
    want = train(sb3_cls, wrap(DummyVecEnv(pixel_fns(dict_obs=True))), 2, want_cb, "MultiInputPolicy", **kw)
    with DaskVecEnv(pixel_fns(dict_obs=True), client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_waits = count_step_waits(venv)
        got = train(dask_cls, wrap(venv), 2, got_cb, "MultiInputPolicy", **kw)
        assert len(step_waits) <= 2, f"{len(step_waits)} step_wait calls in 2 rollouts"
        assert [type(w) for w in chain_of(got.get_env())][:2] == [VecTransposeImage, VecNormalize]
        assert_wrappers_go_on(got, want)
    assert not fallbacks(caught), [str(w.message) for w in fallbacks(caught)]
    assert_same_run(got, want, got_cb, want_cb, 2)
    assert len(got_cb.value_calls) == 2, got_cb.value_calls


def test_still_unsupported_falls_back_with_one_warning(client2: Any) -> None:
    """A VecNormalize under a VecFrameStack (the policy would see stacks of frames normalised with
    running statistics) cannot be repeated faithfully: SB3's loop, with one warning."""
    with DaskVecEnv(pixel_fns(), client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step_waits = count_step_waits(venv)
        env = VecFrameStack(VecNormalize(venv, norm_obs=False), 2)
        model = train(DaskPPO, env, 2, policy="CnnPolicy")
    ours = fallbacks(caught)
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "VecNormalize" in str(ours[0].message)
    assert model.num_timesteps == 2 * 16 * N_ENVS
    assert len(step_waits) == 2 * 16  # one per vec-step


@pytest.mark.filterwarnings("ignore:The `render_mode` attribute")  # the stand-in DaskVecEnv answers no get_attr
def test_plan_rollouts_reasons() -> None:
    """What falls back, and why, without a cluster: each reason names what to change."""

    class Odd(VecEnvWrapper):
        def reset(self) -> Any:
            return self.venv.reset()

        def step_wait(self) -> Any:
            return self.venv.step_wait()

    venv = DaskVecEnv.__new__(DaskVecEnv)  # only its type and spaces are looked at
    venv.num_envs, venv.render_mode = N_ENVS, None
    venv.observation_space, venv.action_space = PixelEnv().observation_space, PixelEnv().action_space
    model = type("Model", (), {"use_sde": False})()
    ok, reason = plan_rollouts(VecTransposeImage(VecFrameStack(VecMonitor(venv), 4)), model)
    assert ok is not None and reason == ""
    for env, words in [
        (Odd(venv), "Odd"),
        (VecFrameStack(VecNormalize(venv, norm_obs=False), 2), "VecNormalize"),
        (VecNormalize(VecNormalize(venv, norm_obs=False), norm_obs=False), "VecNormalize"),
    ]:
        plan, reason = plan_rollouts(env, model)
        assert plan is None and words in reason, reason
    plan, reason = plan_rollouts(venv, type("Model", (), {"use_sde": True})())
    assert plan is None and "use_sde" in reason
