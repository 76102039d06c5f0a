"""Sphinx configuration of daskvec's documentation site.

Build it with ``sphinx-build -W -b html docs docs/_build/html`` (warnings are errors);
check the internal links with ``sphinx-build -W -b linkcheck docs docs/_build/linkcheck``.
Nothing here fetches anything from the network: no intersphinx, notebooks rendered as
stored (not executed), and the link check skips every http(s) link.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

# The package documented is the one in this checkout, whatever else is installed.
sys.path.insert(0, os.path.abspath(".."))

import daskvec

project = "daskvec"
author = "daskvec developers"
copyright = "daskvec developers"
release = daskvec.__version__
version = release

extensions = [
    "myst_nb",  # Markdown pages (MyST) and the notebooks
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the numpydoc-style docstrings
    "sphinx.ext.viewcode",
]

exclude_patterns = ["_build", "**/.ipynb_checkpoints"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
root_doc = "index"

# MyST: GitHub-style anchors so that the pages' links such as benchmark.md#tls work
# both on GitHub and here.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

# The notebooks are rendered as they are stored; the test suite executes them.
nb_execution_mode = "off"

# Python objects.
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_class_signature = "mixed"
autodoc_default_options: dict[str, Any] = {"members": True, "show-inheritance": True}
napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_ivar = True  # "Attributes" sections as fields, not as objects a dataclass documents again
napoleon_use_rtype = False
add_module_names = False

# Every reference to a daskvec object must resolve: to its entry in the API reference,
# or, for the internals the site does not document (the engine, the pool, the worker
# side...), to an object that exists (see _internal_reference: a stale name still
# fails the build). References to other projects' objects (numpy, gymnasium,
# Stable-Baselines3, dask, ...) cannot resolve without intersphinx, and are not checked.
nitpicky = True
nitpick_ignore_regex = [(r"py:.*", r"(?!daskvec\b).*")]

# The link check (-b linkcheck) checks links within the site and to files beside it;
# links to other sites are not fetched.
linkcheck_ignore = [r"https?://.*"]

html_theme = "furo"
html_title = f"daskvec {release}"
html_static_path: list[str] = []
html_show_sourcelink = False


_NOTEBOOK_LINK = re.compile(r"\[([^\]]*)\]\(\.\./notebooks/([\w-]+)\.ipynb\)")


def _notebook_links(app: Any, docname: str, source: list[str]) -> None:
    """Point the pages' links to the notebooks at the rendered notebooks.

    The pages link to the notebooks where they sit in the repository
    (``../notebooks/hpc.ipynb``, what GitHub shows); in the site they are the documents
    ``notebooks/*`` (``docs/notebooks`` is a link to ``../notebooks``). A Markdown link
    would be resolved through that symlink to a file outside the site, so it becomes a
    ``{doc}`` reference.
    """

    def doc_role(m: re.Match[str]) -> str:
        label = m[1].replace("`", "")
        return f"{{doc}}`{label} <notebooks/{m[2]}>`"

    source[0] = _NOTEBOOK_LINK.sub(doc_role, source[0])


def _daskvec_object(target: str) -> bool:
    """Whether ``target`` (``daskvec.module.Class.attr``) names something that exists."""
    parts = target.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for name in parts[i:]:
                obj = getattr(obj, name)
        except AttributeError:
            # a dataclass field or an instance attribute set in __init__
            return len(parts) - i == 1 and isinstance(obj, type) and parts[-1] in _class_attributes(obj)
        return True
    return False


def _class_attributes(cls: type) -> set[str]:
    names = set(getattr(cls, "__dataclass_fields__", {}))
    for klass in cls.__mro__:
        names.update(getattr(klass, "__annotations__", {}))
    return names


def _internal_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Render a reference to an undocumented daskvec internal as plain text, if it exists."""
    if node.get("refdomain") != "py":
        return None
    target = node.get("reftarget", "")
    candidates = [target]
    if node.get("py:class"):
        candidates.append(f"{node.get('py:module')}.{node['py:class']}.{target}")
    if node.get("py:module"):
        candidates.append(f"{node['py:module']}.{target}")
    if any(c.startswith("daskvec.") and _daskvec_object(c) for c in candidates):
        return contnode
    return None


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[type]) -> None:
    """Show a class's public bases: a private mixin (``_WorkerRollouts``) is an implementation detail."""
    bases[:] = [b for b in bases if not b.__name__.startswith("_")]


def setup(app: Any) -> dict[str, Any]:
    app.connect("source-read", _notebook_links)
    app.connect("missing-reference", _internal_reference)
    app.connect("autodoc-process-bases", _public_bases)
    return {"parallel_read_safe": True}
