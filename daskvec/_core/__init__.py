"""The client core shared by both faces; not API.

- :mod:`~daskvec._core.engine`: :class:`Engine`, the step, reset and call lifecycles and
  fail-stop, owned by each face;
- :mod:`~daskvec._core.options`: the options, checked once;
- :mod:`~daskvec._core.directory`: which workers may take envs (eligible, quarantined,
  leaving);
- :mod:`~daskvec._core.pool`: the env-group actors, their channels and the requests in
  flight;
- :mod:`~daskvec._core.handles`: the client's records of its groups (:class:`Group`) and
  of what one collection found (:class:`StepOutcome`);
- :mod:`~daskvec._core.recovery`: rebuilding lost and moved groups, the restart ledger;
- :mod:`~daskvec._core.rollouts`: the client's half of worker-side collections (the
  policy shipped, the fragments brought back);
- :mod:`~daskvec._core.masks`: the action masks that came with the last replies;
- :mod:`~daskvec._core.dask_internals`: every use of Dask internals on the client, with
  the reason.
"""
