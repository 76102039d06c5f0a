"""``python -m benchmarks.timeline``: where one DaskVecEnv vec-step's wall time goes, on one clock.

Stamps are taken around the direct channels' sends and receives on the client and, on
each worker, when a request has been read, when the group's envs were done
(``GroupStats.record_step``) and around the reply's send. On one machine the client's
and the workers' ``time.perf_counter`` read the same monotonic clock, so the stamps of
one vec-step line up: each line of the report is a median over the timed vec-steps.
The hooks wrap module functions of the running processes (the client's channel class,
the workers' serving loop and group statistics, through ``Client.run``), so they measure
the code as it is; they cost about a microsecond a stamp. Single machine, direct
channels (the embedded cluster's default) only.

Example: ``python -m benchmarks.timeline --env CartPole-v1 --envs 8`` (light-8) or
``--env HalfCheetah-v5 --envs 64``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks._timing import write_json

logger = logging.getLogger(__name__)


def _hook_worker() -> None:
    """On a worker: record ``(kind, perf_counter)`` stamps of the serving loop and the envs' end."""
    from daskvec.monitoring import metrics
    from daskvec.transport import server

    stamps: list[tuple[str, float]] = []
    setattr(server, "_timeline_stamps", stamps)  # noqa: B010 - read back by _worker_stamps
    decode, send, record = server.decode, server.send_frames, metrics.GroupStats.record_step

    def decode_request(*args: Any, **kwargs: Any) -> Any:
        stamps.append(("read", time.perf_counter()))  # the serving loop decodes what it has just read
        return decode(*args, **kwargs)

    def send_frames(*args: Any, **kwargs: Any) -> Any:
        stamps.append(("send", time.perf_counter()))
        try:
            return send(*args, **kwargs)
        finally:
            stamps.append(("sent", time.perf_counter()))

    def record_step(self: Any, n_envs: int, seconds: float) -> None:
        stamps.append(("envs_done", time.perf_counter()))
        stamps.append(("env_seconds", seconds))
        record(self, n_envs, seconds)

    decode_request.__wrapped__, send_frames.__wrapped__, record_step.__wrapped__ = decode, send, record  # type: ignore[attr-defined]
    server.decode, server.send_frames = decode_request, send_frames
    metrics.GroupStats.record_step = record_step  # type: ignore[method-assign]


def _unhook_worker() -> None:
    """On a worker: put back what :func:`_hook_worker` wrapped, and drop its stamps."""
    from daskvec.monitoring import metrics
    from daskvec.transport import server

    for module, name in ((server, "decode"), (server, "send_frames"), (metrics.GroupStats, "record_step")):
        wrapped = getattr(module, name)
        original = getattr(wrapped, "__wrapped__", None)
        if original is not None:
            setattr(module, name, original)
    if hasattr(server, "_timeline_stamps"):
        delattr(server, "_timeline_stamps")


def _worker_stamps(clear: bool) -> list[tuple[str, float]]:
    from daskvec.transport import server

    stamps: list[tuple[str, float]] = getattr(server, "_timeline_stamps", [])
    out = list(stamps)
    if clear:
        stamps.clear()
    return out


def _hook_client(stamps: list[tuple[str, float]]) -> Callable[[], None]:
    """Stamp this process's direct channels' sends and decoded replies into ``stamps``; returns the undo."""
    from daskvec.transport import channels

    cls: Any = channels.DirectChannel
    send, recv = cls.send, cls.recv

    def undo() -> None:
        cls.send, cls.recv = send, recv

    def timed_send(self: Any, request: Any) -> None:
        send(self, request)
        stamps.append(("sent", time.perf_counter()))

    def timed_recv(self: Any, timeout: float | None) -> Any:
        reply = recv(self, timeout)
        stamps.append(("decoded", time.perf_counter()))
        return reply

    cls.send, cls.recv = timed_send, timed_recv
    return undo


def _one(worker: list[tuple[str, float]], kind: str, start: float, end: float) -> float | None:
    found = [t for k, t in worker if k == kind and start <= t <= end]
    return found[0] if len(found) == 1 else None


#: One timed vec-step on the client: its start, its end, when each request was sent, when each reply was decoded.
Step = tuple[float, float, list[float], list[float]]


def split(steps: list[Step], workers: list[list[tuple[str, float]]]) -> dict[str, list[float]]:
    """Per vec-step parts in microseconds, from the client's and workers' stamps (steps missing a stamp are skipped)."""
    parts: dict[str, list[float]] = {
        "client sends (all groups)": [],
        "last send -> last group has read its request": [],
        "read -> envs done (slowest group)": [],
        "envs done -> reply send starts (slowest)": [],
        "reply send starts -> client has decoded it (last group)": [],
        "client after the last reply": [],
        "vec-step": [],
    }
    envs = [[t for k, t in w if k == "env_seconds"] for w in workers]
    for start, end, sent, decoded in steps:
        if len(sent) != len(workers) or len(decoded) != len(workers):
            continue
        read = [_one(w, "read", start, end) for w in workers]
        done = [_one(w, "envs_done", start, end) for w in workers]
        send = [_one(w, "send", start, end) for w in workers]
        if any(x is None for x in (*read, *done, *send)):
            continue
        r, d, s = (np.array(x, dtype=float) for x in (read, done, send))
        slowest = int(np.argmax(s))
        parts["client sends (all groups)"].append(sent[-1] - start)
        parts["last send -> last group has read its request"].append(r.max() - sent[-1])
        parts["read -> envs done (slowest group)"].append(d[slowest] - r[slowest])
        parts["envs done -> reply send starts (slowest)"].append(s[slowest] - d[slowest])
        parts["reply send starts -> client has decoded it (last group)"].append(decoded[-1] - s.max())
        parts["client after the last reply"].append(end - decoded[-1])
        parts["vec-step"].append(end - start)
    out = {k: [x * 1e6 for x in v] for k, v in parts.items()}
    out["env seconds per group (median of each)"] = [float(np.median(e)) * 1e6 for e in envs if e]
    return out


def run(env_id: str, n_envs: int, seconds: float, seed: int) -> dict[str, Any]:
    """Time ``seconds`` of stepping ``env_id`` x ``n_envs`` in a DaskVecEnv (SB3's ``make_vec_env``) with stamps."""
    from stable_baselines3.common.env_util import make_vec_env

    from daskvec import DaskVecEnv

    venv = make_vec_env(env_id, n_envs=n_envs, vec_env_cls=DaskVecEnv, seed=seed)  # type: ignore[arg-type]
    undo: Callable[[], None] | None = None
    try:
        venv.action_space.seed(seed)
        actions = np.stack([np.stack([venv.action_space.sample() for _ in range(n_envs)]) for _ in range(64)])
        venv.reset()
        for k in range(300):
            venv.step(actions[k % 64])
        client: Any = venv.client  # type: ignore[attr-defined]
        client.run(_hook_worker)
        stamps: list[tuple[str, float]] = []
        undo = _hook_client(stamps)
        for k in range(300):  # warm, then drop what the warm-up stamped
            venv.step(actions[k % 64])
        client.run(_worker_stamps, True)
        stamps.clear()
        steps: list[Step] = []
        t_end = time.perf_counter() + seconds
        k = 0
        while time.perf_counter() < t_end:
            del stamps[:]
            start = time.perf_counter()
            venv.step(actions[k % 64])
            end = time.perf_counter()
            steps.append((start, end, [t for s, t in stamps if s == "sent"], [t for s, t in stamps if s == "decoded"]))
            k += 1
        workers = list(client.run(_worker_stamps, False).values())
    finally:
        if undo is not None:
            undo()
            with contextlib.suppress(Exception):  # a cluster not the embedded one's keeps its workers
                venv.client.run(_unhook_worker)  # type: ignore[attr-defined]
        venv.close()
    if len({len(sent) for _, _, sent, _ in steps}) > 1 or (steps and len(steps[0][2]) != len(workers)):
        raise RuntimeError(
            f"the timeline needs one env group per worker ({len(workers)} workers, "
            f"{len(steps[0][2]) if steps else 0} groups): use at least as many envs as workers"
        )
    parts = split(steps, workers)
    medians = {k: float(np.median(v)) if v else None for k, v in parts.items() if not k.startswith("env seconds")}
    return {
        "env": env_id,
        "n_envs": n_envs,
        "vec_steps": len(steps),
        "median_us": medians,
        "env_us_per_group": parts["env seconds per group (median of each)"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Command line entry: run, then report each part's median."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--env", default="CartPole-v1")
    parser.add_argument("--envs", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the results as JSON here")
    args = parser.parse_args(argv)
    result = run(args.env, args.envs, args.seconds, args.seed)
    logger.info("%s x%d: %d vec-steps; medians in microseconds", args.env, args.envs, result["vec_steps"])
    for k, v in result["median_us"].items():
        logger.info("  %-58s %s", k, "-" if v is None else f"{v:8.1f}")
    logger.info("  env time per group (median): %s", ", ".join(f"{x:.1f}" for x in result["env_us_per_group"]))
    write_json(result, args.out)
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(message)s")  # the embedded cluster's lines: warnings only
    logger.setLevel(logging.INFO)
    main()
