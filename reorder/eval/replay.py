"""Deterministic virtual-time replay of a trace through one approach, with the thesis' metrics.

Approaches. ``sequence`` (adaptive gap timeout, watermark merge) and ``thesis`` (Eq. 3.11 timeout, the thesis'
merge rule) run :class:`reorder.pipeline.IngestPipeline`, the gateway's own wiring of per-source reorderers, the
reference mapping and the merger, with its future-dated quarantine, join grace and heartbeat rule. ``kslack``,
``mpkslack``, ``aqkslack`` and ``oracle`` are the baselines of this package.

Accounting. Every event of the trace ends in exactly one place: released on the main output (``released_events``;
``late_passed_events`` of them were released although late, by ``drop_late=False`` or a K-slack releasing behind a
newer event), diverted to the late side output (``late_events``, split by reason in ``late_events_<reason>``), or
dropped as a duplicate (``duplicate_events``). ``released + late + duplicate = events`` is checked on every replay;
:class:`AccountingError` says which event broke it.

Metrics (thesis section 5.2.2, on each stream's main output):

* latency of an event = release time - arrival time (the delay the reorderer adds); ``p99_latency_ms`` is the
  latency no more than 1 % of the released events exceed (nearest rank);
* an output event is *out of order* when the event released just before it on the same stream has a
  larger ``true_ts_us``; an event diverted to the late side output (never released) also counts as out
  of order, so dropping late events cannot buy accuracy; a dropped duplicate does not (its first copy was
  scored where it was released);
* injected out-of-order events: the same count over the arrival order;
* ``accuracy_pct = 100 * (injected - out_of_order) / injected`` (negative when the output is worse
  than the input, as in Table 5.10).

Time only moves through the trace's timestamps and the components' deadlines: same trace, same options,
same numbers.  A deadline that falls exactly on an arrival time fires after that arrival (an event
arriving at the deadline is in time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from contract.records import EventRecord
from contract.wire.messages import IncomingEvent
from reorder.eval.kslack import AQKSlack, AQKSlackConfig, KSlack, MPKSlack
from reorder.eval.oracle import oracle_schedule
from reorder.eval.syncsim import SourceClockModel, SyncPlan, plan_sync
from reorder.eval.traces import TraceEvent
from reorder.merger import VIRTUAL_TIME_FLOOR_US, MergerConfig
from reorder.pipeline import IngestPipeline, PipelineConfig, PipelineCores, PipelineOutput, PublishRecord
from reorder.records import Late, Released, SourceEvent
from reorder.sequence import (
    DEFAULT_MAX_BUFFERED,
    DEFAULT_MAX_LATENCY_THRESHOLD_US,
    DEFAULT_WARMUP_MIN_TIMEOUT_US,
    SequenceConfig,
)
from timesync.clocks import EstimateMapping, IdentityMapping, ReferenceMapping
from timesync.estimator import ClockEstimate

__all__ = ["APPROACHES", "AccountingError", "Approach", "ReplayOptions", "ReplayResult", "pipeline_config", "replay"]

Approach = Literal["sequence", "thesis", "kslack", "mpkslack", "aqkslack", "oracle"]
APPROACHES: tuple[Approach, ...] = ("sequence", "thesis", "kslack", "mpkslack", "aqkslack", "oracle")
PIPELINE_APPROACHES: tuple[Approach, ...] = ("sequence", "thesis")


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    approach: Approach = "sequence"
    latency_threshold_us: int | None = None
    """Default: 2 s for ``sequence``, 500 ms for ``thesis`` (Query 5.3)."""
    alpha: float = 0.6
    beta: float = 0.6
    drop_late: bool = False
    """Query 4.3's 7th parameter (``sequence``, ``thesis``). False, as the thesis ran it: a late event joins the
    merge at once, released behind newer ones. True, as the gateway runs: it only goes to the late side output."""
    target_accuracy: float = 0.9999
    min_gap_timeout_us: int = 0
    """``sequence``: never give up on a gap sooner (the gateway's floor is 200 ms, ``GATEWAY_MIN_GAP_TIMEOUT_US``)."""
    warmup_min_timeout_us: int = DEFAULT_WARMUP_MIN_TIMEOUT_US
    """``sequence``: until the gap quantile rests on 1 / (1 - target_accuracy) samples, never give up on a gap sooner
    (:data:`reorder.sequence.DEFAULT_WARMUP_MIN_TIMEOUT_US`; 0 turns the warm-up floor off)."""
    max_latency_threshold_us: int = DEFAULT_MAX_LATENCY_THRESHOLD_US
    """``sequence``: how far the latency threshold may learn (:class:`SequenceConfig`; 0: the threshold is fixed)."""
    max_buffered: int = DEFAULT_MAX_BUFFERED
    """``sequence``, ``thesis``: early events one reorderer may hold before it gives its head gap up."""
    k_us: int = 100_000
    """Fixed K of ``kslack``."""
    sync: bool = True
    """Map source timestamps through simulated time sync (else ``t_ref = source_ts``)."""
    heartbeats: bool = True
    """``sequence``: each sync round also proves the source alive (its seq and clock) to the merger."""
    learn_merge_wait: bool = True
    """``sequence``: the merge waits for a silent source at least as long as that source's silences say
    (:class:`MergerConfig` ``learn_wait``); False: only as long as its reorderer's gap wait."""
    linger_us: int = 2_000_000
    """Sources stay connected this long after the trace's last arrival: their sync rounds (and heartbeats) go on, as a
    live source's do when it has nothing to send. Without it every source vanishes at once when the trace ends and
    the merge waits out each one in turn, a cost no live stream pays."""
    sync_plan: SyncPlan = field(default_factory=SyncPlan)
    seed: int = 1
    aq: AQKSlackConfig = field(default_factory=AQKSlackConfig)
    emit: bool = False
    tolerance_us: int = 100
    """``*_tol`` metrics count an inversion only if it exceeds this (about a LAN time sync's error)."""
    bucket_us: int = 1_000_000
    """Arrival-time bucket for the per-interval average / max latency series (Figures 5.6-5.7)."""
    cores: PipelineCores | None = None
    """``sequence``, ``thesis``: the pipeline's reorderer and merger cores; None: the Python ones (reorder/sequence.py,
    reorder/merger.py). The CLI injects the native ones (``--core native``): this floor may not import them."""


@dataclass(slots=True)
class ReplayResult:
    metrics: dict[str, float | int | str]
    emitted: list[tuple[str, str, int, int, int]]
    """(source_id, stream, seq, release_ts_us, ref_ts_us) in release order (if ``emit``)."""
    series: list[tuple[int, float, float]]
    """(bucket start us, average latency ms, max latency ms) by arrival time."""


class AccountingError(AssertionError):
    """An event of the trace was accounted for twice, or not at all: the replay's numbers would be wrong."""


_PENDING, _RELEASED, _LATE, _DUPLICATE = 0, 1, 2, 3
_OUTCOME_NAMES = ("not accounted for", "released", "late", "duplicate")


class _Collector:
    """Where each event of the trace ended, exactly once, and the order metrics of the main output."""

    def __init__(self, events: Sequence[TraceEvent], emit: bool, tolerance_us: int) -> None:
        self.tolerance_us = tolerance_us
        self.events = events
        self.outcome = bytearray(len(events))
        self.release_us: list[int | None] = [None] * len(events)
        self.last_true: dict[str, int] = {}
        self.out_of_order = 0
        self.out_of_order_ms = 0
        self.out_of_order_tol = 0
        self.released = 0
        self.late_passed = 0
        self.late_by_reason: dict[str, int] = {}
        self.duplicates = 0
        self.emit = emit
        self.emitted: list[tuple[str, str, int, int, int]] = []

    def _account(self, i: int, outcome: int) -> None:
        previous = self.outcome[i]
        if previous != _PENDING:
            e = self.events[i]
            raise AccountingError(f"event {i} ({e.source_id}, {e.stream}, seq {e.seq}) counted twice: "
                                  f"{_OUTCOME_NAMES[previous]}, then {_OUTCOME_NAMES[outcome]}")
        self.outcome[i] = outcome

    def release(self, i: int, release_us: int, ref_ts_us: int, *, late: bool = False) -> None:
        self._account(i, _RELEASED)
        e = self.events[i]
        self.release_us[i] = release_us
        self.released += 1
        self.late_passed += late
        last = self.last_true.get(e.stream)
        if last is not None and last > e.true_ts_us:
            self.out_of_order += 1
            if last // 1000 > e.true_ts_us // 1000:
                self.out_of_order_ms += 1
            if last - e.true_ts_us > self.tolerance_us:
                self.out_of_order_tol += 1
        self.last_true[e.stream] = e.true_ts_us
        if self.emit:
            self.emitted.append((e.source_id, e.stream, e.seq, release_us, ref_ts_us))

    def divert(self, i: int, reason: str) -> None:
        self._account(i, _LATE)
        self.late_by_reason[reason] = self.late_by_reason.get(reason, 0) + 1
        self.out_of_order += 1
        self.out_of_order_ms += 1
        self.out_of_order_tol += 1

    def duplicate(self, i: int) -> None:
        self._account(i, _DUPLICATE)
        self.duplicates += 1

    @property
    def late(self) -> int:
        return sum(self.late_by_reason.values())

    def check(self) -> None:
        """released + late + duplicate = events, every event in exactly one of them."""
        pending = self.outcome.find(_PENDING)
        if pending >= 0:
            e = self.events[pending]
            left = self.outcome.count(_PENDING)
            raise AccountingError(f"{left} events neither released, late nor duplicate, e.g. event {pending} "
                                  f"({e.source_id}, {e.stream}, seq {e.seq})")
        if self.released + self.late + self.duplicates != len(self.events):
            raise AccountingError(f"released {self.released} + late {self.late} + duplicate {self.duplicates} "
                                  f"!= {len(self.events)} events")


def _injected_out_of_order(
    events: Sequence[TraceEvent], order: Sequence[int], unit_us: int = 1, tolerance_us: int = 0
) -> int:
    """Out-of-order events of the arrival order: true timestamps truncated to ``unit_us``, and the
    predecessor larger by more than ``tolerance_us``."""
    last: dict[str, int] = {}
    n = 0
    for i in order:
        e = events[i]
        ts = e.true_ts_us // unit_us
        prev = last.get(e.stream)
        if prev is not None and prev - ts > tolerance_us:
            n += 1
        last[e.stream] = ts
    return n


def _accuracy(injected: int, remaining: int) -> float:
    # with nothing injected, any disorder in the output is a total failure
    if injected:
        return 100.0 * (injected - remaining) / injected
    return 100.0 if remaining == 0 else 0.0


def _nearest_rank(values: list[int], q: float) -> int:
    """The ``q``-quantile of ``values`` by nearest rank (the ceil(q * n)-th smallest); 0 for none."""
    if not values:
        return 0
    values.sort()
    return values[max(0, math.ceil(round(q * len(values), 9)) - 1)]


def _peak_in_flight(events: Sequence[TraceEvent], col: _Collector) -> int:
    marks: list[tuple[int, int]] = []
    for i, e in enumerate(events):
        marks.append((e.arrival_ts_us, 1))
        rel = col.release_us[i]
        marks.append((e.arrival_ts_us if rel is None else rel, -1))
    marks.sort()  # at equal times departures (-1) sort first: an event passed straight through never counts
    peak = cur = 0
    for _, d in marks:
        cur += d
        peak = max(peak, cur)
    return peak


# -- the production pipeline ---------------------------------------------------------------------


def pipeline_config(opts: ReplayOptions) -> PipelineConfig:
    """The :class:`PipelineConfig` a pipeline approach runs: the replay's knobs, the gateway's everything else."""
    cap = opts.latency_threshold_us
    if opts.approach == "thesis":
        sequence = SequenceConfig.thesis(latency_threshold_us=500_000 if cap is None else cap,
                                         alpha=opts.alpha, beta=opts.beta, max_buffered=opts.max_buffered)
        merger = MergerConfig(mode="thesis")
    else:
        sequence = SequenceConfig(latency_threshold_us=2_000_000 if cap is None else cap, alpha=opts.alpha,
                                  beta=opts.beta, target_accuracy=opts.target_accuracy,
                                  min_timeout_us=opts.min_gap_timeout_us,
                                  warmup_min_timeout_us=opts.warmup_min_timeout_us,
                                  max_latency_threshold_us=opts.max_latency_threshold_us,
                                  max_buffered=opts.max_buffered)
        merger = MergerConfig(mode="watermark", learn_wait=opts.learn_merge_wait)
    # Virtual time starts at 0 with source clocks behind it: references below the record contract's 0 are normal.
    config = PipelineConfig(sequence=sequence, merger=merger, drop_late=opts.drop_late,
                            ts_floor_us=VIRTUAL_TIME_FLOOR_US)
    if opts.cores is not None:
        config = opts.cores.apply(config)
    return config


@dataclass(frozen=True, slots=True)
class _Control:
    """A control-plane event of the replay: a new clock estimate, a hello or a heartbeat."""

    at_us: int
    kind: int  # 0 estimate, 1 hello, 2 heartbeat: the order among equal times
    source_id: str
    stream: str
    estimate: ClockEstimate | None = None
    next_seq: int = 0
    """Heartbeat: the seq the source's next event will carry."""
    source_clock_us: int = 0


def _control_events(events: Sequence[TraceEvent], order: Sequence[int], opts: ReplayOptions) -> list[_Control]:
    """Clock estimates, hellos and heartbeats of every source, in time order.

    A source syncs before it connects (as the SDK does), so its hello comes with its first sync round; with
    ``heartbeats``, each round also tells the gateway the seq the source's next event will carry.
    """
    per_source: dict[tuple[str, str], list[int]] = {}
    for i in order:
        e = events[i]
        per_source.setdefault((e.source_id, e.stream), []).append(i)
    end_us = max((e.arrival_ts_us for e in events), default=0) + opts.linger_us
    control: list[_Control] = []
    heartbeats = opts.heartbeats and opts.approach != "thesis"  # Query 5.3's merger knows no heartbeats
    for (sid, stream), idxs in per_source.items():
        pairs = [(events[i].true_ts_us, events[i].source_ts_us) for i in idxs]
        model = SourceClockModel.fit(pairs)
        first_true = min(p[0] for p in pairs)
        # seq the source had sent by a given true time: events sorted by seq follow its clock
        by_seq = sorted(idxs, key=lambda i: events[i].seq)
        sent_true = [events[i].true_ts_us for i in by_seq]
        rounds = plan_sync(sid, model, first_true, end_us, opts.sync_plan, opts.seed)
        for rnd in rounds:
            if opts.sync and rnd.estimate is not None:
                control.append(_Control(rnd.effective_us, 0, sid, stream, estimate=rnd.estimate))
            if rnd is rounds[0]:
                control.append(_Control(rnd.effective_us, 1, sid, stream))
            if heartbeats:
                n_sent = _count_le(sent_true, rnd.started_us)
                next_seq = events[by_seq[n_sent - 1]].seq + 1 if n_sent else events[by_seq[0]].seq
                control.append(_Control(rnd.effective_us, 2, sid, stream, next_seq=next_seq,
                                        source_clock_us=rnd.source_clock_at_start_us))
    control.sort(key=lambda c: (c.at_us, c.kind, c.source_id, c.stream))
    return control


class _PipelineRun:
    """Drives one :class:`IngestPipeline` through the trace in virtual time, as the gateway's shell would."""

    def __init__(self, events: Sequence[TraceEvent], order: Sequence[int], opts: ReplayOptions,
                 col: _Collector) -> None:
        self.events = events
        self.order = order
        self.opts = opts
        self.col = col
        self.estimates = EstimateMapping()
        mapping: ReferenceMapping = self.estimates if opts.sync else IdentityMapping()
        self.pipeline = IngestPipeline(mapping, pipeline_config(opts))

    def _collect(self, outputs: list[PipelineOutput]) -> None:
        col = self.col
        for o in outputs:
            if type(o) is not PublishRecord:
                continue  # punctuation: the pipeline counts it
            record: EventRecord = o.record
            i = record.payload  # the replay carries each event's trace index as its payload
            assert isinstance(i, int)
            if o.topic == "events":
                col.release(i, record.release_ts_us, record.ref_ts_us, late=record.late)
            elif record.late_reason == "duplicate":
                col.duplicate(i)
            else:
                col.divert(i, record.late_reason or "late")

    def _fire_before(self, t_us: int) -> None:
        pipeline = self.pipeline
        while (due := pipeline.next_deadline_us()) is not None and due < t_us:
            self._collect(pipeline.advance(due))

    def _apply(self, c: _Control) -> None:
        if c.kind == 0:
            assert c.estimate is not None
            self.estimates.update(c.source_id, c.estimate)
        elif c.kind == 1:
            self._collect(self.pipeline.register(c.source_id, (c.stream,), c.at_us))
        else:
            self._collect(self.pipeline.heartbeat(c.source_id, {c.stream: c.next_seq}, c.source_clock_us, c.at_us))

    def run(self) -> None:
        events = self.events
        opts = self.opts
        control = _control_events(events, self.order, opts) if (opts.sync or opts.heartbeats) else []
        push = self.pipeline.push
        collect = self._collect
        ci = 0
        for i in self.order:
            e = events[i]
            t = e.arrival_ts_us
            while ci < len(control) and control[ci].at_us <= t:
                self._fire_before(control[ci].at_us)
                self._apply(control[ci])
                ci += 1
            self._fire_before(t)
            collect(push(e.source_id, IncomingEvent(e.stream, e.seq, e.source_ts_us, i), t))
        for c in control[ci:]:  # the sources linger after their last event
            self._fire_before(c.at_us)
            self._apply(c)
        # end of trace: every wait runs out on its own; whatever is then still held was lost (check() says so)
        self._fire_before(1 << 62)


def _count_le(sorted_values: list[int], x: int) -> int:
    lo, hi = 0, len(sorted_values)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_values[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


# -- baselines ----------------------------------------------------------------------------------


def _index(event: SourceEvent) -> int:
    """The replay carries each event's trace index in its payload."""
    idx = event.payload
    assert isinstance(idx, int)
    return idx


def _run_slack(events: Sequence[TraceEvent], order: Sequence[int], opts: ReplayOptions, col: _Collector) -> None:
    streams: dict[str, KSlack] = {}
    values = [float((e.payload or {}).get("v", 1)) for e in events]

    def make() -> KSlack:
        if opts.approach == "kslack":
            return KSlack(opts.k_us)
        if opts.approach == "mpkslack":
            return MPKSlack()
        # the correlation field is the trace's `v` (the thesis passed v_abs); the replay's payload is the index
        return AQKSlack(replace(opts.aq, value=lambda ev: values[_index(ev)]))

    def collect(outputs: list[Released | Late]) -> None:
        for o in outputs:
            if type(o) is Released:
                col.release(_index(o.event), o.release_us, o.event.source_ts_us, late=o.late)
            elif type(o) is Late and not o.passed:
                col.divert(_index(o.event), o.reason)
            # a passed Late (behind_output) is the report of a Released(late=True) counted above

    for i in order:
        e = events[i]
        s = streams.get(e.stream)
        if s is None:
            s = streams[e.stream] = make()
        collect(s.push(SourceEvent(e.source_id, e.stream, e.seq, e.source_ts_us, i), e.arrival_ts_us))
    end = max((e.arrival_ts_us for e in events), default=0)
    for s in streams.values():
        collect(s.flush(end))


def _run_oracle(events: Sequence[TraceEvent], col: _Collector) -> None:
    by_stream: dict[str, list[int]] = {}
    for i, e in enumerate(events):
        by_stream.setdefault(e.stream, []).append(i)
    merged: list[tuple[int, int, int]] = []
    for idxs in by_stream.values():
        sched = oracle_schedule([events[i].true_ts_us for i in idxs], [events[i].arrival_ts_us for i in idxs])
        merged += [(rel, pos, idxs[j]) for pos, (j, rel) in enumerate(sched)]
    merged.sort()
    for rel, _, i in merged:
        col.release(i, rel, events[i].true_ts_us)


def replay(events: Sequence[TraceEvent], opts: ReplayOptions | None = None) -> ReplayResult:
    """Replay ``events`` (any order) through ``opts.approach`` and measure it."""
    opts = opts if opts is not None else ReplayOptions()
    order = sorted(range(len(events)), key=lambda i: (events[i].arrival_ts_us, events[i].source_id, events[i].seq))
    col = _Collector(events, opts.emit, opts.tolerance_us)
    extra: dict[str, float | int | str] = {}
    if opts.approach in PIPELINE_APPROACHES:
        run = _PipelineRun(events, order, opts, col)
        run.run()
        counters = run.pipeline.counters
        extra = {
            "gaps_skipped": counters.gaps,
            "seqs_skipped": counters.gap_events_skipped,
            "quarantined": counters.quarantined,
            "merger_timeouts": counters.source_timeouts,
            "punctuations": counters.punctuations,
        }
    elif opts.approach == "oracle":
        _run_oracle(events, col)
    else:
        _run_slack(events, order, opts, col)
    col.check()
    return _finish(events, order, opts, col, extra)


def _finish(
    events: Sequence[TraceEvent],
    order: Sequence[int],
    opts: ReplayOptions,
    col: _Collector,
    extra: dict[str, float | int | str],
) -> ReplayResult:
    latencies, series = _latency_series(events, col, opts.bucket_us)
    total = sum(latencies)
    peak = max([0, *latencies])
    n = col.released
    injected = _injected_out_of_order(events, order)
    ooo = col.out_of_order
    accuracy = _accuracy(injected, ooo)
    injected_ms = _injected_out_of_order(events, order, 1000)
    injected_tol = _injected_out_of_order(events, order, 1, opts.tolerance_us)
    metrics: dict[str, float | int | str] = {
        "approach": opts.approach,
        "events": len(events),
        "released_events": n,
        "late_events": col.late,
        "duplicate_events": col.duplicates,
        "late_passed_events": col.late_passed,
        "avg_latency_ms": round(total / n / 1000.0, 4) if n else 0.0,
        "p99_latency_ms": round(_nearest_rank(latencies, 0.99) / 1000.0, 3),
        "max_latency_ms": round(peak / 1000.0, 3),
        "avg_max_latency_ms": round(sum(s[2] for s in series) / len(series), 3) if series else 0.0,
        "out_of_order_events": ooo,
        "injected_out_of_order_events": injected,
        "accuracy_pct": round(accuracy, 4),
        # the thesis' timestamps had millisecond resolution: equal milliseconds were never out of order
        "out_of_order_events_ms": col.out_of_order_ms,
        "injected_out_of_order_events_ms": injected_ms,
        "accuracy_ms_pct": round(_accuracy(injected_ms, col.out_of_order_ms), 4),
        # inversions larger than the clock uncertainty of a LAN time sync
        "out_of_order_events_tol": col.out_of_order_tol,
        "injected_out_of_order_events_tol": injected_tol,
        "accuracy_tol_pct": round(_accuracy(injected_tol, col.out_of_order_tol), 4),
        "peak_buffered_events": _peak_in_flight(events, col),
    }
    for reason, count in sorted(col.late_by_reason.items()):
        metrics[f"late_events_{reason}"] = count
    metrics.update(extra)
    return ReplayResult(metrics, col.emitted, series)


def _latency_series(events: Sequence[TraceEvent], col: _Collector,
                    bucket_us: int) -> tuple[list[int], list[tuple[int, float, float]]]:
    """Each released event's latency (release - arrival, µs, in event order) and, per arrival bucket of
    ``bucket_us``, its start (µs) with the average and max latency (ms) of the events that arrived in it."""
    buckets: dict[int, list[int]] = {}
    latencies: list[int] = []
    for i, rel in enumerate(col.release_us):
        if rel is None:
            continue
        e = events[i]
        lat = rel - e.arrival_ts_us
        latencies.append(lat)
        b = buckets.get(e.arrival_ts_us // bucket_us)
        if b is None:
            buckets[e.arrival_ts_us // bucket_us] = [lat, lat, 1]
        else:
            b[0] += lat
            b[1] = max(b[1], lat)
            b[2] += 1
    series = [(k * bucket_us, v[0] / v[2] / 1000.0, v[1] / 1000.0) for k, v in sorted(buckets.items())]
    return latencies, series
