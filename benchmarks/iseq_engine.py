"""The ISEQ engine alone on the Spark benchmark's plain stream: events/s against the stream's length.

    .venv/bin/python -m benchmarks.iseq_engine                     # N = 5k, 10k, 20k, 40k, every indexing profile
    .venv/bin/python -m benchmarks.iseq_engine --baseline 40a9e91  # the same, and the engine of that commit
    .venv/bin/python -m benchmarks.iseq_engine --sizes 2000 --indexing ais --profile   # plus a cProfile

The stream is one stream's events of ``benchmarks/spark_three_window.py`` (``preload``): point events every
100 us, type ``"ABC"[i % 3]``, ``id = i % 50``; the query is that benchmark's SASE sequence written as ISEQ, with
the Spark job's engine configuration (``spark_jobs/iseq.py``, default: K = 0, conservative).  The events are built
as :class:`Interval` beforehand, fed with ``on_item`` in order and closed with the stream's punctuation, as the
job's core does after holding them until the promise.  Per N and profile: CPU seconds (``time.process_time``, best
of ``--repeat``), events per CPU second, the join probes per event, the peak of buffered entries and the output
records.  With ``--baseline REV`` the package ``cep/intervals`` of that commit (``git archive``) runs on the same
stream in the same process, and the two engines' outputs are compared (per item, as sorted record lists: a join
emits its results in its DFS order).  Nothing here asserts on timings.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import io
import pstats
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import cep.intervals

ROOT = Path(__file__).resolve().parents[1]
BASE_US = 1_700_000_000_000_000
STEP_US = 100  # 10k events per second of event time, as spark_three_window.preload
QUERY = "EVENT ISEQ[a.te < b.ts AND b.te < c.ts](A a, B b, C c; {window_ms} ms) WHERE a.id = b.id AND b.id = c.id"
SIZES = (5_000, 10_000, 20_000, 40_000)
PROFILES = ("ais", "ibp", "naive")


@dataclass(frozen=True, slots=True)
class Run:
    events: int
    cpu_s: float
    probes: int
    peak_buffered: int
    outputs: list[list[Any]]
    """Per item fed (and the final punctuation), its output records' keys and kinds, sorted."""

    @property
    def events_per_s(self) -> float:
        return self.events / self.cpu_s

    @property
    def records(self) -> int:
        return sum(len(o) for o in self.outputs)


def baseline_package(rev: str, into: Path) -> ModuleType:
    """``cep/intervals`` as of commit ``rev``, importable as ``iseq_baseline`` (its imports inside the package are
    relative; the ones outside it, ``cep.lexer`` and ``cep.query_ast``, come from this checkout)."""
    archive = subprocess.run(["git", "archive", rev, "cep/intervals"], cwd=ROOT, check=True, capture_output=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    (into / "cep" / "intervals").rename(into / "iseq_baseline")
    sys.path.insert(0, str(into))
    return importlib.import_module("iseq_baseline")


def stream(pkg: ModuleType, events: int) -> list[Any]:
    return [pkg.Interval("ABC"[i % 3], BASE_US + i * STEP_US, BASE_US + i * STEP_US,
                         {"value": float(i % 97), "type": "ABC"[i % 3], "id": i % 50}, f"src-0-{i % 10}:{i // 10}")
            for i in range(events)]


def run_once(pkg: ModuleType, items: list[Any], indexing: str, window_ms: int) -> tuple[float, Any, list[list[Any]]]:
    query = pkg.parse_iseq(QUERY.format(window_ms=window_ms))
    engine = pkg.IntervalEngine(query, pkg.IntervalEngineConfig(indexing=indexing))
    end = items[-1].end_ts_us + 10_000_000
    outputs: list[Any] = []
    started = time.process_time()
    for item in items:
        outputs.append(engine.on_item(item))
    outputs.append(engine.advance_clock(end) + engine.finish())
    cpu_s = time.process_time() - started
    return cpu_s, engine, [sorted((o.kind, o.key) for o in out) for out in outputs]


def measure(pkg: ModuleType, events: int, indexing: str, repeat: int, window_ms: int) -> Run:
    items = stream(pkg, events)
    best_s, engine, outputs = run_once(pkg, items, indexing, window_ms)
    for _ in range(repeat - 1):
        cpu_s, engine, outputs = run_once(pkg, items, indexing, window_ms)
        best_s = min(best_s, cpu_s)
    c = engine.counters
    return Run(events, best_s, c.join_probes, c.peak_buffered, outputs)


def profile(events: int, indexing: str, window_ms: int) -> None:
    items = stream(cep.intervals, events)
    profiler = cProfile.Profile()
    profiler.enable()
    run_once(cep.intervals, items, indexing, window_ms)
    profiler.disable()
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(15)


def row(label: str, r: Run) -> str:
    return (f"{label:>8} {r.cpu_s:>9.3f} {r.events_per_s:>10.0f} {r.probes / r.events:>13.1f} {r.records:>8} "
            f"{r.peak_buffered:>6}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--indexing", nargs="+", choices=PROFILES, default=list(PROFILES))
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--window-ms", type=int, default=20,
                        help="the query's window (20: the Spark benchmark's, no result on this stream; 25: results)")
    parser.add_argument("--baseline", metavar="REV", help="also run cep/intervals of this commit")
    parser.add_argument("--profile", action="store_true", help="cProfile the largest size (first profile)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engines = {"now": cep.intervals}
        if args.baseline:
            engines = {args.baseline[:8]: baseline_package(args.baseline, Path(tmp)), **engines}
        print(f"query: {QUERY.format(window_ms=args.window_ms)}")
        print(f"{'N':>7} {'indexing':>8} {'engine':>8} {'CPU s':>9} {'events/s':>10} {'probes/event':>13} "
              f"{'records':>8} {'peak':>6}")
        for events in args.sizes:
            for indexing in args.indexing:
                runs = {name: measure(pkg, events, indexing, args.repeat, args.window_ms) for name, pkg in engines.items()}
                for name, r in runs.items():
                    print(f"{events:>7} {indexing:>8} {row(name, r)}", flush=True)
                if len({str(r.outputs) for r in runs.values()}) > 1:
                    print(f"{events:>7} {indexing:>8} OUTPUTS DIFFER between engines", flush=True)
    if args.profile:
        profile(max(args.sizes), args.indexing[0], args.window_ms)


if __name__ == "__main__":
    main()
