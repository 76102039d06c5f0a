"""DaskVecEnv on a real SLURM through dask-jobqueue (``.ci/slurm.sh start`` sets one up).

Every test here is skipped, with the reason, when ``sinfo`` is missing or the node is
not idle. Only two one-core jobs run at once on the CI machine, so each cluster here
holds at most two.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from waiting import wait_until

from daskvec.cluster.clients import scheduler_workers

pytestmark = pytest.mark.slurm

SCHEDULER = {"host": "127.0.0.1", "dashboard_address": ":0"}


def slurm_skip_reason() -> str | None:
    """Why the SLURM tests cannot run here, or ``None`` when they can."""
    try:
        import dask_jobqueue  # noqa: F401
    except ImportError:
        return "dask-jobqueue is not installed (pip install 'daskvec[jobqueue]')"
    if shutil.which("sinfo") is None:
        return "no SLURM here: `sinfo` not found (run `.ci/slurm.sh start` as root to start a single-node SLURM)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"`sinfo` failed ({e})"
    states = out.stdout.split()
    if out.returncode != 0 or not {"idle", "mixed"} & set(states):
        detail = (out.stdout.strip() or out.stderr.strip() or "no nodes").replace("\n", " ")
        return f"SLURM is not idle (sinfo: {detail}); run `.ci/slurm.sh start`"
    return None


@pytest.fixture(scope="module")
def slurm() -> None:
    reason = slurm_skip_reason()
    if reason:
        pytest.skip(reason)


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM state of each of ``job_ids`` still known to ``squeue``."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=20).stdout
    states = dict(line.split() for line in out.splitlines() if line.strip())
    return {j: states[j] for j in job_ids if j in states}


def job_of_worker(cluster: Any, client: Any, address: str) -> str:
    """The SLURM job id of the Dask worker at ``address``."""
    name = scheduler_workers(client)[address]["name"]
    return str(cluster.workers[name].job_id)


def cartpoles(n: int) -> list[Any]:
    return [lambda: gym.make("CartPole-v1") for _ in range(n)]


@pytest.fixture(scope="class")
def slurm_cluster(slurm: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """An adaptive SLURMCluster of two one-core jobs, sized for 4 envs by the helper.

    Class-scoped: its jobs hold both cores of the CI node, so it must be gone before
    the other tests submit theirs.
    """
    from dask_jobqueue import SLURMCluster

    from daskvec.jobqueue import cluster_for_envs

    tmp = tmp_path_factory.mktemp("slurm")
    cluster, plan = cluster_for_envs(
        SLURMCluster,
        4,
        envs_per_worker=2,
        memory_per_worker="1GB",
        queue="debug",
        walltime="00:10:00",
        python=sys.executable,
        scheduler_options=SCHEDULER,
        log_directory=str(tmp / "logs"),
        local_directory=str(tmp / "work"),
        wait=120,
    )
    try:
        yield cluster, plan
    finally:
        jobs = [str(j.job_id) for j in cluster.workers.values()]
        cluster.close()
        # closing the cluster cancels its jobs
        wait_until(lambda: not squeue_states(jobs), 30, f"jobs {jobs} to leave the queue", every=0.5)


class TestTwoJobs:
    """Two SLURM jobs holding envs: placement, PPO, a cancelled job, its replacement."""

    @pytest.mark.timeout(120)
    def test_envs_live_in_two_slurm_jobs(self, slurm_cluster: tuple[Any, Any]) -> None:
        from daskvec import DaskVecEnv

        cluster, plan = slurm_cluster
        assert plan.jobs == 2
        # the cluster object itself is the client= argument
        env = DaskVecEnv(cartpoles(4), client=cluster, timeout=60, **plan.vec_env_kwargs())
        try:
            workers = {g["worker"] for g in env.groups}
            assert len(workers) == 2
            assert sorted(len(g["envs"]) for g in env.groups) == [2, 2]
            jobs = [job_of_worker(cluster, env.client, w) for w in workers]
            assert set(squeue_states(jobs).values()) == {"RUNNING"}
            # each group knows when its worker will go: within the job's walltime, after its lifetime margin
            now = time.time()
            assert plan.lifetime_s is not None
            for g in env.groups:
                assert g["deadline"] is not None
                assert now < g["deadline"] <= now + plan.lifetime_s + plan.stagger_s
            env.seed(3)
            env.reset()
            for _ in range(20):
                _, rewards, _, _ = env.step(np.array([0, 1, 0, 1]))
                assert rewards.tolist() == [1.0] * 4
        finally:
            env.close()
        # DaskVecEnv does not close a cluster it did not create: the jobs still run
        assert set(squeue_states(jobs).values()) == {"RUNNING"}

    @pytest.mark.timeout(240)
    def test_ppo_survives_scancel_and_cluster_replaces_job(self, slurm_cluster: tuple[Any, Any]) -> None:
        from distributed import Client
        from stable_baselines3 import PPO
        from stable_baselines3.common.callbacks import BaseCallback

        from daskvec import DaskVecEnv

        cluster, plan = slurm_cluster
        client = Client(cluster, direct_to_workers=True, set_as_default=False)
        env = DaskVecEnv(cartpoles(4), client=client, timeout=60, **{**plan.vec_env_kwargs(), "auto_rebalance": False})
        try:
            victim_worker = env.groups[0]["worker"]
            victim_envs = env.groups[0]["envs"]
            victim_job = job_of_worker(cluster, client, victim_worker)
            events: dict[str, Any] = {}

            class CancelJob(BaseCallback):
                """scancel the job holding env 0 once training is under way."""

                def _on_step(self) -> bool:
                    if "cancelled_at" not in events and self.num_timesteps >= 256:
                        subprocess.run(["scancel", victim_job], check=True, timeout=20)
                        events["cancelled_at"] = self.num_timesteps
                    for i, info in enumerate(self.locals["infos"]):
                        if "daskvec" in info:
                            events.setdefault("truncated", []).append(
                                (i, bool(self.locals["dones"][i]), info.get("TimeLimit.truncated"))
                            )
                    return True

            model = PPO("MlpPolicy", env, n_steps=128, batch_size=128, n_epochs=2, seed=0, device="cpu")
            model.learn(1024, callback=CancelJob())
            assert model.num_timesteps >= 1024
            assert events["cancelled_at"] >= 256
            # the cancelled job's envs were rebuilt on the other job and reported as truncations
            lost = [r for r in env.restart_log if r["reason"] == "worker_lost"]
            assert sorted(r["env"] for r in lost) == victim_envs
            assert all(r["from_worker"] == victim_worker for r in lost)
            assert sorted(i for i, _, _ in events["truncated"]) == victim_envs
            assert all(done and truncated for _, done, truncated in events["truncated"])
            assert victim_worker not in {g["worker"] for g in env.groups}

            # the adaptive cluster submits a replacement job; envs spread back onto it
            eligible = env._engine.directory.eligible
            wait_until(lambda: len(set(eligible()) - {victim_worker}) >= 2, 150, "a replacement SLURM job", every=0.5)
            assert env.rebalance() > 0
            env.step(np.zeros(4, dtype=np.int64))
            assert len({g["worker"] for g in env.groups}) == 2
            assert victim_worker not in {g["worker"] for g in env.groups}
        finally:
            env.close()
            client.close()


@pytest.mark.timeout(240)
def test_envs_leave_a_worker_before_its_lifetime(slurm: None, tmp_path: Path) -> None:
    """A worker whose ``--lifetime`` runs out hands its envs to a newer job before it goes."""
    from dask_jobqueue import SLURMCluster
    from distributed import Client

    from daskvec import DaskVecEnv
    from daskvec.jobqueue import plan_jobs

    # The lifetime must leave room for a second job to be scheduled and its worker to
    # start (10-25 s on a loaded CI machine) before the first worker's envs must move.
    lifetime = 60
    migrate_before = 10.0
    plan = plan_jobs(
        2,
        envs_per_worker=2,
        memory_per_worker="1GB",
        walltime="00:02:00",
        lifetime_margin=120 - lifetime,
        lifetime_stagger=0,
    )
    assert plan.lifetime_s == lifetime
    assert "--lifetime" in plan.worker_extra_args()
    cluster = SLURMCluster(
        **plan.cluster_kwargs(),
        queue="debug",
        walltime="00:02:00",
        python=sys.executable,
        scheduler_options=SCHEDULER,
        log_directory=str(tmp_path / "logs"),
        local_directory=str(tmp_path / "work"),
    )
    client = Client(cluster, direct_to_workers=True, set_as_default=False)
    env = None
    try:
        cluster.scale(jobs=1)
        client.wait_for_workers(1, timeout=120)
        env = DaskVecEnv(cartpoles(2), client=client, timeout=60, migrate_before=migrate_before)
        (old_worker,) = {g["worker"] for g in env.groups}
        old_deadline = env.groups[0]["deadline"]
        assert old_deadline is not None and old_deadline - time.time() <= lifetime
        cluster.scale(jobs=2)  # a second, younger job: it outlives the first
        # the move happens only if the younger worker is there before the old one's envs must go
        client.wait_for_workers(2, timeout=max(old_deadline - time.time() - migrate_before - 2, 1))
        env.reset()
        moved_infos: list[dict[str, Any]] = []
        stop = time.monotonic() + 150
        # step until the first worker has reached its lifetime and left the cluster
        while old_worker in scheduler_workers(client):
            assert time.monotonic() < stop, "the first worker never left"
            _, _, dones, infos = env.step(np.zeros(2, dtype=np.int64))
            for i, info in enumerate(infos):
                if info.get("daskvec", {}).get("reason") == "moved":
                    # a truncation, unless the episode happened to terminate on this very step
                    assert dones[i]
                    assert "terminal_observation" in info
                    assert "TimeLimit.truncated" in info
                    moved_infos.append(info["daskvec"])
        for _ in range(10):
            env.step(np.zeros(2, dtype=np.int64))
        # both envs moved off the expiring worker while it was still there; none was lost
        assert sorted(r["env"] for r in env.restart_log) == [0, 1]
        assert {r["reason"] for r in env.restart_log} == {"moved"}
        assert {m["from_worker"] for m in moved_infos} == {old_worker}
        assert len(moved_infos) == 2
        new_workers = {g["worker"] for g in env.groups}
        assert old_worker not in new_workers and len(new_workers) == 1
    finally:
        if env is not None:
            env.close()
        client.close()
        cluster.close()


@pytest.mark.timeout(120)
def test_worker_deadline_inside_a_slurm_job(slurm: None) -> None:
    """Inside a job, a worker's deadline is the job's end (start + walltime) when it has no lifetime."""
    probe = (
        "import time, types; from daskvec.worker import worker_deadline; "
        "print(time.time(), worker_deadline(types.SimpleNamespace(lifetime=None)), "
        "worker_deadline(types.SimpleNamespace(lifetime=30)))"
    )
    before = time.time()
    out = subprocess.run(
        ["srun", "-t", "00:03:00", "-n", "1", sys.executable, "-c", probe], capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr
    now, job_end, with_lifetime = (float(x) for x in out.stdout.split())
    # squeue gives the end to the second: start + 3 minutes
    assert before + 180 - 5 <= job_end <= now + 180 + 2
    # a lifetime that ends earlier wins; it counts from the process start, so it is at most 30 s away
    assert with_lifetime <= now + 30
    assert with_lifetime < job_end


@pytest.mark.timeout(300)
def test_hpc_notebook(slurm: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """notebooks/hpc.ipynb top to bottom on the real SLURM (here, beside the module's other SLURM tests)."""
    from notebook_runs import run_notebook, text_of

    nb = run_notebook("hpc.ipynb", tmp_path, monkeypatch, envs=4, timesteps=2048, queue="debug", walltime="00:10:00")
    text = text_of(nb)
    assert "#PBS -l walltime=04:00:00" in text
    assert "#SBATCH -t 00:10:00" in text
    assert "daskvec page: http" in text  # cluster_for_envs' scheduler serves the page, and it was checked
    assert "cancelled job" in text and "training finished at 2048" in text
    assert "'reason': 'worker_lost'" in text
    assert "envs moved:" in text
