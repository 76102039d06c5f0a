"""RL Zoo on a Dask cluster: rl_zoo3's own training, with its envs in a DaskVecEnv.

rl-baselines3-zoo (``rl_zoo3``) keeps tuned hyperparameters for most SB3 algorithms and
envs, and trains them with its ``train`` entry point, whose vec env is ``DummyVecEnv``
or ``SubprocVecEnv``. :func:`train_zoo` runs that same entry point, unchanged, with a
subclass of the zoo's :class:`rl_zoo3.exp_manager.ExperimentManager` in place of the
original: the zoo's hook for other vec envs (``default_vec_env_cls``) is set to
:class:`~daskvec.DaskVecEnv`, and its ``vec_env_kwargs`` carry daskvec's options. Every
option of the zoo's ``train`` works as documented by the zoo; ``--vec-env`` is ignored.

The subclass also

- makes the experiment's folders absolute, since the envs' ``Monitor`` files are written
  by the workers, whose working directory is not the client's;
- adds :class:`~daskvec.DaskVecEnvMetrics` to the zoo's callbacks (figures in the zoo's
  logs and TensorBoard);
- closes every vec env it created at the end (the zoo leaves its evaluation env open).

``daskvec zoo`` (:mod:`daskvec.cli`) is the command-line face of :func:`train_zoo`.
Running the zoo needs ``rl_zoo3`` (``pip install "daskvec[zoo]"``); importing this module
does not: ``rl_zoo3`` is imported when :func:`train_zoo` runs or
:class:`DaskExperimentManager` is first used (a ``ModuleNotFoundError`` saying what to
install when it is missing), so that the API reference and ``daskvec zoo --help`` work
without it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stable_baselines3.common.vec_env import VecEnv

from daskvec.cluster.clients import embedded_cluster

if TYPE_CHECKING:
    from daskvec.learners._zoo_manager import DaskExperimentManager

logger = logging.getLogger(__name__)

__all__ = ["DaskExperimentManager", "ZooRun", "train_zoo"]


@dataclass
class ZooRun:
    """What :func:`train_zoo` did.

    Attributes
    ----------
    envs : list of VecEnv
        The vec envs the zoo created (closed by now).
    save_paths : list of str
        Each experiment's folder (the model, ``config.yml``, the monitor files).
    dashboard_link : str or None
        The embedded cluster's dashboard, when one was started.
    """

    envs: list[VecEnv] = field(default_factory=list)
    save_paths: list[str] = field(default_factory=list)
    dashboard_link: str | None = None


def train_zoo(
    zoo_args: Sequence[str],
    client: Any = None,
    *,
    n_workers: int | None = None,
    record_metrics: bool = True,
    **vec_env_kwargs: Any,
) -> ZooRun:
    """Run rl_zoo3's ``train`` with ``zoo_args``, its envs in DaskVecEnvs on one cluster.

    Parameters
    ----------
    zoo_args : sequence of str
        Arguments of the zoo's ``train`` (``python -m rl_zoo3.train --help``), e.g.
        ``["--algo", "ppo", "--env", "CartPole-v1", "-n", "5000"]``.
    client : distributed.Client, str, Cluster or None
        The cluster of every vec env (training and evaluation). ``None`` starts one
        embedded ``LocalCluster`` for the whole run and closes it at the end.
    n_workers : int, optional
        Workers of that embedded cluster (default: one per core). Only without ``client``.
    record_metrics : bool
        Add :class:`~daskvec.DaskVecEnvMetrics` to the zoo's callbacks.
    **vec_env_kwargs
        Further :class:`~daskvec.DaskVecEnv` options (``envs_per_actor``, ``transport``...).

    Returns
    -------
    ZooRun

    Raises
    ------
    ValueError
        ``n_workers`` given with a ``client``.
    """
    if n_workers is not None and client is not None:
        raise ValueError("n_workers sizes the embedded cluster; with a client or scheduler, its own workers are used")
    if "--vec-env" in zoo_args:
        logger.warning("daskvec zoo ignores --vec-env: its envs always live in a DaskVecEnv")
    manager_class = _manager_class()  # before the cluster starts: a missing rl_zoo3 says so at once
    from daskvec.learners._zoo_manager import zoo_entry, zoo_train

    cluster = embedded_cluster(n_workers) if client is None else None
    run = ZooRun(dashboard_link=getattr(cluster, "dashboard_link", None))
    manager = manager_class.configured({"client": cluster or client, **vec_env_kwargs}, record_metrics)
    try:
        if run.dashboard_link:
            logger.info("daskvec zoo: embedded cluster, dashboard %s", run.dashboard_link)
        with zoo_entry(manager, zoo_args):
            zoo_train.train()
    finally:
        manager.close_envs()
        run.envs = list(manager.created)
        run.save_paths = list(manager.save_paths)
        if cluster is not None:
            cluster.close(timeout=30)
    return run


def _manager_class() -> type[DaskExperimentManager]:
    """:class:`DaskExperimentManager`, whose module imports ``rl_zoo3``: imported on first use."""
    try:
        from daskvec.learners._zoo_manager import DaskExperimentManager
    except ModuleNotFoundError as e:
        if e.name is None or e.name.split(".")[0] != "rl_zoo3":
            raise
        raise ModuleNotFoundError(f'daskvec zoo needs rl_zoo3 ({e}): pip install "daskvec[zoo]"', name=e.name) from e
    return DaskExperimentManager


def __getattr__(name: str) -> Any:
    # DaskExperimentManager subclasses rl_zoo3's ExperimentManager: built on first use, so
    # that this module imports without rl_zoo3
    if name == "DaskExperimentManager":
        return _manager_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
