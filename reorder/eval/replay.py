"""Deterministic virtual-time replay of a trace through one approach, with the thesis' metrics.

Metrics (thesis section 5.2.2, on each stream's main output):

* latency of an event = release time - arrival time (the delay the reorderer adds);
* an output event is *out of order* when the event released just before it on the same stream has a
  larger ``true_ts_us``; an event diverted to the late side output (never released) also counts as out
  of order, so dropping late events cannot buy accuracy;
* injected out-of-order events: the same count over the arrival order;
* ``accuracy_pct = 100 * (injected - out_of_order) / injected`` (negative when the output is worse
  than the input, as in Table 5.10).

Time only moves through the trace's timestamps and the components' deadlines: same trace, same options,
same numbers.  A deadline that falls exactly on an arrival time fires after that arrival (an event
arriving at the deadline is in time).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from reorder.eval.kslack import AQKSlack, AQKSlackConfig, KSlack, MPKSlack
from reorder.eval.oracle import oracle_schedule
from reorder.eval.syncsim import SourceClockModel, SyncPlan, plan_sync
from reorder.eval.traces import TraceEvent
from reorder.merger import MergeOutput, MergerConfig, MultiSourceMerger
from reorder.records import GapSkipped, Late, Merged, Released, SourceEvent, SourceTimedOut
from reorder.sequence import ReorderOutput, SequenceConfig, SequenceReorderer
from timesync.clocks import EstimateMapping, IdentityMapping, ReferenceMapping
from timesync.estimator import ClockEstimate

__all__ = ["APPROACHES", "Approach", "ReplayOptions", "ReplayResult", "replay"]

Approach = Literal["sequence", "thesis", "kslack", "mpkslack", "aqkslack", "oracle"]
APPROACHES: tuple[Approach, ...] = ("sequence", "thesis", "kslack", "mpkslack", "aqkslack", "oracle")


@dataclass(frozen=True, slots=True)
class ReplayOptions:
    approach: Approach = "sequence"
    latency_threshold_us: int | None = None
    """Default: 2 s for ``sequence``, 500 ms for ``thesis`` (Query 5.3)."""
    alpha: float = 0.6
    beta: float = 0.6
    drop_late: bool = False
    target_accuracy: float = 0.9999
    k_us: int = 100_000
    """Fixed K of ``kslack``."""
    sync: bool = True
    """Map source timestamps through simulated time sync (else ``t_ref = source_ts``)."""
    heartbeats: bool = True
    """``sequence``: each sync round also proves the source alive (its seq and clock) to the merger."""
    sync_plan: SyncPlan = field(default_factory=SyncPlan)
    seed: int = 1
    aq: AQKSlackConfig = field(default_factory=AQKSlackConfig)
    emit: bool = False
    tolerance_us: int = 100
    """``*_tol`` metrics count an inversion only if it exceeds this (about a LAN time sync's error)."""
    bucket_us: int = 1_000_000
    """Arrival-time bucket for the per-interval average / max latency series (Figures 5.6-5.7)."""


@dataclass(slots=True)
class ReplayResult:
    metrics: dict[str, float | int | str]
    emitted: list[tuple[str, str, int, int, int]]
    """(source_id, stream, seq, release_ts_us, ref_ts_us) in release order (if ``emit``)."""
    series: list[tuple[int, float, float]]
    """(bucket start us, average latency ms, max latency ms) by arrival time."""


class _Collector:
    def __init__(self, events: Sequence[TraceEvent], emit: bool, tolerance_us: int) -> None:
        self.tolerance_us = tolerance_us
        self.out_of_order_tol = 0
        self.events = events
        self.release_us: list[int | None] = [None] * len(events)
        self.diverted: list[bool] = [False] * len(events)
        self.last_true: dict[str, int] = {}
        self.out_of_order = 0
        self.out_of_order_ms = 0
        self.released = 0
        self.late_records = 0
        self.emit = emit
        self.emitted: list[tuple[str, str, int, int, int]] = []

    def release(self, i: int, release_us: int, ref_ts_us: int) -> None:
        e = self.events[i]
        if self.release_us[i] is not None:
            raise AssertionError(f"event {i} released twice")
        self.release_us[i] = release_us
        self.released += 1
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

    def divert(self, i: int) -> None:
        self.diverted[i] = True
        self.out_of_order += 1
        self.out_of_order_ms += 1
        self.out_of_order_tol += 1


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


@dataclass(frozen=True, slots=True)
class _Control:
    """A control-plane event of the replay: a new clock estimate, a registration or a heartbeat."""

    at_us: int
    kind: int  # 0 estimate, 1 register, 2 heartbeat: the order among equal times
    source_id: str
    stream: str
    estimate: ClockEstimate | None = None
    beat: tuple[int, int] | None = None


class _Pipeline:
    """Per-source SequenceReorderers feeding one MultiSourceMerger per stream (thesis Figure 4.2)."""

    def __init__(self, events: Sequence[TraceEvent], order: Sequence[int], opts: ReplayOptions, col: _Collector):
        self.events = events
        self.order = order
        self.opts = opts
        self.col = col
        thesis = opts.approach == "thesis"
        cap = opts.latency_threshold_us
        if thesis:
            self.seq_config = SequenceConfig.thesis(
                latency_threshold_us=500_000 if cap is None else cap,
                alpha=opts.alpha,
                beta=opts.beta,
                drop_late=opts.drop_late,
            )
        else:
            self.seq_config = SequenceConfig(
                latency_threshold_us=2_000_000 if cap is None else cap,
                alpha=opts.alpha,
                beta=opts.beta,
                drop_late=opts.drop_late,
                target_accuracy=opts.target_accuracy,
            )
        self.merger_config = MergerConfig(mode="thesis" if thesis else "watermark")
        self.clock: ReferenceMapping
        self.est_clock = EstimateMapping()
        self.clock = self.est_clock if opts.sync else IdentityMapping()
        self.reorderers: dict[tuple[str, str], SequenceReorderer] = {}
        self.mergers: dict[str, MultiSourceMerger] = {}
        self.timers: list[tuple[int, int, str, str]] = []  # (deadline, kind, source, stream)
        # the deadline last put on the heap per component: push only changes, validate on pop
        self.scheduled_r: dict[tuple[str, str], int] = {}
        self.scheduled_m: dict[str, int] = {}
        self.gaps = 0
        self.skipped = 0
        self.duplicates = 0
        self.late = 0
        self.merger_timeouts = 0
        self.punctuations = 0

    def _reorderer(self, source_id: str, stream: str) -> SequenceReorderer:
        key = (source_id, stream)
        r = self.reorderers.get(key)
        if r is None:
            r = SequenceReorderer(source_id, stream, self.seq_config)
            self.reorderers[key] = r
        return r

    def _merger(self, stream: str) -> MultiSourceMerger:
        m = self.mergers.get(stream)
        if m is None:

            def wait_for(source_id: str, now_us: int, stream: str = stream) -> int:
                return self._reorderer(source_id, stream).merge_wait_us(now_us)

            m = MultiSourceMerger(stream, self.clock, self.merger_config, timeout_for=wait_for)
            self.mergers[stream] = m
        return m

    # -- output plumbing ------------------------------------------------------------------------

    def _on_reorder(self, outs: list[ReorderOutput], r: SequenceReorderer) -> None:
        for o in outs:
            if type(o) is Released:
                idx = o.event.payload
                assert isinstance(idx, int)
                self._on_merge(self._merger(r.stream).push(o.event, o.arrival_us, o.release_us, late=o.late))
            elif type(o) is Late:
                if o.reason == "duplicate":
                    self.duplicates += 1
                else:
                    self.late += 1
                if not o.passed:
                    self._divert(o)
            elif type(o) is GapSkipped:
                self.gaps += 1
                self.skipped += o.last_seq - o.first_seq + 1
        d = r.next_deadline_us()
        key = (r.source_id, r.stream)
        if d is not None and self.scheduled_r.get(key) != d:
            self.scheduled_r[key] = d
            heapq.heappush(self.timers, (d, 0, r.source_id, r.stream))

    def _divert(self, o: Late) -> None:
        idx = o.event.payload
        assert isinstance(idx, int)
        self.col.divert(idx)

    def _on_merge(self, outs: list[MergeOutput]) -> None:
        for o in outs:
            if type(o) is Merged:
                idx = o.event.payload
                assert isinstance(idx, int)
                self.col.release(idx, o.release_us, o.ref_ts_us)
            elif type(o) is Late:
                self.late += 1
                self._divert(o)
            elif type(o) is SourceTimedOut:
                self.merger_timeouts += 1
            else:
                self.punctuations += 1

    def _schedule_mergers(self) -> None:
        for m in self.mergers.values():
            d = m.next_deadline_us()
            if d is not None and self.scheduled_m.get(m.stream) != d:
                self.scheduled_m[m.stream] = d
                heapq.heappush(self.timers, (d, 1, "", m.stream))

    def _fire_before(self, t: int) -> None:
        timers = self.timers
        while timers and timers[0][0] < t:
            d, kind, sid, stream = heapq.heappop(timers)
            if kind == 0:
                r = self.reorderers[(sid, stream)]
                self.scheduled_r.pop((sid, stream), None)
                if r.next_deadline_us() == d:
                    self._on_reorder(r.advance(d), r)
            else:
                m = self.mergers[stream]
                self.scheduled_m.pop(stream, None)
                if m.next_deadline_us() == d:
                    self._on_merge(m.advance(d))
            self._schedule_mergers()

    # -- control plane: sync rounds ------------------------------------------------------------

    def _control_events(self) -> list[_Control]:
        """(time, order, source, stream, payload): clock updates and heartbeats, in time order."""
        events = self.events
        per_source: dict[tuple[str, str], list[int]] = {}
        for i in self.order:
            e = events[i]
            per_source.setdefault((e.source_id, e.stream), []).append(i)
        end_us = max(e.arrival_ts_us for e in events)
        control: list[_Control] = []
        thesis = self.opts.approach == "thesis"
        for (sid, stream), idxs in per_source.items():
            pairs = [(events[i].true_ts_us, events[i].source_ts_us) for i in idxs]
            model = SourceClockModel.fit(pairs)
            first_true = min(p[0] for p in pairs)
            # seq the source had sent by a given true time: events sorted by seq follow its clock
            by_seq = sorted(idxs, key=lambda i: events[i].seq)
            sent_true = [events[i].true_ts_us for i in by_seq]
            rounds = plan_sync(sid, model, first_true, end_us, self.opts.sync_plan, self.opts.seed)
            for rnd in rounds:
                if self.opts.sync and rnd.estimate is not None:
                    control.append(_Control(rnd.effective_us, 0, sid, stream, estimate=rnd.estimate))
                if thesis:
                    if rnd is rounds[0]:
                        control.append(_Control(rnd.effective_us, 1, sid, stream))
                    continue
                if self.opts.heartbeats:
                    n_sent = _count_le(sent_true, rnd.started_us)
                    seq = events[by_seq[n_sent - 1]].seq if n_sent else events[by_seq[0]].seq - 1
                    beat = (seq, rnd.source_clock_at_start_us)
                    control.append(_Control(rnd.effective_us, 2, sid, stream, beat=beat))
        control.sort(key=lambda c: (c.at_us, c.kind, c.source_id))
        return control

    def _apply_control(self, c: _Control) -> None:
        if c.estimate is not None:
            self.est_clock.update(c.source_id, c.estimate)
            return
        m = self._merger(c.stream)
        self._reorderer(c.source_id, c.stream)
        if c.beat is None:
            self._on_merge(m.register(c.source_id, c.at_us))
        else:
            seq, clock_us = c.beat
            self._on_merge(m.heartbeat(c.source_id, seq, clock_us, c.at_us))
        self._schedule_mergers()

    def run(self) -> None:
        events = self.events
        control = self._control_events() if (self.opts.sync or self.opts.heartbeats) else []
        ci = 0
        for i in self.order:
            e = events[i]
            t = e.arrival_ts_us
            while ci < len(control) and control[ci].at_us <= t:
                self._fire_before(control[ci].at_us)
                self._apply_control(control[ci])
                ci += 1
            self._fire_before(t)
            r = self._reorderer(e.source_id, e.stream)
            self._on_reorder(r.push(SourceEvent(e.source_id, e.stream, e.seq, e.source_ts_us, i), t), r)
            self._schedule_mergers()
        # end of trace: let every wait run out on its own, then flush whatever is left
        self._fire_before(1 << 62)
        end = max((e.arrival_ts_us for e in events), default=0)
        for r in self.reorderers.values():
            self._on_reorder(r.flush(end), r)
        for m in self.mergers.values():
            self._on_merge(m.flush(end))


def _index(event: SourceEvent) -> int:
    """The replay carries each event's trace index in its payload."""
    idx = event.payload
    assert isinstance(idx, int)
    return idx


def _count_le(sorted_values: list[int], x: int) -> int:
    lo, hi = 0, len(sorted_values)
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_values[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def _run_slack(events: Sequence[TraceEvent], order: Sequence[int], opts: ReplayOptions, col: _Collector) -> int:
    streams: dict[str, KSlack] = {}
    values = [float((e.payload or {}).get("v", 1)) for e in events]
    late = 0

    def make() -> KSlack:
        if opts.approach == "kslack":
            return KSlack(opts.k_us)
        if opts.approach == "mpkslack":
            return MPKSlack()
        aq = opts.aq
        cfg = AQKSlackConfig(
            epsilon_thr=aq.epsilon_thr,
            delta=aq.delta,
            window_us=aq.window_us,
            slide_us=aq.slide_us,
            kp=aq.kp,
            kd=aq.kd,
            delay_quantile=aq.delay_quantile,
            alpha_min=aq.alpha_min,
            value=lambda ev: values[_index(ev)],
        )
        return AQKSlack(cfg)

    for i in order:
        e = events[i]
        s = streams.get(e.stream)
        if s is None:
            s = streams[e.stream] = make()
        for o in s.push(SourceEvent(e.source_id, e.stream, e.seq, e.source_ts_us, i), e.arrival_ts_us):
            if type(o) is Released:
                col.release(_index(o.event), o.release_us, o.event.source_ts_us)
            else:
                late += 1
    end = max((e.arrival_ts_us for e in events), default=0)
    for s in streams.values():
        for o in s.flush(end):
            if type(o) is Released:
                col.release(_index(o.event), o.release_us, o.event.source_ts_us)
            else:
                late += 1
    return late


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
    late = 0
    if opts.approach in ("sequence", "thesis"):
        pipe = _Pipeline(events, order, opts, col)
        pipe.run()
        late = pipe.late
        extra = {
            "gaps_skipped": pipe.gaps,
            "seqs_skipped": pipe.skipped,
            "duplicates": pipe.duplicates,
            "merger_timeouts": pipe.merger_timeouts,
            "punctuations": pipe.punctuations,
        }
    elif opts.approach == "oracle":
        _run_oracle(events, col)
    else:
        late = _run_slack(events, order, opts, col)
    return _finish(events, order, opts, col, late, extra)


def _finish(
    events: Sequence[TraceEvent],
    order: Sequence[int],
    opts: ReplayOptions,
    col: _Collector,
    late: int,
    extra: dict[str, float | int | str],
) -> ReplayResult:
    total = 0
    peak = 0
    buckets: dict[int, list[int]] = {}
    for i, rel in enumerate(col.release_us):
        if rel is None:
            continue
        e = events[i]
        lat = rel - e.arrival_ts_us
        total += lat
        peak = max(peak, lat)
        b = buckets.get(e.arrival_ts_us // opts.bucket_us)
        if b is None:
            buckets[e.arrival_ts_us // opts.bucket_us] = [lat, lat, 1]
        else:
            b[0] += lat
            b[1] = max(b[1], lat)
            b[2] += 1
    n = col.released
    injected = _injected_out_of_order(events, order)
    ooo = col.out_of_order
    accuracy = _accuracy(injected, ooo)
    injected_ms = _injected_out_of_order(events, order, 1000)
    injected_tol = _injected_out_of_order(events, order, 1, opts.tolerance_us)
    series = [(k * opts.bucket_us, v[0] / v[2] / 1000.0, v[1] / 1000.0) for k, v in sorted(buckets.items())]
    metrics: dict[str, float | int | str] = {
        "approach": opts.approach,
        "events": len(events),
        "released_events": n,
        "avg_latency_ms": round(total / n / 1000.0, 4) if n else 0.0,
        "max_latency_ms": round(peak / 1000.0, 3),
        "avg_max_latency_ms": round(sum(s[2] for s in series) / len(series), 3) if series else 0.0,
        "out_of_order_events": ooo,
        "injected_out_of_order_events": injected,
        "accuracy_pct": round(accuracy, 4),
        "late_events": late,
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
    metrics.update(extra)
    missing = len(events) - n - sum(col.diverted)
    if missing:
        raise AssertionError(f"{missing} events neither released nor diverted")
    return ReplayResult(metrics, col.emitted, series)
