"""The group pool: the env-group actors of one vec env, and the requests sent to them.

:class:`GroupPool` creates groups on the workers a layout names (trying other workers
when one vanishes), connects each with a channel (:mod:`daskvec.transport`), sends one
request per group and hands out the replies as they are read (:meth:`GroupPool.collect`
is an iterator of ``(group, reply)``), recording in a
:class:`~daskvec._core.handles.StepOutcome` what every group answered: the env errors, and the
groups lost or timed out. Collecting can be interrupted (Ctrl-C) and resumed: replies
already read are not waited for again. The pool knows nothing of Stable-Baselines3; what a reply means
for the learner is :mod:`daskvec.sb3.buffers`' business, and what to do about a lost group
is :mod:`daskvec._core.recovery`'s. The records it keeps (each group's :class:`~daskvec._core.handles.Group`
handle, a :class:`~daskvec._core.handles.PendingRequest` per request not answered yet) are in
:mod:`daskvec._core.handles`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import time
import uuid
from collections.abc import Callable, Collection, Generator, Sequence
from typing import Any, Protocol

import numpy as np

from daskvec._core import dask_internals as _dask
from daskvec._core.directory import Layout, WorkerDirectory
from daskvec._core.handles import Group, PendingRequest, StepOutcome, WorkerFrozen, answers
from daskvec._core.options import Options
from daskvec._core.user_errors import mark, shorten
from daskvec.cluster import clients as _cluster
from daskvec.errors import DaskVecEnvError, EnvBuildError, SchedulerLostError, WorkerLostError
from daskvec.protocol.messages import (
    GROUP_KEY_PREFIX,
    Command,
    GroupDesc,
    GroupSpec,
    RemoteError,
    Request,
    StepReply,
    StepRequest,
)
from daskvec.transport import (
    ActorChannel,
    Channel,
    ChannelError,
    DirectChannel,
    iter_replies,
    machine_id,
    recv_many,
    wait_ready,
)
from daskvec.transport.window import supported as window_supported
from daskvec.worker import EnvGroup, EnvHost, factory_name, kill_env_process

logger = logging.getLogger(__name__)

__all__ = ["GroupPool", "RestartHistory"]

#: Seconds the client waits for a group beyond ``timeout``: a factory that hangs is
#: reported by the worker (which gives up after ``timeout``), not taken for a dead worker.
_BUILD_MARGIN = 10.0


class RestartHistory(Protocol):
    """What a new group needs to know of its envs' past (:class:`daskvec._core.recovery.RestartLedger`)."""

    restart_counts: np.ndarray
    error_restarts: np.ndarray
    base_seeds: list[int | None]


#: Workers this process warned about Dask's profiler (:meth:`GroupPool._warn_profiler`): once,
#: not once per vec env on the same cluster.
_PROFILER_WARNED: set[str] = set()


class GroupPool:
    """The env groups of one vec env: create, connect, call, step and tear down.

    Parameters
    ----------
    client : distributed.Client
        The client of the cluster.
    env_fns : list of callable
        Every env's factory (pickled for the workers that build them).
    options : Options
        The vec env's options.
    directory : WorkerDirectory
        Where to find workers when a group must be placed again.
    autoreset : str
        When the groups reset finished envs (a :class:`daskvec.protocol.messages.Autoreset`
        value); Stable-Baselines3's ``"SameStep"`` by default.
    always_pass_options : bool
        Whether the groups call ``env.reset(seed=..., options=...)`` always (Gymnasium's
        way, see :class:`daskvec.protocol.messages.GroupSpec`) or ``options=`` only when given.
    vector : bool
        ``env_fns`` are factories of vectorized envs: each makes one group of its own,
        which is never split nor merged (:meth:`spawn_vectors` creates and numbers them).
    """

    def __init__(
        self,
        client: Any,
        env_fns: list[Callable[[], Any]],
        options: Options,
        directory: WorkerDirectory,
        autoreset: str = "SameStep",
        always_pass_options: bool = False,
        vector: bool = False,
    ):
        self.client = client
        # how the face wants its groups to reset envs, given to every group created
        self.autoreset = autoreset
        self.always_pass_options = always_pass_options
        self.env_fns = env_fns
        self.options = options
        self.directory = directory
        self.transport = options.transport
        self.groups: list[Group] = []
        #: Workers of the spawn under way that run Dask's profiler (:meth:`_warn_profiler`).
        self._profiling: list[str] = []
        # the requests whose replies were not handed out yet, one per group id: a request
        # sent to every group of a batch (a step, a rollout, collected together by
        # collect()) or a step of a group stepping on its own (a partial batch, handed out
        # by collect_ready())
        self._pending: dict[str, PendingRequest] = {}
        self.vector = vector
        # a vector pool's groups, by their env indices: the factory that builds each; before
        # spawn_vectors() has numbered the envs, a group's placeholder indices are [factory]
        self._units: dict[tuple[int, ...], int] = {}
        self._numbered = not vector
        # groups given up because their worker left another group's request unanswered, with why:
        # their next request is recorded as lost at once instead of being sent (see doom())
        self._doomed: dict[str, str] = {}

    # ------------------------------------------------------------------ views
    def load(self) -> dict[str, int]:
        """Envs held per worker."""
        load: dict[str, int] = {}
        for g in self.groups:
            load[g.worker] = load.get(g.worker, 0) + len(g.env_indices)
        return load

    def by_env(self) -> dict[int, tuple[Group, int]]:
        """For each env index: its group and its position in it."""
        return {i: (g, pos) for g in self.groups for pos, i in enumerate(g.env_indices)}

    def summary(self) -> str:
        """How many groups use each transport and socket, e.g. ``"direct/unix x2"``."""
        kinds: dict[str, int] = {}
        for g in self.groups:
            kinds[g.transport] = kinds.get(g.transport, 0) + 1
        return ", ".join(f"{k} x{v}" for k, v in sorted(kinds.items()))

    # ------------------------------------------------------------------ create
    def spawn(self, layout: Layout, history: RestartHistory, exclude: Sequence[str] = ()) -> list[Group]:
        """Create one group per ``(env_indices, worker)`` and add them to the pool.

        A group whose worker vanishes or does not answer is tried on another worker;
        an exception raised by a factory is raised here. ``history`` (the restart
        ledger) gives each env's restarts so far and the seed the user gave it: a group
        restarting an env after an error derives its seed from them and counts the
        error restarts against ``max_restarts``.
        """
        deadline = time.monotonic() + max(self.options.timeout + _BUILD_MARGIN, self.options.worker_wait_timeout)
        pending = list(layout)
        created: list[Group] = []
        bad: set[str] = set(exclude)
        crashed: dict[tuple[int, ...], list[str]] = {}  # envs -> workers lost while building them
        try:
            while pending:
                attempt = [self._submit(indices, worker, history) for indices, worker in pending]
                retry: list[list[int]] = []
                # the first group to fail on a worker answers for the attempt's other groups there:
                # they are not each waited for (a second a group on a dead worker), and a worker lost
                # counts against every group that was being built on it (_check_crash)
                failed: dict[str, Exception] = {}
                skipped: dict[str, list[list[int]]] = {}
                for indices, worker, token, key, fut in attempt:
                    try:
                        if worker in failed:
                            raise failed[worker]
                        created.append(self._connect(indices, worker, token, key, fut, deadline))
                    except Exception as e:
                        if isinstance(e, SchedulerLostError):  # nowhere to place anything
                            raise
                        if _is_placement_failure(e) and not isinstance(e, TimeoutError):
                            e = self._check_crash(crashed.setdefault(tuple(indices), []), indices, worker, e)
                        if not _is_placement_failure(e):
                            for *_, other in attempt:  # a factory raised: drop every group of this attempt
                                with contextlib.suppress(Exception):
                                    other.cancel()
                            notes = getattr(e, "__notes__", [])
                            # which envs, where the worker's note (plain envs) or an EnvBuildError did not say;
                            # a vector env's worker knows no position in vector_env_fns, which this note gives
                            named = any("daskvec: raised by the factory of env" in n for n in notes)
                            if not isinstance(e, EnvBuildError) and not named:
                                e.add_note(f"daskvec: while building {self._what(indices)} on {worker}")
                            if isinstance(e, EnvBuildError):  # daskvec's own words say what to do
                                raise mark(e) from None
                            raise shorten(e, "fix the factory") from None
                        with contextlib.suppress(Exception):
                            fut.cancel()
                        retry.append(indices)
                        if worker in failed:
                            skipped.setdefault(worker, []).append(indices)
                            continue
                        logger.warning(
                            "could not create env group %s on %s (%s); trying another worker", indices, worker, e
                        )
                        failed[worker] = e
                        bad.add(worker)
                        if isinstance(e, TimeoutError):  # alive but not answering: do not try it again soon
                            self.directory.quarantine(
                                worker, f"did not create an env group within {self.options.timeout:.0f}s"
                            )
                for worker, groups in skipped.items():
                    logger.warning("not creating env groups %s on %s either; trying other workers", groups, worker)
                if retry and time.monotonic() > deadline:
                    lost = [i for r in retry for i in r]
                    raise WorkerLostError(f"could not place envs {lost} on any worker", env_indices=lost, worker="")
                if retry:
                    pending = self.directory.assign(
                        retry, self.directory.wait_for_workers(exclude=sorted(bad)), self.load()
                    )
                else:
                    pending = []
        except BaseException:
            self.teardown(created, graceful=False)
            raise
        finally:  # the groups made before a failure were placed too: their workers are named
            self._warn_profiler()
        return created

    def spawn_vectors(self, workers: list[str], history: RestartHistory) -> list[Group]:
        """Create one group per vector factory on ``workers``, then number their envs in factory order.

        A vector env's size is known only once it is built, so the groups are created
        with placeholder indices (``[k]`` for factory ``k``, never sent to the workers)
        and then told their envs' vec-env indices (``Command.NUMBER``): factory 0's envs
        come first.

        Raises
        ------
        DaskVecEnvError
            A group could not be told its indices (its worker was lost at once).
        """
        if self._numbered:
            raise RuntimeError("daskvec internal error: spawn_vectors() on a numbered pool")
        placeholders = [[k] for k in range(len(self.env_fns))]
        self._units = {(k,): k for k in range(len(self.env_fns))}
        created = self.spawn(self.directory.assign(placeholders, workers, {}), history)
        try:
            start = 0
            units: dict[tuple[int, ...], int] = {}
            for g in sorted(created, key=lambda g: g.env_indices[0]):
                n = len(g.desc.observation_spaces)
                unit = g.env_indices[0]
                g.renumber(list(range(start, start + n)))
                units[tuple(g.env_indices)] = unit
                start += n
            self._units, self._numbered = units, True
            replies = self.call({g: (Command.NUMBER, (list(g.env_indices),)) for g in created}, self.options.timeout)
            failed = {g: r for g, r in replies.items() if isinstance(r, (BaseException, RemoteError))}
            if failed:
                g, why = next(iter(failed.items()))
                raise DaskVecEnvError(f"the vector env group of envs {g.env_indices} on {g.worker} failed: {why}")
        except BaseException:
            self.teardown(created, graceful=False)
            raise
        self.groups.sort(key=lambda g: g.env_indices[0])
        return created

    def _check_crash(self, lost: list[str], indices: list[int], worker: str, exc: Exception) -> Exception:
        """``exc``, or an :class:`EnvBuildError` when building ``indices`` lost a second worker.

        One worker lost during a build may be bad luck; two in a row for the same envs
        is their factory killing its process (``os._exit``, a crash), which retrying on
        every worker would only repeat.
        """
        lost.append(worker)
        if len(lost) < 2:
            return exc
        err = EnvBuildError(
            f"building {self._what(indices)} ended the process building them on "
            f"{len(lost)} workers in a row ({', '.join(lost)}): the factory calls os._exit or crashes the "
            "interpreter. Fix the factory; env_process=True keeps such crashes out of the workers",
            env_indices=[] if self.vector and not self._numbered else list(indices),
        )
        err.__cause__ = exc
        return err

    def _what(self, indices: Sequence[int]) -> str:
        """What is being built, for messages: envs and their factories, or a vector env factory not built yet."""
        names = ", ".join(self._factory_names(indices))
        if self.vector and not self._numbered:  # placeholder indices: the factory's position
            return f"vector env factory {indices[0]} of vector_env_fns ({names})"
        return f"envs {list(indices)} (factory {names})"

    def _factory_names(self, indices: Sequence[int]) -> list[str]:
        """The names of the factories that build the envs ``indices`` (for messages)."""
        fns = [self.env_fns[self._units[tuple(indices)]]] if self.vector else [self.env_fns[i] for i in indices]
        return sorted({factory_name(fn) for fn in fns})

    def _factories(self, indices: list[int]) -> bytes:
        """The pickled factories of a group holding the envs ``indices``."""
        if not self.vector:
            return _cluster.dumps_factories(self.env_fns, indices)
        unit = self._units.get(tuple(indices))
        if unit is None:  # a plan that splits or merges vector groups: a bug, never a user's mistake
            raise RuntimeError(f"daskvec internal error: envs {indices} are not the envs of one vector env")
        return _cluster.dumps_factories(self.env_fns, [unit])

    def _submit(self, indices: list[int], worker: str, history: RestartHistory) -> tuple[Any, ...]:
        token = secrets.token_bytes(32) if self.transport != "actor" else None
        key = f"{GROUP_KEY_PREFIX}{uuid.uuid4().hex}"
        known = self._numbered  # a vector group built for the first time learns its indices afterwards
        spec = GroupSpec(
            env_indices=tuple(indices) if known else (),
            token=token,
            on_env_error=self.options.on_env_error,
            max_restarts=self.options.max_restarts,
            error_restarts=tuple(int(history.error_restarts[i]) for i in indices) if known else None,
            rebuilds=tuple(int(history.restart_counts[i]) for i in indices) if known else None,
            base_seeds=tuple(history.base_seeds[i] for i in indices) if known else None,
            busy_poll=self.options.busy_poll,
            shared_memory=None if window_supported() else False,  # this client can read a window: the worker decides
            send_masks=self.options.cache_action_masks,
            autoreset=self.autoreset,
            always_pass_options=self.always_pass_options,
            tls=self.options.encrypted,  # the group's TCP channel speaks TLS
            build_timeout=self.options.timeout,  # the worker gives up first (_BUILD_MARGIN)
            vector=self.vector,
        )
        fut = self.client.submit(
            EnvHost if self.options.env_process else EnvGroup,
            self._factories(indices),
            spec,
            actor=True,
            workers=[worker],
            allow_other_workers=False,
            key=key,
            pure=False,
        )
        return indices, worker, token, key, fut

    def _connect(
        self, indices: list[int], worker: str, token: bytes | None, key: str, fut: Any, deadline: float
    ) -> Group:
        timeout = min(self.options.timeout + _BUILD_MARGIN, max(deadline - time.monotonic(), 1.0))
        # as_current: the Actor proxy binds to the client current when it is
        # unpickled; without it a client made with set_as_default=False is not found
        with self.client.as_current():
            actor = self._await_actor(fut, worker, timeout)
        desc = actor.describe().result(timeout=timeout)
        group = Group(key, list(indices), desc.worker, fut, actor, self._channel(actor, desc, token), desc)
        self.directory.learn_deadline(group.worker, group.deadline)
        if desc.profiler_hazard:  # warned about once for every worker of this spawn, at its end
            self._profiling.append(str(desc.worker))
        self.groups.append(group)
        return group

    def _await_actor(self, fut: Any, worker: str, timeout: float) -> Any:
        """Wait for an actor to be created on ``worker``, giving up early if the worker leaves.

        A task pinned to a worker that dies stays pending forever; checking once a
        second that the worker is still known to the scheduler turns that into an
        ``OSError`` (a placement failure, so the group is tried elsewhere).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                return fut.result(timeout=max(min(1.0, deadline - time.monotonic()), 0.01))
            except TimeoutError:
                if time.monotonic() >= deadline:
                    raise
            if not self.directory.alive(worker):
                raise OSError(f"worker {worker} left before the env group was created on it")

    def _channel(self, actor: Any, desc: GroupDesc, token: bytes | None) -> Channel:
        if self.transport == "actor" or token is None or desc.address is None:
            return ActorChannel(actor)
        timeout = min(self.options.timeout, 5.0)
        # a group that stops reading holds a request no longer than any reply may take
        send_timeout = max(self.options.timeout, self.options.step_timeout)
        secured_worker = _cluster.address_scheme(str(desc.worker)) not in _cluster.PLAIN_SCHEMES
        if secured_worker and not self.options.encrypted and self.transport != "direct-insecure":
            # a secured worker joined a cluster that looked plain: never plaintext to it unasked
            logger.warning("worker %s is secured; using Dask actor calls for its envs", desc.worker)
            return ActorChannel(actor)
        ssl_context = _cluster.client_ssl_context(self.client) if self.options.encrypted else None
        if ssl_context is None and desc.unix_path and desc.machine == machine_id():
            try:
                return DirectChannel(desc.unix_path, token, connect_timeout=timeout, send_timeout=send_timeout)
            except ChannelError as e:  # e.g. a container that shares the host name, not the files
                logger.debug("Unix socket of the env group on %s unusable (%s); using TCP", desc.worker, e)
        try:
            return DirectChannel(
                tuple(desc.address), token, connect_timeout=timeout, ssl_context=ssl_context, send_timeout=send_timeout
            )
        except ChannelError as e:
            if self.transport in ("direct", "direct-insecure"):
                raise DaskVecEnvError(
                    f"cannot open a direct channel to the env group on {desc.worker} ({e}); "
                    "use transport='auto' to fall back to Dask actor calls"
                ) from e
            logger.warning("direct channel to %s unavailable (%s); using Dask actor calls", desc.worker, e)
            return ActorChannel(actor)

    def _warn_profiler(self) -> None:
        """Warn once, naming them all, about the workers of the last spawn that run Dask's profiler on CPython 3.11.

        One line for the cluster rather than one per worker: the cause and the fix are
        the same for every worker of a cluster (see ``profiler_hazard``). A worker is
        named once per process, not again by later vec envs on the same cluster. The
        warning ends with the one line that turns the profiler off where these workers
        get their config: before a ``LocalCluster`` of this process is created, or in
        the environment of ``dask worker``.
        """
        workers = sorted(set(self._profiling) - _PROFILER_WARNED)
        self._profiling.clear()
        if not workers:
            return
        _PROFILER_WARNED.update(workers)
        from distributed import LocalCluster

        if isinstance(getattr(self.client, "cluster", None), LocalCluster):
            fix = (
                'add `dask.config.set({"distributed.worker.profile.enabled": False})` before creating '
                "the LocalCluster (its workers start with this process's Dask config)"
            )
        else:
            fix = (
                "start the workers with DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False in their environment "
                "(`DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False dask worker ...`, or "
                "distributed.worker.profile.enabled: false in their Dask config)"
            )
        who = f"worker {workers[0]} runs" if len(workers) == 1 else f"workers {', '.join(workers)} run"
        logger.warning(
            "%s Dask's profiler on Python 3.11, where sampling thread stacks can deadlock a worker "
            "while env groups start their threads (python/cpython#106883); %s, or use Python 3.12+",
            who,
            fix,
        )

    # ------------------------------------------------------------------ frozen workers
    def doom(self, worker: str, why: str, spare: Collection[Group] = ()) -> list[Group]:
        """Give up every group on ``worker`` but ``spare``: each request to them counts as lost at once.

        A worker that left one group's request unanswered for ``step_timeout`` is frozen
        (or stuck in a hung step), and so are its other groups: waiting for each of
        them in turn would cost one ``step_timeout`` per group. So their requests in
        flight end now, and the next request sent to them is not sent: its reply is a
        :class:`~daskvec._core.handles.WorkerFrozen`, which the engine rebuilds as a
        timeout. Groups created on the worker later are not touched. Returns the
        groups given up.
        """
        doomed = [g for g in self.groups if g.worker == worker and g not in spare]
        for g in doomed:
            self._doomed[g.gid] = why
            pending = self._pending.get(g.gid)
            if pending is not None and pending.waiting:
                pending.reply = WorkerFrozen(why)
        return doomed

    def _given_up(self, pending: PendingRequest) -> bool:
        """Whether ``pending`` goes to a doomed group: its reply is then the loss, and nothing is sent."""
        why = self._doomed.get(pending.group.gid)
        if why is None:
            return False
        if pending.waiting:
            pending.reply = WorkerFrozen(why)
        return True

    # ------------------------------------------------------------------ release
    def teardown(self, groups: Sequence[Group], graceful: bool) -> None:
        """Release ``groups`` and remove them from the pool.

        ``graceful``: ask their actors to shut down. Otherwise (lost, hung) they are
        not asked anything, since a hung group's actor may be stuck in the call that
        hung; their env processes, if their workers still run, are killed by the
        worker itself (a plain ``Client.run``, which does not queue behind actor calls).
        """
        bound = min(self.options.timeout, 10.0)
        doomed = [(g.worker, g.desc.env_pid) for g in groups if g.desc.env_pid is not None] if not graceful else []
        if doomed:
            with contextlib.suppress(Exception):
                alive = _cluster.scheduler_workers(self.client, bound)
                for worker, env_pid in doomed:
                    if worker in alive:
                        self.client.run(kill_env_process, env_pid, workers=[worker], callback_timeout=bound)
        if graceful:
            futs = []
            for g in groups:
                g.channel.close()
                with contextlib.suppress(Exception):
                    futs.append(g.actor.shutdown())
            deadline = time.monotonic() + bound  # one bound for all of them, not one each
            for f in futs:
                with contextlib.suppress(Exception):
                    f.result(timeout=max(deadline - time.monotonic(), 0.01))
        for g in groups:
            g.channel.close()
            with contextlib.suppress(Exception):
                g.future.cancel()
        self.groups = [g for g in self.groups if g not in groups]
        for g in groups:
            self._pending.pop(g.gid, None)
            self._doomed.pop(g.gid, None)

    def close(self, abandon: bool = False, abandon_in_flight: bool = False) -> None:
        """Release every group: those with a request in flight that does not end in time are dropped.

        ``abandon``: ask no group anything (the cluster is gone): drop them all at once.
        ``abandon_in_flight``: drop the groups with a request in flight at once, without
        waiting for it to end.
        """
        if abandon:
            self._pending.clear()
            self.teardown(list(self.groups), graceful=False)
            return
        waiting = [f.group for f in self._pending.values() if f.waiting]
        if abandon_in_flight:
            self._pending.clear()
            self.teardown(waiting, graceful=False)
            self.teardown(list(self.groups), graceful=True)
            return
        deadline = time.monotonic() + min(self.options.step_timeout, 30.0)
        late = sorted(i for g in _unanswered(waiting, min(deadline - time.monotonic(), 1.0)) for i in g.env_indices)
        if late:  # a Ctrl-C'd step or rollout: say why close() waits
            logger.warning(
                "close(): envs %s have not finished the request in flight; waiting up to %.0fs more for "
                "them, then abandoning them",
                late,
                max(deadline - time.monotonic(), 0.0),
            )
        replies = recv_many([g.channel for g in waiting], max(deadline - time.monotonic(), 0.0))
        # a group that did not answer (hung env, dead worker) is abandoned, not asked to shut down
        stuck = [g for g, r in zip(waiting, replies, strict=True) if isinstance(r, BaseException)]
        stuck += [f.group for f in self._pending.values() if not f.waiting and isinstance(f.reply, BaseException)]
        # a frozen worker's groups are not asked to shut down: that would wait out the bound on each
        stuck += [g for g in self.groups if g.gid in self._doomed and g not in stuck]
        self._pending.clear()
        self.teardown(stuck, graceful=False)
        self.teardown(list(self.groups), graceful=True)

    # ------------------------------------------------------------------ calls
    def call(self, requests: dict[Group, Request], timeout: float) -> dict[Group, Any]:
        """Send one request per group and wait once for all replies (values or exceptions)."""
        sent: list[Group] = []
        out: dict[Group, Any] = {}
        for g, request in requests.items():
            if g.gid in self._doomed:
                out[g] = WorkerFrozen(self._doomed[g.gid])
                continue
            try:
                g.channel.send(request)
                sent.append(g)
            except ChannelError as e:
                out[g] = e
        for g, rep in zip(sent, recv_many([g.channel for g in sent], timeout), strict=True):
            out[g] = rep
        return out

    # ------------------------------------------------------------------ steps
    @property
    def stepping(self) -> bool:
        """Whether a request sent by :meth:`send` (a step, a rollout) was not collected yet."""
        return any(p.batch for p in self._pending.values())

    def send_step(self, actions: Any) -> None:
        """Send each group its actions (rows of ``actions``); do not wait."""
        arr = actions if isinstance(actions, np.ndarray) else None

        def request(g: Group) -> StepRequest:
            return StepRequest(arr[g.index] if arr is not None else [actions[i] for i in g.env_indices])

        self.send(request)

    def send(self, request: Callable[[Group], Request], groups: Sequence[Group] | None = None) -> None:
        """Send ``request(group)`` to each of ``groups`` (default: all); do not wait.

        The replies are then read by :meth:`collect` (a step, a rollout: any request
        whose replies are collected as one outcome).
        """
        if self._pending:
            raise RuntimeError("daskvec internal error: send() while requests are in flight")
        now = time.monotonic()
        for g in self.groups if groups is None else groups:
            pending = self._pending[g.gid] = PendingRequest(g, now, batch=True)
            if self._given_up(pending):
                continue
            try:
                g.channel.send(request(g))
            except ChannelError as e:
                pending.reply = e

    def collect(
        self, timeout: float, outcome: StepOutcome, kind: type = StepReply
    ) -> Generator[tuple[Group, Any], None, None]:
        """The replies of what :meth:`send` sent: ``(group, reply)`` for each ``kind`` reply, as soon as it is read.

        Once every reply is in, each group's (those read before an interruption too) is
        recorded in ``outcome``: env errors, lost groups. Close the iterator when the loop
        over it stops early (``contextlib.closing``): if the loop raised (say, observations
        that do not fit), the other replies are then read and dropped, so that the channels
        stay in step. If the wait itself is interrupted (Ctrl-C), the request stays
        pending: the next call reads only the replies still missing.
        """
        pending = [p for p in self._pending.values() if p.batch]
        if not pending:
            raise RuntimeError("daskvec internal error: collect() without send()")
        waiting = [p for p in pending if p.waiting]
        replies = iter_replies([p.group.channel for p in waiting], timeout)
        try:
            for p in waiting:
                p.reply = next(replies)
                if answers(p.reply, kind):
                    yield p.group, p.reply
        except GeneratorExit:  # the caller's loop stopped: read the rest, so that the channels stay in step
            for _ in replies:
                continue
            self._forget(pending)
            raise
        self._forget(pending)
        for p in pending:
            outcome.record(p.group, p.reply, kind)

    def all_ready(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds until every group sent a request by :meth:`send` has its reply in.

        Nothing is read: :meth:`collect` reads the replies. A group whose worker is gone
        counts as ready (its channel reports it).
        """
        return not self.unanswered(timeout)

    def unanswered(self, timeout: float) -> list[Group]:
        """:meth:`all_ready`, returning the groups whose reply is still not in after ``timeout`` seconds."""
        return _unanswered([p.group for p in self._pending.values() if p.batch and p.waiting], timeout)

    def _forget(self, answered: Sequence[PendingRequest]) -> None:
        """Drop the requests whose replies were handed out."""
        for p in answered:
            self._pending.pop(p.group.gid, None)

    # ------------------------------------------------------------------ partial batches
    def in_flight(self) -> list[Group]:
        """Groups sent a step with :meth:`send_groups` whose reply was not handed out yet."""
        return [p.group for p in self._pending.values() if not p.batch]

    def send_groups(self, actions: dict[Group, Any]) -> None:
        """Send a step to each of the given groups (their actions in their envs' order); do not wait.

        Each group then steps on its own: :meth:`collect_ready` hands out the groups that
        answer first.
        """
        if self.stepping:
            raise RuntimeError("daskvec internal error: send_groups() while a full step is pending")
        now = time.monotonic()
        for g, group_actions in actions.items():
            if g.gid in self._pending:
                raise RuntimeError(f"daskvec internal error: envs {g.env_indices} already have a step in flight")
            pending = self._pending[g.gid] = PendingRequest(g, now, batch=False)
            if self._given_up(pending):
                continue
            try:
                g.channel.send(StepRequest(group_actions))
            except ChannelError as e:
                pending.reply = e

    def collect_ready(
        self, min_envs: int, timeout: float, outcome: StepOutcome
    ) -> Generator[tuple[Group, StepReply], None, None]:
        """The step replies of the groups in flight that answer first, until they hold ``min_envs`` envs or more.

        Every group of the batch (in the order they answered) is recorded in ``outcome``
        (``outcome.groups``), then each step reply is handed out as ``(group, reply)``. A
        group that has not answered ``timeout`` seconds after its step was sent counts as
        lost (``TimeoutError``). Groups that answered beyond the batch are kept for the
        next call.
        """
        mine = [p for p in self._pending.values() if not p.batch]
        if not mine:
            raise RuntimeError("daskvec internal error: collect_ready() without send_groups()")
        done = [p for p in mine if not p.waiting]
        while sum(len(p.group.env_indices) for p in done) < min_envs:
            waiting = [p for p in mine if p.waiting]
            if not waiting:
                break
            first_deadline = min(p.sent for p in waiting) + timeout
            for k in wait_ready([p.group.channel for p in waiting], max(first_deadline - time.monotonic(), 0.0)):
                done.append(self._read(waiting[k], waiting[k].sent + timeout))
            now = time.monotonic()
            for p in waiting:
                if p.waiting and now >= p.sent + timeout:
                    p.reply = TimeoutError(f"no reply within {timeout:.1f}s")
                    done.append(p)
        batch: list[PendingRequest] = []
        for p in done:  # the first to answer, up to min_envs; the others wait for the next call
            if sum(len(b.group.env_indices) for b in batch) >= min_envs:
                break
            batch.append(p)
        self._forget(batch)
        answered = [p for p in batch if outcome.record(p.group, p.reply)]
        for p in answered:
            yield p.group, p.reply

    @staticmethod
    def _read(pending: PendingRequest, deadline: float) -> PendingRequest:
        try:
            pending.reply = pending.group.channel.recv(max(deadline - time.monotonic(), 0.1))
        except (ChannelError, TimeoutError) as e:
            pending.reply = e
        return pending


def _is_placement_failure(exc: BaseException) -> bool:
    """Whether creating a group failed because of its worker (retry elsewhere), not the env."""
    return isinstance(exc, (TimeoutError, OSError, *_dask.placement_errors())) or _dask.is_actor_lost(exc)


def _unanswered(waiting: list[Group], timeout: float) -> list[Group]:
    """Those of ``waiting`` whose reply is still not in after ``timeout`` seconds (nothing is read)."""
    deadline = time.monotonic() + timeout
    while waiting:
        ready = set(wait_ready([g.channel for g in waiting], max(deadline - time.monotonic(), 0.0)))
        if not ready:
            return waiting
        waiting = [g for k, g in enumerate(waiting) if k not in ready]
    return []
