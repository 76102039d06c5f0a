"""Sample efficiency of collecting ahead: return against env-steps, synchronous and one version behind.

``python -m benchmarks.ahead_sample_efficiency --seeds 0,1,2,3,4`` trains PPO on
CartPole-v1 (8 envs, RL Zoo's hyperparameters from :mod:`benchmarks.learning`, constant
rates) for ``--steps`` env-steps per case and seed, evaluating deterministically every
``--eval-every`` steps (``--episodes`` on a seeded env of its own,
:func:`benchmarks.learning_runs.evaluate`). Steps, not seconds: the machine's load does
not move the figures. Cases (alternated within a seed, the order rotated with the seed):

- ``ppo-dummy``: SB3's ``PPO`` on ``DummyVecEnv``, the reference;
- ``daskppo``: ``DaskPPO``, ``collect_ahead=0``;
- ``daskppo-ahead``: ``DaskPPO``, ``collect_ahead=1``;
- ``daskppo-ahead-proximal`` (at commit 657e98f only, where ``DaskPPO`` took
  ``ahead_ratio="proximal"``: the ratio clipped around the learner's policy, decoupled
  PPO's, the advantages weighted by ``min(1, pi_learner / pi_behaviour)``; it learned
  more slowly than ``daskppo-ahead`` and was not kept, docs/rollouts.md);
- ``ppo-lagged``: a control written here without daskvec, SB3's ``PPO`` on
  ``DummyVecEnv`` whose rollout k is collected by a copy of the weights taken before the
  training on rollout k-1 (one version behind, as ``collect_ahead=1``), its values
  recomputed with the learner's value function before GAE (its truncations bootstrapped
  with the behaviour copy's values). If ``daskppo-ahead`` learns like this control, its
  slower start is the lag's, not a defect of daskvec's. (In a53e26e its evaluations,
  made during a collection, evaluated the behaviour copy, one update old; the control
  was measured again with the learner evaluated.)

Per update, each run records SB3's ``train/approx_kl``, ``train/clip_fraction`` and
``train/explained_variance``, and, before training on a rollout, the ratio of the
learner's policy to the recorded log-probabilities (mean, and the fraction outside the
clip range) and two checks of the recorded log-probabilities: their largest difference
from the log-probabilities of the weights at the rollout's start (the previous
``on_rollout_end``'s weights when collecting ahead) and whether the rollout starts from
the observations and episode starts where the previous one ended.
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

from benchmarks.ahead_parity import bootstrap_difference
from benchmarks.learning import ZOO_CARTPOLE
from benchmarks.learning_runs import alternated, evaluate, learning_client
from daskvec.bench.machine import machine_info

logger = logging.getLogger(__name__)

__all__ = ["CASES", "run_sample_efficiency", "steps_to"]

CASES = ("ppo-dummy", "daskppo", "daskppo-ahead", "ppo-lagged")
#: the cases a result file may hold (the last one measured at 657e98f)
KNOWN = (*CASES, "daskppo-ahead-proximal")
ENV_ID = "CartPole-v1"
N_ENVS = 8


def _lagged_ppo() -> type:
    """SB3's PPO collecting each rollout with the weights before the last training (the control)."""
    from stable_baselines3 import PPO

    class LaggedPPO(PPO):
        _behaviour: Any = None

        def collect_rollouts(self, env: Any, callback: Any, rollout_buffer: Any, n_rollout_steps: int) -> bool:
            if self._behaviour is None:
                self._behaviour = copy.deepcopy(self.policy)
            self.learner, self.policy = self.policy, self._behaviour
            try:
                ok = super().collect_rollouts(env, callback, rollout_buffer, n_rollout_steps)
            finally:
                self.policy = self.learner
            # the values and the last step's bootstrap of the learner's value function, then GAE again
            buf = rollout_buffer
            with th.no_grad():
                for t in range(buf.buffer_size):
                    buf.values[t] = self.policy.predict_values(th.as_tensor(buf.observations[t])).numpy().ravel()
                last = self.policy.predict_values(th.as_tensor(self._last_obs))
            buf.compute_returns_and_advantage(last_values=last, dones=self._last_episode_starts)
            # the next rollout is collected with the weights as they are before this training
            self._behaviour.load_state_dict(self.policy.state_dict())
            return ok

        def predict(self, *args: Any, **kwargs: Any) -> Any:
            # an evaluation during the collection evaluates the learner, not the behaviour copy
            return getattr(self, "learner", self.policy).predict(*args, **kwargs)

    return LaggedPPO


class _Probe:
    """Per-update statistics, read from a callback (see the module doc)."""

    def __init__(self, clip: float) -> None:
        self.clip = clip
        self.rows: list[dict[str, Any]] = []
        self.previous: dict[str, Any] | None = None
        self.last_obs: np.ndarray | None = None
        self.last_starts: np.ndarray | None = None

    def rollout_end(self, model: Any) -> None:
        buf = model.rollout_buffer
        obs = th.as_tensor(buf.observations.reshape(-1, *buf.obs_shape))
        acts = th.as_tensor(buf.actions.reshape(-1))
        recorded = th.as_tensor(buf.log_probs.reshape(-1))
        policy = getattr(model, "learner", model.policy)  # the control's learner, not its behaviour copy
        with th.no_grad():
            _, now, _ = policy.evaluate_actions(obs, acts)
            then = now
            if self.previous is not None:
                behaviour = copy.deepcopy(policy)
                behaviour.load_state_dict(self.previous)
                _, then, _ = behaviour.evaluate_actions(obs, acts)
        ratio = th.exp(now - recorded).numpy()
        row = {
            "steps": int(model.num_timesteps),
            "ratio_mean": float(ratio.mean()),
            "ratio_abs_dev": float(np.abs(ratio - 1).mean()),
            "ratio_outside_clip": float(np.mean(np.abs(ratio - 1) > self.clip)),
            "logp_vs_current_max": float((now - recorded).abs().max()),
            "logp_vs_previous_max": float((then - recorded).abs().max()),
        }
        if self.last_obs is not None and self.last_starts is not None:
            row["starts_where_ended"] = bool(
                np.array_equal(buf.observations[0], self.last_obs)
                and np.array_equal(buf.episode_starts[0], self.last_starts)
            )
        self.last_obs = np.array(model._last_obs, copy=True)
        self.last_starts = np.array(model._last_episode_starts, dtype=np.float32)
        self.previous = copy.deepcopy(policy.state_dict())
        self.rows.append(row)

    def trained(self, model: Any) -> None:
        if not self.rows:
            return
        values = model.logger.name_to_value
        for key in ("approx_kl", "clip_fraction", "explained_variance", "value_loss"):
            if f"train/{key}" in values:
                self.rows[-1][key] = float(values[f"train/{key}"])


def _run(
    case: str, seed: int, steps: int, eval_every: int, episodes: int, client: Any, changes: dict[str, Any]
) -> dict[str, Any]:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import DummyVecEnv

    from daskvec.sb3 import DaskPPO
    from daskvec.sb3.vec_env import DaskVecEnv

    dask = case.startswith("daskppo")
    env = make_vec_env(
        ENV_ID,
        n_envs=N_ENVS,
        seed=seed,
        vec_env_cls=DaskVecEnv if dask else DummyVecEnv,  # type: ignore[arg-type]
        vec_env_kwargs={"client": client} if dask else None,
    )
    hyper: dict[str, Any] = {**ZOO_CARTPOLE, **changes}
    cls: Any = {"ppo-dummy": PPO, "ppo-lagged": _lagged_ppo()}.get(case, DaskPPO)
    if dask:
        hyper["collect_ahead"] = int("-ahead" in case)
    curve: list[dict[str, float]] = []
    probe = _Probe(float(hyper["clip_range"]))

    class _Watch(BaseCallback):
        next = eval_every

        def _on_rollout_start(self) -> None:
            probe.trained(self.model)

        def _on_rollout_end(self) -> None:
            probe.rollout_end(self.model)

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next:
                self.next += eval_every
                curve.append(
                    {"steps": self.num_timesteps, "return": evaluate(self.model, ENV_ID, episodes, 10_000 + seed)}
                )
            return True

    try:
        model = cls("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyper)
        model.learn(steps, callback=_Watch())
    finally:
        env.close()
    logger.info("%s seed %d: %s", case, seed, [round(c["return"]) for c in curve])
    return {"case": case, "seed": seed, "curve": curve, "updates": probe.rows}


def steps_to(curve: list[dict[str, float]], threshold: float) -> int | None:
    """The steps of the first evaluation at or above ``threshold`` (``None`` if none is)."""
    return next((int(c["steps"]) for c in curve if c["return"] >= threshold), None)


#: the evaluations up to these steps make the early return (the first three at 2,048 a time)
EARLY = 6144


def eval_every(rows: list[dict[str, Any]]) -> int:
    """The steps between a run's evaluations."""
    return int(rows[0]["curve"][0]["steps"])


def _median_steps(reach: list[int | None]) -> float | None:
    """The median steps to the threshold, a run that never reached it later than any; ``None`` if that median is."""
    median = float(np.median([np.inf if s is None else s for s in reach]))
    return None if np.isinf(median) else median


def summarize(runs: list[dict[str, Any]], cases: list[str], threshold: float = 475.0) -> dict[str, Any]:
    """Per case: mean and median return at each evaluation, and steps to ``threshold`` per seed."""
    out: dict[str, Any] = {}
    for case in cases:
        rows = [r for r in runs if r["case"] == case]
        grid = np.array([[c["return"] for c in r["curve"]] for r in rows])
        reach = [steps_to(r["curve"], threshold) for r in rows]
        ups = [u for r in rows for u in r["updates"][1:]]  # the first rollout has no lag in any case

        def _mean(key: str, ups: list[dict[str, Any]] = ups) -> float:
            return float(np.mean([u[key] for u in ups if key in u]))

        area = grid.mean(axis=1)  # each seed's mean over its evaluations: the area under its curve
        out[case] = {
            "seeds": [r["seed"] for r in rows],
            "steps": [c["steps"] for c in rows[0]["curve"]],
            "per_seed_mean_return": area.round(1).tolist(),
            "mean": grid.mean(axis=0).round(1).tolist(),
            "median": np.median(grid, axis=0).round(1).tolist(),
            "steps_to_threshold": reach,
            # a run that never reached it counts as later than any that did
            "median_steps_to_threshold": _median_steps(reach),
            "per_seed_early_return": grid[:, : EARLY // eval_every(rows)].mean(axis=1).round(1).tolist(),
            "update_means": {
                k: round(_mean(k), 4)
                for k in ("approx_kl", "clip_fraction", "explained_variance", "ratio_abs_dev", "ratio_outside_clip")
            },
            "logp_vs_current_max": max(u["logp_vs_current_max"] for r in rows for u in r["updates"]),
            "logp_vs_previous_max": max(u["logp_vs_previous_max"] for r in rows for u in r["updates"]),
            "all_start_where_ended": all(u.get("starts_where_ended", True) for r in rows for u in r["updates"]),
        }
    reference = out.get("daskppo")
    for case, row in out.items():
        if reference is not None and case != "daskppo":
            low, high = bootstrap_difference(reference["per_seed_mean_return"], row["per_seed_mean_return"])
            row["mean_return_minus_daskppo_95"] = [round(low, 1), round(high, 1)]
            low, high = bootstrap_difference(reference["per_seed_early_return"], row["per_seed_early_return"])
            row["early_return_minus_daskppo_95"] = [round(low, 1), round(high, 1)]
    return out


def format_report(summary: dict[str, Any], at: tuple[int, ...] = (4096, 8192, 12288, 16384, 20480)) -> str:
    """Markdown tables: mean (median) return at fixed steps, steps to 475, and the update statistics."""
    head = " | ".join(f"{n:,}" for n in at)
    lines = [f"| case | seeds | {head} | mean over evals (95% CI of diff.) | up to {EARLY:,} (95% CI of diff.) |"]
    lines.append("|" + "---|" * (len(at) + 4))
    for case, row in summary.items():
        cells = []
        for n in at:
            k = row["steps"].index(n) if n in row["steps"] else None
            cells.append("-" if k is None else f"{row['mean'][k]:.0f} ({row['median'][k]:.0f})")
        figures = []
        for key in ("mean", "early"):
            ci = row.get(f"{key}_return_minus_daskppo_95")
            figures.append(f"{np.mean(row[f'per_seed_{key}_return']):.0f}" + (f" ({ci[0]}, {ci[1]})" if ci else ""))
        lines.append(f"| {case} | {len(row['seeds'])} | " + " | ".join(cells + figures) + " |")
    lines += [
        "",
        "| case | steps to 475, per seed | median | approx_kl | clip_fraction | ratio outside clip at start |",
    ]
    lines.append("|---|---|---|---|---|---|")
    for case, row in summary.items():
        reach = ", ".join("never" if s is None else f"{s:,}" for s in row["steps_to_threshold"])
        med = row["median_steps_to_threshold"]
        u = row["update_means"]
        lines.append(
            f"| {case} | {reach} | {'never' if med is None else f'{med:,.0f}'} | {u['approx_kl']:.4f} | "
            f"{u['clip_fraction']:.3f} | {u['ratio_outside_clip']:.3f} |"
        )
    return "\n".join(lines)


def run_sample_efficiency(
    cases: list[str],
    seeds: list[int],
    steps: int = 24_576,
    eval_every: int = 2048,
    episodes: int = 10,
    out_path: Path | None = None,
    changes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train every case on every seed on one embedded cluster; curves, steps to 475 and update statistics.

    ``changes`` replaces some of RL Zoo's hyperparameters (all cases alike).
    """
    changes = dict(changes or {})
    runs: list[dict[str, Any]] = []
    with learning_client() as (client, _):
        for seed, case in alternated(cases, seeds):
            runs.append(_run(case, seed, steps, eval_every, episodes, client, changes))
            if out_path is not None:  # every run kept as it ends: a stopped run leaves its seeds
                out_path.parent.mkdir(parents=True, exist_ok=True)
                out_path.write_text(json.dumps({"partial": True, "runs": runs}, indent=1))
    result = {
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "settings": {"env": ENV_ID, "n_envs": N_ENVS, "steps": steps, "eval_every": eval_every, "episodes": episodes},
        "hyperparameters": {**ZOO_CARTPOLE, **changes},
        "seeds": seeds,
        "summary": summarize(runs, cases),
        "runs": runs,
    }
    if out_path is not None:
        out_path.parent.mkdir(parents=True, exist_ok=True)
        out_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--steps", type=int, default=24_576)
    parser.add_argument("--eval-every", type=int, default=2048)
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--out", default="bench-results/ahead-sample-efficiency.json")
    parser.add_argument("--set", nargs="*", default=[], help="hyperparameter changes, e.g. n_epochs=5")
    parser.add_argument("--report", nargs="*", help="summarise these result files' runs together (no training)")
    args = parser.parse_args(argv)
    if args.report:
        runs = [r for path in args.report for r in json.loads(Path(path).read_text())["runs"]]
        cases = [c for c in KNOWN if any(r["case"] == c for r in runs)]
        print(format_report(summarize(runs, cases)))
        return 0
    th.set_num_threads(1)  # as the workers' policy; on 2 shared cores more threads only contend
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    cases = args.cases.split(",")
    changes = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
    seeds = [int(s) for s in args.seeds.split(",")]
    res = run_sample_efficiency(cases, seeds, args.steps, args.eval_every, args.episodes, Path(args.out), changes)
    for case, s in res["summary"].items():
        logger.info("%s: mean %s; steps to 475 %s; %s", case, s["mean"], s["steps_to_threshold"], s["update_means"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
