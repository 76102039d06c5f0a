"""The ``daskvec`` command, run as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path
from typing import Any

import pytest
from scripted_envs import random_cartpole_return

from daskvec import cli

#: Every test here starts processes (scripts, `dask` commands, clusters).
pytestmark = pytest.mark.processes

#: Short PPO rollouts so that a couple of thousand steps make several updates.
SMALL_PPO = ["--hyperparams", "n_steps=64", "batch_size=64", "n_epochs=2"]


def run_cli(args: list[str], cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return subprocess.run(
        [sys.executable, "-m", "daskvec.cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def run_cli_fetching_page(
    args: list[str], cwd: Path, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], dict[str, int]]:
    """Run the CLI; while it runs, GET the daskvec page it prints. Returns the run and ``{url: status}``."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "daskvec.cli", *args]
    fetched: dict[str, int] = {}
    lines: list[str] = []
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # until the CLI exits (pytest-timeout bounds a silent hang)
                lines.append(line)
                page = re.fullmatch(r"daskvec page: (http://\S+)", line.strip())
                if page and proc.poll() is None:
                    try:
                        with urllib.request.urlopen(page.group(1), timeout=30) as r:
                            fetched[page.group(1)] = r.status
                    except urllib.error.HTTPError as e:
                        fetched[page.group(1)] = e.code
            proc.wait(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=30)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), err.read()), fetched


def untrained_return(seed: int, episodes: int = 3) -> float:
    """What the CLI would evaluate for PPO(seed=seed) before any training (some seeds' nets balance by chance)."""
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    eval_env = Monitor(gym.make("CartPole-v1"))
    try:
        model = PPO("MlpPolicy", eval_env, device="cpu", seed=seed)
        eval_env.reset(seed=seed + 10_000)  # as the CLI does
        rewards, _ = evaluate_policy(
            model, eval_env, n_eval_episodes=episodes, deterministic=True, return_episode_rewards=True
        )
    finally:
        eval_env.close()
    return float(sum(rewards)) / episodes


def check_train_output(proc: subprocess.CompletedProcess[str], model: Path, n_envs: int, seed: int) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    m = re.search(r"^daskvec: (\d+) x CartPole-v1 in (\d+) actors on (\d+) workers", out, re.M)
    assert m and int(m.group(1)) == n_envs, out
    dash = re.search(r"^Dask dashboard: (http://\S+)$", out, re.M)
    assert dash, out
    rate = re.search(
        r"^trained PPO for (\d+) env steps in [\d.]+ s: (\d+) env-steps/s overall; "
        r"stepping the envs: (\d+) env-steps/s \((\d+)% of the run\)$",
        out,
        re.M,
    )
    assert rate and int(rate.group(1)) >= 2000 and int(rate.group(2)) > 0, out
    # the envs step faster than the whole run, which also trains the policy
    assert int(rate.group(3)) > int(rate.group(2)) and 0 < int(rate.group(4)) < 100, out
    reward = re.search(r"^evaluated mean reward: ([\d.]+) \+/- [\d.]+ over 3 episodes$", out, re.M)
    # trained, not any policy: random play scores ~23, and the untrained policy of each seed
    # used here 9, while 2,048 PPO steps reach 142 (seed 5) and 116 (seed 2)
    threshold = 3 * random_cartpole_return()
    assert untrained_return(seed) < threshold, "this seed's untrained policy already plays well: pick another"
    assert reward and float(reward.group(1)) >= threshold, (threshold, out)
    assert f"saved model to {model}" in out
    assert model.is_file()
    with zipfile.ZipFile(model) as z:
        assert "policy.pth" in z.namelist()
    from stable_baselines3 import PPO

    loaded = PPO.load(model, device="cpu")
    assert loaded.observation_space.shape == (4,)
    assert loaded.num_timesteps == int(rate.group(1))
    return {"actors": int(m.group(2)), "workers": int(m.group(3)), "dashboard": dash.group(1)}


def tensorboard_scalars(log_dir: Path) -> dict[str, list[float]]:
    """The scalars SB3 wrote under ``log_dir`` (one run), by tag."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (run,) = [p for p in log_dir.iterdir() if p.is_dir()]
    acc = event_accumulator.EventAccumulator(str(run))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.timeout(300)
def test_train_on_embedded_cluster(tmp_path: Path) -> None:
    model = tmp_path / "ppo_cartpole.zip"
    tb = tmp_path / "tb"
    proc, fetched = run_cli_fetching_page(
        [
            "train",
            "CartPole-v1",
            "--timesteps",
            "2000",
            "--n-envs",
            "4",
            "--seed",
            "5",
            "--eval-episodes",
            "3",
            "--save",
            str(model),
            "--tensorboard-log",
            str(tb),
            *SMALL_PPO,
        ],
        tmp_path,
    )
    facts = check_train_output(proc, model, n_envs=4, seed=5)
    assert facts["workers"] >= 1
    # the printed daskvec page answered while the CLI ran (no dead dashboard link)
    assert fetched == {facts["dashboard"].rsplit("/", 1)[0] + "/daskvec": 200}, (fetched, proc.stdout)
    # daskvec's figures are in SB3's TensorBoard logs, one per rollout of 64 x 4 steps
    assert f"TensorBoard logs (daskvec/* figures included) in {tb}" in proc.stdout
    scalars = tensorboard_scalars(tb)
    assert len(scalars["daskvec/env_steps_per_s"]) == 8 and min(scalars["daskvec/env_steps_per_s"]) > 0
    assert scalars["daskvec/workers"][-1] == facts["workers"]
    # quiet by default: no INFO lines from daskvec
    assert " INFO daskvec" not in proc.stderr


@pytest.mark.timeout(300)
def test_train_against_scheduler(dask_processes: Any, tmp_path: Path) -> None:
    procs = dask_processes(2)
    model = tmp_path / "model.zip"
    proc = run_cli(
        [
            "train",
            "CartPole-v1",
            "--timesteps",
            "2000",
            "--n-envs",
            "4",
            "--envs-per-actor",
            "1",
            "--scheduler",
            procs.address,
            "--seed",
            "2",
            "--eval-episodes",
            "3",
            "--save",
            str(model),
            "--verbose",
            "--no-progress",
            *SMALL_PPO,
        ],
        tmp_path,
    )
    facts = check_train_output(proc, model, n_envs=4, seed=2)
    assert facts["actors"] == 4 and facts["workers"] == 2
    # a standalone scheduler without --preload daskvec.dashboard: its /status is linked, and the
    # missing daskvec page is explained, not linked
    assert "daskvec page: not served: the scheduler does not serve the daskvec page" in proc.stdout
    assert "/daskvec" not in proc.stdout
    with urllib.request.urlopen(facts["dashboard"], timeout=30) as r:
        assert r.status == 200
    assert " INFO daskvec" in proc.stderr  # --verbose shows daskvec's INFO logs
    # the CLI did not shut down a scheduler it did not start
    assert procs.scheduler.poll() is None
    assert all(w.poll() is None for w in procs.workers)


def _run_on_a_terminal(args: list[str], cwd: Path, timeout: float) -> tuple[int, str]:
    """Run ``args`` with a pseudo-terminal as stdout and stderr: (exit code, what it showed, escapes removed)."""
    import pty
    import select

    main, child = pty.openpty()
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=dict(os.environ, OMP_NUM_THREADS="1", COLUMNS="160", TERM="xterm"),
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
    )
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([main], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(main, 1 << 16)
            except OSError:  # EIO: every writer of the terminal has closed it
                break
            if not data:
                break
            chunks.append(data)
        code = proc.wait(timeout=max(deadline - time.monotonic(), 1.0))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(main)
    text = b"".join(chunks).decode(errors="replace")
    return code, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07", "", text).replace("\r", "\n")


@pytest.mark.timeout(300)
def test_train_progress_bar_on_a_terminal_counts_the_steps_the_run_takes_and_ends_with_it(tmp_path: Path) -> None:
    """On a terminal the bar counts against the whole rollouts PPO collects, and its last state is the run's end.

    PPO with 2 envs and ``n_steps=64`` collects rollouts of 128 steps: 3 of them, 384
    steps, for the 300 asked. The bar's last state is drawn when ``learn()`` has
    returned, after the last policy update, before the summary line.
    """
    code, text = _run_on_a_terminal(
        [
            sys.executable,
            "-m",
            "daskvec.cli",
            "train",
            "CartPole-v1",
            "--timesteps",
            "300",
            "--n-envs",
            "2",
            "--eval-episodes",
            "0",
            *SMALL_PPO,
        ],
        tmp_path,
        timeout=240,
    )
    assert code == 0, text
    summary = text.index("trained PPO for 384 env steps")
    bar_states = [line for line in text[:summary].splitlines() if "━" in line]
    assert bar_states, text
    counts = [re.search(r"([\d,]+)/([\d,]+)", line) for line in bar_states]
    assert all(counts) and {m[2] for m in counts if m} == {"384"}, text  # never the 300 asked
    last = bar_states[-1].strip()
    assert re.search(r"^done\s.*384/384 env steps", last), last  # drawn when learn() had returned
    assert not any(line.strip().startswith("done") for line in text[summary:].splitlines()), text


@pytest.mark.timeout(300)
def test_train_prints_progress_lines_when_its_output_is_not_a_terminal(tmp_path: Path) -> None:
    """With the output in a file (or a pipe, as here) there is no progress bar: a line every interval instead."""
    out_file = tmp_path / "train.log"
    with out_file.open("w") as out:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "daskvec.cli",
                "train",
                "CartPole-v1",
                "--timesteps",
                "3000",
                "--n-envs",
                "2",
                "--eval-episodes",
                "0",
                "--progress-interval",
                "0.5",
                *SMALL_PPO,
            ],
            cwd=tmp_path,
            env=dict(os.environ, OMP_NUM_THREADS="1"),
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=240,
        )
    text = out_file.read_text()
    assert proc.returncode == 0, text + proc.stderr
    progress = re.findall(
        # PPO collects whole rollouts of 64 x 2 steps: 24 of them, 3072 steps, for the 3000 asked
        r"^progress: (\d+)/3072 env steps \((\d+)%\), (\d+) env-steps/s overall, "
        r"(\d+) env-steps/s stepping the envs, ETA (\d+) s$",
        text,
        re.M,
    )
    assert progress, text
    done = [int(p[0]) for p in progress]
    assert done == sorted(done) and all(0 < d <= 3072 for d in done), text
    assert all(int(p[1]) <= 100 for p in progress), text
    assert all(int(p[3]) > 0 for p in progress), text
    assert "━" not in text and "it/s" not in text, text  # no progress bar in a file
    assert re.search(
        r"^trained PPO for 3072 env steps in [\d.]+ s: \d+ env-steps/s overall; stepping the envs: "
        r"\d+ env-steps/s \(\d+% of the run\)$",
        text,
        re.M,
    ), text
    # --no-progress: neither the bar nor the lines
    proc = run_cli(
        [
            "train",
            "CartPole-v1",
            "--timesteps",
            "256",
            "--n-envs",
            "2",
            "--eval-episodes",
            "0",
            "--progress-interval",
            "0.01",
            "--no-progress",
            *SMALL_PPO,
        ],
        tmp_path,
    )
    assert proc.returncode == 0 and "progress:" not in proc.stdout, proc.stdout + proc.stderr


def test_unreachable_scheduler_fails_cleanly(capsys: pytest.CaptureFixture[str], restore_daskvec_logger: Any) -> None:
    import socket

    with socket.socket() as s:  # bound, never listening: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        code = cli.main(
            ["train", "CartPole-v1", "--scheduler", f"tcp://127.0.0.1:{port}", "--timeout", "3", "--no-progress"]
        )
    assert code == 1
    assert "cannot reach a Dask scheduler" in capsys.readouterr().err


def test_parser(restore_daskvec_logger: Any) -> None:
    args = cli.build_parser().parse_args(
        [
            "train",
            "Pendulum-v1",
            "--algo",
            "sac",
            "--n-envs",
            "2",
            "--hyperparams",
            "learning_rate=1e-3",
            "policy_kwargs={'net_arch':[8]}",
            "train_freq=4",
        ]
    )
    assert args.env_id == "Pendulum-v1" and args.algo == "sac" and args.n_envs == 2
    assert dict(args.hyperparams) == {"learning_rate": 1e-3, "policy_kwargs": {"net_arch": [8]}, "train_freq": 4}
    assert args.scheduler is None and args.timesteps == 25_000
    assert args.transport is None and args.timeout is None  # from Dask's config (daskvec.*)
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "CartPole-v1", "--n-envs", "0"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "CartPole-v1", "--algo", "trpo"])
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "CartPole-v1", "--hyperparams", "no-equals-sign"])
    with pytest.raises(SystemExit):
        cli.main([])  # a command is required


def test_bench_subcommand_is_wired(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("daskvec.bench")
    parser = cli.build_parser(with_bench=True)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["bench", "--help"])
    assert exc.value.code == 0
    # the scenarios are listed once (they were in the usage line and again in the option's help)
    assert " ".join(capsys.readouterr().out.split()).count("learning-offpolicy") == 1


def test_a_model_that_cannot_be_made_fails_cleanly(
    cluster2: Any, capsys: pytest.CaptureFixture[str], restore_daskvec_logger: Any
) -> None:
    """A typo in --hyperparams, or an algorithm that does not fit the env: one line, exit code 1, no traceback."""
    common = ["--scheduler", cluster2.scheduler_address, "--n-envs", "2", "--no-progress", "--eval-episodes", "0"]
    assert cli.main(["train", "CartPole-v1", *common, "--hyperparams", "n_step=64"]) == 1
    err = capsys.readouterr().err
    assert "daskvec train: cannot create PPO for CartPole-v1 (--hyperparams: n_step=64): TypeError: " in err
    assert "Traceback" not in err
    assert cli.main(["train", "CartPole-v1", *common, "--algo", "sac"]) == 1
    err = capsys.readouterr().err
    assert "cannot create SAC for CartPole-v1 (--hyperparams: none): AssertionError: " in err and "Traceback" not in err


@pytest.mark.timeout(300)
def test_train_collects_ahead_on_the_workers(tmp_path: Path) -> None:
    """``--collect-ahead 1``: DaskPPO collects the next rollout while it trains; the saved model says so."""
    model = tmp_path / "model.zip"
    proc = run_cli(
        [
            *("train", "CartPole-v1", "--timesteps", "1024", "--n-envs", "4", "--collect-ahead", "1"),
            *("--eval-episodes", "0", "--no-progress", "--save", str(model), *SMALL_PPO),
        ],
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"^trained PPO for 1024 env steps", proc.stdout, re.M), proc.stdout
    from daskvec.sb3 import DaskPPO

    loaded = DaskPPO.load(model, device="cpu")
    assert loaded.collect_ahead == 1 and loaded.num_timesteps == 1024


def test_parser_refuses_a_collect_ahead_of_two(restore_daskvec_logger: Any) -> None:
    assert cli.build_parser().parse_args(["train", "CartPole-v1", "--collect-ahead", "1"]).collect_ahead == 1
    assert cli.build_parser().parse_args(["train", "CartPole-v1"]).collect_ahead is None
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["train", "CartPole-v1", "--collect-ahead", "2"])
