"""The VecEnv contract, run the same over DummyVecEnv, SubprocVecEnv and DaskVecEnv.

DaskVecEnv runs in several placements on the session's 2-process LocalCluster: one
worker or two, one env per actor or several, and both transports (the direct socket,
over a Unix socket as on one machine and over TCP as across machines, and the
Dask-actor fallback). Every test below runs on every backend, and most compare
the backend's output with DummyVecEnv's or with a reference computed by hand.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import gymnasium as gym
import numpy as np
import pytest
from envs import SPACE_KINDS, CountingEnv, SpaceEnv, assert_same
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecEnv
from wire_frames import check_channel

from daskvec import DaskVecEnv
from daskvec.cluster.clients import scheduler_workers
from daskvec.errors import ClosedEnvError

N_ENVS = 4

#: DaskVecEnv placements: options, and the expected number of workers and groups.
PLACEMENTS: dict[str, dict[str, Any]] = {
    "dask-1w-direct-envproc": {
        "transport": "direct",
        "env_process": True,
        "one_worker": True,
        "workers": 1,
        "groups": 1,
    },
    "dask-2w-1per-direct": {"transport": "direct", "envs_per_actor": 1, "workers": 2, "groups": 4},
    # as if the client ran on another machine: the direct channel goes over TCP, not the Unix socket
    "dask-2w-direct-tcp": {"transport": "direct", "socket": "tcp", "workers": 2, "groups": 2},
    "dask-2w-actor": {"transport": "actor", "workers": 2, "groups": 2},
    "dask-1w-3per-actor": {"transport": "actor", "one_worker": True, "envs_per_actor": 3, "workers": 1, "groups": 2},
}
BACKENDS = ["dummy", "subproc", *PLACEMENTS]
DASK_BACKENDS = list(PLACEMENTS)


def make_vec(backend: str, env_fns: list[Callable[[], gym.Env[Any, Any]]], client: Any) -> VecEnv:
    """Build ``backend`` over ``env_fns`` and check that a Dask placement is what it says."""
    if backend == "dummy":
        return DummyVecEnv(env_fns)
    if backend == "subproc":
        # fork: the forkserver default re-imports torch & co. (~20 s on this machine)
        return SubprocVecEnv(env_fns, start_method="fork")
    spec = PLACEMENTS[backend]
    workers = sorted(scheduler_workers(client))
    socket = spec.get("socket", "unix" if spec["transport"] == "direct" else None)
    elsewhere = mock.patch("daskvec._core.pool.machine_id", return_value="another-machine/0")
    with elsewhere if socket == "tcp" else contextlib.nullcontext():
        venv = DaskVecEnv(
            env_fns,
            client=client,
            transport=spec["transport"],
            env_process=spec.get("env_process", False),
            envs_per_actor=spec.get("envs_per_actor"),
            workers=workers[:1] if spec.get("one_worker") else None,
            timeout=60,
        )
    groups = venv.groups
    assert len(groups) == spec["groups"], groups
    assert len({g["worker"] for g in groups}) == spec["workers"], groups
    assert {g["transport"] for g in groups} == {spec["transport"]}, groups
    assert {g["socket"] for g in groups} == {socket}, groups
    assert sorted(i for g in groups for i in g["envs"]) == list(range(len(env_fns)))
    worker_pids = client.run(os.getpid)
    for g in groups:  # envs step in a process of their own, or inside the worker when asked
        assert (g["env_pid"] != worker_pids[g["worker"]]) == spec.get("env_process", False), g
    return venv


@pytest.fixture
def vec_factory(dclient: Any) -> Iterator[Callable[[str, list[Callable[[], gym.Env[Any, Any]]]], VecEnv]]:
    """``vec_factory(backend, env_fns)``; every vec env made is closed after the test."""
    made: list[VecEnv] = []

    def build(backend: str, env_fns: list[Callable[[], gym.Env[Any, Any]]]) -> VecEnv:
        venv = make_vec(backend, env_fns, dclient)
        made.append(venv)
        return venv

    yield build
    for venv in made:
        venv.close()


def space_fns(kind: str, n: int = N_ENVS, **kwargs: Any) -> list[Callable[[], gym.Env[Any, Any]]]:
    """``n`` SpaceEnv factories; env ``i`` terminates at step 2+i or is truncated at 4."""
    return [
        functools.partial(SpaceEnv, kind, horizon=4, terminate_at=(2 + i if i % 2 == 0 else None), **kwargs)
        for i in range(n)
    ]


def random_actions(space: gym.Space[Any], n_envs: int, steps: int, seed: int) -> list[np.ndarray]:
    space.seed(seed)
    return [np.stack([np.asarray(space.sample()) for _ in range(n_envs)]) for _ in range(steps)]


def run(venv: VecEnv, actions: list[np.ndarray], seed: int) -> list[Any]:
    """Seed, reset, and step through ``actions``, collecting every output."""
    venv.seed(seed)
    out: list[Any] = [venv.reset(), [dict(i) for i in venv.reset_infos]]
    for a in actions:
        venv.step_async(a)
        obs, rews, dones, infos = venv.step_wait()
        if isinstance(venv, SubprocVecEnv):  # SubprocVecEnv stacks rewards as float64, DummyVecEnv as float32
            assert rews.dtype == np.float64
            rews = rews.astype(np.float32)
        out.append((obs, rews, dones, list(infos), [dict(i) for i in venv.reset_infos]))
    return out


# --------------------------------------------------------------------------- determinism and spaces
@pytest.mark.parametrize(
    ("backend", "kind"),
    [
        *[(b, k) for b in DASK_BACKENDS for k in SPACE_KINDS],
        ("subproc", "box"),  # SubprocVecEnv, SB3's own, as a check of the reference itself
        ("subproc", "dict"),
    ],
)
def test_same_results_as_dummy(backend: str, kind: str, vec_factory: Any) -> None:
    """Same seeds and actions give exactly DummyVecEnv's obs, rewards, dones and infos."""
    ref = vec_factory("dummy", space_fns(kind))
    venv = vec_factory(backend, space_fns(kind))
    assert venv.num_envs == N_ENVS
    assert venv.observation_space == ref.observation_space == SpaceEnv(kind).observation_space
    assert venv.action_space == ref.action_space
    actions = random_actions(venv.action_space, N_ENVS, 9, seed=7)
    got, want = run(venv, actions, seed=123), run(ref, actions, seed=123)
    assert_same(got, want, backend)
    # the run did exercise both kinds of episode end and auto-reset
    infos = [i for step in got[2:] for i in step[3]]
    assert any("terminal_observation" in i and not i["TimeLimit.truncated"] for i in infos)
    assert any(i.get("TimeLimit.truncated") for i in infos)
    for step in got[2:]:
        obs = step[0]
        for e in range(N_ENVS):
            row = (
                {k: v[e] for k, v in obs.items()}
                if isinstance(obs, dict)
                else (tuple(v[e] for v in obs) if isinstance(obs, tuple) else obs[e])
            )
            assert venv.observation_space.contains(row), (kind, row)


# --------------------------------------------------------------------------- reset, seeds, options
@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_seeds_and_options_apply_once(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    seeds = venv.seed(100)
    assert seeds == [100, 101, 102, 103]
    venv.set_options([{"base": 500}, {}, {"base": 502}, {}])
    first = venv.reset()
    second = venv.reset()

    refs = [SpaceEnv("box") for _ in range(N_ENVS)]
    want_first = [refs[i].reset(seed=100 + i, options=[{"base": 500}, {}, {"base": 502}, {}][i]) for i in range(N_ENVS)]
    want_second = [refs[i].reset() for i in range(N_ENVS)]
    np.testing.assert_array_equal(first, np.stack([o for o, _ in want_first]))
    np.testing.assert_array_equal(second, np.stack([o for o, _ in want_second]))
    assert not np.array_equal(first, second)
    # reset_infos hold the infos of the last reset: seeds and options were used once
    assert [i["seed"] for i in venv.reset_infos] == [None] * N_ENVS
    assert [i["options"] for i in venv.reset_infos] == [{}] * N_ENVS
    assert [i["base"] for i in venv.reset_infos] == [info["base"] for _, info in want_second]
    assert want_first[0][1]["base"] == 500 and want_first[2][1]["base"] == 502


@pytest.mark.parametrize("backend", BACKENDS)
def test_reset_infos_after_seeded_reset(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    venv.seed(5)
    venv.set_options({"base": 42})  # one dict: the same options for every env
    venv.reset()
    assert [i["seed"] for i in venv.reset_infos] == [5, 6, 7, 8]
    assert [i["base"] for i in venv.reset_infos] == [42] * N_ENVS
    assert [i["options"] for i in venv.reset_infos] == [{"base": 42}] * N_ENVS


# --------------------------------------------------------------------------- step and auto-reset
@pytest.mark.parametrize("backend", BACKENDS)
def test_step_auto_reset_terminal_observation(backend: str, vec_factory: Any) -> None:
    """Check auto-reset against a hand-written reference of the SB3 step semantics."""
    fns = [
        functools.partial(SpaceEnv, "box", horizon=3, terminate_at=2),  # terminated at 2
        functools.partial(SpaceEnv, "box", horizon=3),  # truncated at 3
        functools.partial(SpaceEnv, "box", horizon=3, terminate_at=3),  # both at 3: not a truncation
        functools.partial(SpaceEnv, "box", horizon=4),
    ]
    venv = vec_factory(backend, fns)
    venv.seed(0)
    obs = venv.reset()
    refs = [fn() for fn in fns]
    ref_obs = [r.reset(seed=i)[0] for i, r in enumerate(refs)]
    np.testing.assert_array_equal(obs, np.stack(ref_obs))
    for step in range(7):
        actions = np.array([step % 4, 1, 2, 3])
        venv.step_async(actions)
        obs, rews, dones, infos = venv.step_wait()
        assert rews.dtype == (np.float64 if backend == "subproc" else np.float32)
        assert dones.dtype == np.bool_ and rews.shape == dones.shape == (N_ENVS,)
        for i, r in enumerate(refs):
            o, rew, term, trunc, info = r.step(actions[i])
            assert rews[i] == np.float32(rew)
            assert bool(dones[i]) == (term or trunc)
            assert infos[i]["t"] == info["t"]
            assert infos[i]["TimeLimit.truncated"] == (trunc and not term)
            if term or trunc:
                np.testing.assert_array_equal(infos[i]["terminal_observation"], o)
                o, reset_info = r.reset()
                assert venv.reset_infos[i]["base"] == reset_info["base"]
                assert venv.reset_infos[i]["seed"] is None
            else:
                assert "terminal_observation" not in infos[i]
            np.testing.assert_array_equal(obs[i], o)


@pytest.mark.parametrize("backend", BACKENDS)
def test_step_convenience_and_returned_arrays_are_copies(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    venv.reset()
    obs1, rews1, _, _ = venv.step(np.ones(N_ENVS, dtype=np.int64))
    keep = obs1.copy(), rews1.copy()
    obs2, _, _, _ = venv.step(np.ones(N_ENVS, dtype=np.int64))
    np.testing.assert_array_equal(obs1, keep[0])  # a later step did not overwrite our arrays
    np.testing.assert_array_equal(rews1, keep[1])
    assert not np.array_equal(obs1, obs2)


# --------------------------------------------------------------------------- attributes and methods
def wrapped_fns() -> list[Callable[[], gym.Env[Any, Any]]]:
    """Envs 0 and 2 wrapped in TimeLimit, 1 and 3 not."""

    def make(i: int) -> gym.Env[Any, Any]:
        env: gym.Env[Any, Any] = CountingEnv(horizon=10 + i)
        return gym.wrappers.TimeLimit(env, max_episode_steps=50) if i % 2 == 0 else env

    return [functools.partial(make, i) for i in range(N_ENVS)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_get_set_attr_env_method_is_wrapped(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, wrapped_fns())
    venv.reset()
    assert venv.get_attr("horizon") == [10, 11, 12, 13]
    assert venv.get_attr("horizon", indices=2) == [12]
    assert venv.get_attr("horizon", indices=[3, 0]) == [13, 10]
    assert venv.get_attr("horizon", indices=-1) == [13]
    assert venv.get_attr("horizon", indices=[-4, -2]) == [10, 12]
    assert venv.get_attr("horizon", indices=range(1, 3)) == [11, 12]

    venv.set_attr("horizon", 3)
    assert venv.get_attr("horizon") == [3, 3, 3, 3]
    venv.set_attr("horizon", 7, indices=[1, -1])
    venv.set_attr("horizon", 9, indices=0)
    assert venv.get_attr("horizon") == [9, 7, 3, 7]
    # on the unwrapped envs 1 and 3 the attribute set is the one the env uses: they now
    # truncate after 7 steps (on 0 and 2, setattr lands on the TimeLimit wrapper, as in SB3)
    venv.reset()
    dones = [venv.step(np.zeros(N_ENVS, dtype=np.int64))[2] for _ in range(7)]
    assert [bool(d[1]) for d in dones] == [False] * 6 + [True]
    assert [bool(d[3]) for d in dones] == [False] * 6 + [True]

    assert venv.env_method("double", 4) == [8, 8, 8, 8]
    assert venv.env_method("double", 4, scale=0.5, indices=[2, -1]) == [4.0, 4.0]
    assert venv.env_method("double", x=1, scale=3.0, indices=1) == [6.0]
    assert venv.env_method("render", indices=[0])[0].shape == (4, 4, 3)

    assert venv.env_is_wrapped(gym.wrappers.TimeLimit) == [True, False, True, False]
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=[1, 2]) == [False, True]
    assert venv.env_is_wrapped(gym.wrappers.TimeLimit, indices=-2) == [True]
    assert venv.env_is_wrapped(gym.wrappers.RecordEpisodeStatistics) == [False] * N_ENVS

    assert venv.has_attr("horizon")
    assert not venv.has_attr("no_such_attribute")
    if backend == "subproc":
        return  # SubprocVecEnv's worker process dies on an env exception; the others re-raise it
    with pytest.raises(AttributeError):
        venv.get_attr("no_such_attribute")
    with pytest.raises(AttributeError):
        venv.env_method("no_such_method")


@pytest.mark.parametrize("backend", BACKENDS)
def test_env_method_changes_state_per_env(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    venv.reset()
    venv.step(np.ones(N_ENVS, dtype=np.int64))
    assert venv.env_method("scaled", 1.0, scale=2.0) == [4.0] * N_ENVS
    assert venv.env_method("scaled", 0.5, indices=[-1, 0]) == [1.5, 1.5]


# --------------------------------------------------------------------------- rendering
@pytest.mark.parametrize("backend", BACKENDS)
def test_render_and_get_images(backend: str, vec_factory: Any) -> None:
    fns = space_fns("box", render_mode="rgb_array")
    venv = vec_factory(backend, fns)
    assert venv.render_mode == "rgb_array"
    venv.seed(3)
    venv.reset()
    images = venv.get_images()
    bases = [i["base"] for i in venv.reset_infos]
    assert len(images) == N_ENVS
    for img, base in zip(images, bases, strict=True):
        assert img.shape == (6, 5, 3) and img.dtype == np.uint8
        assert np.all(img == base % 256)
    tiled = venv.render()
    assert tiled is not None and tiled.shape == (12, 10, 3)  # 4 images tiled 2x2
    ref = vec_factory("dummy", fns)
    ref.seed(3)
    ref.reset()
    np.testing.assert_array_equal(tiled, ref.render())


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_render_mode(backend: str, vec_factory: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    assert venv.render_mode is None
    assert venv.get_attr("render_mode") == [None] * N_ENVS
    with pytest.warns(UserWarning):
        assert venv.get_images() == [None] * N_ENVS


# --------------------------------------------------------------------------- close
def closing_fns(directory: Path, n: int = N_ENVS) -> list[Callable[[], gym.Env[Any, Any]]]:
    """``space_fns("box")`` whose envs append a line to ``directory/closed-<i>`` each time they close.

    The class is made inside this function, so that cloudpickle sends it to the workers
    by value (the workers do not import this test module).
    """

    class ClosingEnv(SpaceEnv):
        def __init__(self, index: int, **kwargs: Any) -> None:
            super().__init__("box", **kwargs)
            self.index = index

        def close(self) -> None:
            with open(directory / f"closed-{self.index}", "a") as f:
                f.write(f"{os.getpid()}\n")
            super().close()

    return [functools.partial(ClosingEnv, i, horizon=4, terminate_at=(2 + i if i % 2 == 0 else None)) for i in range(n)]


def env_closes(directory: Path, n: int = N_ENVS) -> list[int]:
    """How many times each env closed, once every env has closed at least once (30 s at most)."""

    def counts() -> list[int]:
        files = [directory / f"closed-{i}" for i in range(n)]
        return [len(f.read_text().splitlines()) if f.exists() else 0 for f in files]

    deadline = time.monotonic() + 30
    while 0 in counts() and time.monotonic() < deadline:
        time.sleep(0.05)  # the groups close their envs after close() returned, on the workers
    return counts()


def check_closed(backend: str, venv: VecEnv, directory: Path) -> None:
    """What a closed vec env of ``backend`` must show: its envs closed once, nothing left running."""
    closes = env_closes(directory)
    if backend == "dummy":  # DummyVecEnv closes its envs again on each close(): gymnasium allows it
        assert all(c >= 1 for c in closes), closes
        return
    assert closes == [1] * N_ENVS, f"times each env was closed: {closes}"
    assert isinstance(venv, (SubprocVecEnv, DaskVecEnv)) and venv.closed
    if isinstance(venv, SubprocVecEnv):
        assert not any(p.is_alive() for p in venv.processes)  # close() joined its processes
    else:
        with pytest.raises(ClosedEnvError):
            venv.step(np.zeros(N_ENVS, dtype=np.int64))
        with pytest.raises(ClosedEnvError):
            venv.get_attr("t")


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_twice(backend: str, vec_factory: Any, tmp_path: Path) -> None:
    venv = vec_factory(backend, closing_fns(tmp_path))
    venv.reset()
    venv.step(np.zeros(N_ENVS, dtype=np.int64))
    assert not list(tmp_path.glob("closed-*"))  # nothing closed before close()
    venv.close()
    venv.close()
    check_closed(backend, venv, tmp_path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_close_while_step_in_flight(backend: str, vec_factory: Any, tmp_path: Path) -> None:
    venv = vec_factory(backend, closing_fns(tmp_path))
    venv.reset()
    venv.step_async(np.zeros(N_ENVS, dtype=np.int64))
    venv.close()
    check_closed(backend, venv, tmp_path)
    venv.close()


@pytest.mark.parametrize("backend", DASK_BACKENDS)
def test_groups_name_their_channels(backend: str, vec_factory: Any) -> None:
    """Each group's entry says where its channel goes (address, socket path) and whether it is encrypted."""
    venv = vec_factory(backend, space_fns("box"))
    html = venv._repr_html_()
    for g in venv.groups:
        check_channel(g)
        if g["transport"] == "direct":
            assert g["address"] is not None  # the TCP listener, which a firewall must let through
        # the notebook view shows it too
        assert f"{g['channel'] or 'actor calls'} (not encrypted)" in html, (g, html)


@pytest.mark.parametrize("backend", DASK_BACKENDS)
def test_close_releases_the_actors(backend: str, vec_factory: Any, dclient: Any) -> None:
    venv = vec_factory(backend, space_fns("box"))
    keys = {g["key"] for g in venv.groups}

    def held(dask_scheduler: Any) -> list[str]:
        return [str(ts.key) for ws in dask_scheduler.workers.values() for ts in ws.actors]

    assert keys <= set(dclient.run_on_scheduler(held))
    venv.step_async(np.zeros(N_ENVS, dtype=np.int64))
    venv.close()
    deadline = 30.0
    t0 = time.monotonic()
    while keys & set(dclient.run_on_scheduler(held)):
        assert time.monotonic() - t0 < deadline, "actors still held after close()"
        time.sleep(0.1)
    # the cluster itself was not closed: DaskVecEnv did not create it
    assert len(scheduler_workers(dclient)) == 2


# --------------------------------------------------------------------------- SB3 wrappers
def _wrapper_stacks(tmp_path: Path) -> dict[str, Callable[[VecEnv], VecEnv]]:
    from stable_baselines3.common.vec_env import (
        VecFrameStack,
        VecMonitor,
        VecNormalize,
        VecTransposeImage,
    )

    return {
        "normalize": lambda v: VecNormalize(v, norm_obs=True, norm_reward=True),
        "framestack": lambda v: VecFrameStack(v, n_stack=3),
        "monitor": lambda v: VecMonitor(v),
        "transpose": lambda v: VecTransposeImage(v),
    }


@pytest.mark.parametrize("wrapper", ["normalize", "framestack", "monitor", "transpose"])
@pytest.mark.parametrize("backend", ["dask-2w-1per-direct", "dask-1w-3per-actor"])
def test_sb3_wrappers_match_dummy(backend: str, wrapper: str, vec_factory: Any, tmp_path: Path) -> None:
    kind = "image" if wrapper == "transpose" else "box"
    wrap = _wrapper_stacks(tmp_path)[wrapper]
    venv = wrap(vec_factory(backend, space_fns(kind)))
    ref = wrap(vec_factory("dummy", space_fns(kind)))
    actions = random_actions(venv.action_space, N_ENVS, 9, seed=1)
    got, want = run(venv, actions, seed=9), run(ref, actions, seed=9)
    if wrapper == "monitor":  # episode infos carry wall-clock times: compare returns and lengths only
        for out in (got, want):
            for step in out[2:]:
                for info in step[3]:
                    if "episode" in info:
                        info["episode"] = {k: info["episode"][k] for k in ("r", "l")}
        assert any("episode" in i for step in got[2:] for i in step[3])
    assert_same(got, want, f"{backend}+{wrapper}")
    if wrapper == "transpose":
        assert got[0].shape == (N_ENVS, 3, 8, 8)
    if wrapper == "framestack":
        assert got[0].shape == (N_ENVS, 9)
    venv.close()


def record_video(venv: VecEnv, directory: Path, length: int) -> list[np.ndarray]:
    """Record ``venv`` with SB3's VecVideoRecorder from its first step and decode the video file."""
    import imageio_ffmpeg
    from stable_baselines3.common.vec_env import VecVideoRecorder

    venv.seed(5)
    rec = VecVideoRecorder(
        venv, str(directory), record_video_trigger=lambda step: step == 0, video_length=length, name_prefix="clip"
    )
    rec.reset()
    for step in range(length + 2):  # past the end of the clip: it is written once complete
        rec.step(np.full(N_ENVS, step % 2, dtype=np.int64))
    rec.close()
    (video,) = directory.glob("clip*.mp4")
    reader = imageio_ffmpeg.read_frames(str(video))
    width, height = next(reader)["size"]  # the first item is the metadata
    return [np.frombuffer(f, dtype=np.uint8).reshape(height, width, 3) for f in reader]


@pytest.mark.parametrize("backend", ["dask-2w-1per-direct", "dask-2w-actor"])
def test_vec_video_recorder(backend: str, vec_factory: Any, tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    pytest.importorskip("imageio_ffmpeg")
    length = 10
    venv = vec_factory(backend, space_fns("box", render_mode="rgb_array"))
    ref = vec_factory("dummy", space_fns("box", render_mode="rgb_array"))
    shape = ref.render().shape  # the envs' frames tiled 2 by 2: (12, 10, 3)
    got = record_video(venv, tmp_path / "dask", length)
    want = record_video(ref, tmp_path / "dummy", length)
    # SB3 records the frame after reset and one after each step, until it has length + 1
    assert len(got) == len(want) == length + 1, (len(got), len(want))
    assert all(f.shape == shape for f in got), [f.shape for f in got]
    assert len({f.tobytes() for f in want}) > 1  # the picture changes from step to step
    # the same frames went into the same encoder: the same video, up to the codec's rounding
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        diff = np.abs(a.astype(int) - b.astype(int)).max()
        assert diff <= 2, f"frame {i} differs from DummyVecEnv's by up to {diff}"
