"""``daskvec zoo`` trains an RL Zoo configuration with its envs on a Dask cluster.

The command runs in a process of its own, as users run it: importing ``rl_zoo3`` replaces
``gymnasium.wrappers.TimeLimit`` with the zoo's own subclass for the whole process
(``rl_zoo3/gym_patches.py``), which must not leak into the other tests of this session
(``env_is_wrapped(gym.wrappers.TimeLimit)`` would then send the zoo's class).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ZOO = importlib.util.find_spec("rl_zoo3")
if ZOO is None:
    pytest.skip("rl_zoo3 is not installed (pip install -e '.[zoo]')", allow_module_level=True)


def zoo_hyperparams(algo: str, env_id: str) -> dict[str, Any]:
    """The zoo's own tuned hyperparameters, read from the file it ships (without importing the zoo)."""
    assert ZOO is not None and ZOO.origin is not None
    path = Path(ZOO.origin).parent / "hyperparams" / f"{algo}.yml"
    return dict(yaml.safe_load(path.read_text())[env_id])


def daskvec_zoo(args: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``daskvec zoo ARGS`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "daskvec.cli", "zoo", *args], cwd=cwd, capture_output=True, text=True, timeout=220
    )


@pytest.mark.timeout(240)
def test_zoo_trains_ppo_on_cartpole_from_the_zoos_hyperparameters(cluster2: Any, tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    logs = tmp_path / "logs"
    # a relative log folder (-f logs), as users give it; the workers' cwd is elsewhere
    proc = daskvec_zoo(
        [
            "--scheduler",
            cluster2.scheduler_address,  # daskvec's options ...
            "--algo",
            "ppo",
            "--env",
            "CartPole-v1",
            "-n",
            "2048",
            "--eval-freq",
            "-1",  # ... the zoo's
            "-f",
            "logs",
            "--seed",
            "3",
            "--device",
            "cpu",
            "--num-threads",
            "1",
        ],
        cwd=tmp_path,
    )
    out = proc.stdout
    assert proc.returncode == 0, (out, proc.stderr[-3000:])
    (experiment,) = (logs / "ppo").iterdir()
    assert f"daskvec zoo: experiment saved in {experiment}" in out
    tuned = zoo_hyperparams("ppo", "CartPole-v1")
    model = PPO.load(experiment / "CartPole-v1.zip", device="cpu")
    assert model.num_timesteps >= 2048
    assert model.n_envs == tuned["n_envs"] == 8
    assert (model.n_steps, model.batch_size, model.n_epochs) == (
        tuned["n_steps"],
        tuned["batch_size"],
        tuned["n_epochs"],
    )
    assert model.gamma == pytest.approx(tuned["gamma"])
    # the envs' Monitor files, written by the workers into the experiment's folder
    assert len(list(experiment.glob("*.monitor.csv"))) == 8
    # the zoo's log table has daskvec's figures: the envs were in a DaskVecEnv on the 2 workers
    assert re.search(r"^\| daskvec/\s+\|", out, re.M), out
    assert re.search(r"^\|\s+workers\s+\|\s+2\s+\|$", out, re.M), out
    assert re.search(r"^\|\s+env_steps_per_s\s+\|\s+[1-9]", out, re.M), out


@pytest.mark.processes
def test_zoo_refuses_n_workers_with_a_scheduler() -> None:
    proc = daskvec_zoo(["--scheduler", "tcp://127.0.0.1:1", "--n-workers", "2", "--algo", "ppo"])
    assert proc.returncode == 1
    assert "--n-workers sizes the embedded cluster" in proc.stderr


def test_zoo_reports_its_own_errors(cluster2: Any) -> None:
    proc = daskvec_zoo(["--scheduler", cluster2.scheduler_address, "--algo", "ppo", "--env", "CartPol-v1"])
    assert proc.returncode == 1
    assert "daskvec zoo: CartPol-v1 not found in gym registry, you maybe meant CartPole-v1" in proc.stderr
