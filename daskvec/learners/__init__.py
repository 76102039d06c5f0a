"""Learners that collect on the Dask workers: SB3's algorithms with a worker-side ``collect_rollouts``.

- :mod:`daskvec.learners.on_policy`: :class:`DaskPPO`, :class:`DaskA2C`, and the plan of
  which ``VecEnv`` wrappers a worker-side rollout reproduces;
- :mod:`daskvec.learners.off_policy`: :class:`DaskSAC`, :class:`DaskTD3`,
  :class:`DaskDDPG`, :class:`DaskDQN`;
- :mod:`daskvec.learners.zoo`: RL Zoo's training with a :class:`~daskvec.DaskVecEnv`.

Users import the learners from :mod:`daskvec.sb3`. The workers' half of each collection
is in :mod:`daskvec.worker.on_policy` and :mod:`daskvec.worker.off_policy`.
"""
