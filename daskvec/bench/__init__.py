"""The benchmark behind ``daskvec bench``: DaskVecEnv side by side with the usual vec envs.

SB3's ``DummyVecEnv`` and ``SubprocVecEnv``, Gymnasium's ``AsyncVectorEnv``, EnvPool and
:class:`~daskvec.DaskVecEnv` step the same envs with the same seeded actions; each is
reported with its env-steps/s, time to first step, memory per env and their ratios to
``SubprocVecEnv``, in a dict (:func:`run_benchmark`), a table, JSON and a PNG chart.
docs/benchmark.md describes the scenarios, the figures and the JSON.

Its modules, in the order a run uses them: ``envs``, ``scenarios`` (with :class:`BenchOptions`),
``measure``, ``machine``, ``driver``, ``report``, ``command``; ``source`` runs the benchmarks
of the source repository's ``benchmarks/`` from a checkout.

Importing it stays light (the standard library, numpy and gymnasium) because Dask workers
and subprocesses import :mod:`daskvec.bench.envs`, and with it this package.
"""

from __future__ import annotations

from daskvec.bench.command import add_arguments, main, run
from daskvec.bench.driver import SCHEMA_VERSION, run_benchmark
from daskvec.bench.envs import BusyEnv, ImageEnv, action_cycle, burn_cpu
from daskvec.bench.machine import machine_info
from daskvec.bench.measure import process_memory
from daskvec.bench.report import format_table, plot_results, write_results
from daskvec.bench.scenarios import BASELINE, DEFAULT_ENVS, LABELS, SCENARIOS, VEC_ENVS, BenchOptions, Case

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
    "BenchOptions",
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
