"""Time to reward: wall-clock seconds until a deterministic evaluation reaches a threshold.

``daskvec bench --scenario time-to-reward`` (or :func:`run_time_to_reward`) trains each case
on the same seeds, the cases alternated within each seed, and stops a run at the first
evaluation (every ``eval_every`` env-steps, ``eval_episodes`` deterministic episodes on a
seeded env of its own) whose mean return reaches the threshold. The clock starts before
the vec env is made (construction included) and is paused while evaluating (every case
pays the same evaluations; they are not what is compared).

Cases (RL Zoo's tuned hyperparameters, schedules made constant):

- CartPole-v1 (threshold 475), PPO with 8 envs: ``ppo-dummy`` (SB3's PPO on
  ``DummyVecEnv``), ``ppo-subproc`` (on ``SubprocVecEnv``), ``ppo-dask`` (on ``DaskVecEnv``),
  ``daskppo`` (collecting on the workers) and ``daskppo-ahead`` (``collect_ahead=1``);
- Pendulum-v1 (threshold -250), SAC with 4 envs: ``sac-dummy``, ``sac-subproc``,
  ``dasksac`` and ``dasksac-ahead``.

``env_delay`` adds a ``time.sleep`` to every env step: an env whose step waits (on a
simulator in another process, a robot, a remote service) rather than computes. The other
way, on one machine, to keep the envs' time off the learner's CPU is ``hosts_cpus`` (below).
With CPU-bound envs on 2 cores and nothing confined, the learner and the envs share the
cores, and overlapping them mostly trades one for the other.

The learner runs torch with one thread (``learner_threads``) in every case: on 2 cores
shared with the workers, a second intra-op thread spins against them while a rollout is
collected ahead (training a rollout took 114 ms instead of 67 ms at a 10 ms round trip)
and buys little for these small networks when nothing else runs.

``rtt_ms`` runs the daskvec cases' workers on two emulated hosts (:mod:`benchmarks.hosts`:
network namespaces, each with its own address and a relay adding that round trip to
every connection; root) instead of an embedded ``LocalCluster``: the envs behind a
network, as on a cluster's other nodes. SB3's own vec envs run on the learner's host either way.
``hosts_cpus`` confines the hosts' processes to those CPUs (``taskset -c``), so that
the envs' computing stays off the core the learner trains on, as on other machines;
the learner's process may still use every core.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from benchmarks.learning import ZOO_CARTPOLE
from benchmarks.learning_runs import alternated, evaluate, learning_client
from daskvec.bench.machine import machine_info

logger = logging.getLogger(__name__)

__all__ = ["CASES", "format_time_to_reward_table", "run_time_to_reward"]

#: RL Zoo's SAC hyperparameters for Pendulum-v1 (learning rate 1e-3), collected 8 vec-steps at a time.
ZOO_SAC_PENDULUM: dict[str, Any] = {"learning_rate": 1e-3, "train_freq": (8, "step"), "gradient_steps": 8}

#: case -> (env id, algorithm, vec env, collect_ahead)
CASES: dict[str, tuple[str, str, str, int | None]] = {
    "ppo-dummy": ("CartPole-v1", "ppo", "dummy", None),
    "ppo-subproc": ("CartPole-v1", "ppo", "subproc", None),
    "ppo-dask": ("CartPole-v1", "ppo", "dask", None),
    "daskppo": ("CartPole-v1", "daskppo", "dask", 0),
    "daskppo-ahead": ("CartPole-v1", "daskppo", "dask", 1),
    "sac-dummy": ("Pendulum-v1", "sac", "dummy", None),
    "sac-subproc": ("Pendulum-v1", "sac", "subproc", None),
    "dasksac": ("Pendulum-v1", "dasksac", "dask", 0),
    "dasksac-ahead": ("Pendulum-v1", "dasksac", "dask", 1),
}
THRESHOLDS = {"CartPole-v1": 475.0, "Pendulum-v1": -250.0}
#: daskvec's logger keys of who waited for whom (docs/rollouts.md), summed over a run
SPLIT_KEYS = ("learner_wait_s", "learner_busy_s", "envs_busy_s", "envs_idle_s")


def algo_is_daskvec(case: str) -> bool:
    """Whether ``case`` trains one of daskvec's learners (collecting on the workers)."""
    return CASES[case][1].startswith("dask")


N_ENVS = {"CartPole-v1": 8, "Pendulum-v1": 4}


class Waiting(gym.Wrapper[Any, Any, Any, Any]):
    """An env whose step takes ``delay`` seconds of waiting (not of computing)."""

    def __init__(self, env: gym.Env[Any, Any], delay: float) -> None:
        super().__init__(env)
        self.delay = delay

    def step(self, action: Any) -> Any:
        time.sleep(self.delay)
        return self.env.step(action)


class _MakeEnv:
    """A picklable env factory: ``env_id``, made to wait ``delay`` seconds a step."""

    def __init__(self, env_id: str, delay: float) -> None:
        self.env_id, self.delay = env_id, delay

    def __call__(self) -> gym.Env[Any, Any]:
        env = gym.make(self.env_id)
        return Waiting(env, self.delay) if self.delay > 0 else env


def _make_model(case: str, seed: int, env_delay: float, client: Any) -> Any:
    from stable_baselines3 import PPO, SAC
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    from daskvec.sb3 import DaskPPO, DaskSAC
    from daskvec.sb3.vec_env import DaskVecEnv

    env_id, algo, kind, ahead = CASES[case]
    vec_cls: Any = {"dummy": DummyVecEnv, "subproc": SubprocVecEnv, "dask": DaskVecEnv}[kind]
    kwargs: dict[str, Any] = {"client": client} if kind == "dask" else {}
    env = make_vec_env(
        _MakeEnv(env_id, env_delay), n_envs=N_ENVS[env_id], seed=seed, vec_env_cls=vec_cls, vec_env_kwargs=kwargs
    )
    cls: Any = {"ppo": PPO, "daskppo": DaskPPO, "sac": SAC, "dasksac": DaskSAC}[algo]
    hyper = dict(ZOO_CARTPOLE if env_id == "CartPole-v1" else ZOO_SAC_PENDULUM)
    if ahead is not None:
        hyper["collect_ahead"] = ahead
    return cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyper)


def _run_case(
    case: str,
    seed: int,
    env_delay: float,
    eval_every: int,
    eval_episodes: int,
    max_steps: int,
    client: Any,
    threshold: float | None = None,
) -> dict[str, Any]:
    from stable_baselines3.common.callbacks import BaseCallback

    env_id = CASES[case][0]
    goal: float = THRESHOLDS[env_id] if threshold is None else threshold
    curve: list[tuple[float, int, float]] = []
    split = dict.fromkeys(SPLIT_KEYS, 0.0)
    paused = [0.0]
    started = time.perf_counter()

    class _Evaluate(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.next = eval_every
            self.fresh = False
            self.evaluating = 0.0  # seconds of evaluation since the last rollout arrived

        def _on_step(self) -> bool:
            if self.fresh:
                # daskvec's learners log who waited for whom as a rollout arrives, before its first
                # step (SB3's own learners log none of it); counted here, as a run may stop mid-rollout
                self.fresh = False
                logged = self.model.logger.name_to_value
                for key in SPLIT_KEYS:
                    split[key] += float(logged.get(f"daskvec/{key}", 0.0))
                # the envs stood still during the evaluations too, which are off the clock
                if "daskvec/envs_idle_s" in logged:
                    split["envs_idle_s"] -= min(self.evaluating, float(logged["daskvec/envs_idle_s"]))
                self.evaluating = 0.0
            if self.num_timesteps < self.next:
                return True
            self.next += eval_every
            t0 = time.perf_counter()
            elapsed = t0 - started - paused[0]  # the wall clock so far, without the evaluations before
            score = evaluate(self.model, env_id, eval_episodes, seed=10_000 + seed)
            paused[0] += time.perf_counter() - t0
            self.evaluating += time.perf_counter() - t0
            curve.append((elapsed, self.num_timesteps, score))
            return score < goal

        def _on_rollout_start(self) -> None:
            self.fresh = True

    model = _make_model(case, seed, env_delay, client)
    env = model.get_env()
    # where the envs were placed, at the start and at the end: the emulated hosts' workers when rtt_ms is given
    dask = CASES[case][2] == "dask"
    workers = {str(g["worker"]) for g in env.groups} if dask else set()
    try:
        model.learn(max_steps, callback=_Evaluate())
        if dask:
            workers |= {str(g["worker"]) for g in env.groups}
    finally:
        env.close()
    reached = next((c for c in curve if c[2] >= goal), None)
    return {
        "case": case,
        "seed": seed,
        "workers": sorted(workers),
        "seconds": None if reached is None else round(reached[0], 3),
        "steps": None if reached is None else reached[1],
        "curve": [{"seconds": round(s, 3), "steps": n, "return": round(r, 2)} for s, n, r in curve],
        # the run's sums of daskvec's per-rollout logger keys (None for SB3's own learners)
        "time_split": {k: round(v, 3) for k, v in split.items()} if algo_is_daskvec(case) else None,
    }


def run_time_to_reward(
    cases: Sequence[str] = ("ppo-dummy", "daskppo", "daskppo-ahead"),
    seeds: Sequence[int] = (0, 1, 2),
    env_delay: float = 0.0,
    eval_every: int = 2048,
    eval_episodes: int = 5,
    max_steps: int = 200_000,
    scheduler: str | None = None,
    out_path: Path | None = None,
    threshold: float | None = None,
    rtt_ms: float | None = None,
    learner_threads: int | None = 1,
    hosts_cpus: str | None = None,
) -> dict[str, Any]:
    """Train every case on every seed (cases alternated within a seed, their order rotated); medians and ratios.

    Returns the runs, each case's median seconds and its ratio to the first case's, and
    writes them as JSON to ``out_path`` if given. ``threshold`` replaces the envs' own
    (475 on CartPole-v1, -250 on Pendulum-v1); a run that never reaches it within
    ``max_steps`` has no time, and its case no median. The daskvec cases' envs run on
    ``scheduler``'s workers if given, else on two emulated hosts at ``rtt_ms`` if given
    (root), else on an embedded ``LocalCluster`` of two worker processes.
    ``learner_threads`` sets torch's threads in this process for the run (``None``: as they are).
    ``hosts_cpus`` (with ``rtt_ms``) keeps the emulated hosts' processes to those CPUs
    (``taskset -c`` syntax), as other machines' cores would be; the learner's process and
    SB3's vec envs may still run on any.
    """
    import torch

    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ValueError(f"unknown time-to-reward cases {unknown}; choose from {sorted(CASES)}")
    runs = []
    threads = torch.get_num_threads()
    if learner_threads is not None:
        torch.set_num_threads(learner_threads)
    try:
        with learning_client(scheduler, rtt_ms, hosts_cpus) as (client, hosts):
            for seed, case in alternated(list(cases), seeds):
                run = _run_case(case, seed, env_delay, eval_every, eval_episodes, max_steps, client, threshold)
                logger.info("time to reward: %s seed %d: %s s", case, seed, run["seconds"])
                runs.append(run)
    finally:
        torch.set_num_threads(threads)
    medians = {}
    for case in cases:
        times = [r["seconds"] for r in runs if r["case"] == case]
        medians[case] = None if any(t is None for t in times) else float(np.median(times))
    base = medians[cases[0]]
    result = {
        "scenario": "time-to-reward",
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "env_delay": env_delay,
        "rtt_ms": rtt_ms,
        "hosts_cpus": hosts_cpus,
        "learner_threads": torch.get_num_threads() if learner_threads is None else learner_threads,
        # the emulated hosts' addresses: where each run's "workers" should be
        "hosts": hosts or None,
        "eval_every": eval_every,
        "eval_episodes": eval_episodes,
        "seeds": list(seeds),
        "runs": runs,
        "median_seconds": medians,
        "ratio_to_first": {c: None if m is None or not base else round(m / base, 3) for c, m in medians.items()},
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result


def format_time_to_reward_table(result: dict[str, Any]) -> str:
    """The cases' median seconds to the threshold, each run's, and the ratio to the first case."""
    lines = [
        f"time to reward (env delay {result['env_delay'] * 1000:.3g} ms a step; {_where(result)}; "
        f"seeds {result['seeds']}; wall seconds, construction included, evaluations excluded)",
        f"{'case':<15}{'median s':>10}{'ratio':>8}  runs",
    ]
    splits: list[str] = []
    for case in result["median_seconds"]:
        rows = [r["time_split"] for r in result["runs"] if r["case"] == case and r.get("time_split")]
        if rows:
            med = {k: float(np.median([row[k] for row in rows])) for k in SPLIT_KEYS}
            splits.append(
                f"  {case}: envs busy {med['envs_busy_s']:.1f} s, idle {med['envs_idle_s']:.1f} s; "
                f"learner busy {med['learner_busy_s']:.1f} s, waiting {med['learner_wait_s']:.1f} s (medians)"
            )
    for case, median in result["median_seconds"].items():
        runs = [r["seconds"] for r in result["runs"] if r["case"] == case]
        shown = " ".join("never" if s is None else f"{s:.1f}" for s in runs)
        ratio = result["ratio_to_first"][case]
        lines.append(
            f"{case:<15}{'-' if median is None else f'{median:.1f}':>10}{'-' if ratio is None else f'{ratio:.2f}':>8}"
            f"  {shown}"
        )
    if splits:
        lines += ["who waited for whom, over each run (daskvec's logger keys):", *splits]
    return "\n".join(lines)


def _where(result: dict[str, Any]) -> str:
    rtt = result.get("rtt_ms")
    if rtt is None:
        return "daskvec's workers local"
    pinned = f", their processes on CPU {result['hosts_cpus']}" if result.get("hosts_cpus") else ""
    return f"daskvec's workers on 2 emulated hosts at {rtt:g} ms{pinned}"


def plot_curves(result: dict[str, Any], path: Path) -> Path:
    """Two panels (PNG): the share of seeds that reached the threshold against wall-clock
    seconds, and the median return over the seeds against wall-clock seconds, a line per
    case (a run that stopped at the threshold keeps its last evaluation)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (reached, median) = plt.subplots(1, 2, figsize=(10, 4))
    cases = list(result["median_seconds"])
    end = max((c["seconds"] for r in result["runs"] for c in r["curve"]), default=1.0)
    grid = np.linspace(0.0, end, 200)
    for case in cases:
        runs = [r for r in result["runs"] if r["case"] == case]
        times = sorted(r["seconds"] for r in runs if r["seconds"] is not None)
        share = [sum(t <= x for t in times) / len(runs) for x in grid]
        (line,) = reached.plot(grid, share, label=case)
        returns = []
        for r in runs:
            xs = [c["seconds"] for c in r["curve"]]
            ys = [c["return"] for c in r["curve"]]
            # before its first evaluation a run has no return to show; after its last, it keeps it
            returns.append([ys[max(i - 1, 0)] if (i := int(np.searchsorted(xs, x, "right"))) else np.nan for x in grid])
        with warnings.catch_warnings():  # no run has evaluated yet at the first points
            warnings.simplefilter("ignore", RuntimeWarning)
            middle = np.nanmedian(np.array(returns, dtype=float), axis=0)
        median.plot(grid, middle, color=line.get_color(), label=case)
    reached.set_xlabel("wall-clock seconds (evaluations excluded)")
    reached.set_ylabel(f"share of {len(result['seeds'])} seeds at the threshold")
    median.set_xlabel("wall-clock seconds (evaluations excluded)")
    median.set_ylabel("median deterministic evaluation return")
    reached.legend()
    fig.suptitle(f"time to reward, env delay {result['env_delay'] * 1000:.3g} ms a step; {_where(result)}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
