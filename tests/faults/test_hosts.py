"""daskvec across machines, on emulated hosts (``tests/hosts.py``).

Each worker runs in a network and UTS namespace of its own (its own address and host
name), the scheduler on a bridge, the client here. Checked: the direct channel goes over
TCP between hosts and gives DummyVecEnv's results; a host's worker killed during PPO
training; a partitioned host under ``step_timeout``; a healed partition and a new host
used by ``rebalance()``; a TLS cluster across hosts (the encrypted direct channel); stepping through a relay that adds
a 10 ms round trip. Correctness only: speed is the benchmark's job.

Needs root, ``ip``, ``unshare`` and ``iptables``; skipped (with the reason) without them.
"""

from __future__ import annotations

import itertools
import os
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv, assert_same
from hosts import EmulatedHosts, Host, emulated_fixture, measure_relay_cost, recv_exactly, recv_line  # noqa: F401
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from daskvec import DaskVecEnv
from daskvec.transport import machine_id
from daskvec.worker import INFO_KEY, restart_seed

pytestmark = pytest.mark.hosts


# --------------------------------------------------------------------------- helpers
def cartpole() -> gym.Env[Any, Any]:
    return gym.make("CartPole-v1")


def counting() -> gym.Env[Any, Any]:
    return CountingEnv(horizon=1000)


def markers(infos: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The daskvec restart markers in one step's infos, by env index."""
    return {i: info[INFO_KEY] for i, info in enumerate(infos) if INFO_KEY in info}


def run(venv: VecEnv, steps: int, seed: int = 5) -> list[Any]:
    """Seed, reset and step ``venv`` with fixed random actions; every output, infos included."""
    venv.seed(seed)
    out: list[Any] = [venv.reset(), [dict(i) for i in venv.reset_infos]]
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        obs, rews, dones, infos = venv.step(rng.integers(0, 2, size=venv.num_envs))
        out.append((obs, rews, dones, list(infos), [dict(i) for i in venv.reset_infos]))
    return out


def assert_same_as_dummy(env: DaskVecEnv, steps: int) -> None:
    """``env`` (CartPole) gives exactly DummyVecEnv's outputs for the same seeds and actions."""
    ref = DummyVecEnv([cartpole] * env.num_envs)
    try:
        got, want = run(env, steps), run(ref, steps)
    finally:
        ref.close()
    assert_same(got, want, "DaskVecEnv across hosts vs DummyVecEnv")
    # the run went through episode ends and auto-resets
    assert any("terminal_observation" in i for step in got[2:] for i in step[3])


def host_of_env(hosts: EmulatedHosts, env: DaskVecEnv, i: int) -> Host:
    (worker,) = [g["worker"] for g in env.groups if i in g["envs"]]
    return hosts.host_of(worker)


def envs_by_host(hosts: EmulatedHosts, env: DaskVecEnv) -> dict[str, list[int]]:
    """Host name -> the env indices its worker holds."""
    out: dict[str, list[int]] = {}
    for g in env.groups:
        out.setdefault(hosts.host_of(g["worker"]).name, []).extend(g["envs"])
    return {k: sorted(v) for k, v in out.items()}


def assert_layout_intact(env: DaskVecEnv) -> None:
    """Every env index is held by exactly one group."""
    held = Counter(i for g in env.groups for i in g["envs"])
    assert sorted(held) == list(range(env.num_envs)), f"envs lost: {sorted(set(range(env.num_envs)) - set(held))}"
    assert all(c == 1 for c in held.values()), f"envs duplicated: {held}"


def assert_direct_tcp_to_hosts(hosts: EmulatedHosts, env: DaskVecEnv) -> None:
    """Every group is on an emulated host, seen as another machine, over a direct TCP channel."""
    for g, group in zip(env.groups, env._groups, strict=True):
        host = hosts.host_of(g["worker"])
        assert group.desc.machine.startswith(f"{host.name}/"), "the worker does not run under its host's name"
        assert group.desc.machine != machine_id()
        assert (g["transport"], g["socket"]) == ("direct", "tcp"), f"group {g['envs']}: {g['transport']}/{g['socket']}"


# --------------------------------------------------------------------------- CPUs of their own
def test_hosts_cpus_keep_every_process_started_to_those_cpus(tmp_path: Any) -> None:
    """``cpus=``: a process the hosts start (a worker, a relay, the scheduler alike) runs on those CPUs only."""
    have = sorted(os.sched_getaffinity(0))
    if len(have) < 2:
        pytest.skip(f"one CPU here ({have}): pinning to it changes nothing a test could see")
    hosts = EmulatedHosts(1, cpus=str(have[-1]), dask=False, workdir=tmp_path)
    try:
        cmd = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
        proc = hosts._popen(cmd, stdout=subprocess.PIPE, text=True)
        out, _ = proc.communicate(timeout=60)
    finally:
        hosts.close()
    assert out.strip() == str([have[-1]])


@pytest.mark.parametrize(("cpus", "match"), [("one", "as taskset -c takes them"), ("4096", "may run on CPUs")])
def test_hosts_cpus_that_are_not_this_machines_say_so(cpus: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        EmulatedHosts(1, cpus=cpus, dask=False)


# --------------------------------------------------------------------------- the fixture's relay
@pytest.mark.timeout(90)
def test_relay_is_transparent_and_keeps_order(emulated: Any) -> None:
    """2 MB echoed in uneven chunks arrive intact and in order, through the relay and without it."""
    hosts = emulated(0, dask=False)
    direct = hosts.add_host(relay=False)
    relayed = hosts.add_host(2.0)
    assert (direct.rtt_ms, relayed.rtt_ms) == (None, 2.0)
    rng = np.random.default_rng(0)
    payload = rng.bytes(2_000_000)
    cuts = [0, *sorted(rng.choice(len(payload), 300, replace=False).tolist()), len(payload)]
    for host, peer in ((direct, hosts.gateway), (relayed, relayed.address)):
        _, port = hosts.start_echo(host)
        with socket.create_connection((host.address, port), timeout=30) as sock:
            # the echo server sees the relay (the host's own address) as its peer, or us
            assert recv_line(sock) == peer
            pieces = [payload[a:b] for a, b in itertools.pairwise(cuts)]
            sender = threading.Thread(target=lambda s=sock, p=pieces: [s.sendall(x) for x in p])
            sender.start()
            got = recv_exactly(sock, len(payload))
            sender.join()
            assert got == payload
            sock.shutdown(socket.SHUT_WR)  # a half-close travels through the relay and back
            assert sock.recv(1) == b""
        if host is relayed:
            assert relayed.relayed() == [(relayed.address, port)]
    assert direct.relayed() == []
    # what a benchmark reports beside its latency figures (values not checked: no timing here)
    cost = measure_relay_cost(rounds=50)
    assert set(cost) == {"direct_us", "relayed_us", "added_us", "cost_us"}


# --------------------------------------------------------------------------- daskvec across hosts
@pytest.mark.timeout(120)
def test_direct_channel_is_tcp_between_hosts_and_matches_dummy(emulated: Any) -> None:
    hosts = emulated(2)
    with hosts.client() as client, DaskVecEnv([cartpole] * 4, client=client, timeout=60) as env:
        assert_direct_tcp_to_hosts(hosts, env)
        assert sorted(envs_by_host(hosts, env).values()) == [[0, 1], [2, 3]]  # one group on each host
        assert env.transport_summary() == "direct/tcp x2"
        assert_same_as_dummy(env, steps=120)


@pytest.mark.timeout(180)
def test_sigkill_of_a_hosts_worker_during_ppo_learn(emulated: Any) -> None:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    hosts = emulated(2)

    class KillAndCount(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.seen: Counter[int] = Counter()
            self.killed: list[int] = []
            self.survivor: Host | None = None
            self.marker_steps: list[int] = []

        def _on_step(self) -> bool:
            infos, dones = self.locals["infos"], self.locals["dones"]
            for i, m in markers(infos).items():
                self.seen[i] += 1
                self.marker_steps.append(self.num_timesteps)
                assert dones[i], "a rebuilt env must report done"
                assert infos[i]["TimeLimit.truncated"] is True
                assert infos[i]["terminal_observation"].shape == (4,)
                assert m["reason"] == "worker_lost" and m["restarted"] is True
                assert m["seed"] == restart_seed(i, 1, i)  # PPO(seed=0) seeded env i with 0 + i
            if not self.killed and self.num_timesteps >= 4 * 100:
                victim = host_of_env(hosts, env, 0)
                self.killed = envs_by_host(hosts, env)[victim.name]
                (self.survivor,) = [h for h in hosts.hosts if h is not victim]
                hosts.kill_worker(victim)
            return True

    cb = KillAndCount()
    with hosts.client() as client, DaskVecEnv([cartpole] * 4, client=client, timeout=60, worker_wait_timeout=60) as env:
        assert_direct_tcp_to_hosts(hosts, env)
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, device="cpu", seed=0)
        model.learn(4 * 64 * 3, callback=cb)

        assert cb.killed == [0, 1], "the worker was never killed"
        assert model.num_timesteps == 4 * 64 * 3
        # each env of the lost host reported one truncation, in one vec step, and no other env did
        assert dict(cb.seen) == dict.fromkeys(cb.killed, 1)
        assert len(set(cb.marker_steps)) == 1
        assert sorted((e["env"], e["reason"]) for e in env.restart_log) == [(0, "worker_lost"), (1, "worker_lost")]
        assert env.restart_counts.tolist() == [1, 1, 0, 0]
        # the lost envs were rebuilt on the other host, still over TCP
        assert cb.survivor is not None
        assert envs_by_host(hosts, env) == {cb.survivor.name: [0, 1, 2, 3]}
        assert_layout_intact(env)
        assert_direct_tcp_to_hosts(hosts, env)


def partition_and_step(hosts: EmulatedHosts, env: DaskVecEnv, steps_before: int) -> tuple[Host, list[int]]:
    """Partition the host of env 0 after ``steps_before`` steps; check its envs time out and move.

    CountingEnvs stepped with action 1: observation[0] counts steps, the reward is 1.
    Returns the partitioned host and the envs it held.
    """
    n = env.num_envs
    actions = np.ones(n, dtype=np.int64)
    env.reset()
    for _ in range(steps_before):
        last = env.step(actions)[0]
    victim = host_of_env(hosts, env, 0)
    lost = envs_by_host(hosts, env)[victim.name]
    (survivor,) = [h for h in hosts.hosts if h is not victim]
    hosts.partition(victim)
    obs, rews, dones, infos = env.step(actions)
    m = markers(infos)
    assert sorted(m) == lost, f"expected truncations for the partitioned host's envs {lost}, got {sorted(m)}"
    for i in lost:
        assert m[i]["reason"] == "timeout", m[i]
        assert dones[i] and infos[i]["TimeLimit.truncated"] is True
        np.testing.assert_array_equal(infos[i]["terminal_observation"], last[i])
        assert rews[i] == 0.0  # the step the partition swallowed never happened
        assert obs[i][0] == 0.0  # a new episode
    for i in set(range(n)) - set(lost):
        assert obs[i][0] == steps_before + 1 and not dones[i] and rews[i] == 1.0
    assert envs_by_host(hosts, env) == {survivor.name: list(range(n))}
    assert_layout_intact(env)
    # the run goes on, with no further truncation
    for _ in range(5):
        obs, rews, dones, infos = env.step(actions)
        assert not markers(infos) and not dones.any()
        assert rews.tolist() == [1.0] * n
    assert [obs[i][0] for i in range(n)] == [5.0 if i in lost else steps_before + 6.0 for i in range(n)]
    assert sorted(e["env"] for e in env.restart_log) == lost
    return victim, lost


@pytest.mark.timeout(180)
def test_partitioned_host_times_out_and_its_envs_are_rebuilt_elsewhere(emulated: Any) -> None:
    hosts = emulated(2)
    with (
        hosts.client() as client,
        DaskVecEnv(
            [counting] * 4, client=client, envs_per_actor=2, step_timeout=3.0, timeout=30, worker_wait_timeout=30
        ) as env,
    ):
        assert_direct_tcp_to_hosts(hosts, env)
        partition_and_step(hosts, env, steps_before=3)
        assert_direct_tcp_to_hosts(hosts, env)


@pytest.mark.timeout(300)
def test_healed_partition_and_a_new_host_then_rebalance_uses_it(emulated: Any) -> None:
    hosts = emulated(2)
    with (
        hosts.client() as client,
        DaskVecEnv(
            [counting] * 4, client=client, envs_per_actor=1, step_timeout=3.0, timeout=30, worker_wait_timeout=30
        ) as env,
    ):
        victim, _ = partition_and_step(hosts, env, steps_before=2)
        hosts.heal(victim)
        new = hosts.add_host()
        healed = hosts.worker_address(victim)  # the healed worker is still there
        # and the group abandoned on it, once reachable again, is released
        deadline = time.monotonic() + 60
        # (a lambda travels by value: the workers cannot import this module)
        while client.run(lambda dask_worker: len(dask_worker.state.actors), workers=[healed])[healed]:
            assert time.monotonic() < deadline, "the healed host still holds the abandoned env group"
            time.sleep(0.2)
        before = {g["envs"][0]: g["worker"] for g in env.groups}
        actions = np.ones(4, dtype=np.int64)
        obs_before = env.step(actions)[0]
        # 4 envs on the surviving host; the healed one left a step unanswered: the new host takes 2
        assert env.rebalance() == 2
        obs, rews, dones, infos = env.step(actions)
        m = markers(infos)
        assert len(m) == 2
        new_worker = hosts.worker_address(new)
        for i, mk in m.items():
            assert mk["reason"] == "moved" and mk["from_worker"] == before[i] and mk["worker"] == new_worker
            assert dones[i] and infos[i]["TimeLimit.truncated"] is True
            assert infos[i]["terminal_observation"][0] == obs_before[i][0] + 1  # its step happened, then it moved
            assert rews[i] == 1.0 and obs[i][0] == 0.0
        by_host = envs_by_host(hosts, env)
        assert sorted(by_host) == sorted({host_of_env(hosts, env, i).name for i in range(4)})
        assert by_host[new.name] == sorted(m)
        assert victim.name not in by_host
        assert sorted(len(v) for v in by_host.values()) == [2, 2]
        assert_layout_intact(env)
        assert_direct_tcp_to_hosts(hosts, env)
        # The healed host leaves quarantine once it has answered probes sent as the run
        # steps (docs/fault-tolerance.md); then one rebalance gives it envs again. Until then
        # nothing moves; each env that moves is reported once, with its step done.
        deadline = time.monotonic() + 120
        moved_back: list[int] = []
        while not moved_back or sorted(moved_back) != envs_by_host(hosts, env).get(victim.name):
            assert time.monotonic() < deadline, f"the healed host never took envs again ({moved_back} moved back)"
            obs_before = obs
            obs, rews, dones, infos = env.step(actions)
            m = markers(infos)
            for i in range(4):
                if i in m:
                    assert m[i]["reason"] == "moved" and m[i]["worker"] == healed, m[i]
                    assert dones[i] and infos[i]["terminal_observation"][0] == obs_before[i][0] + 1
                    assert obs[i][0] == 0.0
                    moved_back.append(i)
                else:
                    assert not dones[i] and obs[i][0] == obs_before[i][0] + 1
                assert rews[i] == 1.0
            time.sleep(0.2)
        assert sorted(len(v) for v in envs_by_host(hosts, env).values()) == [1, 1, 2]
        assert_layout_intact(env)
        assert env.rebalance() == 0


@pytest.mark.timeout(180)
def test_tls_cluster_across_hosts(emulated: Any) -> None:
    hosts = emulated(2, tls=True)
    assert hosts.address.startswith("tls://")
    with hosts.client() as client, DaskVecEnv([cartpole] * 4, client=client, timeout=60) as env:
        # on TLS the direct channel to each host is TLS too, with the cluster's certificates
        assert env.encrypted
        assert {(g["transport"], g["socket"]) for g in env.groups} == {("direct", "tls")}
        assert all(g["worker"].startswith("tls://") for g in env.groups)
        assert sorted(envs_by_host(hosts, env).values()) == [[0, 1], [2, 3]]
        for group in env._groups:
            assert group.desc.machine != machine_id()
        assert_same_as_dummy(env, steps=60)


@pytest.mark.timeout(180)
def test_stepping_through_a_10ms_relay_matches_dummy(emulated: Any) -> None:
    hosts = emulated(2, rtt_ms=10.0)
    assert [h.rtt_ms for h in hosts.hosts] == [10.0, 10.0]
    with hosts.client() as client, DaskVecEnv([cartpole] * 4, client=client, timeout=60) as env:
        assert_direct_tcp_to_hosts(hosts, env)
        assert_same_as_dummy(env, steps=80)
        # the steps did travel through each host's relay: it carried every group's direct channel
        for group in env._groups:
            host = hosts.host_of(group.worker)
            assert (host.address, group.desc.address[1]) in host.relayed()


# --------------------------------------------------------------------------- vector groups across hosts
def envpool_maker(task: str, n: int, seed: int) -> Any:
    def make() -> Any:
        import envpool

        # episodes of 60 steps: the run goes through truncations and SB3's auto-reset
        return envpool.make_gymnasium(task, num_envs=n, seed=seed, num_threads=1, max_episode_steps=60)

    return make


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("task", "n"), [("Pong-v5", 4), ("HalfCheetah-v5", 8)], ids=["pong-v5", "halfcheetah-v5"])
def test_envpool_groups_across_hosts_match_envpool_alone(emulated: Any, task: str, n: int) -> None:
    """``from_vector_envs`` over 2 EnvPool groups on 2 hosts, the same code as on one machine: each
    group's rows equal EnvPool stepped alone here (SB3's auto-reset in the same step), over direct TCP."""
    pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool)")
    hosts = emulated(2)
    seeds = (0, 1000)
    with hosts.client() as client:
        env = DaskVecEnv.from_vector_envs([envpool_maker(task, n, s) for s in seeds], client=client, timeout=60)
        refs = [envpool_maker(task, n, s)() for s in seeds]
        try:
            assert_direct_tcp_to_hosts(hosts, env)
            assert len({hosts.host_of(g["worker"]).name for g in env.groups}) == 2  # one EnvPool on each host
            obs = env.reset()
            for k, ref in enumerate(refs):
                np.testing.assert_array_equal(obs[k * n : (k + 1) * n], ref.reset()[0])
            rng = np.random.default_rng(3)
            space = refs[0].action_space
            resets = 0
            for t in range(150):
                if isinstance(space, gym.spaces.Discrete):
                    actions = rng.integers(0, int(space.n), size=2 * n)
                else:
                    actions = rng.uniform(-1, 1, size=(2 * n, *space.shape)).astype(space.dtype)
                obs, rewards, dones, infos = env.step(actions)
                for k, ref in enumerate(refs):
                    rows = slice(k * n, (k + 1) * n)
                    want, rew, term, trunc, _ = ref.step(actions[rows])
                    np.testing.assert_array_equal(dones[rows], term | trunc, err_msg=f"step {t}")
                    np.testing.assert_allclose(rewards[rows], rew, err_msg=f"step {t}")
                    ended = np.flatnonzero(term | trunc)
                    for i in ended:
                        np.testing.assert_array_equal(infos[k * n + i]["terminal_observation"], want[i])
                    if len(ended):
                        want[ended] = ref.reset(ended.astype(np.int32))[0]
                        resets += len(ended)
                    np.testing.assert_array_equal(obs[rows], want, err_msg=f"step {t}")
            assert resets >= 2 * n  # every env's episode ended at least once
            assert "elapsed_step" in infos[0] and "env_id" not in infos[0]
        finally:
            env.close()
            for ref in refs:
                ref.close()
