"""The dask-jobqueue sizing helper: arithmetic, generated job scripts of every backend,
and a real cluster of local job processes holding envs (no batch system needed)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import dask
import numpy as np
import pytest

dask_jobqueue = pytest.importorskip("dask_jobqueue")

from daskvec.cluster.clients import scheduler_workers  # noqa: E402
from daskvec.jobqueue import (  # noqa: E402
    DEFAULT_RESOURCE,
    NO_PROFILER_EXPORT,
    cluster_for_envs,
    parse_walltime,
    plan_jobs,
    scale_for_envs,
)

SCHEDULER = {"host": "127.0.0.1", "dashboard_address": ":0"}


# ----------------------------------------------------------------------------- walltime
@pytest.mark.parametrize(
    ("text", "system", "seconds"),
    [
        ("00:30:00", "slurm", 1800),
        ("1-02:00:00", "slurm", 93600),
        ("45:30", "slurm", 2730),
        ("90", "slurm", 5400),
        ("12:00:00", "pbs", 43200),
        ("02:30", "lsf", 9000),
        ("45", "lsf", 2700),
        (600, "slurm", 600),
    ],
)
def test_parse_walltime(text: Any, system: str, seconds: float) -> None:
    assert parse_walltime(text, system) == seconds


@pytest.mark.parametrize(("text", "system"), [("one hour", "slurm"), ("1:2:3:4", "pbs"), ("01:00:00", "lsf")])
def test_parse_walltime_rejects(text: str, system: str) -> None:
    with pytest.raises(ValueError, match="walltime"):
        parse_walltime(text, system)


# ----------------------------------------------------------------------------- plans
def test_plan_even_layout() -> None:
    plan = plan_jobs(64, envs_per_worker=4, processes_per_job=8, memory_per_worker="2GiB")
    assert (plan.workers, plan.jobs, plan.cores_per_job) == (16, 2, 8)
    assert plan.memory_per_job == "16.00GiB"
    assert plan.resources == {DEFAULT_RESOURCE: 4.0}
    assert plan.lifetime_s is None
    assert plan.worker_extra_args() == ["--resources", f"{DEFAULT_RESOURCE}=4"]
    assert plan.vec_env_kwargs()["resources"] == {DEFAULT_RESOURCE: 1}
    assert plan.summary() == "2 jobs x 8 worker processes (8 cores, 16.00GiB each)"


def test_plan_rounds_up() -> None:
    plan = plan_jobs(10, envs_per_worker=3, processes_per_job=3, threads_per_process=2, resource=None)
    # 10 envs at 3 per worker need 4 workers; 3 workers a job need 2 jobs
    assert (plan.workers, plan.jobs, plan.cores_per_job) == (4, 2, 6)
    assert plan.resources == {}
    assert "resources" not in plan.vec_env_kwargs()
    assert "--resources" not in plan.worker_extra_args()


def test_plan_lifetime_from_walltime() -> None:
    plan = plan_jobs(4, walltime="01:00:00")
    assert plan.walltime_s == 3600
    assert plan.lifetime_s is not None
    # every worker leaves (lifetime + stagger) before the walltime, with the margin to spare
    assert plan.lifetime_s + plan.stagger_s == 3600 - 300
    assert plan.stagger_s == 180
    args = plan.worker_extra_args()
    assert args[args.index("--lifetime") + 1] == f"{int(plan.lifetime_s)}s"
    assert args[args.index("--lifetime-stagger") + 1] == "180s"
    # envs move off a worker well before it goes, but not absurdly early
    assert 5 <= plan.migrate_before <= 120
    assert plan.vec_env_kwargs()["migrate_before"] == plan.migrate_before
    assert plan.summary().endswith(f", worker lifetime {plan.lifetime_s:.0f}s +/- 180s")


def test_plan_short_walltime() -> None:
    plan = plan_jobs(2, walltime="00:01:00", lifetime_margin=30, lifetime_stagger=0)
    assert plan.lifetime_s == 30
    assert "--lifetime-stagger" not in plan.worker_extra_args()
    assert plan.migrate_before == 7.5
    with pytest.raises(ValueError, match="longer walltime"):
        plan_jobs(2, walltime="00:01:00", lifetime_margin=60)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n_envs": 0},
        {"n_envs": 4, "envs_per_worker": 0},
        {"n_envs": 4, "processes_per_job": 1.5},
        {"n_envs": 4, "memory_per_worker": 0},
    ],
)
def test_plan_rejects(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        plan_jobs(**kwargs)


# ----------------------------------------------------------------------------- job scripts
# class name -> (extra kwargs, directive prefix, walltime line, cores line)
BACKENDS: dict[str, tuple[dict[str, Any], str, str | None, str]] = {
    "SLURMCluster": (
        {"queue": "debug", "walltime": "02:00:00"},
        "#SBATCH",
        "#SBATCH -t 02:00:00",
        "#SBATCH --cpus-per-task=4",
    ),
    "PBSCluster": (
        {"queue": "batch", "walltime": "02:00:00"},
        "#PBS",
        "#PBS -l walltime=02:00:00",
        "#PBS -l select=1:ncpus=4",
    ),
    "SGECluster": ({"queue": "all.q", "walltime": "02:00:00"}, "#$", "#$ -l h_rt=02:00:00", "#$ -q all.q"),
    "LSFCluster": ({"queue": "normal", "walltime": "02:00"}, "#BSUB", "#BSUB -W 02:00", "#BSUB -n 4"),
    "OARCluster": (
        {"queue": "default", "walltime": "02:00:00", "memory_per_core_property_name": "memcore"},
        "#OAR",
        "walltime=02:00:00",
        "core=4",
    ),
    "MoabCluster": ({"queue": "batch", "walltime": "02:00:00"}, "#PBS", "#PBS -l walltime=02:00:00", "ncpus=4"),
    "HTCondorCluster": ({"disk": "1GB"}, "RequestCpus", None, "RequestCpus = MY.DaskWorkerCores"),
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest) -> str:
    if not hasattr(dask_jobqueue, request.param):
        pytest.skip(f"dask-jobqueue {dask_jobqueue.__version__} has no {request.param}")
    return str(request.param)


def test_job_script_of_each_backend(backend: str, tmp_path: Path) -> None:
    cls = getattr(dask_jobqueue, backend)
    extra, directive, walltime_line, cores_line = BACKENDS[backend]
    cluster, plan = cluster_for_envs(
        cls,
        16,
        envs_per_worker=2,
        processes_per_job=4,
        memory_per_worker="1GiB",
        scaling="none",
        scheduler_options=SCHEDULER,
        log_directory=str(tmp_path),
        **extra,
    )
    try:
        script = cluster.job_script()
        assert (plan.workers, plan.jobs, plan.cores_per_job) == (8, 2, 4)
        assert directive in script
        assert cores_line in script
        # batch systems that run a shell script start their workers without Dask's profiler
        assert (NO_PROFILER_EXPORT in script.splitlines()) == (backend != "HTCondorCluster")
        if walltime_line is not None:
            assert walltime_line in script
        # the worker command: 4 processes of 1 thread, each advertising 2 env slots
        command = next(line for line in script.splitlines() if "distributed.cli.dask_worker" in line)
        assert "--nworkers 4" in command
        assert "--nthreads 1" in command
        assert f"--resources {DEFAULT_RESOURCE}=2" in command
        if walltime_line is None:
            assert plan.walltime_s is None
            assert "--lifetime" not in command
        else:
            lifetime = int(re.search(r"--lifetime (\d+)s", command).group(1))  # type: ignore[union-attr]
            stagger = int(re.search(r"--lifetime-stagger (\d+)s", command).group(1))  # type: ignore[union-attr]
            assert lifetime + stagger < 7200
            assert lifetime - stagger > 7200 / 2
        assert not cluster.workers  # nothing was submitted
    finally:
        cluster.close()


def test_user_worker_args_win(tmp_path: Path) -> None:
    cluster, _ = cluster_for_envs(
        dask_jobqueue.SLURMCluster,
        2,
        walltime="01:00:00",
        scaling="none",
        scheduler_options=SCHEDULER,
        log_directory=str(tmp_path),
        worker_extra_args=["--lifetime", "20s", "--resources", "gpu=1"],
    )
    try:
        command = cluster.job_script().splitlines()[-1]
        assert command.count("--lifetime") == 1
        assert "--lifetime 20s" in command
        assert "--resources gpu=1" in command
        assert DEFAULT_RESOURCE not in command
    finally:
        cluster.close()


def test_workers_start_without_the_profiler_unless_the_prologue_says_otherwise(tmp_path: Path) -> None:
    def lines(**kwargs: object) -> list[str]:
        cluster, _ = cluster_for_envs(
            dask_jobqueue.SLURMCluster,
            2,
            walltime="01:00:00",
            scaling="none",
            scheduler_options=SCHEDULER,
            log_directory=str(tmp_path),
            **kwargs,
        )
        try:
            return cluster.job_script().splitlines()
        finally:
            cluster.close()

    script = lines()
    export = script.index(NO_PROFILER_EXPORT)
    assert export < next(i for i, line in enumerate(script) if "distributed.cli.dask_worker" in line)
    mine = "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=True"
    script = lines(job_script_prologue=["module load python", mine])
    assert script.index(NO_PROFILER_EXPORT) < script.index("module load python") < script.index(mine)
    with dask.config.set({"jobqueue.slurm.job-script-prologue": ["source env.sh"]}):
        script = lines()
    assert script.index(NO_PROFILER_EXPORT) < script.index("source env.sh")


def test_cluster_for_envs_rejects_plan_fields() -> None:
    with pytest.raises(TypeError, match="cores"):
        cluster_for_envs(dask_jobqueue.SLURMCluster, 2, cores=4, scaling="none")
    with pytest.raises(ValueError, match="scaling"):
        cluster_for_envs(dask_jobqueue.SLURMCluster, 2, scaling="sometimes", scheduler_options=SCHEDULER)


# ----------------------------------------------------------------------------- a real cluster
@pytest.mark.timeout(180)
@pytest.mark.processes
def test_local_jobs_hold_envs(tmp_path: Path) -> None:
    """dask-jobqueue's LocalCluster runs the same job scripts as local processes."""
    import gymnasium as gym
    from dask_jobqueue.local import LocalCluster as JobsOnThisMachine

    from daskvec import DaskVecEnv

    cluster, plan = cluster_for_envs(
        JobsOnThisMachine,
        4,
        envs_per_worker=2,
        processes_per_job=1,
        memory_per_worker="1GiB",
        scaling="fixed",
        wait=120,
        scheduler_options=SCHEDULER,
        python=sys.executable,
        local_directory=str(tmp_path),
        worker_extra_args=["--no-dashboard"],
        nanny=False,
    )
    try:
        assert plan.jobs == 2
        env = DaskVecEnv(
            [lambda: gym.make("CartPole-v1") for _ in range(4)], client=cluster, timeout=60, **plan.vec_env_kwargs()
        )
        try:
            info = scheduler_workers(env.client)
            assert all(w["resources"] == {DEFAULT_RESOURCE: 2} for w in info.values())
            assert sorted(len(g["envs"]) for g in env.groups) == [2, 2]
            assert len({g["worker"] for g in env.groups}) == 2
            env.reset()
            for _ in range(5):
                _, rewards, _, _ = env.step(np.zeros(4, dtype=np.int64))
            assert rewards.tolist() == [1.0] * 4
        finally:
            env.close()
        # DaskVecEnv closed only its own client: the cluster still has its jobs
        assert len(cluster.workers) == 2
        # a second call rescales the same cluster, here to 1 job of 2 envs
        assert scale_for_envs(cluster, 2, envs_per_worker=2, scaling="fixed") == 1
    finally:
        cluster.close()
