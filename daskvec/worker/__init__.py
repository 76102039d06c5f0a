"""Worker side: the env-group actors that hold a slice of environments.

- :mod:`daskvec.worker.env_group` -- :class:`EnvGroup`, the actor that builds and steps
  its envs and answers requests on either transport;
- :mod:`daskvec.worker.build` -- building a group's envs from their factories (with a
  timeout);
- :mod:`daskvec.worker.envs` -- single envs as a group sees them: stacking their
  observations and action masks, wrapper lookups, factory names, their errors as replies;
- :mod:`daskvec.worker.host` -- :class:`EnvHost`, the actor when the envs live in a
  process of their own (``env_process=True``), and that process's entry point;
- :mod:`daskvec.worker.on_policy` -- a whole rollout run with a shipped policy, and
  :mod:`daskvec.worker.obs` -- the learner's frame stacks and transpositions repeated for
  that policy (both import torch and SB3 only when a rollout arrives, or not at all);
- :mod:`daskvec.worker.reaper` -- releases groups that Dask dropped without a shutdown;
- :mod:`daskvec.worker.probes` -- what a group learns about its worker (address,
  deadline, profiler);
- :mod:`daskvec.worker.preload` -- the set-up of the embedded cluster's workers (a
  Dask preload: they ignore Ctrl-C and leave a factory's error to the client).

This package is imported by every worker process: it does not import
Stable-Baselines3 or torch.
"""

from __future__ import annotations

from daskvec.protocol.messages import INFO_KEY, restart_seed
from daskvec.worker.env_group import EnvGroup, factory_name, obs_shape, stack_obs
from daskvec.worker.host import EnvHost, host_main, kill_env_process
from daskvec.worker.probes import WORKER_LOCAL_DIR, profiler_hazard, worker_deadline

__all__ = [
    "INFO_KEY",
    "WORKER_LOCAL_DIR",
    "EnvGroup",
    "EnvHost",
    "factory_name",
    "host_main",
    "kill_env_process",
    "obs_shape",
    "profiler_hazard",
    "restart_seed",
    "stack_obs",
    "worker_deadline",
]
