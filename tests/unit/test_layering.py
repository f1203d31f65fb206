"""The floor plan (docs/architecture.md), enforced: packages import only from floors below, no two files import
each other (directly or in a loop), and the sans-IO cores never touch the event loop, sockets, the wall clock,
Kafka or Spark. Plain `ast`: every import counts, including those inside functions."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

FLOORS = {
    "contract": 1, "timesync": 1,
    "reorder": 2, "cep": 2, "broker": 2,
    # The compiled data plane (native/, an extension module, not a folder here): beside the cores it compiles.
    "skewless_native": 2,
    "gateway": 3, "clients": 3, "spark_jobs": 3,
    "skewless": 4, "benchmarks": 4, "scripts": 4,
}
EXTENSION_MODULES = {"skewless_native"}
# Narrower than the floors allow: the SDK is what users install next to their sources.
ALLOWED_ONLY = {"clients": {"contract", "timesync"}}
# Production code never reaches into the evaluation harness.
FORBIDDEN_MODULES = {"reorder.eval": ("reorder", "gateway", "spark_jobs", "clients", "broker", "cep")}
# What a sans-IO core may not import: the event loop, sockets, clocks, threads, Kafka, Spark.
IO_MODULES = ("asyncio", "socket", "time", "datetime", "threading", "confluent_kafka", "pyspark")
# timesync.clocks is pure except these: each reads the machine's clock (a core takes a clock injected instead).
CLOCK_READERS = ("timesync.clocks.system_time_us", "timesync.clocks.for_time_sync", "timesync.clocks.ReferenceClock",
                 "timesync.clocks._KernelStampedClock")
# Every command lives on floor 4 (the floor plan): typer (and click under it) is imported only in skewless/.
CLI_MODULES = ("typer", "click")
CLI_FLOOR = "skewless"
# The one exception: spark-submit runs spark_jobs/submit.py by its path, and it runs spark_jobs/cli.py's commands
# with broker/cli.py's Kafka options. On floor 4 they would pull the whole skewless package (and the gateway's
# dependencies) into the executors' --py-files and the spark extra (test_spark_session, test_packaging).
CLI_FOR_SPARK_SUBMIT = {"broker.cli", "spark_jobs.cli", "spark_jobs.submit"}
# A name an import-by-string call was given that is not a constant: the floor plan cannot be checked there.
DYNAMIC = "<dynamic>"
PURE_CORES = (
    "contract",
    "timesync.codec", "timesync.exchange", "timesync.responder", "timesync.estimator", "timesync.store",
    "reorder.records", "reorder.sequence", "reorder.merger", "reorder.pipeline", "reorder.estimators",
    "reorder.eval.kslack", "reorder.eval.oracle", "reorder.eval.syncsim", "reorder.eval.replay",
    "cep",
    "gateway.session", "gateway.acks", "gateway.auth", "gateway.ingest",
    "broker.batch_ledger",
)


@dataclass(frozen=True)
class Violation:
    rule: str
    where: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.detail}"


def _modules(root: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in FLOORS:
        base = root / package
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _string_import(node: ast.Call) -> str | None:
    """The module an ``__import__(...)`` or ``importlib.import_module(...)`` call names (DYNAMIC if not a constant),
    or None for any other call."""
    func = node.func
    called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
    if called not in ("__import__", "import_module") or not node.args:
        return None
    first = node.args[0]
    return first.value if isinstance(first, ast.Constant) and isinstance(first.value, str) else DYNAMIC


def _imports(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Absolute names of everything `module` imports (with the line), relative imports resolved; imports by string
    count too."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call) and (named := _string_import(node)) is not None:
            yield named, node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            yield base, node.lineno
            for alias in node.names:  # `from pkg import module` imports a module too
                yield f"{base}.{alias.name}", node.lineno


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The project module `name` refers to (the longest known prefix), or None for third-party names."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def check_floor_plan(root: Path) -> list[Violation]:
    modules = _modules(root)
    violations: list[Violation] = []
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        package = module.split(".")[0]
        for name, line in _imports(module, path):
            where = f"{path.relative_to(root)}:{line}"
            top = name.split(".")[0]
            if name == DYNAMIC:
                violations.append(Violation("dynamic", where, f"{module} imports a module named at run time"))
                continue
            if top == "tests":
                violations.append(Violation("tests", where, f"{module} imports the test suite's {name}"))
                continue
            if top in CLI_MODULES and package != CLI_FLOOR and module not in CLI_FOR_SPARK_SUBMIT:
                violations.append(Violation("cli-below-top", where, f"{module} imports {name}: commands live in "
                                                                    f"{CLI_FLOOR}/"))
            pure = any(_in(module, core) for core in PURE_CORES)
            if pure and top in IO_MODULES:
                violations.append(Violation("io-in-core", where, f"{module} imports {name}"))
            if pure and any(_in(name, reader) for reader in CLOCK_READERS):
                violations.append(Violation("clock-in-core", where, f"{module} reads the clock through {name}"))
            target = _resolve(name, modules)
            if target is None and top in EXTENSION_MODULES:
                target = top  # compiled: no file to follow, but its floor holds
            elif target is None or target == module:
                continue
            else:
                graph[module].add(target)
            other = target.split(".")[0]
            if other != package:
                if FLOORS[other] >= FLOORS[package]:
                    violations.append(Violation(
                        "upward", where, f"{package} (floor {FLOORS[package]}) imports {target} "
                                         f"(floor {FLOORS[other]})"))
                elif package in ALLOWED_ONLY and other not in ALLOWED_ONLY[package]:
                    violations.append(Violation("sdk", where, f"{package} may import only "
                                                              f"{sorted(ALLOWED_ONLY[package])}, not {target}"))
            for forbidden, importers in FORBIDDEN_MODULES.items():
                if _in(target, forbidden) and not _in(module, forbidden) and package in importers:
                    violations.append(Violation("eval", where, f"{module} imports the harness {target}"))
    # `from a import b` names both a and a.b: one statement reports each rule once.
    unique = list({(v.rule, v.where): v for v in violations}.values())
    return unique + [Violation("cycle", " -> ".join(cycle), "files import each other") for cycle in _cycles(graph)]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(start: str) -> None:
        # Iterative, so a deep import chain cannot hit the recursion limit.
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_tree_follows_the_floor_plan() -> None:
    violations = check_floor_plan(ROOT)
    assert not violations, "\n".join(map(str, violations))


def test_every_package_has_a_floor() -> None:
    ours = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    assert ours - {"tests"} <= set(FLOORS), f"packages without a floor: {sorted(ours - set(FLOORS) - {'tests'})}"


def _plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(("files", "rule"), [
    ({"contract/__init__.py": "", "contract/wire.py": "from gateway import server\n",
      "gateway/__init__.py": "", "gateway/server.py": ""}, "upward"),
    ({"reorder/__init__.py": "", "reorder/merger.py": "def f():\n    from skewless import demo\n",
      "skewless/__init__.py": "", "skewless/demo.py": ""}, "upward"),
    ({"clients/__init__.py": "", "clients/client.py": "from broker.admin import ensure_topics\n",
      "broker/__init__.py": "", "broker/admin.py": ""}, "sdk"),
    ({"gateway/__init__.py": "", "gateway/server.py": "from reorder.eval.replay import replay\n",
      "reorder/__init__.py": "", "reorder/eval/__init__.py": "", "reorder/eval/replay.py": ""}, "eval"),
    ({"cep/__init__.py": "", "cep/a.py": "from cep import b\n", "cep/b.py": "from . import c\n",
      "cep/c.py": "import cep.a\n"}, "cycle"),
    ({"cep/__init__.py": "", "cep/sase/__init__.py": "", "cep/sase/engine.py": "import time\n"}, "io-in-core"),
    ({"gateway/__init__.py": "", "gateway/ingest.py": "from confluent_kafka import Producer\n"}, "io-in-core"),
    ({"timesync/__init__.py": "", "timesync/clocks.py": "", "reorder/__init__.py": "",
      "reorder/sequence.py": "from timesync.clocks import ReferenceMapping, system_time_us\n"}, "clock-in-core"),
    ({"timesync/__init__.py": "", "timesync/clocks.py": "", "cep/__init__.py": "",
      "cep/windows.py": "import timesync.clocks.for_time_sync\n"}, "clock-in-core"),
    ({"benchmarks/__init__.py": "", "benchmarks/reliability_load.py": "from tests.reliability.load import run\n"},
     "tests"),
    ({"scripts/__init__.py": "", "scripts/reliability.py": "import tests.reliability.report\n"}, "tests"),
    ({"contract/__init__.py": "", "contract/wire.py": "__import__('gateway.server')\n",
      "gateway/__init__.py": "", "gateway/server.py": ""}, "upward"),
    ({"cep/__init__.py": "", "cep/a.py": "import importlib\nimportlib.import_module('broker.admin')\n",
      "broker/__init__.py": "", "broker/admin.py": ""}, "upward"),
    ({"skewless/__init__.py": "", "skewless/cli.py": "for name in ('gateway.cli',):\n    __import__(name)\n"},
     "dynamic"),
    ({"reorder/__init__.py": "", "reorder/merger.py": "import threading\n"}, "io-in-core"),
    ({"timesync/__init__.py": "", "timesync/store.py": "from threading import Lock\n"}, "io-in-core"),
    ({"cep/__init__.py": "", "cep/patterns.py": "from datetime import datetime\n"}, "io-in-core"),
    ({"contract/__init__.py": "", "contract/wire.py": "from skewless_native import decode_frame\n"}, "upward"),
    ({"reorder/__init__.py": "", "reorder/sequence.py": "import skewless_native\n"}, "upward"),
    ({"gateway/__init__.py": "", "gateway/cli.py": "import typer\n"}, "cli-below-top"),
    ({"timesync/__init__.py": "", "timesync/standalone.py": "def f():\n    from typer import echo\n"},
     "cli-below-top"),
    ({"reorder/__init__.py": "", "reorder/eval/__init__.py": "", "reorder/eval/progress.py": "import click\n"},
     "cli-below-top"),
])
def test_planted_violations_are_caught(tmp_path: Path, files: dict[str, str], rule: str) -> None:
    violations = check_floor_plan(_plant(tmp_path, files))
    assert [v.rule for v in violations] == [rule], violations


def test_a_clean_planted_tree_passes(tmp_path: Path) -> None:
    root = _plant(tmp_path, {
        "contract/__init__.py": "", "contract/wire.py": "import msgpack\n",
        "gateway/__init__.py": "", "gateway/server.py": "import asyncio\nfrom contract import wire\n",
        "gateway/ingest.py": "from contract.wire import x\nimport skewless_native\n",
        "skewless/__init__.py": "",
        "skewless/cli.py": "import typer\nfrom gateway import server\n__import__('gateway.server')\n",
        "timesync/__init__.py": "", "timesync/clocks.py": "",
        "reorder/__init__.py": "", "reorder/merger.py": "from timesync.clocks import ReferenceMapping\n",
    })
    assert check_floor_plan(root) == []
