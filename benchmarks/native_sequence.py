"""CPU time per event of the sequence reorderer: the Python core (reorder/sequence.py) and the native one
(native/src/sequence.rs, skewless_native.SequenceReorderer) on the same traces.

    .venv/bin/python -m benchmarks.native_sequence [--events N] [--runs R] [--profile dataset1]

Each trace is one source's events in arrival order, driven as the replay drives a reorderer: every deadline due
strictly before an arrival fires first (``advance``), then the event is pushed (``push``). The variants:

* python, per event: ``SequenceReorderer.push`` / ``advance`` in a Python loop (what the gateway runs today);
* native, per event: the same loop calling the native core's ``push`` / ``advance`` (same API, same records);
* native, batches: ``push_arrivals`` does the loop in Rust for a batch of ``--batch`` events (a frame's worth) and
  returns the same records in one list (one list of the whole trace would cost more in Python's garbage collector,
  which walks every live record, than the reorderer does);
* native core only: ``run_sequence_core``, the Rust loop on handles, no Python object per event (the cost the
  compiled per-event path pays for this stage).

CPU time (``time.process_time``) of each variant, the variants alternating run after run; the table gives the
median and the lowest per event. Every variant's outputs are checked to agree (counts) before timing.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable

import skewless_native

from reorder.eval.traces import PROFILES, TraceSpec, generate
from reorder.records import GapSkipped, Late, Released, SourceEvent
from reorder.sequence import SequenceConfig, SequenceReorderer

RECORDS = (Released, Late, GapSkipped)


def trace_of(profile: str, events: int, seed: int) -> tuple[list[SourceEvent], list[int]]:
    """One source's events in arrival order (ties by seq, as the replay orders them), and their arrival times."""
    trace = generate(TraceSpec(PROFILES[profile], events_per_source=events, sources=1, seed=seed, payload=False))
    trace.sort(key=lambda e: (e.arrival_ts_us, e.seq))
    return ([SourceEvent(e.source_id, e.stream, e.seq, e.source_ts_us, i) for i, e in enumerate(trace)],
            [e.arrival_ts_us for e in trace])


def in_order_trace(events: int) -> tuple[list[SourceEvent], list[int]]:
    return [SourceEvent("s0", "R", i, 66 * i, i) for i in range(events)], [66 * i for i in range(events)]


def per_event_loop(reorderer: SequenceReorderer | skewless_native.SequenceReorderer,
                   events: list[SourceEvent], arrivals: list[int]) -> int:
    push = reorderer.push
    advance = reorderer.advance
    next_deadline = reorderer.next_deadline_us
    n = 0
    for event, t in zip(events, arrivals, strict=True):
        while (due := next_deadline()) is not None and due < t:
            n += len(advance(due))
        n += len(push(event, t))
    return n


def variants(config: SequenceConfig, events: list[SourceEvent], arrivals: list[int],
             batch: int = 1000) -> dict[str, Callable[[], int]]:
    seqs = [e.seq for e in events]
    batches = [(events[i:i + batch], arrivals[i:i + batch]) for i in range(0, len(events), batch)]

    def python() -> int:
        return per_event_loop(SequenceReorderer("s0", "R", config), events, arrivals)

    def native_per_event() -> int:
        return per_event_loop(skewless_native.SequenceReorderer("s0", "R", config, records=RECORDS), events, arrivals)

    def native_batch() -> int:
        r = skewless_native.SequenceReorderer("s0", "R", config, records=RECORDS)
        push_arrivals = r.push_arrivals
        return sum(len(push_arrivals(b_events, b_arrivals)) for b_events, b_arrivals in batches)

    def native_core() -> int:
        return sum(skewless_native.run_sequence_core(config, seqs, arrivals))

    return {"python, per event": python, "native, per event": native_per_event,
            "native, batches (push_arrivals)": native_batch, "native core only (no Python objects)": native_core}


def measure(fns: dict[str, Callable[[], int]], runs: int, n_events: int) -> dict[str, tuple[float, float]]:
    counts = {name: fn() for name, fn in fns.items()}  # warm-up, and the check that all agree
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the variants disagree on the number of outputs: {counts}")
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():  # alternating: a slow spell of the machine hits every variant alike
            t0 = time.process_time()
            fn()
            samples[name].append((time.process_time() - t0) / n_events * 1e6)
    return {name: (statistics.median(s), min(s)) for name, s in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events per trace")
    parser.add_argument("--runs", type=int, default=7, help="timed runs of each variant")
    parser.add_argument("--profile", default="dataset1", choices=sorted(PROFILES), help="disorder profile")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1000, help="events per push_arrivals call")
    args = parser.parse_args()
    traces = {
        f"{args.profile} (seed {args.seed})": trace_of(args.profile, args.events, args.seed),
        "in order": in_order_trace(args.events),
    }
    configs = {"adaptive": SequenceConfig(), "thesis": SequenceConfig.thesis()}
    print(f"CPU us per event, median (lowest) of {args.runs} alternating runs, {args.events:,} events per trace; "
          f"batches of {args.batch}; Python {platform.python_version()}, {platform.machine()}")
    print()
    header = f"| trace | mode | {' | '.join(variants(SequenceConfig(), [], []))} | python / native batches |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for trace_name, (events, arrivals) in traces.items():
        for mode, config in configs.items():
            result = measure(variants(config, events, arrivals, args.batch), args.runs, len(events))
            cells = [f"{med:.3f} ({low:.3f})" for med, low in result.values()]
            ratio = result["python, per event"][0] / result["native, batches (push_arrivals)"][0]
            print(f"| {trace_name} | {mode} | {' | '.join(cells)} | {ratio:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
