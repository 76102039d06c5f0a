"""The Gymnasium face: DaskVectorEnv against SyncVectorEnv, wrappers, partial batches.

Every comparison runs the same seeded envs and actions through ``SyncVectorEnv`` and
``DaskVectorEnv`` and demands identical observations, rewards, terminations,
truncations and infos (values, dtypes and ``_key`` masks), in each autoreset mode.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import CountingEnv, SpaceEnv
from gym_helpers import assert_identical, run_both
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from wire_frames import check_channel

from daskvec.errors import AlreadySteppingError
from daskvec.gymnasium.vector_env import DaskVectorEnv, make_vec
from daskvec.protocol.messages import restart_seed

KINDS = ["box", "discrete", "multidiscrete", "multibinary", "dict", "tuple"]
MODES = [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED]


def space_fns(kind: str, n: int) -> list[Callable[[], gym.Env[Any, Any]]]:
    """Envs of one space whose episodes end at different steps, by termination and by truncation."""
    return [functools.partial(SpaceEnv, kind, horizon=4 + i % 3, terminate_at=3 if i % 2 else None) for i in range(n)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m.value)
@pytest.mark.parametrize("kind", KINDS)
def test_same_results_as_sync_vector_env(client2: Any, kind: str, mode: AutoresetMode) -> None:
    fns = space_fns(kind, 4)
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    with contextlib.closing(DaskVectorEnv(fns, client2, autoreset_mode=mode, envs_per_actor=2)) as dask:
        assert dask.single_observation_space == sync.single_observation_space
        assert dask.observation_space == sync.observation_space
        assert dask.action_space == sync.action_space
        assert dask.metadata["autoreset_mode"] is mode
        assert len(dask.groups) == 2
        ended = run_both(sync, dask, 9, mode, seed=7)
        assert ended >= 6  # episodes ended, by termination and truncation, in the compared steps
    sync.close()


@pytest.mark.timeout(120)
def test_attributes_calls_and_render(client2: Any) -> None:
    fns = [functools.partial(SpaceEnv, "box", render_mode="rgb_array") for _ in range(3)]
    sync = SyncVectorEnv(fns)
    with contextlib.closing(DaskVectorEnv(fns, client2)) as dask:
        dask.reset(seed=3), sync.reset(seed=3)
        assert dask.render_mode == "rgb_array" and dask.metadata["render_modes"] == ["rgb_array"]
        assert_identical(dask.call("scaled", 2.0, scale=3.0), sync.call("scaled", 2.0, scale=3.0))
        assert dask.get_attr("horizon") == sync.get_attr("horizon") == (5, 5, 5)
        dask.set_attr("horizon", [2, 3, 4])
        sync.set_attr("horizon", [2, 3, 4])
        dask.set_attr("terminate_at", 9)
        sync.set_attr("terminate_at", 9)
        assert dask.get_attr("horizon") == (2, 3, 4) and dask.get_attr("terminate_at") == (9, 9, 9)
        assert_identical(dask.render(), sync.render())
        with pytest.raises(ValueError, match="length equal to the number of environments"):
            dask.set_attr("horizon", [1, 2])
        run_both(sync, dask, 5, AutoresetMode.NEXT_STEP, seed=5)
    sync.close()


@pytest.mark.parametrize("transport", ["direct", "actor"])
def test_groups_name_their_channels(client2: Any, transport: str) -> None:
    fns = [functools.partial(SpaceEnv, "box") for _ in range(4)]
    with contextlib.closing(DaskVectorEnv(fns, client2, transport=transport)) as dask:
        groups = dask.groups
        assert groups and {g["transport"] for g in groups} == {"direct/unix" if transport == "direct" else "actor"}
        for g in groups:
            check_channel(g)
            assert not g["encrypted"]
            if transport == "direct":
                assert g["channel"] == g["socket_path"] and g["address"] is not None, g


@pytest.mark.timeout(120)
def test_make_vec_like_gymnasium(client2: Any) -> None:
    with contextlib.closing(
        make_vec("CartPole-v1", num_envs=4, client=client2, vector_kwargs={"envs_per_actor": 2})
    ) as dask:
        sync = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync")
        assert dask.spec is not None and dask.spec.id == "CartPole-v1" and dask.spec.kwargs["num_envs"] == 4
        assert dask.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        assert dask.render_mode is None
        run_both(sync, dask, 30, AutoresetMode.NEXT_STEP, seed=11)
        sync.close()
        with pytest.raises(ValueError, match="got a single action, not a batch of actions for 4 envs"):
            dask.step(1)  # before: "TypeError: len() of unsized object"
        assert dask.step(np.zeros(4, dtype=np.int64))[0].shape == (4, 4)  # refused before anything was sent
    with pytest.raises(ValueError, match="autoreset_mode must be"):
        DaskVectorEnv(space_fns("box", 2), client2, autoreset_mode="sometimes")
    with pytest.raises(ValueError, match="batch_size must be an int from 1 to num_envs=2"):
        DaskVectorEnv(space_fns("box", 2), client2, batch_size=3)
    # gymnasium.make_vec's own choice, copied over: refused at once, not by the env's constructor on a worker
    with pytest.raises(TypeError, match="drop vectorization_mode"):
        make_vec("CartPole-v1", num_envs=2, client=client2, vectorization_mode="async")


@pytest.mark.timeout(120)
def test_gymnasium_vector_wrappers(client2: Any) -> None:
    """RecordEpisodeStatistics, NormalizeObservation and ClipAction give what they give on SyncVectorEnv."""
    from gymnasium.wrappers import vector as vw

    def wrap(env: Any) -> Any:
        return vw.RecordEpisodeStatistics(vw.NormalizeObservation(vw.ClipAction(env)))

    fns = space_fns("box", 4)
    sync = wrap(SyncVectorEnv(fns))
    with contextlib.closing(wrap(DaskVectorEnv(fns, client2, envs_per_actor=2))) as dask:
        assert_identical(dask.reset(seed=1), sync.reset(seed=1), "reset")
        rng = np.random.default_rng(0)
        episodes = 0
        for t in range(12):
            actions = rng.uniform(-3, 3, size=(4, 2)).astype(np.float32)  # outside the Box: ClipAction clips
            got, want = dask.step(actions), sync.step(actions)
            for name, x, y in zip(("obs", "rew", "term", "trunc", "infos"), got, want, strict=True):
                if name == "infos" and "episode" in y:  # wall-clock episode time differs; the rest must not
                    y["episode"].pop("t"), x["episode"].pop("t")
                assert_identical(x, y, f"step {t} {name}")
            episodes += int(want[4].get("_episode", np.zeros(4, bool)).sum())
        assert episodes >= 4
        assert list(dask.return_queue) == list(sync.return_queue)
    sync.close()


@pytest.mark.timeout(180)
def test_cleanrl_style_loop(client2: Any) -> None:
    """A CleanRL-style PPO iteration (rollout in a (T, N) buffer, GAE, one update) runs on it."""
    import torch

    envs = gym.wrappers.vector.RecordEpisodeStatistics(make_vec("CartPole-v1", num_envs=4, client=client2))
    try:
        agent = torch.nn.Sequential(torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
        opt = torch.optim.Adam(agent.parameters(), lr=1e-3)
        steps, n = 64, envs.num_envs
        obs_buf, act_buf = torch.zeros(steps, n, 4), torch.zeros(steps, n, dtype=torch.long)
        rew_buf, done_buf, val_buf = torch.zeros(steps, n), torch.zeros(steps, n), torch.zeros(steps, n)
        obs, _ = envs.reset(seed=0)
        next_done = torch.zeros(n)
        finished = 0
        for t in range(steps):
            o = torch.as_tensor(obs, dtype=torch.float32)
            out = agent(o)
            dist = torch.distributions.Categorical(logits=out[:, :2])
            action = dist.sample()
            obs_buf[t], act_buf[t], done_buf[t], val_buf[t] = o, action, next_done, out[:, 2].detach()
            obs, reward, term, trunc, info = envs.step(action.numpy())
            rew_buf[t] = torch.as_tensor(reward, dtype=torch.float32)
            next_done = torch.as_tensor(term | trunc, dtype=torch.float32)
            finished += int(info.get("_episode", np.zeros(n, bool)).sum())
        adv, last = torch.zeros(steps, n), torch.zeros(n)
        for t in reversed(range(steps)):
            nonterminal = 1.0 - (done_buf[t + 1] if t + 1 < steps else next_done)
            nxt = val_buf[t + 1] if t + 1 < steps else agent(torch.as_tensor(obs, dtype=torch.float32))[:, 2].detach()
            delta = rew_buf[t] + 0.99 * nxt * nonterminal - val_buf[t]
            adv[t] = last = delta + 0.99 * 0.95 * nonterminal * last
        out = agent(obs_buf.reshape(-1, 4))
        logp = torch.distributions.Categorical(logits=out[:, :2]).log_prob(act_buf.reshape(-1))
        loss = -(logp * adv.reshape(-1)).mean() + ((out[:, 2] - (adv + val_buf).reshape(-1)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        assert torch.isfinite(loss)
        assert finished >= 4 and len(envs.return_queue) == finished  # random CartPole episodes are short
    finally:
        envs.close()


# --------------------------------------------------------------------------- partial batches
class GatedSpaceEnv(SpaceEnv):
    """A SpaceEnv whose steps wait until the file ``gate`` exists (``None``: no wait)."""

    def __init__(self, gate: str | None, **kwargs: Any) -> None:
        super().__init__("box", **kwargs)
        self.gate = gate

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        deadline = time.monotonic() + 60
        while self.gate is not None and not os.path.exists(self.gate):
            assert time.monotonic() < deadline, "the test never opened the gate"
            time.sleep(0.005)
        return super().step(action)


def per_env_action(i: int, k: int) -> np.ndarray:
    return np.array([np.sin(i + 0.3 * k), np.cos(2 * i + k)], dtype=np.float32)


@pytest.mark.timeout(120)
def test_partial_batches_are_whole_groups_and_per_env_trajectories_match(client2: Any, tmp_path: Any) -> None:
    """recv() hands out the groups that finished, never waiting for a blocked one; each env's own
    trajectory is what it would be alone."""
    gate = str(tmp_path / "open")
    fns = [functools.partial(GatedSpaceEnv, gate if i < 2 else None, horizon=3 + i % 3) for i in range(6)]
    trajectories: dict[int, list[tuple[Any, ...]]] = {i: [] for i in range(6)}
    count = dict.fromkeys(range(6), 0)

    def round_trip(dask: DaskVectorEnv) -> list[int]:
        o, r, term, trunc, info = dask.recv()
        ids = info["env_id"].tolist()
        assert len(ids) == 2 and info["_env_id"].all()
        for k, i in enumerate(ids):
            trajectories[i].append((o[k], r[k], term[k], trunc[k]))
            count[i] += 1
        dask.send(np.stack([per_env_action(i, count[i]) for i in ids]), ids)
        return sorted(ids)

    with contextlib.closing(DaskVectorEnv(fns, client2, batch_size=2)) as dask:
        assert sorted(len(g["envs"]) for g in dask.groups) == [2, 2, 2]  # groups of gcd(2, 6)
        dask.reset(seed=4)
        dask.send(np.stack([per_env_action(i, 0) for i in range(6)]))
        blocked = [round_trip(dask) for _ in range(12)]
        assert [0, 1] not in blocked and {2, 4} <= {b[0] for b in blocked}  # the others went on
        assert dask.pending == [0, 1, 2, 3, 4, 5]
        with pytest.raises(ValueError, match="whole groups"):
            dask.send(np.zeros((1, 2), np.float32), [2])
        with pytest.raises(ValueError, match="step in flight"):
            dask.send(np.zeros((2, 2), np.float32), [0, 1])
        open(gate, "w").close()
        for _ in range(5000):  # bounded: the gated group comes back once its step can end
            if round_trip(dask) == [0, 1]:
                break
        else:
            pytest.fail("the gated group never came back after its gate opened")
        for _ in range(3):  # every group is in flight: collect them
            dask.recv()
        assert dask.pending == []
        dask.step(np.zeros((6, 2), np.float32))  # none left: the synchronous step is allowed again
    for i in range(6):  # replay each env alone
        alone = SyncVectorEnv([fns[i]])
        alone.reset(seed=4 + i)
        for k, (o, r, term, trunc) in enumerate(trajectories[i]):
            wo, wr, wterm, wtrunc, _ = alone.step(per_env_action(i, k)[None])
            assert_identical((o, r, term, trunc), (wo[0], wr[0], wterm[0], wtrunc[0]), f"env {i} step {k}")
        alone.close()


@pytest.mark.timeout(120)
def test_async_reset_hands_out_first_observations_in_batches(client2: Any) -> None:
    with contextlib.closing(DaskVectorEnv(space_fns("box", 4), client2, batch_size=2)) as dask:
        dask.async_reset(seed=0)
        seen = []
        for _ in range(2):
            _, r, term, trunc, info = dask.recv()
            assert not r.any() and not term.any() and not trunc.any()
            assert info["seed"].tolist() == info["env_id"].tolist()  # the reset info of each env
            seen += info["env_id"].tolist()
            dask.send(np.zeros((2, 2), np.float32), info["env_id"])
        assert sorted(seen) == [0, 1, 2, 3]
        with pytest.raises(AlreadySteppingError, match="steps in flight"):
            dask.step(np.zeros((4, 2), np.float32))
        dask.recv(), dask.recv()
        dask.step(np.zeros((4, 2), np.float32))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=lambda m: m.value)
def test_env_error_restart_is_a_truncation(client2: Any, mode: AutoresetMode) -> None:
    """on_env_error="restart": the env that raised is rebuilt by its group and reports a truncation
    laid out as the autoreset mode lays out any truncation."""
    fns = [functools.partial(CountingEnv, horizon=100, fail_at=3 if i == 1 else None) for i in range(2)]
    with contextlib.closing(DaskVectorEnv(fns, client2, autoreset_mode=mode, on_env_error="restart")) as dask:
        dask.reset(seed=10)
        dask.step(np.zeros(2, np.int64))
        before, *_ = dask.step(np.zeros(2, np.int64))
        obs, rew, term, trunc, info = dask.step(np.ones(2, np.int64))
        seed = restart_seed(1, 1, 11)
        fresh, _ = CountingEnv(horizon=100).reset(seed=seed)
        assert obs[0].tolist() == [3.0, before[0][1]] and rew.tolist() == [1.0, 0.0]
        assert trunc.tolist() == [False, True] and not term.any()
        assert info["_daskvec"].tolist() == [False, True] and info["daskvec"]["reason"][1] == "env_error"
        if mode is AutoresetMode.SAME_STEP:
            assert_identical(obs[1], fresh)
            assert_identical(info["final_obs"][1], before[1])
            assert info["seeded"][1] == seed
        else:
            assert_identical(obs[1], before[1])  # the observation the learner had
            obs, rew, term, trunc, info = dask.step(np.ones(2, np.int64))
            assert_identical(obs[1], fresh)
            assert rew[1] == 0 and not (term[1] or trunc[1]) and info["seeded"][1] == seed
        assert dask.restart_counts.tolist() == [0, 1]


@pytest.mark.timeout(120)
def test_env_process_groups_follow_the_autoreset_mode(client2: Any) -> None:
    """With env_process=True the mode reaches the group in its own process."""
    fns = space_fns("dict", 4)
    sync = SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP)
    with contextlib.closing(DaskVectorEnv(fns, client2, env_process=True, envs_per_actor=2)) as dask:
        assert run_both(sync, dask, 8, AutoresetMode.NEXT_STEP, seed=2) >= 4
    sync.close()


# --------------------------------------------------------------------------- a lost worker
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP], ids=lambda m: m.value)
def test_lost_worker_is_a_truncation(dask_processes: Any, mode: AutoresetMode) -> None:
    """SIGKILL the worker of one group: the other envs stay identical to SyncVectorEnv, the lost
    ones report a truncation (reward 0, the daskvec marker) and start again from the restart seed."""
    procs = dask_processes(2)
    fns = [functools.partial(SpaceEnv, "box", horizon=50) for _ in range(4)]
    sync = SyncVectorEnv(fns, autoreset_mode=mode)
    dask = DaskVectorEnv(fns, procs.address, autoreset_mode=mode, envs_per_actor=2, step_timeout=60)
    try:
        run_both(sync, dask, 3, mode, seed=20)
        victim = dask._engine.groups[1]
        (proc,) = [p for p in procs.workers if p.pid == victim.desc.pid]
        lost, kept = victim.env_indices, dask._engine.groups[0].env_indices
        zeros = np.zeros((4, 2), np.float32)
        last, *_ = dask.step(zeros)  # the observations the envs reached before the kill
        assert_identical(last, sync.step(zeros)[0], "the step before the kill")
        want = sync.step(zeros)
        procs.kill_worker(proc)
        obs, rew, term, trunc, info = dask.step(zeros)
        for i in kept:
            assert_identical((obs[i], rew[i], term[i], trunc[i]), tuple(x[i] for x in want[:4]), f"env {i}")
        assert trunc[lost].all() and not term[lost].any() and not rew[lost].any()
        assert info["_daskvec"].tolist() == [i in lost for i in range(4)]
        assert set(info["daskvec"]["reason"][lost]) == {"worker_lost"}
        seeds = [restart_seed(i, 1, 20 + i) for i in lost]
        fresh = [SpaceEnv("box", horizon=50).reset(seed=s)[0] for s in seeds]
        if mode is AutoresetMode.SAME_STEP:  # the row is already the new episode's first observation
            assert info["_final_obs"].tolist() == [i in lost for i in range(4)]
            for k, i in enumerate(lost):
                assert_identical(obs[i], fresh[k])
                # final_obs: the lost env's last observation, not the rebuilt env's first
                assert_identical(info["final_obs"][i], last[i], f"final_obs of lost env {i}")
        else:  # the row keeps the last observation; the next step hands out the first one, reward 0
            for i in lost:
                assert_identical(obs[i], last[i], f"row of lost env {i}")
            obs, rew, term, trunc, info = dask.step(np.zeros((4, 2), np.float32))
            for k, i in enumerate(lost):
                assert_identical(obs[i], fresh[k])
                assert rew[i] == 0 and not (term[i] or trunc[i])
            assert info["seed"][lost].tolist() == seeds
        assert dask.restart_counts.tolist() == [int(i in lost) for i in range(4)]
    finally:
        dask.close()
        sync.close()


# --------------------------------------------------------------------------- example and benchmark
def load_example() -> Any:
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[2] / "docs" / "examples" / "partial_batch_ppo.py"
    spec = importlib.util.spec_from_file_location("partial_batch_ppo", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.timeout(180)
def test_partial_batch_ppo_example_trains_on_per_env_trajectories(client2: Any, monkeypatch: Any) -> None:
    """The docs example trains briefly from partial batches: two updates of the transitions asked for,
    each env's trajectory its own episodes in order, the parameters changed, the score the greedy
    evaluation of the returned model; its per-env GAE follows each env's episodes.

    (Its full run, reported in docs/gymnasium.md, takes minutes: not a CI test.)
    """
    import torch

    ex = load_example()
    cfg = ex.Config(num_envs=4, batch_size=2, rollout=256, total_steps=512, epochs=1, eval_episodes=1)
    updates: list[list[Any]] = []
    update = ex.update

    def recorded(model: Any, opt: Any, trajs: list[Any], cfg: Any) -> float:
        updates.append(trajs)
        return float(update(model, opt, trajs, cfg))

    monkeypatch.setattr(ex, "update", recorded)
    torch.manual_seed(cfg.seed)  # train() starts with this seed: the same initial parameters
    initial = ex.ActorCritic(4, 2).state_dict()
    model, score = ex.train(cfg, client2)
    # two updates, each of the 256 transitions asked for (a batch of 2 may overshoot by one)
    assert [sum(map(len, trajs)) for trajs in updates] in ([256, 256], [256, 257], [257, 256], [257, 257])
    episodes = 0
    for u, trajs in enumerate(updates):
        assert 1 <= len(trajs) <= cfg.num_envs
        for k, tr in enumerate(trajs):
            where = f"update {u} trajectory {k}"
            assert len(tr.obs) == len(tr.actions) == len(tr.logps) == len(tr.rewards) == len(tr.next_obs) == len(tr)
            assert tr.rewards == [1.0] * len(tr), f"{where}: a reset row was filed as a transition"
            for t in range(len(tr)):
                if tr.ends[t] == "term":  # CartPole fell: the pole or the cart out of bounds
                    episodes += 1
                    assert abs(tr.next_obs[t][0]) > 2.39 or abs(tr.next_obs[t][2]) > 0.2094, f"{where} step {t}"
                if t + 1 == len(tr):
                    break
                if tr.ends[t]:  # the env's next transition starts a new episode
                    assert np.all(np.abs(tr.obs[t + 1]) <= 0.05), f"{where} step {t + 1}: not a first observation"
                else:  # one env's own time axis: the observation a step led to is the next one acted on
                    np.testing.assert_array_equal(tr.next_obs[t], tr.obs[t + 1], err_msg=f"{where} step {t}")
    assert episodes >= 4  # barely trained CartPole episodes are short
    trained = model.state_dict()
    assert any(not torch.equal(initial[k], trained[k]) for k in initial), "the example's updates changed nothing"
    assert score == ex.evaluate(model, cfg.eval_episodes, seed=10_000 + cfg.seed)  # the returned model's, greedily
    # GAE along one env's time axis: termination stops the bootstrap, truncation keeps it
    traj = ex.Trajectory(
        obs=[np.zeros(4, np.float32)] * 3,
        actions=[0, 0, 0],
        logps=[0.0] * 3,
        rewards=[1.0, 1.0, 1.0],
        ends=["", "term", "trunc"],
        next_obs=[np.zeros(4, np.float32)] * 3,
    )
    with torch.no_grad():
        v = float(model.value(torch.zeros(1, 4))[0])
    adv, ret = ex.per_env_gae(model, traj, 0.9, 1.0)
    np.testing.assert_allclose(adv, [1 + 0.9 * v - v + 0.9 * (1 - v), 1 - v, 1 + 0.9 * v - v], rtol=1e-5)
    np.testing.assert_allclose(ret, adv + v, rtol=1e-5)


@pytest.mark.timeout(240)
def test_bench_gymnasium_scenarios(client2: Any) -> None:
    """Both scenarios run in one benchmark call and report every figure (no timing thresholds)."""
    from benchmarks.gym_faces import straggler_ideal
    from daskvec import bench

    assert straggler_ideal([0.008, 0.002, 0.002, 0.002], [4, 4, 4, 4]) == pytest.approx((2000.0, 6500.0))
    address = client2.scheduler.address
    results = bench.run_benchmark(
        settle=0.0, scenarios=["gym-faces", "straggler"], n_envs=[8], seconds=0.3, warmup=0.05, scheduler=address
    )
    faces, straggler = results["cases"]
    assert set(faces["results"]) == {"gym_sync", "gym_async", "gym_dask"}
    for res in faces["results"].values():
        assert res["steps_per_s"] > 0 and res["ttfs_s"] > 0
    assert faces["results"]["gym_async"]["ratio_to_async"] == 1.0
    assert straggler["ideal"]["recv"] > straggler["ideal"]["sync_step"]
    assert straggler["ideal_recv_over_sync"] == pytest.approx(
        straggler["ideal"]["recv"] / straggler["ideal"]["sync_step"]
    )
    for kind in ("sync_step", "recv"):
        assert 0 < straggler["results"][kind]["fraction_of_ideal"] < 1.2  # a sleep never takes less than asked
    table = bench.format_table(results)
    assert "DaskVectorEnv send/recv" in table and "AsyncVectorEnv" in table and "ideal x" in table


@pytest.mark.timeout(120)
def test_torchrl_gym_wrapper_rollout(client2: Any) -> None:
    """TorchRL's GymWrapper runs a rollout on DaskVectorEnv (DISABLED mode: TorchRL resets with a mask),
    with the same result as on SyncVectorEnv."""
    torch = pytest.importorskip("torch")
    libs_gym = pytest.importorskip("torchrl.envs.libs.gym")

    def rollout(vec: Any) -> Any:
        env = libs_gym.GymWrapper(vec)
        env.set_seed(3)
        torch.manual_seed(0)
        try:
            return env.rollout(40, break_when_any_done=False)
        finally:
            env.close()

    fns = [functools.partial(gym.make, "CartPole-v1") for _ in range(4)]
    got = rollout(DaskVectorEnv(fns, client2, autoreset_mode=AutoresetMode.DISABLED, envs_per_actor=2))
    want = rollout(SyncVectorEnv(fns, autoreset_mode=AutoresetMode.DISABLED))
    assert got.batch_size == want.batch_size == torch.Size([4, 40])
    assert int(got["next", "done"].sum()) >= 4  # episodes ended and the envs were reset by TorchRL
    for key in (("observation",), ("action",), ("next", "reward"), ("next", "done"), ("next", "observation")):
        assert torch.equal(got[key], want[key]), key


@pytest.mark.timeout(240)
def test_lost_worker_during_partial_batches(dask_processes: Any) -> None:
    """A group lost while its step is in flight comes back in a batch as a truncation, and can be sent to."""
    procs = dask_processes(2)
    fns = [functools.partial(SpaceEnv, "box", horizon=50) for _ in range(4)]
    with contextlib.closing(DaskVectorEnv(fns, procs.address, batch_size=2, step_timeout=60)) as dask:
        dask.reset(seed=30)
        first, *_ = dask.step(np.zeros((4, 2), np.float32))
        victim = dask._engine.groups[1]
        (proc,) = [p for p in procs.workers if p.pid == victim.desc.pid]
        procs.kill_worker(proc)
        dask.send(np.zeros((4, 2), np.float32))
        seen: dict[int, tuple[Any, ...]] = {}
        for _ in range(2):
            obs, rew, term, trunc, info = dask.recv()
            for k, i in enumerate(info["env_id"].tolist()):
                marker = info["daskvec"]["reason"][k] if info.get("_daskvec", np.zeros(2, bool))[k] else None
                seen[i] = (obs[k], rew[k], term[k], trunc[k], marker)
        assert sorted(seen) == [0, 1, 2, 3]
        for i in victim.env_indices:  # the last observation, reward 0, truncated, marked
            o, r, te, tr, marker = seen[i]
            assert_identical(o, first[i])
            assert (r, te, tr, marker) == (0.0, False, True, "worker_lost")
        for i in (0, 1, 2, 3):
            if i not in victim.env_indices:
                assert seen[i][3:] == (False, None)
        lost = victim.env_indices
        dask.send(np.zeros((2, 2), np.float32), lost)  # the rebuilt group takes steps again
        obs, rew, term, trunc, info = dask.recv()
        assert info["env_id"].tolist() == lost and not rew.any() and not (term | trunc).any()
        assert info["seed"].tolist() == [restart_seed(i, 1, 30 + i) for i in lost]  # NEXT_STEP: the reset row
        while dask.pending:
            dask.recv()
