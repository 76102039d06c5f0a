"""The benchmark harness: structure of its results, files and CLI (no timing thresholds)."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shutil
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import have_chromium

from daskvec import bench

with contextlib.suppress(ImportError):
    # registers the daskvec page before the session cluster (cluster2) starts its dashboard
    import daskvec.dashboard  # noqa: F401

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
STEP_KEYS = {
    "steps_per_s",
    "steps_per_s_runs",
    "vec_steps",
    "elapsed_s",
    "ttfs_s",
    "ttfs_runs",
    "construct_s",
    "reset_s",
    "first_step_s",
    "close_s",
    "reward_sum",
    "dones",
    "obs_checksum",
    "memory",
    "leftover_processes",
    "ratio_steps_per_s",
    "ratio_ttfs",
    "ratio_mem_per_env",
}
MEMORY_KEYS = {
    "client_rss_mb",
    "client_uss_mb",
    "client_delta_uss_mb",
    "env_processes",
    "env_processes_uss_mb",
    "helpers_uss_mb",
    "processes",
    "client_per_env_mb",
    "env_processes_per_env_mb",
    "per_env_mb",
}


def _check_machine(machine: dict[str, Any]) -> None:
    assert machine["cores_usable"] >= 1
    assert machine["memory_gb"] > 0
    assert machine["python"].count(".") == 2
    for pkg in ("daskvec", "distributed", "stable-baselines3", "gymnasium"):
        assert machine["packages"][pkg], pkg


def _check_files(results: dict[str, Any], out: Path) -> dict[str, Any]:
    files = results["files"]
    assert Path(files["json"]).parent == out
    png = Path(files["png"])
    assert png.read_bytes()[:8] == PNG_MAGIC
    assert (out / "latest.png").read_bytes() == png.read_bytes()
    on_disk = json.loads(Path(files["json"]).read_text())
    assert on_disk == json.loads((out / "latest.json").read_text())
    assert on_disk["files"] == files
    assert on_disk["complete"] is True
    return on_disk


@pytest.mark.timeout(240)
def test_run_benchmark_stepping_structure(cluster2: Any, tmp_path: Path) -> None:
    """All four vec envs on three tiny scenarios: every figure is there, ratios are to SubprocVecEnv."""
    results = bench.run_benchmark(
        scenarios=["light", "heavy", "images"],
        n_envs=[2],
        settle=1.0,  # a short wait for an idle CPU before each kind: the test's own timeout stays far
        steps=4,
        warmup=0.0,
        heavy_step_s=1e-4,
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
        subproc_start_method="fork",
        out_dir=tmp_path,
    )
    assert [c["case"] for c in results["cases"]] == ["light-2", "heavy-2", "images-2"]
    _check_machine(results["machine"])
    assert results["settings"]["baseline"] == "subproc"
    for case in results["cases"]:
        assert case["n_envs"] == 2
        assert list(case["results"]) == ["dummy", "subproc", "async", "dask"]
        for kind, res in case["results"].items():
            assert "error" not in res, (case["case"], kind, res.get("error"))
            assert set(res) >= STEP_KEYS, (kind, STEP_KEYS - set(res))
            assert set(res["memory"]) >= MEMORY_KEYS
            assert res["vec_steps"] == 4
            assert res["steps_per_s"] > 0 and res["ttfs_s"] > 0
            assert res["ttfs_s"] >= res["first_step_s"]
            assert res["memory"]["per_env_mb"] >= 0
            assert res["leftover_processes"] == 0
            assert 0 <= res["settle_s"] <= 5.0  # each kind waited for an idle CPU, about --settle at most
        subproc = case["results"]["subproc"]
        assert subproc["ratio_steps_per_s"] == 1.0 and subproc["ratio_ttfs"] == 1.0
        assert math.isclose(
            case["results"]["dask"]["ratio_steps_per_s"],
            case["results"]["dask"]["steps_per_s"] / subproc["steps_per_s"],
        )
        # every SB3 vec env stepped the same envs with the same actions: identical outcomes
        sb3 = [case["results"][k] for k in ("dummy", "subproc", "dask")]
        assert len({(r["reward_sum"], r["dones"], r["obs_checksum"]) for r in sb3}) == 1, case["case"]
        # the env-holding processes are counted: two subprocesses, two Dask workers
        assert subproc["memory"]["env_processes"] == 2
        assert case["results"]["async"]["memory"]["env_processes"] == 2
        assert case["results"]["dask"]["memory"]["env_processes"] == 2
        assert case["results"]["dummy"]["memory"]["env_processes"] == 0
        assert case["results"]["dask"]["transport"]
    heavy = results["cases"][1]
    assert heavy["ideal_steps_per_s"] == pytest.approx(heavy["cores"] / 1e-4)
    assert all("fraction_of_ideal" in r for r in heavy["results"].values())
    on_disk = _check_files(results, tmp_path)
    assert [c["case"] for c in on_disk["cases"]] == ["light-2", "heavy-2", "images-2"]
    table = bench.format_table(results)
    for label in ("DummyVecEnv", "SubprocVecEnv", "AsyncVectorEnv", "DaskVecEnv", "of ideal", "machine:"):
        assert label in table
    # only a busy machine before the run warns; the load at the end is the benchmark's own
    cores = results["machine"]["cores_usable"]
    results["machine"]["load_average"] = [0.0, 0.0, 0.0]
    results["load_average_end"] = [4.0 * cores, 0.0, 0.0]
    quiet = bench.format_table(results)
    assert "WARNING" not in quiet and f"load average at the end {4.0 * cores:.1f}" in quiet
    results["machine"]["load_average"] = [cores, 0.0, 0.0]
    assert "WARNING: the machine was busy before the run" in bench.format_table(results)


@pytest.mark.timeout(240)
def test_run_benchmark_training_structure(cluster2: Any, tmp_path: Path) -> None:
    """A tiny PPO run per vec env: wall time, reward, and the same reward on DummyVecEnv and DaskVecEnv."""
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=["training"],
        vec_envs=["dummy", "async", "dask"],
        n_envs=[2],
        training_timesteps=64,
        eval_episodes=2,
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
        out_dir=tmp_path,
    )
    (case,) = results["cases"]
    assert case["case"] == "training-2" and case["timesteps"] == 64
    assert "skipped" in case["results"]["async"]
    for kind in ("dummy", "dask"):
        res = case["results"][kind]
        assert "error" not in res, res.get("error")
        assert res["timesteps"] >= 64
        assert res["wall_s"] > 0 and res["wall_runs"] == [res["wall_s"]]
        assert 1 <= res["mean_reward"] <= 500
        assert res["ratio_wall"] is None  # no SubprocVecEnv in this run, so no ratio
        assert res["leftover_processes"] == 0
    assert case["results"]["dummy"]["mean_reward"] == case["results"]["dask"]["mean_reward"]
    _check_files(results, tmp_path)
    assert "reward" in bench.format_table(results)


@pytest.mark.timeout(240)
def test_env_processes_are_counted_on_their_workers(cluster2: Any, tmp_path: Path) -> None:
    """With ``env_process=True`` each group's process is read on its worker, beside the worker."""
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=["light"],
        vec_envs=["dask"],
        n_envs=[4],
        steps=3,
        warmup=0.0,
        env_process=True,
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
        out_dir=tmp_path,
    )
    dask = results["cases"][0]["results"]["dask"]
    assert "error" not in dask, dask.get("error")
    roles = [p["role"] for p in dask["memory"]["processes"]]
    assert roles.count("worker") == dask["workers"] == 2
    assert roles.count("env process") == dask["groups"] == 2
    assert dask["memory"]["env_processes"] == 4
    assert all(p["uss_mb"] > 0 for p in dask["memory"]["processes"])
    assert results["settings"]["env_process"] is True


@pytest.mark.timeout(240)
@pytest.mark.processes
def test_cli_run_embedded_cluster(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``daskvec bench`` as the CLI calls it, on the default embedded LocalCluster."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "out"
    args = parser.parse_args(
        [
            "--scenario",
            "light",
            "--envs",
            "2",
            "--steps",
            "3",
            "--warmup",
            "0",
            "--vec-envs",
            "dummy,dask",
            "--out",
            str(out),
        ]
    )
    assert bench.run(args) == 0
    printed = capsys.readouterr().out
    assert "DaskVecEnv" in printed and "DummyVecEnv" in printed and "png:" in printed
    (json_file,) = out.glob("bench-*.json")
    data = json.loads(json_file.read_text())
    (case,) = data["cases"]
    assert case["case"] == "light-2"
    dask = case["results"]["dask"]
    assert "error" not in dask, dask.get("error")
    assert dask["dashboard_link"]  # an embedded cluster was started (and closed: no leftovers)
    assert dask["leftover_processes"] == 0
    assert dask["memory"]["env_processes"] >= 1
    assert data["settings"]["scheduler"] is None
    assert (out / "latest.png").read_bytes()[:8] == PNG_MAGIC


@pytest.mark.timeout(300)
@pytest.mark.parametrize("scenario", ["atari", "mujoco"])
def test_workload_scenarios_structure(cluster2: Any, tmp_path: Path, scenario: str) -> None:
    """Each real workload, briefly, on every kind: the Python ideal is cores x DummyVecEnv of the same run."""
    from daskvec.bench.scenarios import missing_packages

    if missing_packages(scenario):
        pytest.skip(f"{scenario} needs {missing_packages(scenario)} (pip install 'daskvec[workloads]')")
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=[scenario],
        n_envs=[2],
        steps=3,
        warmup=0.0,
        subproc_start_method="fork",
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
        out_dir=tmp_path,
        plot=False,
    )
    (case,) = results["cases"]
    assert case["case"] == f"{scenario}-2" and case["n_envs"] == 2
    res = case["results"]
    assert list(res)[:4] == ["dummy", "subproc", "async", "dask"]
    for kind in ("dummy", "subproc", "async", "dask"):
        assert "error" not in res[kind], (kind, res[kind].get("error"))
        assert res[kind]["vec_steps"] == 3 and res[kind]["steps_per_s"] > 0
        assert res[kind]["leftover_processes"] == 0
        assert math.isclose(res[kind]["fraction_of_ideal"], res[kind]["steps_per_s"] / case["ideal_steps_per_s"])
    assert case["ideal_steps_per_s"] == pytest.approx(case["cores"] * res["dummy"]["steps_per_s"])
    # the SB3 vec envs stepped the same envs with the same actions (VecFrameStack around each for Atari);
    # rewards to float32's precision, since DummyVecEnv keeps them as float32 and SubprocVecEnv as float64
    sb3 = [res[k] for k in ("dummy", "subproc", "dask")]
    assert len({(r["dones"], r["obs_checksum"]) for r in sb3}) == 1
    assert all(math.isclose(r["reward_sum"], sb3[0]["reward_sum"], rel_tol=1e-6, abs_tol=1e-6) for r in sb3)
    if missing_packages("envpool"):
        assert all("envpool is not installed" in res[k]["skipped"] for k in ("envpool", "dask-envpool"))
    else:
        for kind in ("envpool", "dask-envpool"):
            assert "error" not in res[kind], (kind, res[kind].get("error"))
        assert res["dask-envpool"]["of_envpool"] == pytest.approx(
            res["dask-envpool"]["steps_per_s"] / res["envpool"]["steps_per_s"]
        )
        assert res["dask-envpool"]["groups"] >= 1
    table = bench.format_table(results)
    assert "of ideal" in table and "x DummyVecEnv" in table


@pytest.mark.processes
def test_workload_without_its_packages_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from daskvec.bench import driver

    monkeypatch.setattr(driver, "missing_packages", lambda what: ["ale_py"] if what == "atari" else [])
    results = bench.run_benchmark(settle=0.0, scenarios=["atari"], vec_envs=["dummy"], steps=1, out_dir=tmp_path)
    (case,) = results["cases"]
    assert case["skipped"] == "needs ale_py: pip install 'daskvec[workloads]'" and case["results"] == {}
    assert "atari        skipped: needs ale_py" in bench.format_table(results)
    assert "png" not in results["files"]  # nothing was measured, so nothing is drawn


def test_all_leaves_the_workloads_out() -> None:
    from daskvec.bench.driver import _check_selection

    chosen, _ = _check_selection(["all"], ["dummy"])
    assert "atari" not in chosen and "light" in chosen
    chosen, _ = _check_selection(["workloads"], ["dummy"])
    assert chosen == ["atari", "mujoco", "contention"]


@pytest.mark.timeout(300)
def test_contention_structure(cluster2: Any, tmp_path: Path) -> None:
    """PPO beside busy-loop processes: wall times and ratios for the SB3 vec envs, the busy processes gone after."""
    import psutil

    from daskvec.bench.measure import busy_processes

    with busy_processes(2) as pids:
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=["contention"],
        vec_envs=["dummy", "subproc", "async", "dask"],
        n_envs=[2],
        contention_timesteps=64,
        eval_episodes=1,
        subproc_start_method="fork",
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
        out_dir=tmp_path,
        plot=False,
    )
    (case,) = results["cases"]
    assert case["case"] == "contention-2" and case["timesteps"] == 64 and "busy-loop" in case["env"]
    assert "skipped" in case["results"]["async"]
    for kind in ("dummy", "subproc", "dask"):
        res = case["results"][kind]
        assert "error" not in res, (kind, res.get("error"))
        assert res["timesteps"] >= 64 and res["wall_s"] > 0
        assert res["ratio_wall"] == pytest.approx(res["wall_s"] / case["results"]["subproc"]["wall_s"])
        assert res["leftover_processes"] == 0
    assert "contention-2" in bench.format_table(results)


@pytest.mark.timeout(300)
@pytest.mark.processes
def test_ceiling_splits_the_step_time(tmp_path: Path) -> None:
    """``--scenario ceiling``: the ideal from DummyVecEnv, each variant's time split and CPU per vec-step."""
    from benchmarks.ceiling import format_ceiling_table, run_ceiling
    from daskvec.bench.scenarios import missing_packages

    if missing_packages("mujoco"):
        pytest.skip("needs mujoco (pip install 'daskvec[workloads]')")
    # one variant (each starts an embedded cluster of its own): the structure, briefly
    res = run_ceiling("mujoco", 2, seconds=0.5, warmup=0.0, rounds=1, variants=["busy_poll=0"])
    assert res["case"] == "mujoco-2" and len(res["dummy_steps_per_s"]) == 1 and list(res["variants"]) == ["busy_poll=0"]
    assert res["ideal_steps_per_s"] == pytest.approx(res["cores"] * res["dummy_steps_per_s"][0])
    assert res["parallel_ceiling_steps_per_s"] == res["parallel_steps_per_s"][0] > 0
    for name, entry in res["variants"].items():
        (run,) = entry["runs"]
        assert "error" not in run, (name, run.get("error"))
        assert entry["fraction_of_ideal"] == pytest.approx(entry["steps_per_s"] / res["ideal_steps_per_s"])
        parallel = res["parallel_ceiling_steps_per_s"]
        assert entry["fraction_of_parallel"] == pytest.approx(entry["steps_per_s"] / parallel)
        assert len(entry["worker_cpu_ms"]) == run["workers"] >= 1
        assert entry["client_cpu_ms"] > 0 and entry["env_ms"] > 0
        # the three parts are the vec env's own split of each vec-step's wall time
        parts = entry["client_ms"] + entry["transit_ms"] + entry["env_ms"]
        assert parts == pytest.approx(entry["vec_step_ms"], rel=0.25)
    assert "busy_poll=0" in format_ceiling_table(res)
    with pytest.raises(ValueError, match="unknown variant"):
        run_ceiling("mujoco", 2, variants=["fastest"])


GROUPS_KEYS = {
    "groups",
    "workers",
    "transport",
    "vec_steps",
    "wall_s_per_vec_step",
    "cpu_s_per_vec_step",
    "wall_s_per_group",
    "cpu_s_per_group",
    "steps_per_s",
    "wall_s_per_vec_step_runs",
    "cpu_s_per_vec_step_runs",
}


@pytest.mark.timeout(240)
def test_groups_scenario_structure(cluster2: Any, tmp_path: Path) -> None:
    """``groups``: DaskVecEnv alone, one env per group, client time per vec-step and per group for each count."""
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=["groups"],
        n_envs=[2, 3],
        steps=3,
        warmup=0.0,
        repeat=2,
        out_dir=tmp_path,
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
    )
    assert [c["case"] for c in results["cases"]] == ["groups-2", "groups-3"]
    for case, n in zip(results["cases"], (2, 3), strict=True):
        assert case["scenario"] == "groups" and case["n_groups"] == n
        assert list(case["results"]) == ["dask"]  # the other vec envs have no groups
        res = case["results"]["dask"]
        assert "error" not in res, res.get("error")
        assert set(res) >= GROUPS_KEYS, GROUPS_KEYS - set(res)
        assert res["groups"] == n and 1 <= res["workers"] <= 2 and res["vec_steps"] == 3
        assert len(res["wall_s_per_vec_step_runs"]) == len(res["cpu_s_per_vec_step_runs"]) == 2
        assert res["wall_s_per_group"] == pytest.approx(res["wall_s_per_vec_step"] / n)
        assert res["cpu_s_per_group"] == pytest.approx(res["cpu_s_per_vec_step"] / n)
        assert res["wall_s_per_vec_step"] > 0 and res["cpu_s_per_vec_step"] >= 0
    on_disk = json.loads(Path(results["files"]["json"]).read_text())
    assert [c["case"] for c in on_disk["cases"]] == ["groups-2", "groups-3"]
    assert "png" not in results["files"]  # a table only: no SubprocVecEnv to chart ratios to
    table = bench.format_table(results)
    assert table.count("us/group") == 4 and "groups-3" in table and "2 groups on" in table
    assert bench.run_benchmark(settle=0.0, scenarios=["groups"], vec_envs=["dummy"], n_envs=[2], steps=1)["cases"] == []


def test_the_benchmarks_of_the_source_repository_are_found_beside_the_package() -> None:
    """A checkout (this one, an editable install): ``benchmarks/`` beside ``daskvec/``, its modules from there."""
    from daskvec.bench import source

    root = Path(__file__).resolve().parents[2]
    assert source.benchmarks_dir() == root / "benchmarks"
    assert Path(str(source.module("hosts").__file__)) == root / "benchmarks" / "across.py"
    assert Path(str(source.module("--tls", "command").__file__)) == root / "benchmarks" / "command.py"


def test_the_benchmarks_of_the_source_repository_asked_of_a_wheel(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without ``benchmarks/`` beside the package: named, a message saying where it is (exit 2); in "all", skipped."""
    from daskvec.bench import driver, source

    monkeypatch.setattr(source, "benchmarks_dir", lambda: None)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    asked = {
        ("--scenario", "hosts"): "across",
        ("--scenario", "learning-offpolicy"): "offpolicy_learning",
        ("--scenario", "groups"): "groups",
        ("--tls",): "tls",
        ("--scenario", "none", "--dashboard"): "dashboard_load",
    }
    for argv, where in asked.items():
        assert bench.run(parser.parse_args([*argv, "--out", str(tmp_path)])) == 2, argv
        err = capsys.readouterr().err
        assert f"source repository (benchmarks/{where}.py)" in err and 'pip install -e ".[test]"' in err, err
    with pytest.raises(source.InSourceOnly, match="gym-faces"):
        bench.run_benchmark(settle=0.0, scenarios=["light", "gym-faces"])
    chosen, _ = driver._check_selection(["all"], ["dask"])
    assert {"gym-faces", "straggler", "groups"} <= set(chosen)  # "all" does not fail: they are skipped
    (case,) = driver._scenario_cases("straggler", [16], ["dask"], bench.BenchOptions())
    assert case["results"] == {} and "source repository" in case["skipped"]
    assert "straggler    skipped: a benchmark of the source repository" in bench.format_table(
        {"cases": [case], "machine": {"cpu": "x", "cores_usable": 1, "memory_gb": 1, "python": "3"}}
    )
    assert not list(tmp_path.iterdir())  # nothing ran


def test_invalid_options() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        bench.run_benchmark(settle=0.0, scenarios=["fast"])
    with pytest.raises(ValueError, match="vec_envs"):
        bench.run_benchmark(settle=0.0, scenarios=["light"], vec_envs=["ray"])
    with pytest.raises(ValueError, match="transport"):
        bench.run_benchmark(settle=0.0, scenarios=["light"], transport="udp")
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run(parser.parse_args(["--scenario", "light", "--repeat", "0"])) == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["--envs", "0"])


def test_envs_and_actions() -> None:
    """The heavy env burns CPU (not sleep) and the image env returns fresh uint8 frames."""
    import time

    env = bench.BusyEnv(step_cpu_s=2e-3, horizon=3)
    env.reset(seed=1)
    cpu0 = time.thread_time()
    for _ in range(3):
        *_, truncated, _ = env.step(1)
    assert time.thread_time() - cpu0 >= 3 * 2e-3
    assert truncated
    img = bench.ImageEnv()
    first, _ = img.reset(seed=0)
    obs, *_ = img.step(2)
    assert obs.shape == (84, 84, 3) and obs.dtype.name == "uint8"
    assert not (obs == first).all() and img.observation_space.contains(obs)
    a = bench.action_cycle(img.action_space, 16, 32, seed=3)
    b = bench.action_cycle(img.action_space, 16, 32, seed=3)
    assert a.shape == (32, 16) and (a == b).all() and a.min() >= 0 and a.max() <= 3


@pytest.mark.browser
@pytest.mark.timeout(240)
@pytest.mark.skipif(not have_chromium(), reason="needs Debian's chromium")
def test_dashboard_open_vs_closed(cluster2: Any, tmp_path: Path) -> None:
    """--dashboard: the daskvec page is found on the scheduler and really opened in chromium."""
    pytest.importorskip("daskvec.dashboard")
    results = bench.run_benchmark(
        settle=0.0,
        scenarios=["none"],
        vec_envs=["dask"],
        n_envs=[2],
        steps=3,
        warmup=0.0,
        dashboard=True,
        out_dir=tmp_path,
        scheduler=cluster2.scheduler_address,  # type: ignore[attr-defined]
    )
    dash = results["dashboard"]
    assert dash["available"], dash.get("reason") or dash.get("error")
    assert dash["route"] == "/daskvec"
    assert dash["method"] == "chromium" and dash["page_connected"]
    assert dash["open_steps_per_s"] > 0 and dash["closed_steps_per_s"] > 0
    assert math.isclose(dash["ratio_open_to_closed"], dash["open_steps_per_s"] / dash["closed_steps_per_s"])
    assert json.loads(Path(results["files"]["json"]).read_text())["dashboard"]["route"] == "/daskvec"
    assert "dashboard (chromium, /daskvec)" in bench.format_table(results)


# --------------------------------------------------------------------------- across hosts
def test_across_hosts_goals_and_table() -> None:
    """The goals read the ratios to the 0 ms row; the table shows every round trip."""
    from benchmarks.across import _ratios, format_across_table

    def row(rtt: float, rollouts: float, ppo: float, daskppo: float) -> dict[str, Any]:
        return {
            "rtt_ms": rtt,
            "sync_steps_per_s": 1000.0 / (1 + rtt),
            "sync_collect_steps_per_s": 500.0,
            "rollout_steps_per_s": rollouts,
            "ppo_wall_s": ppo,
            "daskppo_wall_s": daskppo,
        }

    results: dict[str, Any] = {
        "settings": {"n_envs": 64, "n_hosts": 2, "n_steps": 128, "timesteps": 1000},
        "relay": {"cost_us": 40.0, "direct_us": 25.0, "relayed_us": 65.0},
        "rows": [row(0, 100.0, 2.0, 1.0), row(2, 95.0, 3.0, 1.1), row(10, 60.0, 9.0, 1.5)],
    }
    _ratios(results)
    assert results["rows"][1]["rollout_steps_per_s_vs_0ms"] == pytest.approx(0.95)
    assert results["goals"] == {
        "rollouts_at_2ms_ge_0.9_of_0ms": True,
        "rollouts_at_10ms_ge_0.7_of_0ms": False,
        "daskppo_not_slower_at_0ms": True,
    }
    table = format_across_table(results)
    assert "rollouts_at_10ms_ge_0.7_of_0ms=NOT met" in table
    assert [line.split()[0] for line in table.splitlines()[2:5]] == ["0", "2", "10"]
    results["rows"][0]["vector"] = {
        "task": "HalfCheetah-v5",
        "n_envs": 64,
        "groups": 2,
        "steps_per_s": 30000.0,
        "envpool_alone_steps_per_s": 60000.0,
        "of_envpool": 0.5,
        "transport": "direct/tcp x2",
    }
    results["rows"][1]["vector"] = {"skipped": "envpool is not installed"}
    table = format_across_table(results)
    assert "vector groups at 0 ms: EnvPool HalfCheetah-v5 x64 as 2 groups 30,000 env-steps/s, 0.50 of EnvPool" in table
    assert "vector groups at 2 ms: skipped (envpool is not installed)" in table


@pytest.mark.timeout(120)
def test_vector_groups_against_envpool_alone_structure(client2: Any) -> None:
    """The across-hosts benchmark's vector figure, here on a local cluster: both rates, their ratio."""
    pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool)")
    pytest.importorskip("mujoco", reason="mujoco is not installed")
    from benchmarks.across import measure_vector_groups

    res = measure_vector_groups(client2, 2, seconds=0.2, repeat=2, seed=0)
    assert (res["task"], res["n_envs"], res["groups"]) == ("HalfCheetah-v5", 64, 2)
    assert len(res["samples"]["groups"]) == len(res["samples"]["alone"]) == 2
    assert res["steps_per_s"] > 0 and res["envpool_alone_steps_per_s"] > 0
    assert res["of_envpool"] == pytest.approx(res["steps_per_s"] / res["envpool_alone_steps_per_s"])
    assert res["transport"].startswith("direct/")


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_envpool_layout_benchmark_structure() -> None:
    """One EnvPool as one group against one EnvPool per core, each as a fraction of EnvPool alone."""
    pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool)")
    pytest.importorskip("mujoco", reason="mujoco is not installed")
    from benchmarks.envpool_layout import run

    res = run("HalfCheetah-v5", rounds=2, seconds=0.2, cores=2)
    assert (res["envs"], res["cores"], [r["round"] for r in res["rounds"]]) == (64, 2, [0, 1])
    for row in res["rounds"]:
        assert min(row["alone"], row["one_group"], row["group_per_core"]) > 0
        assert row["one_group_of_alone"] == pytest.approx(row["one_group"] / row["alone"])
        assert row["group_per_core_of_alone"] == pytest.approx(row["group_per_core"] / row["alone"])
    fractions = [r["one_group_of_alone"] for r in res["rounds"]]
    assert res["median_one_group_of_alone"] == pytest.approx(sum(fractions) / 2)


REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(240)
@pytest.mark.processes
def test_against_a_commit_alternates_both_versions_in_one_process(tmp_path: Path) -> None:
    """``benchmarks/against.py`` takes the package at a commit from git under another name and
    alternates it with this checkout (here HEAD against itself: the machinery, not a speed)."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout of daskvec")
    from benchmarks.against import materialize, run

    name = materialize("HEAD", tmp_path)
    copy = tmp_path / name
    assert name.startswith("daskvec_") and (copy / "__init__.py").exists()
    sources = "".join(p.read_text(encoding="utf-8") for p in copy.rglob("*.py"))
    assert "from daskvec." not in sources and "import daskvec\n" not in sources and f"from {name}." in sources
    with pytest.raises(RuntimeError, match="no-such-commit"):
        materialize("no-such-commit", tmp_path)

    res = run("HEAD", "light", n_envs=2, rounds=2, seconds=0.2)
    assert (res["scenario"], res["n_envs"], [r["round"] for r in res["rounds"]]) == ("light", 2, [0, 1])
    for row in res["rounds"]:
        assert row["base"] > 0 and row["head"] > 0 and row["ratio"] == pytest.approx(row["head"] / row["base"])
    assert res["median_ratio"] == pytest.approx(sum(r["ratio"] for r in res["rounds"]) / 2)
    assert res["base_copy"].startswith("daskvec_") and res["base_copy"] in sys.modules


@pytest.mark.timeout(240)
@pytest.mark.processes
def test_against_a_commit_on_envpool_groups_times_envpool_alone_too() -> None:
    """The EnvPool scenario of ``benchmarks/against.py``: both versions' groups and EnvPool alone in each round."""
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.skip("needs a git checkout of daskvec")
    pytest.importorskip("envpool", reason="envpool is not installed (pip install envpool)")
    from benchmarks.against import run

    res = run("HEAD", "envpool-mujoco", n_envs=4, rounds=2, seconds=0.2)
    for row in res["rounds"]:
        assert set(row) == {"round", "base", "head", "alone", "ratio", "of_alone"}
        assert row["of_alone"]["head"] == pytest.approx(row["head"] / row["alone"])
    assert set(res["median_of_alone"]) == {"base", "head"}


def learning_row(rtt: float, sac: float, cnn: float, waits: float = 0.0) -> dict[str, Any]:
    def fig(steps: float, per_collection: float) -> dict[str, Any]:
        return {"steps_per_s": steps, "step_waits_per_collection": per_collection, "collect_s": 1.0, "train_s": 2.0}

    return {
        "sac": {"dask": fig(sac, waits), "sb3": fig(sac / (1 + rtt), 16.0)},
        "cnn": {"dask": fig(cnn, waits), "sb3": fig(cnn / (1 + rtt), 64.0)},
    }


def test_across_hosts_learning_goals_and_table() -> None:
    """DaskSAC's and the CNN DaskPPO's learn() at 10 ms as fractions of 0 ms, and the step_wait counts, in the
    goals and the table."""
    from benchmarks.across import _ratios, format_across_table
    from benchmarks.across_learn import LearnSettings

    def row(rtt: float, sac: float, cnn: float, waits: float = 0.0) -> dict[str, Any]:
        return {
            "rtt_ms": rtt,
            "sync_steps_per_s": 1.0,
            "sync_collect_steps_per_s": 1.0,
            "rollout_steps_per_s": 1.0,
            "ppo_wall_s": 1.0,
            "daskppo_wall_s": 1.0,
            "learning": learning_row(rtt, sac, cnn, waits),
        }

    def results(*rows: dict[str, Any]) -> dict[str, Any]:
        res = {
            "settings": {
                "n_envs": 64,
                "n_hosts": 2,
                "n_steps": 128,
                "timesteps": 1000,
                "learning": LearnSettings().describe("grey frames"),
            },
            "relay": {"cost_us": 40.0, "direct_us": 25.0, "relayed_us": 65.0},
            "rows": list(rows),
        }
        _ratios(res)
        return res

    res = results(row(0, 1000.0, 400.0), row(2, 950.0, 390.0), row(10, 800.0, 200.0))
    assert res["rows"][2]["learning"]["sac"]["dask"]["vs_0ms"] == pytest.approx(0.8)
    assert res["rows"][2]["learning"]["cnn"]["sb3"]["vs_0ms"] == pytest.approx(200 / 11 / 400)
    goals = res["goals"]
    assert goals["daskSAC_at_10ms_ge_0.7_of_0ms"] and not goals["daskPPO_cnn_at_10ms_ge_0.7_of_0ms"]
    assert goals["dask_learners_at_most_one_step_wait_per_collection"]
    table = format_across_table(res)
    assert "grey frames x8, VecFrameStack(4)" in table and "gradient_steps=16" in table
    lines = table.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:2] == ["rtt", "ms"] and "DaskSAC" in line)
    assert [line.split()[0] for line in lines[head + 1 : head + 4]] == ["0", "2", "10"]
    assert lines[head + 3].split()[1:3] == ["800", "0.80"] and lines[head + 3].split()[-4:] == ["0", "16", "0", "64"]
    # a Dask learner that stepped through the vec env (SB3's loop: a step_wait per vec-step) misses the goal
    res = results(row(0, 1000.0, 400.0), row(10, 900.0, 390.0, waits=16.0))
    assert not res["goals"]["dask_learners_at_most_one_step_wait_per_collection"]
    assert "dask_learners_at_most_one_step_wait_per_collection=NOT met" in format_across_table(res)


def test_across_hosts_learning_cases_collect_on_the_workers(client2: Any) -> None:
    """The benchmark's two learning cases, tiny, on a LocalCluster: the Dask learners collect on the workers
    (no step_wait of the DaskVecEnv, a worker-side collection per collection), SB3's pay a step_wait per
    vec-step; a fallback to SB3's loop fails this."""
    from benchmarks.across_learn import LearnSettings, measure_learning
    from daskvec.bench.envs import grey_frames

    tiny = LearnSettings(
        sac_envs=4, sac_freq=4, sac_timesteps=64, cnn_envs=2, cnn_n_steps=8, cnn_timesteps=32, cnn_batch_size=16
    )
    got = measure_learning(client2, tiny, seed=0, repeat=1, image=grey_frames)
    for case, collections, per in (("sac", 4, 4), ("cnn", 2, 8)):
        dask, sb3 = got[case]["dask"], got[case]["sb3"]
        assert dask["collections"] == sb3["collections"] == collections, (case, dask, sb3)
        assert dask["vec_steps"] == sb3["vec_steps"] == collections * per
        assert (dask["worker_collections"], dask["step_waits_per_collection"]) == (collections, 0), (case, dask)
        assert (sb3["worker_collections"], sb3["step_waits_per_collection"]) == (0, per), (case, sb3)
        assert dask["steps_per_s"] > 0 and sb3["steps_per_s"] > 0 and len(dask["samples"]) == 1
        assert dask["collect_s"] > 0 and sb3["collect_s"] > 0 and (case == "sac" or sb3["train_s"] > 0)
        assert got[case]["restarts"] == 0


def test_rtt_option_is_checked() -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert parser.parse_args(["--scenario", "hosts", "--rtt", "0,2,10"]).rtt == [0.0, 2.0, 10.0]
    assert parser.parse_args(["--scenario", "learning", "--learning-seeds", "0,1"]).learning_seeds == [0, 1]
    with pytest.raises(SystemExit):
        parser.parse_args(["--rtt", "0,-2"])


@pytest.mark.processes
def test_wait_idle_waits_while_every_core_is_busy_and_not_at_all_when_off() -> None:
    from daskvec.bench.machine import _usable_cores, wait_idle
    from daskvec.bench.measure import busy_processes

    assert wait_idle(0.0) == (0.0, True)  # no sample taken
    with busy_processes(_usable_cores()):
        waited, idle = wait_idle(1.0)
        assert not idle and waited >= 1.0  # the CPUs never went idle: it waited its whole budget
    with pytest.raises(ValueError, match="settle must be 0"):
        bench.BenchOptions(settle=-1.0)


def test_timeline_split_lines_up_the_client_and_worker_stamps() -> None:
    """``benchmarks/timeline.py``: each part of a vec-step from stamps on one clock (synthetic, in seconds)."""
    from benchmarks.timeline import split

    # one vec-step from 0 to 1000 us: requests sent at 10 and 20; worker 0 reads at 30, its envs are done
    # at 130, it sends at 150; worker 1 reads at 60, done at 400, sends at 430; replies decoded at 470, 900
    us = 1e-6
    steps = [(0.0, 1000 * us, [10 * us, 20 * us], [470 * us, 900 * us])]
    workers = [
        [("read", 30 * us), ("envs_done", 130 * us), ("env_seconds", 95 * us), ("send", 150 * us), ("sent", 160 * us)],
        [("read", 60 * us), ("envs_done", 400 * us), ("env_seconds", 330 * us), ("send", 430 * us), ("sent", 450 * us)],
    ]
    # a step whose worker stamps are missing is skipped, not misread
    steps.append((2000 * us, 3000 * us, [2010 * us, 2020 * us], [2500 * us, 2900 * us]))
    parts = split(steps, workers)
    got = {k: [round(x, 6) for x in v] for k, v in parts.items()}
    assert got == {
        "client sends (all groups)": [20.0],
        "last send -> last group has read its request": [40.0],
        "read -> envs done (slowest group)": [340.0],
        "envs done -> reply send starts (slowest)": [30.0],
        "reply send starts -> client has decoded it (last group)": [470.0],
        "client after the last reply": [100.0],
        "vec-step": [1000.0],
        "env seconds per group (median of each)": [95.0, 330.0],
    }


@pytest.mark.timeout(180)
@pytest.mark.processes
def test_timeline_runs_on_the_embedded_cluster_and_unhooks_the_client() -> None:
    """A brief real run: every part measured on most vec-steps, and this process's channels left as they were."""
    from benchmarks.timeline import run
    from daskvec.transport.channels import DirectChannel

    send, recv = DirectChannel.send, DirectChannel.recv
    res = run("CartPole-v1", 4, 1.0, 0)
    assert res["vec_steps"] > 50
    assert all(v is not None and v > 0 for v in res["median_us"].values()), res["median_us"]
    assert res["median_us"]["vec-step"] > res["median_us"]["read -> envs done (slowest group)"]
    assert len(res["env_us_per_group"]) == 2  # the embedded cluster's two workers, a group each
    assert (DirectChannel.send, DirectChannel.recv) == (send, recv)


def test_against_closes_the_first_vec_env_when_the_second_fails_to_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """``benchmarks/against.py`` builds base's vec env, then this checkout's: if the second fails, the first closes."""
    import daskvec
    from benchmarks.against import _vec_envs

    closed: list[str] = []

    class Base:
        def __init__(self, fns: list[Any]) -> None:
            self.n = len(fns)

        def close(self) -> None:
            closed.append("base")

    def refuse(fns: list[Any]) -> None:
        raise RuntimeError("no cluster today")

    monkeypatch.setattr(daskvec, "DaskVecEnv", refuse)
    with pytest.raises(RuntimeError, match="no cluster today"):
        _vec_envs(Base, "light", 2)
    assert closed == ["base"]


def test_timeline_unhooks_the_workers_it_hooked() -> None:
    """``benchmarks/timeline.py`` wraps a worker's serving functions; on a cluster that outlives a run they go back."""
    from benchmarks import timeline
    from daskvec.monitoring import metrics
    from daskvec.transport import server

    before = (server.decode, server.send_frames, metrics.GroupStats.record_step)
    timeline._hook_worker()
    try:
        assert (server.decode, server.send_frames, metrics.GroupStats.record_step) != before
    finally:
        timeline._unhook_worker()
    assert (server.decode, server.send_frames, metrics.GroupStats.record_step) == before
    assert not hasattr(server, "_timeline_stamps")


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_time_to_reward_times_each_case_until_its_threshold(tmp_path: Path) -> None:
    """The structure and the bookkeeping, never the speed: each run stops at its first evaluation at or
    above the threshold, its time is that evaluation's clock, medians and ratios follow from the runs."""
    from benchmarks.time_to_reward import format_time_to_reward_table, run_time_to_reward

    out = tmp_path / "ttr.json"
    res = run_time_to_reward(
        ["daskppo", "daskppo-ahead"],
        [0, 1],
        env_delay=0.001,
        eval_every=256,
        eval_episodes=1,
        max_steps=1024,
        out_path=out,
        threshold=0.0,
    )
    assert json.loads(out.read_text())["runs"] == res["runs"]
    assert [(r["case"], r["seed"]) for r in res["runs"]] == [
        ("daskppo", 0),
        ("daskppo-ahead", 0),
        ("daskppo-ahead", 1),
        ("daskppo", 1),
    ]  # alternated, the order rotated with the seed
    for run in res["runs"]:
        assert len(run["curve"]) == 1, "a run goes on after reaching the threshold"
        first = run["curve"][0]
        assert first["steps"] == 256 and run["seconds"] == first["seconds"] > 0 and run["steps"] == 256
        assert run["time_split"]["envs_busy_s"] > 0, run["time_split"]  # daskvec's logger keys, summed
    for case in ("daskppo", "daskppo-ahead"):
        times = [r["seconds"] for r in res["runs"] if r["case"] == case]
        assert res["median_seconds"][case] == pytest.approx(statistics.median(times))
    assert res["ratio_to_first"]["daskppo"] == 1.0
    table = format_time_to_reward_table(res)
    assert "daskppo-ahead" in table and "median s" in table and "who waited for whom" in table
    never = run_time_to_reward(["daskppo"], [0], eval_every=256, eval_episodes=1, max_steps=512, threshold=1e9)
    assert never["median_seconds"] == {"daskppo": None} and len(never["runs"][0]["curve"]) == 2


@pytest.mark.processes
@pytest.mark.timeout(300)
def test_time_to_reward_steps_the_envs_on_emulated_hosts_at_the_round_trip_asked(tmp_path: Path) -> None:
    """``rtt_ms``: daskvec's envs step on the emulated hosts' workers (not a local cluster), SB3's at home."""
    from benchmarks.hosts import missing_requirements
    from benchmarks.time_to_reward import format_time_to_reward_table, run_time_to_reward

    reason = missing_requirements()
    if reason:
        pytest.skip(reason)
    res = run_time_to_reward(
        ["ppo-dummy", "daskppo-ahead"],
        [0],
        env_delay=0.001,
        eval_every=256,
        eval_episodes=1,
        max_steps=512,
        threshold=0.0,
        rtt_ms=2.0,
        hosts_cpus=str(max(os.sched_getaffinity(0))),
    )
    assert res["rtt_ms"] == 2.0 and len(res["hosts"]) == 2 and "127.0.0.1" not in res["hosts"]
    assert res["hosts_cpus"] == str(max(os.sched_getaffinity(0)))
    dask_run, dummy_run = (next(r for r in res["runs"] if r["case"] == c) for c in ("daskppo-ahead", "ppo-dummy"))
    stepped_on = {w.rsplit(":", 1)[0].split("://")[1] for w in dask_run["workers"]}
    assert stepped_on and stepped_on <= set(res["hosts"]), (dask_run["workers"], res["hosts"])
    assert dummy_run["workers"] == [] and dask_run["seconds"] is not None
    assert dummy_run["time_split"] is None and dask_run["time_split"]["envs_busy_s"] > 0
    assert f"2 emulated hosts at 2 ms, their processes on CPU {res['hosts_cpus']}" in format_time_to_reward_table(res)
    with pytest.raises(ValueError, match="scheduler or rtt_ms"):
        run_time_to_reward(["daskppo"], [0], scheduler="tcp://127.0.0.1:1", rtt_ms=2.0)
    with pytest.raises(ValueError, match="give rtt_ms too"):
        run_time_to_reward(["daskppo"], [0], hosts_cpus="0")


def test_ttr_rtt_runs_time_to_reward_once_per_round_trip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--ttr-rtt 0,10``: one run per round trip, each with its own JSON; without it, one local run;
    ``--ttr-hosts-cpus`` reaches the run and names its JSON, and is refused without ``--ttr-rtt``."""
    import benchmarks.time_to_reward as ttr
    from benchmarks.command import run_own

    calls: list[tuple[float | None, Path]] = []
    pinned: list[str] = []

    def record(cases: Any, seeds: Any, *, rtt_ms: float | None, out_path: Path, **kw: Any) -> dict[str, Any]:
        calls.append((rtt_ms, out_path))
        if kw.get("hosts_cpus") is not None:
            pinned.append(kw["hosts_cpus"])
        runs = [{"case": c, "seed": s, "seconds": 1.0, "curve": []} for s in seeds for c in cases]
        return {
            "env_delay": kw["env_delay"],
            "rtt_ms": rtt_ms,
            "seeds": list(seeds),
            "runs": runs,
            "median_seconds": dict.fromkeys(cases, 1.0),
            "ratio_to_first": dict.fromkeys(cases, 1.0),
        }

    monkeypatch.setattr(ttr, "run_time_to_reward", record)
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    base = ["--scenario", "time-to-reward", "--env-delay", "2", "--no-plot", "--out", str(tmp_path)]
    assert parser.parse_args(base).ttr_rtt is None
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--ttr-rtt", "-1"])
    assert run_own(parser.parse_args([*base, "--ttr-rtt", "0,10"])) == 0
    assert [(r, p.name) for r, p in calls] == [
        (0.0, "time-to-reward-delay-2ms-rtt-0ms.json"),
        (10.0, "time-to-reward-delay-2ms-rtt-10ms.json"),
    ]
    calls.clear()
    assert run_own(parser.parse_args(base)) == 0
    assert [(r, p.name) for r, p in calls] == [(None, "time-to-reward-delay-2ms.json")]
    calls.clear()
    assert run_own(parser.parse_args([*base, "--ttr-rtt", "10", "--ttr-hosts-cpus", "1"])) == 0
    assert [(r, p.name) for r, p in calls] == [(10.0, "time-to-reward-delay-2ms-rtt-10ms-hosts-cpu-1.json")]
    assert pinned == ["1"]
    with pytest.raises(SystemExit, match="give --ttr-rtt too"):
        run_own(parser.parse_args([*base, "--ttr-hosts-cpus", "1"]))


def test_learning_benchmarks_alternate_their_cases_rotating_the_order_each_seed() -> None:
    from benchmarks.learning_runs import alternated

    assert list(alternated(["a", "b", "c"], [7, 8, 9, 10])) == [
        *[(7, "a"), (7, "b"), (7, "c")],
        *[(8, "b"), (8, "c"), (8, "a")],
        *[(9, "c"), (9, "a"), (9, "b")],
        *[(10, "a"), (10, "b"), (10, "c")],
    ]
