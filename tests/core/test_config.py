"""daskvec's section of Dask's config, and SubprocVecEnv's keywords.

Config precedence is checked with a real YAML file read by ``dask.config.refresh``, real
environment variables, and keyword arguments, through ``DaskVecEnv`` on the session's
2-process ``LocalCluster``. The worker-side key (``busy-poll``) is set in one worker
process's own config, and read back from the groups the workers built.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest
import yaml
from envs import CountingEnv
from stable_baselines3.common.env_util import make_vec_env

from daskvec import config
from daskvec._core.dask_internals import scheduler_workers
from daskvec._core.options import Options
from daskvec.sb3.vec_env import DaskVecEnv


def counting(n: int = 2) -> list[Any]:
    return [functools.partial(CountingEnv) for _ in range(n)]


@pytest.fixture
def dask_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Any]:
    """``load(yaml_dict, **env)``: Dask's config read again from a YAML file in a temporary
    directory and from ``DASK_*`` environment variables; restored afterwards."""

    def load(values: dict[str, Any] | None = None, **env: str) -> None:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        if values is not None:
            (tmp_path / "site.yaml").write_text(yaml.safe_dump(values))
        dask.config.refresh(paths=[str(tmp_path)])

    yield load
    monkeypatch.undo()
    dask.config.refresh()


def test_shipped_defaults_are_the_options_defaults() -> None:
    shipped = yaml.safe_load(Path(config.DEFAULTS_FILE).read_text())["daskvec"]
    assert dask.config.get("daskvec") == shipped  # registered as Dask defaults
    defaults = Options()
    for key, value in shipped.items():
        name = key.replace("-", "_")
        if name == "busy_poll":
            # the workers read it: the client leaves it to them
            assert defaults.busy_poll is None and Options.create().busy_poll is None
            assert value == 0.002
        elif name == "shared_memory":
            # no option: each worker reads it for its groups (config.worker_shared_memory)
            assert not hasattr(defaults, name) and value is True and config.worker_shared_memory() is True
        else:
            assert getattr(defaults, name) == value, key
    assert Options.create() == defaults


def test_yaml_then_environment_then_keyword(dask_config: Any, client2: Any) -> None:
    dask_config({"daskvec": {"step-timeout": 30, "on-env-error": "restart", "migrate-before": "2 minutes"}})
    with DaskVecEnv(counting(), client=client2) as venv:
        assert venv.options.step_timeout == 30  # the YAML file over the shipped default
        assert venv.options.on_env_error == "restart"
        assert venv.options.migrate_before == 120  # a Dask time string
        assert venv.options.timeout == 300  # untouched keys keep the shipped default
    dask_config(DASK_DASKVEC__STEP_TIMEOUT="45", DASK_DASKVEC__MAX_RESTARTS="3")
    opts = Options.create()
    assert opts.step_timeout == 45  # the environment variable over the YAML file
    assert opts.on_env_error == "restart" and opts.max_restarts == 3  # the YAML file still counts
    with DaskVecEnv(counting(), client=client2, step_timeout=60, on_env_error="raise") as venv:
        assert venv.options.step_timeout == 60  # the keyword over both
        assert venv.options.on_env_error == "raise"
        assert venv.options.max_restarts == 3


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"DASK_DASKVEC__ON_WORKER_LOST": "ignore"}, "daskvec.on-worker-lost"),
        ({"DASK_DASKVEC__TIMEOUT": "soon"}, "daskvec.timeout"),
        ({"DASK_DASKVEC__CONNECT_TIMEOUT": "0"}, "daskvec.connect-timeout"),
        ({"DASK_DASKVEC__ENVS_PER_ACTOR": "0"}, "daskvec.envs-per-actor"),
        ({"DASK_DASKVEC__AUTO_REBALANCE": "sometimes"}, "daskvec.auto-rebalance"),
    ],
)
def test_bad_config_value_names_the_key(dask_config: Any, client2: Any, env: dict[str, str], key: str) -> None:
    dask_config(**env)
    with pytest.raises((ValueError, TypeError), match=key) as info:
        DaskVecEnv(counting(), client=client2)
    assert next(iter(env)) in str(info.value)  # and says which variable sets it
    # a keyword overrides the bad value
    name = key.split(".")[1].replace("-", "_")
    good = {
        "on_worker_lost": "raise",
        "timeout": 10,
        "envs_per_actor": 1,
        "auto_rebalance": False,
        "connect_timeout": 2,
    }[name]
    assert getattr(Options.create(**{name: good}), name) == good


def test_bad_yaml_value_names_the_key(dask_config: Any) -> None:
    dask_config({"daskvec": {"transport": "carrier-pigeon"}})
    with pytest.raises(ValueError, match=r"daskvec\.transport must be one of .*'carrier-pigeon'"):
        Options.create()


def test_keywords_still_checked_and_unknown_options_refused() -> None:
    with pytest.raises(ValueError, match="step_timeout"):
        Options.create(step_timeout=-1)
    with pytest.raises(TypeError, match=r"unknown option\(s\) \['steptimeout'\]"):
        Options.create(steptimeout=1)


def _set_worker_busy_poll(value: Any) -> Any:
    """On a worker: set ``daskvec.busy-poll`` in its own global config; return the old value."""
    import dask

    import daskvec.config  # noqa: F401  (the defaults, so that the old value is the worker's real one)

    old = dask.config.get("daskvec.busy-poll")
    dask.config.set({"daskvec.busy-poll": value})
    return old


@pytest.fixture
def worker_config(client2: Any) -> Iterator[Any]:
    """``set_busy_poll(worker, value)`` in one worker's own config; restored afterwards."""
    saved: dict[str, Any] = {}

    def set_busy_poll(worker: str, value: Any) -> None:
        old = client2.run(_set_worker_busy_poll, value, workers=[worker])[worker]
        saved.setdefault(worker, old)

    yield set_busy_poll
    for worker, old in saved.items():
        client2.run(_set_worker_busy_poll, old, workers=[worker])


def test_workers_read_busy_poll_from_their_own_config(client2: Any, worker_config: Any) -> None:
    a, b = sorted(scheduler_workers(client2))
    worker_config(a, 0.0)  # only worker a's process: the client's config keeps the default
    with DaskVecEnv(counting(), client=client2, envs_per_actor=1, transport="direct") as venv:
        polls = {g["worker"]: g["busy_poll"] for g in venv.groups}
        assert polls == {a: 0.0, b: 0.002}
        venv.reset()
        venv.step(np.zeros(2, dtype=np.int64))
    # a keyword wins over every worker's config
    with DaskVecEnv(counting(), client=client2, envs_per_actor=1, transport="direct", busy_poll=0.001) as venv:
        assert {g["worker"]: g["busy_poll"] for g in venv.groups} == {a: 0.001, b: 0.001}
    # a worker whose config is wrong says so, naming the key and the worker
    worker_config(a, 0.5)
    with pytest.raises(ValueError, match=rf"daskvec\.busy-poll on worker {a} must be .* not 0\.5"):
        DaskVecEnv(counting(), client=client2, envs_per_actor=1, transport="direct", workers=[a])


# --------------------------------------------------------------------------- SubprocVecEnv keywords
def test_make_vec_env_with_subproc_keywords(client2: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """SB3's tests/test_utils.py::test_custom_vec_env, with DaskVecEnv in place of SubprocVecEnv."""
    caplog.set_level(logging.INFO, logger="daskvec")
    monitor_dir = tmp_path / "test_make_vec_env"
    env = make_vec_env(
        "CartPole-v1",
        n_envs=2,
        monitor_dir=str(monitor_dir),
        seed=0,
        vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]  # SB3 annotates its own two only
        vec_env_kwargs={"start_method": "fork", "client": client2},
    )
    try:
        assert isinstance(env, DaskVecEnv) and env.num_envs == 2
        env.reset()
        env.step(np.zeros(2, dtype=np.int64))
        # SB3's factories were called on the workers: each wrote its Monitor file there
        assert os.path.isdir(monitor_dir)
        assert sorted(p.name for p in monitor_dir.iterdir()) == ["0.monitor.csv", "1.monitor.csv"]
    finally:
        env.close()
    said = [r for r in caplog.records if "start_method" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in said]
    assert said[0].levelno == logging.INFO
    assert "start_method='fork'" in said[0].getMessage() and "Dask workers" in said[0].getMessage()
    # SubprocVecEnv's own default (None) is not worth a line
    caplog.clear()
    with DaskVecEnv(counting(), client=client2, start_method=None):
        assert not [r for r in caplog.records if "start_method" in r.getMessage()]
    # a keyword that no vec env knows is still an error that names it
    with pytest.raises(TypeError, match="start_methd"):
        make_vec_env(
            "CartPole-v1",
            n_envs=1,
            vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]
            vec_env_kwargs={"start_methd": "fork", "client": client2},
        )
