"""Every import the README and the docs show works, and the worker side stays free of SB3, torch and Bokeh.

The documented imports are read from the code blocks of ``README.md`` and ``docs/*.md``:
``from daskvec... import ...`` and ``import daskvec...`` lines, dotted names used in Python
code (``daskvec.jobqueue.keep_ctrl_c``), and the modules a command line runs or preloads
(``python -m daskvec.bench``, ``--preload daskvec.dashboard``), each imported here,
in-process. The worker check starts a Python process that imports ``daskvec.worker``
alone and lists what came with it.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

#: A fenced code block of Markdown: its language and its text.
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: ``from daskvec.x import a, b`` (names may be parenthesised over several lines).
FROM_IMPORT = re.compile(r"^\s*from\s+(daskvec(?:\.\w+)*)\s+import\s+(\([^)]*\)|[^\n#]+)", re.MULTILINE)
#: ``import daskvec.x.y`` (``as`` allowed).
PLAIN_IMPORT = re.compile(r"^\s*import\s+(daskvec(?:\.\w+)*)", re.MULTILINE)
#: A dotted name used in Python code (``daskvec.jobqueue.keep_ctrl_c()``, ``daskvec.make_vec(...)``).
DOTTED = re.compile(r"(?<![\w.])(daskvec(?:\.\w+)+)")
#: A string literal (config keys such as ``"daskvec.step-timeout"`` are not imports).
STRING = re.compile(r"(\"[^\"\n]*\"|'[^'\n]*')")
#: A module a command line runs or preloads: ``python -m daskvec.bench``, ``--preload daskvec.dashboard``.
COMMAND_MODULE = re.compile(r"(?:python3? -m|--preload|preload:\s*\[?|^\s*-)\s*(daskvec(?:\.\w+)*)", re.MULTILINE)


def documented_imports(text: str) -> list[tuple[str, str | None]]:
    """``(module, name)`` for every daskvec import in the Python code blocks of ``text`` (name ``None``: the module)."""
    found: list[tuple[str, str | None]] = []
    for lang, code in FENCE.findall(text):
        if lang not in ("python", "py", "pycon", ""):
            continue
        for module, names in FROM_IMPORT.findall(code):
            for name in names.strip("()").replace("\n", " ").split(","):
                name = name.strip().split(" as ")[0].strip()
                if name and name != "*":
                    found.append((module, name))
        found.extend((module, None) for module in PLAIN_IMPORT.findall(code))
        if lang in ("python", "py", "pycon"):
            found.extend((dotted, None) for dotted in DOTTED.findall(STRING.sub('""', code)))
        found.extend((module, None) for module in COMMAND_MODULE.findall(code))
    return found


def pages() -> dict[str, str]:
    out = {"README.md": (ROOT / "README.md").read_text()}
    out.update({f"docs/{p.name}": p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))})
    return out


def all_documented() -> list[tuple[str, str, str | None]]:
    seen: dict[tuple[str, str | None], str] = {}
    for where, text in pages().items():
        for imp in documented_imports(text):
            seen.setdefault(imp, where)
    return [(where, module, name) for (module, name), where in sorted(seen.items(), key=str)]


def check_import(module: str, name: str | None) -> None:
    """Import ``name`` from ``module``; with no name, ``module`` is a dotted name: a module, or an attribute of one."""
    if name is None:
        parts = module.split(".")
        for i in range(len(parts), 0, -1):  # the longest prefix that is a module, then attributes
            try:
                obj = importlib.import_module(".".join(parts[:i]))
            except ImportError:
                if i == 1:
                    raise
                continue
            for attr in parts[i:]:
                if not hasattr(obj, attr):
                    raise ImportError(f"{'.'.join(parts[:i])} has no attribute {attr!r} (for {module})")
                obj = getattr(obj, attr)
            return
    mod = importlib.import_module(module)
    if name is not None and not hasattr(mod, name):
        importlib.import_module(f"{module}.{name}")  # a submodule: ``from daskvec import jobqueue``


def test_the_docs_show_imports() -> None:
    """The scan finds what the README shows (a scan that finds nothing would check nothing)."""
    found = {(m, n) for _, m, n in all_documented()}
    assert ("daskvec", "DaskVecEnv") in found
    assert ("daskvec.sb3", "DaskPPO") in found
    assert ("daskvec.jobqueue", "cluster_for_envs") in found
    assert ("daskvec.make_vec", None) in found
    assert ("daskvec.dashboard", None) in found


def test_a_bogus_documented_import_fails() -> None:
    """The check itself: an import line that names nothing real fails it."""
    text = "```python\nfrom daskvec.sb3 import DaskPPO, DaskNoSuchThing\nimport daskvec.no_such_module\n```\n"
    imports = set(documented_imports(text))
    assert imports == {
        ("daskvec.sb3", "DaskPPO"),
        ("daskvec.sb3", None),
        ("daskvec.sb3", "DaskNoSuchThing"),
        ("daskvec.no_such_module", None),
    }
    check_import("daskvec.sb3", "DaskPPO")
    for imp in [
        ("daskvec.sb3", "DaskNoSuchThing"),
        ("daskvec.no_such_module", None),
        ("daskvec.sb3.DaskNoSuchThing", None),
    ]:
        with pytest.raises(ImportError):
            check_import(*imp)


@pytest.mark.parametrize(("where", "module", "name"), all_documented(), ids=lambda v: str(v))
def test_documented_import_works(where: str, module: str, name: str | None) -> None:
    try:
        check_import(module, name)
    except ImportError as e:
        pytest.fail(f"{where} shows an import that fails: {module} {name or ''}: {e}")


@pytest.mark.processes
def test_the_worker_side_imports_no_sb3_torch_or_bokeh() -> None:
    """What a worker process imports: ``daskvec.worker`` brings no Stable-Baselines3, torch or Bokeh."""
    code = (
        "import sys, daskvec.worker\n"
        "print(' '.join(sorted({m.split('.')[0] for m in sys.modules} & {'stable_baselines3', 'torch', 'bokeh'})))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "", f"importing daskvec.worker imported {done.stdout.strip()}"


def test_each_face_is_importable_from_its_package() -> None:
    """As README's tree shows them: the SB3 face in daskvec/sb3/, the Gymnasium face in daskvec/gymnasium/."""
    import daskvec
    from daskvec.gymnasium import DaskVectorEnv, make_vec
    from daskvec.sb3 import DaskVecEnv

    assert (DaskVectorEnv, make_vec, DaskVecEnv) == (daskvec.DaskVectorEnv, daskvec.make_vec, daskvec.DaskVecEnv)
    with pytest.raises(AttributeError, match="no attribute 'DaskNoSuchThing'"):
        import daskvec.gymnasium as face

        face.DaskNoSuchThing  # noqa: B018 (the lookup is the test)
