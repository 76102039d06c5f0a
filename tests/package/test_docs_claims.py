"""The performance figures that the README, the docs and the notebooks quote are those of
the committed benchmark run (``benchmarks/results/bench.json``), and no text says the opposite of it.

When the benchmark is run again and ``benchmarks/results/bench.json`` replaced, these tests fail until
the prose quoting it is updated.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parents[2]
BENCH = json.loads((ROOT / "benchmarks" / "results" / "bench.json").read_text())
CASES = {c["case"]: c["results"] for c in BENCH["cases"]}


def steps(case: str, vec_env: str) -> str:
    """Env-steps/s of a vec env in the committed run, written as the docs write it (``17,475``)."""
    return f"{CASES[case][vec_env]['steps_per_s']:,.0f}"


def ratio(case: str, digits: int = 1) -> str:
    """DaskVecEnv / SubprocVecEnv env-steps/s in the committed run, e.g. ``2.7x``."""
    return f"{CASES[case]['dask']['ratio_steps_per_s']:.{digits}f}x"


def notebook_markdown(name: str) -> str:
    nb = json.loads((ROOT / "notebooks" / name).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def texts() -> dict[str, str]:
    """Every prose file: README, docs/*.md and the notebooks' markdown cells."""
    out = {"README.md": (ROOT / "README.md").read_text()}
    out.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    out.update({f"notebooks/{p.name}": notebook_markdown(p.name) for p in sorted((ROOT / "notebooks").glob("*.ipynb"))})
    return out


def test_readme_table_is_the_committed_run() -> None:
    readme = (ROOT / "README.md").read_text()
    rows = {
        "light-8": "light: CartPole-v1, 8 envs (env-steps/s)",
        "light-64": "light: CartPole-v1, 64 envs",
        "images-16": "images: 84x84x3 uint8, 16 envs",
    }
    for case, label in rows.items():
        row = (
            f"| {label} | {steps(case, 'dummy')} | {steps(case, 'subproc')} | {steps(case, 'async')} | "
            f"**{steps(case, 'dask')}** | **{ratio(case)}** |"
        )
        assert row in readme, row
    heavy = CASES["heavy-8"]["dask"]
    assert (
        f"**{steps('heavy-8', 'dask')}** ({heavy['fraction_of_ideal']:.2f} of ideal) | **{ratio('heavy-8', 2)}** |"
        in readme
    )


@pytest.mark.parametrize(
    ("where", "quoted"),
    [
        ("notebooks/quickstart.ipynb", lambda: f"with 8 CartPole envs DaskVecEnv made {ratio('light-8')}"),
        ("notebooks/quickstart.ipynb", lambda: f"with 64 envs {ratio('light-64')}"),
        ("notebooks/quickstart.ipynb", lambda: f"images {ratio('images-16')}"),
        ("notebooks/quickstart.ipynb", lambda: f"1 ms of CPU per step {ratio('heavy-8', 2)}"),
        (
            "README.md",
            lambda: (
                f"8 CartPole envs ({steps('light-8', 'dummy')} against DaskVecEnv's\n"
                f"{steps('light-8', 'dask')} env-steps/s)"
            ),
        ),
        ("README.md", lambda: f"({steps('light-64', 'dummy')} and {steps('light-64', 'dask')})"),
        ("docs/hpc.md", lambda: f"stepped {steps('light-64', 'dask')} env-steps/s against {steps('light-8', 'dask')}"),
    ],
)
def test_quoted_figures_are_the_committed_run(where: str, quoted: Any) -> None:
    assert quoted() in texts()[where]


def test_no_text_says_subproc_is_faster_where_the_benchmark_says_otherwise() -> None:
    assert all(CASES[c]["dask"]["ratio_steps_per_s"] > 1 for c in ("light-8", "light-64", "heavy-8", "images-16"))
    claim = re.compile(r"SubprocVecEnv`?[^.]{0,80}\b(is|are|was|runs?) (faster|quicker)", re.IGNORECASE)
    for where, text in texts().items():
        for sentence in re.split(r"(?<=[.!?])\s+", text.replace("\n", " ")):
            assert not claim.search(sentence), f"{where}: {sentence}"


def ahead_ratio(result: dict[str, Any], algo: str = "ppo") -> float:
    """The median seconds of daskvec's ``algo`` collecting ahead over its synchronous median."""
    return float(result["median_seconds"][f"dask{algo}-ahead"] / result["median_seconds"][f"dask{algo}"])


def check_time_to_reward_tables(result: dict[str, Any], algo: str) -> float:
    """docs/rollouts.md's table and docs/benchmark.md's row quote ``result``'s medians and the
    ratio of daskvec's ``algo`` ("ppo" or "sac") collecting ahead, which is returned."""
    name, learner = algo.upper(), f"Dask{algo.upper()}"
    rows = {
        f"{algo}-dummy": f"{name}, `DummyVecEnv`",
        f"{algo}-subproc": f"{name}, `SubprocVecEnv`",
        f"dask{algo}": learner,
        f"dask{algo}-ahead": f"{learner}, `collect_ahead=1`",
    }
    med = {case: f"{m:.1f}" for case, m in result["median_seconds"].items()}
    ratio = ahead_ratio(result, algo)
    rollouts = (ROOT / "docs" / "rollouts.md").read_text().replace("**", "")
    for case, row in rows.items():
        assert f"| {row} | {med[case]} |" in rollouts, (case, med[case])
    assert f"{ratio:.2f}x the synchronous median" in rollouts
    benchmark = (ROOT / "docs" / "benchmark.md").read_text().replace("**", "")
    assert f"| {' | '.join(med[c] for c in rows)} ({ratio:.2f}x {learner}) |" in benchmark
    return ratio


def test_time_to_reward_figures_are_the_committed_runs() -> None:
    """docs/rollouts.md's and docs/benchmark.md's time-to-reward medians are those of the JSON they name."""
    results = ROOT / "benchmarks" / "results"
    rtt = json.loads((results / "time-to-reward-delay-0ms-rtt-10ms-hosts-cpu-1.json").read_text())
    assert rtt["rtt_ms"] == 10 and rtt["env_delay"] == 0 and rtt["hosts_cpus"] == "1" and len(rtt["seeds"]) == 20
    ratio = check_time_to_reward_tables(rtt, "ppo")
    # the other runs at 10 ms, quoted in the text: the ratio of medians and the synchronous and ahead medians
    rollouts = (ROOT / "docs" / "rollouts.md").read_text().replace("**", "")
    others = (
        ("0.05ms-rtt-10ms-hosts-cpu-1", 0.00005, "1"),
        ("0.1ms-rtt-10ms", 0.0001, None),
        ("0.15ms-rtt-10ms", 0.00015, None),
    )
    for name, delay, cpus in others:
        run = json.loads((results / f"time-to-reward-delay-{name}.json").read_text())
        assert run["env_delay"] == delay and run.get("hosts_cpus") == cpus and len(run["seeds"]) == 20
        sync, ahead = (run["median_seconds"][c] for c in ("daskppo", "daskppo-ahead"))
        assert f"collecting ahead {ahead:.1f} s" in rollouts and f"DaskPPO {sync:.1f} s" in rollouts, name
        assert f"{ahead_ratio(run):.2f}x" in rollouts, name
    dask = json.loads((results / "time-to-reward-delay-0ms-rtt-10ms-hosts-cpu-1-ppo-dask.json").read_text())
    assert dask["rtt_ms"] == 10 and dask["hosts_cpus"] == "1" and len(dask["seeds"]) == 10
    quoted = f"{dask['median_seconds']['ppo-dask']:.1f} s"
    assert f"{quoted} median against DaskPPO's {dask['median_seconds']['daskppo']:.1f} s" in rollouts
    assert f"vec-step: {quoted} (10 seeds)" in (ROOT / "docs" / "benchmark.md").read_text()
    cpu = json.loads((results / "time-to-reward-delay-0ms.json").read_text())
    readme = (ROOT / "README.md").read_text()
    assert f"475 in {ratio:.2f}x" in readme
    assert f"DaskPPO took {ahead_ratio(cpu):.2f}x" in readme
    ahead, sync = (f"{cpu['median_seconds'][c]:.1f}" for c in ("daskppo-ahead", "daskppo"))
    assert f"{ahead} s against {sync} s" in (ROOT / "docs" / "benchmark.md").read_text()


def test_dasksac_time_to_reward_figures_are_the_committed_run() -> None:
    sac = json.loads((ROOT / "benchmarks" / "results" / "time-to-reward-sac-delay-5ms-rtt-10ms.json").read_text())
    assert sac["rtt_ms"] == 10 and sac["env_delay"] == 0.005 and len(sac["seeds"]) == 5
    ratio = check_time_to_reward_tables(sac, "sac")
    assert f"-250 in {ratio:.2f}x" in (ROOT / "README.md").read_text()
