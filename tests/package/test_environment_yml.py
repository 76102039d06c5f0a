"""environment.yml (conda) and pyproject.toml must name the same packages with compatible versions."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).parents[2]

#: conda-forge package name -> the PyPI distribution it provides
CONDA_TO_PYPI = {
    "dask-core": "dask",
    "pytorch": "torch",
    "prometheus_client": "prometheus-client",
    "python-build": "build",
}
#: extras a conda user gets (all of them: the environment is for developing daskvec)
EXTRAS = ("dashboard", "jobqueue", "bench", "workloads", "notebooks", "test", "zoo", "tensorboard", "docs", "release")
#: conda packages with no pyproject entry, and why
CONDA_ONLY = {
    "python": "the interpreter (checked against requires-python)",
    "pip": "installs daskvec itself",
    "torch": "pulled by stable-baselines3; pinned to a CPU build here",
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pyproject_requirements() -> dict[str, SpecifierSet]:
    """Every dependency of daskvec and its extras, by normalised name."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in EXTRAS:
        reqs += project["optional-dependencies"][extra]
    out: dict[str, SpecifierSet] = {}
    for text in reqs:
        req = Requirement(text)
        if _norm(req.name) == "daskvec":
            continue  # self-references such as daskvec[dashboard]
        out[_norm(req.name)] = out.get(_norm(req.name), SpecifierSet()) & req.specifier
    return out


def conda_packages() -> tuple[dict[str, str], list[str]]:
    """Conda dependencies as {pypi name: conda version spec}, and the pip section."""
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert "conda-forge" in env["channels"]
    conda: dict[str, str] = {}
    pip: list[str] = []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            pip += dep.get("pip", [])
            for text in dep.get("pip", []):
                if not text.startswith("-"):  # a package conda-forge lacks, installed with pip
                    req = Requirement(text)
                    conda[_norm(req.name)] = str(req.specifier)
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)\s*([<>=!~].*)?", dep.strip())
        assert m, f"cannot read conda dependency {dep!r}"
        name = CONDA_TO_PYPI.get(m.group(1), m.group(1))
        conda[_norm(name)] = (m.group(2) or "").strip()
    return conda, pip


def lower_bound(conda_spec: str) -> Version | None:
    """The smallest version a conda spec such as ``>=2.3`` or ``>=2.3=cpu*`` allows."""
    version_part = conda_spec.split("=cpu")[0].split(",")[0]
    m = re.fullmatch(r"(>=|==|=)\s*([0-9][0-9A-Za-z.]*)\*?", version_part)
    return Version(m.group(2)) if m else None


def test_every_pyproject_dependency_is_in_environment_yml() -> None:
    conda, _ = conda_packages()
    missing = sorted(set(pyproject_requirements()) - set(conda))
    assert not missing, f"in pyproject.toml but not in environment.yml: {missing}"


@pytest.mark.parametrize("name", sorted(pyproject_requirements()))
def test_versions_agree(name: str) -> None:
    conda, _ = conda_packages()
    spec = pyproject_requirements()[name]
    if name not in conda:
        pytest.fail(f"{name} is missing from environment.yml")
    low = lower_bound(conda[name])
    if not str(spec):
        return  # pyproject leaves it open
    assert low is not None, f"environment.yml gives {name} no lower bound ({conda[name]!r}) but pyproject says {spec}"
    # the oldest version conda may install must satisfy pyproject
    assert spec.contains(low, prereleases=True), f"{name}: conda allows {low}, pyproject requires {spec}"
    # and the pins are the same, so that the two files do not drift apart
    mins = [Version(s.version) for s in spec if s.operator in (">=", "==")]
    assert mins and low == max(mins), f"{name}: conda's minimum {low} differs from pyproject's {spec}"


def test_environment_yml_has_nothing_extra() -> None:
    conda, pip = conda_packages()
    extra = sorted(set(conda) - set(pyproject_requirements()) - set(CONDA_ONLY))
    assert not extra, f"in environment.yml but in no pyproject dependency or extra: {extra}"
    assert "-e ." in pip, "environment.yml must install daskvec itself with pip"


def test_python_and_torch() -> None:
    conda, _ = conda_packages()
    requires = SpecifierSet(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"])
    low = lower_bound(conda["python"])
    assert low is not None and requires.contains(low)
    # a CPU build of torch: a plain `pytorch` would pull CUDA
    assert conda["torch"].endswith("=cpu*")
