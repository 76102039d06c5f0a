"""DaskPPO and DaskA2C with ``collect_ahead=1``: the next rollout collected while the learner trains.

What must hold: the rollout trained on was collected with the weights shipped before the
last training (one version behind, never more), its log-probabilities are the behaviour
policy's and its values the learner's current value function's; ``collect_ahead=0`` is
the synchronous mode bit for bit; a seeded run repeats itself; nothing is left in flight
when ``learn()`` ends or a callback stops it; ``close()`` does not wait for a collection
in flight; a worker SIGKILLed while a collection runs ahead costs its fragment, and a
witness env (observation: env index, episode, step) proves no transition came from a
wrong env or a wrong step.
"""

from __future__ import annotations

import copy
import csv
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch as th
from envs import WitnessEnv, triple
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.utils import obs_as_tensor

from daskvec import DaskVecEnv
from daskvec.errors import AlreadySteppingError
from daskvec.learners import on_policy
from daskvec.sb3 import DaskA2C, DaskPPO
from daskvec.sb3.vec_env import State

pytestmark = pytest.mark.usefixtures("one_torch_thread")

N_ENVS = 4
HORIZON = 7


def witness_fns(delay: float = 0.0) -> list[Any]:
    return [lambda i=i: WitnessEnv(i, HORIZON, delay) for i in range(N_ENVS)]


class WitnessCheck(BaseCallback):
    """Checks every step the learner sees: each env's row follows its own row before, or starts afresh."""

    def __init__(self) -> None:
        super().__init__()
        self.last: list[tuple[int, int, int]] | None = None
        self.steps = 0
        self.rebuilt: list[int] = []

    def _on_step(self) -> bool:
        obs, dones, infos = self.locals["new_obs"], self.locals["dones"], self.locals["infos"]
        if self.last is None:
            self.last = [triple(o) for o in np.asarray(self.model._last_obs)]
            assert [r[0] for r in self.last] == list(range(N_ENVS))
        for i in range(N_ENVS):
            _, ep, t = self.last[i]
            now = triple(obs[i])
            if dones[i] and "daskvec" in infos[i]:  # rebuilt elsewhere: a fresh env, its last row as terminal
                assert now[0] == i and now[2] == 0, f"step {self.steps}: rebuilt env {i} handed out {now}"
                assert triple(infos[i]["terminal_observation"]) == self.last[i]
                self.rebuilt.append(i)
            elif dones[i]:
                term = triple(infos[i]["terminal_observation"])
                assert term == (i, ep, t + 1) and t + 1 == HORIZON, f"step {self.steps}: env {i} ended at {term}"
                assert now == (i, ep + 1, 0), f"step {self.steps}: env {i} handed out {now} after {term}"
            else:
                assert now == (i, ep, t + 1), f"step {self.steps}: env {i} handed out {now} after {self.last[i]}"
            self.last[i] = now
        self.steps += 1
        return True


class Weights(BaseCallback):
    """At each rollout's end: the buffer, the policy's weights, and V and log pi of the buffer under them."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[dict[str, Any]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf: Any = self.model.rollout_buffer
        policy = self.model.policy
        with th.no_grad():
            obs = obs_as_tensor(buf.observations.reshape(-1, 3), "cpu")
            actions = th.as_tensor(buf.actions.reshape(-1))
            values, log_probs, _ = policy.evaluate_actions(obs, actions)
        self.rollouts.append(
            {
                # the next rollout goes out after this callback, which may still use the env (a curriculum)
                "env_free": self.model._daskvec_ahead is None
                and self.training_env.get_attr("index") == list(range(self.training_env.num_envs)),
                "state": copy.deepcopy(policy.state_dict()),
                "buffer_log_probs": np.copy(buf.log_probs).reshape(-1),
                "buffer_values": np.copy(buf.values).reshape(-1),
                "actions": np.copy(buf.actions),
                "observations": np.copy(buf.observations),
                "values_now": values.numpy().reshape(-1),
                "log_probs_now": log_probs.numpy().reshape(-1),
            }
        )


def log_probs_under(model: Any, state: dict[str, Any], rollout: dict[str, Any]) -> np.ndarray:
    """log pi(a|s) of a rollout's buffer under the weights ``state``."""
    now = copy.deepcopy(model.policy.state_dict())
    model.policy.load_state_dict(state)
    try:
        with th.no_grad():
            obs = obs_as_tensor(rollout["observations"].reshape(-1, 3), "cpu")
            _, log_probs, _ = model.policy.evaluate_actions(obs, th.as_tensor(rollout["actions"].reshape(-1)))
    finally:
        model.policy.load_state_dict(now)
    return log_probs.numpy().reshape(-1)


def ppo(env: Any, **kw: Any) -> DaskPPO:
    return DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=2, seed=1, device="cpu", **kw)


# --------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("value", "error", "match"),
    [(2, ValueError, "more than one rollout ahead"), (-1, ValueError, "collect_ahead=-1"), ("1", TypeError, "str")],
)
def test_collect_ahead_other_than_0_or_1_is_refused_saying_why(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        DaskPPO("MlpPolicy", "CartPole-v1", collect_ahead=value, device="cpu")


# --------------------------------------------------------------------------- what is trained on
def test_zero_is_the_synchronous_mode_bit_for_bit(client2: Any) -> None:
    """``collect_ahead=0`` and no keyword: the same rollouts and the same final weights."""
    runs = []
    for kw in ({}, {"collect_ahead": 0}):
        with DaskVecEnv(witness_fns(), client2) as env:
            cb = Weights()
            model = ppo(env, **kw)
            model.learn(16 * N_ENVS * 3, callback=cb)
            runs.append(cb.rollouts)
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a["actions"], b["actions"])
        np.testing.assert_array_equal(a["buffer_log_probs"], b["buffer_log_probs"])
        for k in a["state"]:
            assert th.equal(a["state"][k], b["state"][k]), k


@pytest.mark.parametrize(
    ("cls", "revalue_batch"), [(DaskPPO, on_policy.REVALUE_BATCH), (DaskA2C, on_policy.REVALUE_BATCH), (DaskPPO, 13)]
)
def test_a_rollout_ahead_is_one_version_behind_with_current_values(
    cls: Any, revalue_batch: int, client2: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rollout k (k >= 2) was collected with the weights of rollout k-1's end, before the training
    between them: its recorded log-probabilities are theirs, not the trained policy's; its values
    are the trained value function's (valued in one batch, or, with 13 rows a batch, in batches of
    3 vec-steps and a last one of 1). ``on_rollout_end`` can still use the env: the next rollout
    goes out after it."""
    monkeypatch.setattr(on_policy, "REVALUE_BATCH", revalue_batch)
    with DaskVecEnv(witness_fns(), client2) as env:
        cb = Weights()
        kw = {"batch_size": 32, "n_epochs": 2} if cls is DaskPPO else {}
        model = cls("MlpPolicy", env, n_steps=16, seed=1, device="cpu", collect_ahead=1, **kw)
        model.learn(16 * N_ENVS * 4, callback=cb)
        assert env.state is State.IDLE and model._daskvec_ahead is None  # the run's end left nothing in flight
    first, *later = cb.rollouts
    assert len(later) == 3
    assert all(r["env_free"] for r in cb.rollouts)
    # the first rollout has nothing to be behind: collected and valued by the same policy
    np.testing.assert_allclose(first["buffer_log_probs"], first["log_probs_now"], rtol=1e-4, atol=1e-5)
    for k, rollout in enumerate(later, 1):
        behaviour = log_probs_under(model, cb.rollouts[k - 1]["state"], rollout)
        np.testing.assert_allclose(rollout["buffer_log_probs"], behaviour, rtol=1e-4, atol=1e-5, err_msg=f"rollout {k}")
        assert not np.allclose(rollout["buffer_log_probs"], rollout["log_probs_now"], rtol=1e-4, atol=1e-5), (
            f"rollout {k}: recorded by the policy that trains on it, not one version behind"
        )
        np.testing.assert_allclose(rollout["buffer_values"], rollout["values_now"], rtol=1e-4, atol=1e-5)
    assert model._daskvec_lags == (0, 1)


class Boundaries(BaseCallback):
    """At each rollout's end: the buffer's first observations and episode starts, and where it ended."""

    def __init__(self) -> None:
        super().__init__()
        self.rollouts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        buf: Any = self.model.rollout_buffer
        ended = (np.array(self.model._last_obs, copy=True), np.array(self.model._last_episode_starts, dtype=np.float32))
        self.rollouts.append((np.copy(buf.observations[0]), np.copy(buf.episode_starts[0]), *ended))


def test_a_rollout_ahead_starts_where_the_one_before_ended(client2: Any) -> None:
    """The rollout sent ahead starts from the observations the rollout before ended on (its last
    step's bootstrap is taken on them) and with its last dones as episode starts; with a horizon
    of 7 and rollouts of 16 steps, episodes cross every boundary."""
    with DaskVecEnv(witness_fns(), client2) as env:
        cb = Boundaries()
        ppo(env, collect_ahead=1).learn(16 * N_ENVS * 5, callback=cb)
    assert len(cb.rollouts) == 5
    for k in range(1, 5):
        first_obs, first_starts = cb.rollouts[k][:2]
        ended_obs, ended_starts = cb.rollouts[k - 1][2:]
        np.testing.assert_array_equal(first_obs, ended_obs, err_msg=f"rollout {k}")
        np.testing.assert_array_equal(first_starts, ended_starts, err_msg=f"rollout {k}")
        assert [triple(o)[0] for o in first_obs] == list(range(N_ENVS)), f"rollout {k}: envs out of order"


def test_a_seeded_run_ahead_repeats_itself(client2: Any) -> None:
    runs = []
    for _ in range(2):
        with DaskVecEnv(witness_fns(), client2) as env:
            cb = Weights()
            ppo(env, collect_ahead=1).learn(16 * N_ENVS * 3, callback=cb)
            runs.append(cb.rollouts)
    for a, b in zip(*runs, strict=True):
        np.testing.assert_array_equal(a["actions"], b["actions"])
        np.testing.assert_array_equal(a["buffer_values"], b["buffer_values"])
        for k in a["state"]:
            assert th.equal(a["state"][k], b["state"][k]), k


def test_lag_and_who_waited_reach_sb3s_logger(client2: Any, tmp_path: Path) -> None:
    with DaskVecEnv(witness_fns(), client2) as env:
        model = ppo(env, collect_ahead=1)
        model.set_logger(configure(str(tmp_path), ["csv"]))
        model.learn(16 * N_ENVS * 3)
    with open(tmp_path / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3
    keys = ("learner_wait_s", "learner_busy_s", "envs_busy_s", "envs_idle_s", "policy_lag_mean")
    for key in keys:
        assert all(r[f"daskvec/{key}"] != "" for r in rows[1:]), key
    assert [float(r["daskvec/policy_lag_mean"]) for r in rows] == [0.0, 1.0, 1.0]
    assert (float(rows[-1]["daskvec/policy_lag_min"]), float(rows[-1]["daskvec/policy_lag_max"])) == (0.0, 1.0)


# --------------------------------------------------------------------------- stopping and closing
class StopAt(BaseCallback):
    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.seen = at, 0

    def _on_step(self) -> bool:
        self.seen += 1
        return self.seen < self.at


def test_a_callback_that_stops_training_leaves_no_rollout_running(client2: Any) -> None:
    with DaskVecEnv(witness_fns(), client2) as env:
        model = ppo(env, collect_ahead=1)
        model.learn(16 * N_ENVS * 10, callback=StopAt(16 * 2 + 5))  # in the third rollout
        assert model._daskvec_ahead is None and env.state is State.IDLE
        assert model.num_timesteps == (16 * 2 + 5) * N_ENVS
        env.step(np.zeros(N_ENVS, dtype=np.int64))  # the vec env is free for any call


class TrainingFails(Exception):
    pass


def test_other_calls_while_a_collection_runs_ahead_say_why_and_close_does_not_wait(client2: Any) -> None:
    """An error in ``train()`` leaves the next rollout in flight: every call says so, ``close()`` abandons it."""
    per_step = 0.1
    with DaskVecEnv(witness_fns(delay=per_step), client2) as env:
        model = DaskPPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=1, device="cpu", collect_ahead=1)
        model.train = _raise  # type: ignore[method-assign]
        with pytest.raises(TrainingFails):
            model.learn(64 * N_ENVS * 3)
        assert env.state is State.COLLECTING
        with pytest.raises(AlreadySteppingError, match="collection is in flight"):
            env.step_async(np.zeros(N_ENVS, dtype=np.int64))
        with pytest.raises(AlreadySteppingError, match="collection is in flight"):
            env.get_attr("index")
        started = time.monotonic()
        env.close()
        took = time.monotonic() - started
    # the rollout in flight lasts 64 steps of `per_step` on each worker; close() did not wait for it
    assert took < 64 * per_step / 2, f"close() took {took:.1f}s with a rollout of {64 * per_step:.1f}s in flight"


def _raise() -> None:
    raise TrainingFails("the learner failed")


def test_learn_after_a_failed_train_reads_or_drops_the_collection_in_flight(
    client2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """After ``train()`` failed with a rollout in flight, ``learn(..., reset_num_timesteps=False)`` replays it
    (every step following its env's last one) and a default ``learn()`` drops it, saying so, before the reset."""
    rollout = 16 * N_ENVS
    with DaskVecEnv(witness_fns(), client2) as env:
        model = ppo(env, collect_ahead=1)
        train = model.train
        model.train = _raise  # type: ignore[method-assign]
        with pytest.raises(TrainingFails):
            model.learn(rollout * 3)
        assert env.state is State.COLLECTING and model.num_timesteps == rollout
        model.train = train  # type: ignore[method-assign]
        check = WitnessCheck()
        model.learn(rollout * 2, callback=check, reset_num_timesteps=False)
        assert model.num_timesteps == rollout * 3 and check.steps == 32 and env.state is State.IDLE
        model.train = _raise  # type: ignore[method-assign]
        with pytest.raises(TrainingFails):
            model.learn(rollout * 3, reset_num_timesteps=False)
        assert env.state is State.COLLECTING
        model.train = train  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="daskvec.learners.ahead"):
            model.learn(rollout * 2)
        assert "dropping the collection made ahead: learn() resets the env" in caplog.text
        assert model.num_timesteps == rollout * 2 and model._daskvec_ahead is None and env.state is State.IDLE


class _Observed(gym.Env[Any, Any]):
    """An env with a given observation space (for the revaluation's batches, which never step it)."""

    action_space = gym.spaces.Discrete(2)

    def __init__(self, space: gym.Space[Any]) -> None:
        self.observation_space = space

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        return self.observation_space.sample(), {}

    def step(self, action: Any) -> Any:
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize(
    ("policy", "space"),
    [
        ("CnnPolicy", gym.spaces.Box(0, 255, (3, 36, 36), np.uint8)),
        ("MultiInputPolicy", gym.spaces.Dict({"v": gym.spaces.Box(-1, 1, (3,)), "w": gym.spaces.Box(-1, 1, (2, 2))})),
    ],
    ids=["images", "dict"],
)
def test_the_revaluation_in_batches_is_the_value_of_every_row(
    policy: str, space: gym.Space[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Batches of 2 vec-steps of 3 envs, and a last of 1, give each row its own value, as one pass per vec-step."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    monkeypatch.setattr(on_policy, "REVALUE_BATCH", 7)
    model = DaskPPO(policy, DummyVecEnv([lambda: _Observed(space)] * 3), n_steps=5, batch_size=15, seed=0, device="cpu")
    buf: Any = model.rollout_buffer
    rng = np.random.default_rng(0)
    if isinstance(buf.observations, dict):
        for v in buf.observations.values():
            v[:] = rng.uniform(-1, 1, v.shape)
    else:
        buf.observations[:] = rng.integers(0, 256, buf.observations.shape)
    passes = []
    predict = model.policy.predict_values
    monkeypatch.setattr(model.policy, "predict_values", lambda obs: passes.append(1) or predict(obs))
    model._revalue(buf)
    assert len(passes) == 3  # 7 rows a batch: 2 vec-steps of 3 envs, twice, then 1
    model.batch_size = 6  # fewer rows than REVALUE_BATCH: PPO's minibatch bounds the batch too
    monkeypatch.setattr(on_policy, "REVALUE_BATCH", 10**6)
    passes.clear()
    model._revalue(buf)
    assert len(passes) == 3
    monkeypatch.undo()
    with th.no_grad():
        for t in range(buf.buffer_size):
            obs = (
                {k: v[t] for k, v in buf.observations.items()}
                if isinstance(buf.observations, dict)
                else buf.observations[t]
            )
            want = model.policy.predict_values(obs_as_tensor(obs, "cpu")).numpy().reshape(-1)
            np.testing.assert_allclose(buf.values[t], want, rtol=1e-5, atol=1e-5, err_msg=f"vec-step {t}")


# --------------------------------------------------------------------------- a worker lost while collecting ahead
@pytest.mark.timeout(240)
def test_worker_killed_while_a_rollout_is_collected_ahead(dask_processes: Any) -> None:
    """SIGKILL of a worker while the learner trains and the next rollout runs on the workers."""
    procs = dask_processes(2)
    killed: dict[str, Any] = {}
    witness = WitnessCheck()
    with DaskVecEnv(witness_fns(delay=0.02), procs.address, step_timeout=30) as env:
        victim = env.groups[0]
        assert len({g["worker"] for g in env.groups}) == 2
        model = DaskPPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=2, seed=1, device="cpu", collect_ahead=1)
        train = model.train

        def train_then_kill() -> None:
            # the second training runs while the third rollout is collected ahead: kill a worker then
            killed["trains"] = killed.get("trains", 0) + 1
            if killed["trains"] == 2:
                timer = threading.Timer(0.2, os.kill, (victim["pid"], signal.SIGKILL))
                timer.start()
                killed["timer"] = timer
                timer.join()
            train()

        model.train = train_then_kill  # type: ignore[method-assign]
        model.learn(32 * N_ENVS * 5, callback=witness)
        log = env.restart_log
        assert sorted(e["env"] for e in log) == sorted(victim["envs"])
        assert {e["reason"] for e in log} == {"worker_lost"}
        assert env.state is State.IDLE
    assert model.num_timesteps == 5 * 32 * N_ENVS
    assert witness.steps == 5 * 32
    assert sorted(witness.rebuilt) == sorted(victim["envs"]), "each lost env reported its rebuild once"


# --------------------------------------------------------------------------- off-policy learners
class BoxWitnessEnv(WitnessEnv):
    """The witness with a continuous action (SAC, TD3, DDPG)."""

    def __init__(self, index: int, delay: float = 0.0) -> None:
        super().__init__(index, HORIZON, delay)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)  # type: ignore[assignment]


def box_witness_fns(delay: float = 0.0) -> list[Any]:
    return [lambda i=i: BoxWitnessEnv(i, delay) for i in range(N_ENVS)]


class Actions(BaseCallback):
    """At each collection's end: the actor's weights, and the actions it stored with their observations."""

    def __init__(self) -> None:
        super().__init__()
        self.collections: list[dict[str, Any]] = []
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []

    def _on_step(self) -> bool:
        self.seen.append((np.copy(self.model._last_obs), np.copy(self.locals["buffer_actions"])))
        return True

    def _on_rollout_end(self) -> None:
        self.collections.append({"actor": copy.deepcopy(self.model.actor.state_dict()), "steps": self.seen})
        self.seen = []


def td3(env: Any, **kw: Any) -> Any:
    from daskvec.sb3 import DaskTD3

    return DaskTD3(
        "MlpPolicy", env, train_freq=(4, "step"), gradient_steps=3, learning_starts=0, seed=2, device="cpu", **kw
    )


def actor_actions(model: Any, state: dict[str, Any], obs: np.ndarray) -> np.ndarray:
    """The actor's scaled actions for ``obs`` under the weights ``state`` (TD3 without noise)."""
    now = copy.deepcopy(model.actor.state_dict())
    model.actor.load_state_dict(state)
    try:
        with th.no_grad():
            return model.actor(obs_as_tensor(obs, "cpu")).numpy()
    finally:
        model.actor.load_state_dict(now)


def test_off_policy_collections_ahead_use_the_actor_before_the_last_training(client2: Any) -> None:
    """DaskTD3 (no noise: the buffer's actions are the actor's): collection k was acted by the actor
    of collection k-1's end; the replay ratio is as configured, as in the synchronous mode."""
    runs = {}
    for ahead in (0, 1):
        with DaskVecEnv(box_witness_fns(), client2) as env:
            cb = Actions()
            model = td3(env, collect_ahead=ahead)
            model.learn(4 * N_ENVS * 5, callback=cb)
            assert env.state is State.IDLE and model._daskvec_ahead is None
            runs[ahead] = (model, cb.collections)
    sync, ahead_run = runs[0], runs[1]
    # the same replay ratio: 5 collections of 4 vec-steps, 3 gradient steps after each
    assert sync[0].num_timesteps == ahead_run[0].num_timesteps == 5 * 4 * N_ENVS
    assert sync[0]._n_updates == ahead_run[0]._n_updates == 5 * 3
    model, collections = ahead_run
    for k in range(1, len(collections)):
        before = collections[k - 1]["actor"]
        for t, (obs, stored) in enumerate(collections[k]["steps"]):
            np.testing.assert_allclose(stored, actor_actions(model, before, obs), rtol=1e-5, atol=1e-6)
            if t == 0:
                assert not np.allclose(stored, actor_actions(model, collections[k]["actor"], obs), atol=1e-6), (
                    f"collection {k}: acted by the actor that trained on it, not one version behind"
                )
    assert model._daskvec_lags == (0, 1)


def test_a_seeded_dasksac_run_ahead_repeats_itself(client2: Any) -> None:
    from daskvec.sb3 import DaskSAC

    runs = []
    for _ in range(2):
        with DaskVecEnv(box_witness_fns(), client2) as env:
            model = DaskSAC(
                "MlpPolicy",
                env,
                train_freq=(4, "step"),
                gradient_steps=2,
                learning_starts=8,
                seed=5,
                device="cpu",
                collect_ahead=1,
            )
            model.learn(4 * N_ENVS * 4)
            assert model.replay_buffer is not None
            runs.append(np.copy(model.replay_buffer.actions[: model.replay_buffer.pos]))
    np.testing.assert_array_equal(runs[0], runs[1])


@pytest.mark.timeout(240)
def test_worker_killed_while_a_dasksac_collection_runs_ahead(dask_processes: Any) -> None:
    from daskvec.sb3 import DaskSAC

    procs = dask_processes(2)
    killed: dict[str, Any] = {}
    witness = WitnessCheck()
    with DaskVecEnv(box_witness_fns(delay=0.02), procs.address, step_timeout=30) as env:
        victim = env.groups[0]
        assert len({g["worker"] for g in env.groups}) == 2
        model = DaskSAC(
            "MlpPolicy",
            env,
            train_freq=(32, "step"),
            gradient_steps=4,
            learning_starts=0,
            seed=1,
            device="cpu",
            collect_ahead=1,
        )
        train = model.train

        def train_then_kill(*args: Any, **kwargs: Any) -> None:
            killed["trains"] = killed.get("trains", 0) + 1
            if killed["trains"] == 2:  # while the third collection runs ahead
                timer = threading.Timer(0.2, os.kill, (victim["pid"], signal.SIGKILL))
                timer.start()
                timer.join()
            train(*args, **kwargs)

        model.train = train_then_kill  # type: ignore[method-assign]
        model.learn(32 * N_ENVS * 5, callback=witness)
        assert sorted(e["env"] for e in env.restart_log) == sorted(victim["envs"])
        assert env.state is State.IDLE
    assert model.num_timesteps == 5 * 32 * N_ENVS and witness.steps == 5 * 32
    assert sorted(witness.rebuilt) == sorted(victim["envs"])
    # every stored transition is one env's own: next_obs follows obs in the same env and episode
    buf = model.replay_buffer
    assert buf is not None
    obs, nxt, dones = buf.observations[: buf.pos], buf.next_observations[: buf.pos], buf.dones[: buf.pos]
    for t in range(buf.pos):
        for i in range(N_ENVS):
            a, b = triple(obs[t, 0, i] if obs.ndim == 4 else obs[t, i]), triple(nxt[t, i])
            assert a[0] == b[0] == i, f"transition {t} env {i}: {a} -> {b} (a foreign env)"
            if not dones[t, i]:
                assert (b[1], b[2]) == (a[1], a[2] + 1), f"transition {t} env {i}: {a} -> {b} (stale or shifted)"


# --------------------------------------------------------------------------- the learner's device
def test_the_shipped_weights_are_a_cpu_copy_that_training_does_not_change() -> None:
    """A collection sent ahead travels while the learner trains in place: it must carry a copy."""
    from stable_baselines3 import PPO

    from daskvec._core.rollouts import PolicyShipment

    model = PPO("MlpPolicy", "CartPole-v1", device="cpu", seed=0)
    shipment = PolicyShipment().update(model.policy, seed=1)
    before = {k: v.copy() for k, v in shipment.state.items()}
    with th.no_grad():
        for p in model.policy.parameters():
            p.add_(1.0)
    for k, v in shipment.state.items():
        np.testing.assert_array_equal(v, before[k], err_msg=f"{k} changed with the learner's weights")


@pytest.mark.skipif(not th.cuda.is_available(), reason="no CUDA device here: a GPU learner is checked where one is")
def test_a_gpu_learner_with_cpu_workers(client2: Any) -> None:
    with DaskVecEnv(witness_fns(), client2) as env:
        model = DaskPPO("MlpPolicy", env, n_steps=16, batch_size=32, n_epochs=1, device="cuda", collect_ahead=1)
        model.learn(16 * N_ENVS * 3)
        assert model.device.type == "cuda" and model.num_timesteps == 16 * N_ENVS * 3
        assert all(v.device.type == "cpu" for v in [th.as_tensor(a) for a in model._daskvec_shipment.state.values()])
