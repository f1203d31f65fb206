"""Packaging (issue 15 item 7): the base install is exactly what the SDK imports; the library declares ranges, and
constraints.txt pins every dependency to one exact version inside its range."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
OUR_PACKAGES = {"contract", "broker", "skewless", "gateway", "timesync", "reorder", "spark_jobs", "clients", "cep"}
# Our compiled extension (native/, built by `make native` or the Dockerfile's rust stage, not a requirement): the
# gateway runs it when it imports (core = "auto") and the Python cores otherwise.
OUR_EXTENSIONS = {"skewless_native"}
# Import name -> distribution name, where they differ.
DISTRIBUTION_OF = {"yaml": "pyyaml", "confluent_kafka": "confluent-kafka", "prometheus_client": "prometheus-client"}


def _module_file(name: str) -> Path | None:
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def third_party_imports(roots: list[str]) -> set[str]:
    """Top-level names of the non-stdlib, non-project modules that ``roots`` import, following our own imports
    (package __init__ files included, since importing a.b runs a/__init__.py)."""
    seen: set[str] = set()
    found: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        if module in seen:
            continue
        seen.add(module)
        path = _module_file(module)
        if path is None:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in OUR_PACKAGES:
                    if _module_file(name) is not None:
                        todo.append(name)
                elif top not in sys.stdlib_module_names and top not in OUR_EXTENSIONS:
                    found.add(top)
    return found


def _names(requirements: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def test_the_sdk_install_is_exactly_what_the_sdk_imports() -> None:
    sdk_modules = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                   for p in sorted((ROOT / "clients").rglob("*.py"))]
    imported = {canonicalize_name(DISTRIBUTION_OF.get(name, name)) for name in third_party_imports(sdk_modules)}
    project = PYPROJECT["project"]
    sdk = _names(project["dependencies"]) | _names(project["optional-dependencies"]["sdk"])
    assert sdk == imported
    assert imported == {"msgpack"}  # today's answer, so a new SDK import is a decision, not an accident
    for heavy in ("confluent-kafka", "prometheus-client", "typer", "uvloop", "pyspark"):
        assert heavy not in sdk


def test_the_extras_are_apart() -> None:
    extras = {name: _names(reqs) for name, reqs in PYPROJECT["project"]["optional-dependencies"].items()}
    assert set(extras) == {"sdk", "gateway", "spark", "dev"}
    assert "pyspark" not in extras["gateway"]
    assert {"uvloop", "prometheus-client"}.isdisjoint(extras["spark"])
    assert {"pytest", "mypy", "ruff"} <= extras["dev"]
    assert extras["gateway"].isdisjoint(extras["dev"]) and extras["spark"].isdisjoint(extras["dev"])


def test_the_gateway_and_spark_extras_cover_what_their_code_imports() -> None:
    def needed(package: str) -> set[str]:
        roots = [".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in sorted((ROOT / package).rglob("*.py"))]
        return {canonicalize_name(DISTRIBUTION_OF.get(n, n)) for n in third_party_imports(roots)}

    project = PYPROJECT["project"]
    base = _names(project["dependencies"])
    optional = project["optional-dependencies"]
    assert needed("gateway") <= base | _names(optional["gateway"])
    assert needed("spark_jobs") <= base | _names(optional["spark"])


def test_the_library_declares_ranges_and_constraints_pin_each_dependency_inside_its_range() -> None:
    pins: dict[str, str] = {}
    for raw in (ROOT / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            match = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
            assert match, f"constraints.txt: {line!r} is not NAME==VERSION"
            pins[canonicalize_name(match.group(1))] = match.group(2)
    project = PYPROJECT["project"]
    requirements = [*project["dependencies"], *(r for reqs in project["optional-dependencies"].values() for r in reqs)]
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert not any(spec.operator == "==" for spec in requirement.specifier), f"{text}: a range, not a pin"
        assert requirement.specifier, f"{text}: give a range"
        assert name in pins, f"constraints.txt does not pin {name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} outside {text}"


def test_make_and_the_readme_install_with_the_constraints() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c constraints.txt -e '.[gateway,spark,dev]'" in makefile
    readme = (ROOT / "README.md").read_text()
    installs = [line for line in readme.splitlines() if "pip install" in line and "-e" in line]
    assert installs and all("-c constraints.txt" in line for line in installs)


def test_make_test_runs_every_test_folder_once() -> None:
    """`make test` splits the suite (unit tests on two cores, the rest serial): together its pytest lines must name
    each of pyproject's testpaths exactly once (a --ignore does not apply to testpaths, which once ran the unit
    tests twice)."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\ntest: ", 1)[1].split("\n\n", 1)[0]
    named = [word for line in recipe.splitlines() if "/pytest " in line
             for word in line.split() if word.startswith("tests/")]
    testpaths = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["testpaths"]
    assert sorted(named) == sorted(testpaths)
