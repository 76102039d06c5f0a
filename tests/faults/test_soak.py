"""The soak (``benchmarks/soak.py``), briefly: a minute of faults through every face, every invariant held.

The soak runs as a user runs it, ``python -m benchmarks.soak``, with its own ``dask
scheduler`` and ``dask worker`` processes. A one-minute run is four phases (the SB3 face,
the Gymnasium face's ``step()`` and ``send``/``recv``, DaskPPO), and its schedule puts a
SIGKILL and a SIGSTOP in each of them, one freeze longer and one shorter than
``step_timeout``. The exit status says whether every invariant held; the JSON says which.
The only time bounds are the soak's own, derived from ``step_timeout``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

import benchmarks

pytestmark = pytest.mark.processes

ROOT = Path(benchmarks.__file__).resolve().parents[1]
#: The soak's step timeout here: short, so that a minute holds every fault and its recovery.
STEP_TIMEOUT = 3.0


@pytest.mark.timeout(600)
def test_a_minute_of_faults_through_every_face_keeps_every_invariant(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.soak", "--minutes", "1", "--seed", "0"]
    cmd += ["--step-timeout", str(STEP_TIMEOUT), "--json", str(out)]
    # the soak bounds each of its own waits; this one only turns a hang into a failure
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=540)
    print(done.stdout)
    result = json.loads(out.read_text())
    failed = [name for name, ok in result["invariants"].items() if not ok]
    assert done.returncode == 0 and not failed, f"{failed}\n{done.stdout}\n{done.stderr[-4000:]}"
    assert result["ok"] and result["wrong_steps"] == 0
    # the schedule did what the test counts on: every face met a kill and a freeze
    faces = {ph["face"] for ph in result["phases"]}
    assert faces == {"sb3", "gym-step", "gym-send-recv", "ppo"}, faces
    for ph in result["phases"]:
        kinds = {f["kind"] for f in ph["faults"] if not f["skipped"]}
        assert {"kill", "freeze"} <= kinds, (ph["face"], ph["faults"])
        told = ph["told_against_ledger"]
        assert ph["markers_match_ledger"] and not told["problems"] and ph["ledger"] > 0, ph
        # only a worker-side collection may tell two rebuilds of an env with one marker
        assert not told["superseded"] or ph["face"] == "ppo", ph
    holds = result["freeze_holds"]
    assert any(h > STEP_TIMEOUT for h in holds) and any(h < STEP_TIMEOUT for h in holds), holds
    # every row of the run was checked, and the run stepped through its faults
    assert result["rows_checked"] > 0 and all(ph["rows_checked"] > 0 for ph in result["phases"])
    assert max(result["longest_call_s"].get(k, 0.0) for k in ("step", "recv")) <= result["bound_s"]
    assert not result["leftovers_after_close"]


@pytest.mark.timeout(600)
def test_a_terminated_soak_ends_every_process_it_started(tmp_path: Path) -> None:
    """``kill <soak>`` (SIGTERM, as a batch system's time limit sends) leaves no scheduler or worker behind."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "benchmarks.soak", "--minutes", "10", "--seed", "0"]
    cmd += ["--step-timeout", str(STEP_TIMEOUT), "--keep"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        for line in proc.stdout or ():
            lines.put(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    seen: list[str] = []
    try:
        # the first fault: the scheduler and the workers are up and the envs step on them
        while not any("phase 0: " in line for line in seen):
            seen.append(lines.get(timeout=300))
        started = proc_tree(proc.pid)
        assert len(started) >= 4, started  # the scheduler and three workers
        proc.send_signal(signal.SIGTERM)
        # the soak bounds its clean-up; this only turns a hang into a failure
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(10)
    while not lines.empty():
        seen.append(lines.get())
    out = "".join(seen)
    assert code == 128 + signal.SIGTERM, out[-4000:]
    assert "stopped by SIGTERM" in out, out[-4000:]
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, f"left behind: {[p.cmdline() for p in alive]}\n{out[-4000:]}"
    # and none it started later (a replacement worker): they all run in its work directory
    workdir = out.rsplit("logs: ", 1)[1].split()[0]
    assert Path(workdir).is_dir(), out[-4000:]
    assert not [p.info for p in psutil.process_iter(["pid", "cwd", "cmdline"]) if p.info["cwd"] == workdir]
    shutil.rmtree(workdir)


def proc_tree(pid: int) -> list[psutil.Process]:
    """Every process ``pid`` started, directly or not."""
    return psutil.Process(pid).children(recursive=True)
