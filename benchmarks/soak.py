"""A soak: the witness env over real ``dask scheduler``/``dask worker`` processes, under a seeded schedule of faults.

The run is cut into phases that rotate through daskvec's faces: the SB3 face
(:class:`daskvec.DaskVecEnv`, ``step``), the Gymnasium face
(:class:`daskvec.gymnasium.DaskVectorEnv`, ``step()`` and ``send``/``recv``) and a learner
collecting on the workers (:class:`daskvec.sb3.DaskPPO`). Each phase builds its vec env of
:class:`~benchmarks.witness.WitnessEnv` s, steps it while a thread injects that phase's
faults, and closes it. The faults, one at a time:

- ``kill``: SIGKILL of a ``dask worker`` holding envs, then a replacement worker started;
- ``freeze``: SIGSTOP of a worker holding envs for a while (sometimes longer than
  ``step_timeout``, sometimes shorter), then SIGCONT;
- ``partition`` (``--hosts``, root): every packet into and out of an emulated host
  dropped for a while, then healed (:class:`benchmarks.hosts.EmulatedHosts`).

Every phase holds at least one kill and one freeze (and one partition with ``--hosts``),
and the run at least one freeze longer and one shorter than ``step_timeout``, however short
it is. Every row handed out is checked by the witness (observation ``(env index, episode,
step)``): a row that is not the one its env must produce next is a wrong step. What the run
prints (and writes to ``--json``): wrong steps, the restarts the caller was told of (the
markers) against the vec env's ledger (``restart_log``, ``restart_counts``) and against
the faults injected, the longest call against ``step_timeout``, env-steps per minute, the
spread of envs over workers over time, and what daskvec left on the workers after
``close()``. The exit status is nonzero when an invariant fails.

Run from a checkout: ``python -m benchmarks.soak --minutes 30 --seed 0 --json
benchmarks/results/soak-30min.json`` (see docs/fault-tolerance.md, "The soak").
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.hosts import checkout_env
from benchmarks.witness import WitnessEnv, dask_ports, footprint_probe, triple

logger = logging.getLogger(__name__)

#: The phases, in the order they rotate.
FACES = ("sb3", "gym-step", "gym-send-recv", "ppo")
#: The marker key of a rebuilt env in an SB3 info (``daskvec.worker.INFO_KEY``).
MARKER = "daskvec"
#: A short freeze lasts this fraction of ``step_timeout`` (drawn in the range), a long one this multiple.
SHORT_HOLD = (0.2, 0.6)
LONG_HOLD = (1.3, 2.5)
#: Where the first faults of a phase may land, as fractions of the phase (the rest is left to settle).
FAULT_WINDOW = 0.8
#: Seconds between two faults: the cluster settles before the next one, so each fault's cost is its own.
FAULT_GAP = 1.0


# --------------------------------------------------------------------------- the schedule
@dataclass
class Fault:
    """One fault of the schedule, and what it did once injected."""

    phase: int
    at: float  # seconds from the phase's start
    kind: str  # "kill", "freeze", "partition"
    hold: float = 0.0  # seconds a freeze or partition lasts
    # filled in when injected
    started: float | None = None  # seconds from the run's start
    worker: str | None = None
    pid: int | None = None
    envs: list[int] = field(default_factory=list)  # the envs the worker held then
    ledger_at: int | None = None  # entries in the restart ledger just before the fault
    replacement: str | None = None
    skipped: str | None = None


def make_schedule(
    rng: random.Random, n_phases: int, phase_seconds: float, step_timeout: float, per_minute: float, hosts: bool
) -> list[Fault]:
    """The faults of every phase: one kill, one freeze (one partition with ``hosts``), then random extras.

    Parameters
    ----------
    rng : random.Random
        The seeded source of every choice.
    n_phases, phase_seconds : int, float
        How many phases, and how long each one lasts.
    step_timeout : float
        What freezes and partitions are measured in: short ones last less, long ones more.
    per_minute : float
        Mean faults per minute in all (the guaranteed ones count).
    hosts : bool
        Whether partitions are possible.

    Returns
    -------
    list of Fault
        Ordered by phase, then time.
    """
    kinds = ("kill", "freeze", "partition") if hosts else ("kill", "freeze")
    holds: list[bool] = [True, False]  # the run's first two holds: one long, one short, in a random order
    rng.shuffle(holds)
    faults = []
    for phase in range(n_phases):
        extra = max(0, int(rng.expovariate(1.0) * per_minute * phase_seconds / 60) - len(kinds))
        chosen = [*kinds, *(rng.choice(kinds) for _ in range(extra))]
        rng.shuffle(chosen)
        times = sorted(rng.uniform(0.05, FAULT_WINDOW) * phase_seconds for _ in chosen)
        for at, kind in zip(times, chosen, strict=True):
            hold = 0.0
            if kind != "kill":
                long = holds.pop(0) if holds else rng.random() < 0.5
                hold = rng.uniform(*(LONG_HOLD if long else SHORT_HOLD)) * step_timeout
            faults.append(Fault(phase, at, kind, hold))
    return faults


def told_against_ledger(
    markers: Sequence[tuple[int, str, int]],
    log: Sequence[dict[str, Any]],
    counts: Sequence[int],
    each_at_its_own_step: bool,
) -> dict[str, Any]:
    """Whether the markers the caller saw account for every rebuild in the ledger.

    ``markers``: ``(env, reason, restarts)`` in the order seen; ``log``: ``restart_log``;
    ``counts``: ``restart_counts``. The ledger holds one entry per rebuild, env ``i``'s
    ``k``-th being its rebuild number ``k`` (the marker's ``restarts``). Every marker names
    a rebuild of the ledger, with its reason, each at most once and in order, and every
    env's last rebuild is told. Stepping (``each_at_its_own_step``), every rebuild is told
    at a step of its own. In a worker-side rollout, a rebuild whose group was lost again
    before it returned a step is told by the env's next marker, whose ``restarts`` counts
    both (docs/rollouts.md): an untold rebuild is accepted only when the next one of its
    env happened in the same collection (the ledger's ``step`` does not move during a
    collection); those are counted as ``superseded``.
    """
    problems: list[str] = []
    superseded: list[tuple[int, str]] = []
    for i, count in enumerate(counts):
        entries = [e for e in log if int(e["env"]) == i]
        if len(entries) != count:
            problems.append(f"env {i}: {len(entries)} ledger entries, restart_counts {count}")
            continue
        seen = [(reason, restarts) for j, reason, restarts in markers if j == i]
        numbers = [restarts for _, restarts in seen]
        if numbers != sorted(set(numbers)) or not all(1 <= n <= count for n in numbers):
            problems.append(f"env {i}: markers counted {numbers}, restart_counts {count}")
            continue
        for reason, n in seen:
            if entries[n - 1]["reason"] != reason:
                problems.append(f"env {i}: rebuild {n} told as {reason!r}, in the ledger {entries[n - 1]['reason']!r}")
        for n in sorted(set(range(1, count + 1)) - set(numbers)):
            entry, following = entries[n - 1], entries[n] if n < count else None
            in_one_collection = following is not None and following.get("step") == entry.get("step")
            if each_at_its_own_step or not in_one_collection:
                problems.append(f"env {i}: rebuild {n} ({entry['reason']}, step {entry.get('step')}) never told")
            else:
                superseded.append((i, str(entry["reason"])))
    return {"ok": not problems, "problems": problems[:20], "superseded": superseded}


def kill_not_rebuilt(fault: Fault, log: Sequence[dict[str, Any]]) -> list[int]:
    """The envs of a killed worker that the ledger does not show rebuilt elsewhere after the kill.

    ``fault.envs`` are the envs ``env.groups`` placed on the worker at the kill, which
    include a group still being built there (a rebuild under way). The ledger records a
    rebuild when it has finished. Each of those envs needs an entry after
    ``fault.ledger_at`` (the ledger's length read just before the worker's envs were)
    and its last such entry must leave it on another worker: a rebuild from the killed
    worker, or, for an env that was on its way to it, that rebuild finished elsewhere. A
    killed worker never comes back, so an env the ledger leaves on it is lost.
    """
    start = fault.ledger_at or 0
    missing = []
    for i in fault.envs:
        after = [e for e in log[start:] if int(e["env"]) == i]
        if not after or after[-1].get("worker") == fault.worker:
            missing.append(i)
    return missing


# --------------------------------------------------------------------------- the cluster
class LocalProcesses:
    """A ``dask scheduler`` and ``dask worker`` processes (no nanny: a SIGKILL kills a worker for good).

    Parameters
    ----------
    n_workers : int
        Workers to start.
    workdir : Path
        Where the scheduler file and the processes' logs go.
    timeout : float
        Bound of every wait for a process to start.
    """

    def __init__(self, n_workers: int, workdir: Path, timeout: float) -> None:
        self.workdir, self.timeout, self.env = workdir, timeout, checkout_env()
        self.workers: list[subprocess.Popen[bytes]] = []
        scheduler_file = workdir / "scheduler.json"
        self.scheduler = self._popen(
            [
                *("-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0"),
                *("--dashboard-address", ":0", "--scheduler-file", str(scheduler_file)),
            ],
            "scheduler",
        )
        try:
            self._start(scheduler_file, n_workers)
        except BaseException:  # a stop (or a failure) while starting: end what was started
            self.stop()
            raise

    def _start(self, scheduler_file: Path, n_workers: int) -> None:
        deadline = time.monotonic() + self.timeout
        while True:  # the scheduler picks its port (0) and writes its address in the file
            try:
                self.address = str(json.loads(scheduler_file.read_text())["address"])
                break
            except (OSError, ValueError, KeyError):  # not written yet, or half written
                if self.scheduler.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"dask scheduler did not start; see {self.workdir}") from None
                time.sleep(0.1)
        for _ in range(n_workers):
            self.add_worker()

    def _popen(self, args: Sequence[str], name: str) -> subprocess.Popen[bytes]:
        with (self.workdir / f"{name}.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, *args], cwd=self.workdir, env=self.env, stdout=log, stderr=subprocess.STDOUT
            )

    def add_worker(self) -> None:
        """Start one more ``dask worker``."""
        args = ["-m", "distributed.cli.dask_worker", self.address, "--nthreads", "1", "--no-nanny", "--no-dashboard"]
        self.workers.append(self._popen(args, f"worker-{len(self.workers)}"))

    def kill(self, pid: int, worker: str) -> None:
        """SIGKILL worker ``pid`` (like a node dying) and start a replacement."""
        os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, ChildProcessError):
            os.waitpid(pid, 0)  # reap it: a zombie would look alive to the bookkeeping below
        self.add_worker()

    def partition(self, worker: str) -> None:  # pragma: no cover - needs emulated hosts
        raise RuntimeError("partitions need --hosts")

    heal = partition

    def stop(self) -> None:
        """Terminate every process (kill after a bounded wait)."""
        procs = [*self.workers, self.scheduler]
        for p in procs:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)  # a frozen one must be able to end
                p.terminate()
        for p in procs:
            try:
                p.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=self.timeout)


class HostProcesses:
    """The same over :class:`benchmarks.hosts.EmulatedHosts` (root): one worker per emulated host.

    A killed worker is replaced on its own host; a partition drops every packet of a host.
    """

    def __init__(self, n_workers: int, workdir: Path, timeout: float) -> None:
        from benchmarks.hosts import EmulatedHosts, missing_requirements

        missing = missing_requirements()
        if missing:
            raise RuntimeError(f"--hosts needs {missing}")
        self.hosts = EmulatedHosts(n_workers, 0.0, workdir=workdir)
        self.hosts.env.update(checkout_env())
        self.hosts.start()
        self.address = self.hosts.address

    def kill(self, pid: int, worker: str) -> None:
        host = self.hosts.host_of(worker)
        os.kill(pid, signal.SIGKILL)
        self.hosts.kill_worker(host)  # waits for it
        self.hosts.start_worker(host)

    def partition(self, worker: str) -> None:
        self.hosts.partition(self.hosts.host_of(worker))

    def heal(self, worker: str) -> None:
        self.hosts.heal(self.hosts.host_of(worker))

    def stop(self) -> None:
        self.hosts.close()


def bounded(fn: Callable[[], Any], timeout: float, what: str) -> Any:
    """``fn()``, or TimeoutError after ``timeout`` s (a Dask call to a worker that may not answer)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        return pool.submit(fn).result(timeout)
    except concurrent.futures.TimeoutError:
        raise TimeoutError(f"{what}: no answer in {timeout:.0f}s") from None
    finally:
        pool.shutdown(wait=False)


# --------------------------------------------------------------------------- the witness
class Witness:
    """Every row handed out, checked against the row before it for the same env.

    A row is right when it is the next step of its env's episode, the first row of the
    next episode after a truncation at ``horizon``, or, for an env the caller was told was
    rebuilt (a marker), what docs/fault-tolerance.md says it must be. Anything else counts as
    a wrong step (the first few are kept to be shown).
    """

    def __init__(self, n_envs: int, horizon: int) -> None:
        self.n_envs, self.horizon = n_envs, horizon
        self.last: dict[int, tuple[int, int, int]] = {}
        self.fresh: set[int] = set()  # Gymnasium NEXT_STEP: the next row is a rebuilt env's first
        self.rows = 0
        self.wrong: list[str] = []
        self.n_wrong = 0
        # (env, reason, the marker's ``restarts``) of every restart the caller was told of
        self.markers: list[tuple[int, str, int]] = []

    def bad(self, what: str) -> None:
        self.n_wrong += 1
        if len(self.wrong) < 20:
            self.wrong.append(what)

    def first(self, obs: Any) -> None:
        """The observations of a reset: every env's episode 0, step 0."""
        for i, o in enumerate(np.asarray(obs)):
            if triple(o) != (i, 0, 0):
                self.bad(f"reset: env {i} handed out {triple(o)}")
            self.last[i] = (i, 0, 0)
        self.rows += len(self.last)

    def sb3(self, obs: Any, rewards: Any, dones: Any, infos: Sequence[dict[str, Any]]) -> None:
        """One SB3 vec-step (``step`` of the SB3 face, or a learner's step)."""
        for i in range(self.n_envs):
            self.sb3_row(i, triple(obs[i]), float(rewards[i]), bool(dones[i]), infos[i])
        self.rows += self.n_envs

    def sb3_row(self, i: int, now: tuple[int, int, int], reward: float, done: bool, info: dict[str, Any]) -> None:
        last = self.last[i]
        _, ep, t = last
        after = (i, ep, t + 1)
        terminal = triple(info["terminal_observation"]) if "terminal_observation" in info else None
        if MARKER in info:
            reason = str(info[MARKER]["reason"])
            self.markers.append((i, reason, int(info[MARKER]["restarts"])))
            # moved: its step happened, then a fresh env; else its step never happened. A fresh env
            # hands out its first observation, or the one after its first step when it was rebuilt
            # outside a step (docs/fault-tolerance.md, "What the learner sees")
            expected_terminal, expected_reward = (after, 1.0) if reason == "moved" else (last, 0.0)
            if not (done and reward == expected_reward and terminal == expected_terminal and now in FRESH(i)):
                self.bad(f"env {i} rebuilt ({reason}): done={done} reward={reward} {terminal} -> {now} after {last}")
        elif done:
            if not (t + 1 == self.horizon and terminal == after and now == (i, ep + 1, 0)):
                self.bad(f"env {i} done at {terminal} -> {now} after {last}")
        elif now != after:
            self.bad(f"env {i} handed out {now} after {last}")
        self.last[i] = now

    def gym(self, obs: Any, rewards: Any, terminated: Any, truncated: Any, info: dict[str, Any]) -> None:
        """One Gymnasium batch (``NEXT_STEP`` autoreset): all envs, or those of ``info["env_id"]``."""
        ids = [int(i) for i in info["env_id"]] if "env_id" in info else list(range(self.n_envs))
        marked = info.get("_" + MARKER, np.zeros(len(ids), dtype=bool))
        for k, i in enumerate(ids):
            now, last, reward = triple(obs[k]), self.last[i], float(rewards[k])
            _, ep, t = last
            term, trunc = bool(terminated[k]), bool(truncated[k])
            # the row this env's next step makes: the reset row (a rebuilt env's first
            # observation, or the next episode's; reward 0) or the next step of its episode
            resets = i in self.fresh or last[2] == self.horizon
            made = ((i, 0, 0) if i in self.fresh else (i, ep + 1, 0), 0.0) if resets else ((i, ep, t + 1), 1.0)
            if marked[k]:
                reason = str(info[MARKER]["reason"][k])
                self.markers.append((i, reason, int(info[MARKER]["restarts"][k])))
                # moved: the row of the step it made (a reset row too); else its last row again
                # (its step never happened)
                expected, expected_reward = made if reason == "moved" else (last, 0.0)
                if not (now == expected and reward == expected_reward and trunc and not term):
                    self.bad(f"env {i} rebuilt ({reason}): {now} reward={reward} trunc={trunc} after {last}")
                self.fresh.add(i)
            elif resets:
                expected = made[0]
                if not (now == expected and reward == 0.0 and not term and not trunc):
                    self.bad(f"env {i} handed out {now} (reward {reward}) after {last}, expected {expected}")
                self.fresh.discard(i)
            elif not (now == (i, ep, t + 1) and reward == 1.0 and not term and trunc == (t + 1 == self.horizon)):
                self.bad(f"env {i} handed out {now} (trunc={trunc}) after {last}")
            self.last[i] = now
        self.rows += len(ids)

    def buffer(self, observations: np.ndarray, episode_starts: np.ndarray, before: dict[int, tuple[int, int, int]]):
        """A learner's rollout buffer: each stored observation follows the one before it in its env.

        ``before``: each env's observation when the rollout started (the buffer's first row).
        """
        n_steps = observations.shape[0]
        for i in range(self.n_envs):
            rows = [triple(observations[t, i]) for t in range(n_steps)]
            if rows[0] != before[i]:
                self.bad(f"buffer: env {i} starts at {rows[0]}, the learner's last observation was {before[i]}")
            for t in range(1, n_steps):
                (a, b), (_, ep, s) = (rows[t - 1], rows[t]), rows[t - 1]
                if b[0] != i:
                    self.bad(f"buffer row {t}: env {i} holds {b} (a foreign env)")
                elif not episode_starts[t, i] and b != (i, ep, s + 1):
                    self.bad(f"buffer row {t}: env {i} {a} -> {b} (stale or shifted)")
                elif episode_starts[t, i] and not ((b == (i, ep + 1, 0) and s + 1 == self.horizon) or b in FRESH(i)):
                    self.bad(f"buffer row {t}: env {i} {a} -> {b} (a new episode that is not one)")
        self.rows += n_steps * self.n_envs


def FRESH(i: int) -> tuple[tuple[int, int, int], ...]:
    """A rebuilt env's possible first rows: its first observation, or the one after its first step."""
    return ((i, 0, 0), (i, 0, 1))


# --------------------------------------------------------------------------- faults
class Injector(threading.Thread):
    """Injects one phase's faults, one at a time, at their times (or as soon as the one before has ended).

    A fault picks a worker that holds envs of ``env`` (seeded), records which envs it held,
    and ends before the next one starts: a freeze is resumed and a killed worker's
    replacement has joined the scheduler, so that each fault's cost is its own.
    """

    def __init__(self, run: Run, env: Any, faults: list[Fault], t0: float) -> None:
        super().__init__(name="soak-faults", daemon=True)
        self.run_, self.env, self.faults, self.t0 = run, env, faults, t0
        self.error: BaseException | None = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            for fault in self.faults:
                wait = self.t0 + fault.at - time.monotonic()
                if wait > 0 and self.stop_event.wait(wait):
                    fault.skipped = "the run stopped"
                    continue
                self.inject(fault)
                self.stop_event.wait(FAULT_GAP)
        except BaseException as e:  # reported by the main thread, which fails the run
            self.error = e
            logger.exception("fault injection failed")

    def holders(self) -> dict[str, tuple[int, list[int]]]:
        """Worker address -> (its pid, the envs it holds), read while the main thread steps."""
        out: dict[str, tuple[int, list[int]]] = {}
        for g in list(self.env.groups):  # a copy: the main thread may replace groups meanwhile
            if int(g["pid"]) in self.run_.killed:
                continue
            pid, envs = out.get(g["worker"], (int(g["pid"]), []))
            out[g["worker"]] = (pid, sorted([*envs, *g["envs"]]))
        return out

    def inject(self, fault: Fault) -> None:
        run = self.run_
        ledger_at = len(self.env.restart_log)  # before the holders: a rebuild may end meanwhile
        held = self.holders()
        if not held:
            fault.skipped = "no worker held envs"
            return
        fault.worker = run.rng.choice(sorted(held))
        fault.pid, fault.envs = held[fault.worker]
        fault.ledger_at = ledger_at
        fault.started = time.monotonic() - run.t0
        run.faulted.add(fault.worker)
        logger.info(
            "phase %d: %s %s (pid %d, envs %s) %.1fs",
            fault.phase,
            fault.kind,
            fault.worker,
            fault.pid,
            fault.envs,
            fault.hold,
        )
        if fault.kind == "kill":
            before = set(run.live_workers())
            run.killed.add(fault.pid)
            run.cluster.kill(fault.pid, fault.worker)
            fault.replacement = run.wait_for_replacement(before - {fault.worker})
        elif fault.kind == "freeze":
            os.kill(fault.pid, signal.SIGSTOP)
            try:
                self.stop_event.wait(fault.hold)
            finally:
                os.kill(fault.pid, signal.SIGCONT)
        else:
            run.cluster.partition(fault.worker)
            try:
                self.stop_event.wait(fault.hold)
            finally:
                run.cluster.heal(fault.worker)


# --------------------------------------------------------------------------- the run
@dataclass
class Options:
    """The soak's settings (the CLI's flags)."""

    minutes: float = 30.0
    seed: int = 0
    n_workers: int = 3
    n_envs: int = 8
    envs_per_actor: int = 1
    step_timeout: float = 5.0
    timeout: float = 60.0
    margin: float | None = None  # default: step_timeout / 2
    phase_seconds: float | None = None  # default: a quarter of the run, at most two minutes
    faults_per_minute: float = 4.0
    horizon: int = 50
    env_delay: float = 0.0
    n_steps: int = 16
    sample_seconds: float = 60.0
    hosts: bool = False

    def margin_s(self) -> float:
        return self.step_timeout / 2 if self.margin is None else self.margin

    def phase_s(self) -> float:
        return self.phase_seconds or min(120.0, self.minutes * 60 / len(FACES))


class Run:
    """One soak: the cluster, the schedule, and everything measured."""

    def __init__(self, opts: Options, cluster: Any, client: Any) -> None:
        self.opts, self.cluster, self.client = opts, cluster, client
        self.rng = random.Random(opts.seed)
        self.n_phases = max(len(FACES), round(opts.minutes * 60 / opts.phase_s()))
        self.faults = make_schedule(
            self.rng, self.n_phases, opts.phase_s(), opts.step_timeout, opts.faults_per_minute, opts.hosts
        )
        self.t0 = time.monotonic()
        self.faulted: set[str] = set()
        # processes this run killed: env.groups can still name one (its loss not yet noticed
        # by the caller, inside a collection) when the next fault picks a worker
        self.killed: set[int] = set()
        self.baselines: dict[str, Any] = {}
        self.calls: dict[str, list[float]] = {"step": [], "recv": [], "collect": []}
        self.longest: dict[str, dict[str, Any]] = {}
        self.steps_at: list[tuple[float, int]] = []  # (seconds from the start, env-steps)
        self.spread: list[dict[str, Any]] = []
        self.phases: list[dict[str, Any]] = []
        self.next_sample = 0.0
        self.first_collects: list[float] = []  # each PPO phase's first collection (set-up; no fault yet)
        self.warm_workers: set[str] = set()  # the workers that have collected a rollout for DaskPPO

    # -------------------------------------------------------------- the cluster
    def live_workers(self) -> list[str]:
        info = bounded(lambda: self.client.scheduler_info(), self.opts.timeout, "the scheduler's workers")
        return sorted(info["workers"])

    def probe(self, workers: list[str]) -> dict[str, Any]:
        """What daskvec holds on ``workers`` (none of them frozen or cut off)."""
        probe = footprint_probe(dask_ports(self.client))
        return bounded(lambda: self.client.run(probe, workers=workers), self.opts.timeout, "the footprint probe")

    def wait_for_replacement(self, others: set[str]) -> str:
        """Wait until a new worker joined; take its footprint before it holds envs."""
        deadline = time.monotonic() + self.opts.timeout
        while True:
            new = set(self.live_workers()) - others - set(self.baselines)
            if new:
                (worker,) = sorted(new)[:1]
                self.baselines.update(self.probe([worker]))
                return worker
            if time.monotonic() > deadline:
                raise TimeoutError(f"no replacement worker joined in {self.opts.timeout:.0f}s")
            time.sleep(0.1)

    # -------------------------------------------------------------- measuring
    def timed(self, kind: str, phase: int, fn: Callable[[], Any]) -> Any:
        start = time.monotonic()
        out = fn()
        took = time.monotonic() - start
        self.calls[kind].append(took)
        if took > self.longest.get(kind, {}).get("seconds", -1.0):
            self.longest[kind] = {"seconds": took, "phase": phase, "at": start - self.t0}
        return out

    def count(self, n: int) -> None:
        self.steps_at.append((time.monotonic() - self.t0, n))

    def sample(self, env: Any, force: bool = False) -> None:
        """Every ``sample_seconds`` (and at each phase's end): envs per worker, and the live workers."""
        now = time.monotonic() - self.t0
        if not force and now < self.next_sample:
            return
        self.next_sample = now + self.opts.sample_seconds
        per: Counter[str] = Counter()
        for g in env.groups:
            per[g["worker"]] += len(g["envs"])
        self.spread.append(
            {
                "at": round(now, 1),
                "envs_per_worker": dict(sorted(per.items())),
                "live_workers": len(self.live_workers()),
            }
        )

    # -------------------------------------------------------------- phases
    def run(self) -> None:
        self.baselines.update(self.probe(self.live_workers()))
        for phase in range(self.n_phases):
            face = FACES[phase % len(FACES)]
            last = phase == self.n_phases - 1
            self.phases.append(self.run_phase(phase, face, last))

    def make_env(self, face: str) -> Any:
        o = self.opts
        fns = [partial(WitnessEnv, i, o.horizon, o.env_delay) for i in range(o.n_envs)]
        options: dict[str, Any] = {
            "envs_per_actor": o.envs_per_actor,
            "step_timeout": o.step_timeout,
            "timeout": o.timeout,
            # a killed worker's replacement takes envs again, as a long run's user would want
            "auto_rebalance": True,
        }
        if face.startswith("gym"):
            from daskvec import DaskVectorEnv

            batch = o.n_envs // 2 if face == "gym-send-recv" else None
            return DaskVectorEnv(fns, self.cluster.address, batch_size=batch, **options)
        from daskvec import DaskVecEnv

        return DaskVecEnv(fns, self.cluster.address, **options)

    def run_phase(self, phase: int, face: str, last: bool) -> dict[str, Any]:
        o = self.opts
        faults = [f for f in self.faults if f.phase == phase]
        witness = Witness(o.n_envs, o.horizon)
        env = self.make_env(face)
        record: dict[str, Any] = {"phase": phase, "face": face, "start": round(time.monotonic() - self.t0, 1)}
        injector: Injector | None = None
        try:
            stepper = Stepper(self, env, face, phase, witness)
            stepper.reset()
            t0 = time.monotonic()
            injector = Injector(self, env, faults, t0)
            injector.start()
            end = t0 + o.phase_s()
            # the phase lasts its time, and until its last fault has ended and a few calls followed it
            while time.monotonic() < end or injector.is_alive():
                stepper.advance()
                self.sample(env)
            injector.join(o.timeout)
            if injector.error is not None:
                raise RuntimeError("a fault could not be injected") from injector.error
            for _ in range(3):  # what the last fault did is reported by the calls after it
                stepper.advance()
            if last:
                record["settled_in"] = self.settle(stepper, env)
            self.sample(env, force=True)
            record["groups_at_end"] = [{"worker": g["worker"], "envs": g["envs"]} for g in env.groups]
            record.update(self.restarts(env, witness, faults, face))
        finally:
            if injector is not None:  # a stopped run ends its fault first: a freeze resumed, a kill replaced
                injector.stop_event.set()
                injector.join(o.timeout)
            with contextlib.suppress(Exception):  # closing after a failure must not hide it
                close_start = time.monotonic()
                env.close()
                record["close_seconds"] = round(time.monotonic() - close_start, 2)
        record["wrong_steps"] = witness.n_wrong
        record["wrong_examples"] = witness.wrong
        record["rows_checked"] = witness.rows
        record["faults"] = [asdict(f) for f in faults]
        logger.info(
            "phase %d (%s): %d rows, %d wrong, restarts %s",
            phase,
            face,
            witness.rows,
            witness.n_wrong,
            record.get("markers_by_reason"),
        )
        return record

    def settle(self, stepper: Stepper, env: Any) -> float:
        """Step until the envs are over every live worker, within the bound the docs derive.

        A resumed worker's quarantine ends after ``PROBES_TO_HEAL`` probes ``PROBE_INTERVAL``
        apart, each answered within ``timeout``; then one rebalance; a replacement worker gets
        envs at the next ``auto_rebalance`` (every ``rebalance_interval``).
        """
        from daskvec import config
        from daskvec._core.directory import PROBES_TO_HEAL
        from daskvec._core.recovery import PROBE_INTERVAL

        interval = float(config.get("rebalance_interval"))
        bound = PROBES_TO_HEAL * (PROBE_INTERVAL + self.opts.timeout) + PROBE_INTERVAL + self.opts.timeout + interval
        start = time.monotonic()
        while {g["worker"] for g in env.groups} != set(self.live_workers()):
            if time.monotonic() - start > bound:
                break
            stepper.advance()
        return round(time.monotonic() - start, 1)

    def restarts(self, env: Any, witness: Witness, faults: list[Fault], face: str) -> dict[str, Any]:
        """The restarts the caller was told of, against the ledger and against the faults."""
        log = list(env.restart_log)
        counts = [int(c) for c in env.restart_counts]
        # a restart daskvec did not cause on purpose must come from a worker a fault hit
        unexplained = [e for e in log if e["reason"] != "moved" and e.get("from_worker") not in self.faulted]
        kills_unrebuilt = [
            {"worker": f.worker, "envs": f.envs, "not_rebuilt": missing}
            for f in faults
            if f.kind == "kill" and (missing := kill_not_rebuilt(f, log))
        ]
        told = told_against_ledger(witness.markers, log, counts, each_at_its_own_step=face != "ppo")
        return {
            "markers": len(witness.markers),
            "markers_by_reason": dict(Counter(r for _, r, _ in witness.markers)),
            "ledger": len(log),
            "markers_match_ledger": told["ok"],
            "told_against_ledger": told,
            "restart_counts": counts,
            "unexplained_restarts": unexplained,
            "kills_not_rebuilt": kills_unrebuilt,
            "restart_log": log,
        }

    # -------------------------------------------------------------- after the run
    def leftovers(self) -> dict[str, Any]:
        """Wait (bounded) until every live worker's footprint is back to its baseline; what is left."""
        deadline = time.monotonic() + self.opts.timeout
        while True:
            workers = self.live_workers()
            now = self.probe(workers)
            left = {
                w: {k: v for k, v in now[w].items() if v != self.baselines[w][k]}
                for w in workers
                if w in self.baselines
            }
            left = {w: v for w, v in left.items() if v}
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


class Stepper:
    """Drives one phase's vec env through its face, checking every row with the witness."""

    def __init__(self, run: Run, env: Any, face: str, phase: int, witness: Witness) -> None:
        self.run, self.env, self.face, self.phase, self.witness = run, env, face, phase, witness
        self.actions = np.zeros(env.num_envs, dtype=np.int64)
        self.model: Any = None
        self.warming = False

    def reset(self) -> None:
        if self.face == "sb3":
            self.witness.first(self.env.reset())
        elif self.face == "ppo":
            self.model = self.learner()
            # the learner's first rollout ships its policy and starts the workers' collectors:
            # set-up, collected before any fault and not counted among the collections
            self.warming = True
            try:
                self.advance()
            finally:
                self.warming = False
        else:
            obs, _ = self.env.reset()
            self.witness.first(obs)
            if self.face == "gym-send-recv":
                self.env.send(self.actions)

    def advance(self) -> None:
        """One call: a vec-step, a ``recv`` (and the ``send`` of the envs it returned), or a few rollouts."""
        w, run = self.witness, self.run
        if self.face == "sb3":
            w.sb3(*run.timed("step", self.phase, lambda: self.env.step(self.actions)))
            run.count(self.env.num_envs)
        elif self.face == "gym-step":
            w.gym(*run.timed("step", self.phase, lambda: self.env.step(self.actions)))
            run.count(self.env.num_envs)
        elif self.face == "gym-send-recv":
            batch = run.timed("recv", self.phase, self.env.recv)
            w.gym(*batch)
            ids = np.asarray(batch[4]["env_id"])
            run.count(len(ids))
            self.env.send(np.zeros(len(ids), dtype=np.int64), ids)
        else:
            n = self.model.n_steps * self.env.num_envs
            self.model.learn(n, reset_num_timesteps=False, callback=self.callback)

    def learner(self) -> Any:
        """DaskPPO collecting on the workers; a callback checks every step and every rollout buffer."""
        from stable_baselines3.common.callbacks import BaseCallback

        from daskvec.sb3 import DaskPPO

        stepper, run, w = self, self.run, self.witness

        class Check(BaseCallback):
            def _on_training_start(self) -> None:
                if not w.last:
                    w.first(self.model._last_obs)

            def _on_rollout_start(self) -> None:
                self.before = dict(w.last)
                self.workers = {g["worker"] for g in stepper.env.groups}
                self.started = time.monotonic()

            def _on_step(self) -> bool:
                loc = self.locals
                w.sb3(loc["new_obs"], loc["rewards"], loc["dones"], loc["infos"])
                run.count(stepper.env.num_envs)
                return True

            def _on_rollout_end(self) -> None:
                took = time.monotonic() - self.started
                workers = self.workers | {g["worker"] for g in stepper.env.groups}
                # a worker's first rollout builds the policy there, which imports much of torch
                # (seconds): that collection is reported apart, not bounded with the others
                kind = "collect" if workers <= run.warm_workers else "first collect on a worker"
                run.warm_workers |= workers
                if stepper.warming:
                    run.first_collects.append(took)  # the phase's set-up, before any fault
                else:
                    run.calls.setdefault(kind, []).append(took)
                    if took > run.longest.get(kind, {}).get("seconds", -1.0):
                        run.longest[kind] = {"seconds": took, "phase": stepper.phase, "at": self.started - run.t0}
                model: Any = self.model
                buf = model.rollout_buffer
                w.buffer(buf.observations, buf.episode_starts, self.before)

        self.callback = Check()
        o = run.opts
        return DaskPPO(
            "MlpPolicy",
            self.env,
            n_steps=o.n_steps,
            batch_size=o.n_steps * o.n_envs,
            n_epochs=1,
            device="cpu",
            seed=o.seed,
        )


# --------------------------------------------------------------------------- the report
def collect_stall_bound(o: Options, n_workers: int) -> float:
    """What a fault may add to a worker-side collection, as docs/fault-tolerance.md says it is found.

    A collection cannot tell a frozen worker by its reply: it watches the worker's
    heartbeats to the scheduler, and judges it frozen after ``step_timeout`` without one, but
    never less than 10 heartbeat intervals (5 s up to 10 workers). It looks every quarter of
    ``step_timeout`` (0.5 s to 5 s), reads each answer of the scheduler at its next look, and
    gives a last look before it gives up: three looks on top, then the rebuild (``margin``).
    """
    from daskvec._core.dask_internals import heartbeat_interval
    from daskvec._core.directory import _HEARTBEATS
    from daskvec._core.rollouts import _LOOK_MAX, _LOOK_MIN

    quiet = max(o.step_timeout, _HEARTBEATS * heartbeat_interval(n_workers))
    look = min(max(o.step_timeout / 4, _LOOK_MIN), _LOOK_MAX)
    return quiet + 3 * look + o.margin_s()


def summarize(run: Run, leftovers: dict[str, Any], live: list[str]) -> dict[str, Any]:
    """Everything measured, and each invariant with whether it held."""
    o = run.opts
    bound = o.step_timeout + o.margin_s()
    collects = run.calls["collect"]
    # a collection's own work (its median) is not a stall: only what a fault added is bounded
    collect_bound = collect_stall_bound(o, len(run.live_workers())) + (statistics.median(collects) if collects else 0.0)
    longest = {k: round(v["seconds"], 2) for k, v in run.longest.items()}
    per_minute: Counter[int] = Counter()
    for at, n in run.steps_at:
        per_minute[int(at // 60)] += n
    elapsed = time.monotonic() - run.t0
    throughput = [
        {"minute": m, "env_steps": n, "per_minute": round(n * 60 / min(60.0, elapsed - 60 * m), 1)}
        for m, n in sorted(per_minute.items())
    ]
    faults = [f for ph in run.phases for f in ph["faults"]]
    injected = [f for f in faults if not f["skipped"]]
    holds = [f["hold"] for f in injected if f["kind"] == "freeze"]
    final = run.phases[-1]["groups_at_end"] if run.phases else []
    held = {g["worker"] for g in final}
    wrong = sum(ph["wrong_steps"] for ph in run.phases)
    per_phase = [Counter(f["kind"] for f in ph["faults"] if not f["skipped"]) for ph in run.phases]
    invariants = {
        "no wrong step": wrong == 0,
        "restarts told = ledger (restart_log, restart_counts)": all(ph["markers_match_ledger"] for ph in run.phases),
        "every restart from a faulted worker (or moved)": not any(ph["unexplained_restarts"] for ph in run.phases),
        "every killed worker's envs rebuilt": not any(ph["kills_not_rebuilt"] for ph in run.phases),
        f"longest step/recv <= step_timeout + {o.margin_s():g}s": max(
            [longest.get("step", 0.0), longest.get("recv", 0.0)]
        )
        <= bound,
        "longest collect (on workers that had collected) <= its median + heartbeat-watch bound": longest.get(
            "collect", 0.0
        )
        <= collect_bound,
        "envs over every live worker at the end": held == set(live),
        "nothing left on the workers after close()": not leftovers,
        "a kill and a freeze in every phase": all(c["kill"] and c["freeze"] for c in per_phase),
        "freezes longer and shorter than step_timeout": any(h > o.step_timeout for h in holds)
        and any(h < o.step_timeout for h in holds),
    }
    return {
        "options": asdict(o),
        "seconds": round(elapsed, 1),
        "rows_checked": sum(ph["rows_checked"] for ph in run.phases),
        "wrong_steps": wrong,
        "wrong_examples": [e for ph in run.phases for e in ph["wrong_examples"]][:20],
        "faults_injected": dict(Counter(f["kind"] for f in injected)),
        "freeze_holds": [round(h, 1) for h in holds],
        "faults_skipped": [f for f in faults if f["skipped"]],
        "restarts_told": sum(ph["markers"] for ph in run.phases),
        "restarts_in_ledger": sum(ph["ledger"] for ph in run.phases),
        # rebuilds in a worker-side rollout lost again before they stepped: told by the next marker
        "restarts_superseded": sum(len(ph["told_against_ledger"]["superseded"]) for ph in run.phases),
        "restarts_by_reason": dict(sum((Counter(ph["markers_by_reason"]) for ph in run.phases), Counter())),
        "longest_call_s": longest,
        "longest_call_where": run.longest,
        "median_collect_s": round(statistics.median(collects), 2) if collects else None,
        "first_collect_s": [round(t, 2) for t in run.first_collects],
        "step_timeout": o.step_timeout,
        "bound_s": bound,
        "collect_bound_s": round(collect_bound - (statistics.median(collects) if collects else 0.0), 2),
        "throughput": throughput,
        "spread": run.spread,
        "live_workers_at_end": live,
        "leftovers_after_close": leftovers,
        "phases": run.phases,
        "invariants": invariants,
        "ok": all(invariants.values()),
    }


def print_report(result: dict[str, Any]) -> None:
    """The report's table, for a terminal."""
    o = result["options"]
    print(
        f"soak: {result['seconds']:.0f}s, seed {o['seed']}, {o['n_workers']} workers, {o['n_envs']} envs, "
        f"step_timeout {o['step_timeout']:g}s, {len(result['phases'])} phases"
    )
    print(f"  rows checked by the witness   {result['rows_checked']}")
    print(f"  wrong steps                   {result['wrong_steps']}")
    for e in result["wrong_examples"][:5]:
        print(f"    {e}")
    print(f"  faults injected               {result['faults_injected']} (freezes held {result['freeze_holds']} s)")
    print(
        f"  restarts told / in ledger     {result['restarts_told']} / {result['restarts_in_ledger']} "
        f"{result['restarts_by_reason']}; superseded in a rollout (counted by the next marker) "
        f"{result['restarts_superseded']}"
    )
    for ph in result["phases"]:
        for problem in ph["told_against_ledger"]["problems"][:3]:
            print(f"    phase {ph['phase']} ({ph['face']}): {problem}")
    print(
        f"  longest call (s)              {result['longest_call_s']} (bound {result['bound_s']:g}; "
        f"collect {result['collect_bound_s']:g} plus the median {result['median_collect_s']})"
    )
    print("  env-steps per minute          " + ", ".join(str(t["per_minute"]) for t in result["throughput"]))
    print("  envs per worker over time")
    for s in result["spread"]:
        counts = sorted(s["envs_per_worker"].values(), reverse=True)
        print(f"    {s['at']:7.1f}s  {counts} over {s['live_workers']} live workers")
    print(f"  left after close()            {result['leftovers_after_close'] or 'nothing'}")
    for name, ok in result["invariants"].items():
        print(f"  [{'ok' if ok else 'FAILED'}] {name}")


def parse(argv: Sequence[str] | None) -> tuple[Options, Path | None, bool]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n", 1)[0])
    d = Options()
    p.add_argument("--minutes", type=float, default=d.minutes, help="how long the run lasts")
    p.add_argument("--seed", type=int, default=d.seed, help="seeds the fault schedule and every choice in it")
    p.add_argument("--n-workers", type=int, default=d.n_workers)
    p.add_argument("--n-envs", type=int, default=d.n_envs)
    p.add_argument("--envs-per-actor", type=int, default=d.envs_per_actor)
    p.add_argument("--step-timeout", type=float, default=d.step_timeout)
    p.add_argument("--timeout", type=float, default=d.timeout, help="daskvec's timeout, and the soak's own waits")
    p.add_argument(
        "--margin",
        type=float,
        default=None,
        help="what a call may take beyond step_timeout "
        "(default: step_timeout / 2: the rebuild of a lost worker's groups)",
    )
    p.add_argument("--phase-seconds", type=float, default=None)
    p.add_argument("--faults-per-minute", type=float, default=d.faults_per_minute)
    p.add_argument("--horizon", type=int, default=d.horizon, help="the witness env's episode length")
    p.add_argument("--env-delay", type=float, default=d.env_delay, help="seconds each env step sleeps")
    p.add_argument("--n-steps", type=int, default=d.n_steps, help="DaskPPO's n_steps")
    p.add_argument("--sample-seconds", type=float, default=d.sample_seconds, help="how often the spread is sampled")
    p.add_argument("--hosts", action="store_true", help="workers on emulated hosts, and partitions (root)")
    p.add_argument("--json", type=Path, default=None, help="write the result here")
    p.add_argument("--keep", action="store_true", help="keep the processes' logs even when the run passes")
    a = p.parse_args(argv)
    opts = Options(**{k: v for k, v in vars(a).items() if k in Options.__dataclass_fields__})
    return opts, a.json, a.keep


def soak(opts: Options, workdir: Path) -> dict[str, Any]:
    """Run the soak in ``workdir``; the result of :func:`summarize`."""
    from distributed import Client

    cluster: Any = (HostProcesses if opts.hosts else LocalProcesses)(opts.n_workers, workdir, opts.timeout)
    try:
        with Client(cluster.address, set_as_default=False, timeout=opts.timeout) as client:
            client.wait_for_workers(opts.n_workers, timeout=opts.timeout)
            run = Run(opts, cluster, client)
            run.run()
            live = run.live_workers()
            return summarize(run, run.leftovers(), live)
    finally:
        cluster.stop()


class Stopped(BaseException):
    """The soak was told to stop (SIGTERM, SIGHUP, SIGINT) before its time was up."""


#: The signals that stop the soak, and the first that came (its clean-up runs once).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
_stopped_by: list[signal.Signals] = []


def _stop(signum: int, frame: Any) -> None:
    # No later signal, of any of the three, may interrupt the clean-up the first one starts.
    for other in STOP_SIGNALS:
        signal.signal(other, signal.SIG_IGN)
    _stopped_by.append(signal.Signals(signum))
    raise Stopped(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: run, print, write ``--json``; 0 when every invariant held.

    SIGTERM, SIGHUP and Ctrl-C stop the run and end the processes it started (with
    ``--hosts``, its emulated hosts too); the exit status is then 128 + the signal.
    """
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    opts, out, keep = parse(argv)
    import torch

    torch.set_num_threads(1)  # the learner shares the machine with the workers it measures
    workdir = Path(tempfile.mkdtemp(prefix="daskvec-soak-"))
    for signum in STOP_SIGNALS:
        signal.signal(signum, _stop)
    try:
        result = soak(opts, workdir)
    except BaseException:
        # whatever the signal's exception became on its way out (a vec env in the middle of a
        # recovery turns an interruption into its own error), the run was stopped, not failed
        if not _stopped_by:
            raise
        logger.warning("stopped by %s; its processes are ended; logs: %s", _stopped_by[0].name, workdir)
        return 128 + _stopped_by[0].value
    print_report(result)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    if result["ok"] and not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"logs of the scheduler and the workers: {workdir}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
