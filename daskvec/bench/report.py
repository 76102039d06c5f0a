"""The results as files (JSON and a PNG chart) and as a plain-text table, with the ratios."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from daskvec.bench import source
from daskvec.bench.scenarios import BASELINE, LABELS, VEC_ENVS

__all__ = ["NO_PLOT_REASON", "format_table", "plot_results", "plotting_available", "write_results"]

logger = logging.getLogger(__name__)

#: Why the chart is missing, and how to get it: said once when matplotlib is not installed.
NO_PLOT_REASON = 'no chart: it needs matplotlib (pip install "daskvec[bench]")'


def plotting_available() -> bool:
    """Whether matplotlib, which draws the chart, can be imported (the ``bench`` extra)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


#: Scenarios that time PPO runs (wall time), not stepping windows.
_PPO_SCENARIOS = ("training", "contention")
#: Scenarios shown in the table only (those of benchmarks/): they have no SubprocVecEnv baseline to chart ratios to.
_TABLE_ONLY = tuple(source.IN_SOURCE)


def _ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def _add_ratios(case: dict[str, Any]) -> None:
    if case["scenario"] in _TABLE_ONLY:
        return
    base = case["results"].get(BASELINE, {})
    base_mem = base.get("memory", {}).get("per_env_mb")
    for res in case["results"].values():
        if "error" in res or "skipped" in res:
            continue
        if case["scenario"] in _PPO_SCENARIOS:
            res["ratio_wall"] = _ratio(res["wall_s"], base.get("wall_s"))
            res["ratio_steps_per_s"] = _ratio(base.get("wall_s"), res["wall_s"])
        else:
            res["ratio_steps_per_s"] = _ratio(res["steps_per_s"], base.get("steps_per_s"))
            res["ratio_ttfs"] = _ratio(res["ttfs_s"], base.get("ttfs_s"))
        res["ratio_mem_per_env"] = _ratio(res["memory"]["per_env_mb"], base_mem)
        if case.get("ideal_steps_per_s"):
            res["fraction_of_ideal"] = res["steps_per_s"] / case["ideal_steps_per_s"]


def write_results(
    results: dict[str, Any], out_dir: str | os.PathLike[str], plot: bool = True, stamp: str | None = None
) -> dict[str, str]:
    """Write the results as JSON (and a PNG chart) into ``out_dir``; return the paths.

    Files are named ``bench-<stamp>.json``/``.png`` (``stamp`` defaults to now) and
    copied to ``latest.json``/``latest.png``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = stamp or _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    files: dict[str, str] = {"json": str(out / f"bench-{stamp}.json")}
    if plot and any(c["scenario"] not in _TABLE_ONLY and not c.get("skipped") for c in results["cases"]):
        if plotting_available():
            files["png"] = str(out / f"bench-{stamp}.png")
            plot_results(results, files["png"])
            shutil.copyfile(files["png"], out / "latest.png")
        else:
            # the chart is an extra: a missing matplotlib must not cost the run its results
            results["plot_skipped"] = NO_PLOT_REASON
            logger.info("bench chart skipped: %s", NO_PLOT_REASON)
    results["files"] = files
    text = json.dumps(results, indent=2, default=_json_default, allow_nan=True)
    Path(files["json"]).write_text(text)
    (out / "latest.json").write_text(text)
    return files


def _json_default(obj: Any) -> Any:
    return obj.tolist() if isinstance(obj, np.generic | np.ndarray) else str(obj)


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def format_table(results: dict[str, Any]) -> str:
    """The results as a plain-text table (one row per case and vec env)."""
    head = (
        f"{'case':<12} {'vec env':<15} {'env-steps/s':>12} {'x Subproc':>9} {'first step s':>12} "
        f"{'x Subproc':>9} {'MB/env':>8} {'x Subproc':>9}  notes"
    )
    lines = [head, "-" * len(head)]
    for case in results["cases"]:
        if case.get("skipped"):
            lines.append(f"{case['case']:<12} skipped: {case['skipped']}")
        elif case["scenario"] in _TABLE_ONLY:
            lines.extend(source.format_case(case))
        else:
            lines.extend(_table_row(case, kind, res) for kind, res in case["results"].items())
    if results.get("dashboard"):
        lines.extend(source.format_case(results["dashboard"], "--dashboard"))
    lines.extend(_machine_lines(results))
    return "\n".join(lines)


def _table_row(case: dict[str, Any], kind: str, res: dict[str, Any]) -> str:
    """One row of :func:`format_table`: a vec env's figures in a case, or its error."""
    label = LABELS.get(kind, kind)
    if "error" in res or "skipped" in res:
        return f"{case['case']:<12} {label:<15} {res.get('error') or res.get('skipped')}"
    notes = []
    if case["scenario"] in _PPO_SCENARIOS:
        first = f"{_fmt(res['wall_s'], '.1f')} wall"
        notes.append(f"reward {res['mean_reward']:.1f}+-{res['std_reward']:.1f}")
        ratio_first = res.get("ratio_wall")
    else:
        first = _fmt(res["ttfs_s"], ".2f")
        ratio_first = res.get("ratio_ttfs")
        if res.get("fraction_of_ideal") is not None:
            notes.append(
                f"{res['fraction_of_ideal']:.2f} of ideal {case['ideal_steps_per_s']:.0f}"
                + (f" ({case['ideal']})" if kind == "dummy" and case.get("ideal") else "")
            )
        if res.get("of_envpool") is not None:
            notes.append(f"{res['of_envpool']:.2f} of EnvPool alone")
    if res.get("transport"):
        notes.append(res["transport"])
    if res.get("leftover_processes"):
        notes.append(f"{res['leftover_processes']} processes left running")
    return (
        f"{case['case']:<12} {label:<15} {_fmt(res['steps_per_s'], ',.0f'):>12} "
        f"{_fmt(res.get('ratio_steps_per_s'), '.2f'):>9} {first:>12} {_fmt(ratio_first, '.2f'):>9} "
        f"{_fmt(res['memory']['per_env_mb'], '.1f'):>8} {_fmt(res.get('ratio_mem_per_env'), '.2f'):>9}  "
        + "; ".join(notes)
    )


def _machine_lines(results: dict[str, Any]) -> list[str]:
    """The machine, the load before and after the run, and how to read the table."""
    m = results["machine"]
    start, end = (m.get("load_average") or [0.0])[0], (results.get("load_average_end") or [0.0])[0]
    lines = [
        f"machine: {m['cpu']}, {m['cores_usable']} usable cores, {m['memory_gb']} GB, Python {m['python']}, "
        f"load average at start {_fmt((m.get('load_average') or [None])[0], '.2f')}"
    ]
    # Only the load before the run says something about other processes: by the end, the
    # 1-min figure is mostly the benchmark's own (64 SubprocVecEnv children, Dask workers).
    if start > 0.5 * (m.get("cores_usable") or 1):
        lines.append(
            f"WARNING: the machine was busy before the run (1-min load average {start:.1f}, "
            f"{m.get('cores_usable')} cores): other processes competed for the CPU, figures and ratios are unreliable"
        )
        if m.get("autogroup"):
            lines.append(
                "  the kernel shares a busy CPU per session (sched_autogroup): every process of this run "
                "together gets one session's part, so vec envs of many processes lose most to the load"
            )
    lines.append(f"load average at the end {end:.1f} (counts the benchmark's own processes, still exiting)")
    lines.append(
        "training/contention rows: 'env-steps/s' is timesteps / wall time, 'first step s' is the wall time of the run;"
        " 'x Subproc' above 1 is faster for env-steps/s, below 1 is faster for times."
    )
    return lines


def plot_results(results: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Draw the ratios to SubprocVecEnv per case as grouped bars into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    cases = [c for c in results["cases"] if c["scenario"] not in _TABLE_ONLY and not c.get("skipped")]
    kinds = [k for k in VEC_ENVS if any(k in c["results"] for c in cases)]
    colors = {
        "dummy": "#8c8c8c",
        "subproc": "#4c72b0",
        "async": "#dd8452",
        "dask": "#55a868",
        "envpool": "#8172b3",
        "dask-envpool": "#64b5cd",
    }
    panels = (
        ("ratio_steps_per_s", "Speed vs SubprocVecEnv (higher is better)\nenv-steps/s; training: 1 / wall time"),
        ("ratio_ttfs", "Time to first step vs SubprocVecEnv (lower is better)\nconstruction + reset + first step"),
        ("ratio_mem_per_env", "Memory per env vs SubprocVecEnv (lower is better)\nclient growth + env processes, USS"),
    )
    fig, axes = plt.subplots(1, len(panels), figsize=(18, 5.4))
    width = 0.8 / max(1, len(kinds))
    x = np.arange(len(cases))
    for ax, (key, title) in zip(axes, panels, strict=True):
        for j, kind in enumerate(kinds):
            vals = [c["results"].get(kind, {}).get(key) for c in cases]
            heights = [v if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else np.nan for v in vals]
            bars = ax.bar(x - 0.4 + width * (j + 0.5), heights, width, label=LABELS[kind], color=colors[kind])
            ax.bar_label(bars, [f"{h:.2g}" if np.isfinite(h) else "" for h in heights], fontsize=7, padding=2)
        ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_yscale("log")
        ax.set_xticks(x, [c["case"] for c in cases], rotation=20)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
    axes[0].legend(fontsize=8, loc="best")
    m = results["machine"]
    fig.suptitle(
        f"daskvec bench: {m['cpu']}, {m['cores_usable']} cores, {m['memory_gb']} GB, "
        f"Python {m['python']} ({results['created']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
