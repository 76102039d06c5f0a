"""The ``daskvec`` command.

``daskvec train ENV_ID``
    Train a Stable-Baselines3 agent on ``ENV_ID`` with its envs in a
    :class:`~daskvec.DaskVecEnv`: on the cluster at ``--scheduler``, or on an embedded
    ``LocalCluster`` when no scheduler is given. Shows a progress bar on a terminal,
    and otherwise (output to a file or a pipe) a progress line every
    ``--progress-interval`` seconds; prints the dashboard link (and the daskvec page's;
    only pages the scheduler serves, or why not), the env-steps/s of the whole run and
    of stepping the envs alone, and the evaluated mean reward, and saves the model with
    ``--save``. Options not given come from Dask's config (``daskvec.*``).

``daskvec bench ...``
    Benchmarks (see :mod:`daskvec.bench`).

``daskvec zoo [daskvec options] ZOO_ARGS...``
    rl_zoo3's ``train`` with its envs in DaskVecEnvs (see :mod:`daskvec.learners.zoo`): every
    argument that is not one of daskvec's goes to the zoo.

Examples
--------
.. code-block:: console

    $ daskvec train CartPole-v1 --algo ppo --n-envs 8 --timesteps 25000 --save ppo_cartpole
    $ daskvec train CartPole-v1 --scheduler tcp://10.0.0.1:8786 --envs-per-actor 4
    $ daskvec zoo --n-workers 2 --algo ppo --env CartPole-v1 -n 20000
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import logging
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["build_parser", "main", "train"]

logger = logging.getLogger(__name__)

#: Algorithms ``daskvec train`` offers, by command-line name.
ALGOS = ("ppo", "a2c", "dqn", "sac")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, not {text}")
    return value


def _hyperparam(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word such as a policy or schedule name
    return key, value


def _add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true", help="show daskvec's INFO logs")


def _add_train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("env_id", metavar="ENV_ID", help="a Gymnasium env id, e.g. CartPole-v1")
    parser.add_argument("--algo", choices=ALGOS, default="ppo", help="the SB3 algorithm (default: ppo)")
    parser.add_argument("--n-envs", type=_positive_int, default=8, help="number of parallel envs (default: 8)")
    parser.add_argument(
        "--timesteps", type=_positive_int, default=25_000, help="env steps to train for, over all envs (default: 25000)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the envs and the agent (default: 0)")
    parser.add_argument(
        "--envs-per-actor", type=_positive_int, default=None, help="envs per Dask actor (default: one actor per worker)"
    )
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Dask scheduler address, e.g. tcp://10.0.0.1:8786 (default: an embedded LocalCluster)",
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "direct", "actor", "direct-insecure"),
        default=None,
        help="how steps reach the actors (default: Dask config daskvec.transport, auto)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds any single wait for the cluster may take (default: Dask config daskvec.timeout, 300)",
    )
    parser.add_argument("--save", metavar="PATH", default=None, help="save the trained model there (SB3 .zip)")
    parser.add_argument(
        "--eval-episodes",
        type=int,
        default=10,
        help="episodes of deterministic evaluation at the end; 0 skips it (default: 10)",
    )
    parser.add_argument(
        "--hyperparams",
        metavar="KEY=VALUE",
        nargs="+",
        type=_hyperparam,
        default=[],
        help="extra arguments of the algorithm, e.g. n_steps=256 learning_rate=1e-3",
    )
    parser.add_argument("--device", default="cpu", help="torch device for the agent (default: cpu)")
    parser.add_argument(
        "--collect-ahead",
        type=int,
        choices=(0, 1),
        default=None,
        help="collect on the workers with daskvec's learner (DaskPPO, DaskA2C, DaskDQN, DaskSAC): 0 collects "
        "each rollout after training on the one before, 1 collects the next while the learner trains "
        "(default: SB3's own algorithm, stepping the vec env)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="show neither the progress bar nor the progress lines"
    )
    parser.add_argument(
        "--progress-interval",
        metavar="SECONDS",
        type=_positive_float,
        default=10.0,
        help="when the output is not a terminal (a file, a pipe), print a progress line this often "
        "instead of the progress bar (default: 10)",
    )
    parser.add_argument(
        "--tensorboard-log",
        metavar="DIR",
        default=None,
        help="write SB3's TensorBoard logs there, daskvec's figures included (needs tensorboard)",
    )
    _add_common(parser)


def _add_zoo_arguments(parser: argparse.ArgumentParser) -> None:
    """daskvec's own options of ``daskvec zoo``; the zoo's are forwarded, so none may share a name with them."""
    parser.add_argument(
        "--scheduler",
        metavar="ADDRESS",
        default=None,
        help="Dask scheduler address (default: an embedded LocalCluster for the whole run)",
    )
    parser.add_argument(
        "--n-workers", type=_positive_int, default=None, help="workers of the embedded cluster (default: one per core)"
    )
    parser.add_argument(
        "--envs-per-actor", type=_positive_int, default=None, help="envs per Dask actor (default: one actor per worker)"
    )
    parser.add_argument(
        "--transport",
        choices=("auto", "direct", "actor"),
        default="auto",
        help="how steps reach the actors (default: auto)",
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds any single wait for the cluster may take (default: 300)"
    )
    parser.add_argument(
        "--on-env-error",
        choices=("raise", "restart"),
        default="raise",
        help="re-raise an env's exception, or rebuild the env (default: raise)",
    )
    parser.add_argument(
        "--no-daskvec-metrics", action="store_true", help="do not add daskvec's figures to the zoo's logs"
    )


def build_parser(with_bench: bool = False) -> argparse.ArgumentParser:
    """The ``daskvec`` argument parser.

    Parameters
    ----------
    with_bench : bool
        Add the options of ``daskvec bench`` (this imports :mod:`daskvec.bench`).

    Returns
    -------
    argparse.ArgumentParser
    """
    parser = argparse.ArgumentParser(
        prog="daskvec", description="Stable-Baselines3 vectorized environments on Dask clusters."
    )
    from daskvec import __version__

    parser.add_argument("--version", action="version", version=f"daskvec {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    train_p = sub.add_parser(
        "train",
        help="train an SB3 agent with its envs on a Dask cluster",
        description="Train an SB3 agent with its envs in a DaskVecEnv.",
    )
    _add_train_arguments(train_p)
    zoo_p = sub.add_parser(
        "zoo",
        help="train an RL Zoo (rl_zoo3) configuration with its envs on a Dask cluster",
        description="rl_zoo3's train with its envs in DaskVecEnvs. Every argument that is not "
        "listed here goes to the zoo (see `python -m rl_zoo3.train --help`), e.g. "
        "`daskvec zoo --n-workers 2 --algo ppo --env CartPole-v1 -n 20000`.",
        allow_abbrev=False,
    )
    _add_zoo_arguments(zoo_p)
    bench_p = sub.add_parser(
        "bench",
        help="benchmark DaskVecEnv against SB3's vec envs",
        description="Benchmark DaskVecEnv against SB3's vec envs.",
    )
    if with_bench:
        from daskvec import bench

        bench.add_arguments(bench_p)
        if not any("-v" in a.option_strings for a in bench_p._actions):
            _add_common(bench_p)
    return parser


def _configure_logging(verbose: bool) -> None:
    """Log daskvec's own messages to stderr: warnings by default, INFO with ``--verbose``."""
    log = logging.getLogger("daskvec")
    log.setLevel(logging.INFO if verbose else logging.WARNING)
    if not any(getattr(h, "_daskvec_cli", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
        handler._daskvec_cli = True  # type: ignore[attr-defined]
        log.addHandler(handler)
    log.propagate = False


def _policy_for(observation_space: Any) -> str:
    import gymnasium as gym

    return "MultiInputPolicy" if isinstance(observation_space, gym.spaces.Dict) else "MlpPolicy"


def _algo_class(name: str, on_workers: bool = False) -> Any:
    """SB3's algorithm ``name``, or daskvec's learner of it that collects on the workers."""
    if on_workers:
        from daskvec import sb3 as learners

        return {"ppo": learners.DaskPPO, "a2c": learners.DaskA2C, "dqn": learners.DaskDQN, "sac": learners.DaskSAC}[
            name
        ]
    import stable_baselines3 as sb3

    return {"ppo": sb3.PPO, "a2c": sb3.A2C, "dqn": sb3.DQN, "sac": sb3.SAC}[name]


def _has_progress_bar_deps() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        return False
    return True


def _has_tensorboard() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class _Stepping:
    """A vec env's steps and the seconds it spent stepping its envs (its timer's transit and env time)."""

    env_steps: int
    seconds: float

    @classmethod
    def of(cls, env: Any) -> _Stepping:
        timer = env.timer
        return cls(int(timer.vec_steps) * int(env.num_envs), float(timer.transit_s + timer.env_s))

    def since(self, before: _Stepping) -> _Stepping:
        return _Stepping(self.env_steps - before.env_steps, self.seconds - before.seconds)

    @property
    def rate(self) -> float:
        """Env-steps per second while stepping: the rate of collection alone, without the learner's work."""
        return self.env_steps / self.seconds if self.seconds > 0 else 0.0


class _ProgressLines:
    """Prints a progress line every ``interval`` seconds: an SB3 callback in function form.

    A progress bar needs a terminal; with the output going to a file or a pipe these
    lines say how far training is: env steps done, the rate of the whole run (the
    learner's work included), the rate of stepping the envs alone, and the time left
    at the run's rate so far.
    """

    def __init__(self, env: Any, total: int, interval: float, clock: Any = time.perf_counter) -> None:
        self.env, self.total, self.interval, self.clock = env, total, interval, clock
        self.start = clock()
        self.before = _Stepping.of(env)
        self._next = self.start + interval

    def __call__(self, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        now = self.clock()
        if now >= self._next:
            self._next = now + self.interval
            print(self.line(int(locals_["self"].num_timesteps), now), flush=True)
        return True

    def line(self, done: int, now: float) -> str:
        """``progress: done/total env steps (pct%), rate overall, rate stepping the envs, ETA``."""
        elapsed = max(now - self.start, 1e-9)
        overall = done / elapsed
        stepping = _Stepping.of(self.env).since(self.before)
        eta = f"{(self.total - done) / overall:.0f} s" if overall > 0 and done < self.total else "0 s"
        return (
            f"progress: {done}/{self.total} env steps ({100 * done / max(self.total, 1):.0f}%), "
            f"{overall:.0f} env-steps/s overall, {stepping.rate:.0f} env-steps/s stepping the envs, ETA {eta}"
        )


class _ProgressBar:
    """The progress bar on a terminal: env steps done against those the run will take, until the run ends.

    SB3's own bar counts against the ``total_timesteps`` asked, which an on-policy
    algorithm overshoots (it collects whole rollouts: 32,768 steps for 25,000 asked with
    8 envs), and it stops, its clock frozen at 100%, when the last rollout is collected,
    before the last policy update. This one counts against :func:`_steps_to_train`, says
    when the policy is being updated, keeps its clock running through that update, and
    ends when the ``with`` block around ``learn()`` does.
    """

    def __init__(self, total: int, rollout: int | None) -> None:
        from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeRemainingColumn
        from rich.text import Text

        class _Elapsed(ProgressColumn):
            # rich's TimeElapsedColumn stops at the task's first 100%: this clock stops when the run does
            def render(self, task: Task) -> Text:
                return Text(time.strftime("%H:%M:%S", time.gmtime(task.elapsed or 0.0)), style="progress.elapsed")

        self.total, self.rollout = total, rollout
        self.progress = Progress(
            TextColumn("{task.description:<19}"),
            BarColumn(),
            TextColumn("{task.completed:,.0f}/{task.total:,.0f} env steps"),
            _Elapsed(),
            TextColumn("<"),
            TimeRemainingColumn(),
        )
        self.task = self.progress.add_task("collecting", total=total, start=False)

    def __enter__(self) -> _ProgressBar:
        self.progress.start()
        self.progress.start_task(self.task)
        return self

    def __exit__(self, *exc: object) -> None:
        failed = exc[0] is not None
        self.progress.update(self.task, description="stopped" if failed else "done")
        self.progress.stop_task(self.task)
        self.progress.stop()

    def on_step(self, locals_: dict[str, Any], globals_: dict[str, Any]) -> bool:
        """SB3 callback in function form: the steps done, and whether a policy update comes next."""
        done = int(locals_["self"].num_timesteps)
        updating = self.rollout is not None and done % self.rollout == 0
        self.progress.update(self.task, completed=done, description="updating the policy" if updating else "collecting")
        return True


def _summary(algo: str, steps: int, elapsed: float, stepping: _Stepping) -> str:
    """The line after training: the whole run's rate, and that of stepping the envs alone."""
    share = 100 * stepping.seconds / elapsed if elapsed > 0 else 0.0
    return (
        f"trained {algo.upper()} for {steps} env steps in {elapsed:.1f} s: {steps / max(elapsed, 1e-9):.0f} "
        f"env-steps/s overall; stepping the envs: {stepping.rate:.0f} env-steps/s ({share:.0f}% of the run)"
    )


def _model_and_callbacks(args: argparse.Namespace, env: Any) -> tuple[Any, list[Any], _ProgressBar | None]:
    """The model ``daskvec train`` trains on ``env``, its callbacks, and its progress bar if it shows one.

    The progress bar (:class:`_ProgressBar`) needs a terminal (and rich); with the output
    going to a file or a pipe, progress lines are printed instead (:class:`_ProgressLines`).
    :class:`~daskvec.monitoring.sb3_logger.DaskVecEnvMetrics` records the vec env's figures in SB3's logger.
    """
    from stable_baselines3.common.callbacks import ConvertCallback

    from daskvec.monitoring.sb3_logger import DaskVecEnvMetrics

    ahead = {} if args.collect_ahead is None else {"collect_ahead": args.collect_ahead}
    model = _algo_class(args.algo, on_workers=bool(ahead))(
        _policy_for(env.observation_space),
        env,
        device=args.device,
        seed=args.seed,
        verbose=0,
        tensorboard_log=args.tensorboard_log,
        **ahead,
        **dict(args.hyperparams),
    )
    terminal = sys.stdout.isatty()
    bar = None
    callbacks: list[Any] = [DaskVecEnvMetrics()]
    if not args.no_progress and terminal and _has_progress_bar_deps():
        bar = _ProgressBar(_steps_to_train(model, args.timesteps), _rollout_steps(model))
        callbacks.append(ConvertCallback(bar.on_step))
    if not args.no_progress and not terminal:
        callbacks.append(
            ConvertCallback(_ProgressLines(env, _steps_to_train(model, args.timesteps), args.progress_interval))
        )
    return model, callbacks, bar


def _rollout_steps(model: Any) -> int | None:
    """The env steps of one rollout of an on-policy algorithm (a policy update follows each), else ``None``."""
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    return int(model.n_steps * model.n_envs) if isinstance(model, OnPolicyAlgorithm) else None


def _steps_to_train(model: Any, timesteps: int) -> int:
    """The env steps ``model.learn(timesteps)`` takes: an on-policy algorithm collects whole rollouts."""
    from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm

    if isinstance(model, OnPolicyAlgorithm):
        rollout = model.n_steps * model.n_envs
        return -(-timesteps // rollout) * rollout
    return timesteps


def _report_training(args: argparse.Namespace, model: Any, elapsed: float, stepping: _Stepping) -> None:
    """After training: the rates (:func:`_summary`), where the TensorBoard logs are, the model saved."""
    print(_summary(args.algo, int(model.num_timesteps), elapsed, stepping), flush=True)
    if args.tensorboard_log:
        print(f"TensorBoard logs (daskvec/* figures included) in {args.tensorboard_log}", flush=True)
    if args.save:
        model.save(args.save)
        saved = args.save if str(args.save).endswith(".zip") else f"{args.save}.zip"
        print(f"saved model to {saved}", flush=True)


def _evaluate(args: argparse.Namespace, model: Any) -> None:
    """Print the trained model's mean reward over ``args.eval_episodes`` episodes of a local env."""
    import gymnasium as gym
    import numpy as np
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor

    eval_env = Monitor(gym.make(args.env_id))
    eval_env.reset(seed=args.seed + 10_000)
    try:
        rewards, _ = evaluate_policy(
            model, eval_env, n_eval_episodes=args.eval_episodes, deterministic=True, return_episode_rewards=True
        )
    finally:
        eval_env.close()
    mean, std = float(np.mean(rewards)), float(np.std(rewards))
    print(f"evaluated mean reward: {mean:.2f} +/- {std:.2f} over {args.eval_episodes} episodes", flush=True)


def train(args: argparse.Namespace) -> int:
    """Run ``daskvec train`` with parsed ``args``; returns the exit code.

    Parameters
    ----------
    args : argparse.Namespace
        As produced by :func:`build_parser` for the ``train`` command.

    Returns
    -------
    int
        0 on success, 1 when the env, the cluster or the model could not be set up.
    """
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_vec_env

    from daskvec.sb3.vec_env import DaskVecEnv

    if args.tensorboard_log and not _has_tensorboard():
        print("daskvec train: --tensorboard-log needs tensorboard: pip install tensorboard", file=sys.stderr)
        return 1
    vec_kwargs: dict[str, Any] = {
        "client": args.scheduler,
        "envs_per_actor": args.envs_per_actor,
        "transport": args.transport,
        "timeout": args.timeout,
    }
    try:
        env = make_vec_env(
            args.env_id,
            n_envs=args.n_envs,
            seed=args.seed,
            vec_env_cls=DaskVecEnv,  # type: ignore[arg-type]  # SB3 annotates its own two only
            vec_env_kwargs=vec_kwargs,
        )
    except (ValueError, TypeError, OSError, gym.error.Error) as e:
        print(f"daskvec train: cannot create the envs: {e}", file=sys.stderr)
        return 1
    try:
        assert isinstance(env, DaskVecEnv)
        print(
            f"daskvec: {args.n_envs} x {args.env_id} in {len(env.groups)} actors on "
            f"{len({g['worker'] for g in env.groups})} workers ({env.transport_summary()})",
            flush=True,
        )
        for line in env.dashboard.lines():  # only links to pages the scheduler serves
            print(line, flush=True)
        try:
            model, callbacks, bar = _model_and_callbacks(args, env)
        except (TypeError, ValueError, AssertionError) as e:  # SB3 checks spaces with assert
            given = " ".join(f"{k}={v!r}" for k, v in args.hyperparams) or "none"
            print(
                f"daskvec train: cannot create {args.algo.upper()} for {args.env_id} (--hyperparams: {given}): "
                f"{type(e).__name__}: {e}",
                file=sys.stderr,
            )
            return 1
        before = _Stepping.of(env)
        start = time.perf_counter()
        with bar if bar is not None else contextlib.nullcontext():
            model.learn(total_timesteps=args.timesteps, callback=callbacks)
        _report_training(args, model, time.perf_counter() - start, _Stepping.of(env).since(before))
    finally:
        env.close()
    if args.eval_episodes > 0:
        _evaluate(args, model)
    return 0


def zoo(args: argparse.Namespace, zoo_args: Sequence[str]) -> int:
    """Run ``daskvec zoo``: rl_zoo3's ``train`` with ``zoo_args``, its envs in DaskVecEnvs.

    Parameters
    ----------
    args : argparse.Namespace
        daskvec's options of the ``zoo`` command, as parsed by :func:`build_parser`.
    zoo_args : sequence of str
        Everything else, for the zoo.

    Returns
    -------
    int
        0 on success, 1 when rl_zoo3 is missing, the options do not fit together, or the zoo
        or the cluster refused them.
    """
    try:
        import rl_zoo3  # noqa: F401  # daskvec.learners.zoo imports it only when the zoo runs

        from daskvec.learners.zoo import train_zoo
    except ImportError as e:
        print(f'daskvec zoo needs rl_zoo3 ({e}): pip install "daskvec[zoo]"', file=sys.stderr)
        return 1
    if args.n_workers is not None and args.scheduler is not None:
        print(
            "daskvec zoo: --n-workers sizes the embedded cluster; with --scheduler the cluster's workers are used",
            file=sys.stderr,
        )
        return 1
    forwarded = list(zoo_args[1:] if zoo_args[:1] == ["--"] else zoo_args)
    try:
        run = train_zoo(
            forwarded,
            args.scheduler,
            n_workers=args.n_workers,
            record_metrics=not args.no_daskvec_metrics,
            envs_per_actor=args.envs_per_actor,
            transport=args.transport,
            timeout=args.timeout,
            on_env_error=args.on_env_error,
        )
    except ValueError as e:  # the zoo's own checks (env id, hyperparameters) and unreachable schedulers
        print(f"daskvec zoo: {e}", file=sys.stderr)
        return 1
    for path in run.save_paths:
        print(f"daskvec zoo: experiment saved in {path}", flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``daskvec`` command.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    command = next((a for a in argv if not a.startswith("-")), None)
    try:
        parser = build_parser(with_bench=command == "bench")
    except ImportError as e:
        print(f"daskvec bench is not available: {e}", file=sys.stderr)
        return 1
    if command == "zoo":  # the zoo's own arguments pass through
        args, zoo_args = parser.parse_known_args(argv)
    else:
        args, zoo_args = parser.parse_args(argv), []
    _configure_logging(bool(getattr(args, "verbose", False)))
    if args.command == "zoo":
        return zoo(args, zoo_args)
    if args.command == "train":
        with contextlib.suppress(KeyboardInterrupt):
            return train(args)
        print("interrupted", file=sys.stderr)
        return 130
    from daskvec import bench

    return int(bench.run(args))


if __name__ == "__main__":
    sys.exit(main())
