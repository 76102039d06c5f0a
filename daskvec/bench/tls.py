"""``daskvec bench --tls``: what encryption costs, in one run.

Three DaskVecEnvs step the same CartPole-v1 envs with the same seeded random actions:

- ``encrypted``: the direct channel over TLS (mutual, the cluster's certificates) on a
  2-worker ``LocalCluster`` whose comms are TLS (``Security.temporary()``);
- ``actor``: Dask actor calls on that same TLS cluster (what a secured cluster got before
  the encrypted channel);
- ``plaintext``: the direct channel on a plain 2-worker ``LocalCluster`` (the Unix
  socket, as daskvec picks it when client and worker share a machine).

Each is reported in env-steps per second, with its ratio to the other two.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = ["format_tls_table", "run_tls_benchmark"]

#: The measurements of a run, in the order they are taken and shown.
KINDS = ("encrypted", "actor", "plaintext")


@contextlib.contextmanager
def _cluster(tls: bool) -> Iterator[Any]:
    from distributed import Client

    from daskvec.cluster import embedded_cluster

    kwargs: dict[str, Any] = {"n_workers": 2, "dashboard_address": ":0"}
    if tls:
        from distributed.security import Security

        kwargs.update(protocol="tls", security=Security.temporary())
    with embedded_cluster(**kwargs) as cluster, Client(cluster, direct_to_workers=True, set_as_default=False) as c:
        yield c


def _measure(client: Any, transport: str, n_envs: int, seconds: float, warmup: float, seed: int) -> dict[str, Any]:
    import gymnasium as gym

    from daskvec import DaskVecEnv

    fns = [lambda: gym.make("CartPole-v1")] * n_envs
    actions = np.random.default_rng(seed).integers(0, 2, size=(1024, n_envs))
    with DaskVecEnv(fns, client=client, transport=transport, timeout=120) as env:
        env.seed(seed)
        env.reset()
        end = time.perf_counter() + warmup
        i = 0
        while time.perf_counter() < end:
            env.step(actions[i % len(actions)])
            i += 1
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            env.step(actions[(i + steps) % len(actions)])
            steps += 1
        elapsed = time.perf_counter() - t0
        return {
            "env_steps_per_s": steps * n_envs / elapsed,
            "vec_steps": steps,
            "seconds": elapsed,
            "transport": env.transport_summary(),
            "encrypted": env.encrypted,
        }


def run_tls_benchmark(n_envs: int = 8, seconds: float = 3.0, warmup: float = 0.5, seed: int = 0) -> dict[str, Any]:
    """Measure the encrypted direct channel, actor calls on TLS, and the plaintext channel.

    Parameters
    ----------
    n_envs : int
        CartPole-v1 envs in each vec env.
    seconds, warmup : float
        Timed window and warm-up of each measurement.
    seed : int
        Seed of the envs and the actions.

    Returns
    -------
    dict
        ``{"n_envs", "results": {kind: {...}}, "ratios": {...}}``; a kind that failed has
        an ``"error"`` instead of figures.
    """
    results: dict[str, dict[str, Any]] = {}
    with _cluster(tls=True) as client:
        for kind, transport in (("encrypted", "direct"), ("actor", "actor")):
            try:
                results[kind] = _measure(client, transport, n_envs, seconds, warmup, seed)
            except Exception as e:
                results[kind] = {"error": f"{type(e).__name__}: {e}"}
    with _cluster(tls=False) as client:
        try:
            results["plaintext"] = _measure(client, "direct", n_envs, seconds, warmup, seed)
        except Exception as e:
            results["plaintext"] = {"error": f"{type(e).__name__}: {e}"}
    rate = {k: r.get("env_steps_per_s") for k, r in results.items()}
    ratios = {}
    if rate["encrypted"] and rate["actor"]:
        ratios["encrypted/actor"] = rate["encrypted"] / rate["actor"]
    if rate["encrypted"] and rate["plaintext"]:
        ratios["encrypted/plaintext"] = rate["encrypted"] / rate["plaintext"]
    return {"n_envs": n_envs, "results": results, "ratios": ratios}


def format_tls_table(result: dict[str, Any]) -> str:
    """The figures of :func:`run_tls_benchmark` as a small text table."""
    lines = [f"CartPole-v1, {result['n_envs']} envs, 2 workers", f"{'':<11}{'env-steps/s':>12}  transport"]
    for kind in KINDS:
        r = result["results"].get(kind, {})
        if "error" in r:
            lines.append(f"{kind:<11}{'failed':>12}  {r['error']}")
        else:
            lines.append(f"{kind:<11}{r['env_steps_per_s']:>12,.0f}  {r['transport']}")
    for name, value in result["ratios"].items():
        lines.append(f"{name}: {value:.2f}x")
    return "\n".join(lines)
