"""Exceptions raised by daskvec.

Every error that daskvec raises on its own account derives from
:class:`DaskVecEnvError`. The call-order errors also derive from Gymnasium's own
(``ClosedEnvironmentError``, ``AlreadyPendingCallError``, ``NoAsyncCallError``), so that
code written for ``gymnasium.vector.AsyncVectorEnv`` catches them as it catches
Gymnasium's, and code written for daskvec as before. Errors raised *by an environment* on a worker are
re-raised on the client with their original type (an ``AttributeError`` stays an
``AttributeError``); daskvec only adds notes saying which env on which worker raised
it and how to see the full traceback, and sets ``exc.env_index``, ``exc.worker`` and
``exc.remote_traceback`` (the traceback formatted on the worker, also logged by the
``daskvec`` logger at DEBUG). The same holds for an exception raised by an env factory.
"""

from __future__ import annotations

from gymnasium import error as gym_error

__all__ = [
    "AlreadySteppingError",
    "ClosedEnvError",
    "DaskVecEnvError",
    "EnvBuildError",
    "EnvBuildTimeoutError",
    "EnvRestartBudgetExceeded",
    "MissingMainGuardError",
    "NoAsyncCallError",
    "RemoteEnvError",
    "SchedulerLostError",
    "StepTimeoutError",
    "WorkerLostError",
]


class DaskVecEnvError(RuntimeError):
    """Base class of the errors that daskvec raises itself."""


class ClosedEnvError(DaskVecEnvError, gym_error.ClosedEnvironmentError):
    """A method was called on a vec env after ``close()``.

    Also a ``gymnasium.error.ClosedEnvironmentError``.
    """


class _PendingCallError(DaskVecEnvError):
    """Gymnasium's call-order errors carry the name of the call concerned (``"step"``, ``"reset"``, ...)."""

    name: str

    def __init__(self, message: str, name: str = "step") -> None:
        super().__init__(message)
        self.name = name

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (str(self), self.name))


class AlreadySteppingError(_PendingCallError, gym_error.AlreadyPendingCallError):
    """A call was made while another (a step, a reset, a call) is still pending.

    Collect the pending one first (``step_wait()``, ``reset_wait()``, ``call_wait()``,
    or ``recv()`` for partial batches). Also a ``gymnasium.error.AlreadyPendingCallError``.

    Attributes
    ----------
    name : str
        The pending call (``"step"``, ``"reset"``, ``"call"`` or ``"recv"``).
    """


class NoAsyncCallError(_PendingCallError, gym_error.NoAsyncCallError):
    """A ``*_wait()`` (or ``recv()``) was called without its ``*_async()`` (or ``send()``) first.

    Also a ``gymnasium.error.NoAsyncCallError``.

    Attributes
    ----------
    name : str
        The call that was waited for (``"step"``, ``"reset"``, ``"call"`` or ``"recv"``).
    """


class WorkerLostError(DaskVecEnvError):
    """The worker holding some environments died or could not be reached.

    Raised only when the vec env was built with ``on_worker_lost="raise"``;
    by default lost environments are rebuilt on live workers instead.

    Attributes
    ----------
    env_indices : list of int
        The environments that were lost.
    worker : str
        Address of the worker that held them.
    """

    def __init__(self, message: str, env_indices: list[int], worker: str) -> None:
        super().__init__(message)
        self.env_indices = env_indices
        self.worker = worker

    def __reduce__(self) -> tuple[type, tuple[str, list[int], str]]:
        return (type(self), (str(self), self.env_indices, self.worker))


class SchedulerLostError(DaskVecEnvError):
    """The cluster's scheduler died or did not answer within the timeout.

    Without its scheduler a cluster can neither place nor rebuild envs (and a killed
    scheduler takes its workers down with it), so the vec env fails stop: it is broken,
    every later call raises, and ``close()`` returns promptly without waiting for the
    cluster. Create a new vec env once the scheduler is back.

    Attributes
    ----------
    address : str
        The scheduler's address.
    """

    def __init__(self, message: str, address: str = "") -> None:
        super().__init__(message)
        self.address = address

    def __reduce__(self) -> tuple[type, tuple[str, str]]:
        return (type(self), (str(self), self.address))


class StepTimeoutError(WorkerLostError):
    """A call to some environments did not come back within the timeout.

    Raised only with ``on_worker_lost="raise"``; by default the environments are
    treated like lost ones and rebuilt elsewhere.
    """


class EnvRestartBudgetExceeded(DaskVecEnvError):
    """An environment was restarted more often than ``max_restarts`` allows.

    This stops an environment that crashes on every step from looping forever.

    Attributes
    ----------
    env_index : int
        The environment that exhausted its budget.
    restarts : int
        How many times it had been restarted.
    """

    def __init__(self, message: str, env_index: int, restarts: int) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.restarts = restarts

    def __reduce__(self) -> tuple[type, tuple[str, int, int]]:  # raised on workers, sent to the client
        return (type(self), (str(self), self.env_index, self.restarts))


class RemoteEnvError(DaskVecEnvError):
    """Stand-in for an environment exception that could not be sent back as is.

    Used only when the original exception object cannot be pickled; its type name,
    message and traceback are kept in the message and in ``remote_type``.
    """

    def __init__(self, message: str, remote_type: str = "") -> None:
        super().__init__(message)
        self.remote_type = remote_type


class EnvBuildError(DaskVecEnvError):
    """Building some environments failed in a way that retrying elsewhere would not fix.

    Raised when a factory killed the process building it (``os._exit``, a crash of the
    interpreter) again after one retry on another worker.

    Attributes
    ----------
    env_indices : list of int
        The environments that were being built.
    """

    def __init__(self, message: str, env_indices: list[int]) -> None:
        super().__init__(message)
        self.env_indices = env_indices

    def __reduce__(self) -> tuple[type, tuple[str, list[int]]]:  # raised on workers, sent to the client
        return (type(self), (str(self), self.env_indices))


class EnvBuildTimeoutError(EnvBuildError):
    """A factory did not return within ``timeout``; it is not retried on other workers.

    The thread (or env process) running the factory is abandoned (killed), so that the
    worker stays free for other work.
    """


class MissingMainGuardError(DaskVecEnvError):
    """An embedded cluster was about to start from code that every worker process would run again.

    Dask starts the embedded cluster's worker processes with multiprocessing's
    ``spawn``, which imports the main script again in each of them; code at the top
    level of that script, outside ``if __name__ == "__main__":``, would then try to
    start a cluster in every worker. A main script with no file (read from standard
    input, ``python - < script.py``) cannot be imported again at all. Raised before
    any process is started.
    """
