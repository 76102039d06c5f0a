"""What a user watches: figures, the notebook view, dashboard links, SB3's logger.

- :mod:`~daskvec.monitoring.metrics`: figures the workers report with their heartbeats,
  and the client's time split (the workers import this module);
- :mod:`~daskvec.monitoring.links`: which dashboard pages a scheduler really serves;
- :mod:`~daskvec.monitoring.notebook`: a vec env's ``_repr_html_``;
- :mod:`~daskvec.monitoring.sb3_logger`: :class:`~daskvec.DaskVecEnvMetrics`, figures in
  SB3's logger.

The dashboard page itself is :mod:`daskvec.dashboard` (public: it is a scheduler preload).
"""
