"""``daskvec bench --tls``: what encryption costs, in one run.

Three DaskVecEnvs step the same CartPole-v1 envs with the same seeded random actions:

- ``encrypted``: the direct channel over TLS (mutual, the cluster's certificates) on a
  2-worker ``LocalCluster`` whose comms are TLS (``Security.temporary()``);
- ``actor``: Dask actor calls on such a TLS cluster (what a secured cluster got before
  the encrypted channel);
- ``plaintext``: the direct channel on a plain 2-worker ``LocalCluster`` (the Unix
  socket, as daskvec picks it when client and worker share a machine);
- ``plaintext-tcp``: the same over TCP, as a client on another host would use it (the
  client is told the workers run elsewhere). Encryption matters between hosts, so this
  is the comparison that isolates what TLS costs.

Each is reported in env-steps per second, with the ratios of the encrypted channel to
the others.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any
from unittest import mock

import numpy as np

__all__ = ["format_tls_table", "run_tls_benchmark"]

#: The measurements of a run, in the order they are taken and shown.
KINDS = ("encrypted", "actor", "plaintext", "plaintext-tcp")


@contextlib.contextmanager
def _cluster(tls: bool, n_workers: int = 2) -> Iterator[Any]:
    from distributed import Client

    from daskvec.cluster.clients import embedded_cluster

    kwargs: dict[str, Any] = {"n_workers": n_workers, "dashboard_address": ":0"}
    if tls:
        from distributed.security import Security

        kwargs.update(protocol="tls", security=Security.temporary())
    with embedded_cluster(**kwargs) as cluster, Client(cluster, direct_to_workers=True, set_as_default=False) as c:
        yield c


def _open(client: Any, transport: str, n_envs: int, seed: int, elsewhere: bool) -> Any:
    """A reset DaskVecEnv of CartPoles; ``elsewhere``: connect as a client on another host would."""
    import gymnasium as gym

    from daskvec import DaskVecEnv

    fns = [lambda: gym.make("CartPole-v1")] * n_envs
    # another host's client is not offered the Unix socket: it uses TCP
    patch = (
        mock.patch("daskvec._core.pool.machine_id", return_value="another-host")
        if elsewhere
        else contextlib.nullcontext()
    )
    with patch:
        env = DaskVecEnv(fns, client=client, transport=transport, timeout=120)
    env.seed(seed)
    env.reset()
    return env


def _window(env: Any, actions: np.ndarray, seconds: float) -> tuple[int, float]:
    """Step ``env`` for ``seconds``; return (vec-steps, elapsed)."""
    steps, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        env.step(actions[steps % len(actions)])
        steps += 1
    return steps, time.perf_counter() - t0


def run_tls_benchmark(
    n_envs: int = 8, seconds: float = 3.0, warmup: float = 0.5, seed: int = 0, rounds: int = 6, n_workers: int = 2
) -> dict[str, Any]:
    """Measure the encrypted direct channel, actor calls on TLS, and the plaintext channel.

    The four vec envs are built first, each on a 2-worker cluster of its own, then
    stepped in turn, ``rounds`` short windows each, so that a change in the machine's
    load during the run weighs on all of them alike (the machine is shared).

    Parameters
    ----------
    n_envs : int
        CartPole-v1 envs in each vec env.
    seconds : float
        Timed seconds per vec env, in all (split into ``rounds`` windows).
    warmup : float
        Seconds each vec env steps before any timing.
    seed : int
        Seed of the envs and the actions.
    rounds : int
        Windows per vec env.
    n_workers : int
        Workers of each cluster.

    Returns
    -------
    dict
        ``{"n_envs", "results": {kind: {...}}, "ratios": {...}}``; a kind that could not
        be built has an ``"error"`` instead of figures.
    """
    plan = {
        "encrypted": (True, "direct", False),
        "actor": (True, "actor", False),
        "plaintext": (False, "direct", False),
        "plaintext-tcp": (False, "direct", True),
    }
    actions = np.random.default_rng(seed).integers(0, 2, size=(1024, n_envs))
    results: dict[str, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack:
        envs: dict[str, Any] = {}
        for kind, (tls, transport, elsewhere) in plan.items():
            try:
                # a cluster each: groups of two vec envs in one worker process would share
                # its busy polling (one stepping connection per process polls)
                client = stack.enter_context(_cluster(tls=tls, n_workers=n_workers))
                envs[kind] = env = _open(client, transport, n_envs, seed, elsewhere)
            except Exception as e:
                results[kind] = {"error": f"{type(e).__name__}: {e}"}
                continue
            stack.callback(env.close)
            _window(env, actions, warmup)
        totals: dict[str, list[float]] = {kind: [0, 0.0] for kind in envs}
        for _ in range(max(rounds, 1)):
            for kind, env in envs.items():
                steps, elapsed = _window(env, actions, seconds / max(rounds, 1))
                totals[kind][0] += steps
                totals[kind][1] += elapsed
        for kind, env in envs.items():
            vec_steps, timed = totals[kind]
            results[kind] = {
                "env_steps_per_s": vec_steps * n_envs / timed,
                "vec_steps": int(vec_steps),
                "seconds": timed,
                "transport": env.transport_summary(),
                "encrypted": env.encrypted,
            }
    rate = {k: float(r["env_steps_per_s"]) for k, r in results.items() if "env_steps_per_s" in r}
    ratios = {
        f"encrypted/{other}": rate["encrypted"] / rate[other]
        for other in ("actor", "plaintext", "plaintext-tcp")
        if "encrypted" in rate and other in rate
    }
    ordered = {k: results[k] for k in KINDS if k in results}
    return {"n_envs": n_envs, "n_workers": n_workers, "results": ordered, "ratios": ratios}


def format_tls_table(result: dict[str, Any]) -> str:
    """The figures of :func:`run_tls_benchmark` as a small text table."""
    head = f"CartPole-v1, {result['n_envs']} envs, {result.get('n_workers', 2)} workers per cluster"
    lines = [head, f"{'':<14}{'env-steps/s':>12}  transport"]
    for kind in KINDS:
        r = result["results"].get(kind, {})
        if "error" in r:
            lines.append(f"{kind:<14}{'failed':>12}  {r['error']}")
        else:
            lines.append(f"{kind:<14}{r['env_steps_per_s']:>12,.0f}  {r['transport']}")
    for name, value in result["ratios"].items():
        lines.append(f"{name}: {value:.2f}x")
    return "\n".join(lines)
