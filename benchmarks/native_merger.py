"""CPU time per event of the merge: reorder.merger (Python) and skewless_native.MultiSourceMerger (Rust), same input.

    .venv/bin/python -m benchmarks.native_merger [--events N] [--repeats R]

Each workload is built once (events, arrivals, mappings) and replayed into a fresh merger of each core, the two
cores alternating run by run; the figure is the median of the runs' process CPU time divided by the events pushed.
The loop that feeds a merger is the same Python loop for both, so the native figures include one boundary crossing
per call (per event for ``push``, per frame for ``push_run``). Both cores must end with the same counters (checked).
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import skewless_native

from reorder.merger import MergerConfig, MultiSourceMerger
from reorder.records import SourceEvent
from timesync.clocks import IdentityMapping

FRAME_EVENTS = 50
FRAME_INTERVAL_US = 100_000  # a source's frame every 100 ms, as the SDK's default flush


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str
    sources: list[str]
    # Per call: ("push", event, arrival_us, (ref_us, error_us)) or ("run", source_id, [(event, arrival, mapping)])
    # or ("beat", source_id, seq, ref_us); each at its now_us (the arrival).
    calls: list[tuple[Any, ...]]
    events: int


def _frames(n_sources: int, n_events: int, jitter_us: int, seed: int) -> list[tuple[int, str, list[SourceEvent]]]:
    """Each source sends a frame of FRAME_EVENTS events every FRAME_INTERVAL_US (sources staggered), stamps spread
    over the frame's interval plus ``jitter_us`` of clock noise kept monotone per source; (arrival_us, source, events)
    sorted by arrival."""
    rng = random.Random(seed)
    per_source = n_events // n_sources
    frames = []
    for s in range(n_sources):
        source_id = f"src-{s:04d}"
        stagger_us = s * FRAME_INTERVAL_US // n_sources
        last_ts = 0
        for f in range(per_source // FRAME_EVENTS):
            start_us = f * FRAME_INTERVAL_US + stagger_us
            events = []
            for i in range(FRAME_EVENTS):
                seq = f * FRAME_EVENTS + i
                ts = max(last_ts + 1, start_us + i * FRAME_INTERVAL_US // FRAME_EVENTS + rng.randint(0, jitter_us))
                last_ts = ts
                events.append(SourceEvent(source_id, "R", seq, ts, b"payload"))
            frames.append((start_us + FRAME_INTERVAL_US + rng.randint(0, 2_000), source_id, events))
    frames.sort(key=lambda f: f[0])
    return frames


def per_event_workload(name: str, n_sources: int, n_events: int, jitter_us: int) -> Workload:
    calls: list[tuple[Any, ...]] = []
    for arrival, _source_id, events in _frames(n_sources, n_events, jitter_us, seed=n_sources):
        calls.extend(("push", e, arrival, (e.source_ts_us, 50)) for e in events)
    return Workload(name, sorted({c[1].source_id for c in calls}), calls, len(calls))


def run_workload(name: str, n_sources: int, n_events: int, jitter_us: int) -> Workload:
    calls: list[tuple[Any, ...]] = []
    events = 0
    for arrival, source_id, frame in _frames(n_sources, n_events, jitter_us, seed=n_sources):
        calls.append(("run", source_id, [(e, arrival, (e.source_ts_us, 50)) for e in frame], arrival))
        events += len(frame)
    return Workload(name, sorted({c[1] for c in calls}), calls, events)


def heartbeat_workload(name: str, n_sources: int, rounds: int) -> Workload:
    """Idle sources heartbeating (no events): the merge's cost per heartbeat, its punctuation scan included."""
    calls: list[tuple[Any, ...]] = []
    for r in range(rounds):
        for s in range(n_sources):
            now = r * 100_000 + s * 100_000 // n_sources
            calls.append(("beat", f"src-{s:04d}", -1, now, now))
    return Workload(name, sorted({c[1] for c in calls}), calls, len(calls))


def replay(factory: Callable[[], Any], workload: Workload) -> tuple[int, dict[str, int]]:
    """CPU ns of one replay into a fresh merger, and its counters."""
    merger = factory()
    for source_id in workload.sources:
        merger.register(source_id, 0)
    push, push_run, heartbeat = merger.push, merger.push_run, merger.heartbeat
    start = time.process_time_ns()
    for call in workload.calls:
        kind = call[0]
        if kind == "push":
            _, event, arrival, mapped = call
            push(event, arrival, arrival, mapped=mapped)
        elif kind == "run":
            _, source_id, run, arrival = call
            push_run(source_id, run, arrival)
        else:
            _, source_id, seq, ref, now = call
            heartbeat(source_id, seq, ref, now, mapped=(ref, 50))
    elapsed = time.process_time_ns() - start
    counters = merger.counters
    return elapsed, (counters.as_dict() if hasattr(counters, "as_dict") else dataclasses.asdict(counters))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = MergerConfig()  # the gateway's defaults: watermark mode, learned waits, 1 ms punctuation interval
    cores: dict[str, Callable[[], Any]] = {
        "python": lambda: MultiSourceMerger("R", IdentityMapping(), config),
        "native": lambda: skewless_native.MultiSourceMerger("R", IdentityMapping(), config),
    }
    workloads = [
        per_event_workload("20 sources in order, push per event", 20, args.events, 0),
        per_event_workload("20 sources, 3 ms clock jitter, push per event", 20, args.events, 3_000),
        run_workload(f"20 sources in order, push_run per frame of {FRAME_EVENTS}", 20, args.events, 0),
        run_workload(f"200 sources, 3 ms jitter, push_run per frame of {FRAME_EVENTS}", 200, args.events, 3_000),
        heartbeat_workload("1,000 idle sources, heartbeat per call", 1_000, max(1, args.events // 1_000)),
    ]
    print(f"CPU time per event (us), median of {args.repeats} alternating runs; {platform.python_implementation()} "
          f"{platform.python_version()}, {platform.machine()}")
    print()
    print("| workload | events | python us/event | native us/event | python / native |")
    print("|---|---:|---:|---:|---:|")
    for workload in workloads:
        times: dict[str, list[int]] = {name: [] for name in cores}
        counters: dict[str, dict[str, int]] = {}
        for _ in range(args.repeats):
            for name, factory in cores.items():
                elapsed, counters[name] = replay(factory, workload)
                times[name].append(elapsed)
        if counters["python"] != counters["native"]:
            raise SystemExit(f"{workload.name}: the cores disagree: {counters}")
        py_us, native_us = (statistics.median(times[name]) / 1_000 / workload.events for name in ("python", "native"))
        print(f"| {workload.name} | {workload.events:,} | {py_us:.3f} | {native_us:.3f} | {py_us / native_us:.1f}x |")


if __name__ == "__main__":
    main()
