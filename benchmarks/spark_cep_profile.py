"""Where a CEP job's Python time goes per micro-batch, without Spark: the state function each job hands to
``applyInPandasWithState`` run on the chunk Spark would hand it (one stream, the benchmark's record shape, as
pandas columns), phase by phase, plus pyinstrument's call tree (docs/spark-cep-profile.txt).

Phases: ``core`` = the pure core's own work (``on_events`` + ``on_watermark``: the cep objects and the job adapter
that builds result dicts), ``state`` = restoring and snapshotting the group state blob, ``shell`` = everything else
(pandas chunk to columns, sorting, punctuations, T_a, JSON encoding of the results, the output frame).

Run: .venv/bin/python benchmarks/spark_cep_profile.py (benchmarks/spark_three_window.py calls it for its report).
``--keys N`` spreads the events over N partition keys (default 50: every key gets events in every micro-batch);
with many keys and small batches each batch touches a few of them, which is what an incremental snapshot is for.
``--jobs``, ``--events``, ``--batches`` pick a subset and the batch shape, ``--no-tree`` skips the call tree (e.g. to
run this script against an older checkout's code: ``PYTHONPATH=<checkout> python benchmarks/spark_cep_profile.py``).
``--cprofile N`` runs each job's state function once more under cProfile and prints its N costliest functions by
own time (and by cumulative time): deterministic counts of calls, where pyinstrument samples.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

DOCS = Path(__file__).resolve().parents[1] / "docs"
BASE_US = 1_700_000_000_000_000
SEQUENCE_QUERY = "EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 20 ms"
PATTERN = "SEQ(a: type == 'A', b: type == 'B') PARTITION BY id WITHIN 10 ms MODE per_event MAX_UNCERTAINTY 1 ms"
PROFILED_JOBS = ("three_window", "window_count", "pattern", "sequence")
DEFAULT_KEYS = 50


def chunk(events: int, batch: int, *, jvm_value: bool, keys: int = DEFAULT_KEYS) -> Any:
    """One stream's micro-batch as Spark hands it to Python: the benchmark's events (10k/s of event time, 10
    sources, payload value/type/id with ``keys`` ids in turn), the columns the job ships."""
    import pandas as pd

    i = np.arange(batch * events, (batch + 1) * events)
    frame = pd.DataFrame({
        "group_key": ["a"] * events, "kind": ["event"] * events, "stream": ["a"] * events,
        "source_id": [f"src-0-{k % 10}" for k in i], "seq": i // 10, "ref_ts_us": BASE_US + i * 100,
        "uncertainty_us": np.full(events, 500), "watermark_us": np.full(events, np.nan),
        "rtt_us": np.full(events, np.nan), "late": [False] * events, "late_reason": [None] * events,
        "payload": [orjson.dumps({"value": float(k % 97), "type": "ABC"[k % 3], "id": int(k % keys)}).decode()
                    for k in i],
        "topic": ["p.events.a"] * events, "partition": np.zeros(events, dtype=np.int32), "offset": i})
    if jvm_value:
        frame["value"] = (i % 97).astype(float)
        frame = frame.drop(columns=["payload"])
    return frame


class _State:
    """Spark's GroupState as the state function uses it."""

    def __init__(self) -> None:
        self.exists = False
        self.get: tuple[bytes] | None = None

    def update(self, value: tuple[bytes]) -> None:
        self.exists, self.get = True, value


class _Timed:
    """Wraps a core: adds the time of its calls to ``spent``."""

    def __init__(self, core: Any, spent: dict[str, float]) -> None:
        self.core, self.spent = core, spent

    def _timed(self, phase: str, call: Callable[..., Any], *args: Any) -> Any:
        started = time.perf_counter()
        try:
            return call(*args)
        finally:
            self.spent[phase] += time.perf_counter() - started

    def on_events(self, batch: Any) -> Any:
        core_on_events = getattr(self.core, "on_events", None)
        if core_on_events is None:
            return self._timed("core", self.core.on_rows, batch.rows())
        return self._timed("core", core_on_events, batch)

    def on_rows(self, rows: Any) -> Any:
        return self._timed("core", self.core.on_rows, rows)

    def on_watermark(self, watermark_us: int) -> Any:
        return self._timed("core", self.core.on_watermark, watermark_us)

    def set_ta_us(self, ta_us: int) -> None:
        self.core.set_ta_us(ta_us)

    def snapshot(self) -> bytes:
        blob: bytes = self._timed("state", self.core.snapshot)
        return blob


def factories() -> dict[str, Callable[[str, bytes | None], Any]]:
    from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
    from cep.patterns import PatternSpec
    from cep.sase import EngineConfig, parse_query
    from spark_jobs import pattern, sequence, three_window, window_count

    tw = three_window.ThreeWindowOptions("-", width_us=1_000_000, max_shift_us=1_000)
    wc = window_count.WindowCountOptions("-", width_us=1_000_000)
    spec = PatternSpec.parse(PATTERN)
    query = parse_query(SEQUENCE_QUERY)
    config = EngineConfig(mode="conservative", allowed_lateness_us=DEFAULT_ALLOWED_LATENESS_US)
    return {
        "three_window": lambda s, b: three_window.ThreeWindowCore(s, tw, 0, b),
        "window_count": lambda s, b: window_count.WindowCountCore(s, wc, b),
        "pattern": lambda s, b: pattern.PatternStreamCore(s, spec, 0, False, DEFAULT_ALLOWED_LATENESS_US, b),
        "sequence": lambda s, b: sequence.SequenceStreamCore(s, query, config, "type", b),
    }


def phase_costs(job: str, events: int = 100_000, batches: int = 2, keys: int = DEFAULT_KEYS) -> dict[str, float]:
    """Seconds per phase over ``batches`` micro-batches of ``events`` each (the state grows as in the benchmark:
    its one punctuation comes last), and the blob size after them."""
    from spark_jobs.stateful import make_stream_function

    spent = {"core": 0.0, "state": 0.0, "total": 0.0}
    make = factories()[job]

    def factory(stream: str, blob: bytes | None) -> _Timed:
        started = time.perf_counter()
        core = make(stream, blob)
        spent["state"] += time.perf_counter() - started
        return _Timed(core, spent)

    apply = make_stream_function(job, factory, lambda _s: ("p.events.a", 1))
    state = _State()
    for b in range(batches):
        frame = chunk(events, b, jvm_value=job == "three_window", keys=keys)
        started = time.perf_counter()
        for _out in apply(("a",), iter([frame]), state):
            pass
        spent["total"] += time.perf_counter() - started
    spent["shell"] = spent["total"] - spent["core"] - spent["state"]
    spent["events"] = float(events * batches)
    spent["blob_bytes"] = float(len(state.get[0])) if state.get else 0.0
    return spent


def write_profile_tree(jobs: tuple[str, ...] = PROFILED_JOBS) -> Path:
    from pyinstrument import Profiler

    texts = []
    for job in jobs:
        profiler = Profiler(interval=0.001)
        profiler.start()
        phase_costs(job, events=50_000, batches=2)
        profiler.stop()
        texts.append(f"===== {job}: state function, 2 micro-batches x 50,000 events of one stream =====\n"
                     + profiler.output_text(unicode=False, color=False, show_all=False))
    out = DOCS / "spark-cep-profile.txt"
    out.write_text("\n".join(texts))
    return out


def cprofile_top(job: str, events: int, batches: int, keys: int, top: int) -> str:
    """cProfile of :func:`phase_costs` for one job: its ``top`` functions by own time, then by cumulative time."""
    import cProfile
    import io
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    phase_costs(job, events, batches, keys)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).strip_dirs()
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="also write the phases as JSON (spark_three_window.py --phases-json)")
    parser.add_argument("--jobs", nargs="+", choices=PROFILED_JOBS, default=list(PROFILED_JOBS))
    parser.add_argument("--events", type=int, default=100_000, help="events per micro-batch")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--keys", type=int, default=DEFAULT_KEYS, help="partition keys (payload ids) in turn")
    parser.add_argument("--no-tree", action="store_true", help="skip the pyinstrument call tree")
    parser.add_argument("--cprofile", type=int, metavar="N", help="print each job's N costliest functions (cProfile)")
    args = parser.parse_args()
    phases = {}
    for job in args.jobs:
        spent = phases[job] = phase_costs(job, args.events, args.batches, args.keys)
        per = {k: spent[k] * 1e6 / spent["events"] for k in ("shell", "state", "core", "total")}
        print(f"{job:>13}: " + "  ".join(f"{k} {v:5.1f} us/event" for k, v in per.items())
              + f"  blob {spent['blob_bytes'] / 1e6:.2f} MB", flush=True)
    if args.cprofile is not None:
        for job in args.jobs:
            print(f"===== cProfile, {job}: {args.batches} micro-batches x {args.events:,} events =====")
            print(cprofile_top(job, args.events, args.batches, args.keys, args.cprofile), flush=True)
    if not args.no_tree:
        print(f"wrote {write_profile_tree()}")
    if args.json is not None:
        # For benchmarks/spark_three_window.py --phases-json (the report without profiling again).
        args.json.write_bytes(orjson.dumps(phases))


if __name__ == "__main__":
    main()
