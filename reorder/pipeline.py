"""The ordering pipeline, sans-IO: per-source sequence reorderers feeding one merger per stream.

The one wiring of reorderers -> reference mapping -> merger: the gateway runs it on its clock, the replay
(reorder/eval/replay.py) on virtual time, so the benchmark measures what production runs.

    events of a source ──▶ SequenceReorderer(source, stream) ──▶ ReferenceMapping ──▶ MultiSourceMerger(stream)
                                  │ late, gaps                      │ future-dated          │ late, punctuation
                                  ▼                                  ▼                       ▼
                             late topic                         late topic            events topic (ordered)

The shell passes the gateway clock's `now_us` into every call and calls `advance(now_us)` when
`next_deadline_us()` is due. Outputs are plain records the shell publishes; nothing here does I/O. Every pushed event
leaves exactly once, as one record on the events or the late topic, unless it is still held (`buffered()`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, cast

from contract.records import MAX_TS_US, MIN_TS_US, REF_RAISED_US, EventRecord
from contract.wire.messages import AtomicInterval, IncomingEvent, IntervalEndpoint
from reorder.merger import MergeOutput, MergerConfig, MultiSourceMerger
from reorder.records import GapSkipped, Late, Merged, Punctuation, Released, SourceEvent, SourceTimedOut
from reorder.sequence import ReorderOutput, SequenceConfig, SequenceReorderer
from timesync.clocks import ReferenceMapping

# The events topic promises order, so late events only go to the late topic (Query 4.3's 7th parameter = drop).
# A live gateway sees stalls a replay does not (event-loop pauses, a pool connection falling behind): gaps get at
# least 200 ms before they are skipped. In-order events never wait, so this costs latency only on lost events.
GATEWAY_MIN_GAP_TIMEOUT_US = 200_000
# Per (source, stream): the reorder buffer behind a gap (then the gap is given up, `buffer_full`). The replay's
# traces want more room (reorder.sequence.DEFAULT_MAX_BUFFERED); a gateway keeps one source's memory to this bound
# (docs/operations.md, "Limits"), far below max_buffered_events, which pauses every source holding events.
GATEWAY_MAX_BUFFERED = 100_000
# A gateway does not learn a longer gap wait by default: the merge waits for a source as long as its reorderer
# holds a gap, so a learned wait (up to 2 x the longest gap a source showed) would hold every source of the stream,
# and a hostile source could lengthen it at will. `gap_timeout_learned_max_s` turns learning on.
GATEWAY_SEQUENCE_DEFAULTS = SequenceConfig(drop_late=True, min_timeout_us=GATEWAY_MIN_GAP_TIMEOUT_US,
                                           max_buffered=GATEWAY_MAX_BUFFERED, max_latency_threshold_us=0)
# A clock more than a minute ahead of the gateway is broken, not early: quarantined so it cannot drag the
# merge and the watermark into the future.
DEFAULT_MAX_FUTURE_US = 60_000_000
# After a restart, how long the merge waits for the sources recovered from Kafka to reconnect (the SDK's default
# reconnect backoff tops out at 5 s): all of them share this one deadline, so sources that never come back cost
# one wait in total, not one each.
DEFAULT_RECONNECT_GRACE_US = 5_000_000
# How long the merge waits for a source that said hello but has sent neither an event nor a heartbeat since. All
# sources that join around the same time share about the same deadline: a crowd of silent newcomers (a slowloris or
# hello flood on an open gateway) costs one wait in total, not one adaptive wait each, one after the other.
DEFAULT_JOIN_GRACE_US = 2_000_000


class SequenceCore(Protocol):
    """What the pipeline asks of a per-source reorderer: :class:`reorder.sequence.SequenceReorderer`'s API, which the
    native core (``skewless_native.SequenceReorderer``, built with ``records=(Released, Late, GapSkipped)``) has too."""

    @property
    def expected_seq(self) -> int: ...
    @property
    def buffered(self) -> int: ...
    def next_deadline_us(self) -> int | None: ...
    def merge_wait_us(self, now_us: int) -> int: ...
    def push(self, event: SourceEvent, now_us: int) -> list[ReorderOutput]: ...
    def take_in_order(self, seq: int, now_us: int) -> bool: ...
    def advance(self, now_us: int) -> list[ReorderOutput]: ...


RunItem = tuple[SourceEvent, int, tuple[int, int]]
TakeRun = Callable[[Sequence[IncomingEvent], int, str, int, "list[tuple[int, int]] | None", ReferenceMapping,
                    type[SourceEvent], tuple[int, int, int, int]], tuple[list[RunItem], int]]
"""A native reorderer's ``take_run`` (skewless_native.SequenceReorderer): push_many's in-order fast path for a run
of events in one call, from an index: the run's items and the index of the first event it left to push_many."""

PushInOrder = Callable[[SequenceCore, object, Sequence[IncomingEvent], int, str, int, "list[tuple[int, int]] | None",
                        ReferenceMapping, type[SourceEvent], tuple[int, int, int, int]],
                       tuple[int, "list[RunItem] | None", "list[Any] | None", "list[int] | None",
                             "dict[int, int] | None"]]
"""A native merger's ``push_in_order`` (skewless_native.MultiSourceMerger): the reorderer's ``take_run``, then, when
push_many would hand that run to the merger right after (the frame ends or its next event is another stream's),
``push_run_built`` of it, in one call. Returns (the index of the first event not taken, the taken items when they
were not pushed, else None, then ``push_run_built``'s outputs and handed-back positions and ``{id(event):
error_us}`` of the run's events among the handed-back outputs when something was handed back)."""

ReordererFactory = Callable[[str, str, SequenceConfig], SequenceCore]
"""Builds the reorderer of (source_id, stream) with a config: a floor above this one injects the native core."""


class MergerCounterValues(Protocol):
    @property
    def departures(self) -> int: ...


class MergerCore(Protocol):
    """What the pipeline (and the gateway's join entry, through :meth:`IngestPipeline.merger_of`) asks of a stream's
    merger: :class:`reorder.merger.MultiSourceMerger`'s API, which the native core
    (``skewless_native.MultiSourceMerger``, built with ``records=(Merged, Punctuation, SourceTimedOut, Late)``) has
    too."""

    @property
    def watermark_us(self) -> int | None: ...
    @property
    def counters(self) -> MergerCounterValues: ...
    def queued_by_source(self) -> dict[str, int]: ...
    def sources(self) -> list[str]: ...
    def is_timed_out(self, source_id: str) -> bool: ...
    def next_deadline_us(self) -> int | None: ...
    def queued_of(self, source_id: str) -> int | None: ...
    def waits_for(self, source_id: str) -> bool: ...
    def forget(self, source_id: str) -> bool: ...
    def note_heard(self, source_id: str, now_us: int) -> None: ...
    def restore_watermark(self, watermark_us: int) -> None: ...
    def push(self, event: SourceEvent, arrival_us: int, now_us: int, *, late: bool = False,
             mapped: tuple[int, int] | None = None) -> list[MergeOutput]: ...
    def push_run(self, source_id: str, run: list[tuple[SourceEvent, int, tuple[int, int]]],
                 now_us: int) -> list[MergeOutput]: ...
    def register(self, source_id: str, now_us: int) -> list[MergeOutput]: ...
    def hear(self, source_id: str, now_us: int) -> list[MergeOutput]: ...
    def heartbeat(self, source_id: str, seq: int, source_ts_us: int, now_us: int, *, caught_up: bool = False,
                  mapped: tuple[int, int] | None = None) -> list[MergeOutput]: ...
    def leave(self, source_id: str, now_us: int) -> list[MergeOutput]: ...
    def advance(self, now_us: int) -> list[MergeOutput]: ...


MergerFactory = Callable[[str, ReferenceMapping, MergerConfig, Callable[[str, int], int]], MergerCore]
"""Builds the merger of a stream from its clock, its config and its ``timeout_for`` (how long to wait for a silent
source): a floor above this one injects the native core."""


class MergedRecordsCore(Protocol):
    """Builds the caller's own outputs (the gateway's Produce actions, gateway.native's record builder) for the
    merge's plain releases of a run, in one call, exactly as the caller would from their PublishRecords."""

    def build_merged(self, merged: list[MergeOutput], run: list[tuple[SourceEvent, int, tuple[int, int]]],
                     clock: ReferenceMapping) -> tuple[list[object], list[int]]:
        """``merged``: what ``MergerCore.push_run(run)`` returned. Each item's built output, or the item itself in
        its place where it leaves it to ``_records``; with the positions of those."""
        ...


@dataclass(frozen=True)
class PipelineConfig:
    sequence: SequenceConfig = GATEWAY_SEQUENCE_DEFAULTS
    merger: MergerConfig = field(default_factory=MergerConfig)
    max_future_us: int = DEFAULT_MAX_FUTURE_US
    reconnect_grace_us: int = DEFAULT_RECONNECT_GRACE_US
    join_grace_us: int = DEFAULT_JOIN_GRACE_US
    ts_floor_us: int = MIN_TS_US
    """The lowest reference time a record (and a watermark) may carry: the record contract's 0. The replay runs on
    virtual time that starts at 0 with source clocks behind it: it lowers this to
    ``reorder.merger.VIRTUAL_TIME_FLOOR_US``."""
    drop_late: bool = True
    """Query 4.3's 7th parameter for every reorderer of the pipeline (it overrides ``sequence.drop_late``).

    True, the gateway: a late event goes to the late topic only, so the events topic keeps its order promise
    (docs/record-contract.md). False, the thesis' Query 5.3 as the replay runs it: a late event joins the merge at
    once and is published on the events topic flagged ``late`` with its reason, unless it is older than a
    punctuation already emitted (then it still goes to the late topic, ``after_punctuation``)."""
    reorderer_factory: ReordererFactory = SequenceReorderer
    """The per-source reorderer core: the Python :class:`SequenceReorderer` (this floor's), or one a higher floor
    injects (the replay's ``--core native``)."""
    merger_factory: MergerFactory = MultiSourceMerger
    """The per-stream merger core: the Python :class:`MultiSourceMerger` (this floor's), or one a higher floor
    injects."""


@dataclass(frozen=True, slots=True)
class PipelineCores:
    """The reorderer and merger cores a floor above this one injects (the native ones: gateway/native.py)."""

    reorderer_factory: ReordererFactory
    merger_factory: MergerFactory

    def apply(self, config: PipelineConfig) -> PipelineConfig:
        return replace(config, reorderer_factory=self.reorderer_factory, merger_factory=self.merger_factory)


@dataclass(frozen=True, slots=True)
class PublishRecord:
    record: EventRecord
    topic: Literal["events", "late"]


@dataclass(frozen=True, slots=True)
class PublishPunctuation:
    stream: str
    watermark_us: int
    at_us: int


@dataclass(frozen=True, slots=True)
class PublishRefused:
    """Nothing to publish: the pipeline refused an event or a heartbeat of ``source_id``, for ``reason``.

    An event (``stream`` and ``seq`` set) whose mapped time falls outside the record contract's range
    (``timestamp_out_of_range``: ``ref_ts_us``, its start or its error bound outside ``MIN_TS_US..MAX_TS_US``) is
    never published; the shell settles its seq (so the cumulative ack moves over it) and tells the source. A
    heartbeat (``stream`` and ``seq`` None) whose clock reading maps more than ``max_future_us`` ahead of the
    gateway clock (``future_dated``) or outside the range moves nothing: a runaway clock's heartbeat would
    otherwise run the stream's watermark ahead of every other source's events."""

    source_id: str
    stream: str | None
    seq: int | None
    reason: str
    detail: str


PipelineOutput = PublishRecord | PublishPunctuation | PublishRefused

# Why an event or heartbeat is refused (PublishRefused.reason).
OUT_OF_RANGE = "timestamp_out_of_range"
FUTURE_DATED = "future_dated"


def _out_of_range(ref_us: int, error_us: int, floor_us: int = MIN_TS_US) -> bool:
    return not (floor_us <= ref_us <= MAX_TS_US and MIN_TS_US <= error_us <= MAX_TS_US)


@dataclass
class PipelineCounters:
    released: int = 0
    late: int = 0
    quarantined: int = 0
    gaps: int = 0
    gap_events_skipped: int = 0
    source_timeouts: int = 0
    punctuations: int = 0
    heartbeats_refused: int = 0  # future-dated or out-of-range heartbeats: they moved nothing
    timestamps_refused: int = 0  # events whose mapped times fall outside the contract's range: never published
    watermarks_distrusted: int = 0  # restored watermarks beyond max_future of the restoring clock, not restored
    stamp_regressions: int = 0  # events late as "stamp_regression" (their source's stamps went backwards)
    after_give_up: int = 0  # events late as "after_give_up" (below what was released after their source was given up)
    refs_raised: int = 0  # events whose ref_ts_us was raised within their error bound to keep reference order
    departures: int = 0  # sources that left cleanly (a bye): the merge gave them up without a wait


class _StreamPipeline:
    def __init__(self, stream: str, clock: ReferenceMapping, config: PipelineConfig) -> None:
        self.reorderers: dict[str, SequenceCore] = {}
        self.config = config
        self.stream = stream
        merger = config.merger
        if merger.min_watermark_us != config.ts_floor_us:
            merger = replace(merger, min_watermark_us=config.ts_floor_us)
        self.merger = config.merger_factory(stream, clock, merger, self._merge_wait)
        sequence = config.sequence
        self.sequence = sequence if sequence.drop_late == config.drop_late else replace(
            sequence, drop_late=config.drop_late)
        # Sources recovered after a restart that have not reconnected yet, and sources that said hello but have not
        # sent anything since: the merge waits for them until then (a shared deadline, not one wait each).
        self.expected_until: dict[str, int] = {}
        self.join_window_until_us = 0  # the deadline newcomers share (IngestPipeline.register)
        self.next_join_window_us = 0  # the earliest a next join window may open

    def _merge_wait(self, source_id: str, now_us: int) -> int:
        until = self.expected_until.get(source_id)
        if until is not None:
            return max(0, until - now_us)
        reorderer = self.reorderers.get(source_id)
        return self.config.merger.default_timeout_us if reorderer is None else reorderer.merge_wait_us(now_us)

    def reorderer(self, source_id: str, initial_seq: int) -> SequenceCore:
        reorderer = self.reorderers.get(source_id)
        if reorderer is None:
            config = self.sequence
            if initial_seq != config.initial_seq:
                config = replace(config, initial_seq=initial_seq)
            reorderer = self.config.reorderer_factory(source_id, self.stream, config)
            self.reorderers[source_id] = reorderer
        return reorderer


class IngestPipeline:
    def __init__(self, clock: ReferenceMapping, config: PipelineConfig | None = None) -> None:
        self.clock = clock
        self.config = config or PipelineConfig()
        self.counters = PipelineCounters()
        self._streams: dict[str, _StreamPipeline] = {}
        self._next_seq_hint: dict[tuple[str, str], int] = {}
        # Lazy heap of (deadline_us, 0 for a reorderer / 1 for the merger, stream, source_id or ""); stale entries are
        # skipped. At equal deadlines reorderers go first: the merge's wait for a source is a wait for that source's
        # next release, and a release due at the same instant is in time (thesis mode makes the two coincide).
        self._deadlines: list[tuple[int, int, str, str]] = []
        self._scheduled: dict[tuple[str, str], int] = {}
        # The gaps the reorderers gave up, for a caller that acts on them (the gateway: its acks pass them and the
        # source is told, issue 24 item 2): None keeps none (the replay); a list collects them, the caller drains it.
        self.gaps_given_up: list[GapSkipped] | None = None
        # What builds the caller's outputs of a run's plain releases itself (the gateway's native record builder):
        # they go into the outputs as it built them, counted as released; None: every release is a PublishRecord.
        self.merged_records: MergedRecordsCore | None = None
        self._run_limits = (self.config.max_future_us, self.config.ts_floor_us, MAX_TS_US, MIN_TS_US)  # take_run's

    # -- setup ------------------------------------------------------------------------------------

    def resume_from(self, source_id: str, stream: str, next_seq: int) -> None:
        """After a restart: this source's events below `next_seq` are already in Kafka."""
        self._next_seq_hint[(source_id, stream)] = next_seq

    def forget_seq_hints(self, source_id: str, streams: Iterable[str]) -> None:
        """The gateway forgot the source on these streams (it left their checkpoints): drop its next-seq hints,
        the last per-source state forget_source keeps."""
        for stream in streams:
            self._next_seq_hint.pop((source_id, stream), None)

    def restore_watermark(self, stream: str, watermark_us: int, now_us: int | None = None) -> bool:
        """After a restart: keep the promise of the last punctuation published before it.

        With ``now_us`` (a checkpoint read back), a watermark more than ``max_future_us`` ahead of ``now_us`` (or
        outside the contract's range) is not trusted and not restored (False, counted): validated input never
        promises that far ahead, so it comes from an unvalidated one (a runaway heartbeat before heartbeats were
        checked) or a gateway clock that stepped back. Restored, it would send every source's on-time events to the
        late topic until the clock caught up with it."""
        if now_us is not None and (watermark_us - now_us > self.config.max_future_us
                                   or _out_of_range(watermark_us, 0, self.config.ts_floor_us)):
            self.counters.watermarks_distrusted += 1
            return False
        self._stream(stream).merger.restore_watermark(watermark_us)
        return True

    def expect(self, source_id: str, stream: str, now_us: int) -> list[PipelineOutput]:
        """After a restart: a source recovered from Kafka joins the merge before it reconnects.

        Otherwise the first source back would run the watermark past the resends of the others, and their
        in-order events would go to the late topic. The merge waits for it until `reconnect_grace_us` after now.
        """
        self._stream(stream).reorderer(source_id, self._next_seq_hint.get((source_id, stream), 0))
        return self.hold_until(source_id, stream, now_us + self.config.reconnect_grace_us, now_us)

    def hold_until(self, source_id: str, stream: str, until_us: int, now_us: int) -> list[PipelineOutput]:
        """The merge waits for the silent source on the stream until ``until_us``, whenever its wait starts.

        A newcomer's join wait (``register``, ``wait_until``) is judged from when it was last heard of: the merge
        gives a source up at once when it has been silent for longer than the wait it would get from now. For a wait
        with a fixed end that rule gave a recovered source up at once whenever the merge began waiting for it past
        half of its reconnect grace (the first other source back 2.5 s after a takeover), and its resends went late.
        Heard of at ``until_us``, the rule (heard + (until - now) <= now) reads ``until_us <= now``: the end alone
        decides, in the Python and the native merger alike, until the source speaks."""
        pipeline = self._stream(stream)
        pipeline.expected_until[source_id] = until_us
        out: list[PipelineOutput] = []
        self._merge_outputs(pipeline, pipeline.merger.register(source_id, now_us), out)
        pipeline.merger.note_heard(source_id, until_us)
        self._track(pipeline, "")
        return out

    def register(self, source_id: str, streams: tuple[str, ...], now_us: int) -> list[PipelineOutput]:
        out: list[PipelineOutput] = []
        for stream in streams:
            pipeline = self._stream(stream)
            # Join windows, one per stream: newcomers share the deadline of the window open when they say hello,
            # and a window opens at most once per two graces. A trickle of silent newcomers (a hello flood) then
            # holds the merge for one grace at a time and at most half of the time, never for as long as they keep
            # coming (issue 24 item 5). A newcomer between windows is not waited for (its first events follow its
            # hello by milliseconds; those behind the watermark are late, as for any source behind it).
            if now_us >= pipeline.join_window_until_us and now_us >= pipeline.next_join_window_us:
                pipeline.join_window_until_us = now_us + self.config.join_grace_us
                pipeline.next_join_window_us = pipeline.join_window_until_us + self.config.join_grace_us
            pipeline.expected_until[source_id] = max(now_us, pipeline.join_window_until_us)
            # The reorderer comes with the first event or heartbeat (push, heartbeat): a source that only says
            # hello costs its merge registration, not a reorderer per declared stream (issue 24 item 5).
            self._merge_outputs(pipeline, pipeline.merger.register(source_id, now_us), out)
        return out

    # -- merge entries a caller manages itself (the gateway's join entry for silent newcomers, gateway.ingest) ------

    def merger_of(self, stream: str) -> MergerCore | None:
        """The stream's merge, for queries (None before the stream's first registration, event or heartbeat)."""
        pipeline = self._streams.get(stream)
        return None if pipeline is None else pipeline.merger

    def holds_state(self, source_id: str, stream: str) -> bool:
        """Whether the source has a reorderer (it sent an event or a heartbeat) or a merge entry on the stream."""
        pipeline = self._streams.get(stream)
        return pipeline is not None and (source_id in pipeline.reorderers
                                         or pipeline.merger.queued_of(source_id) is not None)

    def expected_until_us(self, source_id: str, stream: str) -> int | None:
        """Until when the merge waits for the silent source on the stream (a join or reconnect grace), if it does."""
        pipeline = self._streams.get(stream)
        return None if pipeline is None else pipeline.expected_until.get(source_id)

    def set_expected_until(self, source_id: str, stream: str, until_us: int) -> None:
        """Change the end of the grace the merge gives the silent source on the stream (its wait, if started, keeps
        the deadline it had: only a wait that starts later reads this)."""
        self._stream(stream).expected_until[source_id] = until_us

    def wait_until(self, source_id: str, stream: str, until_us: int, now_us: int) -> list[PipelineOutput]:
        """The merge waits for the silent source on the stream until ``until_us``, as if it had said hello with that
        grace (``register``'s entry with a deadline the caller chose)."""
        pipeline = self._stream(stream)
        pipeline.expected_until[source_id] = until_us
        out: list[PipelineOutput] = []
        self._merge_outputs(pipeline, pipeline.merger.register(source_id, now_us), out)
        self._track(pipeline, "")
        return out

    def leave_merge(self, source_id: str, stream: str, now_us: int) -> list[PipelineOutput]:
        """The source leaves the stream's merge as after a ``bye`` (nothing waits for it; what it queued still goes
        out in order), and its grace is forgotten."""
        pipeline = self._streams[stream]
        out: list[PipelineOutput] = []
        self._merge_outputs(pipeline, pipeline.merger.leave(source_id, now_us), out)
        self._track(pipeline, "")
        pipeline.expected_until.pop(source_id, None)
        return out

    def forget_source(self, source_id: str, streams_of_source: Iterable[str] | None = None) -> bool:
        """Free a source's per-stream state (its reorderers and merge entries) once it holds nothing: its next
        seq per stream is kept as a hint, so a source that comes back resumes where it left off. False (and
        nothing freed) while it holds events anywhere, its own or, as the source a merge is waiting for, the others'
        (freed then, their wait was lost and they stayed queued with no deadline; its wait gives it up and the next
        sweep frees it). ``streams_of_source``: the only streams it can have state in (its declared ones), to look
        at those only; None: every stream."""
        candidates = (self._streams.values() if streams_of_source is None
                      else [p for p in map(self._streams.get, streams_of_source) if p is not None])
        streams = [p for p in candidates if source_id in p.reorderers or p.merger.queued_of(source_id) is not None]
        for pipeline in streams:
            reorderer = pipeline.reorderers.get(source_id)
            if ((reorderer is not None and reorderer.buffered) or pipeline.merger.queued_of(source_id)
                    or pipeline.merger.waits_for(source_id)):
                return False
        for pipeline in streams:
            reorderer = pipeline.reorderers.pop(source_id, None)
            if reorderer is not None:
                self._next_seq_hint[(source_id, pipeline.stream)] = reorderer.expected_seq
            pipeline.expected_until.pop(source_id, None)
            self._scheduled.pop((pipeline.stream, source_id), None)
            pipeline.merger.forget(source_id)
        return True

    # -- input ------------------------------------------------------------------------------------

    def push(self, source_id: str, event: IncomingEvent, arrival_us: int, *,
             mapped: tuple[int, int] | None = None) -> list[PipelineOutput]:
        """``mapped``: ``clock.to_reference(source_id, event.source_ts_us)`` as the caller just computed it (the
        gateway's clock-step check maps every event of a synced source). It is used only if the reorderer releases
        this very event within this call: nothing can change the clock's estimate in between, so it is the mapping
        the pipeline would compute. An event the reorderer buffers is mapped when it leaves, as before."""
        pipeline = self._stream(event.stream)
        if pipeline.expected_until:
            pipeline.expected_until.pop(source_id, None)  # it spoke: its own adaptive waits apply from now on
        reorderer = pipeline.reorderer(source_id, self._next_seq_hint.get((source_id, event.stream), 0))
        source_event = SourceEvent(source_id, event.stream, event.seq, event.source_ts_us, event.payload,
                                   event.interval)
        out: list[PipelineOutput] = []
        self._reorder_outputs(pipeline, reorderer.push(source_event, arrival_us), arrival_us, out,
                              source_event if mapped is not None else None, mapped)
        self._heard_behind_a_gap(pipeline, source_id, reorderer, arrival_us, out)
        self._track(pipeline, source_id)
        return out

    def _heard_behind_a_gap(self, pipeline: _StreamPipeline, source_id: str, reorderer: SequenceCore, now_us: int,
                            out: list[PipelineOutput]) -> None:
        """An event its reorderer holds behind a gap reached no merge, yet the source spoke: the merge hears of it,
        so its wait for the source starts again from now and covers the gap's hold (``merge_wait_us``). Otherwise a
        wait set before (a newcomer's join wait, a wait that began while it was silent) could end while the gap is
        still held, and the others' releases would run the watermark past everything behind the gap. Watermark mode
        only: the thesis' merge waits Eq. 3.11 from when it started waiting, whatever arrives meanwhile."""
        if reorderer.buffered and self.config.merger.mode == "watermark":
            self._merge_outputs(pipeline, pipeline.merger.hear(source_id, now_us), out)

    def push_many(self, source_id: str, events: Sequence[IncomingEvent], arrival_us: int,
                  mappings: list[tuple[int, int]] | None = None) -> list[PipelineOutput]:
        """``push`` for each event of one frame, in order, with the same outputs but for where a punctuation falls;
        ``mappings``: each event's ``mapped`` (as ``push`` takes it), or None to map them here.

        The in-order fast path: an event that is its reorderer's next seq with nothing buffered is released by it at
        once (``SequenceReorderer.take_in_order``), mapped, and collected with the source's other such events of
        the frame into one ``MultiSourceMerger.push_run``: one drain of the merge per run, not one per event. Any
        other event (a gap, a late one, a future-dated one) first hands the run collected so far to the merger,
        then takes ``push``'s own path, so outputs keep the order ``push`` gives them."""
        out: list[PipelineOutput] = []
        pipeline: _StreamPipeline | None = None
        reorderer: SequenceCore | None = None
        take_run: TakeRun | None = None
        run: list[tuple[SourceEvent, int, tuple[int, int]]] = []
        touched: list[_StreamPipeline] = []
        index, count = 0, len(events)
        while index < count:
            event = events[index]
            if pipeline is None or event.stream != pipeline.stream:
                if run:
                    assert pipeline is not None
                    self._push_run(pipeline, source_id, run, arrival_us, out)
                pipeline = self._stream(event.stream)
                if pipeline.expected_until:
                    pipeline.expected_until.pop(source_id, None)  # it spoke: its own adaptive waits apply from now on
                reorderer = pipeline.reorderer(source_id, self._next_seq_hint.get((source_id, event.stream), 0))
                # The native reorderer's take_run: the fast path below for a whole run of events in one call.
                take_run = getattr(reorderer, "take_run", None)
                if pipeline not in touched:
                    touched.append(pipeline)
            assert reorderer is not None
            if take_run is not None:
                push_in_order = None if run else self._push_in_order_of(pipeline)
                if push_in_order is not None:
                    next_index = self._push_in_order(push_in_order, reorderer, source_id, events, index, arrival_us,
                                                     mappings, run, out)
                else:
                    taken, next_index = take_run(events, index, source_id, arrival_us, mappings, self.clock,
                                                 SourceEvent, self._run_limits)
                    run += taken
                if next_index > index:
                    index = next_index
                    continue
            given = mappings[index] if mappings is not None else None
            self._push_one_of_many(pipeline, reorderer, source_id, event, given, arrival_us, run, out)
            index += 1
        if run:
            assert pipeline is not None
            self._push_run(pipeline, source_id, run, arrival_us, out)
        for touched_pipeline in touched:
            self._track(touched_pipeline, source_id)
        return out

    def _push_in_order_of(self, pipeline: _StreamPipeline) -> PushInOrder | None:
        """The stream's native merger's fused in-order call, when the records are built natively too."""
        if self.merged_records is None:
            return None
        return cast("PushInOrder | None", getattr(pipeline.merger, "push_in_order", None))

    def _push_in_order(self, push_in_order: PushInOrder, reorderer: SequenceCore, source_id: str,
                       events: Sequence[IncomingEvent], index: int, arrival_us: int,
                       mappings: list[tuple[int, int]] | None, run: list[RunItem], out: list[PipelineOutput]) -> int:
        """``take_run`` from ``index`` and, when push_many would push that run next, ``_push_run`` of it, in one
        native call; returns the index of the first event not taken."""
        next_index, taken, built, handed_back, run_errors = push_in_order(
            reorderer, self.merged_records, events, index, source_id, arrival_us, mappings, self.clock, SourceEvent,
            self._run_limits)
        if taken is not None:
            run += taken
        elif built is not None and handed_back is not None:
            self._take_built(built, handed_back, run_errors, out)
        return next_index

    def _push_one_of_many(self, pipeline: _StreamPipeline, reorderer: SequenceCore, source_id: str,
                          event: IncomingEvent, given: tuple[int, int] | None, arrival_us: int,
                          run: list[tuple[SourceEvent, int, tuple[int, int]]], out: list[PipelineOutput]) -> None:
        """One event of ``push_many``: onto the run if it is in order (the fast path), else through ``push``'s own
        path once the run so far went to the merger."""
        if reorderer.take_in_order(event.seq, arrival_us):
            mapped = given if given is not None else self.clock.to_reference(source_id, event.source_ts_us)
            source_event = SourceEvent(source_id, event.stream, event.seq, event.source_ts_us, event.payload,
                                       event.interval)
            # In the contract's range (an interval's start too) and not future-dated: on the fast path; any
            # other goes through _to_merger, which refuses or quarantines it.
            config = self.config
            if (mapped[0] - arrival_us <= config.max_future_us and config.ts_floor_us <= mapped[0] <= MAX_TS_US
                    and mapped[1] >= MIN_TS_US
                    and (event.interval is None or not self._out_of_contract(source_event, mapped))):
                run.append((source_event, arrival_us, mapped))
                return
            if run:
                self._push_run(pipeline, source_id, run, arrival_us, out)
            self._to_merger(pipeline, Released(source_event, arrival_us, arrival_us), arrival_us, out, mapped=mapped)
            return
        if run:
            self._push_run(pipeline, source_id, run, arrival_us, out)
        source_event = SourceEvent(source_id, event.stream, event.seq, event.source_ts_us, event.payload,
                                   event.interval)
        self._reorder_outputs(pipeline, reorderer.push(source_event, arrival_us), arrival_us, out,
                              source_event if given is not None else None, given)
        self._heard_behind_a_gap(pipeline, source_id, reorderer, arrival_us, out)

    def _push_run(self, pipeline: _StreamPipeline, source_id: str, run: list[tuple[SourceEvent, int, tuple[int, int]]],
                  now_us: int, out: list[PipelineOutput]) -> None:
        """Hands the run to the merger and empties it (the caller collects the next run in the same list)."""
        merged_records = self.merged_records
        fused = None if merged_records is None else getattr(pipeline.merger, "push_run_built", None)
        if fused is not None:
            # The native merger's push_run and the builder's build_merged in one call, without the Merged records
            # of the releases the builder produces.
            built, handed_back = fused(source_id, run, now_us, merged_records, self.clock)
        else:
            merged = pipeline.merger.push_run(source_id, run, now_us)
            if not merged:  # the merge waits for another source: nothing to build
                run.clear()
                return
            if merged_records is None:
                errors = {id(event): mapped[1] for event, _arrival_us, mapped in run}
                run.clear()
                self._records(merged, out, None, None, None, errors)
                return
            built, handed_back = merged_records.build_merged(merged, run, self.clock)
        run_errors = {id(event): mapped[1] for event, _arrival_us, mapped in run} if handed_back else None
        run.clear()
        self._take_built(built, handed_back, run_errors, out)

    def _take_built(self, built: list[Any], handed_back: list[int], run_errors: dict[int, int] | None,
                    out: list[PipelineOutput]) -> None:
        """``push_run_built``'s outputs into ``out``: the Produce actions as they are, the records it handed back
        (the merge's other outputs, releases the builder left) through ``_records``."""
        self.counters.released += len(built) - len(handed_back)
        start = 0
        for position in handed_back:  # the merge's other outputs, and releases the builder left to _records
            out += cast(list[PipelineOutput], built[start:position])
            self._records([cast(MergeOutput, built[position])], out, None, None, None, run_errors)
            start = position + 1
        out += cast(list[PipelineOutput], built[start:])

    def heartbeat(self, source_id: str, next_seq: dict[str, int], source_ts_us: int,
                  now_us: int) -> list[PipelineOutput]:
        """A heartbeat passes the rules an event does before it moves anything: its clock reading, mapped, must
        be inside the contract's range and at most ``max_future_us`` ahead of ``now_us``. Otherwise it is refused
        (one ``PublishRefused`` with stream and seq None, counted): it neither counts as the source speaking nor
        moves its frontier, so the watermark never exceeds what validated input promised."""
        out: list[PipelineOutput] = []
        mapped = self.clock.to_reference(source_id, source_ts_us)
        ref_us, error_us = mapped
        floor_us = self.config.ts_floor_us
        if _out_of_range(ref_us, error_us, floor_us) or ref_us - now_us > self.config.max_future_us:
            self.counters.heartbeats_refused += 1
            if _out_of_range(ref_us, error_us, floor_us):
                return [PublishRefused(source_id, None, None, OUT_OF_RANGE,
                                       f"heartbeat source_ts_us={source_ts_us} maps to {ref_us} (error bound "
                                       f"{error_us} us), outside {MIN_TS_US}..{MAX_TS_US}")]
            return [PublishRefused(source_id, None, None, FUTURE_DATED,
                                   f"heartbeat source_ts_us={source_ts_us} maps {ref_us - now_us} us ahead of the "
                                   f"gateway clock (max {self.config.max_future_us} us)")]
        for stream, seq in next_seq.items():
            pipeline = self._stream(stream)
            if pipeline.expected_until:
                pipeline.expected_until.pop(source_id, None)
            reorderer = pipeline.reorderer(source_id, self._next_seq_hint.get((source_id, stream), 0))
            # Only a source whose every event up to next_seq - 1 has left its reorderer is proven caught up.
            if reorderer.expected_seq >= seq and reorderer.buffered == 0:
                self._merge_outputs(pipeline, pipeline.merger.heartbeat(source_id, seq - 1, source_ts_us, now_us,
                                                                        caught_up=True, mapped=mapped), out)
                self._track(pipeline, "")
        return out

    def source_left(self, source_id: str, now_us: int) -> list[PipelineOutput]:
        """The source said ``bye`` (issue 25 item 7): every merge it is in gives it up now instead of waiting for it
        (its learned wait, or its join or reconnect grace); what it has queued is still released in order. Its
        reorderer is left as it is: a gap it left open is waited for as usual (its resends may come later). A
        source that comes back (hello, event, heartbeat) is welcomed as after any give-up."""
        out: list[PipelineOutput] = []
        for pipeline in self._streams.values():
            if source_id not in pipeline.reorderers and source_id not in pipeline.merger.sources():
                continue
            pipeline.expected_until.pop(source_id, None)
            departed = pipeline.merger.counters.departures
            self._merge_outputs(pipeline, pipeline.merger.leave(source_id, now_us), out)
            if pipeline.merger.counters.departures > departed:  # a pool says bye on each of its connections
                self.counters.departures += 1
            self._track(pipeline, "")
        return out

    def advance(self, now_us: int) -> list[PipelineOutput]:
        out: list[PipelineOutput] = []
        while self._deadlines and self._deadlines[0][0] <= now_us:
            deadline, _merger_last, stream, source_id = heapq.heappop(self._deadlines)
            if self._scheduled.get((stream, source_id)) == deadline:
                del self._scheduled[(stream, source_id)]
            pipeline = self._streams[stream]
            if source_id:
                reorderer = pipeline.reorderers.get(source_id)
                if reorderer is None:
                    continue  # forgotten (forget_source): a stale entry
                due = reorderer.next_deadline_us()
                if due is not None and due <= now_us:
                    self._reorder_outputs(pipeline, reorderer.advance(now_us), now_us, out)
                self._track(pipeline, source_id)
            else:
                due = pipeline.merger.next_deadline_us()
                if due is not None and due <= now_us:
                    self._merge_outputs(pipeline, pipeline.merger.advance(now_us), out)
                self._track(pipeline, "")
        return out

    def next_deadline_us(self) -> int | None:
        """The earliest deadline a core set and still has. Entries a later one replaced are dropped here, not when
        their time comes: with 20 sources the merge's blocker, and so its deadline, changes with nearly every frame,
        and the gateway's timer, woken at each replaced entry, ran about 9,000 times a second for nothing."""
        deadlines, scheduled = self._deadlines, self._scheduled
        while deadlines:
            due, _merger_last, stream, source_id = deadlines[0]
            if scheduled.get((stream, source_id)) == due:
                return due
            heapq.heappop(deadlines)
        return None

    # -- queries ----------------------------------------------------------------------------------

    def buffered(self) -> dict[str, int]:
        """Events held per source (all streams): reorder buffers plus merge queues; sources holding none are left
        out."""
        held: dict[str, int] = {}
        for pipeline in self._streams.values():
            for source_id, reorderer in pipeline.reorderers.items():
                if reorderer.buffered:
                    held[source_id] = held.get(source_id, 0) + reorderer.buffered
            for source_id, queued in pipeline.merger.queued_by_source().items():
                held[source_id] = held.get(source_id, 0) + queued
        return held

    def has_sources(self, stream: str) -> bool:
        """Whether any source ever joined the stream here (registered, recovered, or sent to it). A stream whose
        sources all said bye still counts: punctuating it at the gateway's clock would send a source that comes
        back with its spool's older events to the late topic."""
        pipeline = self._streams.get(stream)
        return pipeline is not None and bool(pipeline.reorderers or pipeline.merger.sources())

    def watermark_us(self, stream: str) -> int | None:
        pipeline = self._streams.get(stream)
        return None if pipeline is None else pipeline.merger.watermark_us

    # -- internals --------------------------------------------------------------------------------

    def _stream(self, stream: str) -> _StreamPipeline:
        pipeline = self._streams.get(stream)
        if pipeline is None:
            pipeline = _StreamPipeline(stream, self.clock, self.config)
            self._streams[stream] = pipeline
        return pipeline

    def _track(self, pipeline: _StreamPipeline, source_id: str) -> None:
        # Only a deadline that changed goes on the heap: on the in-order fast path nothing does.
        if source_id:
            self._schedule(pipeline.reorderers[source_id].next_deadline_us(), pipeline.stream, source_id)
        self._schedule(pipeline.merger.next_deadline_us(), pipeline.stream, "")

    def _schedule(self, due: int | None, stream: str, source_id: str) -> None:
        key = (stream, source_id)
        if due is None or self._scheduled.get(key) == due:
            return
        self._scheduled[key] = due
        heapq.heappush(self._deadlines, (due, 0 if source_id else 1, stream, source_id))

    def _reorder_outputs(self, pipeline: _StreamPipeline, outputs: list[Released | Late | GapSkipped], now_us: int,
                         out: list[PipelineOutput], pushed: SourceEvent | None = None,
                         mapped: tuple[int, int] | None = None) -> None:
        passed: Late | None = None
        for item in outputs:
            if isinstance(item, Released):
                self._to_merger(pipeline, item, now_us, out, passed if item.late else None,
                                mapped if item.event is pushed else None)
                passed = None
            elif isinstance(item, Late):
                if item.passed:
                    # drop_late=False: the reorderer releases it right after this report; it is published once,
                    # where the merge puts it, and carries this reason there.
                    passed = item
                    continue
                self.counters.late += 1
                out.append(self._late_record(item.event, item.arrival_us, now_us, item.reason, item.lateness_us))
            else:
                self.counters.gaps += 1
                self.counters.gap_events_skipped += item.last_seq - item.first_seq + 1
                if self.gaps_given_up is not None:
                    self.gaps_given_up.append(item)

    def _to_merger(self, pipeline: _StreamPipeline, released: Released, now_us: int, out: list[PipelineOutput],
                   passed: Late | None = None, mapped: tuple[int, int] | None = None) -> None:
        event = released.event
        if mapped is None:
            mapped = self.clock.to_reference(event.source_id, event.source_ts_us)
        ref_us = mapped[0]
        refused = self._refusal(event, mapped)
        if refused is not None:
            out.append(refused)
            return
        if ref_us - now_us > self.config.max_future_us:
            self.counters.quarantined += 1
            out.append(self._late_record(event, released.arrival_us, now_us, "future_dated", ref_us - now_us))
            return
        # The merger gets the mapping just made: mapping again in the same call gives the same (ref, err). So does
        # the record's, if the merge releases the event at once.
        merged = pipeline.merger.push(event, released.arrival_us, now_us, late=released.late, mapped=mapped)
        self._merge_outputs(pipeline, merged, out, passed, event, mapped)

    def _refusal(self, event: SourceEvent, mapped: tuple[int, int]) -> PublishRefused | None:
        """The event's refusal (counted) if a timestamp of its record would fall outside the contract's range (its
        mapped time, its error bound, an atomic interval's mapped start and its bound), else None."""
        if not self._out_of_contract(event, mapped):
            return None
        self.counters.timestamps_refused += 1
        return PublishRefused(event.source_id, event.stream, event.seq, OUT_OF_RANGE,
                              f"source_ts_us={event.source_ts_us} maps to ref_ts_us={mapped[0]} (error bound "
                              f"{mapped[1]} us), outside {MIN_TS_US}..{MAX_TS_US} (or its interval's start is)")

    def _out_of_contract(self, event: SourceEvent, mapped: tuple[int, int]) -> bool:
        ref_us, error_us = mapped
        start_us, start_error_us = ref_us, error_us
        interval = event.interval
        if isinstance(interval, AtomicInterval):
            start_ref_us, start_error_us = self.clock.to_reference(event.source_id, interval.source_start_ts_us)
            # the start the record will carry: the end minus the interval's mapped length (_add_interval)
            start_us = ref_us - (self.clock.to_reference(event.source_id, event.source_ts_us)[0] - start_ref_us)
        floor_us = self.config.ts_floor_us
        return _out_of_range(ref_us, error_us, floor_us) or _out_of_range(start_us, start_error_us, floor_us)

    def _merge_outputs(self, pipeline: _StreamPipeline, outputs: list[Merged | Punctuation | SourceTimedOut | Late],
                       out: list[PipelineOutput], passed: Late | None = None, pushed: SourceEvent | None = None,
                       mapped: tuple[int, int] | None = None) -> None:
        """``pushed``, ``mapped``: the event just pushed into the merger and its mapping, made in this call."""
        self._records(outputs, out, passed, pushed, mapped, None)

    def _records(self, outputs: list[Merged | Punctuation | SourceTimedOut | Late], out: list[PipelineOutput],
                 passed: Late | None, pushed: SourceEvent | None, mapped: tuple[int, int] | None,
                 run_errors: dict[int, int] | None) -> None:
        """The merge's outputs as records; ``run_errors``: the error bounds of the mappings of a run pushed in this
        call (``push_many``), by ``id`` of its events."""
        clock = self.clock
        counters = self.counters
        rtts: dict[str, int | None] = {}
        for item in outputs:
            if isinstance(item, Merged):
                counters.released += 1
                event = item.event
                # The record's uncertainty is the release's mapping (the estimate may have changed while the event
                # waited in the merge); for an event pushed in this call, that is the mapping it was pushed with.
                if mapped is not None and event is pushed:
                    error_us = mapped[1]
                else:
                    run_error = run_errors.get(id(event)) if run_errors is not None else None
                    error_us = (run_error if run_error is not None
                                else clock.to_reference(event.source_id, event.source_ts_us)[1])
                source_id = event.source_id
                if source_id in rtts:
                    rtt_us = rtts[source_id]
                else:
                    rtt_us = rtts[source_id] = clock.rtt_us(source_id)
                # A raised record's time is its mapping moved up by ``raised_us``: its bound covers the move (the
                # true time is within ``error_us`` of the mapping, review B3), or ``uncertainty_us`` would not hold.
                raised_us = item.raised_us
                record = EventRecord(
                    event.stream, source_id, event.seq, event.source_ts_us, item.ref_ts_us, error_us + raised_us,
                    item.arrival_us, item.release_us, False, event.payload, None, rtt_us)
                if event.interval is not None:
                    self._add_interval(record, event)
                    if raised_us and isinstance(event.interval, AtomicInterval):
                        assert record.start_uncertainty_us is not None
                        record.start_uncertainty_us += raised_us  # its start moved with its end
                if raised_us:
                    counters.refs_raised += 1
                    record.extra = {REF_RAISED_US: item.raised_us}
                if passed is not None and passed.event is event:  # drop_late=False: released although late
                    record = replace(record, late=True, late_reason=passed.reason, lateness_us=passed.lateness_us)
                out.append(PublishRecord(record, "events"))
            elif isinstance(item, Punctuation):
                counters.punctuations += 1
                out.append(PublishPunctuation(item.stream, item.watermark_us, item.at_us))
            elif isinstance(item, SourceTimedOut):
                self.counters.source_timeouts += 1
            else:
                self.counters.late += 1
                if item.reason == "stamp_regression":
                    counters.stamp_regressions += 1
                elif item.reason == "after_give_up":
                    counters.after_give_up += 1
                out.append(self._late_record(item.event, item.arrival_us, item.arrival_us, item.reason,
                                             item.lateness_us))

    def late_record(self, source_id: str, event: IncomingEvent, arrival_us: int, now_us: int,
                    reason: str) -> PublishRecord | PublishRefused:
        """A late-topic record for an event the caller diverts before it enters the pipeline (its lateness: how far
        its mapped time lies behind its arrival)."""
        source_event = SourceEvent(source_id, event.stream, event.seq, event.source_ts_us, event.payload,
                                   event.interval)
        return self._late_record(source_event, arrival_us, now_us, reason, None)

    def _late_record(self, event: SourceEvent, arrival_us: int, now_us: int, reason: str,
                     lateness_us: int | None) -> PublishRecord | PublishRefused:
        """The event's late-topic record, or its refusal if its timestamps fall outside the contract's range."""
        mapped = self.clock.to_reference(event.source_id, event.source_ts_us)
        refused = self._refusal(event, mapped)
        if refused is not None:
            return refused
        ref_us, error_us = mapped
        if lateness_us is None:
            lateness_us = arrival_us - ref_us
        record = EventRecord(
            stream=event.stream, source_id=event.source_id, seq=event.seq, source_ts_us=event.source_ts_us,
            ref_ts_us=ref_us, uncertainty_us=error_us, arrival_ts_us=arrival_us, release_ts_us=now_us,
            late=True, payload=event.payload, late_reason=reason, rtt_us=self.clock.rtt_us(event.source_id),
            lateness_us=lateness_us)
        if event.interval is not None:
            self._add_interval(record, event)
        return PublishRecord(record, "late")

    def _add_interval(self, record: EventRecord, event: SourceEvent) -> None:
        """An interval event's fields on its record, whose end (``ref_ts_us``, ``uncertainty_us``) is already set.

        An atomic interval's start is mapped like its end, with the source's current estimate: ``start_ts_us`` is
        the end minus the interval's length as that estimate maps it, which is exactly the start's own mapping when
        the end was mapped with the same estimate (always, but for an event whose estimate changed while it waited
        in the merge: then the start keeps its distance to the end the record is ordered by, never after it).
        ``start_uncertainty_us`` is the start's own error bound. An endpoint event is a point event with its id,
        its start fields its own time. A point event's record keeps them None (its JSON leaves them out)."""
        interval = event.interval
        if isinstance(interval, AtomicInterval):
            start = interval.source_start_ts_us
            clock = self.clock
            start_ref_us, start_error_us = clock.to_reference(event.source_id, start)
            end_ref_us = clock.to_reference(event.source_id, event.source_ts_us)[0]
            record.start_ts_us = record.ref_ts_us - (end_ref_us - start_ref_us)
            record.start_uncertainty_us = start_error_us
            record.source_start_ts_us = start
        elif isinstance(interval, IntervalEndpoint):
            record.start_ts_us = record.ref_ts_us
            record.start_uncertainty_us = record.uncertainty_us
            record.source_start_ts_us = event.source_ts_us
            record.interval_id = interval.interval_id
            record.endpoint = interval.endpoint
