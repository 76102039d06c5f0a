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
Importing this module needs ``rl_zoo3`` (``pip install "daskvec[zoo]"``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import rl_zoo3.train as zoo_train
from rl_zoo3.exp_manager import ExperimentManager
from stable_baselines3.common.vec_env import VecEnv

from daskvec.cluster.clients import embedded_cluster
from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics
from daskvec.sb3.vec_env import DaskVecEnv

logger = logging.getLogger(__name__)

__all__ = ["DaskExperimentManager", "ZooRun", "train_zoo"]


class DaskExperimentManager(ExperimentManager):
    """rl_zoo3's ``ExperimentManager`` with its envs in :class:`~daskvec.DaskVecEnv`.

    Use :meth:`configured` to get a subclass bound to a cluster and options; the zoo's
    ``train`` entry point then creates it with its own arguments.

    Attributes
    ----------
    dask_vec_env_kwargs : dict
        Keyword arguments of every DaskVecEnv (``client=`` and the options).
    record_metrics : bool
        Whether to add :class:`~daskvec.DaskVecEnvMetrics` to the zoo's callbacks.
    created : list of VecEnv
        Every vec env the managers of this class created (training and evaluation).
    save_paths : list of str
        The folder of each experiment of this class.
    """

    default_vec_env_cls = DaskVecEnv
    dask_vec_env_kwargs: ClassVar[dict[str, Any]] = {}
    record_metrics: ClassVar[bool] = True
    created: ClassVar[list[VecEnv]] = []
    save_paths: ClassVar[list[str]] = []

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.vec_env_class = DaskVecEnv  # what default_vec_env_cls does, whatever --vec-env said
        self.vec_env_kwargs = dict(self.dask_vec_env_kwargs)
        # the workers write the Monitor files: give them paths that do not depend on their cwd
        self.log_path = os.path.abspath(self.log_path)
        self.save_path = os.path.abspath(self.save_path)
        self.params_path = os.path.abspath(self.params_path)
        type(self).save_paths.append(self.save_path)

    @classmethod
    def configured(cls, vec_env_kwargs: dict[str, Any], record_metrics: bool = True) -> type[DaskExperimentManager]:
        """A subclass whose vec envs get ``vec_env_kwargs`` and that keeps its own list of envs."""
        attrs = {
            "dask_vec_env_kwargs": dict(vec_env_kwargs),
            "record_metrics": record_metrics,
            "created": [],
            "save_paths": [],
        }
        return type(cls.__name__, (cls,), attrs)

    def create_envs(self, n_envs: int, eval_env: bool = False, no_log: bool = False) -> VecEnv:
        """The zoo's envs (wrappers, normalisation, frame stacking) over a DaskVecEnv."""
        env = super().create_envs(n_envs, eval_env=eval_env, no_log=no_log)
        type(self).created.append(env)
        return env

    def create_callbacks(self) -> None:
        """The zoo's callbacks, and :class:`~daskvec.DaskVecEnvMetrics` after them."""
        super().create_callbacks()
        if self.record_metrics:
            self.callbacks.append(DaskVecEnvMetrics())

    @classmethod
    def close_envs(cls) -> None:
        """Close every vec env this class created (closing twice is harmless)."""
        for env in cls.created:
            try:
                env.close()
            except Exception:  # one env failing to close must not keep the others open
                logger.exception("closing a vec env of the zoo run failed")


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


@contextlib.contextmanager
def _zoo_entry(manager: type[ExperimentManager], argv: Sequence[str]) -> Iterator[None]:
    """While inside: the zoo's ``train`` reads ``argv`` and builds ``manager``."""
    saved_argv, saved_manager = sys.argv, zoo_train.ExperimentManager
    sys.argv = ["daskvec zoo", *argv]
    zoo_train.ExperimentManager = manager  # type: ignore[misc]
    try:
        yield
    finally:
        sys.argv = saved_argv
        zoo_train.ExperimentManager = saved_manager  # type: ignore[misc]


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
    cluster = embedded_cluster(n_workers) if client is None else None
    run = ZooRun(dashboard_link=getattr(cluster, "dashboard_link", None))
    manager = DaskExperimentManager.configured({"client": cluster or client, **vec_env_kwargs}, record_metrics)
    try:
        if run.dashboard_link:
            logger.info("daskvec zoo: embedded cluster, dashboard %s", run.dashboard_link)
        with _zoo_entry(manager, zoo_args):
            zoo_train.train()
    finally:
        manager.close_envs()
        run.envs = list(manager.created)
        run.save_paths = list(manager.save_paths)
        if cluster is not None:
            cluster.close(timeout=30)
    return run
