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
reward) and the real workloads ``atari``, ``mujoco`` and ``contention``.

Results come back as a dict (:func:`run_benchmark`), and are written as JSON and a PNG
bar chart with the machine description.

The package, in the order a run uses it: :mod:`~daskvec.bench.envs` (the envs and
seeded actions), :mod:`~daskvec.bench.scenarios` (scenarios, vec env kinds, cases,
options), :mod:`~daskvec.bench.measure` and :mod:`~daskvec.bench.memory` (one vec env
timed, the memory of its processes), :mod:`~daskvec.bench.machine`,
:mod:`~daskvec.bench.driver` (:func:`run_benchmark`), :mod:`~daskvec.bench.report`
(JSON, PNG, table), :mod:`~daskvec.bench.command` (``daskvec bench``).

The benchmarks that need root, a browser or daskvec's internals, or measure daskvec
against itself (across emulated hosts, TLS, action masks, the learning checks, the
Gymnasium faces and stragglers, the cost per group, the Python ceiling, the dashboard's
load) live in the source repository's ``benchmarks/``, which the wheel leaves out;
``daskvec bench`` runs them from a source checkout (:mod:`~daskvec.bench.source`).

Importing it stays light (the standard library, numpy and gymnasium; everything else is
imported when used) because Dask workers and subprocesses import
:mod:`daskvec.bench.envs`, and with it this package, to build the envs.
"""

from __future__ import annotations

from daskvec.bench.command import add_arguments, main, run
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
    "burn_cpu",
    "format_table",
    "machine_info",
    "main",
    "plot_results",
    "process_memory",
    "run",
    "run_benchmark",
    "write_results",
]
