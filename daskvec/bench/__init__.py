"""The benchmark behind ``daskvec bench``: DaskVecEnv side by side with the usual vec envs.

One process run steps SB3's ``DummyVecEnv`` and ``SubprocVecEnv``, Gymnasium's
``AsyncVectorEnv`` (through its own loop) and :class:`~daskvec.DaskVecEnv` on the same
envs with the same pre-generated, seeded random actions, and reports for each:

- env-steps per second over a fixed time budget (or a fixed step count) after a warm-up;
- time to first step: construction + first reset + first step, i.e. what a user waits
  for before the first transition (for DaskVecEnv with no scheduler this includes
  starting the embedded ``LocalCluster``);
- memory: the client process and every process holding envs (RSS and USS), per env;
- the ratio of each figure to ``SubprocVecEnv``'s in the same run.

Scenarios (see :data:`SCENARIOS`): ``light`` (CartPole-v1, 8 and 64 envs), ``heavy``
(:class:`BusyEnv`, a step that burns 1 ms of CPU, 8 envs; the ideal is
``n_cores x 1000`` env-steps/s), ``images`` (:class:`ImageEnv`, 84x84x3 uint8
observations, 16 envs), ``training`` (PPO on CartPole-v1 with 8 envs for 25,000
timesteps, wall time from construction to the end of ``learn`` plus the evaluated mean
reward) and ``groups`` (DaskVecEnv alone with 2, 8, 32 and 64 groups of one CartPole-v1
each: the client's wall and CPU time per vec-step and per group). ``--dashboard``
measures DaskVecEnv with the daskvec dashboard page open in a headless browser against
the page closed.

Results come back as a dict (:func:`run_benchmark`), and are written as JSON and a PNG
bar chart with the machine description.

The package, in the order a run uses it:

- :mod:`~daskvec.bench.envs`: the benchmark's envs and seeded actions;
- :mod:`~daskvec.bench.scenarios`: scenarios, vec env kinds, cases and options;
- :mod:`~daskvec.bench.measure` and :mod:`~daskvec.bench.memory`: one vec env timed, and
  the memory of the processes it uses;
- :mod:`~daskvec.bench.groups`: the ``groups`` scenario, the client's time per group;
- :mod:`~daskvec.bench.dashboard_load`: the dashboard page open vs closed;
- :mod:`~daskvec.bench.tls`: ``--tls``, the encrypted direct channel against actor calls
  and the plaintext channel;
- :mod:`~daskvec.bench.machine`: the machine and software;
- :mod:`~daskvec.bench.driver`: :func:`run_benchmark`, every case in turn;
- :mod:`~daskvec.bench.report`: JSON, PNG and the table;
- :mod:`~daskvec.bench.command`: ``daskvec bench`` and ``python -m daskvec.bench``.

Two scenarios run on their own, outside ``all`` (issue 13):

- ``hosts`` (:mod:`~daskvec.bench.across`, on :mod:`~daskvec.bench.hosts`): emulated
  worker hosts (network namespaces, a delay relay; needs root and iptables) with a
  round-trip sweep (``--rtt 0,2,10``): synchronous stepping, PPO's loop, worker-side
  rollouts (:class:`~daskvec.sb3.DaskPPO`), PPO vs DaskPPO wall time, the relay's cost,
  and (:mod:`~daskvec.bench.across_learn`) ``learn()`` throughput of DaskSAC and of DaskPPO
  with ``CnnPolicy`` on frame stacks beside SAC and PPO over the synchronous vec env;
- ``learning`` (:mod:`~daskvec.bench.learning`): DaskPPO against PPO with DummyVecEnv on
  CartPole-v1, 8 envs, 50,000 timesteps, seeds 0, 1, 2.

Importing it stays light (the standard library, numpy and gymnasium; everything else is
imported when used) because Dask workers and subprocesses import
:mod:`daskvec.bench.envs`, and with it this package, to build the envs.
"""

from __future__ import annotations

from daskvec.bench.command import add_arguments, main, run
from daskvec.bench.dashboard_load import bokeh_connections, bokeh_routes, find_dashboard_route, measure_dashboard
from daskvec.bench.driver import SCHEMA_VERSION, run_benchmark
from daskvec.bench.envs import BusyEnv, ImageEnv, action_cycle, burn_cpu
from daskvec.bench.machine import machine_info
from daskvec.bench.memory import process_memory
from daskvec.bench.report import format_table, plot_results, write_results
from daskvec.bench.scenarios import BASELINE, DEFAULT_ENVS, LABELS, SCENARIOS, VEC_ENVS, Case, Options

__all__ = [
    "BASELINE",
    "DEFAULT_ENVS",
    "LABELS",
    "SCENARIOS",
    "SCHEMA_VERSION",
    "VEC_ENVS",
    "BusyEnv",
    "Case",
    "ImageEnv",
    "Options",
    "action_cycle",
    "add_arguments",
    "bokeh_connections",
    "bokeh_routes",
    "burn_cpu",
    "find_dashboard_route",
    "format_table",
    "machine_info",
    "main",
    "measure_dashboard",
    "plot_results",
    "process_memory",
    "run",
    "run_benchmark",
    "write_results",
]
