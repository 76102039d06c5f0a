"""Cluster helpers: which client to use, where env groups go, how factories travel.

- :func:`resolve_client` turns the ``client=`` argument of :class:`~daskvec.DaskVecEnv`
  (a ``Client``, an address, a ``Cluster`` or ``None``) into a connected client and
  says which objects daskvec created and must close (the embedded cluster it may start
  is :mod:`daskvec.cluster.embedded`'s).
- :func:`plan_groups` and :func:`assign_workers` split envs into groups and balance
  the groups over the eligible workers.
- :func:`dumps_factories` pickles env factories so that code defined in ``__main__``,
  a notebook, a test module or a local module the workers cannot import still works.
- :class:`KeepEnvWorkers` is a scheduler plugin that keeps workers holding envs out
  of adaptive scale-down while other workers can go.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import json
import logging
import os
import sys
import sysconfig
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import cloudpickle
from distributed.diagnostics.plugin import SchedulerPlugin

from daskvec._core import dask_internals as _dask
from daskvec._core import user_errors as _user_errors
from daskvec.cluster.embedded import WORKER_EXIT_S, EmbeddedCluster, embedded_cluster
from daskvec.errors import SchedulerLostError
from daskvec.monitoring.links import check_dashboard
from daskvec.protocol.messages import GROUP_KEY_PREFIX, group_actors_on

logger = logging.getLogger(__name__)

__all__ = [
    "GROUP_KEY_PREFIX",
    "KeepEnvWorkers",
    "ResolvedClient",
    "assign_workers",
    "choose_transport",
    "dumps_factories",
    "eligible_workers",
    "embedded_cluster",
    "install_dashboard_page",
    "keep_env_workers",
    "plan_groups",
    "resolve_client",
]


# --------------------------------------------------------------------------- clients
#: Seconds past ``connect_timeout`` to wait for a Client to a scheduler address: Dask's
#: own timeout, when it applies, fires first and gives its own reason.
_CONNECT_MARGIN = 1.0


#: The clients of this process's embedded clusters, and their users: a vec
#: env made with ``client=None`` while one is the default client uses it too, and it closes
#: with the last of them. ``_EMBEDDED_LOCK`` is held from reading the default client to
#: registering a new cluster, and while the last user closes it: a vec env made on another
#: thread meanwhile waits, then joins or starts a cluster of its own.
_EMBEDDED: dict[Any, int] = {}  # client (hashed by identity) -> vec envs using it
_EMBEDDED_LOCK = threading.RLock()


@dataclass
class ResolvedClient:
    """A client to use, and what daskvec created to get it (and so must close)."""

    client: Any
    own_client: bool = False
    cluster: Any = None
    own_cluster: bool = False
    #: an embedded cluster that other vec envs of this process may use too (see ``_EMBEDDED``)
    shared: bool = False
    closed: bool = False

    def close(self, timeout: float = 10) -> None:
        """Close what daskvec created (an embedded cluster with its last user), at most ``timeout`` s each; once."""
        with _EMBEDDED_LOCK:
            if self.closed:
                return
            self.closed = True
            if self.shared:
                others = _EMBEDDED.pop(self.client, 1) - 1
                if others:
                    _EMBEDDED[self.client] = others
                    logger.info("daskvec's embedded LocalCluster stays up for %d other vec env(s)", others)
                    return
                self._close_owned(timeout)  # holding the lock: see _EMBEDDED
                return
        self._close_owned(timeout)

    def _close_owned(self, timeout: float) -> None:
        if self.own_client:
            with contextlib.suppress(Exception):
                self.client.close(timeout=timeout)
        if self.own_cluster and self.cluster is not None:
            with contextlib.suppress(Exception):
                # the embedded cluster's nannies wait up to WORKER_EXIT_S for a worker process that is still
                # exiting; the rest of the close must not be cut short meanwhile
                patience = WORKER_EXIT_S + 10.0 if isinstance(self.cluster, EmbeddedCluster) else 0.0
                self.cluster.close(timeout=timeout + patience)


def _embedded_client(cluster_kwargs: dict[str, Any] | None) -> ResolvedClient:
    """``client=None``: the default client (joining daskvec's embedded cluster behind it), or a new embedded cluster."""
    from distributed import Client

    with _EMBEDDED_LOCK:
        current = _default_client()
        if current is not None:
            if cluster_kwargs:
                _refuse_cluster_kwargs(f"the default Client {current}")
            if current not in _EMBEDDED or current.status != "running":
                return ResolvedClient(current)  # the user's own client
            _EMBEDDED[current] += 1
            logger.info(
                "daskvec uses the embedded LocalCluster already running here (%d vec envs on it now)",
                _EMBEDDED[current],
            )
            return ResolvedClient(current, own_client=True, cluster=current.cluster, own_cluster=True, shared=True)
        cluster = embedded_cluster(**(cluster_kwargs or {}))
        c = Client(cluster, direct_to_workers=True)
        _EMBEDDED[c] = 1
    if logger.isEnabledFor(logging.INFO):  # checking the pages costs a call to the scheduler
        logger.info("daskvec started a LocalCluster; %s", check_dashboard(c).describe())
    return ResolvedClient(c, own_client=True, cluster=cluster, own_cluster=True, shared=True)


def _refuse_cluster_kwargs(given: str) -> NoReturn:
    raise ValueError(
        f"cluster_kwargs configures the embedded LocalCluster, which daskvec does not start with {given}: "
        "configure that cluster instead, or drop cluster_kwargs"
    )


def _default_client() -> Any:
    from distributed import Client

    with contextlib.suppress(ValueError):
        return Client.current(allow_global=True)
    return None


def install_dashboard_page() -> bool:
    """Add the daskvec page to every Dask scheduler this process starts from now on.

    :func:`daskvec.dashboard.install`, or ``False`` (with a log line saying why) when
    Bokeh is missing or too old for Dask's dashboard.
    """
    try:
        from daskvec import dashboard
    except ImportError as e:
        logger.info("daskvec dashboard page not installed: %s", e)
        return False
    return dashboard.install()


def _connect(address: str, timeout: float) -> Any:
    """A ``Client`` of the scheduler at ``address``, connected within about ``timeout`` seconds.

    Dask bounds the TCP connection by its ``timeout`` but not the handshake after it: a
    scheduler that accepts connections and does not answer (SIGSTOPped, a stalled VM)
    holds ``Client(address)`` until it answers. The Client is made on a thread of its
    own and waited for with a deadline; one that comes after it is closed there.
    """
    from distributed import Client

    lock = threading.Lock()
    made: dict[str, Any] = {}

    def connect() -> None:
        before = _default_client()
        try:
            c = Client(address, timeout=timeout, direct_to_workers=True)
        except BaseException as e:  # handed to the caller (or dropped: it gave up)
            made["error"] = e
            # Dask leaves a Client failed on a malformed address (a ValueError, at once) as the default
            # client, which every later DaskVecEnv(client=None) would use (an unreachable one it drops)
            failed = _default_client() if isinstance(e, ValueError) else None
            if failed is not None and failed is not before and getattr(failed, "status", None) != "running":
                with contextlib.suppress(Exception):
                    failed.close(timeout=1)
            return
        with lock:
            if "gave_up" not in made:
                made["client"] = c
                return
        c.close()  # the caller gave up before it came: nobody will use it

    thread = threading.Thread(target=connect, name="daskvec-connect", daemon=True)
    thread.start()
    thread.join(timeout + _CONNECT_MARGIN)
    # the messages below say the cause and what to do: Dask's chained errors are logged, not printed
    with lock:
        if "client" not in made and "error" not in made:
            made["gave_up"] = True
            raise _user_errors.mark(
                ValueError(
                    f"the Dask scheduler at {address!r} took a connection but did not answer within {timeout:.0f}s "
                    "(stopped, frozen or overloaded?); check that `dask scheduler` is running there and responsive, "
                    "or raise connect_timeout"
                )
            )
    error = made.get("error")
    if isinstance(error, (OSError, TimeoutError, ValueError)):
        logger.debug("connecting to %r failed", address, exc_info=error)
    if isinstance(error, (OSError, TimeoutError)):
        raise _user_errors.mark(
            ValueError(
                f"cannot reach a Dask scheduler at {address!r} within {timeout:.0f}s ({error}); "
                "check the address (e.g. 'tcp://host:8786') and that `dask scheduler` is running"
            )
        )
    if isinstance(error, ValueError):  # Dask's words on a malformed address ("missing port number")
        raise _user_errors.mark(
            ValueError(f"cannot connect to {address!r}: {error}; a scheduler address looks like 'tcp://host:8786'")
        )
    if error is not None:
        raise error
    return made["client"]


def resolve_client(
    client: Any, connect_timeout: float = 30.0, cluster_kwargs: dict[str, Any] | None = None
) -> ResolvedClient:
    """Turn the ``client=`` argument of ``DaskVecEnv`` into a usable client.

    Parameters
    ----------
    client : Client, str, Cluster or None
        ``None`` uses the current default client if there is one, else starts an
        embedded ``LocalCluster``; a string is a scheduler address; any object with a
        ``scheduler_address`` (``LocalCluster``, a dask-jobqueue cluster) is connected to.
    connect_timeout : float
        Seconds to wait for a scheduler address to answer.
    cluster_kwargs : dict, optional
        Extra arguments for the embedded ``LocalCluster``.

    Raises
    ------
    TypeError
        For anything else.
    ValueError
        For a scheduler address that cannot be reached, or ``cluster_kwargs`` where no
        embedded cluster is started.
    """
    from distributed import Client

    if client is None:
        return _embedded_client(cluster_kwargs)
    if cluster_kwargs:
        _refuse_cluster_kwargs(f"client={type(client).__name__}")
    if isinstance(client, Client):
        return ResolvedClient(client)
    if isinstance(client, str):
        _check_address_security(client)
        return ResolvedClient(_connect(client, connect_timeout), own_client=True)
    if hasattr(client, "scheduler_address"):
        if type(client).__module__.startswith("dask_jobqueue"):
            from daskvec.jobqueue import keep_ctrl_c

            keep_ctrl_c()  # importing dask_jobqueue turned Ctrl-C into sys.exit()
        c = Client(client, direct_to_workers=True)
        return ResolvedClient(c, own_client=True, cluster=client)
    raise TypeError(
        "client must be a distributed.Client, a scheduler address string, a Cluster "
        f"(LocalCluster, SLURMCluster, ...) or None, not {type(client).__name__}"
    )


#: Address schemes of Dask comms that carry bytes in the clear. Any other scheme
#: (``tls``, ``gateway``, ``wss``, one from a plugin) counts as secured.
PLAIN_SCHEMES = frozenset({"tcp", "inproc"})


def address_scheme(address: str) -> str:
    """The comm scheme of a Dask address (``"tcp"`` when it has none, as Dask assumes)."""
    return address.split("://", 1)[0].lower() if "://" in address else "tcp"


def security_reasons(client: Any, worker_addresses: Sequence[str] | None = None, timeout: float = 30.0) -> list[str]:
    """Why the cluster behind ``client`` counts as secured; empty when it does not.

    Anything that can say so is asked: the scheduler's address scheme, every worker's
    (a TLS cluster can sit behind a scheduler address that looks plain, e.g. a
    proxy), and the client's security object (an SSL context or
    ``require_encryption`` from ``get_connection_args("client")``, which is how
    dask-gateway's ``GatewaySecurity`` reports it). A security object that cannot be
    asked counts as secured: in doubt, daskvec never opens a plaintext channel
    unasked.

    Parameters
    ----------
    client : distributed.Client
        The client of the cluster.
    worker_addresses : sequence of str, optional
        The workers to check; by default every worker the scheduler knows now.
    timeout : float, optional
        Seconds the scheduler has to name its workers.

    Raises
    ------
    SchedulerLostError
        The scheduler did not answer within ``timeout`` (nothing can be placed then).
    """
    reasons: list[str] = []
    address = str(getattr(client.scheduler, "address", "") or "")
    if address and address_scheme(address) not in PLAIN_SCHEMES:
        reasons.append(f"scheduler address {address}")
    if worker_addresses is None:
        try:
            worker_addresses = list(scheduler_workers(client, timeout))
        except SchedulerLostError:
            raise
        except Exception as e:  # cannot tell: assume the worst
            reasons.append(f"worker addresses unknown ({type(e).__name__}: {e})")
            worker_addresses = []
    secured_workers = [w for w in worker_addresses if address_scheme(w) not in PLAIN_SCHEMES]
    if secured_workers:
        reasons.append(
            f"worker address {secured_workers[0]}"
            + (f" and {len(secured_workers) - 1} more" if len(secured_workers) > 1 else "")
        )
    security = getattr(client, "security", None)
    if security is not None:
        try:
            args = security.get_connection_args("client")
        except Exception as e:
            reasons.append(f"security object {type(security).__name__} could not be asked ({type(e).__name__}: {e})")
        else:
            if args.get("ssl_context") is not None:
                reasons.append(f"{type(security).__name__} has a TLS context")
            if args.get("require_encryption"):
                reasons.append(f"{type(security).__name__} requires encryption")
        if getattr(security, "require_encryption", False) and not any("requires encryption" in r for r in reasons):
            reasons.append(f"{type(security).__name__} requires encryption")
    return reasons


def _check_address_security(address: str) -> None:
    """A clear error for a secured scheduler address given without certificates.

    Dask's own (``TypeError: TLS expects a ssl_context``) does not say what to pass. The
    certificates can come from Dask's config (``distributed.comm.tls``), else the user
    must make the client.
    """
    from distributed.security import Security

    scheme = address_scheme(address)
    if scheme != "tls":
        return
    try:
        configured = Security().get_connection_args("client").get("ssl_context") is not None
    except Exception:
        configured = False
    if not configured:
        raise ValueError(
            f"client={address!r} is a TLS address, but no certificates were given; make the client "
            "yourself and pass it: client=Client(address, security=Security(tls_ca_file='ca.pem', "
            "tls_client_cert='client.pem', tls_client_key='client-key.pem', require_encryption=True)) "
            "(from distributed.security import Security), or set distributed.comm.tls.ca-file and "
            "distributed.comm.tls.client.cert/key in Dask's config"
        )


def uses_tls(client: Any) -> bool:
    """Whether the cluster behind ``client`` is secured (see :func:`security_reasons`)."""
    return bool(security_reasons(client))


def client_ssl_context(client: Any) -> Any:
    """The client's TLS context for connecting to workers (``None`` if it has none)."""
    security = getattr(client, "security", None)
    if security is None:
        return None
    try:
        return security.get_connection_args("client").get("ssl_context")
    except Exception:
        return None


def choose_transport(client: Any, transport: str, timeout: float = 30.0) -> tuple[str, bool]:
    """The transport a vec env uses on ``client``'s cluster, and whether its direct channel is TLS.

    On a plain cluster, ``transport`` as given. On a secured one (see
    :func:`security_reasons`): ``"auto"`` and ``"direct"`` are the TLS direct channel
    (``"auto"`` falls back to actor calls when the client has no TLS context),
    ``"actor"`` stays, and ``"direct-insecure"`` is the plaintext channel, with a warning.

    Raises
    ------
    ValueError
        ``transport="direct"`` on a secured cluster whose client has no TLS context.
    """
    reasons = security_reasons(client, timeout=timeout)
    if not reasons:
        return transport, False
    why = "; ".join(reasons)
    if transport == "actor":
        return "actor", False
    if transport == "direct-insecure":
        logger.warning(
            "transport='direct-insecure' on a secured cluster (%s): env steps travel UNENCRYPTED "
            "between this client and the workers",
            why,
        )
        return "direct-insecure", False
    if client_ssl_context(client) is None:  # secured, but no certificate to speak TLS with
        if transport == "direct":
            raise ValueError(
                f"transport='direct' needs TLS on this secured cluster ({why}), but the client has no TLS "
                "context (client.security.get_connection_args('client')); pass a client made with "
                "security=Security(tls_ca_file=..., tls_client_cert=..., tls_client_key=...), use "
                "transport='actor', or transport='direct-insecure' to send steps unencrypted"
            )
        logger.info("secured cluster (%s) without a client TLS context: using Dask actor calls", why)
        return "actor", False
    logger.info("secured cluster (%s): the direct channel uses TLS", why)
    return transport, True


# --------------------------------------------------------------------------- placement
def scheduler_workers(client: Any, timeout: float = 30.0) -> dict[str, Any]:
    """The scheduler's current view of every worker: ``{address: worker info}``.

    Asked of the scheduler itself, not read from the client's cache, waiting at most
    ``timeout`` seconds (see :func:`daskvec._core.dask_internals.scheduler_workers`).

    Raises
    ------
    daskvec.errors.SchedulerLostError
        When the scheduler does not answer in time or is gone.
    """
    return _dask.scheduler_workers(client, timeout)


def keep_env_workers(client: Any, timeout: float = 30.0) -> None:
    """Register :class:`KeepEnvWorkers` on the client's scheduler (once; later calls replace it).

    A scheduler that cannot import daskvec refuses it: then a warning says that adaptive
    scale-down may close workers holding envs. A scheduler that does not answer within
    ``timeout`` seconds is a :class:`~daskvec.errors.SchedulerLostError`.
    """
    try:
        _dask.register_scheduler_plugin(client, KeepEnvWorkers(), KeepEnvWorkers.name, timeout)
    except TimeoutError as e:
        raise _dask.scheduler_lost(client, e, timeout) from e
    except Exception as e:
        logger.warning(
            "could not register the scale-down plugin on the scheduler (%s); "
            "adaptive scale-down may close workers holding envs",
            e,
        )


def eligible_workers(
    scheduler_info: dict[str, Any],
    workers: Sequence[str] | None = None,
    resources: dict[str, float] | None = None,
) -> list[str]:
    """Workers that may hold envs: those named in ``workers`` (addresses or names) and
    having at least ``resources``; all workers when neither is given."""
    out = []
    wanted = set(workers) if workers else None
    for addr, info in sorted(scheduler_info.get("workers", {}).items()):
        if wanted is not None and addr not in wanted and str(info.get("name")) not in wanted:
            continue
        if resources:
            have = info.get("resources", {}) or {}
            if any(have.get(k, 0) < v for k, v in resources.items()):
                continue
        out.append(addr)
    return out


def plan_groups(n_envs: int, n_workers: int, envs_per_actor: int | None) -> list[list[int]]:
    """Split env indices ``0..n_envs-1`` into contiguous groups.

    With ``envs_per_actor=None`` there is one group per worker (as even as possible),
    which is the fastest layout: one round trip per worker per step.
    """
    if envs_per_actor is None:
        n_groups = max(1, min(n_envs, n_workers))
        size, extra = divmod(n_envs, n_groups)
        groups, start = [], 0
        for g in range(n_groups):
            k = size + (1 if g < extra else 0)
            groups.append(list(range(start, start + k)))
            start += k
        return groups
    return [list(range(s, min(s + envs_per_actor, n_envs))) for s in range(0, n_envs, envs_per_actor)]


def assign_workers(groups: list[list[int]], workers: Sequence[str], load: dict[str, int] | None = None) -> list[str]:
    """Give each group the worker holding the fewest envs so far (stable, round robin on ties)."""
    if not workers:
        raise ValueError("no eligible worker to place envs on")
    held = {w: (load or {}).get(w, 0) for w in workers}
    order = {w: i for i, w in enumerate(workers)}
    out = []
    for g in sorted(range(len(groups)), key=lambda i: -len(groups[i])):
        w = min(workers, key=lambda a: (held[a], order[a]))
        held[w] += len(groups[g])
        out.append((g, w))
    result = [""] * len(groups)
    for g, w in out:
        result[g] = w
    return result


# --------------------------------------------------------------------------- pickling
def _stdlib_and_site_dirs() -> list[str]:
    """The standard library's and the site directories: not the bare prefixes, which, for a
    system Python (``/usr``), hold the user's ``/usr/src/app`` as well."""
    import site

    paths = sysconfig.get_paths()
    dirs = {paths.get(k, "") for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    with contextlib.suppress(AttributeError):  # virtualenv's old site.py has neither
        dirs |= {*site.getsitepackages(), site.getusersitepackages()}
    return [os.path.realpath(d) for d in dirs if d]


@functools.lru_cache(maxsize=1)
def _installed_dirs() -> tuple[str, ...]:
    return tuple(_stdlib_and_site_dirs())


def _is_editable(dist: importlib.metadata.Distribution) -> bool:
    """Whether ``dist`` was installed in editable mode (PEP 660's ``direct_url.json``): its code is the user's."""
    try:
        text = dist.read_text("direct_url.json")
        return text is not None and bool(json.loads(text).get("dir_info", {}).get("editable"))
    except (OSError, ValueError, AttributeError):
        return False


def _top_levels(dist: importlib.metadata.Distribution) -> set[str]:
    """The top-level import names ``dist`` installs: its ``top_level.txt``, else the first parts of its files."""
    text = dist.read_text("top_level.txt")
    if text:
        return {line.strip() for line in text.splitlines() if line.strip()}
    tops: set[str] = set()
    for file in dist.files or ():
        first = file.parts[0] if file.parts else ""
        if not first or first == ".." or first.endswith((".dist-info", ".egg-info", ".data")):
            continue
        if len(file.parts) > 1:
            tops.add(first)
        elif first.endswith((".py", ".so", ".pyd")):
            tops.add(first.split(".")[0])
    return tops


@functools.lru_cache(maxsize=4)
def _installed_roots(path: tuple[str, ...]) -> dict[str, frozenset[str]]:
    """For each top-level name an installed (not editable) distribution provides, the directories it lives in.

    Found from the distributions' metadata on ``path`` (``sys.path``), wherever they were
    installed: a venv, ``pip install --target`` or ``--prefix`` on ``PYTHONPATH``, an HPC
    module, a zip with its ``.dist-info``, an ``.egg-info`` of ``setup.py install``.
    """
    roots: dict[str, set[str]] = {}
    for dist in importlib.metadata.distributions(path=list(path)):
        if _is_editable(dist):
            continue
        try:
            root = os.path.realpath(str(dist.locate_file("")))
            tops = _top_levels(dist)
        except Exception:  # unreadable metadata: that distribution is not counted
            continue
        for top in tops:
            roots.setdefault(top, set()).add(root)
    return {top: frozenset(dirs) for top, dirs in roots.items()}


def _import_roots(mod: types.ModuleType) -> list[str]:
    """The directories ``mod`` (a top-level module or package, or a namespace package) was imported from."""
    path = getattr(mod, "__file__", None)
    if path:
        real = os.path.realpath(path)
        parent = os.path.dirname(real)
        return [os.path.dirname(parent) if os.path.basename(real).startswith("__init__.") else parent]
    # a namespace package: no file, one directory per portion
    return [os.path.dirname(os.path.realpath(p)) for p in list(getattr(mod, "__path__", None) or [])]


def _is_local_module(mod: types.ModuleType) -> bool:
    """Whether ``mod`` (a top-level module) is user code, to be sent to the workers by value.

    Not user code: the standard library, what lives in the interpreter's site directories,
    and any module an installed distribution (not an editable one) put where it was
    imported from, wherever that is on ``sys.path`` (``PYTHONPATH``, ``pip install
    --target``): NumPy, Gymnasium, cloudpickle itself are imported on the workers. A
    user's own modules and packages (namespace packages too), and projects installed in
    editable mode, are user code.
    """
    name = mod.__name__
    if name == "__main__" or name.split(".")[0] in ("daskvec", "distributed", "dask"):
        return False
    if name in sys.builtin_module_names:
        return False
    roots = _import_roots(mod)
    if not roots:
        return False
    installed = _installed_dirs()
    provided = _installed_roots(tuple(sys.path)).get(name, frozenset())
    return any(r not in provided and not any((r + os.sep).startswith(d + os.sep) for d in installed) for r in roots)


def _top_local_modules() -> list[types.ModuleType]:
    """Top-level modules loaded from outside the Python installation (user code)."""
    # each top-level name once: torch alone has thousands of submodules in sys.modules
    names = {name.split(".")[0] for name, mod in list(sys.modules.items()) if isinstance(mod, types.ModuleType)}
    tops = [sys.modules.get(top) for top in sorted(names)]
    return [mod for mod in tops if isinstance(mod, types.ModuleType) and _is_local_module(mod)]


@contextlib.contextmanager
def _pickled_by_value(modules: list[types.ModuleType]) -> Iterator[None]:
    registered = []
    for mod in modules:
        try:
            cloudpickle.register_pickle_by_value(mod)
            registered.append(mod)
        except ValueError:
            continue  # already registered by the user, or not a pickleable module
    try:
        yield
    finally:
        for mod in registered:
            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(mod)


def dumps_by_value(obj: Any) -> bytes:
    """cloudpickle ``obj``, sending user modules (not installed packages) by value."""
    with _pickled_by_value(_top_local_modules()):
        return cloudpickle.dumps(obj)


def dumps_factories(env_fns: Sequence[Callable[[], Any]], indices: Sequence[int]) -> bytes:
    """Pickle the factories ``env_fns[i] for i in indices`` as one list.

    User code (``__main__``, notebooks, local modules, test modules) is sent by
    value, so workers do not need to import it.

    Raises
    ------
    TypeError
        Naming the first factory that cannot be pickled.
    """
    fns = [env_fns[i] for i in indices]
    try:
        return dumps_by_value(fns)
    except Exception:
        for i in indices:
            try:
                dumps_by_value(env_fns[i])
            except Exception as e:
                raise TypeError(
                    f"env_fns[{i}] cannot be pickled to send it to the workers "
                    f"({type(e).__name__}: {e}); make the factory a plain function or "
                    "lambda that creates the env, without capturing open files, locks or clients"
                ) from e
        raise


# --------------------------------------------------------------------------- scale-down
class KeepEnvWorkers(SchedulerPlugin):
    """Scheduler plugin: keep workers holding daskvec envs out of adaptive scale-down.

    ``Adaptive`` (and anything else using ``Scheduler.workers_to_close``) asks plugins
    which workers may go. This plugin removes the workers that hold daskvec env
    groups, as long as other candidates remain; if only env-holding workers remain,
    they are left in the list, and the envs on them are rebuilt elsewhere by
    DaskVecEnv's fault tolerance (reported to the learner as truncations).
    ``SpecCluster.scale(n)`` does not ask plugins; envs on workers it closes are
    rebuilt the same way.
    """

    name = "daskvec-keep-env-workers"
    #: Registering it again (one per DaskVecEnv) keeps the first instance, silently.
    idempotent = True

    @staticmethod
    def holds_envs(ws: Any) -> bool:
        """Whether a scheduler ``WorkerState`` holds any daskvec env group."""
        return group_actors_on(ws) > 0

    def valid_workers_downscaling(self, scheduler: Any, workers: list[Any]) -> list[Any]:
        """Drop env-holding workers from ``workers`` unless nothing else could go."""
        free = [ws for ws in workers if not self.holds_envs(ws)]
        return free if free else workers
