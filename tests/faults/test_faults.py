"""Fault tolerance with real faults: killed workers, crashing and frozen envs, scale-down.

Every test counts the restart markers (``info["daskvec"]``) the learner actually saw
and checks them against ``env.restart_log`` / ``env.restart_counts``, and checks that
the groups still hold every env index exactly once: a lost, duplicated or
double-reported env fails the test.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import DaskProcesses, start_dask_processes
from envs import CountingEnv
from worker_processes import group_pids, process_of

from benchmarks.witness import dask_ports, footprint_probe
from daskvec import DaskVecEnv
from daskvec.cluster.clients import keep_env_workers, scheduler_workers
from daskvec.errors import DaskVecEnvError, EnvRestartBudgetExceeded, StepTimeoutError
from daskvec.worker import INFO_KEY, restart_seed

#: Every test here starts processes (scripts, `dask` commands, clusters).
pytestmark = pytest.mark.processes


# --------------------------------------------------------------------------- helpers
def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


class FreezingEnv(CountingEnv):
    """A CountingEnv that, once per test, sleeps for an hour inside ``step``.

    The first instance to reach step ``freeze_at`` creates ``flag`` and freezes; the
    rebuilt env sees the flag and steps normally.
    """

    def __init__(self, flag: str, freeze_at: int = 3) -> None:
        super().__init__(horizon=1000)
        self.flag = flag
        self.freeze_at = freeze_at

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.total_steps + 1 == self.freeze_at and not os.path.exists(self.flag):
            Path(self.flag).touch()
            time.sleep(3600)
        return super().step(action)


def assert_layout_intact(env: DaskVecEnv) -> None:
    """Every env index is held by exactly one group, on a distinct live group."""
    held = Counter(i for g in env.groups for i in g["envs"])
    assert sorted(held) == list(range(env.num_envs)), f"envs lost: {sorted(set(range(env.num_envs)) - set(held))}"
    assert all(c == 1 for c in held.values()), f"envs duplicated: {held}"


def markers(infos: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The daskvec restart markers in one step's infos, by env index."""
    return {i: info[INFO_KEY] for i, info in enumerate(infos) if INFO_KEY in info}


def process_ended(pid: int) -> bool:
    """Whether process ``pid`` has exited (a zombie nobody reaped counts as exited)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for_exit(pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not process_ended(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {timeout:.0f}s"
        time.sleep(0.2)


def live_workers(procs: DaskProcesses) -> list[Any]:
    return [p for p in procs.workers if p.poll() is None]


def documented_seed(env_index: int, restarts: int, base_seed: int | None) -> int:
    """The seed docs/fault-tolerance.md promises a rebuilt env, computed from the formula given there.

    Deliberately not :func:`daskvec.worker.restart_seed`: a broken ``restart_seed`` must
    not break the expectation with it.
    """
    entropy = [0 if base_seed is None else base_seed & 0xFFFFFFFF, env_index, restarts]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] & 0x7FFFFFFF)


def assert_seeded_with(env: DaskVecEnv, obs: np.ndarray, i: int, seed: int) -> None:
    """Rebuilt env ``i`` was reset exactly once, with ``seed``: by its own record and by its observation."""
    assert env.get_attr("reset_seeds", [i]) == [[seed]], f"env {i} was not reset with the seed {seed}"
    assert env.reset_infos[i]["seeded"] == seed
    fresh, _ = CountingEnv(horizon=1000).reset(seed=seed)
    np.testing.assert_array_equal(obs[i], fresh, err_msg=f"env {i}'s first observation")


def ensure_workers(procs: DaskProcesses, n: int) -> None:
    """Bring the module's cluster back to exactly ``n`` live worker processes."""
    from distributed import Client

    alive = live_workers(procs)
    for p in alive[n:]:
        procs.kill_worker(p)
    for _ in range(n - len(alive)):
        procs.add_worker()
    with Client(procs.address, timeout=60, set_as_default=False) as c:
        deadline = time.monotonic() + 60
        while len(scheduler_workers(c)) != n:
            assert time.monotonic() < deadline, "the scheduler did not settle on the expected workers"
            time.sleep(0.1)


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskProcesses]:
    """A ``dask scheduler`` and ``dask worker`` processes shared by this module's tests.

    Each test starts with :func:`ensure_workers`: workers killed by one test are
    replaced for the next.
    """
    p = start_dask_processes(3, tmp_path_factory.mktemp("faults"))
    yield p
    p.stop()


# --------------------------------------------------------------------------- lost worker
@pytest.mark.timeout(240)
def test_sigkill_worker_during_ppo_learn(procs: DaskProcesses) -> None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    ensure_workers(procs, 3)
    env = DaskVecEnv([cartpole] * 6, client=procs.address, timeout=60, worker_wait_timeout=60)
    assert len({g["worker"] for g in env.groups}) == 3

    class KillAndCount(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.seen: Counter[int] = Counter()
            self.killed: list[int] = []
            self.marker_steps: list[int] = []

        def _on_step(self) -> bool:
            infos, dones = self.locals["infos"], self.locals["dones"]
            for i, m in markers(infos).items():
                self.seen[i] += 1
                self.marker_steps.append(self.num_timesteps)
                assert dones[i], "a restarted env must report done"
                assert infos[i]["TimeLimit.truncated"] is True
                assert infos[i]["terminal_observation"].shape == (4,)
                assert m["restarted"] is True and m["reason"] == "worker_lost"
                assert m["seed"] == restart_seed(i, 1, i)  # PPO(seed=0) seeded env i with 0 + i
            if not self.killed and self.num_timesteps >= 6 * 100:
                pid, indices = next(iter(group_pids(env).items()))
                self.killed = sorted(indices)
                procs.kill_worker(process_of(procs, pid))
            return True

    cb = KillAndCount()
    with env:
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, device="cpu", seed=0)
        model.learn(6 * 64 * 4, callback=cb)

        assert cb.killed, "the worker was never killed"
        assert env.num_envs == 6
        assert_layout_intact(env)
        # each env of the killed worker was reported exactly once, and no other env was
        assert dict(cb.seen) == dict.fromkeys(cb.killed, 1)
        assert sorted(e["env"] for e in env.restart_log) == cb.killed
        assert {e["reason"] for e in env.restart_log} == {"worker_lost"}
        assert env.restart_counts.tolist() == [1 if i in cb.killed else 0 for i in range(6)]
        # all markers were in one vec step
        assert len(set(cb.marker_steps)) == 1
        assert len({g["worker"] for g in env.groups}) == 2


@pytest.mark.timeout(180)
@pytest.mark.parametrize("user_seed", [None, 11])
def test_lost_envs_get_reward_zero_and_the_documented_seed(procs: DaskProcesses, user_seed: int | None) -> None:
    """Envs lost with their worker, twice: reward 0 in the truncation row, reseeded as documented each time."""
    ensure_workers(procs, 3)
    with DaskVecEnv(
        [functools.partial(CountingEnv, horizon=1000)] * 4,
        client=procs.address,
        envs_per_actor=2,
        timeout=60,
        worker_wait_timeout=60,
    ) as env:
        if user_seed is not None:
            env.seed(user_seed)
        env.reset()
        base = [None if user_seed is None else user_seed + i for i in range(4)]
        assert env.get_attr("reset_seeds") == [[b] for b in base]
        actions = np.array([1, 2, 2, 1])  # CountingEnv's reward is the action: no env's last reward is 0
        seen = []
        for restarts in (1, 2):
            last, rews, _, _ = env.step(actions)
            assert rews.tolist() == actions.tolist()
            held = group_pids(env)
            victim = next(pid for pid, envs in held.items() if 0 in envs)
            assert sorted(held[victim]) == [0, 1]
            # the first time the envs go to the idle third worker, the second time to the last one
            procs.kill_worker(process_of(procs, victim))
            obs, rews, dones, infos = env.step(actions)
            m = markers(infos)
            assert sorted(m) == [0, 1]
            assert rews.tolist() == [0.0, 0.0, 2.0, 1.0]  # the lost envs' step never happened
            assert dones.tolist() == [True, True, False, False]
            for i in (0, 1):
                seed = documented_seed(i, restarts, base[i])
                assert_seeded_with(env, obs, i, seed)
                assert infos[i]["TimeLimit.truncated"] is True
                # the last observation the learner saw, not the rebuilt env's first
                np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i], err_msg=f"env {i}")
                assert (m[i]["reason"], m[i]["restarts"], m[i]["seed"]) == ("worker_lost", restarts, seed)
            seen.append(env.get_attr("reset_seeds", [0])[0][0])
        assert seen[0] != seen[1]  # a second rebuild is not a replay of the first
        assert env.restart_counts.tolist() == [2, 2, 0, 0]
        assert_layout_intact(env)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("user_seed", [None, 11])
def test_env_error_after_a_lost_worker_gets_the_documented_seed(procs: DaskProcesses, user_seed: int | None) -> None:
    """Env 1 is rebuilt once with its lost worker, then raises: its second rebuild counts both.

    The seed follows the documented formula with the env's total rebuild count (2) and
    the user's seed, not the seed of its first rebuild, whichever side rebuilds it.
    """
    ensure_workers(procs, 3)
    fns = [functools.partial(CountingEnv, horizon=1000, fail_at=4 if i == 1 else None) for i in range(4)]
    with DaskVecEnv(
        fns, client=procs.address, envs_per_actor=2, on_env_error="restart", timeout=60, worker_wait_timeout=60
    ) as env:
        if user_seed is not None:
            env.seed(user_seed)
        env.reset()
        base = None if user_seed is None else user_seed + 1
        actions = np.ones(4, dtype=np.int64)
        env.step(actions)
        held = group_pids(env)
        procs.kill_worker(process_of(procs, next(pid for pid, envs in held.items() if 1 in envs)))
        obs, _, _, infos = env.step(actions)  # the envs of the lost worker are rebuilt
        assert markers(infos)[1]["reason"] == "worker_lost"
        assert_seeded_with(env, obs, 1, documented_seed(1, 1, base))
        for _ in range(4):
            obs, _, dones, infos = env.step(actions)
        # the rebuilt env 1 raised on its 4th step and its group rebuilt it
        m = markers(infos)
        assert list(m) == [1] and m[1]["reason"] == "env_error" and dones[1]
        seed = documented_seed(1, 2, base)
        assert (m[1]["restarts"], m[1]["seed"]) == (2, seed)
        assert_seeded_with(env, obs, 1, seed)
        assert env.restart_counts.tolist()[:2] == [1, 2] and env.error_restarts.tolist()[1] == 1


# --------------------------------------------------------------------------- crashing env
@pytest.mark.timeout(120)
@pytest.mark.parametrize("policy", ["raise", "restart"])
def test_env_raising_on_its_50th_step(client2: Any, policy: str) -> None:
    fns = [functools.partial(CountingEnv, horizon=1000, fail_at=50 if i == 1 else None) for i in range(4)]
    with DaskVecEnv(fns, client=client2, envs_per_actor=2, on_env_error=policy, max_restarts=1, timeout=60) as env:
        env.seed(7)
        obs = env.reset()
        actions = np.ones(4, dtype=np.int64)
        for _ in range(49):
            obs, _, dones, infos = env.step(actions)
            assert not dones.any() and not markers(infos)
        if policy == "raise":
            with pytest.raises(ValueError, match="boom at step 50") as err:
                env.step(actions)
            assert err.value.env_index == 1  # type: ignore[attr-defined]
            assert "boom at step 50" in err.value.remote_traceback  # type: ignore[attr-defined]
            return
        last = obs.copy()
        obs, rews, dones, infos = env.step(actions)
        assert dones.tolist() == [False, True, False, False]
        assert rews.tolist() == [1.0, 0.0, 1.0, 1.0]
        m = markers(infos)
        assert list(m) == [1]
        assert m[1]["reason"] == "env_error" and m[1]["error"] == "ValueError: boom at step 50"
        assert m[1]["seed"] == restart_seed(1, 1, 8)  # env.seed(7) gave env 1 the seed 8
        assert infos[1]["TimeLimit.truncated"] is True
        np.testing.assert_array_equal(infos[1]["terminal_observation"], last[1])
        assert obs[1][0] == 0  # a fresh episode
        assert env.error_restarts.tolist() == [0, 1, 0, 0]
        assert env.restart_counts.tolist() == [0, 1, 0, 0]
        assert [(e["env"], e["reason"]) for e in env.restart_log] == [(1, "env_error")]
        # the other envs went on undisturbed
        assert obs[[0, 2, 3], 0].tolist() == [50.0, 50.0, 50.0]
        # the rebuilt env fails again at its own 50th step: past max_restarts=1
        for _ in range(49):
            _, _, dones, infos = env.step(actions)
            assert not markers(infos)
        with pytest.raises(EnvRestartBudgetExceeded, match="max_restarts=1") as budget:
            env.step(actions)
        assert budget.value.env_index == 1 and budget.value.restarts == 2


@pytest.mark.timeout(120)
@pytest.mark.parametrize("user_seed", [None, 7])
def test_env_rebuilt_after_errors_gets_the_documented_seeds(client2: Any, user_seed: int | None) -> None:
    """Env 1 raises on its 3rd step, and so does each rebuilt env 1: two restarts, two documented seeds."""
    fns = [functools.partial(CountingEnv, horizon=1000, fail_at=3 if i == 1 else None) for i in range(4)]
    with DaskVecEnv(fns, client=client2, envs_per_actor=2, on_env_error="restart", max_restarts=2, timeout=60) as env:
        if user_seed is not None:
            env.seed(user_seed)
        env.reset()
        base = None if user_seed is None else user_seed + 1
        actions = np.full(4, 2, dtype=np.int64)
        seen = []
        for restarts in (1, 2):
            for _ in range(2):
                _, _, dones, infos = env.step(actions)
                assert not dones.any() and not markers(infos)
            obs, rews, dones, infos = env.step(actions)  # env 1 raises
            m = markers(infos)
            assert list(m) == [1] and m[1]["reason"] == "env_error" and m[1]["restarts"] == restarts
            assert dones.tolist() == [False, True, False, False] and rews.tolist() == [2.0, 0.0, 2.0, 2.0]
            seed = documented_seed(1, restarts, base)
            assert_seeded_with(env, obs, 1, seed)
            assert m[1]["seed"] == seed
            seen.append(env.get_attr("reset_seeds", [1])[0][0])
        assert seen[0] != seen[1]  # a second restart is not a replay of the first
        assert env.error_restarts.tolist() == [0, 2, 0, 0]


# --------------------------------------------------------------------------- scale-down
@pytest.mark.timeout(180)
def test_localcluster_scale_down_while_stepping() -> None:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=50
        ) as cluster,
        Client(cluster, set_as_default=False) as client,
        DaskVecEnv(
            [functools.partial(CountingEnv, horizon=25)] * 6, client=client, timeout=60, worker_wait_timeout=60
        ) as env,
    ):
        env.reset()
        actions = np.zeros(6, dtype=np.int64)
        for _ in range(5):
            env.step(actions)
        # SpecCluster.scale() closes the most recently added worker, plugins or not
        last_name = str(list(cluster.worker_spec)[-1])
        (doomed,) = [a for a, w in scheduler_workers(client).items() if str(w["name"]) == last_name]
        doomed_envs = sorted(i for g in env.groups if g["worker"] == doomed for i in g["envs"])
        cluster.scale(1)
        seen: Counter[int] = Counter()
        steps = 0
        while not seen:
            assert steps < 20_000, "the scale-down was never noticed"
            _, _, dones, infos = env.step(actions)
            steps += 1
            for i, m in markers(infos).items():
                assert m["reason"] == "worker_lost" and m["from_worker"] == doomed and dones[i]
                seen[i] += 1
        for _ in range(30):  # and nothing is reported twice afterwards
            _, _, _, infos = env.step(actions)
            seen.update(markers(infos).keys())
        assert dict(seen) == dict.fromkeys(doomed_envs, 1)
        assert sorted(e["env"] for e in env.restart_log) == doomed_envs
        assert_layout_intact(env)
        assert doomed not in {g["worker"] for g in env.groups}
        assert len(scheduler_workers(client)) == 1


def test_the_scale_down_plugin_is_registered_once_without_a_warning(client2: Any) -> None:
    """Each DaskVecEnv registers it; the scheduler keeps the first and says nothing (it warned "overwriting")."""
    import warnings

    def plugin_id(dask_scheduler: Any) -> int:
        return id(dask_scheduler.plugins["daskvec-keep-env-workers"])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        keep_env_workers(client2)
        first = client2.run_on_scheduler(plugin_id)
        keep_env_workers(client2)
        assert client2.run_on_scheduler(plugin_id) == first
    assert not [w for w in caught if "already contains a plugin" in str(w.message)]


def test_keep_env_workers_plugin_spares_env_workers(procs: DaskProcesses) -> None:
    """Adaptive scale-down (``Scheduler.workers_to_close``) picks idle workers first."""
    from distributed import Client

    ensure_workers(procs, 3)
    with Client(procs.address, set_as_default=False) as client:
        workers = sorted(scheduler_workers(client))
        holders, idle = workers[:2], workers[2]
        with DaskVecEnv([cartpole] * 4, client=client, workers=holders, timeout=60) as env:
            assert {g["worker"] for g in env.groups} == set(holders)

            def to_close(n: int) -> Any:
                return client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=n))

            assert to_close(1) == [idle]
            # asked for two, it still offers only the worker without envs
            assert to_close(2) == [idle]
            # the same question without the plugin offers env-holding workers
            client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.remove_plugin("daskvec-keep-env-workers"))
            try:
                assert set(to_close(2)) & set(holders)
            finally:
                keep_env_workers(env.client)
            assert to_close(2) == [idle]

    # every worker holds envs: the plugin leaves the choice to the scheduler
    with (
        Client(procs.address, set_as_default=False) as client,
        DaskVecEnv([cartpole] * 3, client=client, timeout=60) as env,
    ):
        assert len({g["worker"] for g in env.groups}) == 3
        assert len(client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.workers_to_close(n=1))) == 1


# --------------------------------------------------------------------------- rebalance
@pytest.mark.timeout(180)
def test_rebalance_onto_a_new_worker(procs: DaskProcesses) -> None:
    ensure_workers(procs, 2)
    with DaskVecEnv(
        [functools.partial(CountingEnv, horizon=1000)] * 6, client=procs.address, envs_per_actor=1, timeout=60
    ) as env:
        env.reset()
        actions = np.ones(6, dtype=np.int64)
        for _ in range(3):
            env.step(actions)
        before = {g["envs"][0]: g["worker"] for g in env.groups}
        assert sorted(Counter(before.values()).values()) == [3, 3]
        assert env.rebalance() == 0  # already balanced
        procs.add_worker()
        procs.wait_for_workers(3)
        assert env.rebalance() == 2
        assert env.rebalance() == 2  # planning again replaces the plan, it does not add to it
        obs, rews, dones, infos = env.step(actions)
        m = markers(infos)
        assert len(m) == 2
        new_worker = ({g["worker"] for g in env.groups} - set(before.values())).pop()
        for i, mk in m.items():
            assert mk["reason"] == "moved" and mk["from_worker"] == before[i] and mk["worker"] == new_worker
            assert dones[i] and infos[i]["TimeLimit.truncated"] is True
            assert infos[i]["terminal_observation"][0] == 4.0  # the step it made before moving
            assert rews[i] == 1.0  # the step happened: its reward is kept
            assert obs[i][0] == 0.0
        assert [int(o[0]) for i, o in enumerate(obs) if i not in m] == [4] * 4
        assert sorted(Counter(g["worker"] for g in env.groups).values()) == [2, 2, 2]
        assert_layout_intact(env)
        assert sorted(e["env"] for e in env.restart_log) == sorted(m)
        seen = Counter(m.keys())
        for _ in range(20):
            _, _, _, infos = env.step(actions)
            seen.update(markers(infos).keys())
        assert dict(seen) == dict.fromkeys(m, 1)
        assert env.rebalance() == 0


@pytest.mark.timeout(180)
def test_auto_rebalance_splits_a_group(procs: DaskProcesses) -> None:
    ensure_workers(procs, 2)
    with DaskVecEnv(
        [functools.partial(CountingEnv, horizon=1000)] * 4,
        client=procs.address,
        timeout=60,
        auto_rebalance=True,
        rebalance_interval=0.2,
    ) as env:
        env.reset()
        actions = np.ones(4, dtype=np.int64)
        procs.add_worker()
        procs.wait_for_workers(3)
        seen: Counter[int] = Counter()
        total = np.zeros(4)
        for step in range(2000):
            _, rews, _, infos = env.step(actions)
            total += rews
            seen.update(markers(infos).keys())
            if len({g["worker"] for g in env.groups}) == 3 and step > 10:
                break
        assert len({g["worker"] for g in env.groups}) == 3
        envs_per_worker = Counter(g["worker"] for g in env.groups for _ in g["envs"])
        assert sorted(envs_per_worker.values()) == [1, 1, 2]
        # one group of 2 was split: both its envs were rebuilt (one in place, one on the new worker), once
        assert sorted(seen.values()) == [1, 1] and len({i // 2 for i in seen}) == 1
        assert {e["reason"] for e in env.restart_log} == {"moved"}
        assert total.tolist() == [step + 1.0] * 4  # no step lost its reward
        assert_layout_intact(env)


@pytest.mark.timeout(240)
def test_frozen_worker_costs_one_placement_timeout(procs: DaskProcesses) -> None:
    """A worker that stops answering (SIGSTOP) but is still on the scheduler's list."""
    import signal

    ensure_workers(procs, 3)
    env = DaskVecEnv(
        [functools.partial(CountingEnv, horizon=1000)] * 4, client=procs.address, envs_per_actor=2, timeout=10
    )
    frozen = None
    try:
        held = group_pids(env)
        (idle,) = [p for p in live_workers(procs) if p.pid not in held]
        victim_pid = next(pid for pid, envs in held.items() if 0 in envs)
        env.reset()
        actions = np.zeros(4, dtype=np.int64)
        env.step(actions)
        os.kill(idle.pid, signal.SIGSTOP)
        frozen = idle
        procs.kill_worker(process_of(procs, victim_pid))
        # the lost envs go to the worker holding none, the frozen one: its placement
        # times out (10 s) and they land on the last live worker
        _, _, dones, infos = env.step(actions)
        m = markers(infos)
        assert sorted(m) == sorted(held[victim_pid]) and all(dones[i] for i in m)
        assert set(group_pids(env)) == set(held) - {victim_pid}
        # Without the quarantine the idle frozen worker is the obvious target of a
        # rebalance, and every later placement would wait out the timeout on it again.
        assert env.rebalance() == 0
        restarts = len(env.restart_log)
        for _ in range(3):
            env.step(actions)
        assert len(env.restart_log) == restarts
        assert_layout_intact(env)
    finally:
        env.close()
        if frozen is not None:
            os.kill(frozen.pid, signal.SIGCONT)
            procs.kill_worker(frozen)


# --------------------------------------------------------------------------- hangs
@pytest.mark.timeout(180)
@pytest.mark.parametrize(
    ("policy", "transport", "env_process"),
    [("restart", "direct", False), ("restart", "actor", False), ("restart", "actor", True), ("raise", "direct", False)],
)
def test_frozen_env_under_step_timeout(
    procs: DaskProcesses, tmp_path: Path, policy: str, transport: str, env_process: bool
) -> None:
    ensure_workers(procs, 2)
    flag = str(tmp_path / "frozen")
    fns = [
        functools.partial(FreezingEnv, flag) if i == 0 else functools.partial(CountingEnv, horizon=1000)
        for i in range(4)
    ]
    env = DaskVecEnv(
        fns,
        client=procs.address,
        transport=transport,
        step_timeout=3.0,
        timeout=60,
        on_worker_lost=policy,
        env_process=env_process,
    )
    frozen_pid = next(pid for pid, envs in group_pids(env).items() if 0 in envs)
    (frozen_env_pid,) = [g["env_pid"] for g in env.groups if 0 in g["envs"]]
    try:
        env.reset()
        actions = np.zeros(4, dtype=np.int64)
        env.step(actions)
        last = env.step(actions)[0]
        if policy == "raise":
            with pytest.raises(StepTimeoutError, match=r"did not answer within 3\.0s") as err:
                env.step(actions)
            assert 0 in err.value.env_indices
            with pytest.raises(DaskVecEnvError, match="lost envs earlier"):
                env.step_async(actions)
        else:
            obs, _, dones, infos = env.step(actions)
            assert os.path.exists(flag)
            m = markers(infos)
            lost = sorted(m)
            assert 0 in lost
            for i in lost:
                assert m[i]["reason"] == "timeout" and dones[i] and infos[i]["TimeLimit.truncated"] is True
                np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i])
            for i in set(range(4)) - set(lost):
                assert obs[i][0] == 3.0 and not dones[i]
            seen = Counter(m.keys())
            for _ in range(10):
                _, _, _, infos = env.step(actions)
                seen.update(markers(infos).keys())
            assert dict(seen) == dict.fromkeys(lost, 1)
            assert_layout_intact(env)
            assert frozen_pid not in group_pids(env)
            if env_process:  # the abandoned group's process, frozen mid-step, is killed; its worker lives on
                wait_for_exit(frozen_env_pid, 30)
                assert process_of(procs, frozen_pid).poll() is None
    finally:
        env.close()  # must not wait on the frozen thread
        assert env.closed
        procs.kill_worker(process_of(procs, frozen_pid))


# --------------------------------------------------------------------------- env processes
def env_process_vec(procs: DaskProcesses, envs_per_actor: int) -> DaskVecEnv:
    """4 CountingEnvs with ``env_process=True`` over 2 worker processes."""
    ensure_workers(procs, 2)
    return DaskVecEnv(
        [functools.partial(CountingEnv, horizon=1000)] * 4,
        client=procs.address,
        envs_per_actor=envs_per_actor,
        timeout=60,
        env_process=True,
    )


@pytest.mark.timeout(180)
def test_crashed_env_process_is_rebuilt_and_its_worker_kept(procs: DaskProcesses) -> None:
    """SIGKILL of the process stepping one group (an env that crashed the interpreter)."""
    import signal

    env = env_process_vec(procs, envs_per_actor=2)
    try:
        worker_pids = set(group_pids(env))
        victim = env.groups[0]
        assert victim["env_pid"] not in worker_pids  # the envs step in a process of their own
        env.reset()
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(3):
            last = env.step(actions)[0]
        os.kill(victim["env_pid"], signal.SIGKILL)
        obs, _, dones, infos = env.step(actions)
        m = markers(infos)
        assert sorted(m) == sorted(victim["envs"])
        for i in victim["envs"]:
            assert m[i]["reason"] == "worker_lost" and dones[i] and infos[i]["TimeLimit.truncated"] is True
            np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i])
            assert obs[i][0] == 0.0  # a fresh episode
        for i in set(range(4)) - set(victim["envs"]):
            assert obs[i][0] == 4.0 and not dones[i]
        seen = Counter(m.keys())
        for _ in range(5):
            seen.update(markers(env.step(actions)[3]).keys())
        assert dict(seen) == dict.fromkeys(victim["envs"], 1)
        assert sorted(e["env"] for e in env.restart_log) == sorted(victim["envs"])
        assert_layout_intact(env)
        # no worker was lost: both worker processes still run and still hold envs
        assert {p.pid for p in live_workers(procs)} == worker_pids
        assert victim["env_pid"] not in {g["env_pid"] for g in env.groups}
    finally:
        env.close()


@pytest.mark.timeout(180)
def test_env_processes_end_with_their_worker_and_on_close(procs: DaskProcesses) -> None:
    env = env_process_vec(procs, envs_per_actor=1)
    try:
        env.reset()
        doomed_pid, doomed_envs = sorted(group_pids(env).items())[0]
        orphans = [g["env_pid"] for g in env.groups if g["envs"][0] in doomed_envs]
        assert len(orphans) == len(doomed_envs) >= 1
        procs.kill_worker(process_of(procs, doomed_pid))
        for pid in orphans:  # they see the pipe from their worker close, and exit
            wait_for_exit(pid, 30)
        env.step(np.zeros(4, dtype=np.int64))
        assert_layout_intact(env)
        survivors = [g["env_pid"] for g in env.groups]
    finally:
        env.close()
    for pid in survivors:
        wait_for_exit(pid, 15)


# --------------------------------------------------------------------------- soak
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_soak_workers_killed_and_replaced(procs: DaskProcesses) -> None:
    """At least 20 000 vec-steps and 3 kills, a worker holding envs SIGKILLed every few seconds."""
    ensure_workers(procs, 3)
    n_envs, n_steps, kill_every = 4, 20_000, 4.0
    # two groups of two on three workers: a kill moves a group to the spare worker or a survivor
    with DaskVecEnv(
        [cartpole] * n_envs, client=procs.address, envs_per_actor=2, timeout=60, step_timeout=30, worker_wait_timeout=60
    ) as env:
        env.seed(0)
        env.reset()
        rng = np.random.default_rng(0)
        seen: Counter[int] = Counter()
        expected: Counter[int] = Counter()
        kills = 0
        next_kill = time.monotonic() + kill_every
        step = 0
        # kills come by the clock and steps as fast as the machine goes: step on until both
        # counts are reached (the test's timeout bounds it)
        while step < n_steps or kills < 3:
            kill_now = time.monotonic() > next_kill
            if kill_now and step % 2 == 0:  # half the kills land between steps
                pid, indices = sorted(group_pids(env).items())[kills % len(group_pids(env))]
                procs.kill_worker(process_of(procs, pid))
                expected.update(indices)
            env.step_async(rng.integers(0, 2, n_envs))
            if kill_now and step % 2 == 1:  # the other half while a step is in flight
                pid, indices = sorted(group_pids(env).items())[kills % len(group_pids(env))]
                procs.kill_worker(process_of(procs, pid))
                expected.update(indices)
            obs, _, dones, infos = env.step_wait()
            assert obs.shape == (n_envs, 4) and np.isfinite(obs).all()
            for i, m in markers(infos).items():
                assert dones[i] and m["reason"] == "worker_lost"
                seen[i] += 1
            if kill_now:
                kills += 1
                procs.add_worker()  # a replacement joins while the envs are rebuilt elsewhere
                next_kill = time.monotonic() + kill_every
            step += 1
        for _ in range(5):  # a kill in the last steps is reported within a step or two
            _, _, _, infos = env.step(rng.integers(0, 2, n_envs))
            seen.update(markers(infos).keys())
        assert kills >= 3
        assert seen == expected
        assert Counter(e["env"] for e in env.restart_log) == expected
        assert env.restart_counts.tolist() == [expected[i] for i in range(n_envs)]
        assert_layout_intact(env)


@pytest.mark.timeout(120)
def test_close_while_a_frozen_step_is_in_flight(
    procs: DaskProcesses, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ensure_workers(procs, 2)
    fns = [functools.partial(FreezingEnv, str(tmp_path / "frozen")), functools.partial(CountingEnv, horizon=1000)]
    env = DaskVecEnv(fns, client=procs.address, envs_per_actor=1, step_timeout=2.0, timeout=60)
    frozen_pid = next(pid for pid, envs in group_pids(env).items() if 0 in envs)
    try:
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        env.step(np.zeros(2, dtype=np.int64))
        env.step_async(np.zeros(2, dtype=np.int64))  # env 0 freezes in this step
        env.close()  # drains for step_timeout, then abandons the frozen group instead of waiting on it
        assert env.closed and not env.groups
        # and says why it waits, naming the env (env 1 answered at once: not named)
        (said,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("close(): ")]
        assert "envs [0] have not finished the request in flight; waiting up to 1s more" in said, said
        assert (tmp_path / "frozen").exists()
        env.close()  # and a second close is a no-op
    finally:
        procs.kill_worker(process_of(procs, frozen_pid))


@pytest.mark.timeout(120)
def test_envs_leave_a_worker_before_its_lifetime_ends(procs: DaskProcesses) -> None:
    ensure_workers(procs, 1)
    leaving = procs.add_worker("--lifetime", "600s")  # due to leave within migrate_before
    procs.wait_for_workers(2)
    try:
        with DaskVecEnv(
            [functools.partial(CountingEnv, horizon=1000)] * 4, client=procs.address, timeout=60, migrate_before=900
        ) as env:
            on_leaving = sorted(group_pids(env).get(leaving.pid, []))
            assert on_leaving, "expected a group on the worker with a lifetime"
            env.reset()
            obs, rews, dones, infos = env.step(np.ones(4, dtype=np.int64))
            m = markers(infos)
            assert sorted(m) == on_leaving
            for i in on_leaving:
                assert m[i]["reason"] == "moved" and dones[i] and infos[i]["TimeLimit.truncated"] is True
                assert rews[i] == 1.0 and infos[i]["terminal_observation"][0] == 1.0 and obs[i][0] == 0.0
            assert leaving.pid not in group_pids(env)
            seen = Counter(m.keys())
            for _ in range(10):  # nothing moves back or twice
                _, _, _, infos = env.step(np.ones(4, dtype=np.int64))
                seen.update(markers(infos).keys())
            assert dict(seen) == dict.fromkeys(on_leaving, 1)
            assert_layout_intact(env)
    finally:
        procs.kill_worker(leaving)


# --------------------------------------------------------------------------- nothing left behind
class TrackedEnv(CountingEnv):
    """A CountingEnv that is open, on the disk, from its creation to its ``close()``.

    It holds a file ``<directory>/<pid>-<id>`` meanwhile: the test sees which process
    still holds open envs without asking that process (:func:`open_envs`).
    """

    def __init__(self, directory: str) -> None:
        super().__init__(horizon=1000)
        self.marker = Path(directory) / f"{os.getpid()}-{id(self)}"
        self.marker.touch()

    def close(self) -> None:
        self.marker.unlink(missing_ok=True)
        super().close()


def open_envs(directory: Path) -> dict[int, int]:
    """How many TrackedEnvs each live process holds open (a killed process holds none)."""
    held = Counter(int(p.name.split("-")[0]) for p in directory.iterdir())
    return {pid: n for pid, n in held.items() if not process_ended(pid)}


def freeze(pid: int) -> None:
    """SIGSTOP process ``pid`` and wait until it is stopped (the signal lands a little later)."""
    import signal

    import psutil

    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"process {pid} did not stop"
        time.sleep(0.01)


def wait_for_footprint(client: Any, probe: Any, expected: dict[str, Any], what: str, timeout: float = 30) -> None:
    """Poll the workers of ``expected`` until each one's footprint is back to its expected one."""
    deadline = time.monotonic() + timeout
    while True:
        now = client.run(probe, workers=list(expected))
        left = {w: {k: v for k, v in now[w].items() if v != expected[w][k]} for w in expected}
        if not any(left.values()):
            return
        assert time.monotonic() < deadline, f"{what}, {timeout:.0f}s later the workers still hold {left}"
        time.sleep(0.5)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("env_process", [False, True], ids=["in_worker", "env_process"])
def test_group_abandoned_on_a_frozen_worker_is_released_when_it_resumes(
    dask_processes: Any, tmp_path: Path, env_process: bool
) -> None:
    """A worker frozen (SIGSTOP) past step_timeout, then resumed: its abandoned group leaves nothing there.

    The client gives the group up without asking it anything (it may be stuck) and
    rebuilds its envs on the other worker. Once its worker runs again, the group's
    threads, sockets, envs and env process go, and ``close()`` leaves nothing anywhere.
    """
    import signal

    from distributed import Client

    procs = dask_processes(2)
    envs_dir = tmp_path / "envs"
    envs_dir.mkdir()
    with Client(procs.address, set_as_default=False, timeout=60) as client:
        probe = footprint_probe(dask_ports(client))
        baseline = client.run(probe)
        env = DaskVecEnv(
            [functools.partial(TrackedEnv, str(envs_dir))] * 4,
            client=procs.address,
            envs_per_actor=2,
            step_timeout=3.0,
            timeout=60,
            on_worker_lost="restart",
            env_process=env_process,
        )
        try:
            (frozen,) = [g for g in env.groups if 0 in g["envs"]]
            assert len({g["worker"] for g in env.groups}) == 2
            assert open_envs(envs_dir)[frozen["env_pid"]] == 2
            env.reset()
            actions = np.zeros(4, dtype=np.int64)
            env.step(actions)
            # the whole node freezes (a stalled VM): the worker and, if any, the group's env process
            stopped = sorted({frozen["pid"], frozen["env_pid"]})
            try:
                for pid in stopped:
                    freeze(pid)
                _, _, dones, infos = env.step(actions)  # the frozen group times out; rebuilt on the other worker
            finally:
                for pid in stopped:
                    os.kill(pid, signal.SIGCONT)
            m = markers(infos)
            assert sorted(m) == frozen["envs"] and all(m[i]["reason"] == "timeout" and dones[i] for i in m)
            assert frozen["worker"] not in {g["worker"] for g in env.groups}
            wait_for_footprint(
                client, probe, {frozen["worker"]: baseline[frozen["worker"]]}, "the frozen worker resumed"
            )
            assert frozen["env_pid"] not in open_envs(envs_dir), "the abandoned group's envs are still open"
            env.step(actions)  # the env steps on, with its envs on the other worker
            assert_layout_intact(env)
        finally:
            env.close()
        wait_for_footprint(client, probe, baseline, "after close()")
        assert open_envs(envs_dir) == {}, "envs left open after close()"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("env_process", [False, True], ids=["in_worker", "env_process"])
def test_close_leaves_nothing_on_the_workers(dask_processes: Any, tmp_path: Path, env_process: bool) -> None:
    """After ``close()`` of a healthy env, no daskvec thread, socket, env or env process is left on any worker."""
    from distributed import Client

    procs = dask_processes(2)
    envs_dir = tmp_path / "envs"
    envs_dir.mkdir()
    with Client(procs.address, set_as_default=False, timeout=60) as client:
        probe = footprint_probe(dask_ports(client))
        baseline = client.run(probe)
        with DaskVecEnv(
            [functools.partial(TrackedEnv, str(envs_dir))] * 4,
            client=procs.address,
            timeout=60,
            env_process=env_process,
        ) as env:
            env.reset()
            for _ in range(3):
                env.step(np.zeros(4, dtype=np.int64))
            during = client.run(probe)
            assert all(during[w]["threads"] != baseline[w]["threads"] for w in baseline)  # the probe sees them
        wait_for_footprint(client, probe, baseline, "after close()")
        assert open_envs(envs_dir) == {}, "envs left open after close()"


class _TrainingFails(Exception):
    pass


def _fail_training(*args: Any, **kwargs: Any) -> None:
    raise _TrainingFails("the learner failed with a collection in flight")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("learner", ["ppo", "dqn"])
def test_close_in_the_middle_of_a_collection_ahead_is_prompt_and_leaves_nothing(
    dask_processes: Any, learner: str
) -> None:
    """``train()`` fails while the next collection runs ahead (64 steps of 0.1 s on each worker): ``close()``
    does not wait for it (it returns in under half of it), and no daskvec thread or socket is left on the
    workers once it ends."""
    from distributed import Client

    from benchmarks.witness import WitnessEnv
    from daskvec.sb3 import DaskDQN, DaskPPO

    procs = dask_processes(2)
    with Client(procs.address, set_as_default=False, timeout=60) as client:
        probe = footprint_probe(dask_ports(client))
        baseline = client.run(probe)
        env = DaskVecEnv([functools.partial(WitnessEnv, i, None, 0.1) for i in range(4)], client=procs.address)
        try:
            if learner == "ppo":
                model: Any = DaskPPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, collect_ahead=1)
            else:
                model = DaskDQN("MlpPolicy", env, train_freq=(64, "step"), learning_starts=0, collect_ahead=1)
            model.train = _fail_training
            with pytest.raises(_TrainingFails):
                model.learn(64 * 4 * 3)
            assert model._daskvec_ahead is not None, "nothing was in flight: the test proves nothing"
        finally:
            started = time.monotonic()
            env.close()
            took = time.monotonic() - started
        assert took < 3.2, f"close() took {took:.1f}s with a collection of 6.4s in flight"
        wait_for_footprint(client, probe, baseline, "after close() in the middle of a collection")


class BumpEnv(CountingEnv):
    """``bump()`` counts its calls (a method with a side effect); env 4's ``bump`` and ``reset`` are slow."""

    def __init__(self, slow: bool = False) -> None:
        super().__init__(horizon=1000)
        self.bumps, self.resets, self.slow = 0, 0, slow

    def bump(self) -> int:
        self.bumps += 1
        if self.slow:
            time.sleep(3)
        return self.bumps

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.resets += 1
        if self.slow:
            time.sleep(3)
        return super().reset(seed=seed, options=options)


@pytest.mark.timeout(240)
def test_a_worker_lost_during_a_call_or_a_reset_leaves_the_other_envs_done_once(dask_processes: Any) -> None:
    """The call (or reset) goes again only to the rebuilt envs: a method with side effects runs once on
    every env, each env is reset once, and the rebuilt envs' reset infos keep their marker."""
    import signal
    import threading

    procs = dask_processes(4)  # 3 groups, and an idle worker for envs 4 and 5 to be rebuilt on alone
    fns = [functools.partial(BumpEnv, slow=(i == 4)) for i in range(6)]
    env = DaskVecEnv(fns, client=procs.address, envs_per_actor=2, timeout=60)
    try:
        env.reset()
        (victim,) = [g for g in env.groups if 4 in g["envs"]]
        threading.Timer(1.0, os.kill, (victim["pid"], signal.SIGKILL)).start()
        assert env.env_method("bump") == [1] * 6  # env 4 and 5: rebuilt, then bumped once
        assert env.get_attr("bumps") == [1] * 6
        assert env.restart_counts.tolist() == [0, 0, 0, 0, 1, 1]

        (victim,) = [g for g in env.groups if 4 in g["envs"]]
        rebuilt = sorted(i for g in env.groups if g["worker"] == victim["worker"] for i in g["envs"])
        assert rebuilt == [4, 5]
        before = env.get_attr("resets")
        threading.Timer(1.0, os.kill, (victim["pid"], signal.SIGKILL)).start()
        env.seed(42)
        env.reset()
        after = env.get_attr("resets")
        for i in range(6):  # a rebuilt env: its restart reset, then the user's seeded one
            assert after[i] == (2 if i in rebuilt else before[i] + 1), (i, before, after, rebuilt)
        assert sorted(i for i, info in enumerate(env.reset_infos) if INFO_KEY in info) == rebuilt
        assert [s[-1] for s in env.get_attr("reset_seeds")] == [42 + i for i in range(6)]
    finally:
        env.close()


def learn_through_a_fault(env: DaskVecEnv, fault: Callable[[Any], None]) -> Any:
    """DaskPPO on ``env`` for 3 rollouts of 512 steps, calling ``fault(training_env)`` as the second starts.

    Returns the callback: ``collected``, the seconds from the fault until that rollout was in
    (its steps are then replayed), and ``markers``, the restart markers seen, by env.
    """
    from stable_baselines3.common.callbacks import BaseCallback

    from daskvec.sb3 import DaskPPO

    class FaultOnSecondRollout(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.rollouts = 0
            self.started = 0.0
            self.collected: float | None = None
            self.markers: dict[int, dict[str, Any]] = {}

        def _on_rollout_start(self) -> None:
            self.rollouts += 1
            if self.rollouts == 2:
                fault(self.training_env)
                self.started = time.monotonic()

        def _on_step(self) -> bool:
            if self.rollouts == 2 and self.collected is None:  # the rollout is in: its steps are replayed
                self.collected = time.monotonic() - self.started
            self.markers.update(markers(self.locals["infos"]))
            return True

    callback = FaultOnSecondRollout()
    model = DaskPPO("MlpPolicy", env, n_steps=512, batch_size=512, n_epochs=1, device="cpu", seed=0)
    model.learn(total_timesteps=512 * 4 * 3, callback=callback)
    return callback


@pytest.mark.timeout(300)
def test_an_env_hung_in_a_live_worker_during_a_worker_side_rollout_costs_about_step_timeout(
    dask_processes: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An env that hangs inside ``step`` while its worker lives on (heartbeats and all) stalled a
    rollout for ``step_timeout * n_steps`` (here 2 s x 512: 17 min; 34 hours with the defaults).
    Its group now says, from the actor's thread, how long its envs have been in one step: after
    about ``step_timeout`` the rollout gives up on that fragment, and its envs are rebuilt and
    reported as timeouts while the other worker's fragment is kept."""
    procs = dask_processes(2)
    flag = str(tmp_path / "hung")
    fns = [functools.partial(FreezingEnv, flag, freeze_at=10**9)] * 2 + [functools.partial(CountingEnv, 1000)] * 2
    env = DaskVecEnv(fns, client=procs.address, envs_per_actor=2, step_timeout=2.0, timeout=60)
    assert len({g["worker"] for g in env.groups}) == 2

    def hang_env_0(training_env: Any) -> None:  # its third step from here hangs (its rebuilt self sees the flag)
        (done,) = training_env.get_attr("total_steps", indices=[0])
        training_env.set_attr("freeze_at", done + 3, indices=[0])

    try:
        callback = learn_through_a_fault(env, hang_env_0)
    finally:
        env.close()
    assert callback.collected is not None and callback.collected < 30, (
        f"the rollout with a hung env took {callback.collected}s (step_timeout 2 s)"
    )
    assert sorted(callback.markers) == [0, 1], callback.markers  # env 0's group: rebuilt
    assert all(m["reason"] == "timeout" for m in callback.markers.values())
    assert any("have been in one step for 2s or more" in r.getMessage() for r in caplog.records)


@pytest.mark.timeout(300)
def test_a_worker_frozen_during_a_worker_side_rollout_costs_about_step_timeout(
    dask_processes: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """DaskPPO waits ``step_timeout * n_steps`` for a rollout (a healthy one may take that long);
    a worker frozen (SIGSTOP) in it stalled training that long (here 2 s x 512: 17 min, and
    34 hours with the defaults). Its missing heartbeats now end the wait after about
    ``step_timeout``; its envs are rebuilt and reported as timeouts."""
    import signal
    import threading

    procs = dask_processes(2)
    env = DaskVecEnv([cartpole] * 4, client=procs.address, envs_per_actor=2, step_timeout=2.0, timeout=60)
    (frozen,) = [g for g in env.groups if 0 in g["envs"]]
    assert len({g["worker"] for g in env.groups}) == 2

    guard = threading.Timer(120, os.kill, (frozen["pid"], signal.SIGCONT))  # a test, not a hang, if it waits on
    guard.start()
    try:
        callback = learn_through_a_fault(env, lambda training_env: freeze(frozen["pid"]))
    finally:
        guard.cancel()
        os.kill(frozen["pid"], signal.SIGCONT)
        env.close()
    assert callback.collected is not None and callback.collected < 30, (
        f"the rollout with a frozen worker took {callback.collected}s (step_timeout 2 s)"
    )
    assert sorted(callback.markers) == frozen["envs"]
    assert all(m["reason"] == "timeout" for m in callback.markers.values())
    # the log gives the time the rollout waited for them (it gave step_timeout, or the channel's last wait)
    (line,) = [r.getMessage() for r in caplog.records if "rebuilding them" in r.getMessage()]
    waited = float(re.search(r"did not answer within ([\d.]+)s", line).group(1))  # type: ignore[union-attr]
    assert 2.0 < waited <= callback.collected + 1, line
