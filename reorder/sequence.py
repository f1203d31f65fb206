"""Per-(source, stream) sequence reorderer: thesis section 3.2.1 and Figure 4.2, plus an adaptive mode.

Sans-IO: the caller passes the current (virtual or real) time to every call and asks
:meth:`SequenceReorderer.next_deadline_us` when to call :meth:`SequenceReorderer.advance` next.

Two timeout policies share the same state machine:

* ``mode="thesis"``: Eq. 3.11, ``min(t_latency_th, max(t_inter, t_buffer))``, where ``t_buffer`` only
  learns from early events released after their gap closed in time (the literal reading).
* ``mode="adaptive"`` (default): the ``target_accuracy``-quantile of *gap-closing delays*, i.e. the time
  from a hole becoming visible (a higher seq arrived) to the missing event arriving.  Holes that were
  skipped still feed the estimator when their event finally turns up, so a source with heavy-tailed
  delays teaches the reorderer to wait longer, up to its latency threshold.  This is AQ-K-slack's
  quality-driven idea applied to this source's gaps instead of a global K.  The threshold itself learns as
  MP-K-slack's K does: ``timeout_factor`` x the longest gap-closing delay seen, never shrinking, never below
  ``latency_threshold_us`` nor above ``max_latency_threshold_us``.

Every gap gets its own full timeout once it is at the head: the deadline is computed when the head
gap opens, as Figure 4.2 computes the timeout when an event is added to an empty buffer.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Literal

from reorder.bounds import check_at_least, check_fraction
from reorder.estimators import DecayedQuantile, SmoothedDelay
from reorder.ranges import RangeMap
from reorder.records import GapSkipped, Late, Released, SourceEvent

__all__ = ["DEFAULT_MAX_LATENCY_THRESHOLD_US", "MAX_SKIPPED_RANGES", "ReorderOutput", "SequenceConfig",
           "SequenceCounters", "SequenceReorderer", "warmup_samples_for"]

ReorderOutput = Released | Late | GapSkipped

#: Early events one reorderer may hold; past it the head gap is skipped with reason "buffer_full".  At 15k events/s
#: this is ~66 s of a DEBS-like source, above the learned latency threshold's 60 s bound: a gap the threshold lets
#: the reorderer wait for is not given up for want of room (with 100k, ~6.6 s, 26 of Dataset 3's 32 misses with the
#: learned threshold were such gaps).  The gateway bounds its memory across all reorderers by pausing sources
#: (``max_buffered_events``, also 1M by default), so one busy source may use what all of them may.
DEFAULT_MAX_BUFFERED = 1_000_000
#: Skipped sequence numbers remembered to tell a late arrival (and its lateness) from a duplicate; the lowest are
#: forgotten first. Kept as ranges (reorder/ranges.py): a gap costs one range whatever its length.
DEFAULT_MAX_SKIPPED_TRACKED = 100_000
#: ... in at most this many ranges, the lowest dropped first (as the gateway's DeliveryTracker keeps its given-up
#: seqs): a run of one-seq gaps (alternating holes) would otherwise keep 100,000 ranges, 16.9 MiB per reorderer.
MAX_SKIPPED_RANGES = 1024

#: Gap-closing samples needed before the adaptive quantile is trusted at all; until then wait the full cap.  A
#: 0.9999-quantile of 20 samples is their maximum, and a source's first 20 gaps are typically its common
#: millisecond disorder: the first long delay then outlasts a wait learned on nothing but short ones.  On the
#: multi-source replays of issue 12 item 7 every miss was such a gap (28, skipped on 27-273 samples); with 200,
#: 6 remain.  The cost falls only on gaps that never close (a lost event): they are held up to the cap instead
#: of the learned wait during the source's first 200 gaps, 0.04-0.2 s of a 15k events/s source, 6-9 s of a
#: 500 events/s one; the merge waits as long for that source meanwhile (docs/reorder.md).
DEFAULT_MIN_GAP_SAMPLES = 200
#: After those 200 and until the quantile rests on 1 / (1 - q) samples (:func:`warmup_samples_for`), no gap is given
#: up sooner than this.  A q-quantile of fewer samples says nothing about a 1-in-1/(1-q) delay: on the pool profile a
#: connection's first stall (5-50 ms, about 1 event in 5,000) came after ~1,500 samples of 50 us jitter, outlasted
#: the 0.7 ms they taught, and its whole stalled run went out of order (issue 25 item 5).  100 ms covers such
#: stalls; waiting the cap instead (2 s) covered them too but held every long delay of a Dataset 3 source for up
#: to 2 s while it warmed up (multi-source replays: 2.5 s mean latency instead of 46 ms).
DEFAULT_WARMUP_MIN_TIMEOUT_US = 100_000
#: Adaptive mode: how far the latency threshold may learn (:attr:`SequenceConfig.max_latency_threshold_us`).  The
#: longest delay of the benchmark's profiles is Dataset 3's 30 s tail, and the learned threshold is ``timeout_factor``
#: (2) times the longest gap-closing delay seen: 60 s lets every such gap be waited for once one like it was seen.
DEFAULT_MAX_LATENCY_THRESHOLD_US = 60_000_000


def warmup_samples_for(target_accuracy: float) -> int:
    """Gap samples the ``target_accuracy``-quantile needs before its learned wait is trusted below the warm-up
    floor: ``1 / (1 - q)`` (10,000 at 0.9999)."""
    # round() first: 1 / (1 - 0.9999) is 10000.0000000008 in binary floating point
    return max(1, math.ceil(round(1.0 / (1.0 - target_accuracy), 6)))


@dataclass(frozen=True, slots=True)
class SequenceConfig:
    """Query 4.3's parameters (timeout, alpha, beta, drop-late) plus the adaptive policy's knobs."""

    mode: Literal["adaptive", "thesis"] = "adaptive"
    latency_threshold_us: int = 2_000_000
    """Eq. 3.11's ``t_latency-th``.  Thesis mode: no gap is waited for longer than this.  Adaptive mode: the cap of
    the wait until this source shows a gap that closed later; then the cap is learned (``max_latency_threshold_us``,
    :meth:`SequenceReorderer.effective_latency_threshold_us`), never below this."""
    alpha: float = 0.6
    beta: float = 0.6
    drop_late: bool = False
    """Query 4.3's 7th parameter.  False: late events are released (flagged) and reported; True: they
    only go to the late side output."""
    target_accuracy: float = 0.9999
    """Adaptive mode: the fraction of gaps the timeout should outlast."""
    timeout_factor: float = 2.0
    """Adaptive mode: the timeout is this multiple of the quantile.  A 0.9999-quantile rests on a
    handful of samples, and waiting longer for a gap that does close costs only that gap's own closing
    time, while giving up early costs an out-of-order event."""
    quantile_half_life: float = 10_000.0
    """Adaptive mode: gap samples after which an old sample counts half.  10k gaps is a few seconds of
    a 15k events/s source with ~10 % disorder: long enough for a stable 0.9999-quantile, short enough
    that one burst of extreme delays does not set the timeout for the rest of the run."""
    max_latency_threshold_us: int = DEFAULT_MAX_LATENCY_THRESHOLD_US
    """Adaptive mode: the learned cap, ``timeout_factor`` x the longest gap-closing delay this reorderer has seen
    (a gap skipped and then closed by its late event included), never shrinks, as MP-K-slack's K, and grows at most
    to this; the cap is never below ``latency_threshold_us``.  ``latency_threshold_us`` or less turns learning off."""
    min_gap_samples: int = DEFAULT_MIN_GAP_SAMPLES
    warmup_samples: int | None = None
    """Adaptive mode: until this many gap samples, no gap is given up sooner than ``warmup_min_timeout_us``;
    None: :func:`warmup_samples_for` ``target_accuracy`` (10,000 at 0.9999)."""
    warmup_min_timeout_us: int = DEFAULT_WARMUP_MIN_TIMEOUT_US
    min_timeout_us: int = 0
    """Adaptive mode: never give up on a gap sooner than this.  Waiting costs only when a gap never
    closes (a truly lost event); a floor protects against a quantile learned on a calm network before
    the first stall of a connection pool or an event-loop pause."""
    initial_seq: int | None = 0
    """First expected seq.  None adopts the first event's seq (a source joining mid-stream), at the risk
    of releasing that event ahead of earlier ones still in flight."""
    max_buffered: int = DEFAULT_MAX_BUFFERED
    max_skipped_tracked: int = DEFAULT_MAX_SKIPPED_TRACKED

    def __post_init__(self) -> None:
        check_at_least(0, latency_threshold_us=self.latency_threshold_us)
        check_fraction("target_accuracy", self.target_accuracy)
        check_at_least(1, max_buffered=self.max_buffered)
        check_at_least(0, min_timeout_us=self.min_timeout_us, warmup_min_timeout_us=self.warmup_min_timeout_us,
                       max_latency_threshold_us=self.max_latency_threshold_us)

    @property
    def effective_warmup_samples(self) -> int:
        """``warmup_samples``, or the default its ``target_accuracy`` implies."""
        if self.warmup_samples is not None:
            return self.warmup_samples
        return warmup_samples_for(self.target_accuracy)

    @classmethod
    def thesis(cls, latency_threshold_us: int = 500_000, **kwargs: object) -> SequenceConfig:
        """Query 5.3 of the thesis: ``reorder:sequence(..., 500L, 0.6, 0.6, false)``."""
        return cls(mode="thesis", latency_threshold_us=latency_threshold_us, **kwargs)  # type: ignore[arg-type]


@dataclass(slots=True)
class SequenceCounters:
    released: int = 0
    in_order: int = 0
    buffered: int = 0
    peak_buffered: int = 0
    gaps_closed: int = 0
    timeouts: int = 0
    buffer_full_skips: int = 0
    skipped_seqs: int = 0
    late: int = 0
    late_passed: int = 0
    duplicates: int = 0


class SequenceReorderer:
    """Releases one source's events of one stream in sequence order (thesis Figure 4.2)."""

    __slots__ = (
        "_adopt_first",
        "_buffer",
        "_deadline_us",
        "_expected",
        "_first_seq",
        "_head_since_us",
        "_heap",
        "_holes",
        "_last_in_order_us",
        "_longest_gap_delay_us",
        "_max_seen",
        "_skipped",
        "buffer_delay",
        "config",
        "counters",
        "gap_delay",
        "inter_arrival",
        "source_id",
        "stream",
    )

    def __init__(self, source_id: str, stream: str, config: SequenceConfig | None = None) -> None:
        cfg = config if config is not None else SequenceConfig()
        self.config = cfg
        self.source_id = source_id
        self.stream = stream
        self.counters = SequenceCounters()
        self.inter_arrival = SmoothedDelay(cfg.alpha, first_dev_abs=False)  # Eq. 3.1-3.5
        self.buffer_delay = SmoothedDelay(cfg.beta, first_dev_abs=True)  # Eq. 3.6-3.10
        self.gap_delay = DecayedQuantile(cfg.target_accuracy, half_life_samples=cfg.quantile_half_life)
        # with initial_seq None, expected starts below any real seq and the first event is adopted
        self._adopt_first = cfg.initial_seq is None
        self._expected = cfg.initial_seq if cfg.initial_seq is not None else -(1 << 62)
        self._max_seen = self._expected - 1
        self._first_seq = self._expected
        self._buffer: dict[int, tuple[SourceEvent, int]] = {}
        self._heap: list[int] = []
        # seq -> time the hole became visible (a higher seq arrived while it was missing), per run of seqs: a jump
        # of a million seqs is one range, not a million entries (issue 24 item 3)
        self._holes: RangeMap[int] = RangeMap()
        # skipped seq -> (time the hole became visible, time it was skipped), per run; skips happen at the head, so
        # the lowest seqs are the oldest and are forgotten first
        self._skipped: RangeMap[tuple[int, int]] = RangeMap()
        self._last_in_order_us: int | None = None
        self._longest_gap_delay_us = 0
        self._deadline_us: int | None = None
        self._head_since_us = 0

    # -- queries --------------------------------------------------------------------------------

    @property
    def expected_seq(self) -> int:
        """The next sequence number this reorderer will release (Figure 4.2's expSeqNum)."""
        return self._expected

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def next_deadline_us(self) -> int | None:
        """When the head gap times out, or None when nothing is held."""
        return self._deadline_us

    @property
    def longest_gap_delay_us(self) -> int:
        """The longest gap-closing delay seen so far (0 before any): the learned cap's evidence."""
        return self._longest_gap_delay_us

    def effective_latency_threshold_us(self) -> int:
        """The cap of the wait for a gap opening now.  Thesis mode: ``latency_threshold_us``.  Adaptive mode:
        ``max(latency_threshold_us, min(max_latency_threshold_us, timeout_factor x longest_gap_delay_us))``."""
        cfg = self.config
        if cfg.mode == "thesis":
            return cfg.latency_threshold_us
        # A gap that closed after D proves this source's gaps can take D: a fixed cap below it gives up every such
        # gap however often they come (Dataset 3: 35 of 41 misses were gaps of 3.9-28 s skipped at the 2 s cap,
        # while 2 x the quantile already said 5.3-47 s). The cap only bounds the quantile's wait; it never shrinks.
        learned_us = min(cfg.max_latency_threshold_us, int(cfg.timeout_factor * self._longest_gap_delay_us))
        return max(cfg.latency_threshold_us, learned_us)

    def timeout_us(self) -> int:
        """The timeout a gap opening now would get (Eq. 3.11, or the adaptive quantile)."""
        cfg = self.config
        if cfg.mode == "thesis":
            t_inter = self.inter_arrival.value_us
            t_buffer = self.buffer_delay.value_us
            return int(min(cfg.latency_threshold_us, max(t_inter, t_buffer, 0.0)))
        cap_us = self.effective_latency_threshold_us()
        samples = self.gap_delay.count
        if samples < cfg.min_gap_samples:
            return cap_us
        learned_us = max(cfg.min_timeout_us, int(cfg.timeout_factor * self.gap_delay.value_us()))
        if samples < cfg.effective_warmup_samples:
            learned_us = max(learned_us, cfg.warmup_min_timeout_us)
        return min(cap_us, learned_us)

    def merge_wait_us(self, now_us: int) -> int:
        """How long a merger should wait for this source's next release (thesis section 3.2.2).

        Thesis mode: the Eq. 3.11 timeout, as written.  Adaptive mode: whatever is left of the head
        gap's wait, plus the gap timeout and the smoothed in-order inter-arrival time, so the merger does
        not give up on a source whose reorderer is still legitimately waiting.
        """
        if self.config.mode == "thesis":
            return self.timeout_us()
        hold = max(0, self._deadline_us - now_us) if self._deadline_us is not None else 0
        return hold + self.timeout_us() + max(0, int(self.inter_arrival.value_us))

    # -- input ----------------------------------------------------------------------------------

    def push(self, event: SourceEvent, now_us: int) -> list[ReorderOutput]:
        """Accept one event that arrived at ``now_us``; return what it releases or reports."""
        seq = event.seq
        if seq == self._expected:
            last = self._last_in_order_us
            if last is not None:
                self.inter_arrival.update(now_us - last)
            self._last_in_order_us = now_us
            self._expected = seq + 1
            counters = self.counters
            counters.in_order += 1
            counters.released += 1
            if not self._buffer:  # the in-order fast path: no state beyond the counters
                self._max_seen = seq
                return [Released(event, now_us, now_us)]
            opened = self._holes.pop(seq)
            self._learn_gap_delay(now_us - (now_us if opened is None else opened))
            counters.gaps_closed += 1
            out: list[ReorderOutput] = [Released(event, now_us, now_us)]
            self._release_run(now_us, out, learn=True)
            return out
        if self._adopt_first:
            self._adopt_first = False
            self._expected = seq
            self._first_seq = seq
            self._max_seen = seq - 1
            return self.push(event, now_us)
        if seq > self._expected:
            return self._buffer_early(event, now_us)
        return self._late(event, now_us)

    def take_in_order(self, seq: int, now_us: int) -> bool:
        """``push``'s in-order fast path without its output: True when ``seq`` is the expected seq and nothing is
        buffered, with the event released exactly as ``push`` would release it (``Released(event, now_us, now_us)``,
        which the caller builds if it needs it); False, and nothing changed, otherwise (call ``push``)."""
        if seq != self._expected or self._buffer:
            return False
        last = self._last_in_order_us
        if last is not None:
            self.inter_arrival.update(now_us - last)
        self._last_in_order_us = now_us
        self._expected = seq + 1
        self._max_seen = seq
        counters = self.counters
        counters.in_order += 1
        counters.released += 1
        return True

    def advance(self, now_us: int) -> list[ReorderOutput]:
        """Fire every timeout due at or before ``now_us``; outputs carry the deadline as their time."""
        out: list[ReorderOutput] = []
        while self._deadline_us is not None and self._deadline_us <= now_us:
            self._skip_head_gap(self._deadline_us, "timeout", out)
        return out

    def flush(self, now_us: int) -> list[ReorderOutput]:
        """Give up on every gap at once (end of stream): release everything held, in seq order."""
        out: list[ReorderOutput] = []
        while self._buffer:
            self._skip_head_gap(now_us, "timeout", out)
        return out

    # -- internals ------------------------------------------------------------------------------

    def _buffer_early(self, event: SourceEvent, now_us: int) -> list[ReorderOutput]:
        seq = event.seq
        if seq in self._buffer:
            self.counters.duplicates += 1
            return [Late(event, now_us, "duplicate", 0, False)]
        if seq > self._max_seen:
            # Holes further back than max_buffered are not tracked: they contribute no delay sample.
            self._holes.add(max(self._max_seen + 1, seq - self.config.max_buffered), seq - 1, now_us)
            self._max_seen = seq
        else:
            opened = self._holes.pop(seq)
            if opened is not None:
                self._learn_gap_delay(now_us - opened)
                self.counters.gaps_closed += 1
        was_empty = not self._buffer
        self._buffer[seq] = (event, now_us)
        heapq.heappush(self._heap, seq)
        counters = self.counters
        counters.buffered += 1
        n = len(self._buffer)
        counters.peak_buffered = max(counters.peak_buffered, n)
        if was_empty:
            self._open_head_gap(now_us)
        if n > self.config.max_buffered:
            out: list[ReorderOutput] = []
            self._skip_head_gap(now_us, "buffer_full", out)
            return out
        return []

    def _late(self, event: SourceEvent, now_us: int) -> list[ReorderOutput]:
        counters = self.counters
        info = self._skipped.pop(event.seq)
        if info is not None:
            opened_us, skipped_us = info
            # The feedback the literal thesis timeout lacks: this gap really needed now - opened.
            self._learn_gap_delay(now_us - opened_us)
            late = Late(event, now_us, "late_after_skip", now_us - skipped_us, not self.config.drop_late)
        elif event.seq < self._first_seq:
            late = Late(event, now_us, "before_start", 0, not self.config.drop_late)
        else:
            counters.duplicates += 1
            return [Late(event, now_us, "duplicate", 0, False)]
        counters.late += 1
        if self.config.drop_late:
            return [late]
        counters.late_passed += 1
        counters.released += 1
        return [late, Released(event, now_us, now_us, True)]

    def _learn_gap_delay(self, delay_us: int) -> None:
        self.gap_delay.add(delay_us)
        self._longest_gap_delay_us = max(self._longest_gap_delay_us, delay_us)

    def _open_head_gap(self, now_us: int) -> None:
        self._head_since_us = now_us
        self._deadline_us = now_us + self.timeout_us()

    def _release_run(self, now_us: int, out: list[ReorderOutput], *, learn: bool) -> None:
        buffer = self._buffer
        expected = self._expected
        released = 0
        while expected in buffer:
            event, arrival_us = buffer.pop(expected)
            if learn:  # Eq. 3.7-3.10 learn only from gaps that closed in time
                self.buffer_delay.update(now_us - arrival_us)
            out.append(Released(event, arrival_us, now_us))
            expected += 1
            released += 1
        self._expected = expected
        self.counters.released += released
        heap = self._heap
        while heap and heap[0] < expected:
            heapq.heappop(heap)
        if buffer:
            self._open_head_gap(now_us)
        else:
            self._deadline_us = None

    def _skip_head_gap(self, at_us: int, reason: Literal["timeout", "buffer_full"], out: list[ReorderOutput]) -> None:
        heap = self._heap
        while heap and heap[0] < self._expected:
            heapq.heappop(heap)
        first = self._expected
        resume = heap[0]
        skipped = self._skipped
        limit = self.config.max_skipped_tracked
        # Each skipped seq keeps the time its hole became visible (the head gap's opening when it was not tracked),
        # one entry per run of seqs that share it; only the newest ``limit`` skipped seqs are kept.
        tracked_from = max(first, resume - limit)
        head_since_us = self._head_since_us
        cursor = first
        for lo, hi, opened_us in self._holes.pop_range(first, resume - 1):
            skipped.add(max(cursor, tracked_from), lo - 1, (head_since_us, at_us))
            skipped.add(max(lo, tracked_from), hi, (opened_us, at_us))
            cursor = hi + 1
        skipped.add(max(cursor, tracked_from), resume - 1, (head_since_us, at_us))
        skipped.trim_low(limit)
        skipped.drop_first_ranges(MAX_SKIPPED_RANGES)
        counters = self.counters
        counters.skipped_seqs += resume - first
        if reason == "timeout":
            counters.timeouts += 1
        else:
            counters.buffer_full_skips += 1
        out.append(
            GapSkipped(self.source_id, self.stream, first, resume - 1, at_us - self._head_since_us, at_us, reason)
        )
        self._expected = resume
        self._release_run(at_us, out, learn=False)
