"""Size a dask-jobqueue cluster (SLURM, PBS, SGE, LSF, ...) for a number of envs.

On a batch system each Dask worker is started by a job; how many jobs to ask for, how
many cores, worker processes and how much memory each needs, and when each worker
should leave before its walltime, all follow from how many envs you want to run.
:func:`plan_jobs` works this out, :func:`cluster_for_envs` builds and scales the
cluster from it, and :func:`scale_for_envs` scales a cluster you made yourself.

An env-group actor runs on its worker's single actor thread, so a worker *process*
steps its envs one after the other: one process per core (``threads_per_process=1``)
is the layout that steps envs in parallel.

Walltime: each worker is given ``--lifetime`` a little shorter than the job's walltime
(and a ``--lifetime-stagger`` so that workers of one batch do not all leave at once).
Every env group reports that deadline to :class:`~daskvec.DaskVecEnv`, which moves the
envs off a worker ``migrate_before`` seconds ahead of it, reporting truncations, while
an adaptive cluster submits replacement jobs.

Example
-------
>>> from dask_jobqueue import SLURMCluster                      # doctest: +SKIP
>>> from daskvec.jobqueue import cluster_for_envs               # doctest: +SKIP
>>> cluster, plan = cluster_for_envs(SLURMCluster, 64, envs_per_worker=4,
...     processes_per_job=8, queue="normal", walltime="02:00:00")  # doctest: +SKIP
>>> env = DaskVecEnv(env_fns, client=cluster, **plan.vec_env_kwargs())  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dask.utils import format_bytes, parse_bytes

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_RESOURCE",
    "JobPlan",
    "cluster_for_envs",
    "keep_ctrl_c",
    "parse_walltime",
    "plan_jobs",
    "scale_for_envs",
]

#: Name of the worker resource that marks workers started to hold envs.
DEFAULT_RESOURCE = "daskvec_envs"

_SCALINGS = ("adapt", "fixed", "none")

# Batch systems whose walltime is written ``[hours:]minutes`` rather than ``[[days-]hours:]minutes:seconds``.
_MINUTE_FORMATS = ("lsf",)


_SigintHandler = Callable[[int, Any], Any] | int | None


def _is_jobqueue_handler(handler: _SigintHandler) -> bool:
    return str(getattr(handler, "__module__", "") or "").startswith("dask_jobqueue")


#: The SIGINT handler when this module was imported, unless dask-jobqueue had replaced it already.
_SIGINT_BEFORE: _SigintHandler = signal.getsignal(signal.SIGINT)
if _is_jobqueue_handler(_SIGINT_BEFORE):
    _SIGINT_BEFORE = signal.default_int_handler


def keep_ctrl_c() -> bool:
    """Put back the SIGINT handler that importing dask-jobqueue replaced, so Ctrl-C stays a ``KeyboardInterrupt``.

    ``import dask_jobqueue`` (0.9) installs a SIGINT handler that calls ``sys.exit()``
    (its runners' scheduler and worker processes stop themselves with SIGINT; they
    never run daskvec's code). From then on Ctrl-C during ``model.learn`` is a
    ``SystemExit``, which code catching ``KeyboardInterrupt`` (a training loop that
    saves and stops, ``daskvec train``'s "interrupted") does not expect.

    Called when this module is imported, by :func:`cluster_for_envs` and
    :func:`scale_for_envs`, and by ``DaskVecEnv`` given a dask-jobqueue cluster. It puts
    back the handler this module found when it was imported (Python's own if
    dask-jobqueue was imported first). A handler that is not dask-jobqueue's is left
    alone, as is everything outside the main thread, where handlers cannot be set.

    Returns
    -------
    bool
        Whether a handler was put back.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    if not _is_jobqueue_handler(signal.getsignal(signal.SIGINT)):
        return False
    signal.signal(signal.SIGINT, _SIGINT_BEFORE)
    logger.debug("put back the SIGINT handler that importing dask_jobqueue replaced (Ctrl-C: KeyboardInterrupt)")
    return True


keep_ctrl_c()  # dask_jobqueue imported before this module (``from dask_jobqueue import SLURMCluster`` first)


def parse_walltime(walltime: str | int | float, system: str = "slurm") -> float:
    """Seconds in a batch-system walltime string.

    Parameters
    ----------
    walltime : str, int or float
        ``"HH:MM:SS"``, ``"D-HH:MM:SS"``, ``"MM:SS"`` or ``"MM"`` (SLURM, PBS, SGE,
        OAR, Moab; a lone number is minutes, as ``sbatch -t`` reads it), ``"HH:MM"``
        or ``"MM"`` for LSF (``bsub -W``). Numbers are seconds.
    system : str
        The dask-jobqueue config name of the batch system (``"slurm"``, ``"pbs"``,
        ``"lsf"``, ...), which decides how a string is read.

    Returns
    -------
    float

    Raises
    ------
    ValueError
        For a string that is not a walltime.

    Examples
    --------
    >>> parse_walltime("01:30:00")
    5400.0
    >>> parse_walltime("1-00:00:00")
    86400.0
    >>> parse_walltime("02:00", "lsf")
    7200.0
    """
    if isinstance(walltime, (int, float)):
        return float(walltime)
    text = str(walltime).strip()
    m = re.fullmatch(r"(?:(\d+)-)?(\d+(?::\d+){0,2})", text)
    if not m:
        raise ValueError(f"walltime {walltime!r} is not of the form [D-]HH:MM:SS, MM:SS or MM")
    days = int(m.group(1) or 0)
    parts = [int(p) for p in m.group(2).split(":")]
    if system in _MINUTE_FORMATS:
        if len(parts) > 2 or days:
            raise ValueError(f"an LSF walltime is [HH:]MM, not {walltime!r}")
        hours, minutes = parts if len(parts) == 2 else [0, parts[0]]
        return float(hours * 3600 + minutes * 60)
    if len(parts) == 1:
        h, mi, s = 0, parts[0], 0
    elif len(parts) == 2:
        h, mi, s = 0, parts[0], parts[1]
    else:
        h, mi, s = parts
    return float(days * 86400 + h * 3600 + mi * 60 + s)


def _seconds_text(seconds: float) -> str:
    return f"{max(int(seconds), 1)}s"


@dataclass(frozen=True)
class JobPlan:
    """How many batch jobs, and of what shape, hold ``n_envs`` envs.

    Attributes
    ----------
    n_envs : int
        Envs to hold.
    envs_per_worker : int
        Envs each worker process holds.
    processes_per_job : int
        Dask worker processes per job (``processes=`` of dask-jobqueue).
    threads_per_process : int
        Threads per worker process.
    cores_per_job : int
        ``cores=`` of dask-jobqueue: ``processes_per_job * threads_per_process``.
    memory_per_job : str
        ``memory=`` of dask-jobqueue.
    workers : int
        Worker processes needed: ``ceil(n_envs / envs_per_worker)``.
    jobs : int
        Jobs to submit: ``ceil(workers / processes_per_job)``.
    walltime_s : float or None
        The jobs' walltime in seconds, when known.
    lifetime_s : float or None
        ``--lifetime`` given to each worker (before the stagger), when a walltime is known.
    stagger_s : float
        ``--lifetime-stagger`` given to each worker.
    resources : dict
        Worker resources each worker advertises (``--resources``), e.g. ``{"daskvec_envs": 4}``.
    """

    n_envs: int
    envs_per_worker: int
    processes_per_job: int
    threads_per_process: int
    cores_per_job: int
    memory_per_job: str
    workers: int
    jobs: int
    walltime_s: float | None = None
    lifetime_s: float | None = None
    stagger_s: float = 0.0
    resources: dict[str, float] = field(default_factory=dict)

    def worker_extra_args(self) -> list[str]:
        """Arguments for ``dask worker`` (dask-jobqueue's ``worker_extra_args``)."""
        args: list[str] = []
        if self.resources:
            args += ["--resources", ",".join(f"{k}={_num(v)}" for k, v in self.resources.items())]
        if self.lifetime_s is not None:
            args += ["--lifetime", _seconds_text(self.lifetime_s)]
            if self.stagger_s > 0:
                args += ["--lifetime-stagger", _seconds_text(self.stagger_s)]
        return args

    def cluster_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for a dask-jobqueue cluster class (cores, processes, memory, worker args)."""
        return {
            "cores": self.cores_per_job,
            "processes": self.processes_per_job,
            "memory": self.memory_per_job,
            "worker_extra_args": self.worker_extra_args(),
        }

    @property
    def migrate_before(self) -> float:
        """Seconds ahead of a worker's end to move its envs: 2 minutes, less for short lifetimes."""
        if self.lifetime_s is None:
            return 120.0
        return float(min(120.0, max(5.0, 0.25 * (self.lifetime_s - self.stagger_s))))

    def summary(self) -> str:
        """The plan in words, for log lines.

        Returns
        -------
        str
            E.g. ``"2 jobs x 8 worker processes (8 cores, 8.00GiB each), worker lifetime 3120s +/- 180s"``.
        """
        lifetime = f", worker lifetime {self.lifetime_s:.0f}s +/- {self.stagger_s:.0f}s" if self.lifetime_s else ""
        return (
            f"{self.jobs} jobs x {self.processes_per_job} worker processes "
            f"({self.cores_per_job} cores, {self.memory_per_job} each){lifetime}"
        )

    def vec_env_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~daskvec.DaskVecEnv` that match this plan.

        ``resources`` keeps envs on the workers started for them; ``migrate_before``
        fits the workers' lifetime; ``auto_rebalance`` spreads envs back over
        replacement jobs when they join.
        """
        out: dict[str, Any] = {"migrate_before": self.migrate_before, "auto_rebalance": True}
        if self.resources:
            out["resources"] = {k: 1 for k in self.resources}
        return out


def _num(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else str(v)


def _config_name(cluster_cls: Any, kwargs: dict[str, Any]) -> str:
    name = kwargs.get("config_name")
    if name:
        return str(name)
    job_cls = getattr(cluster_cls, "job_cls", None)
    return str(getattr(job_cls, "config_name", None) or getattr(cluster_cls, "config_name", "") or "slurm")


def plan_jobs(
    n_envs: int,
    *,
    envs_per_worker: int = 1,
    processes_per_job: int = 1,
    threads_per_process: int = 1,
    memory_per_worker: str | int = "1GiB",
    walltime: str | float | None = None,
    system: str = "slurm",
    lifetime_margin: float | None = None,
    lifetime_stagger: float | None = None,
    resource: str | None = DEFAULT_RESOURCE,
) -> JobPlan:
    """Work out the jobs that hold ``n_envs`` envs.

    Parameters
    ----------
    n_envs : int
        Number of environments.
    envs_per_worker : int
        Envs per worker process (they step one after another: more than 1 pays when a
        step is cheap compared with a network round trip).
    processes_per_job, threads_per_process : int
        Worker processes per job (one per core is usual) and threads per process (1 is enough).
    memory_per_worker : str or int
        Memory for one worker process, e.g. ``"2GiB"``.
    walltime : str or float, optional
        The jobs' walltime (see :func:`parse_walltime`); workers then get a ``--lifetime``
        so that they leave, and their envs move, before the batch system kills them.
    system : str
        dask-jobqueue config name of the batch system (``"slurm"``, ``"pbs"``, ``"lsf"``, ...).
    lifetime_margin : float, optional
        Seconds before the walltime by which every worker has left. Default:
        10% of the walltime, at most 5 minutes.
    lifetime_stagger : float, optional
        Spread of the workers' lifetimes (``--lifetime-stagger``), so that they leave at
        different times. Default: 5% of the walltime, at most 3 minutes.
    resource : str or None
        Name of the worker resource that marks env workers (``--resources
        NAME=envs_per_worker``); ``None`` adds none.

    Returns
    -------
    JobPlan

    Raises
    ------
    ValueError
        For non-positive counts, or a walltime shorter than the margin.

    Examples
    --------
    >>> plan = plan_jobs(64, envs_per_worker=4, processes_per_job=8)
    >>> plan.workers, plan.jobs, plan.cores_per_job
    (16, 2, 8)
    """
    counts = {"n_envs": n_envs, "envs_per_worker": envs_per_worker, "processes_per_job": processes_per_job}
    for name, value in {**counts, "threads_per_process": threads_per_process}.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, not {value!r}")
    mem = parse_bytes(memory_per_worker) if isinstance(memory_per_worker, str) else int(memory_per_worker)
    if mem <= 0:
        raise ValueError(f"memory_per_worker must be positive, not {memory_per_worker!r}")
    workers = math.ceil(n_envs / envs_per_worker)
    jobs = math.ceil(workers / processes_per_job)
    walltime_s, lifetime_s, stagger = _lifetime(walltime, system, lifetime_margin, lifetime_stagger)
    return JobPlan(
        n_envs=n_envs,
        envs_per_worker=envs_per_worker,
        processes_per_job=processes_per_job,
        threads_per_process=threads_per_process,
        cores_per_job=processes_per_job * threads_per_process,
        memory_per_job=format_bytes(mem * processes_per_job).replace(" ", ""),
        workers=workers,
        jobs=jobs,
        walltime_s=walltime_s,
        lifetime_s=lifetime_s,
        stagger_s=stagger,
        resources={resource: float(envs_per_worker)} if resource else {},
    )


def _lifetime(
    walltime: str | float | None, system: str, margin: float | None, stagger: float | None
) -> tuple[float | None, float | None, float]:
    """``(walltime, lifetime, stagger)`` in seconds for :func:`plan_jobs` (``None`` without a walltime)."""
    if walltime is None:
        return None, None, 0.0
    walltime_s = parse_walltime(walltime, system)
    margin_s = min(300.0, 0.10 * walltime_s) if margin is None else float(margin)
    stagger_s = min(180.0, 0.05 * walltime_s) if stagger is None else float(stagger)
    lifetime_s = walltime_s - margin_s - stagger_s
    if margin_s < 0 or stagger_s < 0 or lifetime_s - stagger_s <= 0:
        raise ValueError(
            f"walltime {walltime!r} ({walltime_s:.0f}s) leaves no lifetime after a margin of "
            f"{margin_s:.0f}s and a stagger of {stagger_s:.0f}s; ask for a longer walltime"
        )
    return walltime_s, lifetime_s, stagger_s


def _has_option(args: list[str], option: str) -> bool:
    return any(a == option or a.startswith(option + "=") for a in args)


#: First line of the job script prologue of the clusters :func:`cluster_for_envs` makes
#: for the batch systems whose job script is a shell script.
NO_PROFILER_EXPORT = "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"
_SHELL_SCRIPT_SYSTEMS = frozenset({"slurm", "pbs", "sge", "lsf", "oar", "moab"})


def cluster_for_envs(
    cluster_cls: Any,
    n_envs: int,
    *,
    envs_per_worker: int = 1,
    processes_per_job: int = 1,
    threads_per_process: int = 1,
    memory_per_worker: str | int = "1GiB",
    lifetime_margin: float | None = None,
    lifetime_stagger: float | None = None,
    resource: str | None = DEFAULT_RESOURCE,
    scaling: str = "adapt",
    spare_jobs: int = 0,
    wait: float | None = None,
    **cluster_kwargs: Any,
) -> tuple[Any, JobPlan]:
    """Create a dask-jobqueue cluster sized for ``n_envs`` envs, and scale it.

    Parameters
    ----------
    cluster_cls : type
        A dask-jobqueue cluster class (``SLURMCluster``, ``PBSCluster``, ``SGECluster``, ...).
    n_envs : int
        Number of environments the cluster must hold.
    envs_per_worker, processes_per_job, threads_per_process, memory_per_worker : optional
        See :func:`plan_jobs`.
    lifetime_margin, lifetime_stagger, resource : optional
        See :func:`plan_jobs`. The walltime is read from ``walltime=`` in
        ``cluster_kwargs``, else from dask-jobqueue's configuration.
    scaling : {"adapt", "fixed", "none"}
        ``"adapt"`` (default): ``cluster.adapt(minimum_jobs=jobs, maximum_jobs=jobs +
        spare_jobs)``, so that jobs that end (walltime, ``scancel``, node failure)
        are replaced by new ones. ``"fixed"``: ``cluster.scale(jobs=jobs)``, jobs
        that end are not replaced. ``"none"``: submit nothing (e.g. to inspect
        ``cluster.job_script()`` first, then call :func:`scale_for_envs`).
    spare_jobs : int
        Extra jobs the adaptive cluster may hold (replacements start before workers leave).
    wait : float, optional
        Block until all planned workers have joined, at most this many seconds.
    **cluster_kwargs
        Passed to ``cluster_cls`` (``queue``, ``account``, ``walltime``,
        ``scheduler_options``, ``log_directory``, ``job_extra_directives``, ...).
        ``cores``, ``processes`` and ``memory`` come from the plan; your
        ``worker_extra_args`` are kept and the plan's added (an explicit
        ``--lifetime`` or ``--resources`` of yours wins). On SLURM, PBS, SGE, LSF, OAR
        and Moab the job script first turns Dask's profiler off (it can deadlock workers
        on Python 3.11, see :func:`daskvec.worker.profiler_hazard`), then runs your
        ``job_script_prologue``, which may turn it on again.

    Returns
    -------
    cluster : JobQueueCluster
        The cluster, scaled; pass it (or a ``Client`` on it) to ``DaskVecEnv``.
    plan : JobPlan
        The plan; ``plan.vec_env_kwargs()`` gives the matching ``DaskVecEnv`` options.

    Raises
    ------
    TypeError
        If ``cores``, ``processes`` or ``memory`` are given (they come from the plan).
    TimeoutError
        If ``wait`` is given and the workers did not all join in time (the cluster
        is closed first).
    """
    keep_ctrl_c()
    _refuse_planned_kwargs(cluster_kwargs)
    system, plan = _plan_for(
        cluster_cls,
        n_envs,
        cluster_kwargs,
        envs_per_worker=envs_per_worker,
        processes_per_job=processes_per_job,
        threads_per_process=threads_per_process,
        memory_per_worker=memory_per_worker,
        lifetime_margin=lifetime_margin,
        lifetime_stagger=lifetime_stagger,
        resource=resource,
    )
    if scaling not in _SCALINGS:
        raise ValueError(f"scaling must be one of {_SCALINGS}, not {scaling!r}")
    kwargs = _cluster_kwargs(plan, system, cluster_kwargs)
    cluster = _start_scaled(cluster_cls, kwargs, plan, scaling=scaling, spare_jobs=spare_jobs, wait=wait)
    logger.info("%s for %d envs: %s", type(cluster).__name__, n_envs, plan.summary())
    return cluster, plan


def _plan_for(cluster_cls: Any, n_envs: int, cluster_kwargs: dict[str, Any], **sizes: Any) -> tuple[str, JobPlan]:
    """The batch system's config name, and :func:`plan_jobs` for ``n_envs`` envs on it.

    The walltime is ``cluster_kwargs``' ``walltime``, else that of dask-jobqueue's config
    for the system; ``sizes`` are :func:`plan_jobs`' other keywords.
    """
    system = _config_name(cluster_cls, cluster_kwargs)
    return system, plan_jobs(n_envs, walltime=_walltime(system, cluster_kwargs), system=system, **sizes)


def _cluster_kwargs(plan: JobPlan, system: str, cluster_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The job-queue cluster's keyword arguments: the plan's, the user's worker arguments merged in, theirs over it."""
    user_args = [str(a) for a in cluster_kwargs.pop("worker_extra_args", None) or []]
    kwargs = {
        **plan.cluster_kwargs(),
        "worker_extra_args": _merge_worker_args(user_args, plan.worker_extra_args()),
        **cluster_kwargs,
    }
    if system in _SHELL_SCRIPT_SYSTEMS:
        kwargs["job_script_prologue"] = _prologue_without_profiler(system, kwargs.get("job_script_prologue"))
    return kwargs


def _refuse_planned_kwargs(cluster_kwargs: dict[str, Any]) -> None:
    """Raise ``TypeError`` if the caller passed a cluster option that the plan sets."""
    clash = sorted({"cores", "processes", "memory"} & set(cluster_kwargs))
    if clash:
        raise TypeError(
            f"cluster_for_envs sets {', '.join(clash)} from the plan; use envs_per_worker, "
            "processes_per_job, threads_per_process and memory_per_worker instead"
        )


def _walltime(system: str, cluster_kwargs: dict[str, Any]) -> Any:
    """The jobs' walltime: ``walltime=`` of the caller, else dask-jobqueue's configuration."""
    walltime = cluster_kwargs.get("walltime")
    if walltime is None:
        import dask

        walltime = dask.config.get(f"jobqueue.{system}.walltime", None)
    return walltime


def _merge_worker_args(user_args: list[str], ours: list[str]) -> list[str]:
    """The caller's worker arguments, then each of the plan's the caller did not give.

    An explicit ``--lifetime`` of the caller's also drops the plan's ``--lifetime-stagger``.
    """
    merged = list(user_args)
    for opt, value in zip(ours[::2], ours[1::2], strict=True):
        explicit_lifetime = opt == "--lifetime-stagger" and _has_option(user_args, "--lifetime")
        if not _has_option(user_args, opt) and not explicit_lifetime:
            merged += [opt, value]
    return merged


def _prologue_without_profiler(system: str, prologue: list[str] | None) -> list[str]:
    """The job script prologue, led by the line that turns Dask's profiler off.

    Workers without Dask's stack-sampling profiler (see daskvec.worker.profiler_hazard);
    a prologue of the user's, or from the config, runs after this line and may undo it.
    """
    if prologue is None:
        import dask

        prologue = dask.config.get(f"jobqueue.{system}.job-script-prologue", None) or []
    return [NO_PROFILER_EXPORT, *prologue]


def _start_scaled(
    cluster_cls: Any, kwargs: dict[str, Any], plan: JobPlan, *, scaling: str, spare_jobs: int, wait: float | None
) -> Any:
    """Create the cluster and scale it for ``plan`` (unless ``scaling="none"``); close it if that fails.

    Its scheduler, which runs in this process, serves the daskvec dashboard page.
    """
    from daskvec.cluster.clients import install_dashboard_page

    install_dashboard_page()
    cluster = cluster_cls(**kwargs)
    try:
        if scaling != "none":
            scale_for_envs(cluster, plan, scaling=scaling, spare_jobs=spare_jobs, wait=wait)
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.close()
        raise
    return cluster


def _processes_per_job(cluster: Any) -> int:
    job = getattr(cluster, "_dummy_job", None)
    n = getattr(job, "worker_processes", None)
    if n:
        return int(n)
    group = (getattr(cluster, "new_spec", None) or {}).get("group")
    return len(group) if group else 1


def scale_for_envs(
    cluster: Any,
    n_envs: int | JobPlan,
    *,
    envs_per_worker: int = 1,
    scaling: str = "adapt",
    spare_jobs: int = 0,
    wait: float | None = None,
) -> int:
    """Scale an existing dask-jobqueue cluster so that it holds ``n_envs`` envs.

    Parameters
    ----------
    cluster : JobQueueCluster
        A cluster created by you (its ``processes`` per job is read from it).
    n_envs : int or JobPlan
        Number of envs, or a plan from :func:`plan_jobs`.
    envs_per_worker : int
        Envs per worker process (ignored when a plan is given).
    scaling : {"adapt", "fixed"}
        Adaptive (replaces jobs that end) or a fixed ``scale(jobs=...)``.
    spare_jobs : int
        Extra jobs an adaptive cluster may hold.
    wait : float, optional
        Block until all the workers have joined, at most this many seconds.

    Returns
    -------
    int
        The number of jobs asked for.

    Raises
    ------
    TimeoutError
        If ``wait`` is given and the workers did not all join in time.
    """
    keep_ctrl_c()
    if scaling not in ("adapt", "fixed"):
        raise ValueError(f"scaling must be 'adapt' or 'fixed', not {scaling!r}")
    if not isinstance(spare_jobs, int) or spare_jobs < 0:
        raise ValueError(f"spare_jobs must be an int >= 0, not {spare_jobs!r}")
    per_job = _processes_per_job(cluster)
    if isinstance(n_envs, JobPlan):
        if n_envs.processes_per_job != per_job:
            raise ValueError(
                f"the plan has {n_envs.processes_per_job} worker processes per job but the cluster "
                f"starts {per_job}; make the plan with processes_per_job={per_job}"
            )
        jobs = n_envs.jobs
    else:
        jobs = plan_jobs(n_envs, envs_per_worker=envs_per_worker, processes_per_job=per_job, resource=None).jobs
    if scaling == "adapt":
        # one-second checks: a job that ended is noticed and replaced quickly
        cluster.adapt(minimum_jobs=jobs, maximum_jobs=jobs + spare_jobs, interval="1s", wait_count=3)
    else:
        cluster.scale(jobs=jobs)
    if wait is not None:
        _wait_for_workers(cluster, jobs * per_job, wait)
    return jobs


def _wait_for_workers(cluster: Any, n: int, timeout: float) -> None:
    from distributed import Client

    with Client(cluster, set_as_default=False) as client:
        client.wait_for_workers(n, timeout=timeout)
