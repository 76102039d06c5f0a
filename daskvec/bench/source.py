"""The benchmarks that live in the source repository's ``benchmarks/``, which the wheel leaves out.

In a source checkout (an editable install) ``benchmarks/`` is beside the package and
``daskvec bench`` runs them from there; from an installed wheel, asking for one raises
:class:`InSourceOnly`, which says where it lives and how to run it.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = ["IN_SOURCE", "InSourceOnly", "benchmarks_dir", "format_case", "module", "require"]

#: What ``daskvec bench`` runs from ``benchmarks/``: scenario (or option) -> the module there.
IN_SOURCE: dict[str, str] = {
    "gym-faces": "gym_faces",
    "straggler": "gym_faces",
    "groups": "groups",
    "hosts": "across",
    "learning": "learning",
    "learning-offpolicy": "offpolicy_learning",
    "ceiling": "ceiling",
    "time-to-reward": "time_to_reward",
    "--tls": "tls",
    "--dashboard": "dashboard_load",
}


class InSourceOnly(ValueError):
    """A benchmark of the source repository was asked for, and this daskvec was installed without it."""


def benchmarks_dir() -> Path | None:
    """``benchmarks/`` beside the package (a source checkout), or ``None`` (an installed wheel)."""
    import daskvec

    found = Path(daskvec.__file__).resolve().parent.parent / "benchmarks"
    return found if (found / "__init__.py").is_file() else None


def require(asked: str) -> None:
    """Raise :class:`InSourceOnly` when ``asked`` (a key of :data:`IN_SOURCE`) cannot run here."""
    if asked in IN_SOURCE and benchmarks_dir() is None:
        what = asked if asked.startswith("--") else f"--scenario {asked}"
        raise InSourceOnly(
            f"{what} is a benchmark of daskvec's source repository (benchmarks/{IN_SOURCE[asked]}.py), "
            "which the installed package does not carry. Run it from a source checkout: clone the "
            f'repository, `pip install -e ".[test]"` in it, then `daskvec bench {what}` there.'
        )


def module(asked: str, name: str | None = None) -> ModuleType:
    """Import ``benchmarks.<name>`` (default: ``asked``'s in :data:`IN_SOURCE`) from the checkout.

    The repository's root goes at the end of ``sys.path``, where the embedded cluster's workers find it too.
    """
    require(asked)
    where = benchmarks_dir()
    assert where is not None
    root = str(where.parent)
    if root not in sys.path:
        sys.path.append(root)
    mod = importlib.import_module(f"benchmarks.{name or IN_SOURCE[asked]}")
    if not Path(str(mod.__file__)).resolve().is_relative_to(where):
        raise InSourceOnly(f"`import benchmarks` found {mod.__file__}, not daskvec's {where}: rename or remove it")
    return mod


def format_case(case: dict[str, Any], asked: str | None = None) -> list[str]:
    """Table lines of a case of a scenario in ``benchmarks/`` (or of ``asked``'s entry, by its own module)."""
    asked = asked or case["scenario"]
    try:
        return list(module(asked).format_case(case))
    except InSourceOnly:
        return [f"{case.get('case', asked):<12} (a benchmark of the source repository: its figures are in the JSON)"]
