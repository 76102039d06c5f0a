"""The part of :mod:`daskvec.learners.zoo` that needs ``rl_zoo3``: the zoo's experiment manager, subclassed.

:mod:`daskvec.learners.zoo` imports this module only when it runs the zoo, so that it can
be imported (by the docs' API reference, by ``daskvec zoo --help``) without ``rl_zoo3``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import rl_zoo3.train as zoo_train
from rl_zoo3.exp_manager import ExperimentManager
from stable_baselines3.common.vec_env import VecEnv

from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics
from daskvec.sb3.vec_env import DaskVecEnv

logger = logging.getLogger(__name__)

__all__ = ["DaskExperimentManager", "zoo_entry", "zoo_train"]


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


@contextlib.contextmanager
def zoo_entry(manager: type[ExperimentManager], argv: Sequence[str]) -> Iterator[None]:
    """While inside: the zoo's ``train`` reads ``argv`` and builds ``manager``."""
    saved_argv, saved_manager = sys.argv, zoo_train.ExperimentManager
    sys.argv = ["daskvec zoo", *argv]
    zoo_train.ExperimentManager = manager  # type: ignore[misc]
    try:
        yield
    finally:
        sys.argv = saved_argv
        zoo_train.ExperimentManager = saved_manager  # type: ignore[misc]
