"""daskvec's section of Dask's configuration: the ``daskvec.*`` keys.

The defaults ship in ``daskvec/daskvec.yaml`` and are added to Dask's defaults when
daskvec is imported (``dask.config.update_defaults``, as Dask's own downstream
libraries do). They can then be set like any Dask setting: a YAML file in
``~/.config/dask/`` or ``/etc/dask/``, an environment variable such as
``DASK_DASKVEC__STEP_TIMEOUT=60``, or ``dask.config.set({"daskvec.step-timeout": 60})``.
A keyword argument of :class:`~daskvec.DaskVecEnv` wins over all of them; a keyword
left at ``None`` reads the config (see docs/configuration.md).

Who reads what: the client reads every key when a vec env is created
(:meth:`daskvec._core.options.Options.create`), except ``busy-poll``, which is a worker's
CPU budget: each worker reads it from its own config when it builds an env group
(:func:`worker_busy_poll`), unless the vec env was given ``busy_poll=``; and
``shared-memory``, which each worker reads from its own config
(:func:`worker_shared_memory`).

This module imports only Dask and PyYAML: workers import it too.
"""

from __future__ import annotations

import os
from typing import Any

import dask.config
import yaml
from dask.utils import parse_timedelta

__all__ = ["DEFAULTS", "DURATIONS", "KEYS", "get", "hint", "key", "worker_busy_poll", "worker_shared_memory"]

#: The file of defaults shipped with daskvec.
DEFAULTS_FILE = os.path.join(os.path.dirname(__file__), "daskvec.yaml")

with open(DEFAULTS_FILE, encoding="utf-8") as _f:
    #: The shipped defaults, ``{"daskvec": {"step-timeout": None, ...}}``.
    DEFAULTS: dict[str, Any] = yaml.safe_load(_f)

dask.config.update_defaults(DEFAULTS)

#: Option name (as the keyword argument spells it) -> its key in Dask's config.
KEYS: dict[str, str] = {name.replace("-", "_"): f"daskvec.{name}" for name in DEFAULTS["daskvec"]}

#: Options that are seconds: in the config they may also be Dask time strings ("90s", "5 minutes").
DURATIONS = frozenset(
    {
        "busy_poll",
        "timeout",
        "connect_timeout",
        "step_timeout",
        "worker_wait_timeout",
        "migrate_before",
        "rebalance_interval",
    }
)


def key(option: str) -> str:
    """The config key of a keyword option, e.g. ``"step_timeout"`` -> ``"daskvec.step-timeout"``."""
    return KEYS[option]


def hint(option: str) -> str:
    """Where a config value can be changed, for error messages about it."""
    variable = "DASK_" + key(option).upper().replace(".", "__").replace("-", "_")
    return (
        f"; {key(option)} is set in a Dask YAML file (~/.config/dask/*.yaml, /etc/dask/), the "
        f"environment variable {variable} or dask.config.set: fix it there, or pass {option}= to override it"
    )


def get(option: str) -> Any:
    """The configured value of a keyword option (time strings of durations in seconds).

    A time string that Dask cannot read is returned as it is, for the option's own
    check to reject with a clear message.
    """
    value = dask.config.get(key(option))
    if option in DURATIONS and isinstance(value, str):
        try:
            return parse_timedelta(value, default="seconds")
        except (ValueError, KeyError, TypeError):
            return value
    return value


def worker_busy_poll(value: float | None, worker: str = "") -> float:
    """On a worker: the busy-poll budget of a new env group.

    ``value`` when the vec env was given ``busy_poll=`` (already checked on the
    client), else this worker's own ``daskvec.busy-poll``.

    Raises
    ------
    ValueError
        The worker's config holds an invalid value; the message names the key and
        the worker.
    """
    from daskvec.transport import check_busy_poll

    if value is not None:
        return check_busy_poll(value)
    where = f" on worker {worker}" if worker else ""
    try:
        return check_busy_poll(get("busy_poll"), name=f"the Dask config {key('busy_poll')}{where}")
    except ValueError as e:
        raise ValueError(f"{e}{hint('busy_poll')}") from None


def worker_shared_memory(value: bool | None = None, worker: str = "") -> bool:
    """On a worker: whether a new env group shares a memory window with clients on its machine.

    ``value`` when given (``False``: the client cannot read one; ``True``: an env
    process gets its worker's answer), else (``None``: the client can) this worker's
    own ``daskvec.shared-memory``.

    Raises
    ------
    ValueError
        The worker's config holds something other than true or false; the message
        names the key and the worker.
    """
    if value is not None:
        return bool(value)
    got = dask.config.get("daskvec.shared-memory", True)
    if not isinstance(got, bool):
        where = f" on worker {worker}" if worker else ""
        raise ValueError(
            f"the Dask config daskvec.shared-memory{where} must be true or false, not {got!r}; it is set in a "
            "Dask YAML file (~/.config/dask/*.yaml, /etc/dask/), the environment variable DASK_DASKVEC__SHARED_MEMORY "
            "or dask.config.set: fix it there"
        )
    return got
