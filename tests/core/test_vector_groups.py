"""Vectorized envs as env groups: ``from_vector_envs`` on both faces.

Each group is one vector env built on a worker. Against a Gymnasium ``SyncVectorEnv``
of plain envs, every result must equal the plain-env path for the same seeds and
actions (``DummyVecEnv`` for the SB3 face, ``SyncVectorEnv`` of all the envs for the
Gymnasium face); against EnvPool (skipped when it is not installed), SB3's semantics
are checked against EnvPool stepped alone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import pickle
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from envs import BrokenStepEnv, CountingEnv, SpaceEnv, assert_same
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from stable_baselines3.common.vec_env import DummyVecEnv

from daskvec import DaskVecEnv
from daskvec._core.recovery import check_plan, plan_rebalance
from daskvec.gymnasium.vector_env import DaskVectorEnv
from daskvec.protocol.messages import INFO_KEY, Autoreset, ColumnInfos, restart_seed
from daskvec.worker.vector import _ENVPOOL_BOOKKEEPING, VectorEnvs, column_infos, env_info

HAVE_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(not HAVE_ENVPOOL, reason="envpool is not installed (pip install envpool)")

SB3_KINDS = ["box", "image", "discrete", "multidiscrete", "dict", "tuple"]


def space_fns(kind: str, n: int) -> list[Callable[[], gym.Env[Any, Any]]]:
    """Envs whose episodes end at different steps, by termination and by truncation."""
    return [functools.partial(SpaceEnv, kind, horizon=4 + i % 3, terminate_at=3 if i % 2 else None) for i in range(n)]


def vector_fns(fns: list[Callable[[], Any]], sizes: list[int], mode: AutoresetMode) -> list[Callable[[], Any]]:
    """Factories of SyncVectorEnvs holding ``fns`` in slices of ``sizes``."""
    out, start = [], 0
    for k in sizes:
        out.append(functools.partial(SyncVectorEnv, fns[start : start + k], autoreset_mode=mode))
        start += k
    assert start == len(fns)
    return out


def markers(infos: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {i: info[INFO_KEY] for i, info in enumerate(infos) if INFO_KEY in info}


# --------------------------------------------------------------------------- the SB3 face
@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [AutoresetMode.SAME_STEP, AutoresetMode.DISABLED], ids=lambda m: m.value)
@pytest.mark.parametrize("kind", SB3_KINDS)
def test_sb3_face_equals_the_plain_env_path(client2: Any, kind: str, mode: AutoresetMode) -> None:
    """Observations, rewards, dones and infos (terminal_observation, TimeLimit.truncated) as DummyVecEnv's."""
    fns = space_fns(kind, 5)
    ref = DummyVecEnv(fns)
    with contextlib.closing(DaskVecEnv.from_vector_envs(vector_fns(fns, [3, 2], mode), client2)) as env:
        assert env.num_envs == 5 and [g["envs"] for g in env.groups] == [[0, 1, 2], [3, 4]]
        assert env.observation_space == ref.observation_space and env.action_space == ref.action_space
        env.seed(11)
        ref.seed(11)
        assert_same(env.reset(), ref.reset(), "reset")
        assert_same(env.reset_infos, ref.reset_infos, "reset infos")
        space = ref.action_space
        space.seed(3)
        ended = 0
        for t in range(12):
            actions = np.stack([space.sample() for _ in range(5)]) if kind != "dict" else [space.sample()] * 5
            env.step_async(np.asarray(actions))
            ref.step_async(np.asarray(actions))
            for name, got, want in zip(
                ("obs", "rewards", "dones", "infos"), env.step_wait(), ref.step_wait(), strict=True
            ):
                assert_same(got, want, f"step {t} {name}")
            ended += sum("terminal_observation" in info for info in ref.buf_infos)
        assert ended >= 8  # episodes ended, by termination and by truncation
    ref.close()


@pytest.mark.timeout(120)
def test_sb3_face_per_env_calls_reach_the_envs_of_a_sync_vector_env(client2: Any) -> None:
    fns = [functools.partial(SpaceEnv, "box", render_mode="rgb_array") for _ in range(4)]
    ref = DummyVecEnv(fns)
    vfns = vector_fns(fns, [2, 2], AutoresetMode.SAME_STEP)
    with contextlib.closing(DaskVecEnv.from_vector_envs(vfns, client2)) as env:
        env.seed(1)
        ref.seed(1)
        env.reset(), ref.reset()
        assert env.render_mode == "rgb_array"
        assert env.get_attr("horizon") == ref.get_attr("horizon")
        env.set_attr("horizon", 2, indices=[1, 2])
        ref.set_attr("horizon", 2, indices=[1, 2])
        assert env.get_attr("horizon") == [5, 2, 2, 5]
        assert env.env_method("scaled", 2.0, scale=3.0, indices=[3]) == ref.env_method(
            "scaled", 2.0, scale=3.0, indices=[3]
        )
        assert env.env_is_wrapped(gym.Wrapper) == ref.env_is_wrapped(gym.Wrapper)
        assert_same(list(env.get_images()), list(ref.get_images()))
        for _ in range(3):  # the attributes set above changed the episodes of envs 1 and 2 alike
            actions = np.zeros((4, 2), dtype=np.float32)
            assert_same(env.step(actions), ref.step(actions))
    ref.close()


@pytest.mark.timeout(180)
def test_vector_groups_in_env_processes(client2: Any) -> None:
    """env_process=True: each vector env lives in a process of its own beside its worker, with the same results."""
    fns = space_fns("box", 4)
    ref = DummyVecEnv(fns)
    vfns = vector_fns(fns, [2, 2], AutoresetMode.SAME_STEP)
    with contextlib.closing(DaskVecEnv.from_vector_envs(vfns, client2, env_process=True)) as env:
        assert all(g["env_pid"] != g["pid"] for g in env.groups)
        env.seed(2)
        ref.seed(2)
        assert_same(env.reset(), ref.reset())
        for t in range(8):
            actions = np.full((4, 2), 0.1 * t, dtype=np.float32)
            assert_same(env.step(actions), ref.step(actions), f"step {t}")
    ref.close()


@pytest.mark.timeout(120)
def test_a_vector_env_that_cannot_reset_in_the_same_step_is_refused(client2: Any) -> None:
    vfns = vector_fns(space_fns("box", 2), [2], AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError, match=r"'NextStep'.*AutoresetMode.SAME_STEP or AutoresetMode.DISABLED"):
        DaskVecEnv.from_vector_envs(vfns, client2)
    with pytest.raises(TypeError, match=r"which has no num_envs"):
        DaskVecEnv.from_vector_envs([functools.partial(SpaceEnv, "box")], client2)
    with pytest.raises(TypeError, match="vector_env_fns must be a list"):
        DaskVecEnv.from_vector_envs(vfns[0], client2)  # type: ignore[arg-type]
    # and the other way round: a vector env where one env is due points at from_vector_envs
    same_step = vector_fns(space_fns("box", 2), [2], AutoresetMode.SAME_STEP)
    for face in (DaskVecEnv, DaskVectorEnv):
        with pytest.raises(TypeError, match=r"'SyncVectorEnv', a vectorized env of 2 envs.*from_vector_envs"):
            face(same_step * 2, client2)


def _async_vector_env() -> Any:
    return gym.vector.AsyncVectorEnv([functools.partial(SpaceEnv, "box")] * 2)


@pytest.mark.timeout(120)
def test_an_async_vector_env_in_a_worker_says_what_to_use_instead(client2: Any) -> None:
    """A Dask worker is a daemonic process: an AsyncVectorEnv cannot start its processes there."""
    with pytest.raises(AssertionError, match="daemonic") as info:
        DaskVecEnv.from_vector_envs([_async_vector_env], client2, timeout=60)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "use a SyncVectorEnv" in notes and "env_process=True" in notes, notes


@pytest.mark.timeout(120)
def test_vector_env_error_restarts_the_whole_vector_env(client2: Any) -> None:
    """on_env_error='restart': all the envs of the vector env that raised report a truncation, the others step on."""
    fns: list[Callable[[], Any]] = [functools.partial(CountingEnv, horizon=50) for _ in range(4)]
    fns[1] = functools.partial(BrokenStepEnv, horizon=50, fail_at=3)
    vfns = vector_fns(fns, [2, 2], AutoresetMode.SAME_STEP)
    with contextlib.closing(DaskVecEnv.from_vector_envs(vfns, client2, on_env_error="restart")) as env:
        env.seed(5)
        env.reset()
        actions = np.ones(4, dtype=np.int64)
        for _ in range(2):
            obs, rewards, dones, infos = env.step(actions)
            assert not dones.any()
        obs, rewards, dones, infos = env.step(actions)  # env 1 raises: its vector env (envs 0 and 1) is rebuilt
        m = markers(infos)
        assert sorted(m) == [0, 1] and all(m[i]["reason"] == "env_error" for i in m)
        assert list(dones) == [True, True, False, False] and list(rewards[:2]) == [0.0, 0.0]
        assert all(infos[i]["TimeLimit.truncated"] is True for i in (0, 1))
        assert infos[0]["terminal_observation"][0] == 2.0  # the observation the learner had
        assert [m[i]["seed"] for i in (0, 1)] == [restart_seed(i, 1, 5 + i) for i in (0, 1)]
        assert obs[0][0] == 0.0 and obs[2][0] == 3.0  # the rebuilt envs start over; the others step on
        assert list(env.error_restarts) == [1, 1, 0, 0]


@pytest.mark.timeout(240)
def test_a_lost_worker_rebuilds_its_vector_env_whole(dask_processes: Any) -> None:
    from distributed import Client

    procs = dask_processes(2)
    fns = [functools.partial(CountingEnv, horizon=50) for _ in range(6)]
    vfns = vector_fns(fns, [3, 3], AutoresetMode.SAME_STEP)
    with (
        contextlib.closing(DaskVecEnv.from_vector_envs(vfns, procs.address, timeout=60, worker_wait_timeout=60)) as env,
        Client(procs.address, set_as_default=False) as client,
    ):
        assert len({g["worker"] for g in env.groups}) == 2
        env.reset()
        env.step(np.ones(6, dtype=np.int64))
        lost = next(g for g in env.groups if g["envs"] == [3, 4, 5])
        pids = client.run(__import__("os").getpid)
        victim = next(p for p in procs.workers if p.pid == pids[lost["worker"]])
        procs.kill_worker(victim)
        _, rewards, dones, infos = env.step(np.ones(6, dtype=np.int64))
        m = markers(infos)
        assert sorted(m) == [3, 4, 5] and all(m[i]["reason"] == "worker_lost" for i in m)
        assert list(rewards) == [1.0] * 3 + [0.0] * 3
        assert list(dones) == [False] * 3 + [True] * 3
        assert [g["envs"] for g in env.groups] == [[0, 1, 2], [3, 4, 5]]
        assert len({g["worker"] for g in env.groups}) == 1  # rebuilt whole, beside the other one
        obs, *_ = env.step(np.ones(6, dtype=np.int64))
        assert list(obs[:, 0]) == [3.0, 3.0, 3.0, 1.0, 1.0, 1.0]


@pytest.mark.timeout(120)
def test_vector_groups_report_to_the_dashboard(client2: Any) -> None:
    """The workers' figures (the dashboard's /workers columns and Prometheus) count a vector group's envs and steps."""
    from daskvec.monitoring import metrics

    def summaries() -> dict[str, dict[str, float]]:
        return dict(client2.run(metrics.worker_summary))

    before = summaries()
    vfns = vector_fns([functools.partial(CountingEnv, horizon=4) for _ in range(6)], [3, 3], AutoresetMode.SAME_STEP)
    with contextlib.closing(DaskVecEnv.from_vector_envs(vfns, client2)) as env:
        env.reset()
        for _ in range(8):
            env.step(np.ones(6, dtype=np.int64))
        after = summaries()
        held: dict[str, int] = {}
        for g in env.groups:
            held[g["worker"]] = held.get(g["worker"], 0) + len(g["envs"])
        for w, k in held.items():
            assert after[w]["daskvec_envs"] - before[w]["daskvec_envs"] == k
            assert after[w]["daskvec_steps"] - before[w]["daskvec_steps"] == k * 8
            assert after[w]["daskvec_episodes"] - before[w]["daskvec_episodes"] == k * 2


def test_rebalance_moves_whole_vector_groups_only() -> None:
    groups = [([0, 1, 2, 3], "a"), ([4, 5], "a"), ([6, 7], "a"), ([8, 9, 10], "b")]
    plan = plan_rebalance(groups, ["a", "b", "c"], whole_groups=True)
    check_plan(groups, plan)
    assert plan.layout and all(tuple(ind) in {tuple(g[0]) for g in groups} for ind, _ in plan.layout)
    load = {"a": 8, "b": 3, "c": 0}
    for pos, (ind, w) in zip(plan.old, plan.layout, strict=True):
        load[groups[pos][1]] -= len(ind)
        load[w] += len(ind)
    assert max(load.values()) - min(load.values()) <= 4  # as even as whole groups allow: a 4, 3 and 4
    gone = plan_rebalance(groups, ["b", "c"], whole_groups=True)  # "a" leaves: all its groups move, whole
    assert sorted(gone.old) == [0, 1, 2]
    assert plan_rebalance([([0, 1], "a"), ([2, 3, 4], "b")], ["a", "b"], whole_groups=True).old == []


@pytest.mark.timeout(240)
def test_worker_side_rollouts_on_vector_groups_equal_the_plain_env_path(client2: Any) -> None:
    """DaskPPO on two vector groups learns exactly what it learns on two groups of the same plain envs."""
    from stable_baselines3.common.monitor import Monitor

    from daskvec.sb3 import DaskPPO

    def make_one() -> Any:
        return Monitor(gym.make("CartPole-v1"))

    def make_vec() -> Any:
        return SyncVectorEnv([make_one, make_one], autoreset_mode=AutoresetMode.SAME_STEP)

    learned = []
    for env in (
        DaskVecEnv.from_vector_envs([make_vec, make_vec], client2),
        DaskVecEnv([make_one] * 4, client2, envs_per_actor=2),
    ):
        with contextlib.closing(env):
            assert [g["envs"] for g in env.groups] == [[0, 1], [2, 3]]
            model = DaskPPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=0, device="cpu")
            model.learn(total_timesteps=512)
            assert model.num_timesteps == 512 and len(model.ep_info_buffer) > 0
            learned.append(
                (
                    {k: v.clone() for k, v in model.policy.state_dict().items()},
                    [info["r"] for info in model.ep_info_buffer],
                )
            )
    (vec_params, vec_returns), (plain_params, plain_returns) = learned
    assert vec_returns == plain_returns
    for k, v in vec_params.items():
        assert np.array_equal(v.numpy(), plain_params[k].numpy()), k


# --------------------------------------------------------------------------- the Gymnasium face
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("face", "own"),
    [
        (AutoresetMode.NEXT_STEP, AutoresetMode.NEXT_STEP),
        (AutoresetMode.SAME_STEP, AutoresetMode.SAME_STEP),
        (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED),
        (AutoresetMode.DISABLED, AutoresetMode.DISABLED),
    ],
    ids=["next-next", "same-same", "same-disabled", "disabled-disabled"],
)
@pytest.mark.parametrize("kind", ["box", "dict"])
def test_gymnasium_face_equals_one_sync_vector_env(
    client2: Any, kind: str, face: AutoresetMode, own: AutoresetMode
) -> None:
    from gym_helpers import run_both

    fns = space_fns(kind, 5)
    sync = SyncVectorEnv(fns, autoreset_mode=face)
    vfns = vector_fns(fns, [2, 3], own)
    with contextlib.closing(DaskVectorEnv.from_vector_envs(vfns, client2, autoreset_mode=face)) as dask:
        assert dask.num_envs == 5 and dask.single_observation_space == sync.single_observation_space
        assert dask.metadata["autoreset_mode"] is face
        ended = run_both(sync, dask, 9, face, seed=7)
        assert ended >= 6
    sync.close()


def test_env_info_inverts_gymnasiums_batching() -> None:
    infos: dict[str, Any] = {}
    vec = SyncVectorEnv([lambda: CountingEnv()] * 3)
    for i, info in enumerate([{"t": 1, "s": "a"}, {}, {"t": 3, "d": {"x": 1.5}}]):
        infos = vec._add_info(infos, info, i)
    assert env_info(infos, 0) == {"t": 1, "s": "a"}
    assert env_info(infos, 1) == {}
    assert env_info(infos, 2) == {"t": 3, "d": {"x": 1.5}}
    assert type(env_info(infos, 0)["t"]) is int
    assert env_info({"lives": np.array([3, 2]), "ram": np.zeros((2, 4))}, 1)["lives"] == 2  # EnvPool: no masks
    vec.close()


def _batched(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``rows`` batched as Gymnasium's ``SyncVectorEnv`` batches its envs' infos (``_key`` masks)."""
    infos: dict[str, Any] = {}
    vec = SyncVectorEnv([lambda: CountingEnv()] * len(rows))
    for i, info in enumerate(rows):
        infos = vec._add_info(infos, info, i)
    vec.close()
    return infos


class _NumberedResets(CountingEnv):
    """A CountingEnv whose reset info is a number (as the step's is), so the two could be confused."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        self.resets = getattr(self, "resets", 0) + 1
        obs, _ = super().reset(seed=seed, options=options)
        return obs, {"resets": self.resets}


def test_column_infos_are_every_envs_env_info() -> None:
    """Numeric columns become every env's info at once: what env_info gives env by env, types and key order too."""
    n = 5
    rng = np.random.default_rng(3)
    envpool_like = {
        "env_id": np.arange(n, dtype=np.int32),
        "players": {"env_id": np.arange(n, dtype=np.int32)},
        "elapsed_step": rng.integers(0, 1000, n).astype(np.int32),
        "reward_run": rng.standard_normal(n),
        "small": rng.standard_normal(n).astype(np.float32),
        "lives": rng.integers(0, 5, n).astype(np.uint8),
        "ok": rng.random(n) < 0.5,
        "ram": rng.integers(0, 255, (n, 8)).astype(np.uint8),  # a row per env
    }
    for infos, skip in [
        (envpool_like, _ENVPOOL_BOOKKEEPING),
        (_batched([{"t": i, "x": 0.5 * i, "b": i % 2 == 0} for i in range(n)]), frozenset()),  # masks all set
    ]:
        got = column_infos(infos, n, skip)
        want = {i: env_info(infos, i, skip) for i in range(n)}
        assert type(got) is ColumnInfos and list(got) == list(want)
        for i in range(n):
            assert [(k, type(v)) for k, v in got[i].items()] == [(k, type(v)) for k, v in want[i].items()]
            for k, v in got[i].items():
                np.testing.assert_array_equal(v, want[i][k])
    # what columns cannot say: None, and the group builds each env's info alone
    for bad in [
        _batched([{"t": 1}, {}, {"t": 3}, {"t": 4}, {"t": 5}]),  # an env without the key
        {"d": {"x": np.ones(n)}},  # nested (final_info)
        {"s": np.array(list("abcde"), dtype=object)},
        {"ram": np.zeros((n, 4), dtype=">f8")},  # a byte order the wire does not keep
        {"big": np.array([1, 2, 3, 4, 2**63], dtype=np.uint64)},  # beyond int64
        {"x": np.ones(n, dtype=np.longdouble)},  # env_info keeps its precision, a Python float would not
        {"t": np.ones(n + 1)},  # not one per env
        {"t": [1] * n},  # not an array
        {},
    ]:
        assert column_infos(bad, n) is None, bad
    # a vector group's step takes them when they apply, and each env's info alone when not
    sync = SyncVectorEnv([functools.partial(_NumberedResets, horizon=3)] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    vec = VectorEnvs(sync, Autoreset.SAME_STEP)
    vec.reset([None, None], [None, None])
    out = vec.step(np.array([1, 0]))
    assert type(out.infos) is ColumnInfos and out.infos == {0: {"t": 1}, 1: {"t": 1}}
    vec.step(np.array([1, 0]))
    out = vec.step(np.array([1, 0]))  # both episodes end: their infos are in final_info, per env
    assert type(out.infos) is dict and out.infos == {0: {"t": 3}, 1: {"t": 3}} and set(out.final_obs) == {0, 1}
    assert out.reset_infos == {0: {"resets": 2}, 1: {"resets": 2}}
    sync.close()
    # read-only, so its rows and its columns agree; a pickle of it is a plain dict
    got = column_infos(envpool_like, n, _ENVPOOL_BOOKKEEPING)
    assert got is not None
    for change in (lambda: got.__setitem__(0, {}), lambda: got.pop(0), lambda: got.update({}), got.clear):
        with pytest.raises(TypeError, match="read-only"):
            change()
    again = pickle.loads(pickle.dumps(got))
    assert type(again) is dict and list(again) == list(got) and again[1]["elapsed_step"] == got[1]["elapsed_step"]


def test_modes_that_cannot_be_served_are_refused_with_the_mode_to_use() -> None:
    vec = SyncVectorEnv([lambda: CountingEnv()] * 2, autoreset_mode=AutoresetMode.SAME_STEP)
    with pytest.raises(ValueError, match=r"AutoresetMode.NEXT_STEP"):
        VectorEnvs(vec, Autoreset.NEXT_STEP)
    with pytest.raises(ValueError, match=r"AutoresetMode.DISABLED"):
        VectorEnvs(vec, Autoreset.DISABLED)
    ok = VectorEnvs(vec, Autoreset.SAME_STEP)
    with pytest.raises(ValueError, match="one options dict for all"):
        ok.check_options([{"base": 1}, {"base": 2}])
    assert ok.check_options([{"base": 1}, {"base": 2}], mask=[True, False]) == {"base": 1}
    vec.close()


# --------------------------------------------------------------------------- EnvPool
def envpool_fn(task: str, n: int, seed: int) -> Callable[[], Any]:
    def make() -> Any:
        import envpool

        return envpool.make_gymnasium(task, num_envs=n, seed=seed)

    return make


#: The keys SB3's face adds to an env's own info.
SB3_KEYS = ("TimeLimit.truncated", "terminal_observation")


@needs_envpool
@pytest.mark.timeout(180)
def test_envpool_groups_keep_sb3_semantics(client2: Any) -> None:
    """Two EnvPool groups: each group's rows equal EnvPool stepped alone, with SB3's auto-reset in the same step."""
    import envpool

    with contextlib.closing(
        DaskVecEnv.from_vector_envs([envpool_fn("CartPole-v1", 3, 0), envpool_fn("CartPole-v1", 3, 100)], client2)
    ) as env:
        assert env.num_envs == 6 and "EnvPool" in env._engine.groups[0].desc.vector
        refs = [envpool.make_gymnasium("CartPole-v1", num_envs=3, seed=s) for s in (0, 100)]
        obs = env.reset()
        for k, ref in enumerate(refs):
            np.testing.assert_allclose(obs[3 * k : 3 * k + 3], ref.reset()[0])
        ended = 0
        rng = np.random.default_rng(0)
        for t in range(120):
            actions = rng.integers(0, 2, size=6)
            obs, rewards, dones, infos = env.step(actions)
            for k, ref in enumerate(refs):
                rows = slice(3 * k, 3 * k + 3)
                want, rew, term, trunc, ref_infos = ref.step(actions[rows])
                np.testing.assert_array_equal(dones[rows], term | trunc, err_msg=f"step {t}")
                np.testing.assert_allclose(rewards[rows], rew)
                for i in range(3):  # EnvPool's own infos, env by env (the group sends them as columns)
                    own = {k: v for k, v in infos[3 * k + i].items() if k not in SB3_KEYS}
                    assert own == env_info(ref_infos, i, _ENVPOOL_BOOKKEEPING), f"step {t}, env {3 * k + i}"
                for i in np.flatnonzero(term | trunc):
                    info = infos[3 * k + i]
                    np.testing.assert_allclose(info["terminal_observation"], want[i])
                    assert info["TimeLimit.truncated"] == bool(trunc[i] and not term[i])
                    ended += 1
                if (term | trunc).any():
                    ids = np.flatnonzero(term | trunc).astype(np.int32)
                    want[ids] = ref.reset(ids)[0]
                np.testing.assert_allclose(obs[rows], want, err_msg=f"step {t}")
        assert ended >= 4
        assert "env_id" not in infos[0] and "elapsed_step" in infos[0]
        with pytest.raises(AttributeError, match="does not give access to its envs one by one"):
            env.env_method("seed", 1)
        with pytest.raises(NotImplementedError, match="cannot set"):
            env.set_attr("x", 1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.seed(3)
            env.reset()
        assert any("take their seed when they are made" in str(w.message) for w in caught)
        for ref in refs:
            ref.close()


@needs_envpool
@pytest.mark.timeout(180)
def test_envpool_groups_on_the_gymnasium_face(client2: Any) -> None:
    """NEXT_STEP, EnvPool's own mode: each group's results are EnvPool's, infos included."""
    import envpool

    with contextlib.closing(
        DaskVectorEnv.from_vector_envs([envpool_fn("CartPole-v1", 2, 0), envpool_fn("CartPole-v1", 2, 7)], client2)
    ) as env:
        refs = [envpool.make_gymnasium("CartPole-v1", num_envs=2, seed=s) for s in (0, 7)]
        obs, _ = env.reset()
        np.testing.assert_allclose(obs, np.concatenate([r.reset()[0] for r in refs]))
        for t in range(80):
            actions = np.array([t % 2, 1, 0, (t // 3) % 2])
            obs, rewards, term, trunc, infos = env.step(actions)
            outs = [r.step(actions[2 * k : 2 * k + 2]) for k, r in enumerate(refs)]
            np.testing.assert_allclose(obs, np.concatenate([o[0] for o in outs]), err_msg=f"step {t}")
            np.testing.assert_allclose(rewards, np.concatenate([o[1] for o in outs]))
            np.testing.assert_array_equal(term, np.concatenate([o[2] for o in outs]))
            np.testing.assert_array_equal(trunc, np.concatenate([o[3] for o in outs]))
            np.testing.assert_array_equal(infos["elapsed_step"], np.concatenate([o[4]["elapsed_step"] for o in outs]))
        for ref in refs:
            ref.close()


@needs_envpool
@pytest.mark.timeout(120)
def test_the_fixed_seed_warning_counts_only_the_envs_a_reset_mask_selects(client2: Any) -> None:
    """Seeds for EnvPool's envs warn (it ignores them); a masked reset that leaves them out does not."""
    plain = functools.partial(
        SyncVectorEnv, [functools.partial(gym.make, "CartPole-v1")] * 2, autoreset_mode=AutoresetMode.DISABLED
    )
    with contextlib.closing(
        DaskVectorEnv.from_vector_envs([plain, envpool_fn("CartPole-v1", 2, 0)], client2, autoreset_mode="Disabled")
    ) as env:
        env.reset()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.reset(seed=5, options={"reset_mask": np.array([True, True, False, False])})
        assert not [w for w in caught if "take their seed" in str(w.message)], [str(w.message) for w in caught]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            env.reset(seed=5, options={"reset_mask": np.array([False, True, True, False])})
        assert [w for w in caught if "take their seed when they are made" in str(w.message)]


def test_a_rebuild_of_another_size_is_refused_with_both_sizes() -> None:
    """A rebuilt vector group (lost worker, move, restart) keeps its env numbers: a factory making more is refused."""
    import cloudpickle

    from daskvec.errors import EnvBuildError
    from daskvec.protocol.messages import GroupSpec
    from daskvec.worker.env_group import EnvGroup

    four = vector_fns([functools.partial(CountingEnv, horizon=4) for _ in range(4)], [4], AutoresetMode.SAME_STEP)
    factories = cloudpickle.dumps(four)
    with pytest.raises(EnvBuildError, match=r"made 4 envs .* holds 2 \(envs \[8, 9\]\)") as caught:
        EnvGroup(factories, GroupSpec((8, 9), token=None, vector=True), worker_address="test")
    assert caught.value.env_indices == [8, 9]
    group = EnvGroup(factories, GroupSpec((8, 9, 10, 11), token=None, vector=True), worker_address="test")
    try:
        assert group.env_indices == [8, 9, 10, 11] and len(group.envs) == 4
    finally:
        group.shutdown()


def test_gymnasium_face_batches_vector_envs_of_differing_bounds(client2: Any) -> None:
    """``observation_mode="different"`` over vector envs whose envs have other bounds, as Gymnasium batches them."""
    from gym_helpers import BoundsEnv
    from gymnasium.vector.utils import batch_differing_spaces

    highs = [[1.0, 2.0], [3.0, 4.0]]
    vfns = [
        functools.partial(SyncVectorEnv, [functools.partial(BoundsEnv, h) for h in hs], observation_mode="different")
        for hs in highs
    ]
    spaces = [BoundsEnv(h).observation_space for hs in highs for h in hs]
    with contextlib.closing(DaskVectorEnv.from_vector_envs(vfns, client2, observation_mode="different")) as dask:
        assert dask.num_envs == 4 and dask.observation_space == batch_differing_spaces(spaces)
        obs, _ = dask.reset(seed=0)
        assert all(spaces[i].contains(obs[i]) for i in range(4))
    with pytest.raises(RuntimeError, match="observation_mode='different'"):
        DaskVectorEnv.from_vector_envs(vfns, client2)


# --------------------------------------------------------------------------- build failures name the factory
def failing_vector_factory() -> Any:
    raise RuntimeError("no simulator licence")


def exiting_vector_factory() -> Any:
    import os

    os._exit(3)  # the interpreter ends, as a crashing C extension would


@pytest.mark.timeout(120)
def test_a_failing_vector_factory_is_named_by_its_position_not_by_placeholder_envs(client2: Any) -> None:
    """A vector env's size is known only once built: its first build's error names the factory, not "envs [1]"."""
    good = vector_fns(space_fns("box", 2), [2], AutoresetMode.SAME_STEP)[0]
    with pytest.raises(RuntimeError, match="no simulator licence") as caught:
        DaskVecEnv.from_vector_envs([good, failing_vector_factory], client2, timeout=60)
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "vector env factory failing_vector_factory (its first build)" in notes, notes
    assert "vector env factory 1 of vector_env_fns (failing_vector_factory)" in notes, notes
    assert "envs [" not in notes, notes


@pytest.mark.timeout(240)
def test_a_vector_factory_that_ends_its_worker_is_refused_after_two_workers(dask_processes: Any) -> None:
    """Two workers lost in a row building one vector factory: an EnvBuildError naming the factory, no retry loop."""
    from daskvec.errors import EnvBuildError

    procs = dask_processes(2)
    good = vector_fns(space_fns("box", 2), [2], AutoresetMode.SAME_STEP)[0]
    crashed = r"building vector env factory 1 of vector_env_fns \(exiting_vector_factory\) ended the process"
    with pytest.raises(EnvBuildError, match=crashed + " building them on 2 workers in a row"):
        DaskVecEnv.from_vector_envs([good, exiting_vector_factory], procs.address, timeout=60, worker_wait_timeout=60)
