"""Clusters: which client a vec env uses, and the cluster daskvec starts itself.

- :mod:`~daskvec.cluster.clients`: the ``client=`` argument resolved (a ``Client``, an
  address, a ``Cluster``, or the embedded cluster), whether a cluster is secured,
  placement arithmetic, factories pickled by value, the scale-down plugin;
- :mod:`~daskvec.cluster.embedded`: the embedded ``LocalCluster``, quiet in the user's
  terminal.

Batch systems (dask-jobqueue) are public and live in :mod:`daskvec.jobqueue`.
"""
