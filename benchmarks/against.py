"""``python -m benchmarks.against --base COMMIT``: this checkout's DaskVecEnv against a commit's, in one process.

A change's effect on a machine whose speed swings by a third from one minute to the
next cannot be read from two runs of ``daskvec bench``. Here both versions run side by
side: the package as it was at ``--base`` is taken from git (``git archive``) into a
temporary directory under another name (``daskvec_<commit>``, its imports rewritten
to match), and each round times a window of stepping with each version, in
alternating order, the same envs and the same actions. Each version has its own
embedded cluster; the workers of the one not being timed wait in ``poll``. Reported as
env-steps/s per round and the ratio this checkout / base, with the median.

The scenarios are ``daskvec bench``'s stepping cases (``light``: CartPole-v1;
``heavy``: a busy-loop env of 1 ms of CPU a step), built by this checkout's
``daskvec.bench.scenarios``, so both versions step the same envs, as are ``atari`` (Pong,
SB3's ``AtariWrapper``, ``VecFrameStack(4)``) and ``mujoco`` (HalfCheetah-v5); and the EnvPool
groups (``envpool-mujoco``: HalfCheetah-v5, ``envpool-atari``: Pong-v5),
one ``from_vector_envs`` group of ``--envs`` envs with a thread per core, as ``daskvec
bench``'s ``dask-envpool``, with EnvPool alone (the same threads, its Gymnasium API)
timed in the same rounds: ``of_alone`` is each version's rate over EnvPool's. The earlier copy
adds no dashboard page (two copies would register the same Prometheus series); the
page is not on the step path.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import logging
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._timing import rate, write_json

logger = logging.getLogger(__name__)

#: ``from daskvec...`` and ``import daskvec...`` statements, to be pointed at the copy.
_IMPORT = re.compile(r"\b(from|import) daskvec\b")


def materialize(commit: str, into: Path, repo: Path | None = None) -> str:
    """Write the ``daskvec`` package as it was at ``commit`` into ``into`` as ``daskvec_<commit>``; its name.

    Raises
    ------
    RuntimeError
        ``commit`` is not a commit of the repository (or git is missing), with git's message.
    """
    repo = repo or Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "--short", f"{commit}^{{commit}}"],
            check=True,
            capture_output=True,
            text=True,
            timeout=60,
        ).stdout.strip()
        archive = subprocess.run(
            ["git", "-C", str(repo), "archive", "--format=tar", sha, "daskvec"],
            check=True,
            capture_output=True,
            timeout=120,
        ).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", b"") or b""
        detail = detail.decode(errors="replace") if isinstance(detail, bytes) else detail
        raise RuntimeError(f"cannot take daskvec at {commit!r} from {repo}: {detail.strip() or e}") from e
    name = f"daskvec_{sha}"
    tar_path = into / "base.tar"
    tar_path.write_bytes(archive)
    with tarfile.open(tar_path) as tar:
        tar.extractall(into, filter="data")
    (into / "daskvec").rename(into / name)
    root = into / name
    # modules named in strings (a Dask preload, say): those of two dots or more, which no
    # config key ("daskvec.timeout") can be mistaken for
    modules = {
        ".".join(("daskvec", *p.relative_to(root).with_suffix("").parts))
        for p in root.rglob("*.py")
        if len(p.relative_to(root).parts) > 1 and p.stem != "__init__"
    }
    named = re.compile(r"([\"'])(" + "|".join(re.escape(m) for m in sorted(modules)) + r")\1") if modules else None
    for path in root.rglob("*.py"):
        text = _IMPORT.sub(lambda m: f"{m.group(1)} {name}", path.read_text(encoding="utf-8"))
        if named is not None:
            text = named.sub(lambda m: f"{m.group(1)}{name}{m.group(2)[len('daskvec') :]}{m.group(1)}", text)
        path.write_text(text, encoding="utf-8")
    return name


def load_base(name: str, where: Path) -> Any:
    """Import the copy ``name`` from ``where`` (its worker processes find it too); its ``DaskVecEnv``."""
    sys.path.insert(0, str(where))  # spawned worker processes start with this process's sys.path
    try:  # the package laid out by role: its callers import the function when they call it
        cluster: Any = importlib.import_module(f"{name}.cluster.clients")
    except ModuleNotFoundError:  # an older copy: one module
        cluster = importlib.import_module(f"{name}.cluster")
    cluster.install_dashboard_page = lambda: False  # see the module's docstring
    return importlib.import_module(name).DaskVecEnv


#: The EnvPool scenarios: their EnvPool task.
ENVPOOL_TASKS = {"envpool-mujoco": "HalfCheetah-v5", "envpool-atari": "Pong-v5"}


def _vec_envs(base_cls: Any, scenario: str, n_envs: int) -> dict[str, Any]:
    """The vec envs one round times: ``base``'s and this checkout's (and EnvPool alone)."""
    import functools
    import os

    from daskvec import DaskVecEnv
    from daskvec.bench.envs import make_envpool
    from daskvec.bench.scenarios import BenchOptions, _cases

    task = ENVPOOL_TASKS.get(scenario)
    frame_stack = 0
    if task is None:
        (case,) = _cases(scenario, [n_envs], BenchOptions().heavy_step_s)
        fns, frame_stack = [case.make] * n_envs, case.frame_stack
        makers: dict[str, Callable[[], Any]] = {"base": lambda: base_cls(fns), "head": lambda: DaskVecEnv(fns)}
    else:
        threads = len(os.sched_getaffinity(0))
        fn = functools.partial(make_envpool, task, n_envs, 0, threads)
        makers = {
            "base": lambda: base_cls.from_vector_envs([fn]),
            "head": lambda: DaskVecEnv.from_vector_envs([fn]),
            "alone": fn,
        }
    venvs: dict[str, Any] = {}
    try:  # one at a time: if one fails to build, those built before it are closed
        for which, make in makers.items():
            venvs[which] = make()
    except BaseException:
        for venv in venvs.values():
            with contextlib.suppress(Exception):  # the build's error is the one to see
                venv.close()
        raise
    if frame_stack:  # atari: VecFrameStack on the vec env, as daskvec bench has it
        from stable_baselines3.common.vec_env import VecFrameStack

        venvs = {k: VecFrameStack(v, frame_stack) for k, v in venvs.items()}
    return venvs


def run(base: str, scenario: str, n_envs: int, rounds: int, seconds: float) -> dict[str, Any]:
    """Alternate this checkout's DaskVecEnv and ``base``'s for ``rounds`` rounds; the rates and ratios."""
    with tempfile.TemporaryDirectory(prefix="daskvec-base-") as tmp:
        name = materialize(base, Path(tmp))
        base_cls = load_base(name, Path(tmp))
        venvs = _vec_envs(base_cls, scenario, n_envs)
        try:
            actions = np.stack([venvs["head"].action_space.sample() for _ in range(256 * n_envs)])
            actions = actions.reshape(256, n_envs, *actions.shape[1:])
            for venv in venvs.values():
                if "alone" not in venvs:  # EnvPool groups take their seed when they are made
                    venv.seed(0)
                venv.reset()
            rows = []
            for r in range(rounds):
                got = {}
                order = list(venvs) if r % 2 == 0 else list(venvs)[::-1]
                for which in order:
                    got[which] = rate(venvs[which], actions, seconds, warmup=20)
                row: dict[str, Any] = {"round": r, **got, "ratio": got["head"] / got["base"]}
                if "alone" in got:
                    row["of_alone"] = {k: got[k] / got["alone"] for k in ("base", "head")}
                rows.append(row)
                logger.info(
                    "%s-%d round %d: %s env-steps/s, ratio %.3f",
                    scenario,
                    n_envs,
                    r,
                    ", ".join(f"{k} {v:.0f}" for k, v in got.items()),
                    row["ratio"],
                )
        finally:
            for venv in venvs.values():
                venv.close()
    result = {
        "base": base,
        "base_copy": name,
        "scenario": scenario,
        "n_envs": n_envs,
        "seconds": seconds,
        "rounds": rows,
        "median_ratio": statistics.median(row["ratio"] for row in rows),
    }
    if "alone" in venvs:
        result["median_of_alone"] = {k: statistics.median(row["of_alone"][k] for row in rows) for k in ("base", "head")}
    return result


def main(argv: list[str] | None = None) -> int:
    """Command line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the commit to compare with (any git revision)")
    scenarios = ("light", "heavy", "atari", "mujoco", *ENVPOOL_TASKS)
    parser.add_argument("--scenario", choices=scenarios, nargs="+", default=["light", "heavy"])
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=1.5)
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    args = parser.parse_args(argv)
    handler = logging.StreamHandler()  # this module's lines only: the embedded clusters' stay at warnings
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    results = [run(args.base, s, args.envs, args.rounds, args.seconds) for s in args.scenario]
    for result in results:
        logger.info("%s-%d: median ratio head/base %.3f", result["scenario"], result["n_envs"], result["median_ratio"])
        if "median_of_alone" in result:
            logger.info("  of EnvPool alone, medians: base %.3f, head %.3f", *result["median_of_alone"].values())
    write_json(results, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
