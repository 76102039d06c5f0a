"""DaskPPO and DaskA2C: rollouts collected on the workers fill the buffer as SB3's own loop does.

A deterministic policy (the action head's logits pinned far apart, so every action is 0)
makes SB3's loop on ``DummyVecEnv`` and the worker-side rollouts on ``DaskVecEnv`` see
the same transitions; the buffers, callbacks, ``num_timesteps`` and ``ep_info_buffer``
are then compared. Faults use real processes: a ``dask worker`` killed with SIGKILL
while a rollout runs.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from stable_baselines3 import A2C, PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv, VecCheckNan, VecMonitor, VecNormalize

from daskvec import DaskVecEnv
from daskvec.sb3 import DaskA2C, DaskPPO

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_ENVS = 4
#: Keys of SB3's collect_rollouts locals that callbacks read.
SB3_LOCALS = {
    "self",
    "env",
    "callback",
    "rollout_buffer",
    "n_rollout_steps",
    "n_steps",
    "obs_tensor",
    "actions",
    "values",
    "log_probs",
    "clipped_actions",
    "new_obs",
    "rewards",
    "dones",
    "infos",
}


def short_cartpole() -> gym.Env[Any, Any]:
    """Always pushed left, CartPole falls after 8-10 steps: cut at 9, some episodes end each way."""
    return Monitor(gym.make("CartPole-v1", max_episode_steps=9))


def bare_short_cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1", max_episode_steps=9)


class SlowCartPole(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole with 20 ms per step, so that a rollout lasts long enough to kill its worker."""

    def step(self, action: Any) -> Any:
        time.sleep(0.02)
        return self.env.step(action)


def slow_cartpole() -> gym.Env[Any, Any]:
    return Monitor(SlowCartPole(gym.make("CartPole-v1", max_episode_steps=20)))


def five_step_cartpole() -> gym.Env[Any, Any]:
    """Always pushed left, CartPole falls after 8-10 steps: cut at 5, every episode is truncated."""
    return gym.make("CartPole-v1", max_episode_steps=5)


class ConstantEnv(gym.Env[np.ndarray, int]):
    """The same observation at every reset and step; episodes of 5 steps, truncated."""

    def __init__(self) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.full(3, 0.5, np.float32), {}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return np.full(3, 0.5, np.float32), 1.0, False, self.t >= 5, {}


def values_of(model: Any, obs: np.ndarray) -> np.ndarray:
    """``V(obs)`` by the model's policy, computed as SB3's loop computes a truncation's terminal value."""
    with th.no_grad():
        return model.policy.predict_values(model.policy.obs_to_tensor(np.asarray(obs))[0]).cpu().numpy().reshape(-1)


def pin_actions(model: Any) -> None:
    """Make the policy deterministic: action 0 with probability 1 - e^-60."""
    with th.no_grad():
        model.policy.action_net.weight.zero_()
        model.policy.action_net.bias.copy_(th.tensor([30.0, -30.0]))


class Recorder(BaseCallback):
    """Everything a callback sees, per step; stops at step ``stop_at`` if given."""

    def __init__(self, stop_at: int | None = None, on_rollout: Any = None, on_end: Any = None) -> None:
        super().__init__()
        self.steps: list[dict[str, Any]] = []
        self.rollout_starts = 0
        self.rollout_ends = 0
        self.stop_at = stop_at
        self.on_rollout = on_rollout
        self.on_end = on_end
        self.buffers: list[dict[str, np.ndarray]] = []

    def _on_rollout_start(self) -> None:
        self.rollout_starts += 1
        if self.on_rollout is not None:
            self.on_rollout(self.rollout_starts)

    def _on_step(self) -> bool:
        loc = self.locals
        self.steps.append(
            {
                "num_timesteps": self.num_timesteps,
                "keys": set(loc),
                "rewards": np.copy(loc["rewards"]),
                "dones": np.copy(loc["dones"]),
                "infos": [{k: v for k, v in i.items() if k != "episode"} for i in loc["infos"]],
                "episodes": [(i["episode"]["r"], i["episode"]["l"]) for i in loc["infos"] if "episode" in i],
                "new_obs": copy_obs(loc["new_obs"]),
            }
        )
        return self.stop_at is None or len(self.steps) < self.stop_at

    def _on_rollout_end(self) -> None:
        self.rollout_ends += 1
        buf: Any = self.model.rollout_buffer  # as filled: training reshapes it afterwards
        self.buffers.append({"actions": np.copy(buf.actions), "rewards": np.copy(buf.rewards)})
        if self.on_end is not None:
            self.on_end(self.rollout_ends)


def train(
    cls: Any, env: Any, rollouts: int, callback: BaseCallback | None = None, policy: str = "MlpPolicy", **kw: Any
) -> Any:
    n_steps = kw.pop("n_steps", 16)
    extra = {"batch_size": 32, "n_epochs": 1} if issubclass(cls, PPO) else {}
    model = cls(policy, env, n_steps=n_steps, seed=0, device="cpu", **extra, **kw)
    pin_actions(model)
    model.learn(n_steps * N_ENVS * rollouts, callback=callback)
    return model


def fallbacks(caught: list[warnings.WarningMessage]) -> list[warnings.WarningMessage]:
    """The warnings saying that SB3's own loop is used instead of worker-side rollouts."""
    return [w for w in caught if "SB3's own loop" in str(w.message)]


def copy_obs(obs: Any) -> Any:
    """A copy of observations: an array, or a dict of arrays (Dict spaces)."""
    return {k: np.copy(v) for k, v in obs.items()} if isinstance(obs, dict) else np.copy(obs)


def assert_same_obs(got: Any, want: Any, what: str) -> None:
    """The same observations (arrays, or dicts of arrays), shape and dtype included."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), what
        for k in want:
            assert_same_obs(got[k], want[k], f"{what}[{k!r}]")
        return
    got, want = np.asarray(got), np.asarray(want)
    assert (got.shape, got.dtype) == (want.shape, want.dtype), (
        f"{what}: {got.shape} {got.dtype} vs {want.shape} {want.dtype}"
    )
    np.testing.assert_array_equal(got, want, err_msg=what)


def assert_same_buffers(got: Any, want: Any) -> None:
    a, b = got.rollout_buffer, want.rollout_buffer
    for name in ("observations", "actions", "episode_starts"):
        assert_same_obs(getattr(a, name), getattr(b, name), name)
    # rewards: exact but for the bootstraps, whose values the worker's torch computed (1 ulp apart at most)
    assert a.rewards.shape == b.rewards.shape
    np.testing.assert_array_equal(a.rewards[b.rewards == 1.0], 1.0)
    np.testing.assert_allclose(a.rewards, b.rewards, rtol=1e-6, err_msg="rewards")
    for name in ("values", "log_probs", "returns", "advantages"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-5, atol=1e-6, err_msg=name)


def assert_same_steps(got: Recorder, want: Recorder) -> None:
    assert len(got.steps) == len(want.steps)
    assert (got.rollout_starts, got.rollout_ends) == (want.rollout_starts, want.rollout_ends)
    for t, (x, y) in enumerate(zip(got.steps, want.steps, strict=True)):
        assert x["keys"] >= SB3_LOCALS, f"step {t}: locals miss {SB3_LOCALS - x['keys']}"
        assert x["num_timesteps"] == y["num_timesteps"]
        np.testing.assert_array_equal(x["rewards"], y["rewards"], err_msg=f"step {t}")
        np.testing.assert_array_equal(x["dones"], y["dones"], err_msg=f"step {t}")
        assert_same_obs(x["new_obs"], y["new_obs"], f"step {t}")
        assert x["episodes"] == y["episodes"], f"step {t}"
        for i, (p, q) in enumerate(zip(x["infos"], y["infos"], strict=True)):
            assert set(p) == set(q), f"step {t} env {i}: {sorted(p)} vs {sorted(q)}"
            if "terminal_observation" in p:
                assert_same_obs(p["terminal_observation"], q["terminal_observation"], f"step {t} env {i} terminal")
            assert p.get("TimeLimit.truncated") == q.get("TimeLimit.truncated")


# --------------------------------------------------------------------------- same data as SB3's loop
@pytest.mark.parametrize(("dask_cls", "sb3_cls"), [(DaskPPO, PPO), (DaskA2C, A2C)])
def test_buffer_and_callbacks_as_sb3_loop(dask_cls: Any, sb3_cls: Any, client2: Any) -> None:
    """Two rollouts: the same buffer, steps, infos, truncation bootstraps and episodes as SB3's loop."""
    want_cb, got_cb = Recorder(), Recorder()
    want = train(sb3_cls, DummyVecEnv([short_cartpole] * N_ENVS), 2, want_cb)
    with DaskVecEnv([short_cartpole] * N_ENVS, client2) as env:
        got = train(dask_cls, env, 2, got_cb)
        assert env.restart_log == []
    # the run saw episodes end both ways, so the bootstrap was exercised
    truncs = sum(i.get("TimeLimit.truncated", False) for s in want_cb.steps for i in s["infos"])
    assert truncs and sum(s["dones"].sum() for s in want_cb.steps) > truncs
    assert_same_steps(got_cb, want_cb)
    assert_same_buffers(got, want)
    assert got.num_timesteps == want.num_timesteps == 2 * 16 * N_ENVS
    assert [(e["r"], e["l"]) for e in got.ep_info_buffer] == [(e["r"], e["l"]) for e in want.ep_info_buffer]
    assert len(got.ep_info_buffer) > 0


def test_seeded_daskppo_samples_the_same_actions(client2: Any) -> None:
    """The workers' sampling is seeded from the learner: the same seed gives the same rollouts."""
    runs = []
    for _ in range(2):
        with DaskVecEnv([short_cartpole] * N_ENVS, client2) as env:
            model = DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=3, device="cpu")
            model.learn(16 * N_ENVS * 2)
            runs.append(model.rollout_buffer)
    assert 0 < runs[0].actions.mean() < 1  # sampled, not pinned
    np.testing.assert_array_equal(runs[0].actions, runs[1].actions)
    np.testing.assert_array_equal(runs[0].observations, runs[1].observations)


def test_seeded_daskppo_groups_sample_streams_of_their_own(client2: Any) -> None:
    """Every env sees the same observation at every step, so two groups drawing from one sampling
    stream would sample the same action columns: they differ, and repeat run after run."""
    runs = []
    for _ in range(2):
        with DaskVecEnv([ConstantEnv] * N_ENVS, client2, envs_per_actor=2) as env:
            groups = [sorted(g["envs"]) for g in env.groups]
            assert len(groups) == 2 and len({g["worker"] for g in env.groups}) == 2
            cb = Recorder()
            model = DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=3, device="cpu")
            model.learn(16 * N_ENVS * 2, callback=cb)
            runs.append(np.stack([b["actions"].reshape(16, N_ENVS) for b in cb.buffers]))  # (rollout, step, env)
    first, second = runs
    assert first.shape == (2, 16, N_ENVS) and 0 < first.mean() < 1  # sampled, not pinned
    a, b = groups
    for n in range(2):
        assert not np.array_equal(first[n][:, a], first[n][:, b]), (
            f"rollout {n + 1}: envs {a} and {b} sampled the same actions {first[n][:, a].T.tolist()}: "
            "the groups share one sampling stream"
        )
    np.testing.assert_array_equal(first, second, err_msg="a seeded DaskPPO did not sample the same actions again")


def test_every_truncation_comes_with_the_workers_value(client2: Any) -> None:
    """The workers compute V(terminal observation) of every truncation they see: the client computes
    none itself (its one value call per rollout is the last values, as in SB3's loop)."""
    cb = Recorder()
    calls: list[tuple[int, ...]] = []
    with DaskVecEnv([five_step_cartpole] * N_ENVS, client2) as env:
        model = DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, seed=0, device="cpu")
        pin_actions(model)
        predict_values = model.policy.predict_values

        def counted(obs: th.Tensor) -> th.Tensor:
            if cb.rollout_starts > cb.rollout_ends:  # inside collect_rollouts
                calls.append(tuple(obs.shape))
            return predict_values(obs)

        model.policy.predict_values = counted
        model.learn(16 * N_ENVS * 2, callback=cb)
        assert env.restart_log == []
    truncations = sum(i.get("TimeLimit.truncated", False) for s in cb.steps for i in s["infos"])
    assert truncations == 2 * 3 * N_ENVS  # episodes of 5 steps in 2 rollouts of 16
    assert calls == [(N_ENVS, 4)] * 2, (
        f"client-side value calls during the rollouts: {calls}; a truncation reached the learner without the "
        "worker's terminal value"
    )


def test_on_step_false_stops_training(client2: Any) -> None:
    want_cb, got_cb = Recorder(stop_at=3), Recorder(stop_at=3)
    want = train(PPO, DummyVecEnv([short_cartpole] * N_ENVS), 4, want_cb)
    with DaskVecEnv([short_cartpole] * N_ENVS, client2) as env:
        got = train(DaskPPO, env, 4, got_cb)
        # the vec env is usable afterwards
        env.reset()
    assert len(got_cb.steps) == len(want_cb.steps) == 3
    assert got.num_timesteps == want.num_timesteps == 3 * N_ENVS
    assert got_cb.rollout_ends == want_cb.rollout_ends == 0


class NormWitness(BaseCallback):
    """Per rollout: the VecNormalize statistics at its start, the raw observations and rewards
    (``get_original_obs``/``get_original_reward`` after each step), and at its end the buffer and
    ``V(buffer observations)`` by the policy that collected it."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[dict[str, Any]] = []

    def _on_rollout_start(self) -> None:
        vn: Any = self.training_env
        self.rollouts.append(
            {
                "obs_mean": np.copy(vn.obs_rms.mean),
                "obs_var": np.copy(vn.obs_rms.var),
                "ret_var": np.copy(vn.ret_rms.var),
                "raw_obs": [vn.get_original_obs()],
                "raw_rewards": [],
                "bootstrapped": [],
            }
        )

    def _on_step(self) -> bool:
        vn: Any = self.training_env
        r = self.rollouts[-1]
        r["raw_obs"].append(vn.get_original_obs())
        r["raw_rewards"].append(vn.get_original_reward())
        dones, infos = self.locals["dones"], self.locals["infos"]
        r["bootstrapped"].append(
            [bool(d and i.get("TimeLimit.truncated", False)) for d, i in zip(dones, infos, strict=True)]
        )
        return True

    def _on_rollout_end(self) -> None:
        buf: Any = self.model.rollout_buffer
        r = self.rollouts[-1]
        r["obs"], r["rewards"], r["values"] = np.copy(buf.observations), np.copy(buf.rewards), np.copy(buf.values)
        flat = buf.observations.reshape(-1, *buf.observations.shape[2:])
        r["v_of_obs"] = values_of(self.model, flat).reshape(buf.values.shape)


def test_vecnormalize_and_vecmonitor(client2: Any) -> None:
    """Statistics updated from the raw data after each rollout equal SB3's; the buffer holds what the policy saw."""
    kw = {"gamma": 0.9}

    def wrap(venv: Any) -> VecNormalize:
        return VecNormalize(VecMonitor(venv), gamma=0.9)

    want = train(PPO, wrap(DummyVecEnv([bare_short_cartpole] * N_ENVS)), 2, **kw)
    witness = NormWitness()
    with DaskVecEnv([bare_short_cartpole] * N_ENVS, client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        env = wrap(venv)
        got = train(DaskPPO, env, 2, witness, **kw)
    assert not fallbacks(caught)
    w = want.get_env()
    for name in ("obs_rms", "ret_rms"):
        a, b = getattr(env, name), getattr(w, name)
        np.testing.assert_allclose(a.mean, b.mean, rtol=1e-10, err_msg=name)
        np.testing.assert_allclose(a.var, b.var, rtol=1e-10, err_msg=name)
        assert a.count == b.count
    assert [(e["r"], e["l"]) for e in got.ep_info_buffer] == [(e["r"], e["l"]) for e in want.ep_info_buffer]
    # each rollout's observations and rewards: the raw ones normalised with the stats frozen at its start
    assert len(witness.rollouts) == 2
    for n, r in enumerate(witness.rollouts, 1):
        scale = np.sqrt(r["obs_var"] + env.epsilon)
        raw_obs = np.array(r["raw_obs"][:-1])  # the observation before each step
        want_obs = np.clip((raw_obs - r["obs_mean"]) / scale, -env.clip_obs, env.clip_obs).astype(np.float32)
        assert r["obs"].shape == want_obs.shape == (16, N_ENVS, 4)
        np.testing.assert_allclose(
            r["obs"],
            want_obs,
            rtol=1e-6,
            atol=1e-7,
            err_msg=f"rollout {n}: buffer observations are not the raw ones normalised "
            "with the statistics frozen at the rollout's start",
        )
        raw_rewards = np.array(r["raw_rewards"])
        want_rewards = np.clip(raw_rewards / np.sqrt(r["ret_var"] + env.epsilon), -env.clip_reward, env.clip_reward)
        plain = ~np.array(r["bootstrapped"])  # a bootstrap row also holds gamma * V(terminal observation)
        assert plain.any() and not plain.all()
        np.testing.assert_allclose(
            r["rewards"][plain],
            want_rewards[plain].astype(np.float32),
            rtol=1e-6,
            err_msg=f"rollout {n}: buffer rewards are not the raw ones normalised with "
            "the return statistics frozen at the rollout's start",
        )
        # the workers' policy saw those normalised observations: its values are V(buffer observations)
        np.testing.assert_allclose(
            r["values"],
            r["v_of_obs"],
            rtol=1e-5,
            atol=1e-6,
            err_msg=f"rollout {n}: the values are not V(normalised observations)",
        )
    # the stats moved during each rollout, so normalising with the running ones would differ
    last = witness.rollouts[-1]
    assert not np.allclose(last["obs_mean"], env.obs_rms.mean) and not np.isclose(last["ret_var"], env.ret_rms.var)


def test_non_daskvec_env_is_plain_ppo() -> None:
    want = train(PPO, DummyVecEnv([short_cartpole] * N_ENVS), 2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = train(DaskPPO, DummyVecEnv([short_cartpole] * N_ENVS), 2)
    assert not fallbacks(caught)
    assert_same_buffers(got, want)
    for (k, a), (_, b) in zip(got.policy.state_dict().items(), want.policy.state_dict().items(), strict=True):
        assert th.equal(a, b), k


def test_unsupported_wrapper_falls_back_with_one_warning(client2: Any) -> None:
    with DaskVecEnv([short_cartpole] * N_ENVS, client2) as venv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = train(DaskPPO, VecCheckNan(venv), 3)
    ours = fallbacks(caught)
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "VecCheckNan" in str(ours[0].message)
    assert model.num_timesteps == 3 * 16 * N_ENVS


# --------------------------------------------------------------------------- a worker killed mid-rollout
@pytest.mark.timeout(180)
def test_worker_killed_mid_rollout(dask_processes: Any) -> None:
    """SIGKILL of a worker mid-rollout: its envs report truncations at the first step; training goes on."""
    procs = dask_processes(2)
    killed: dict[str, Any] = {}
    with DaskVecEnv([slow_cartpole] * N_ENVS, procs.address, step_timeout=30) as env:
        victim = env.groups[0]
        assert len({g["worker"] for g in env.groups}) == 2

        def kill_during_second(n: int) -> None:
            if n == 2:  # ~0.4 s into a rollout of ~1.3 s
                timer = threading.Timer(0.4, os.kill, (victim["pid"], signal.SIGKILL))
                timer.start()
                killed["timer"] = timer

        lost = sorted(victim["envs"])
        ends: dict[str, Any] = {}

        def values_at_end(n: int) -> None:
            if n == 2:  # V by the policy that collected the rollout
                ends["v_terminal"] = values_of(cb.model, cb.steps[31]["new_obs"][lost])  # the last obs seen
                ends["v_reset"] = values_of(cb.model, cb.steps[32]["new_obs"][lost])  # the rebuilt envs' first

        cb = Recorder(on_rollout=kill_during_second, on_end=values_at_end)
        model = train(DaskPPO, env, 4, cb, n_steps=32)
        killed["timer"].join()
        log = env.restart_log
        assert sorted(e["env"] for e in log) == sorted(victim["envs"])
        assert {e["reason"] for e in log} == {"worker_lost"}
        assert victim["worker"] not in {g["worker"] for g in env.groups}
    assert model.num_timesteps == 4 * 32 * N_ENVS
    assert cb.rollout_ends == 4
    first = cb.steps[32]  # the second rollout's first step
    for i in range(N_ENVS):
        info = first["infos"][i]
        if i in victim["envs"]:
            assert first["dones"][i] and info["TimeLimit.truncated"] and first["rewards"][i] == 0.0
            assert info["daskvec"]["reason"] == "worker_lost"
            np.testing.assert_array_equal(info["terminal_observation"], cb.steps[31]["new_obs"][i])
        else:
            assert "daskvec" not in info
    # no other step reports a rebuild: the rest of the rollout was recollected, not cut
    assert all("daskvec" not in i for s in cb.steps[33:] for i in s["infos"])
    # in the buffer, the lost envs' truncations are bootstrapped from their terminal observations
    assert not np.isclose(ends["v_reset"], ends["v_terminal"], rtol=1e-4, atol=1e-6).any()  # the test tells them apart
    rewards = cb.buffers[1]["rewards"][0]  # the second rollout's first step, bootstraps applied
    np.testing.assert_allclose(
        rewards[lost],
        (model.gamma * ends["v_terminal"]).astype(np.float32),
        rtol=1e-6,
        err_msg="a lost env's reward is not 0 + gamma * V(terminal_observation)",
    )
