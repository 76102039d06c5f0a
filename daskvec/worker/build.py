"""Building a group's envs from their factories, on the worker.

An :class:`~daskvec.worker.env_group.EnvGroup` gets its envs' factories pickled; this module
calls them: one env per factory (:func:`build_envs`, :func:`build_env`, which checks
that each returns a new env), or the group's one vectorized env (:func:`build_vector`).
With a build timeout the factories run on a thread of their own (:func:`build_group`),
abandoned when they take longer, so that a hanging factory frees the worker's task
thread and is named in an :class:`~daskvec.errors.EnvBuildTimeoutError`. What a factory
raises carries a note naming its env and worker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from daskvec.errors import EnvBuildError, EnvBuildTimeoutError
from daskvec.protocol.messages import Autoreset, format_traceback
from daskvec.worker.envs import factory_name
from daskvec.worker.vector import VectorEnvs

logger = logging.getLogger(__name__)

__all__ = ["build_env", "build_envs", "build_group", "build_vector", "close_envs"]


def build_group(
    factories: Sequence[Callable[[], Any]],
    env_indices: Sequence[int],
    where: str,
    autoreset: Autoreset,
    vector: bool,
    timeout: float | None,
) -> list[gym.Env[Any, Any]] | VectorEnvs:
    """A group's envs (or, with ``vector``, its one vectorized env), built within ``timeout`` seconds.

    Parameters
    ----------
    factories : sequence of callable
        One per env (or the vector env's one).
    env_indices : sequence of int
        The envs' vec-env indices, for the messages (empty for a vector group not numbered yet).
    where : str
        The worker's address, for the messages.
    autoreset : Autoreset
        The group's autoreset mode (a vector env must be able to follow it).
    vector : bool
        Whether the one factory makes a vectorized env.
    timeout : float or None
        ``None``: the factories run on the calling thread; else on a thread of their own,
        abandoned after ``timeout`` seconds (:class:`~daskvec.errors.EnvBuildTimeoutError`).
    """

    def build(progress: list[int] | None = None) -> list[gym.Env[Any, Any]] | VectorEnvs:
        if vector:
            return build_vector(factories[0], env_indices, where, autoreset)
        return build_envs(factories, env_indices, where, progress)

    if timeout is None:
        return build()
    progress = [0]
    done: dict[str, Any] = {}
    # the build hands its result over, or the caller gives up on it, never both: a build that
    # ends as the timeout expires either is taken or closes what it made
    handover = threading.Lock()
    abandoned = False

    def run() -> None:
        try:
            result: dict[str, Any] = {"envs": build(progress)}
        except BaseException as e:
            result = {"error": e}
        with handover:
            if not abandoned:
                done.update(result)
                return
        if "envs" in result:  # too late: nobody will use them
            envs = result["envs"]
            close_envs(envs if isinstance(envs, list) else [envs], where)

    thread = threading.Thread(target=run, name="daskvec-build", daemon=True)
    thread.start()
    thread.join(timeout)
    with handover:
        if not done:
            abandoned = True
    if abandoned:
        raise _hung(factories, env_indices, where, vector, timeout, progress[0])
    if "error" in done:
        raise done["error"]
    envs: list[gym.Env[Any, Any]] | VectorEnvs = done["envs"]
    return envs


def _hung(
    factories: Sequence[Callable[[], Any]],
    env_indices: Sequence[int],
    where: str,
    vector: bool,
    timeout: float,
    pos: int,
) -> EnvBuildTimeoutError:
    """The error for a factory that did not return within ``timeout`` (the ``pos``-th one)."""
    if vector:
        return EnvBuildTimeoutError(
            f"the vector env factory ({factory_name(factories[0])}) did not return within "
            f"{timeout:g}s on worker {where}; its thread was abandoned and the worker is "
            "free. Check what the factory waits for, or pass a larger timeout=",
            env_indices=list(env_indices),
        )
    return EnvBuildTimeoutError(
        f"the factory of env {env_indices[pos]} ({factory_name(factories[pos])}) did not "
        f"return within {timeout:g}s on worker {where}; its thread was abandoned and "
        "the worker is free. Check what the factory waits for, or pass a larger timeout=",
        env_indices=[env_indices[pos]],
    )


def build_vector(
    factory: Callable[[], Any], env_indices: Sequence[int], where: str, autoreset: Autoreset
) -> VectorEnvs:
    """A group's one vectorized env from its factory, as :class:`~daskvec.worker.vector.VectorEnvs`."""
    try:
        vec = factory()
    except Exception as e:
        of = f"of envs {list(env_indices)}" if env_indices else "(its first build)"
        _keep_traceback(e)
        e.add_note(f"daskvec: raised by the vector env factory {factory_name(factory)} {of} on {where}")
        _note_daemonic(e)
        raise
    try:
        built = VectorEnvs(vec, autoreset)
    except Exception:
        with contextlib.suppress(Exception):
            vec.close()
        raise
    if env_indices and built.n != len(env_indices):  # a rebuild: its envs keep their numbers
        with contextlib.suppress(Exception):
            built.close()
        raise EnvBuildError(
            f"the vector env factory ({factory_name(factory)}) made {built.n} envs on worker {where}, but "
            f"its group holds {len(env_indices)} (envs {list(env_indices)}) since its first build; a vector "
            "env factory must make the same number of envs every time it is called (do not size it by the "
            "machine, e.g. with os.cpu_count())",
            env_indices=list(env_indices),
        )
    return built


def build_envs(
    factories: Sequence[Callable[[], Any]], env_indices: Sequence[int], where: str, progress: list[int] | None = None
) -> list[gym.Env[Any, Any]]:
    """One env per factory, each a new one (``progress[0]``: the position being built); all closed if one fails.

    Envs that render to a window (``render_mode="human"``) are refused when their windowing
    library needs a display this process does not have (:func:`_check_the_display`), and when
    another env group of this process already has such envs open (:func:`_claim_the_display`).
    """
    envs: list[gym.Env[Any, Any]] = []
    try:
        for pos, fn in enumerate(factories):
            if progress is not None:
                progress[0] = pos
            env = build_env(fn, env_indices[pos], where)
            for other_pos, other in enumerate(envs):
                if other is env:
                    raise ValueError(
                        f"env factories {env_indices[other_pos]} and {env_indices[pos]} returned "
                        "the same environment instance; each factory must create a new env "
                        "(e.g. `lambda: gym.make(...)`)"
                    )
            envs.append(env)
            _check_the_display(env, env_indices[pos], where)
        _claim_the_display(envs, env_indices, where)
    except BaseException:
        close_envs(envs, where)
        raise
    return envs


#: This process's envs that render to a window (``render_mode="human"``), all of one env
#: group, until they are closed (:func:`close_envs`) or collected.
_WINDOW_ENVS: weakref.WeakSet[Any] = weakref.WeakSet()
_WINDOW_LOCK = threading.Lock()


def _renders_to_a_window(env: Any) -> bool:
    return getattr(env, "render_mode", None) == "human"


def _has_display() -> bool:
    """Whether a window can be opened from this process (on Linux: an X11 or Wayland display is named)."""
    if not sys.platform.startswith("linux"):
        return True  # macOS and Windows always have one (whether a worker may use it is theirs to say)
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def _window_library(env: Any) -> str | None:
    """The windowing library ``env`` opens its window with, when it is one that cannot do without a display.

    pygame's SDL falls back to an offscreen driver when there is no display (CartPole and
    the other classic-control envs render, to nowhere), so it is not named. MuJoCo's
    viewer opens a GLFW window, and GLFW with no display fails an assertion that aborts
    the process at the env's first render (its reset).
    """
    unwrapped = getattr(env, "unwrapped", env)
    if getattr(unwrapped, "mujoco_renderer", None) is not None:
        return "GLFW (MuJoCo's viewer)"
    return None


def _check_the_display(env: Any, index: int, where: str) -> None:
    """Refuse at once an env whose window needs a display where this process has none.

    Without this the env's first reset aborts the process that holds it (the worker, or
    its env process), and each rebuild elsewhere aborts again.

    Raises
    ------
    daskvec.errors.EnvBuildError
        ``env`` renders to a window with a library that needs a display, and there is none.
    """
    if not _renders_to_a_window(env) or _has_display():
        return
    library = _window_library(env)
    if library is None:
        return
    raise EnvBuildError(
        f"env {index} renders to a window (render_mode='human') with {library}, and worker {where} has no "
        "display (neither DISPLAY nor WAYLAND_DISPLAY is set in its environment): its first render would abort "
        "the process. Start the workers where a display is (DISPLAY set in their environment), or use "
        "render_mode='rgb_array' (with MUJOCO_GL=egl it needs no display) and show the frames yourself",
        env_indices=[index],
    )


def _claim_the_display(envs: Sequence[Any], env_indices: Sequence[int], where: str) -> None:
    """Let one env group of this process at a time have envs that render to a window.

    Windowing libraries (pygame's SDL, GLFW) hold one display per process, tied to the
    thread that opened it, and a worker steps each env group on a thread of its own: a
    second group's window on the same process fails (SDL with EGL: ``EGL_BAD_ACCESS``),
    crashes the worker or blocks. So a second group of such envs is refused at once,
    saying why and what to do; one group (e.g. in an env process, one group per process)
    renders as it would in a process of its own.

    Raises
    ------
    daskvec.errors.EnvBuildError
        Some of ``envs`` render to a window and another group of this process has such envs open.
    """
    windows = [i for i, env in zip(env_indices, envs, strict=True) if _renders_to_a_window(env)]
    if not windows:
        return
    with _WINDOW_LOCK:
        if any(env not in envs for env in _WINDOW_ENVS):
            raise EnvBuildError(
                f"envs {windows} render to a window (render_mode='human'), and another env group on worker "
                f"{where} already has one open: a process has one display, tied to the thread that opened it "
                "(pygame's SDL, GLFW), and a worker steps each env group on a thread of its own, so a second "
                "group's window fails, crashes the worker or blocks. Pass env_process=True (each env group in "
                "a process of its own; envs_per_actor=1 for a window per env), or render_mode='rgb_array' and "
                "show the frames (env.render()) yourself",
                env_indices=windows,
            )
        _WINDOW_ENVS.update(env for env in envs if _renders_to_a_window(env))


def build_env(factory: Callable[[], Any], index: int, where: str) -> gym.Env[Any, Any]:
    """Env ``index`` from its factory, checked to be an env."""
    try:
        env = factory()
    except Exception as e:
        _keep_traceback(e)
        e.add_note(f"daskvec: raised by the factory of env {index} on worker {where}")
        _note_daemonic(e)
        raise
    if not (hasattr(env, "step") and hasattr(env, "reset")):
        raise TypeError(
            f"the factory of env {index} returned {type(env).__name__!r}, not a gymnasium.Env; "
            "env_fns must be callables that create an environment"
        )
    if _is_vectorized(env):
        with contextlib.suppress(Exception):
            env.close()
        raise TypeError(
            f"the factory of env {index} returned {type(env).__name__!r}, a vectorized env of "
            f"{env.num_envs} envs, where one env is due; give such factories to "
            "DaskVecEnv.from_vector_envs(...) (or DaskVectorEnv.from_vector_envs), which steps each one as a group"
        )
    env_: gym.Env[Any, Any] = env
    return env_


def _keep_traceback(e: BaseException) -> None:
    """Set ``e.remote_traceback``: the factory's frames, formatted here, where their source is.

    The client shows the user the error and where it was raised, and keeps this on
    the exception for a closer look (:mod:`daskvec._core.user_errors`); the frames Dask
    rebuilds on the client are daskvec's and Dask's as well, with position markers
    computed from the wrong code.
    """
    with contextlib.suppress(Exception):  # an exception type that refuses attributes
        e.remote_traceback = format_traceback(e)  # type: ignore[attr-defined]


def _note_daemonic(e: BaseException) -> None:
    """Say what to do when a factory started a process inside a Dask worker, which cannot have children."""
    if "daemonic processes are not allowed to have children" in str(e):
        e.add_note(
            "daskvec: a Dask worker runs as a daemonic process, which cannot start processes (an AsyncVectorEnv "
            "does): use a SyncVectorEnv (daskvec's groups already step in parallel), or env_process=True (each "
            "group in a process of its own), or workers started with the Dask config distributed.worker.daemon: "
            "false"
        )


def _is_vectorized(env: Any) -> bool:
    """Whether ``env`` is a vectorized env (a Gymnasium ``VectorEnv``, an EnvPool) rather than one env."""
    if isinstance(env, gym.vector.VectorEnv):
        return True
    return hasattr(env, "num_envs") and hasattr(env, "single_observation_space")


def close_envs(envs: Sequence[Any], where: str) -> None:
    """Close every env (or vector env); one that fails to close is logged and does not stop the others."""
    for env in envs:
        try:
            env.close()
        except Exception:
            logger.exception("closing an env on %s failed", where)
        with _WINDOW_LOCK:
            _WINDOW_ENVS.discard(env)
