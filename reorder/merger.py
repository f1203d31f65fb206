"""Multi-source merger per stream: thesis section 3.2.2, plus exact watermarks and punctuation.

Input: each source's events already in sequence order (from a :class:`reorder.sequence.SequenceReorderer`).
Output: :class:`~reorder.records.Merged` events in reference-time order, :class:`Punctuation`,
:class:`SourceTimedOut` and :class:`Late` records.

Thesis rule (``mode="thesis"``): look at the head of every source's queue and release the smallest
``t_ref``; if a source that is not flagged timed out has an empty queue, wait for it up to its timeout,
then flag it timed out; the flag drops on its next event.

Watermark rule (``mode="watermark"``, default).  A source's *frontier* is the reference time of the
newest event it handed to the merger, or of a heartbeat / re-sync that carried its current seq and
clock once every event up to that seq was delivered.  Its next event cannot be earlier than that (the
source clock is monotonic and seq follows it), so an empty source whose frontier is at or past the
smallest head does not hold the merge back and is never timed out.  The watermark is
``min over live sources of (head t_ref, or frontier if empty) - error bound``; it only moves forward,
and a :class:`Punctuation` carries it downstream: no event with a smaller ``t_ref`` follows on the main
output.  An event that would break that promise (a timed-out source coming back with old events) goes
to the late side output instead, with how far behind the watermark it was.

Learned merge wait (watermark mode, ``learn_wait``).  How long the merge waits for a silent source is also learned
from that source's own *silences*: each time the merge starts waiting for it, the time until it next speaks (an
event or a heartbeat, also when the wait had already given up) is a sample of a decayed quantile, as the sequence
reorderer learns its gap wait from gap-closing delays.  The wait is at least ``wait_factor`` times that quantile,
bounded by ``learned_wait_cap_us``; until ``min_wait_samples`` silences were seen it is the cap.  It applies once the
source has delivered an event or a heartbeat; before, the given wait alone (a join or reconnect grace).  A source whose
uplink stalls shows no gap to its reorderer, so only this wait keeps the merge from giving up on it
(docs/reorder.md, "The learned merge wait").
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from contract.records import MIN_TS_US
from reorder.bounds import check_at_least, check_fraction
from reorder.estimators import DecayedQuantile
from reorder.records import Late, Merged, Punctuation, SourceEvent, SourceTimedOut
from timesync.clocks import ReferenceMapping

__all__ = ["VIRTUAL_TIME_FLOOR_US", "MergeOutput", "MergerConfig", "MergerCounters", "MultiSourceMerger"]

MergeOutput = Merged | Punctuation | SourceTimedOut | Late

_NEVER = -(1 << 62)
#: A ``min_watermark_us`` for virtual time (the replay: time starts at 0 and source clocks may be behind it); any
#: real watermark is above it.
VIRTUAL_TIME_FLOOR_US = _NEVER // 2 + 1

#: Events one source may have queued while the merge waits for another; past it the source being
#: waited for is flagged timed out at once (memory is bounded, the wait is not worth more).
DEFAULT_MAX_QUEUED = 200_000
#: The longest the learned merge wait holds the merge for one silent source (the sequence reorderer's gap cap).
DEFAULT_LEARNED_WAIT_CAP_US = 2_000_000
#: Silences a source must have shown before its learned wait is trusted; until then the merge waits up to the cap.
DEFAULT_MIN_WAIT_SAMPLES = 1_000


@dataclass(frozen=True, slots=True)
class MergerConfig:
    mode: Literal["watermark", "thesis"] = "watermark"
    default_timeout_us: int = 500_000
    """Wait for a silent source when no per-source timeout function is given."""
    punctuation_interval_us: int = 1_000
    """Punctuation is emitted at most this often (gateway time) and only when the watermark moved."""
    max_queued_per_source: int = DEFAULT_MAX_QUEUED
    learn_wait: bool = True
    """Watermark mode: wait for a silent source at least as long as its learned silences say (module docstring).
    On by default, so the gateway has it (setting ``merge_wait_learned``): a stalled uplink shows its reorderer no
    gap, and without it the merge gives up on that source and diverts what it sent meanwhile (multistall replay: 577
    events late instead of 0).  It never shortens a wait, and its warm-up (the cap until ``min_wait_samples``)
    costs a source that vanishes no more than its reorderer's own wait does before that reorderer has learned its
    gaps (the same cap, docs/reorder.md)."""
    learned_wait_cap_us: int = DEFAULT_LEARNED_WAIT_CAP_US
    """No silence is waited for longer than this on account of the learned wait; also the wait before it is
    trusted.  Waiting costs only when the source has nothing to send (gone, or sparse without heartbeats)."""
    wait_quantile: float = 0.9999
    """The fraction of a source's silences the learned wait should outlast."""
    wait_factor: float = 2.0
    """The learned wait is this multiple of the quantile: a 0.9999-quantile rests on a handful of samples, and
    waiting longer for a source that does come back costs only its own silence, while giving up diverts its events."""
    wait_half_life: float = 10_000.0
    """Silences after which an old one counts half."""
    min_wait_samples: int = DEFAULT_MIN_WAIT_SAMPLES
    min_watermark_us: int = MIN_TS_US
    """No punctuation promises a watermark below this: the record contract's range starts at 0 (no record's
    ``ref_ts_us`` is negative, so a negative watermark promises nothing). The replay's virtual time lowers it to
    ``VIRTUAL_TIME_FLOOR_US``."""

    def __post_init__(self) -> None:
        check_fraction("wait_quantile", self.wait_quantile)
        check_at_least(0, learned_wait_cap_us=self.learned_wait_cap_us, min_wait_samples=self.min_wait_samples)


@dataclass(slots=True)
class MergerCounters:
    merged: int = 0
    timeouts: int = 0
    late: int = 0
    punctuations: int = 0
    heartbeats: int = 0
    peak_queued: int = 0
    raised: int = 0  # events raised to the highest reference time before them (a regression within their bound)
    stamp_regressions: int = 0  # events diverted as Late "stamp_regression"
    after_give_up: int = 0  # events diverted as Late "after_give_up"
    departures: int = 0  # sources that left cleanly (``leave``): given up without a wait


class _Source:
    __slots__ = (
        "error_us",
        "frontier",
        "frontier_error_us",
        "heard_us",
        "last_seq",
        "leaving",
        "pending_beat",
        "queue",
        "silences",
        "timed_out",
        "wait_deadline",
        "waited_since",
    )

    def __init__(self, silences: DecayedQuantile | None) -> None:
        # (ref, event, arrival_us, raised_us): raised_us > 0 for an event raised to keep reference order (Merged)
        self.queue: deque[tuple[int, SourceEvent, int, int]] = deque()
        self.frontier = _NEVER
        # How far the source's true time at its frontier may lie below it (the bound of the mapping that set it):
        # its next event's true time is no earlier, so a mapping with another bound may place it up to the two
        # bounds together below the frontier without any stamp going backwards (a re-sync, review B3).
        self.frontier_error_us = 0
        self.error_us = 0
        self.last_seq: int | None = None
        self.pending_beat: tuple[int, int, int] | None = None  # (seq, ref_ts_us, error_us) not yet covered
        self.timed_out = False
        self.leaving = False  # said bye with events queued: given up once they are released
        self.wait_deadline: int | None = None
        # when the source last spoke (an event, a heartbeat, its registration): a wait counts its silence from here
        self.heard_us: int | None = None
        # when the merge started waiting for this source (None: not waiting), and how long its silences lasted
        self.waited_since: int | None = None
        self.silences = silences


class MultiSourceMerger:
    """Merges the ordered per-source queues of one stream by reference timestamp."""

    def __init__(
        self,
        stream: str,
        clock: ReferenceMapping,
        config: MergerConfig | None = None,
        timeout_for: Callable[[str, int], int] | None = None,
    ) -> None:
        """``timeout_for(source_id, now_us)`` gives how long to wait for that silent source."""
        self.stream = stream
        self.clock = clock
        self.config = config if config is not None else MergerConfig()
        self._timeout_for = timeout_for
        self.counters = MergerCounters()
        self._sources: dict[str, _Source] = {}
        self._heads: list[tuple[int, str]] = []  # one (ref, source) per non-empty queue
        self._empty: list[tuple[int, str]] = []  # lazy heap of (frontier, source) of empty live sources
        self._blocker: str | None = None
        self._watermark = _NEVER
        self._emitted_watermark = _NEVER
        self._next_punctuation_us = _NEVER
        self._watermark_holder: str | None = None  # the source that held the watermark down at the last scan
        # The highest reference time released on the main output: no later release may go below it (reference
        # order per partition, docs/record-contract.md), whatever the watermark allowed.
        self._released_max = _NEVER
        self._queued = 0
        self._flushing = False

    # -- queries --------------------------------------------------------------------------------

    @property
    def watermark_us(self) -> int | None:
        """The latest punctuated watermark, or None before the first."""
        return None if self._emitted_watermark == _NEVER else self._emitted_watermark

    @property
    def queued(self) -> int:
        return self._queued

    def queued_by_source(self) -> dict[str, int]:
        """Events waiting in each source's queue (only sources with some). From the heads heap (one entry per
        non-empty queue): the gateway's buffer check calls this every 20 ms, and walking every registered source
        cost 31 ms a call with 500 sources on 64 streams (issue 24 item 5)."""
        sources = self._sources
        return {sid: len(sources[sid].queue) for _ref, sid in self._heads}

    def sources(self) -> list[str]:
        return list(self._sources)

    def is_timed_out(self, source_id: str) -> bool:
        return self._sources[source_id].timed_out

    def next_deadline_us(self) -> int | None:
        if self._blocker is None:
            return None
        return self._sources[self._blocker].wait_deadline

    # -- input ----------------------------------------------------------------------------------

    def push(self, event: SourceEvent, arrival_us: int, now_us: int, *, late: bool = False,
             mapped: tuple[int, int] | None = None) -> list[MergeOutput]:
        """An event released by the source's reorderer; ``late`` if it was released behind its successors.

        ``mapped``: ``clock.to_reference(event.source_id, event.source_ts_us)`` as the caller just computed it, so
        the event is not mapped twice in one call (the pipeline maps it first, for its future-dated check)."""
        src = self._source(event.source_id)
        ref, err = mapped if mapped is not None else self.clock.to_reference(event.source_id, event.source_ts_us)
        src.error_us = err
        out: list[MergeOutput] = []
        self._revive(event.source_id, src, now_us)
        watermark_mode = self.config.mode == "watermark"
        if watermark_mode and not late and src.frontier - ref > err + src.frontier_error_us:
            # Its source's stamps went backwards along its seqs (below its own frontier by more than its error
            # bound and the frontier's together): late whatever the watermark says, with the reason that names the
            # cause.
            if event.seq > (src.last_seq if src.last_seq is not None else _NEVER):
                src.last_seq = event.seq
            self._regressed(src, event, arrival_us, ref, src.frontier, out)
            self._drain(now_us, out)
            return out
        promised = self._emitted_watermark
        if watermark_mode and ref < promised and (late or promised > src.frontier):
            self._after_punctuation(event, arrival_us, ref, out)
            # _revive cancelled any wait on this source: decide again, or the merge is left without a deadline
            self._drain(now_us, out)
            return out
        if late:
            # passed through by the reorderer's configuration: it is already behind, do not hold it
            self.counters.merged += 1
            out.append(Merged(event, arrival_us, max(now_us, arrival_us), ref))
            self._drain(now_us, out)
            return out
        if event.seq > (src.last_seq if src.last_seq is not None else _NEVER):
            src.last_seq = event.seq
        raised = 0
        if watermark_mode:
            # Reference order: not below what was released, nor below this source's own queued events, nor below
            # the punctuation (one at or below its frontier: a re-sync may place it there, review B3).
            floor = src.queue[-1][0] if src.queue else self._released_max
            floor = max(floor, self._released_max, promised)
            if ref < floor:
                if floor - ref > _allowed_us(src, floor, err):
                    if ref < promised:
                        self._after_punctuation(event, arrival_us, ref, out)
                    else:
                        self._regressed(src, event, arrival_us, ref, floor, out)
                    self._drain(now_us, out)
                    return out
                raised, ref = floor - ref, floor
                self.counters.raised += 1
        self._enqueue(src, event, arrival_us, ref, err, raised, now_us, out)
        self._drain(now_us, out)
        return out

    def _enqueue(self, src: _Source, event: SourceEvent, arrival_us: int, ref: int, err: int, raised: int,
                 now_us: int, out: list[MergeOutput]) -> None:
        """``push``'s in-order event joins its source's queue (a source that queues too much ends the wait for the
        one the merge is blocked on)."""
        _advance_frontier(src, ref, err + raised)
        self._apply_pending_beat(event.source_id, src)
        was_empty = not src.queue
        src.queue.append((ref, event, arrival_us, raised))
        self._queued += 1
        self.counters.peak_queued = max(self.counters.peak_queued, self._queued)
        if was_empty:
            heapq.heappush(self._heads, (ref, event.source_id))
        if len(src.queue) > self.config.max_queued_per_source and self._blocker is not None:
            self._time_out(self._blocker, now_us, out)

    def push_run(self, source_id: str, run: list[tuple[SourceEvent, int, tuple[int, int]]],
                 now_us: int) -> list[MergeOutput]:
        """Events of one source released by its reorderer in one call, in seq order, each with its arrival and its
        mapping ``clock.to_reference(...)`` made in this call: ``push`` for each of them, but the merge is drained
        once per stretch of them that is not late, not once per event.

        The releases and what is late are the ones ``push`` gives one by one (the queue is FIFO, the heads a heap by
        reference time), in the same order: only the drains between two events of the stretch are saved, and with
        them the waits they would start on this very source between two of its own events (a zero-length silence
        each, which taught the learned wait nothing). A punctuation comes after the stretch's releases instead of
        among them, with the watermark they leave."""
        src = self._source(source_id)
        self._revive(source_id, src, now_us)
        out: list[MergeOutput] = []
        watermark_mode = self.config.mode == "watermark"
        queue = src.queue
        limit = self.config.max_queued_per_source
        start = len(queue)
        for event, arrival_us, (ref, err) in run:
            src.error_us = err
            if watermark_mode and src.frontier - ref > err + src.frontier_error_us:
                start = self._close_stretch(source_id, src, start, now_us, out)
                if src.last_seq is None or event.seq > src.last_seq:
                    src.last_seq = event.seq
                self._regressed(src, event, arrival_us, ref, src.frontier, out)
                continue
            promised = self._emitted_watermark
            if watermark_mode and ref < promised and promised > src.frontier:
                start = self._close_stretch(source_id, src, start, now_us, out)
                self._after_punctuation(event, arrival_us, ref, out)
                continue
            if src.last_seq is None or event.seq > src.last_seq:
                src.last_seq = event.seq
            raised, queued_ref = 0, ref
            if watermark_mode:
                # Reference order: not below what was released, nor below this source's own queued events, nor below
                # the punctuation (as in ``push``).
                floor = queue[-1][0] if queue else self._released_max
                floor = max(floor, self._released_max, promised)
                if ref < floor:
                    if floor - ref > _allowed_us(src, floor, err):
                        start = self._close_stretch(source_id, src, start, now_us, out)
                        if ref < promised:
                            self._after_punctuation(event, arrival_us, ref, out)
                        else:
                            self._regressed(src, event, arrival_us, ref, floor, out)
                        continue
                    self.counters.raised += 1
                    raised, queued_ref = floor - ref, floor
            _advance_frontier(src, queued_ref, err + raised)
            queue.append((queued_ref, event, arrival_us, raised))
            if len(queue) > limit and self._blocker is not None:
                self._time_out(self._blocker, now_us, out)
        if len(queue) > start:
            self._end_stretch(source_id, src, start, now_us, out)
        else:
            self._drain(now_us, out)
        return out

    def _after_punctuation(self, event: SourceEvent, arrival_us: int, ref: int, out: list[MergeOutput]) -> None:
        """An event below the punctuation that cannot be raised to it: late."""
        self.counters.late += 1
        out.append(Late(event, arrival_us, "after_punctuation", self._emitted_watermark - ref, False))

    def _regressed(self, src: _Source, event: SourceEvent, arrival_us: int, ref: int, floor: int,
                   out: list[MergeOutput]) -> None:
        """An event below ``floor`` (the highest reference time released, or queued before it by its own source) by
        more than its error bound: released, it would break the partition's reference order; it goes to the late
        side output instead. ``stamp_regression`` when it is below its own source's frontier (the source's stamps
        went backwards along its seqs), ``after_give_up`` otherwise (the merge gave its source up and released
        later events of the others meanwhile: the only other way an event can fall behind what was released)."""
        self.counters.late += 1
        if ref < src.frontier:
            self.counters.stamp_regressions += 1
            out.append(Late(event, arrival_us, "stamp_regression", floor - ref, False))
        else:
            self.counters.after_give_up += 1
            out.append(Late(event, arrival_us, "after_give_up", floor - ref, False))

    def _close_stretch(self, source_id: str, src: _Source, start: int, now_us: int, out: list[MergeOutput]) -> int:
        """Before an event that leaves ``push_run``'s stretch: the stretch queued so far goes out (if any); returns
        where the next stretch starts in the source's queue."""
        if len(src.queue) > start:
            self._end_stretch(source_id, src, start, now_us, out)
        return len(src.queue)

    def _end_stretch(self, source_id: str, src: _Source, start: int, now_us: int, out: list[MergeOutput]) -> None:
        """``push_run``: the source's queue grew from ``start`` events: account for them, then drain once."""
        self._apply_pending_beat(source_id, src)
        self._queued += len(src.queue) - start
        self.counters.peak_queued = max(self.counters.peak_queued, self._queued)
        if start == 0:
            heapq.heappush(self._heads, (src.queue[0][0], source_id))
        self._drain(now_us, out)

    def restore_watermark(self, watermark_us: int) -> None:
        """After a restart: a watermark already promised downstream stays promised (it never goes backwards)."""
        self._emitted_watermark = max(self._emitted_watermark, watermark_us)

    def register(self, source_id: str, now_us: int) -> list[MergeOutput]:
        """Announce a source (e.g. at its first time sync): from now on the merge waits for it."""
        src = self._source(source_id)
        self._revive(source_id, src, now_us)
        out: list[MergeOutput] = []
        self._drain(now_us, out)
        return out

    def note_heard(self, source_id: str, now_us: int) -> None:
        """When the source was last heard of, and nothing else: its wait, if started, keeps its deadline; a wait that
        starts later judges its silence from here (a source silent for longer than its whole wait is given up at
        once). An unknown source is no-op."""
        src = self._sources.get(source_id)
        if src is not None:
            src.heard_us = now_us

    def hear(self, source_id: str, now_us: int) -> list[MergeOutput]:
        """The source spoke, yet nothing of it reached the merge (its reorderer holds what it sent behind a gap): the
        merge waits for it afresh from now, a wait it had given up included. The silence measured for its learned
        wait goes on until its next release, the thing the merge waits for."""
        src = self._source(source_id)
        self._revive(source_id, src, now_us, silence_ends=False)
        out: list[MergeOutput] = []
        self._drain(now_us, out)
        return out

    def queued_of(self, source_id: str) -> int | None:
        """Events queued for ``source_id``; None if the merge does not know it (O(1), unlike queued_by_source)."""
        src = self._sources.get(source_id)
        return None if src is None else len(src.queue)

    def waits_for(self, source_id: str) -> bool:
        """Whether the merge is holding other sources' events for this one (it is the source being waited for)."""
        return self._blocker == source_id

    def forget(self, source_id: str) -> bool:
        """Drop a source that holds nothing (the gateway frees idle sources); ``register`` or its next event brings
        it back as a new source. Refused (False) while its queue is not empty or the merge waits for it: the others'
        events it holds back are released by that wait (it gives the source up), and dropping it would leave them
        queued with no deadline, unreleased until the stream's next push (review B1)."""
        src = self._sources.get(source_id)
        if src is None or src.queue or self._blocker == source_id:
            return False
        del self._sources[source_id]
        if self._watermark_holder == source_id:
            self._watermark_holder = None
        # Its entries in the lazy heap of empty sources are dropped as stale by _top_blocker.
        return True

    def heartbeat(self, source_id: str, seq: int, source_ts_us: int, now_us: int, *,
                  caught_up: bool = False, mapped: tuple[int, int] | None = None) -> list[MergeOutput]:
        """Proof of life: the source had sent every event up to ``seq`` when its clock read ``source_ts_us``.

        It also registers the source, so the merge waits for it from its first sync on. ``caught_up``: the caller
        knows every event up to ``seq`` has reached the merge, or never will through it (the ingest pipeline: the
        source's reorderer is past ``seq``, and what it did not release was merged before a restart or a shard
        handover). Without it the frontier waits until this merger has seen ``seq`` itself; a recovered source whose
        events were all published by the previous owner sends none again, and its heartbeats would never count:
        it would hold the merge for as long as it kept heartbeating (each one restarting the merge's wait).
        """
        src = self._source(source_id)
        if caught_up and (src.last_seq is None or src.last_seq < seq):
            src.last_seq = seq
        self.counters.heartbeats += 1
        ref, err = mapped if mapped is not None else self.clock.to_reference(source_id, source_ts_us)
        src.error_us = err
        delivered = src.last_seq if src.last_seq is not None else -1
        if (self.config.mode != "watermark" or (delivered >= seq and ref > src.frontier)
                or not (src.timed_out or src.wait_deadline is not None)):
            self._revive(source_id, src, now_us)
        # Otherwise the merge is waiting for this source (or gave it up) and the heartbeat promises nothing beyond its
        # frontier: alive, but no proof that what the others queued can go. Reviving it would restart the wait at
        # every heartbeat, and a source whose clock readings lag its stamps (a stuck clock, an SDK promise after a
        # far-off application stamp) would hold the whole stream for as long as it heartbeats.
        if src.pending_beat is None or seq >= src.pending_beat[0]:
            src.pending_beat = (seq, ref, err)
        self._apply_pending_beat(source_id, src)
        out: list[MergeOutput] = []
        self._drain(now_us, out)
        return out

    def leave(self, source_id: str, now_us: int) -> list[MergeOutput]:
        """The source left cleanly (a ``bye``): nothing more comes from it, so the merge gives it up at once instead
        of after its wait (issue 25 item 7), as it gives up a timed-out source, but counted as a departure, not a
        timeout (no ``SourceTimedOut``). Events it has queued are still released in order; it is given up once they
        are. If it comes
        back, its next event, heartbeat or registration revives it as after any give-up: events below the
        punctuation or below what was released meanwhile go to the late side output with their reason."""
        src = self._sources.get(source_id)
        if src is None or src.timed_out or src.leaving:
            return []
        self.counters.departures += 1
        out: list[MergeOutput] = []
        if src.queue:
            src.leaving = True
        else:
            self._depart_promising(source_id, src, now_us, out)
        self._drain(now_us, out)
        return out

    def _depart_promising(self, source_id: str, src: _Source, now_us: int, out: list[MergeOutput]) -> None:
        """Depart, after a punctuation (outside the punctuation interval) of what its promises allowed while it
        counted: once given up its frontier no longer bounds the watermark, and when it was the last source the
        stream would otherwise end below its final heartbeat's promise (windows left open)."""
        if self.config.mode == "watermark":
            self._punctuate(now_us, out)
        self._depart(source_id, src)

    def _depart(self, source_id: str, src: _Source) -> None:
        """Give a source that left up: as ``_time_out`` does, without counting a timeout."""
        src.leaving = False
        src.timed_out = True
        src.wait_deadline = None
        src.waited_since = None  # a departure is no silence to learn a wait from
        if self._blocker == source_id:
            self._blocker = None

    def advance(self, now_us: int) -> list[MergeOutput]:
        """Fire the wait on a silent source if its deadline is at or before ``now_us``."""
        out: list[MergeOutput] = []
        while self._blocker is not None:
            deadline = self._sources[self._blocker].wait_deadline
            if deadline is None or deadline > now_us:
                break
            self._time_out(self._blocker, deadline, out)
            self._drain(deadline, out)
        return out

    def flush(self, now_us: int) -> list[MergeOutput]:
        """End of stream: release everything queued in reference order without waiting."""
        out: list[MergeOutput] = []
        self._flushing = True
        try:
            self._drain(now_us, out)
        finally:
            self._flushing = False
        return out

    # -- internals ------------------------------------------------------------------------------

    def _source(self, source_id: str) -> _Source:
        src = self._sources.get(source_id)
        if src is None:
            cfg = self.config
            silences = None
            if cfg.learn_wait and cfg.mode == "watermark":
                cap_us = max(cfg.learned_wait_cap_us, 2)
                silences = DecayedQuantile(cfg.wait_quantile, half_life_samples=cfg.wait_half_life, max_us=cap_us)
            src = _Source(silences)
            self._sources[source_id] = src
            heapq.heappush(self._empty, (src.frontier, source_id))
        return src

    def _revive(self, source_id: str, src: _Source, now_us: int, silence_ends: bool = True) -> None:
        src.heard_us = now_us
        if silence_ends and src.waited_since is not None:
            # the silence the merge waited through ends here, whether or not the wait had given up
            if src.silences is not None:
                src.silences.add(now_us - src.waited_since)
            src.waited_since = None
        src.wait_deadline = None
        src.leaving = False
        if self._blocker == source_id:
            self._blocker = None
        if src.timed_out:
            src.timed_out = False
            if not src.queue:
                heapq.heappush(self._empty, (src.frontier, source_id))

    def _apply_pending_beat(self, source_id: str, src: _Source) -> None:
        """Advance the frontier to a heartbeat's clock once every event up to its seq was delivered."""
        beat = src.pending_beat
        if beat is None or self.config.mode != "watermark":
            return
        seq, ref, err = beat
        delivered = src.last_seq if src.last_seq is not None else -1
        if delivered < seq:
            return
        src.pending_beat = None
        moved = ref > src.frontier
        _advance_frontier(src, ref, err)
        if moved and not src.queue and not src.timed_out:
            # the old (lower) entry of this source becomes stale and is dropped lazily
            heapq.heappush(self._empty, (ref, source_id))

    def _top_blocker(self, ref: int) -> str | None:
        """The empty live source with the lowest frontier, if it could still send something below ``ref``."""
        if self._flushing:
            return None
        empty = self._empty
        sources = self._sources
        thesis = self.config.mode == "thesis"
        while empty:
            frontier, sid = empty[0]
            src = sources.get(sid)
            if src is None or src.queue or src.timed_out or src.frontier != frontier:
                heapq.heappop(empty)  # stale entry
                continue
            if thesis or frontier < ref:
                return sid
            return None
        return None

    def _learned_wait_us(self, silences: DecayedQuantile) -> int:
        """The wait this source's silences call for: ``min(cap, wait_factor x q-quantile)``, the cap until trusted."""
        cfg = self.config
        if silences.count < cfg.min_wait_samples:
            return cfg.learned_wait_cap_us
        return min(cfg.learned_wait_cap_us, int(cfg.wait_factor * silences.value_us()))

    def _time_out(self, source_id: str, at_us: int, out: list[MergeOutput]) -> None:
        src = self._sources[source_id]
        src.timed_out = True
        src.wait_deadline = None
        if self._blocker == source_id:
            self._blocker = None
        self.counters.timeouts += 1
        out.append(SourceTimedOut(self.stream, source_id, at_us))

    def _drain(self, now_us: int, out: list[MergeOutput]) -> None:
        heads = self._heads
        sources = self._sources
        while heads:
            ref, sid = heads[0]
            blocker = self._top_blocker(ref)
            if blocker is not None:
                if self._blocker != blocker:
                    self._blocker = blocker
                    bsrc = sources[blocker]
                    if bsrc.wait_deadline is None:
                        wait = (
                            self._timeout_for(blocker, now_us)
                            if self._timeout_for is not None
                            else self.config.default_timeout_us
                        )
                        if bsrc.silences is not None and bsrc.frontier != _NEVER:
                            # a source that never delivered has shown no silences: the given wait (a join or
                            # reconnect grace) alone says how long it may take to speak
                            wait = max(wait, self._learned_wait_us(bsrc.silences))
                        # A source already silent for longer than the whole wait it would get (gone without a word)
                        # is given up at once: N such sources cost the merge one wait, not N waits in a row each
                        # starting when the previous one gave up. Any other source gets the full wait from now, as
                        # every source does in thesis mode (Eq. 3.11).
                        if (bsrc.heard_us is not None and bsrc.heard_us + wait <= now_us
                                and self.config.mode == "watermark"):
                            bsrc.wait_deadline = now_us
                        else:
                            bsrc.wait_deadline = now_us + wait
                        if bsrc.waited_since is None:
                            bsrc.waited_since = now_us
                break
            self._blocker = None
            src = sources[sid]
            queue = src.queue
            _, event, arrival_us, raised_us = queue.popleft()
            self._queued -= 1
            self.counters.merged += 1
            self._released_max = max(self._released_max, ref)
            # Never released before it arrived: a frame read earlier on another connection may be handled after
            # this event's own (connections queue their frames apart), and its arrival is the call's now.
            out.append(Merged(event, arrival_us, max(now_us, arrival_us), ref, raised_us))
            if queue:
                heapq.heapreplace(heads, (queue[0][0], sid))  # one sift instead of a pop and a push
            else:
                heapq.heappop(heads)
                if src.leaving:
                    self._depart_promising(sid, src, now_us, out)  # it said bye: its last queued event is out
                elif not src.timed_out:
                    heapq.heappush(self._empty, (src.frontier, sid))
        if len(self._empty) > 4 * len(sources) + 64:
            # stale entries normally surface and are dropped quickly; this bounds the worst case
            self._empty = [(s.frontier, k) for k, s in sources.items() if not s.queue and not s.timed_out]
            heapq.heapify(self._empty)
        if self.config.mode == "watermark" and now_us >= self._next_punctuation_us:
            self._punctuate(now_us, out)

    def _punctuate(self, now_us: int, out: list[MergeOutput]) -> None:
        # The watermark is a minimum over every live source: while the source that held it down at the last scan is
        # live and still at or below the emitted watermark, the minimum is too and no scan is needed. Scanning on
        # every call while the merge was blocked cost O(sources) per heartbeat: with 1,000 sources on 10,000 pooled
        # connections that was most of the gateway's CPU, and it starved the timers that unblock the merge.
        holder = self._sources.get(self._watermark_holder) if self._watermark_holder is not None else None
        if holder is not None and not holder.timed_out and _bound_us(holder) <= self._emitted_watermark:
            return
        low: int | None = None
        low_source: str | None = None
        for source_id, src in self._sources.items():
            if src.timed_out:
                continue
            bound = _bound_us(src)
            if low is None or bound < low:
                low, low_source = bound, source_id
        self._watermark_holder = low_source
        if low is None or low <= self._emitted_watermark or low < self.config.min_watermark_us:
            # A watermark below 0 promises nothing (no record's ref_ts_us is negative) and is outside the
            # contract's range: a source with a large error bound near the epoch holds it back until it is not.
            return
        self._emitted_watermark = low
        self._next_punctuation_us = now_us + self.config.punctuation_interval_us
        self.counters.punctuations += 1
        out.append(Punctuation(self.stream, low, now_us))


def _advance_frontier(src: _Source, ref_us: int, error_us: int) -> None:
    """The source delivered (or promised) ``ref_us``, its true time at most ``error_us`` below it."""
    if ref_us > src.frontier:
        src.frontier, src.frontier_error_us = ref_us, error_us
    elif ref_us == src.frontier:
        src.frontier_error_us = min(src.frontier_error_us, error_us)  # both bounds hold: the tighter one does


def _allowed_us(src: _Source, floor_us: int, error_us: int) -> int:
    """How far an event of ``src`` mapped with bound ``error_us`` may sit below ``floor_us`` and still be raised to
    it. A floor at or below the source's own frontier: both bounds (its true time is no earlier than the frontier's,
    so the two mappings may differ by both, review B3). A floor set by other sources' releases above it: its own bound
    alone (the others' times say nothing about its true time)."""
    return error_us + src.frontier_error_us if floor_us <= src.frontier else error_us


def _bound_us(src: _Source) -> int:
    """The lowest reference time this source may still deliver: its next queued event or its frontier, minus its
    clock's error bound."""
    return (src.queue[0][0] if src.queue else src.frontier) - src.error_us
