"""daskvec's figures in SB3's logger; sb3-contrib on DaskVecEnv; action masks."""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv
from stable_baselines3 import PPO
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize
from wire_frames import same, step_reply, wire

from daskvec import DaskVecEnv, DaskVecEnvMetrics
from daskvec.monitoring.sb3_logger import PREFIX, RESTART_REASONS, RestartTally, _Mark, layout_figures, timing_figures
from daskvec.transport import ActorChannel, DirectChannel, decode, encode, pack, unpack

sb3_contrib = pytest.importorskip("sb3_contrib", reason="sb3-contrib is not installed (pip install -e '.[test]')")

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture
def sends(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts the requests sent to env groups from this process, over either channel."""
    count = {"n": 0}
    for cls in (DirectChannel, ActorChannel):
        original = cls.send

        def counting(self: Any, request: Any, _original: Any = original) -> None:
            count["n"] += 1
            _original(self, request)

        monkeypatch.setattr(cls, "send", counting)
    return count


class MaskedEnv(gym.Env[np.ndarray, int]):
    """Four actions; ``action_masks`` forbids action ``t % 4`` and the ``blocked`` one.

    Taking a forbidden action raises, so a learner that used a stale mask fails. The
    observation is ``[t, blocked]``; episodes last ``horizon`` steps; the env raises at
    its ``fail_at``-th step (counted over its life), like a crash.
    """

    def __init__(self, horizon: int = 12, fail_at: int | None = None) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 100.0, shape=(2,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(4)
        self.horizon, self.fail_at = horizon, fail_at
        self.t, self.total, self.blocked = 0, 0, -1

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.blocked], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def action_masks(self) -> np.ndarray:
        mask = np.ones(4, dtype=bool)
        mask[self.t % 4] = False
        if self.blocked >= 0:
            mask[self.blocked] = False
        return mask

    def block(self, action: int) -> None:
        self.blocked = action

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        if not self.action_masks()[action]:
            raise RuntimeError(f"action {action} is masked at t={self.t} (blocked={self.blocked})")
        self.total += 1
        if self.fail_at is not None and self.total == self.fail_at:
            raise ValueError(f"crash at step {self.total}")
        self.t += 1
        return self._obs(), float(action == 3), self.t >= self.horizon, False, {}


def expected_mask(t: int, blocked: int = -1) -> np.ndarray:
    env = MaskedEnv()
    env.t, env.blocked = t, blocked
    return env.action_masks()


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


# --------------------------------------------------------------------------- the logger callback
METRIC_KEYS = [
    "env_steps_per_s",
    "step_client_ms",
    "step_transit_ms",
    "step_env_ms",
    "share_client",
    "share_transit",
    "share_env",
    "workers",
    "envs_per_worker_min",
    "envs_per_worker_max",
    "restarts",
    "lost_workers",
    *(f"restarts/{r}" for r in RESTART_REASONS),
]


def test_metrics_land_in_sb3_csv_log_with_restart_counts(dclient: Any, tmp_path: Path) -> None:
    """PPO with an env that crashes twice (on_env_error='restart'): every key in progress.csv, restarts counted."""
    fns = [functools.partial(CountingEnv, fail_at=30)] + [CountingEnv] * 3
    env = VecMonitor(DaskVecEnv(fns, client=dclient, on_env_error="restart"))
    try:
        model = PPO("MlpPolicy", env, device="cpu", seed=0, n_steps=16, batch_size=32, n_epochs=1)
        model.set_logger(configure(str(tmp_path), ["csv"]))
        callback = DaskVecEnvMetrics()
        model.learn(256, callback=callback)
        log = list(env.venv.restart_log)  # type: ignore[attr-defined]
    finally:
        env.close()
    rows = read_csv(tmp_path / "progress.csv")
    assert len(rows) == 4  # one per rollout of 16 x 4 steps
    for key in METRIC_KEYS:
        assert PREFIX + key in rows[0], key
    last = rows[-1]
    # env 0 crashed at its 30th and 60th step (a rebuilt env counts its steps from 0)
    assert [e["reason"] for e in log] == ["env_error", "env_error"] and {e["env"] for e in log} == {0}
    assert float(last["daskvec/restarts/env_error"]) == 2 == float(last["daskvec/restarts"])
    assert float(last["daskvec/restarts/worker_lost"]) == 0 == float(last["daskvec/lost_workers"])
    assert float(rows[0]["daskvec/restarts"]) == 0  # none in the first 16 steps per env
    assert float(last["daskvec/workers"]) == 2 and float(last["daskvec/envs_per_worker_max"]) == 2
    for row in rows:
        assert float(row["daskvec/env_steps_per_s"]) > 0
        assert float(row["daskvec/step_env_ms"]) > 0 and float(row["daskvec/step_transit_ms"]) > 0
        shares = sum(float(row[f"daskvec/share_{k}"]) for k in ("client", "transit", "env"))
        assert shares == pytest.approx(1.0)
    assert callback.last["daskvec/restarts"] == 2


def test_metrics_of_worker_side_rollouts(dclient: Any, tmp_path: Path) -> None:
    """DaskPPO collects its rollouts on the workers: the callback still sees their steps and time split."""
    from daskvec.sb3 import DaskPPO
    from daskvec.sb3 import DaskVecEnvMetrics as FromSb3

    assert FromSb3 is DaskVecEnvMetrics
    env = DaskVecEnv([CountingEnv] * 4, client=dclient)
    try:
        model = DaskPPO("MlpPolicy", env, device="cpu", seed=0, n_steps=16, batch_size=32, n_epochs=1)
        model.set_logger(configure(str(tmp_path), ["csv"]))
        model.learn(128, callback=DaskVecEnvMetrics())
        assert env.timer.vec_steps == 32  # two rollouts of 16 vec-steps, none stepped by the client
    finally:
        env.close()
    rows = read_csv(tmp_path / "progress.csv")
    assert len(rows) == 2
    for row in rows:
        assert float(row["daskvec/env_steps_per_s"]) > 0 and float(row["daskvec/step_env_ms"]) > 0
        shares = sum(float(row[f"daskvec/share_{k}"]) for k in ("client", "transit", "env"))
        assert shares == pytest.approx(1.0)


@pytest.mark.timeout(180)
def test_metrics_count_a_lost_worker(dask_processes: Any, tmp_path: Path) -> None:
    """SIGKILL of one of 2 ``dask worker`` processes during MaskablePPO: its envs count as restarts
    for ``worker_lost``, the worker as lost, and the layout figures follow. The rebuilt envs' masks
    came with their reset replies: every mask the learner asked for was in the cache."""
    from stable_baselines3.common.callbacks import BaseCallback
    from worker_processes import group_pids, process_of

    procs = dask_processes(2)
    env = DaskVecEnv([MaskedEnv] * 4, client=procs.address, timeout=60, worker_wait_timeout=60)
    killed: list[int] = []

    class KillAfterFirstRollout(BaseCallback):
        def _on_rollout_start(self) -> None:
            if self.num_timesteps > 0 and not killed:
                pid, indices = next(iter(group_pids(env).items()))
                killed.extend(indices)
                procs.kill_worker(process_of(procs, pid))

        def _on_step(self) -> bool:
            return True

    with env:
        model = sb3_contrib.MaskablePPO("MlpPolicy", env, device="cpu", seed=0, n_steps=16, batch_size=32, n_epochs=1)
        model.set_logger(configure(str(tmp_path), ["csv"]))
        model.learn(4 * 16 * 3, callback=[KillAfterFirstRollout(), DaskVecEnvMetrics()])
        log = list(env.restart_log)
        assert (env._masks.hits, env._masks.misses) == (3 * 16, 0)
    rows = read_csv(tmp_path / "progress.csv")
    assert len(killed) == 2 and sorted(e["env"] for e in log) == sorted(killed)
    assert [float(r["daskvec/restarts/worker_lost"]) for r in rows] == [0, 2, 2]
    assert [float(r["daskvec/lost_workers"]) for r in rows] == [0, 1, 1]
    assert [float(r["daskvec/workers"]) for r in rows] == [2, 1, 1]
    assert float(rows[-1]["daskvec/envs_per_worker_max"]) == 4


def test_metrics_with_tensorboard_log_and_progress_bar(dclient: Any, tmp_path: Path) -> None:
    """``tensorboard_log=`` and ``progress_bar=True``, the DaskVecEnv under VecNormalize: the scalars are written."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    env = VecNormalize(
        make_vec_env(
            "CartPole-v1",
            n_envs=4,
            seed=0,
            vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
            vec_env_kwargs={"client": dclient},
        )
    )
    try:
        model = PPO(
            "MlpPolicy", env, device="cpu", seed=0, n_steps=16, batch_size=32, n_epochs=1, tensorboard_log=str(tmp_path)
        )
        model.learn(128, callback=DaskVecEnvMetrics(), progress_bar=True)
    finally:
        env.close()
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    acc = event_accumulator.EventAccumulator(str(run))
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {PREFIX + k for k in METRIC_KEYS} <= scalars, scalars
    assert len(acc.Scalars("daskvec/env_steps_per_s")) == 2  # two rollouts
    assert [e.value for e in acc.Scalars("daskvec/workers")] == [2.0, 2.0]


def test_metrics_refuse_an_env_that_is_not_a_dask_vec_env() -> None:
    env = VecMonitor(DummyVecEnv([lambda: gym.make("CartPole-v1")]))
    model = PPO("MlpPolicy", env, device="cpu", n_steps=16, batch_size=16)
    with pytest.raises(TypeError, match=r"model's env is DummyVecEnv \(under VecMonitor\)"):
        model.learn(16, callback=DaskVecEnvMetrics())
    with pytest.raises(ValueError, match="log_freq must be a positive int"):
        DaskVecEnvMetrics(log_freq=0)


def test_restart_tally_counts_reasons_and_lost_workers() -> None:
    log = [
        {"env": 0, "reason": "worker_lost", "worker": "w3", "from_worker": "w1"},
        {"env": 1, "reason": "worker_lost", "worker": "w3", "from_worker": "w1"},
        {"env": 2, "reason": "timeout", "worker": "w3", "from_worker": "w2"},
        {"env": 2, "reason": "moved", "worker": "w1", "from_worker": "w3"},
        {"env": 3, "reason": "env_error", "worker": "w3"},
    ]
    tally = RestartTally()
    tally.update(log[:2])
    assert tally.figures()["lost_workers"] == 1
    tally.update(log)  # only the new entries are counted
    fig = tally.figures()
    assert fig["restarts"] == 5 and fig["lost_workers"] == 2
    assert [fig[f"restarts/{r}"] for r in RESTART_REASONS] == [1, 2, 1, 1]


def test_timing_and_layout_figures() -> None:
    """100 vec-steps of 8 envs in 2 s: 0.1 s on the client, 0.05 s in transit, 0.05 s in the envs."""
    fig = timing_figures(_Mark(10.0, 50, 1.0, 1.0, 1.0), _Mark(12.0, 150, 1.1, 1.05, 1.05), num_envs=8)
    assert fig == pytest.approx(
        {
            "env_steps_per_s": 400.0,
            "step_client_ms": 1.0,
            "step_transit_ms": 0.5,
            "step_env_ms": 0.5,
            "share_client": 0.5,
            "share_transit": 0.25,
            "share_env": 0.25,
        }
    )
    idle = timing_figures(_Mark(1.0, 5, 0, 0, 0), _Mark(2.0, 5, 0, 0, 0), num_envs=8)
    assert set(idle.values()) == {0.0}
    groups = [{"worker": "a", "envs": [0, 1]}, {"worker": "a", "envs": [2]}, {"worker": "b", "envs": [3]}]
    assert layout_figures(groups) == {"workers": 2.0, "envs_per_worker_min": 1.0, "envs_per_worker_max": 3.0}


# --------------------------------------------------------------------------- sb3-contrib
@pytest.mark.parametrize("algo", ["RecurrentPPO", "TRPO"])
def test_contrib_algorithms_train_on_dask_vec_env(algo: str, dclient: Any) -> None:
    cls = getattr(sb3_contrib, algo)
    policy = "MlpLstmPolicy" if algo == "RecurrentPPO" else "MlpPolicy"
    kwargs: dict[str, Any] = {"n_steps": 16, "batch_size": 32} if algo == "RecurrentPPO" else {"n_steps": 32}
    env = make_vec_env(
        "CartPole-v1",
        n_envs=4,
        seed=0,
        vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
        vec_env_kwargs={"client": dclient, "envs_per_actor": 2},
    )
    try:
        model = cls(policy, env, device="cpu", seed=0, **kwargs)
        model.learn(256)
        assert model.num_timesteps >= 256
        assert len(model.ep_info_buffer) > 0  # episodes ended on the workers and were reported
    finally:
        env.close()


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_maskable_ppo_one_round_trip_per_group_per_step(cache: bool, dclient: Any, sends: dict[str, int]) -> None:
    """MaskablePPO respects fresh masks every step (a stale one raises in the env) and, with the cache,
    sends each group one request per step, plus one reset and one has_attr per rollout."""
    n_envs, n_steps, total = 4, 16, 256
    env = DaskVecEnv([MaskedEnv] * n_envs, client=dclient, envs_per_actor=2, cache_action_masks=cache)
    try:
        model = sb3_contrib.MaskablePPO(
            "MlpPolicy", env, device="cpu", seed=0, n_steps=n_steps, batch_size=32, n_epochs=1
        )
        groups = len(env.groups)
        sends["n"] = 0
        model.learn(total)
        sent = sends["n"]
    finally:
        env.close()
    assert groups == 2
    rollouts = total // (n_steps * n_envs)
    vec_steps = rollouts * n_steps
    mask_calls = 0 if cache else vec_steps
    assert sent == groups * (1 + rollouts + vec_steps + mask_calls), (sent, groups, rollouts, vec_steps)
    assert env._masks.hits == (vec_steps if cache else 0)


@pytest.mark.parametrize("options", [{}, {"transport": "actor", "env_process": True}], ids=["direct", "actor-process"])
def test_action_mask_cache_follows_the_envs(options: dict[str, Any], dclient: Any, sends: dict[str, int]) -> None:
    """Masks come with every reply; set_attr and other env_method calls send the next mask call to the envs;
    a restarted env's fresh mask comes with the step that rebuilt it. Either transport, envs in the worker or
    in a process of their own."""
    fns = [MaskedEnv, functools.partial(MaskedEnv, fail_at=2), MaskedEnv, MaskedEnv]
    env = DaskVecEnv(fns, client=dclient, envs_per_actor=2, on_env_error="restart", **options)
    try:
        assert {g["transport"] for g in env.groups} == {options.get("transport", "direct")}
        env.reset()
        sends["n"] = 0
        masks = env.env_method("action_masks")
        assert sends["n"] == 0 and same(masks, [expected_mask(0)] * 4)
        env.set_attr("blocked", 2, indices=[0])
        sends["n"] = 0
        assert same(env.env_method("action_masks", indices=[0, 3]), [expected_mask(0, 2), expected_mask(0)])
        assert sends["n"] == 2  # both groups asked: env 0 changed
        env.step(np.array([1, 1, 1, 1]))
        sends["n"] = 0
        assert same(env.env_method("action_masks"), [expected_mask(1, 2)] + [expected_mask(1)] * 3)
        assert sends["n"] == 0
        env.env_method("block", 3, indices=[2])
        sends["n"] = 0
        assert same(env.env_method("action_masks", indices=2), [expected_mask(1, 3)])
        assert sends["n"] == 1
        env.step(np.array([3, 2, 2, 2]))  # env 1 crashes at its 2nd step and is rebuilt
        assert [e["env"] for e in env.restart_log] == [1]
        sends["n"] = 0
        masks = env.env_method("action_masks")
        assert sends["n"] == 0
        assert same(masks, [expected_mask(2, 2), expected_mask(0), expected_mask(2, 3), expected_mask(2)])
        assert env.has_attr("action_masks") and not env.has_attr("no_such_attribute")
    finally:
        env.close()


def test_masks_travel_in_compact_step_replies() -> None:
    obs = np.arange(6, dtype=np.float32).reshape(3, 2)
    for masks in (np.array([[True, False], [False, True], [True, True]]), np.ones((3, 6000), dtype=bool)):
        reply = step_reply(obs, masks=masks)
        frames = encode(reply)
        assert memoryview(frames[1])[0] == 0x03
        assert same(decode(wire(frames)), reply) and same(unpack(pack(reply)), reply)
    assert memoryview(encode(step_reply(obs))[1])[0] == 0x02  # no masks: the reply as before
    odd = step_reply(obs, masks=np.array([[1], "a", None], dtype=object))
    assert memoryview(encode(odd)[1])[0] == 0x80
    assert same(decode(wire(encode(odd))), odd)


def test_mask_benchmark_measures_both_ways(dclient: Any) -> None:
    """benchmarks.masks: one rollout of 64 steps each way; only the cached run answers from the cache."""
    from benchmarks.masks import measure

    on, off = measure(True, dclient, 2, 128), measure(False, dclient, 2, 128)
    assert on["timesteps"] == off["timesteps"] == 128
    assert (on["mask_cache_hits"], off["mask_cache_hits"]) == (64, 0)
    assert on["env_steps_per_s"] > 0 and off["collect_env_steps_per_s"] > 0
