"""Issue 14 (part 5): ``daskvec zoo`` trains an RL Zoo configuration with its envs on a Dask cluster."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from daskvec import cli

rl_zoo3 = pytest.importorskip("rl_zoo3", reason="rl_zoo3 is not installed (pip install -e '.[zoo]')")


@pytest.fixture(autouse=True)
def daskvec_logging_restored() -> Iterator[None]:
    """cli.main sets up daskvec's logger for a terminal; other tests' caplog needs it as it was."""
    log = logging.getLogger("daskvec")
    level, propagate, handlers = log.level, log.propagate, list(log.handlers)
    yield
    log.setLevel(level)
    log.propagate = propagate
    log.handlers[:] = handlers


def zoo_hyperparams(algo: str, env_id: str) -> dict[str, Any]:
    """The zoo's own tuned hyperparameters, read from the file it ships."""
    path = Path(rl_zoo3.__file__).parent / "hyperparams" / f"{algo}.yml"
    return dict(yaml.safe_load(path.read_text())[env_id])


@pytest.mark.timeout(240)
def test_zoo_trains_ppo_on_cartpole_from_the_zoos_hyperparameters(
    cluster2: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from stable_baselines3 import PPO

    monkeypatch.chdir(tmp_path)  # a relative log folder, as users give it; the workers' cwd is elsewhere
    logs = tmp_path / "logs"
    code = cli.main(["zoo", "--scheduler", cluster2.scheduler_address,  # daskvec's options ...
                     "--algo", "ppo", "--env", "CartPole-v1", "-n", "2048", "--eval-freq", "-1",  # ... the zoo's
                     "-f", "logs", "--seed", "3", "--device", "cpu", "--num-threads", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    (experiment,) = (logs / "ppo").iterdir()
    assert f"daskvec zoo: experiment saved in {experiment}" in out
    tuned = zoo_hyperparams("ppo", "CartPole-v1")
    model = PPO.load(experiment / "CartPole-v1.zip", device="cpu")
    assert model.num_timesteps >= 2048
    assert model.n_envs == tuned["n_envs"] == 8
    assert (model.n_steps, model.batch_size, model.n_epochs) == (tuned["n_steps"], tuned["batch_size"],
                                                                 tuned["n_epochs"])
    assert model.gamma == pytest.approx(tuned["gamma"])
    # the envs' Monitor files, written by the workers into the experiment's folder
    assert len(list(experiment.glob("*.monitor.csv"))) == 8
    # the zoo's log table has daskvec's figures: the envs were in a DaskVecEnv on the 2 workers
    assert re.search(r"^\| daskvec/\s+\|", out, re.M), out
    assert re.search(r"^\|\s+workers\s+\|\s+2\s+\|$", out, re.M), out
    assert re.search(r"^\|\s+env_steps_per_s\s+\|\s+[1-9]", out, re.M), out


def test_zoo_refuses_n_workers_with_a_scheduler(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["zoo", "--scheduler", "tcp://127.0.0.1:1", "--n-workers", "2", "--algo", "ppo"])
    assert code == 1
    assert "--n-workers sizes the embedded cluster" in capsys.readouterr().err


def test_zoo_reports_its_own_errors(cluster2: Any, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["zoo", "--scheduler", cluster2.scheduler_address, "--algo", "ppo", "--env", "CartPol-v1"])
    assert code == 1
    assert "daskvec zoo: CartPol-v1 not found in gym registry, you maybe meant CartPole-v1" in capsys.readouterr().err
