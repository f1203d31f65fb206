"""The gateway's decisions, sans-IO (h11-style): the shell calls in with what happened and the time, and carries
out the actions that come back. Nothing here touches a socket, Kafka, the event loop or a clock: every call that
needs the time takes ``now_us`` (microseconds of the gateway's reference clock), so the rules run on virtual time
in tests exactly as they run live.

Calls in: ``source_registered``, ``events_received``, ``heartbeat_received`` (from connections), ``on_delivered``
and ``kafka_queue_full`` (from Kafka), ``stream_created`` / ``stream_recovered`` / ``clock_changed`` (startup and
time sync), ``poll`` and ``advance`` (timers), plus counting calls for connections and tasks.

Actions out (the shell carries them out; ``Produce`` actions in the order given, the others at once):

    SendFrame(connection, data)        write to that connection (a re-ack to the connection that sent a duplicate)
    SendToSource(source_id, data)      write to ONE live connection of the source (acks: cumulative per stream,
                                       applied pool-wide by the SDK; a resync request, rule 9)
    Produce(topic, key, value, delivery, timestamp_ms, headers)
                                       hand to Kafka, waiting while its queue is full (report kafka_queue_full);
                                       the delivery report goes back to on_delivered(delivery, ...) unless None
                                       (or, for a transaction's records, on_committed once it committed)
    WriteCheckpoint(topic, key, value, headers)
                                       best effort: skipped, not waited for, when Kafka's queue is full (the next
                                       checkpoint, or the recovery scan, covers a lost one)
    PauseReading(source_id)            stop reading every connection of the source (including later ones)
    ResumeReading(source_id)           read them again

Rules:

1. Dedup and re-ack: an event whose (source, stream, seq) was accepted before is a duplicate: counted, never
   published. If Kafka already confirmed everything up to it, the connection that sent it gets the cumulative ack
   at once (the ack it resends for was lost with a connection): one ack per stream for the whole frame, however
   many duplicates it holds. Re-acks come before the batch's produces: they need no Kafka and must not wait behind
   a stall. A duplicate whose payload or ``source_ts_us`` differ from the accepted event's is a *conflict*: counted
   (``conflicts``), logged (rate-limited), answered to its connection with a non-fatal ``seq_conflict`` error
   naming its stream and seq (before the frame's re-acks), never published. The tracker compares with the accepted
   event while it is unacknowledged, then with a digest of the last ``RECENT_ACKED_DIGESTS`` acked seqs per
   (source, stream) (gateway/acks.py); an older duplicate is re-acked as a plain one.
2. Ack coalescing: a delivery report confirms one event; the DeliveryTracker moves the cumulative ack only over
   contiguous confirmed seqs (never past an unconfirmed one). ``poll`` sends one ack per (source, stream) with the
   highest value reached since the previous poll, to one connection of the source.
3. Delivery failure: counted, kept as ``last_kafka_error``, and forgotten by the tracker so that the client's
   resend is accepted again; no ack, no checkpoint progress.
4. Buffer pressure, with hysteresis: every ``pressure_check_interval_us``, when nothing is throttled and the
   pipeline holds more than ``max_buffered_events``, every source holding events is paused (``global_pauses``);
   the sources the merge waits for hold none and keep being read. They are resumed together only once at most
   half the limit is held. A source registering while throttled is paused at once.
5. Kafka-stall grace: a refused produce (queue full) marks Kafka stalled until ``stall_grace_us`` after the last
   refusal (``kafka_stalls`` counts stalls, not refusals). While stalled ``advance`` fires no reorder gap or merge
   timeout and ``next_deadline_us`` is no earlier than the grace end: the sources the merge waits for only look
   silent because the gateway stopped reading them. The shell also reports a connection waiting for the producer
   as a refusal. With ``gateway_pause_us`` set (the shell polls every 2 ms), a gap longer than that between two
   calls in (``poll``, ``advance``, ``events_received``) means the gateway itself did not run (a frozen or starved
   process, a blocked loop): the same grace starts (``gateway_pauses``), or the first source read on waking would
   make the merge give up the others, whose data waited unread. The end of a takeover window that held a stream
   (rule 15) starts the same grace.
6. Checkpoints: a confirmed event on the events topic advances its stream's progress (next seq of its source, next
   offset) and marks the stream dirty; a refused event (rule 8), and an events-topic confirmation, also move the
   next seq past the cumulative ack they reach: the source forgets refused seqs with the ack, so a restarted
   gateway must not wait out a gap for them. A punctuation promises its watermark (dirty too). ``poll`` writes one
   checkpoint per dirty stream every ``checkpoint_interval_us``; ``checkpoint_dirty_streams`` at shutdown. A source
   whose newest event was released more than ``source_retention_us`` ago leaves the checkpoint (``sources_expired``),
   so checkpoints stay bounded by the sources active within the retention. A source enters its streams'
   checkpoints at its hello (next seq 0), written within ``REGISTRATION_CHECKPOINT_DELAY_US`` (and no sooner than
   ``REGISTRATION_CHECKPOINT_SPACING_US`` after the previous checkpoints, so a wave of hellos rewrites them once a
   second, not ten times): a shard's next owner (or a restarted gateway) waits for it like for every source it
   recovers.
7. Records: pipeline outputs become contract.records bytes: EventRecord JSON keyed by the record's key on the
   events or late topic; PunctuationRecord on the events topic under PUNCTUATION_KEY; progress and clock-state
   records on the sources topic. Every record carries the headers of docs/record-contract.md (kind, the source id
   of an event record, the contract version); an event record's Kafka timestamp (CreateTime) is its reference
   time, a punctuation's its watermark, in milliseconds, held within an hour before and a minute after its release
   (``kafka_timestamp_ms``: retention counts from it, and brokers may refuse far-future timestamps).
8. Refused payloads: an event whose payload the record contract cannot carry arrives with a RejectedPayload
   (contract.wire.messages.payload_problem). It is counted (``invalid_payloads``) and answered at once with a
   non-fatal ``invalid_payload`` error frame naming its stream and seq; it still goes through dedup and the ordering
   pipeline, so its seq is not waited for as a gap, and when released it is not produced but confirmed in the
   DeliveryTracker, so the cumulative ack moves over it and the SDK forgets it (a resend would be refused again).
   An event whose record still fails to encode (a gateway bug: parse-time validation should have refused it) is
   handled the same way, counted as ``encode_failures``, logged with its source, and answered with a non-fatal
   ``internal_error`` naming it: one bad record never loses the records released with it, kills the task that
   released it, or stalls its source's acks. A record over ``max_record_bytes`` (Kafka would refuse it for good)
   is refused the same way with ``invalid_payload``, counted as ``records_too_large``.
9. Clock steps, caught at the first event after them, confirmed by a time-sync sample (docs/architecture.md,
   "Clock steps"). Every source with a clock estimate (one ``clock_changed`` seen) is checked on each accepted
   event: with its current mapping ``(ref, err)``, the apparent delay ``arrival - ref`` is the network delay plus a
   mapping error within ``err``. The event is suspect when
     (a) ``arrival - ref < -(err + clock_step_future_tolerance_us)``: it would have arrived before it happened (a
         forward step; no delay can do that), or
     (b) ``arrival - ref > recent + err + clock_step_delay_margin_us`` (``recent``: the largest apparent delay among
         the source's last 64 to 128 events) AND its seq is above the highest seq pushed of its stream while it
         maps before that event by more than ``err`` and the margin: a clock that jumped back. A delay alone does
         neither: a delayed event is in order with its source's others, or fills a gap below the highest seq.
     (c) The delay of (b) without the order of (b) is no step: at most one ``resync`` (reason ``delay``) per
         ``clock_step_hold_us`` is sent (``clock_delay_resyncs``), cheap; the event is pushed as usual.
   A suspect event is held, with every later event of the source, and the source is sent a ``resync`` (reason
   ``clock_step``) naming it. The first estimate resting on a sample taken after the detection (``clock_changed``
   with ``sync_ref_us`` at or after it) resolves the hold: the step is how far that estimate moves the first held
   event against the mapping it was detected with. Beyond both error bounds and the tolerance it is a step
   (counted in ``clock_steps``, recorded in ``clock_steps`` as ``ClockStepDetected`` naming that first event);
   within, none (``clock_step_false_alarms``). The next ``poll`` (or event, or timer) pushes the held events, in
   order, mapped with the new estimate, as if they arrived then (the pipeline's clock never goes backwards; their
   ``arrival_ts_us`` is the release). The time-sync estimator restarts from a sample that disagrees with it beyond
   its bound (timesync.estimator), so that estimate never mixes both sides of a step.
   Meanwhile the merge waits for the source as for a recovered one (``IngestPipeline.expect``). A slow re-sync
   never diverts events: past ``clock_step_max_held`` held events the source is paused (``PauseReading``; resumed
   when the hold ends), and every ``clock_step_hold_us`` without a fresh sample the request is sent again and the
   merge's wait renewed. Only a source that sends no sample at all for ``clock_step_give_up_us`` after the
   detection (it does not re-sync) has its held events sent to the late topic with reason
   ``clock_step_unresolved`` (counted), and its further events too, without holding or checking, until its next
   estimate arrives: it holds the merge back once, not forever. Its reorderer then skips their seqs as a gap.
   The check's mapping is the one the event is pushed with (``IngestPipeline.push(mapped=...)``): the pipeline and
   the merger do not map an event again in the same call, so the check costs one mapping, not one more.
10. Idle punctuation: the Spark jobs advance a stream to the minimum over its events topic's partitions of their
   latest punctuations, so a shard with no source of a stream would hold the whole stream back forever.
   ``punctuate_idle`` (the shell calls it every second for every stream of the deployment) punctuates a stream that
   no source of the shard has joined at ``now - idle_lag_us`` when its watermark trails that. A source that joins
   the shard later with events older than that finds them late (``after_punctuation``), as any source behind a
   promised watermark does. Streams with sources are left to the merge: their quiet periods are its business.
11. Idle sources are freed. A hello costs the source a checkpoint entry and a place among the silent newcomers of
   each stream it names, nothing more: the merge waits for a stream's silent newcomers through one join entry
   (``JOIN_WINDOW_SOURCE``, see "rule 11: newcomers that have not spoken" below), and a newcomer's own merge entry
   and reorderer come with its first event, heartbeat or expectation on that stream. Once a source's last
   connection closed (``source_disconnected``) and ``idle_source_retention_us`` passed, ``poll`` frees its
   per-stream state if it holds nothing (``forget_idle_sources``, counted as ``sources_forgotten``); its dedup floor
   and next seq per stream stay, so it resumes where it left off. A source that never sent an event leaves the
   checkpoint too.
12. Time rules for heartbeats and timestamp ranges (docs/record-contract.md, "Timestamp ranges"). A heartbeat moves
   the merge's frontier only if its clock reading passes what an event's would: mapped at most ``max_future_us``
   ahead of the gateway clock and inside 0..2^63-1 (the pipeline's check), and, for a source with a clock
   estimate, not ahead of its own arrival by more than its error bound plus ``clock_step_future_tolerance_us``
   (rule 9 (a); a heartbeat during a hold or an unresolved step is ignored, as before). A refused heartbeat is
   counted (``heartbeats_refused``), logged (rate-limited) and answered with a non-fatal ``invalid_message``
   error naming the reason (``future_dated``, ``timestamp_out_of_range``, ``clock_step``). An event whose record
   would carry a timestamp outside 0..2^63-1 (its mapped time, an interval's mapped start, an error bound) is
   refused: counted (``timestamps_refused``), settled like a refused payload (rule 8: never produced, the ack
   moves over it) and answered with a non-fatal ``invalid_message`` naming its stream and seq. A checkpointed
   watermark more than ``max_future_us`` ahead of the clock at recovery is not restored (``watermarks_distrusted``,
   logged; the progress record drops it until the next punctuation): validated input never promises that.
13. Given-up gaps and seq jumps (issue 24 items 2 and 3). When a reorderer gives a gap up (``timeout``,
   ``buffer_full``), the tracker settles the seqs of it it never received, so the cumulative ack passes them, and
   the source gets one ``gap`` notice per run of them (``SendToSource``, before the ack that passes them; counted as
   ``gaps_given_up`` and ``seqs_given_up``). A given-up seq that arrives later is accepted once more and published
   once, on the late topic (``late_after_skip``, even when its reorderer no longer remembered it:
   ``DeliveryTracker.take_given_up``); the newest ``max_skipped_tracked`` given-up seqs the ack passed are remembered
   for that (every one above the ack), in at most 1,024 ranges, as the reorderer remembers them; a freed source's
   are forgotten (rule 11). An event whose seq lies more than ``max_seq_jump`` above everything
   accepted, given up or acked of its (source, stream) is refused before it costs anything: counted
   (``seq_jumps``), logged (rate-limited), answered with a non-fatal ``seq_jump`` error naming it, not accepted,
   never acked. Holes, skipped seqs and settled seqs are kept as ranges (reorder/ranges.py): a jump costs one range.
14. A clean ``bye`` (``source_left``, counted as ``byes``) tells the merge the source left: the shell calls it once
   every connection the source has open said ``bye`` (a pool's connections are separate TCP streams: one's bye may be
   read before another's last events, review B7). Every merge it is in gives it up at once (a departure, not a
   timeout) instead of after its learned wait or join grace; events it has queued are still released in order, and
   it is given up once they are. A source that comes back (hello, event,
   heartbeat) is welcomed as after any give-up: its events below the punctuation go late ``after_punctuation``,
   below what was released meanwhile ``after_give_up`` (docs/record-contract.md, "Reference order").
15. Takeover window. A shard's checkpoints name the sources its previous owner had when it last committed one (rule 6
   puts a source in within about a second of its hello): a source that owner welcomed after that is in no checkpoint,
   and its unacknowledged events come back to the new owner from a source nobody waits for. Once the first source back
   ran the merge past them, every one of them was late (``after_punctuation``). So ``taken_over`` (the shell calls it
   when a runtime starts: a takeover, a restart) opens a window of ``takeover_grace_us``: every stream recovered while
   it is open gets one more merge entry, ``TAKEOVER_WINDOW_SOURCE``, that the merge waits for until the window ends
   (``IngestPipeline.hold_until``): no event is released and no punctuation passes the restored one before then, so a
   source that says hello within the window (any source: the checkpoint cannot say which ones are missing) is merged in
   order with the recovered ones. The entry never speaks; at the window's end (``advance``, ``poll``; not during a
   Kafka stall, rule 5) it leaves the merge as after a ``bye`` and is forgotten, and the merge goes on with the sources
   it has, under rule 5's grace: the window withheld every ack, so a source bound to a number of unacknowledged events
   went silent waiting for them and speaks again only once they are committed; without the grace the merge gave such a
   source up at once (silent longer than its whole wait) as soon as another source ran past it, and its next events
   went late. A source that comes after the window is a newcomer behind the watermark: its older events go late with a
   reason (``after_punctuation``), never silently. The window holds a stream without sources too (no idle punctuation,
   rule 10, while it lasts). Counted: ``takeover_windows`` (streams held), ``takeover_newcomers`` (sources no recovered
   checkpoint named that said hello within a window).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal, NewType, Protocol, cast

# Rule 7: the record headers and Kafka timestamps are the record contract's.
from contract.records import (
    CLOCK_HEADERS,
    PROGRESS_HEADERS,
    PUNCTUATION_HEADERS,
    PUNCTUATION_KEY,
    EventRecord,
    Headers,
    ProgressRecord,
    PunctuationRecord,
    event_headers,
    kafka_timestamp_ms,
)
from contract.topics import InvalidStreamName, TopicNames
from contract.wire import messages
from contract.wire.errors import InvalidMessage, InvalidPayload, LocalProtocolError
from contract.wire.frames import encode_frame
from contract.wire.messages import MAX_SOURCE_ID_CHARS
from gateway.acks import ACCEPTED, CONFLICT, DEFAULT_MAX_SEQ_JUMP, DUPLICATE, DeliveryTracker, EventDigestsCore
from gateway.clock_state import clock_state_record
from gateway.logs import limited_log
from reorder.merger import MergeOutput
from reorder.pipeline import (
    IngestPipeline,
    PipelineConfig,
    PipelineOutput,
    PublishPunctuation,
    PublishRecord,
    PublishRefused,
)
from reorder.records import GapSkipped, SourceEvent
from timesync.clocks import ReferenceMapping
from timesync.store import SourceInfo

log = logging.getLogger(__name__)

ConnectionId = NewType("ConnectionId", int)

# The buffer check walks every reorderer and merge queue: every 20 ms bounds its cost with thousands of sources and
# still stops reading within a few batches of the limit.
PRESSURE_CHECK_INTERVAL_US = 20_000
# While Kafka back-pressures the gateway (librdkafka's queue full), and for this long after, no reorder gap or merge
# wait fires: the sources the merge waits for are silent because the gateway stopped reading them, not because they
# are gone. Timing them out would push their in-order events to the late topic once Kafka is back.
STALL_GRACE_US = 2_000_000
# The shell calls poll every 2 ms: no call at all for longer than this means the gateway itself did not run (a
# frozen or starved process, a blocked loop) and read no source meanwhile. Its sources' silence is then its own: the
# same grace as for a Kafka stall (rule 5), or the first source read after it makes the merge give up the others.
GATEWAY_PAUSE_US = 250_000
DEFAULT_CHECKPOINT_INTERVAL_US = 5_000_000
SOURCE_RETENTION_US = 7 * 24 * 3600 * 1_000_000
# A new source is in a checkpoint this soon after its hello (rule 6), so a shard's next owner waits for it.
REGISTRATION_CHECKPOINT_DELAY_US = 100_000
# ... but no sooner than this after the previous checkpoint: a wave of hellos rewrote every stream's checkpoint (each
# listing every source) every 100 ms; now once a second while it lasts.
REGISTRATION_CHECKPOINT_SPACING_US = 1_000_000
# Rule 11: the one merge source that stands for a stream's newcomers that have not spoken on it yet. Longer than any
# wire source id (MAX_SOURCE_ID_CHARS), so no source can be it.
JOIN_WINDOW_SOURCE = "\x00" * (MAX_SOURCE_ID_CHARS + 1)
# Rule 15: the merge entry that holds a stream recovered at a takeover until the window ends; no wire source id
# (nor JOIN_WINDOW_SOURCE) is this long.
TAKEOVER_WINDOW_SOURCE = "\x00" * (MAX_SOURCE_ID_CHARS + 2)
# Rule 15: the sources of a dead owner are back at its successor within about a second of it serving (the first ack
# came 0.3-0.9 s after, 2.4 s at load ~20: docs/cluster.md "Measured"): the owner record goes out in its first commit,
# the other gateways redirect the hellos they held at once, and the SDK retries every retry_after_ms (0.5 s). Twice
# that, the same as a newcomer's join grace.
TAKEOVER_GRACE_US = 2_000_000
# Rule 11: a source with no connection that holds nothing is freed this long after its last connection closed.
IDLE_SOURCE_RETENTION_US = 60_000_000
IDLE_SWEEP_INTERVAL_US = 1_000_000
# Sources freed per poll at most (about 2 ms each with 64 streams): a thousand closing at once must not stall the
# event loop for a second; the next poll goes on with the rest.
IDLE_SWEEP_BATCH = 100
# The broker's default message.max.bytes (1048588) less room for the record batch's own overhead.
MAX_RECORD_BYTES = 1_000_000
# The most recent produce -> delivery-report latencies kept for the metrics' percentiles.
DELIVERY_LATENCY_SAMPLES = 4096
# Rule 9. A held source is asked to re-sync again every this long while no sample taken after the detection came
# (an SDK burst takes a few round trips; a lost request or a loaded host makes it slower), and the merge's wait for
# it is renewed as often; 5 s matches the pipeline's reconnect grace, which bounds each of those waits.
CLOCK_STEP_HOLD_US = 5_000_000
# Held events beyond this many pause the source's reading (backpressure) until the hold ends: never diverted.
CLOCK_STEP_MAX_HELD = 10_000
# A source that sends no time-sync sample at all for this long after the detection does not re-sync (an SDK without
# time sync, a blocked UDP port): its held events go to the late topic, so it holds the merge back once, not forever.
CLOCK_STEP_GIVE_UP_US = 30_000_000
# (a): the gateway stamps arrival after the source stamped the event, so only a broken error bound or a reference
# clock step (an upstream correction) puts an event in the future of its arrival; 20 ms covers those.
CLOCK_STEP_FUTURE_TOLERANCE_US = 20_000
# (b): a delay this much above the source's recent ones is taken for a backward step. Below it, event-loop pauses
# and scheduling hiccups of a loaded gateway are not worth a re-sync; a backward step of less than this (plus the
# recent delay spread) goes unnoticed until the next periodic re-sync, as before.
CLOCK_STEP_DELAY_MARGIN_US = 250_000
# Apparent delays are remembered as the maxima of two windows of this many events: the bound of (b) is the largest
# delay of the last 64 to 128 events, in O(1) per event.
CLOCK_STEP_DELAY_WINDOW = 64
RESYNC_REASON = "clock_step"
DELAY_RESYNC_REASON = "delay"
# Rule 12: refusals are logged the first this many times, then every this many-th (counters keep the totals).
REFUSAL_LOG_FIRST = 10
REFUSAL_LOG_EVERY = 1000
UNRESOLVED_REASON = "clock_step_unresolved"
RECENT_CLOCK_STEPS = 256
# Rule 13: the reasons a reorderer gives a given-up seq it remembers (late_after_skip) or no longer does.
LATE_AFTER_SKIP = "late_after_skip"
GIVEN_UP_LATE_REASONS = frozenset((LATE_AFTER_SKIP, "duplicate", "before_start"))
BuiltRecord = tuple[bytes, bytes | Exception, int | None, tuple[tuple[str, bytes], ...]]
"""What a RecordBuilderCore gives per record: key, value (or the exception the encoder raised), timestamp_ms (None
past 64 bits) and headers."""


class RecordBuilderCore(Protocol):
    """Rule 7's record bytes for a batch of event records (``late[i]``: the record goes to the late topic), exactly
    as ``EventRecord.to_json``, ``EventRecord.key``, ``event_headers`` and ``kafka_timestamp_ms`` give them."""

    def build_events(self, records: list[EventRecord], late: list[bool]) -> list[BuiltRecord]: ...

    def publish_to(self, topics: dict[tuple[str, str], str], max_record_bytes: int) -> None:
        """Where ``produce_records`` and ``build_merged`` publish: the core's topic cache ((stream, kind) -> topic,
        which ``_publish_one`` fills) and its ``max_record_bytes``."""
        ...

    def produce_records(self, outputs: list[PipelineOutput]) -> tuple[list[Produce | PipelineOutput], list[int]]:
        """``IngestCore._publish_one`` for each plain event record of ``outputs``; every other output is handed back
        in its place. Returns the list and the positions of the outputs handed back."""
        ...

    def build_merged(self, merged: list[MergeOutput], run: list[tuple[SourceEvent, int, tuple[int, int]]],
                     clock: ReferenceMapping) -> tuple[list[object], list[int]]:
        """reorder.pipeline's ``MergedRecordsCore``: the Produce actions of the merge's plain releases."""
        ...

    def forget_source(self, source_id: str) -> None:
        """The source was freed (rule 11): its cached headers go, as ``_event_headers``' entries do."""
        ...

    def any_payload_of_class(self, events: Sequence[messages.IncomingEvent], refused: type) -> bool:
        """``any(type(event.payload) is refused for event in events)``, in one call."""
        ...


SeqRun = tuple[int, str, int, int, int]
"""``_seq_runs``' tuple: the run's first position in its group's indices, its topic, first seq, last seq, latest
release time."""
DeliveryGroups = list[tuple[tuple[str, str], list[int], list[SeqRun]]]
"""A transaction's deliveries per (source, stream), in their first delivery's order: the key, the deliveries'
indices, the runs of consecutive seqs among them."""


class DeliveryRunsCore(Protocol):
    """``on_committed``'s per-record loops in one call (gateway.native: the Rust one, ``skewless_native.DeliveryRuns``):
    the delivery latencies, ``_observed_groups``' observations and groups and each group's ``_seq_runs``."""

    def group(self, deliveries: list[DeliveryRef], now_us: int
              ) -> tuple[list[int], list[tuple[str, str, int, int]], DeliveryGroups] | None:
        """``([now_us - d.released_us ...], [(stream, source_id, seq, released_us) of each observe_seq call, in
        order], groups)``; None when it does not take these deliveries (the Python functions then run)."""
        ...


@dataclass(frozen=True)
class IngestConfig:
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    # Events held in reorder buffers and merge queues, all sources together (rule 4).
    max_buffered_events: int = 1_000_000
    checkpoint_interval_us: int = DEFAULT_CHECKPOINT_INTERVAL_US
    stall_grace_us: int = STALL_GRACE_US
    pressure_check_interval_us: int = PRESSURE_CHECK_INTERVAL_US
    # Rule 9.
    clock_step_hold_us: int = CLOCK_STEP_HOLD_US
    clock_step_max_held: int = CLOCK_STEP_MAX_HELD
    clock_step_give_up_us: int = CLOCK_STEP_GIVE_UP_US
    # Rule 5 for the gateway's own pauses (GATEWAY_PAUSE_US): only for a shell that calls poll every few ms, as
    # gateway.shard does; None (tests on virtual time jump between calls at will): off.
    gateway_pause_us: int | None = None
    # A source whose newest event is older than this leaves the progress checkpoint (rule 6); its resends of
    # events older than that are then taken as new. Must exceed how long a source may stay away with unacked
    # events (its spool): a week by default.
    source_retention_us: int = SOURCE_RETENTION_US
    # Kafka refuses a record over the broker's message.max.bytes (1 MB by default) for good: such an event is
    # refused at release, like an invalid payload (rule 8), instead of failing its shard's transaction forever.
    max_record_bytes: int = MAX_RECORD_BYTES
    # Rule 13: a seq this far above its (source, stream)'s highest seq is refused (``seq_jump``).
    max_seq_jump: int = DEFAULT_MAX_SEQ_JUMP
    # Rule 11.
    idle_source_retention_us: int = IDLE_SOURCE_RETENTION_US
    # Rule 15: 0 opens no window.
    takeover_grace_us: int = TAKEOVER_GRACE_US
    clock_step_future_tolerance_us: int = CLOCK_STEP_FUTURE_TOLERANCE_US
    clock_step_delay_margin_us: int = CLOCK_STEP_DELAY_MARGIN_US
    # Rule 7's record bytes: None builds them here (EventRecord.to_json, event_headers, kafka_timestamp_ms, the
    # specification); a factory of a RecordBuilderCore (gateway.native: the Rust one) builds each call's records in
    # one batch, with the same bytes.
    record_builder: Callable[[], RecordBuilderCore] | None = None
    # The delivery tracker's digests: None computes them here (gateway.acks.event_digest, the specification); a
    # factory of an EventDigestsCore (gateway.native: the Rust one) gives the same verdicts, a frame's in-order run
    # admitted in one call.
    event_digests: Callable[[], EventDigestsCore] | None = None
    # The reference mapping the core and its pipeline use: None uses the one given to IngestCore (the
    # specification); a function of it (gateway.native.native_reference_mapping: the Rust one, the same results)
    # gives the one to use instead.
    reference_mapping: Callable[[ReferenceMapping], ReferenceMapping] | None = None
    # on_committed's per-record loops: None runs them here (_observed_groups, _seq_runs: the specification); a
    # factory of a DeliveryRunsCore (gateway.native: the Rust one) does them in one call, with the same results.
    delivery_runs: Callable[[], DeliveryRunsCore] | None = None


# -- actions ----------------------------------------------------------------------------------------------------


# Not frozen: one DeliveryRef and one Produce are built per event, and a frozen dataclass pays object.__setattr__
# per field (contract.records.EventRecord says the same). Nothing changes them after they are built.
@dataclass(slots=True)
class DeliveryRef:
    """What a produced event's delivery report is about; the shell hands it back to ``on_delivered``."""

    source_id: str
    stream: str
    seq: int
    topic: Literal["events", "late"]
    released_us: int  # the record's release stamp, taken just before produce: delivery latency without a clock read


@dataclass(frozen=True, slots=True)
class SendFrame:
    connection: ConnectionId
    data: bytes


@dataclass(frozen=True, slots=True)
class SendToSource:
    """Write to one live connection of the source: acks are cumulative per (source, stream) and the SDK applies them
    pool-wide. Writing each ack to every connection of a pool cost 10 writes per ack with pools of 10."""

    source_id: str
    data: bytes




@dataclass(slots=True)  # built per event: not frozen, see DeliveryRef
class Produce:
    topic: str
    key: bytes
    value: bytes
    delivery: DeliveryRef | None  # None: no report wanted
    # The Kafka record's CreateTime in milliseconds (an event's reference time, a punctuation's watermark; 0: the
    # produce time) and its headers (contract.records HEADER_*), shared between records, never changed.
    timestamp_ms: int = 0
    headers: Headers | None = None


@dataclass(frozen=True, slots=True)
class WriteCheckpoint:
    """A record of the compacted sources topic, best effort (skipped when Kafka's queue is full)."""

    topic: str
    key: bytes
    value: bytes
    headers: Headers | None = None


@dataclass(frozen=True, slots=True)
class PauseReading:
    source_id: str


@dataclass(frozen=True, slots=True)
class ResumeReading:
    source_id: str


IngestAction = SendFrame | SendToSource | Produce | WriteCheckpoint | PauseReading | ResumeReading


# -- state ------------------------------------------------------------------------------------------------------


@dataclass
class GatewayCounters:
    connections_opened: int = 0
    connections_closed: int = 0
    frames_too_large: int = 0
    malformed_frames: int = 0
    protocol_errors: int = 0
    events_received: int = 0
    events_published: int = 0
    duplicates: int = 0
    delivery_failures: int = 0
    heartbeats: int = 0
    timeouts: int = 0
    auth_failures: int = 0
    recovered_sources: int = 0
    global_pauses: int = 0
    kafka_stalls: int = 0
    task_failures: int = 0
    invalid_payloads: int = 0  # events refused because their payload is not JSON-representable (rule 8)
    encode_failures: int = 0  # records that failed to encode after all: a gateway bug, counted apart (rule 8)
    clock_steps: int = 0  # clock steps a time-sync sample confirmed, each caught at its first event (rule 9)
    clock_step_false_alarms: int = 0  # holds the re-sync showed were no step: released as they were
    clock_step_unresolved: int = 0  # events sent to the late topic because their source never re-synced
    clock_delay_resyncs: int = 0  # re-syncs asked because of a delay alone: nothing held (rule 9 (c))
    gateway_pauses: int = 0  # times the gateway itself did not run for over gateway_pause_us (rule 5)
    sources_expired: int = 0  # sources dropped from checkpoints after the source retention (rule 6)
    records_too_large: int = 0  # events refused because their record exceeds max_record_bytes (rule 8)
    idle_punctuations: int = 0  # punctuations of streams the shard holds nothing of (rule 10)
    gaps_given_up: int = 0  # gap notices sent: runs of seqs the reorderers gave up, never received (rule 13)
    seqs_given_up: int = 0  # the seqs in them
    conflicts: int = 0  # duplicates whose payload or source_ts_us differ from the accepted event's (rule 1)
    seq_jumps: int = 0  # events refused because their seq jumped past max_seq_jump (rule 13)
    sources_forgotten: int = 0  # idle sources whose per-stream state was freed (rule 11)
    streams_refused: int = 0  # hellos refused for a stream not allowed or over the stream cap (docs/operations.md)
    slow_readers_closed: int = 0  # connections closed because their peer did not read (gateway.connection)
    heartbeats_refused: int = 0  # future-dated, out-of-range or clock-stepped heartbeats: they moved nothing (rule 12)
    timestamps_refused: int = 0  # events whose mapped times fall outside the contract's range (rule 12)
    watermarks_distrusted: int = 0  # checkpointed watermarks beyond max_future of the clock, not restored (rule 12)
    byes: int = 0  # clean departures: the source's last open connection said bye, the merge gave it up (rule 14)
    takeover_windows: int = 0  # streams a takeover window held (rule 15)
    takeover_newcomers: int = 0  # sources no recovered checkpoint named that said hello within the window (rule 15)
    offset_audit_failures: int = 0  # transactions aborted: Kafka's delivery reports broke the offset count (rule 2)

    def count_error(self, code: str) -> None:
        if code == "frame_too_large":
            self.frames_too_large += 1
        elif code == "malformed_frame":
            self.malformed_frames += 1
        elif code == "timeout":
            self.timeouts += 1
        elif code in ("unauthenticated", "unknown_source"):
            self.auth_failures += 1
        elif code == "stream_refused":
            self.streams_refused += 1
        else:
            self.protocol_errors += 1


@dataclass(frozen=True, slots=True)
class ClockStepDetected:
    """Rule 9: the event that showed a source's clock step. ``apparent_step_us`` is how far its mapped time moved
    against its arrival: positive for a clock that jumped ahead (measured against ``-err``), negative for one that
    jumped back (measured against the recent delays)."""

    source_id: str
    stream: str
    seq: int
    apparent_step_us: int
    at_us: int


@dataclass(frozen=True, slots=True)
class ClockStepHold:
    """Rule 9: how a hold ended: ``resolved`` (pushed with the new estimate) or ``unresolved`` (to the late topic)."""

    source_id: str
    events: int
    held_us: int  # from the detection to the release
    outcome: Literal["resolved", "unresolved"]


@dataclass(slots=True)
class _Trigger:
    event: messages.IncomingEvent
    arrival_us: int
    ref_us: int  # mapped with the estimate it was detected with
    error_us: int


class _ClockWatch:
    """Rule 9 state of one source with a clock estimate."""

    __slots__ = ("delay_resync_us", "delays_seen", "frontier", "held", "hold_until_us", "older_max_us", "paused",
                 "recent_max_us", "resolved", "since_us", "step_us", "trigger", "unresolved")

    def __init__(self) -> None:
        self.recent_max_us: int | None = None  # largest apparent delay of the current window
        self.older_max_us: int | None = None  # of the window before
        self.delays_seen = 0
        # stream -> (seq, ref_us) of the highest seq pushed: a backward step maps a later seq before it (rule 9 (b))
        self.frontier: dict[str, tuple[int, int]] = {}
        self.held: list[tuple[messages.IncomingEvent, int]] = []  # (event, arrival_us)
        self.hold_until_us: int | None = None  # set while holding: when the re-sync is asked again
        self.since_us = 0
        self.trigger: _Trigger | None = None
        self.resolved = False
        self.step_us: int | None = None  # once resolved: the step the fresh estimate shows, None if none
        self.paused = False  # the hold filled: the source is not read until it ends
        self.unresolved = False  # the last hold ran out: events go late until the next estimate
        self.delay_resync_us: int | None = None  # when a re-sync was last asked for a delay alone (rule 9 (c))

    def advance_frontier(self, stream: str, seq: int, ref_us: int) -> None:
        frontier = self.frontier.get(stream)
        if frontier is None or seq > frontier[0]:
            self.frontier[stream] = (seq, ref_us)

    def learn(self, delay_us: int) -> None:
        if self.delays_seen == CLOCK_STEP_DELAY_WINDOW:
            self.older_max_us, self.recent_max_us, self.delays_seen = self.recent_max_us, None, 0
        self.delays_seen += 1
        if self.recent_max_us is None or delay_us > self.recent_max_us:
            self.recent_max_us = delay_us

    def delay_bound_us(self) -> int | None:
        if self.older_max_us is None:
            return self.recent_max_us
        if self.recent_max_us is None:
            return self.older_max_us
        return max(self.recent_max_us, self.older_max_us)


class StreamProgress(ProgressRecord):
    """What is known to be in the events topic of one stream (the checkpoint record plus its bookkeeping)."""

    __slots__ = ()

    def observe(self, source_id: str, seq: int, offset: int, released_us: int) -> None:
        self.observe_seq(source_id, seq, released_us)
        self.observe_offset(offset)

    def observe_seq(self, source_id: str, seq: int, released_us: int) -> None:
        if seq + 1 > self.next_seq.get(source_id, 0):
            self.next_seq[source_id] = seq + 1
        if released_us > self.seen_us.get(source_id, 0):
            self.seen_us[source_id] = released_us

    def observe_offset(self, offset: int) -> None:
        self.next_offset = max(self.next_offset, offset + 1)

    def expire(self, now_us: int, retention_us: int) -> list[str]:
        """Forget sources whose newest event is older than the retention (rule 6): the checkpoint stays bounded.
        A source without a time (an older checkpoint) starts its retention now. Returns the forgotten ones."""
        for source_id in self.next_seq:
            self.seen_us.setdefault(source_id, now_us)
        expired = [s for s, seen_us in self.seen_us.items() if seen_us < now_us - retention_us]
        for source_id in expired:
            self.next_seq.pop(source_id, None)
            del self.seen_us[source_id]
        return expired

    def consumed(self, source_id: str, acked_seq: int) -> bool:
        """The source was acked through ``acked_seq`` (published or refused): its next seq is past it. True if
        that moved the progress."""
        if acked_seq + 1 > self.next_seq.get(source_id, 0):
            self.next_seq[source_id] = acked_seq + 1
            return True
        return False

    def promise(self, watermark_us: int) -> None:
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us


def _latest(*times_us: int | None) -> int | None:
    """The latest of the times given, None if none is."""
    known = [t for t in times_us if t is not None]
    return max(known) if known else None


class IngestCore:
    def __init__(self, topics: TopicNames, mapping: ReferenceMapping, config: IngestConfig | None = None) -> None:
        self.topics = topics
        self.config = config or IngestConfig()
        self.counters = GatewayCounters()
        if self.config.reference_mapping is not None:
            mapping = self.config.reference_mapping(mapping)
        self.pipeline = IngestPipeline(mapping, self.config.pipeline)
        self.tracker = DeliveryTracker(self.config.max_seq_jump, self.config.pipeline.sequence.max_skipped_tracked,
                                       None if self.config.event_digests is None else self.config.event_digests())
        self.pipeline.gaps_given_up = []  # drained by _publish (rule 13)
        self.last_delivery_us: int | None = None
        self.last_kafka_error: str | None = None
        self.delivery_latencies_us: deque[int] = deque(maxlen=DELIVERY_LATENCY_SAMPLES)
        self._progress: dict[str, StreamProgress] = {}
        self._dirty_streams: set[str] = set()
        self._acks_due: dict[tuple[str, str], int] = {}
        self._throttled: frozenset[str] = frozenset()
        self._kafka_refused_us: int | None = None
        self._last_call_us: int | None = None  # rule 5: the last poll, advance or events_received
        self._paused_us: int | None = None  # rule 5: when the gateway was found to have been paused
        self._next_pressure_check_us: int | None = None
        self._next_checkpoint_us: int | None = None
        self._mapping = mapping
        self._streams_of: dict[str, tuple[str, ...]] = {}
        self._watches: dict[str, _ClockWatch] = {}  # rule 9: sources with a clock estimate
        self._holding: set[str] = set()
        self.clock_steps: deque[ClockStepDetected] = deque(maxlen=RECENT_CLOCK_STEPS)
        self.clock_step_holds: deque[ClockStepHold] = deque(maxlen=RECENT_CLOCK_STEPS)
        self._topic_names: dict[tuple[str, str], str] = {}
        self._event_headers: dict[tuple[str, str], Headers] = {}
        self._record_builder = None if self.config.record_builder is None else self.config.record_builder()
        self._delivery_runs = None if self.config.delivery_runs is None else self.config.delivery_runs()
        if self._record_builder is not None:
            # Rule 7's records of the merge's plain releases are built in one call per run (reorder.pipeline).
            self._record_builder.publish_to(self._topic_names, self.config.max_record_bytes)
            self.pipeline.merged_records = self._record_builder
        # Rule 11: sources with no connection left, since when; swept every IDLE_SWEEP_INTERVAL_US by poll.
        self._disconnected_since: dict[str, int] = {}
        self._next_idle_sweep_us = 0
        self._next_expiry_us = 0  # rule 6's retention sweep, at most once per checkpoint interval
        self._last_checkpoint_us: int | None = None  # rule 6: when poll last wrote checkpoints
        # Rule 11: per stream, the newcomers that named it at hello and have not spoken on it since, each with the end
        # of the join wait it was given; the join window's end the stream's JOIN_WINDOW_SOURCE waits for, and how
        # many of those newcomers were given that end and are still silent.
        self._joining: dict[str, dict[str, int]] = {}
        self._join_live: dict[str, set[str]] = {}  # those of them the join entry stands for
        self._join_window: dict[str, tuple[int, int]] = {}
        self._swept_outputs: list[PipelineOutput] = []  # what freeing sources released, published by poll
        # Rule 15: the open takeover window's end, the streams it holds, and the sources the recovered checkpoints
        # named (a hello from any other within the window is a takeover newcomer).
        self.takeover_until_us: int | None = None
        self._takeover_streams: set[str] = set()
        self._takeover_known: set[str] = set()
        self._takeover_newcomers: set[str] = set()
        # Rule 15 with rule 5: when the last takeover window that held a stream ended; the stall grace runs from it.
        self._window_ended_us: int | None = None

    # -- streams and startup ------------------------------------------------------------------------------------

    def knows_stream(self, stream: str) -> bool:
        """Its topics exist and its progress is known (created empty or recovered): sources may publish to it."""
        return stream in self._progress

    def stream_created(self, stream: str) -> None:
        self._progress[stream] = StreamProgress(stream)
        self._cache_topics(stream)

    def _cache_topics(self, stream: str) -> None:
        """The stream's topic names, cached before its first record: the native builder produces the records whose
        topic is cached (a miss goes the Python way). A name TopicNames refuses is refused where a record of the
        stream is published, as it always was."""
        try:
            self._topic(stream, "events")
            self._topic(stream, "late")
        except InvalidStreamName:
            pass

    def stream_recovered(self, progress: StreamProgress, now_us: int) -> list[IngestAction]:
        """After a restart: what Kafka holds of the stream. Everything below each source's next seq is a duplicate
        if resent, the last promised watermark is kept, and the merge waits (bounded) for every source that was
        streaming before."""
        stream = progress.stream
        self._progress[stream] = progress
        self._cache_topics(stream)
        if progress.watermark_us is not None and not self.pipeline.restore_watermark(stream, progress.watermark_us,
                                                                                     now_us):
            # Rule 12: no validated input promises that far ahead; kept, it would divert every on-time event.
            self.counters.watermarks_distrusted += 1
            log.warning("stream %s: the checkpoint's watermark %d is %d us ahead of the gateway clock (max %d): "
                        "not restored", stream, progress.watermark_us, progress.watermark_us - now_us,
                        self.config.pipeline.max_future_us)
            progress.watermark_us = None
        outputs: list[PipelineOutput] = []
        for source_id, next_seq in progress.next_seq.items():
            self.pipeline.resume_from(source_id, stream, next_seq)
            self.tracker.resume(source_id, stream, next_seq)
            outputs += self.pipeline.expect(source_id, stream, now_us)
        self.counters.recovered_sources += len(progress.next_seq)
        if self.takeover_until_us is not None and now_us < self.takeover_until_us:
            # Rule 15: the sources this checkpoint does not name may come back too, until the window ends.
            outputs += self.pipeline.hold_until(TAKEOVER_WINDOW_SOURCE, stream, self.takeover_until_us, now_us)
            self._takeover_streams.add(stream)
            self._takeover_known.update(progress.next_seq)
            self.counters.takeover_windows += 1
        return self._publish(outputs)

    # -- rule 15: the takeover window -------------------------------------------------------------------------------

    def taken_over(self, now_us: int) -> None:
        """The shell starts serving the shard from what Kafka holds (a takeover or a restart), before it recovers
        any stream: the takeover window opens until ``now_us + takeover_grace_us``."""
        if self.config.takeover_grace_us > 0:
            self.takeover_until_us = now_us + self.config.takeover_grace_us

    def takeover_window_holds_until_us(self) -> int | None:
        """When the open takeover window ends, if it holds a stream (for /healthz)."""
        return self.takeover_until_us if self._takeover_streams else None

    def _end_takeover_window(self, now_us: int) -> list[PipelineOutput]:
        """Once the window is over (not during a Kafka stall: rule 5), its entry leaves every merge it held."""
        until_us = self.takeover_until_us
        if until_us is None or now_us < until_us or self.kafka_stalled(now_us):
            return []
        self.takeover_until_us = None
        outputs: list[PipelineOutput] = []
        for stream in sorted(self._takeover_streams):
            outputs += self.pipeline.leave_merge(TAKEOVER_WINDOW_SOURCE, stream, now_us)
            self.pipeline.forget_source(TAKEOVER_WINDOW_SOURCE, (stream,))
        if self._takeover_streams:
            # The window withheld every release, so every ack: a source with a bound on its unacknowledged events
            # went silent waiting for them, and speaks again only once the released events are committed. Its
            # silence was the gateway's, as in a Kafka stall: the same grace (rule 5), or the merge gave such a
            # source up at once (silent longer than its whole wait) as soon as another source ran past it.
            self._window_ended_us = now_us
            log.info("takeover window over after %.2f s: it held %d streams; %d sources no checkpoint named said "
                     "hello in it%s", (now_us - until_us + self.config.takeover_grace_us) / 1e6,
                     len(self._takeover_streams), len(self._takeover_newcomers),
                     f" ({', '.join(sorted(self._takeover_newcomers)[:8])})" if self._takeover_newcomers else "")
        self._takeover_streams.clear()
        self._takeover_known.clear()
        self._takeover_newcomers.clear()
        return outputs

    def punctuate_idle(self, stream: str, now_us: int, idle_lag_us: int) -> list[IngestAction]:
        """Rule 10: a stream no source of this shard ever joined, whose watermark trails ``now_us`` by more than
        ``idle_lag_us``, is punctuated at ``now_us - idle_lag_us`` (the merge's floor moves with it)."""
        if stream not in self._progress or self.pipeline.has_sources(stream):
            return []
        watermark_us = now_us - idle_lag_us
        current_us = self.pipeline.watermark_us(stream)
        promised_us = self._progress[stream].watermark_us
        if max(current_us or watermark_us - 1, promised_us or watermark_us - 1) >= watermark_us:
            return []
        self.pipeline.restore_watermark(stream, watermark_us)
        self._progress[stream].promise(watermark_us)
        self._dirty_streams.add(stream)
        self.counters.idle_punctuations += 1
        value = PunctuationRecord(stream, watermark_us, now_us).to_json()
        return [Produce(self.topics.events(stream), PUNCTUATION_KEY, value, None,
                        kafka_timestamp_ms(watermark_us, now_us), PUNCTUATION_HEADERS)]

    def stream_progress(self, stream: str) -> StreamProgress | None:
        return self._progress.get(stream)

    def clock_changed(self, info: SourceInfo, t_a_us: int, now_us: int) -> list[IngestAction]:
        """A source's clock estimate changed: its state goes to the sources topic, so a restarted gateway maps the
        source's timestamps before it syncs again."""
        record = clock_state_record(info, now_us, t_a_us)
        watch = self._watches.get(info.source_id)
        if watch is None:
            self._watches[info.source_id] = _ClockWatch()
        elif watch.hold_until_us is not None:
            self._check_resolved(info, watch)
        else:
            watch.unresolved = False  # a new estimate: check its events again
        return [WriteCheckpoint(self.topics.sources, record.key, record.to_json(), CLOCK_HEADERS)]

    # -- connections and sources --------------------------------------------------------------------------------

    def connection_opened(self) -> None:
        self.counters.connections_opened += 1

    def connection_closed(self) -> None:
        self.counters.connections_closed += 1

    def session_failed(self, error_code: str) -> None:
        self.counters.count_error(error_code)

    def task_failed(self) -> None:
        self.counters.task_failures += 1

    def offset_audit_failed(self) -> None:
        self.counters.offset_audit_failures += 1

    def source_registered(self, source_id: str, streams: tuple[str, ...], now_us: int) -> list[IngestAction]:
        self._disconnected_since.pop(source_id, None)
        if (self._takeover_streams and source_id not in self._takeover_known
                and source_id not in self._takeover_newcomers and not self._takeover_streams.isdisjoint(streams)):
            self._takeover_newcomers.add(source_id)
            self.counters.takeover_newcomers += 1
        self._streams_of[source_id] = tuple(dict.fromkeys((*self._streams_of.get(source_id, ()), *streams)))
        for stream in streams:
            progress = self._progress.get(stream)
            if progress is not None and source_id not in progress.next_seq:
                # In the checkpoint before its first event is: a shard's next owner then waits for it like for any
                # source it recovers, instead of letting the others' events run the watermark past its resends.
                progress.next_seq[source_id] = 0
                self._dirty_streams.add(stream)
                due_us = now_us + REGISTRATION_CHECKPOINT_DELAY_US
                if self._last_checkpoint_us is not None:
                    due_us = max(due_us, self._last_checkpoint_us + REGISTRATION_CHECKPOINT_SPACING_US)
                if self._next_checkpoint_us is None or due_us < self._next_checkpoint_us:
                    self._next_checkpoint_us = due_us  # soon, not at the next interval: one for a burst of hellos
        known = [s for s in streams if self._in_pipeline(source_id, s)]
        outputs = self.pipeline.register(source_id, tuple(known), now_us) if known else []
        if len(known) < len(streams):
            self._join(source_id, [s for s in streams if s not in known], now_us, outputs)
        actions = self._publish(outputs)
        if source_id in self._throttled:
            actions.append(PauseReading(source_id))
        return actions

    def _in_pipeline(self, source_id: str, stream: str) -> bool:
        """Whether the ordering pipeline holds state for the source on the stream: a reorderer (it sent an event or a
        heartbeat there) or a merge entry. A newcomer that only named the stream at hello has neither (rule 11)."""
        return self.pipeline.holds_state(source_id, stream)

    # -- rule 11: newcomers that have not spoken ----------------------------------------------------------------------
    #
    # The merge waits for a newcomer that named a stream at hello until it speaks there or its join wait ends
    # (reorder.pipeline: join windows). A merge entry per (newcomer, stream) made at hello cost 1.3 KiB per stream named
    # (a 64-stream hello with 2,000 sources registered: 0.7 ms of CPU, up to 4 ms on a loaded machine; two thirds of it
    # the garbage collector walking the entries already made). Instead the stream's silent newcomers are kept here, and
    # the merge holds ONE entry for all of them, JOIN_WINDOW_SOURCE: registered like a newcomer whenever a newcomer
    # would be given a later end than the entry waits for (so it gets the end of the join window a newcomer gets), and
    # heard of at each hello (the merge gives up at once a source silent for longer than its whole wait). A newcomer
    # gets its own merge entry, as its hello would have made it, just before its first event, heartbeat or expectation
    # on the stream goes in; the join entry leaves the merge (a departure: nothing waits) once no newcomer it stands for
    # is silent, and is forgotten once the stream has no silent newcomer at all. It stands for the newcomers that joined
    # since the merge last gave it up: as the merge gives up every silent newcomer when it gives up their wait, and
    # holds the punctuation back for those it has not (they have no frontier).
    #
    # Where it differs from an entry per newcomer, it waits longer, not less (on random runs against an entry per
    # newcomer, tests/unit/gateway/test_hostile_sources.py, no event went late that did not go late there): the
    # merge gives the join entry up at once only if the newest hello of its window is older than the wait itself,
    # where it judged each newcomer by its own hello; and when the newcomer it waits for speaks while others of the
    # window stay silent, it waits for the window's end without judging the others again.

    def _join_state(self, stream: str) -> tuple[dict[str, int], set[str], bool]:
        """The stream's silent newcomers (each with the end of its join wait), those the join entry stands for, and
        whether the merge waits for them (the join entry is live). A join entry the merge gave up stands for none."""
        joining = self._joining.setdefault(stream, {})
        live = self._join_live.setdefault(stream, set())
        merger = self.pipeline.merger_of(stream)
        registered = merger is not None and merger.queued_of(JOIN_WINDOW_SOURCE) is not None
        if registered and merger is not None and merger.is_timed_out(JOIN_WINDOW_SOURCE) and live:
            live.clear()
            until_us, _silent = self._join_window[stream]
            self._join_window[stream] = (until_us, 0)
        return joining, live, bool(live) or (registered and merger is not None
                                            and not merger.is_timed_out(JOIN_WINDOW_SOURCE))

    def _join(self, source_id: str, streams: list[str], now_us: int, outputs: list[PipelineOutput]) -> None:
        for stream in streams:
            joining, live, waiting = self._join_state(stream)
            window = self._join_window.get(stream)
            merger = self.pipeline.merger_of(stream)
            if (window is None or not waiting or now_us >= window[0] or merger is None
                    or (merger.waits_for(JOIN_WINDOW_SOURCE) and merger.next_deadline_us() != window[0])):
                # The end this newcomer would be given is later than the one the join entry waits for (or it waits
                # for none, or the merge gave its wait up already): registered again, it waits for the end a
                # newcomer gets now.
                outputs += self.pipeline.register(JOIN_WINDOW_SOURCE, (stream,), now_us)
                until_us = self.pipeline.expected_until_us(JOIN_WINDOW_SOURCE, stream)
                assert until_us is not None  # register just set it
                window = (until_us, 0)
            else:
                # Registering it again would change only when it was last heard of: that, without the registration's
                # drain of the merge (which cannot release or punctuate while the entry waits).
                merger.note_heard(JOIN_WINDOW_SOURCE, now_us)
            until_us, silent = window
            if source_id not in live or joining[source_id] != until_us:
                silent += 1
            joining[source_id] = until_us
            live.add(source_id)
            self._join_window[stream] = (until_us, silent)

    def _speaking(self, source_id: str, streams: Sequence[str], now_us: int) -> list[PipelineOutput]:
        """Before the pipeline takes an event, heartbeat or expectation of the source on ``streams``: where it is a
        silent newcomer the join entry stands for, it gets the merge entry its hello would have made (waited for until
        the end of the join wait it was given), then the join entry stops standing for it. Its own entry first, so
        that the join entry leaving cannot let the watermark pass what it is about to send."""
        outputs: list[PipelineOutput] = []
        for stream in streams:
            joining = self._joining.get(stream)
            if joining is None or source_id not in joining:
                continue
            if source_id in self._join_state(stream)[1]:
                outputs += self.pipeline.wait_until(source_id, stream, joining[source_id], now_us)
            # Else the merge gave its wait up: it has no entry, as a given-up one counts for nothing, until its first
            # release reaches the merge (which brings a given-up source back).
            self._not_joining(source_id, stream, now_us, outputs)
        return outputs

    def _not_joining(self, source_id: str, stream: str, now_us: int, outputs: list[PipelineOutput]) -> bool:
        """The source is no silent newcomer of the stream any more (it spoke, left or was freed). True if the merge
        was waiting for it (the join entry stood for it)."""
        joining, live, waiting = self._join_state(stream)
        until_us = joining.pop(source_id)
        stood_for = source_id in live
        live.discard(source_id)
        window_until_us, silent = self._join_window[stream]
        if stood_for and until_us == window_until_us:
            silent -= 1
            self._join_window[stream] = (window_until_us, silent)
        if waiting and not live:
            outputs += self.pipeline.leave_merge(JOIN_WINDOW_SOURCE, stream, now_us)
        elif waiting and silent == 0 and stood_for and until_us == window_until_us:
            # Only newcomers of earlier windows stay silent: their waits ended, as the join entry's does now.
            self.pipeline.set_expected_until(JOIN_WINDOW_SOURCE, stream, max(joining[s] for s in live))
        if not joining:
            del self._joining[stream], self._join_live[stream], self._join_window[stream]
            self.pipeline.forget_source(JOIN_WINDOW_SOURCE, (stream,))
        return stood_for and waiting

    def _holds_a_join_wait(self, source_id: str) -> bool:
        """Whether the merge of one of the source's streams holds others' events for it alone: it is the last silent
        newcomer the join entry stands for, and the merge waits for that entry. Freeing it then would lose that wait
        (forget_source refuses a source the merge waits for, review B1): it is freed once the wait gave it up."""
        for stream in self._streams_of.get(source_id, ()):
            live = self._join_live.get(stream)
            if (live is not None and live == {source_id}
                    and (merger := self.pipeline.merger_of(stream)) is not None
                    and merger.waits_for(JOIN_WINDOW_SOURCE)):
                return True
        return False

    def source_left(self, source_id: str, now_us: int) -> list[IngestAction]:
        """Rule 14: every connection the source has open said ``bye`` (the shell waits for the last one)."""
        self.counters.byes += 1
        outputs = self.pipeline.source_left(source_id, now_us)
        for stream in self._streams_of.get(source_id, ()):
            if source_id in self._joining.get(stream, {}) and self._not_joining(source_id, stream, now_us, outputs):
                self.pipeline.counters.departures += 1  # as the merge counts a silent source's bye
        return self._publish(outputs)

    def source_disconnected(self, source_id: str, now_us: int) -> None:
        """The source's last connection closed: rule 11's retention starts."""
        if source_id in self._streams_of:
            self._disconnected_since[source_id] = now_us

    def known_sources(self) -> set[str]:
        """The sources this core holds per-source state for (registered, not yet forgotten)."""
        return set(self._streams_of)

    def forget_idle_sources(self, now_us: int, limit: int | None = None) -> list[str]:
        """Rule 11: free the state of every source disconnected for ``idle_source_retention_us`` that holds
        nothing (no event in a reorder buffer or merge queue, no clock-step hold). Kept: its delivery tracker entry
        (the dedup floor, so a resend of an acked seq stays a duplicate; events still in flight to Kafka are
        acked through it as before) and its next seq per stream (it resumes without a gap wait). A source that never
        sent an event also leaves the progress checkpoint its hello put it in (rule 6). Returns the freed ids; at
        most ``limit`` are looked at."""
        due = [s for s, since_us in self._disconnected_since.items()
               if since_us + self.config.idle_source_retention_us < now_us and s not in self._holding]
        if limit is not None:
            due = due[:limit]
        freed = []
        for source_id in due:
            if self._holds_a_join_wait(source_id) or not self.pipeline.forget_source(
                    source_id, self._streams_of.get(source_id, ())):
                continue  # it still holds events: kept until they leave
            del self._disconnected_since[source_id]
            for stream in self._streams_of.get(source_id, ()):
                if source_id in self._joining.get(stream, {}):
                    self._not_joining(source_id, stream, now_us, self._swept_outputs)
            in_checkpoint: list[str] = []
            gone: list[str] = []
            for stream in self._streams_of.pop(source_id, ()):
                progress = self._progress.get(stream)
                if (progress is not None and progress.next_seq.get(source_id) == 0
                        and self.tracker.acked_through(source_id, stream) is None):
                    del progress.next_seq[source_id]
                    progress.seen_us.pop(source_id, None)
                    self._dirty_streams.add(stream)
                (in_checkpoint if progress is not None and source_id in progress.next_seq else gone).append(stream)
            # Churning source ids must not pile up (review B5): what a stream's checkpoint still holds keeps its
            # dedup floor alone (the acked seq, compacted) until rule 6 expires it; the rest goes now.
            self.tracker.compact(source_id, in_checkpoint)
            self._forget_source_streams(source_id, gone)
            self._event_headers.pop((source_id, "events"), None)
            self._event_headers.pop((source_id, "late"), None)
            if self._record_builder is not None:
                self._record_builder.forget_source(source_id)
            freed.append(source_id)
        self.counters.sources_forgotten += len(freed)
        return freed

    def events_received(self, connection: ConnectionId, source_id: str,
                        events: tuple[messages.IncomingEvent, ...], arrival_us: int) -> list[IngestAction]:
        """Dedup (rule 1), then the ordering pipeline; returns re-acks, then what is ready to publish, in order."""
        self._note_running(arrival_us)
        actions: list[IngestAction] = self._release_resolved(arrival_us) if self._holding else []
        outputs: list[PipelineOutput] = []
        watch = self._watches.get(source_id) if self._watches else None
        accepted: list[messages.IncomingEvent] = []
        mappings: list[tuple[int, int]] = []
        reacks: dict[str, int] | None = None
        self.counters.events_received += len(events)
        if self._joining:
            outputs += self._speaking(source_id, list(dict.fromkeys(event.stream for event in events)), arrival_us)
        admissions = self.tracker.admit_frame(source_id, events)
        if admissions is None and watch is None and not self._any_refused_payload(events):
            # Every event accepted, no payload refused, no clock to check (the usual frame): all go on together, as
            # they came (the native decoder's EventFrame stays one: its events are read natively, none made).
            outputs += self.pipeline.push_many(source_id, events, arrival_us, None)
            return actions + self._publish(outputs)
        for index, event in enumerate(events):
            if type(event.payload) is messages.RejectedPayload:
                actions.append(self._refuse_payload(connection, source_id, event, event.payload, arrival_us))
            admission = ACCEPTED if admissions is None else admissions[index]
            if admission is not ACCEPTED:
                if admission is DUPLICATE:
                    reacks = self._duplicate(source_id, event, reacks)
                else:
                    actions.append(self._refuse_seq(connection, source_id, event, admission is CONFLICT, arrival_us))
                continue
            if watch is None:
                accepted.append(event)
                continue
            if watch.hold_until_us is None and not watch.unresolved:
                # Rule 9's check on a calm source: its mapping goes with the event into the pipeline.
                calm = self._mapping.to_reference(source_id, event.source_ts_us)
                delay_us = arrival_us - calm[0]
                if self._step_us(watch, delay_us, calm[1]) is None:
                    watch.learn(delay_us)
                    watch.advance_frontier(event.stream, event.seq, calm[0])
                    accepted.append(event)
                    mappings.append(calm)
                    continue
            # A hold, an unresolved step, or a step just shown: what came before goes first, then rule 9 in full
            # (which maps the event again, to the same result: nothing changed the estimate in between).
            if accepted:
                outputs += self.pipeline.push_many(source_id, accepted, arrival_us, mappings)
                accepted, mappings = [], []
            mapped = self._held_back(source_id, watch, event, arrival_us, actions, outputs)
            if mapped is not None:
                outputs += self.pipeline.push(source_id, event, arrival_us, mapped=mapped)
        if reacks is not None:
            actions += [SendFrame(connection, encode_frame(messages.build_ack(stream, acked)))
                        for stream, acked in reacks.items()]
        if accepted:
            # The frame's accepted events go through the pipeline together; rule 9's mappings go with them.
            outputs += self.pipeline.push_many(source_id, accepted, arrival_us, mappings if watch is not None else None)
        actions += self._publish(outputs)
        return actions

    def _any_refused_payload(self, events: tuple[messages.IncomingEvent, ...]) -> bool:
        if self._record_builder is not None:  # the native builder: one pass without a Python frame per event
            return self._record_builder.any_payload_of_class(events, messages.RejectedPayload)
        return any(type(event.payload) is messages.RejectedPayload for event in events)

    def _duplicate(self, source_id: str, event: messages.IncomingEvent,
                   reacks: dict[str, int] | None) -> dict[str, int] | None:
        """Rule 1: counted; if the ack passed it, its stream is re-acked once for the frame, after its errors."""
        self.counters.duplicates += 1
        acked = self.tracker.acked_through(source_id, event.stream)
        if acked is not None and acked >= event.seq:
            if reacks is None:
                reacks = {}
            reacks[event.stream] = acked
        return reacks

    def _refuse_payload(self, connection: ConnectionId, source_id: str, event: messages.IncomingEvent,
                        rejected: messages.RejectedPayload, now_us: int) -> SendFrame:
        """Rule 8: the source is told at once; the event is still admitted (its seq is settled at release)."""
        self.counters.invalid_payloads += 1
        # Per event: rate-limited (a flood once wrote 121 MiB of these); the counter keeps the exact total.
        limited_log(log, logging.WARNING, "invalid_payload", "refused %s/%s seq %d: %s", source_id, event.stream,
                    event.seq, rejected.reason, now_us=now_us)
        return SendFrame(connection, encode_frame(messages.build_error(
            InvalidPayload.code, rejected.reason, False, event.stream, event.seq)))

    def _refuse_seq(self, connection: ConnectionId, source_id: str, event: messages.IncomingEvent, conflict: bool,
                    now_us: int) -> SendFrame:
        """Rules 1 and 13: a duplicate seq with another payload or timestamp (a conflict), or a seq jump past
        ``max_seq_jump``: counted, logged (rate-limited), answered to the sender with a non-fatal error naming it;
        nothing is published or acknowledged for it."""
        if conflict:
            self.counters.conflicts += 1
            code = messages.SEQ_CONFLICT
            message = (f"seq {event.seq} of stream {event.stream} was already accepted with another payload or "
                       f"source_ts_us: this event is not published")
        else:
            self.counters.seq_jumps += 1
            code = messages.SEQ_JUMP
            message = (f"seq {event.seq} of stream {event.stream} is more than {self.config.max_seq_jump} above the "
                       f"stream's highest seq: refused")
        limited_log(log, logging.WARNING, code, "%s: %s", source_id, message, now_us=now_us)
        return SendFrame(connection, encode_frame(messages.build_error(code, message, False, event.stream,
                                                                       event.seq)))

    def _gaps_given_up(self, gaps: list[GapSkipped]) -> list[IngestAction]:
        """Rule 13: the reorderers gave these gaps up. The tracker lets the cumulative ack pass their seqs (those it
        never received), and the source is told which, one ``gap`` notice per run, before the ack that passes them
        (the ack goes out at the next poll)."""
        actions: list[IngestAction] = []
        for gap in gaps:
            pieces, acked = self.tracker.give_up(gap.source_id, gap.stream, gap.first_seq, gap.last_seq)
            if acked is not None:
                self._ack_moved(gap.source_id, gap.stream, acked, True)
            for first_seq, last_seq in pieces:
                self.counters.gaps_given_up += 1
                self.counters.seqs_given_up += last_seq - first_seq + 1
                actions.append(SendToSource(gap.source_id, encode_frame(messages.build_gap(
                    gap.stream, first_seq, last_seq, gap.reason))))
        gaps.clear()
        return actions

    def heartbeat_received(self, source_id: str, heartbeat: messages.Heartbeat, now_us: int) -> list[IngestAction]:
        """Rule 12: a heartbeat passes the rules an event does before it moves the merge's frontier."""
        self.counters.heartbeats += 1
        actions = self._release_resolved(now_us) if self._holding else []
        watch = self._watches.get(source_id)
        if watch is not None and (watch.hold_until_us is not None or watch.unresolved):
            # Its clock reading is as wrong as its events' (rule 9): it must not move the merge's frontier.
            return actions
        if watch is not None:
            # Rule 9 (a) for its clock reading: mapped ahead of its own arrival by more than the error bound, it
            # shows a forward step its next event will be held for; until then it must not move the frontier.
            ref_us, error_us = self._mapping.to_reference(source_id, heartbeat.source_ts_us)
            ahead_us = ref_us - now_us
            if ahead_us > error_us + self.config.clock_step_future_tolerance_us:
                return actions + self._publish([PublishRefused(
                    source_id, None, None, RESYNC_REASON,
                    f"heartbeat source_ts_us={heartbeat.source_ts_us} maps {ahead_us} us ahead of its arrival "
                    f"(error bound {error_us} us): a clock step")])
        outputs = self._speaking(source_id, list(heartbeat.next_seq), now_us) if self._joining else []
        outputs += self.pipeline.heartbeat(source_id, heartbeat.next_seq, heartbeat.source_ts_us, now_us)
        return actions + self._publish(outputs)

    # -- Kafka --------------------------------------------------------------------------------------------------

    def kafka_queue_full(self, now_us: int) -> None:
        """Kafka refused a produce; the shell retries it. Starts or extends the stall grace (rule 5)."""
        refused_us = self._kafka_refused_us
        if refused_us is None or now_us - refused_us >= self.config.stall_grace_us:
            self.counters.kafka_stalls += 1
        self._kafka_refused_us = now_us

    def kafka_stalled(self, now_us: int) -> bool:
        """Kafka refused a produce, or the gateway itself did not run, within the last ``stall_grace_us``."""
        return self._in_grace(now_us, self._kafka_refused_us, self._paused_us)

    def _timeouts_held(self, now_us: int) -> bool:
        """Rule 5's grace: a Kafka stall or a gateway pause (``kafka_stalled``), or a takeover window that held a
        stream ended (rule 15), within the last ``stall_grace_us``: no reorder gap or merge wait fires."""
        return self._in_grace(now_us, self._kafka_refused_us, self._paused_us, self._window_ended_us)

    def _in_grace(self, now_us: int, *started_us: int | None) -> bool:
        since_us = _latest(*started_us)
        return since_us is not None and now_us - since_us < self.config.stall_grace_us

    def _note_running(self, now_us: int) -> None:
        """Rule 5 for the gateway's own pauses: a gap between calls in longer than ``gateway_pause_us`` starts the
        stall grace."""
        pause_us = self.config.gateway_pause_us
        if pause_us is None:
            return
        last_us = self._last_call_us
        if last_us is not None and now_us <= last_us:
            return  # a frame read before the last call, handled after it: the gateway was running
        self._last_call_us = now_us
        if last_us is not None and now_us - last_us > pause_us:
            self.counters.gateway_pauses += 1
            self._paused_us = now_us
            # A loaded host does this often: a warning only for a pause of a second or more, and rate-limited (the
            # counter keeps the exact number; a host starved for CPU would otherwise spend it writing these).
            limited_log(log, logging.WARNING if now_us - last_us >= 1_000_000 else logging.INFO, "gateway_pause",
                        "the gateway did not run for %d ms: no reorder gap or merge timeout fires for %d ms",
                        (now_us - last_us) // 1000, self.config.stall_grace_us // 1000, now_us=now_us)

    def on_delivered(self, delivery: DeliveryRef, error: str | None, offset: int | None, now_us: int) -> None:
        """Kafka's delivery report for one produced event (rules 2, 3 and 6)."""
        self.delivery_latencies_us.append(now_us - delivery.released_us)
        source_id, stream, seq = delivery.source_id, delivery.stream, delivery.seq
        if error is not None:
            self.counters.delivery_failures += 1
            self.last_kafka_error = error
            self.tracker.failed(source_id, stream, seq)
            limited_log(log, logging.WARNING, "delivery_failure", "Kafka refused %s/%s seq %d: %s", source_id, stream,
                        seq, error, now_us=now_us)
            return
        if delivery.topic == "events" and offset is not None:
            self._progress[stream].observe(source_id, seq, offset, delivery.released_us)
            self._dirty_streams.add(stream)
        self.counters.events_published += 1
        self.last_delivery_us = now_us
        acked = self.tracker.confirmed(source_id, stream, seq)
        if acked is not None:
            self._ack_moved(source_id, stream, acked, delivery.topic == "events")

    def on_delivered_all(self, deliveries: Sequence[DeliveryRef], offsets: Mapping[str, int], now_us: int) -> None:
        """Without transactions: Kafka reported every record of ``deliveries`` delivered, in this order, and
        ``offsets`` gives per stream the highest offset of their events-topic records. What ``on_delivered`` does
        for each of them in turn (each with its own offset), in one call: ``on_committed``'s confirmation, which a
        committed transaction's records get."""
        self.on_committed(deliveries, offsets, now_us)

    def on_committed(self, deliveries: Sequence[DeliveryRef], offsets: Mapping[str, int], now_us: int) -> None:
        """A Kafka transaction committed: every record of ``deliveries`` is in Kafka (a commit succeeds only once
        each record of its transaction was delivered), and ``offsets`` gives, per stream, the highest offset the
        transaction's records got in that stream's events topic partition (at least the highest of ``deliveries``'
        events-topic records: recovery scans from the checkpoint's next offset on). Rules 2 and 6 as
        ``on_delivered`` applies them to each record, in one call instead of one per record."""
        if not deliveries and not offsets:
            return
        progress = self._progress
        confirmed_run = self.tracker.confirmed_run
        first_moved: dict[tuple[str, str], int] = {}  # the delivery whose confirmation first moved the key's ack
        moved: dict[tuple[str, str], int] = {}
        consumed: dict[tuple[str, str], int] = {}
        for key, indices, runs in self._delivery_groups(deliveries, now_us):
            source_id, stream = key
            # A run: consecutive seqs on one topic, confirmed in one tracker call as per record in order;
            # observe_seq keeps maxima, so the run's last seq and latest release suffice (again for the first).
            for start, topic, first_seq, last_seq, seen_us in runs:
                on_events = topic == "events"
                if on_events:
                    progress[stream].observe_seq(source_id, last_seq, seen_us)
                    self._dirty_streams.add(stream)
                confirmation = confirmed_run(source_id, stream, first_seq, last_seq)
                if confirmation is not None:
                    moved_at_seq, acked = confirmation
                    if key not in first_moved:
                        first_moved[key] = indices[start + moved_at_seq - first_seq]
                    # Cumulative acks only grow: the last one per (source, stream) is what rule 2 sends and rule 6
                    # keeps.
                    moved[key] = acked
                    if on_events:
                        consumed[key] = acked
        for stream, offset in offsets.items():
            progress[stream].observe_offset(offset)
            self._dirty_streams.add(stream)
        self.counters.events_published += len(deliveries)
        if deliveries:
            self.last_delivery_us = now_us
        # In the order the acks first moved, as per record.
        for source_id, stream in sorted(moved, key=first_moved.__getitem__):
            self._ack_moved(source_id, stream, moved[(source_id, stream)], False)
        for (source_id, stream), acked in consumed.items():
            if progress[stream].consumed(source_id, acked):
                self._dirty_streams.add(stream)

    def _delivery_groups(self, deliveries: Sequence[DeliveryRef], now_us: int
                         ) -> DeliveryGroups | Iterator[tuple[tuple[str, str], list[int], Iterator[SeqRun]]]:
        """``on_committed``'s per-record part: the delivery latencies kept, each (source, stream)'s first events
        record observed (``_observed_groups``), and the groups with their runs (``_seq_runs``, lazily): in one native
        call when the core has ``delivery_runs`` and it takes these deliveries."""
        if self._delivery_runs is not None and type(deliveries) is list:
            grouped = self._delivery_runs.group(deliveries, now_us)
            if grouped is not None:
                latencies, observed, groups = grouped
                self.delivery_latencies_us.extend(latencies)
                progress = self._progress
                for stream, source_id, seq, released_us in observed:
                    progress[stream].observe_seq(source_id, seq, released_us)
                return groups
        self.delivery_latencies_us.extend([now_us - delivery.released_us for delivery in deliveries])
        observed_groups = self._observed_groups(deliveries)
        return ((key, indices, _seq_runs(deliveries, indices)) for key, indices in observed_groups.items())

    def _observed_groups(self, deliveries: Sequence[DeliveryRef]) -> dict[tuple[str, str], list[int]]:
        """The deliveries' indices per (source, stream), in their order: the merge interleaves sources, so a
        source's records are rarely next to each other in a transaction, but its seqs are in runs there. A source's
        first events record is observed here, in the deliveries' order: the progress record lists its sources in the
        order they were first observed, as per record."""
        progress = self._progress
        groups: dict[tuple[str, str], list[int]] = {}
        unobserved: set[tuple[str, str]] = set()
        for index, delivery in enumerate(deliveries):
            key = (delivery.source_id, delivery.stream)
            group = groups.get(key)
            if group is None:
                groups[key] = [index]
                if delivery.topic == "events":
                    progress[delivery.stream].observe_seq(delivery.source_id, delivery.seq, delivery.released_us)
                else:
                    unobserved.add(key)
            else:
                group.append(index)
                if unobserved and key in unobserved and delivery.topic == "events":
                    unobserved.discard(key)
                    progress[delivery.stream].observe_seq(delivery.source_id, delivery.seq, delivery.released_us)
        return groups

    # -- timers -------------------------------------------------------------------------------------------------

    def next_deadline_us(self) -> int | None:
        """When ``advance`` has something to fire: the pipeline's next deadline, held back to the end of a Kafka
        stall's grace (rule 5)."""
        due = self.pipeline.next_deadline_us()
        if self.takeover_until_us is not None and (due is None or self.takeover_until_us < due):
            due = self.takeover_until_us
        for source_id in self._holding:
            hold_until_us = self._watches[source_id].hold_until_us
            if hold_until_us is not None and (due is None or hold_until_us < due):
                due = hold_until_us
        since_us = _latest(self._kafka_refused_us, self._paused_us, self._window_ended_us)
        if due is None or since_us is None:
            return due
        return max(due, since_us + self.config.stall_grace_us)

    def advance(self, now_us: int) -> list[IngestAction]:
        """Fire the reorder gap timeouts and merge waits that are due, unless rule 5's grace holds them."""
        self._note_running(now_us)
        if self._timeouts_held(now_us):
            return []
        actions = self._release_resolved(now_us) if self._holding else []
        for source_id in sorted(self._holding):
            watch = self._watches[source_id]
            if watch.hold_until_us is not None and watch.hold_until_us <= now_us:
                actions += self._renew_hold(source_id, watch, now_us)
        # The window's entry leaves before the merge's own wait for it would time it out at the same instant.
        outputs = self._end_takeover_window(now_us) if self.takeover_until_us is not None else []
        if self._timeouts_held(now_us):  # the window just ended: its grace starts now
            return actions + self._publish(outputs)
        return actions + self._publish(outputs + self.pipeline.advance(now_us))

    def poll(self, now_us: int) -> list[IngestAction]:
        """Called after the shell served Kafka's delivery reports: the acks they earned (rule 2), and the buffer
        check (rule 4) and checkpoints (rule 6) when their intervals are up."""
        self._note_running(now_us)
        actions: list[IngestAction] = list(self.due_acks())
        if self._holding:
            actions += self._release_resolved(now_us)
        if self.takeover_until_us is not None:
            actions += self._publish(self._end_takeover_window(now_us))
        if self._disconnected_since and now_us >= self._next_idle_sweep_us:
            swept = self.forget_idle_sources(now_us, IDLE_SWEEP_BATCH)
            if self._swept_outputs:
                outputs, self._swept_outputs = self._swept_outputs, []
                actions += self._publish(outputs)
            # A full batch: more may be due, go on at the next poll.
            self._next_idle_sweep_us = now_us if len(swept) == IDLE_SWEEP_BATCH else now_us + IDLE_SWEEP_INTERVAL_US
        if self._next_pressure_check_us is None or now_us >= self._next_pressure_check_us:
            self._next_pressure_check_us = now_us + self.config.pressure_check_interval_us
            actions += self._check_buffer_pressure()
        if self._next_checkpoint_us is None:
            self._next_checkpoint_us = now_us + self.config.checkpoint_interval_us
        elif now_us >= self._next_checkpoint_us:
            self._next_checkpoint_us = now_us + self.config.checkpoint_interval_us
            # The retention sweep walks every source of every dirty stream: once per checkpoint interval, not at
            # each of the checkpoints a wave of hellos asks for every 100 ms (it was most of their cost).
            expire = now_us >= self._next_expiry_us
            if expire:
                self._next_expiry_us = now_us + self.config.checkpoint_interval_us
            actions += self.checkpoint_dirty_streams(now_us if expire else None)
            self._last_checkpoint_us = now_us
        return actions

    def current_acks(self, source_id: str) -> list[SendToSource]:
        """The source's cumulative acks as they stand, one per stream: sent again when one of its connections closes
        (the last ack may have gone to that connection, and a source that sends nothing more would wait for it
        forever; a repeated cumulative ack changes nothing at the SDK)."""
        acks = []
        for stream in self._streams_of.get(source_id, ()):
            acked = self.tracker.acked_through(source_id, stream)
            if acked is not None and acked >= 0:
                acks.append(SendToSource(source_id, encode_frame(messages.build_ack(stream, acked))))
        return acks

    def due_acks(self) -> list[SendToSource]:
        """One cumulative ack per (source, stream), however many deliveries it covers."""
        if not self._acks_due:
            return []
        due, self._acks_due = self._acks_due, {}
        return [SendToSource(source_id, encode_frame(messages.build_ack(stream, acked)))
                for (source_id, stream), acked in due.items()]

    def checkpoint_dirty_streams(self, now_us: int | None = None) -> list[WriteCheckpoint]:
        """One checkpoint per dirty stream; with ``now_us``, sources past the retention are dropped first."""
        dirty, self._dirty_streams = self._dirty_streams, set()
        if now_us is not None:
            for stream in dirty:
                expired = self._progress[stream].expire(now_us, self.config.source_retention_us)
                if expired:
                    for source_id in expired:
                        if source_id not in self._streams_of:  # freed (rule 11); a registered one goes when freed
                            self._forget_source_streams(source_id, (stream,))
                    self.counters.sources_expired += len(expired)
                    log.info("stream %s: %d sources silent past the retention left the checkpoint", stream,
                             len(expired))
        return [WriteCheckpoint(self.topics.sources, progress.key, progress.to_json(), PROGRESS_HEADERS)
                for progress in (self._progress[stream] for stream in sorted(dirty))]

    # -- queries ------------------------------------------------------------------------------------------------

    @property
    def throttled_sources(self) -> frozenset[str]:
        return self._throttled

    def delivery_latency_percentiles_us(self) -> dict[str, float]:
        latencies = sorted(self.delivery_latencies_us)
        if not latencies:
            return {}
        return {"kafka_delivery_p50_us": float(latencies[len(latencies) // 2]),
                "kafka_delivery_p99_us": float(latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)])}

    # -- internals ----------------------------------------------------------------------------------------------

    def _forget_source_streams(self, source_id: str, streams: tuple[str, ...] | list[str]) -> None:
        """A freed source is in none of these streams' checkpoints (rule 6 expired it, or it never sent): its
        tracker entries and seq hints there go, as a restarted gateway would not know them either; its clock
        watch goes once no checkpoint holds it."""
        if streams:
            self.tracker.forget(source_id, streams)
            self.pipeline.forget_seq_hints(source_id, streams)
        watch = self._watches.get(source_id)
        if (watch is not None and not watch.held and source_id not in self._holding
                and not any(source_id in progress.next_seq for progress in self._progress.values())):
            del self._watches[source_id]

    def _held_back(self, source_id: str, watch: _ClockWatch, event: messages.IncomingEvent, arrival_us: int,
                   actions: list[IngestAction], outputs: list[PipelineOutput]) -> tuple[int, int] | None:
        """Rule 9 for one accepted event of a source with a clock estimate: None when it is not pushed now (held,
        or late because its source never re-synced), else its mapping ``(ref, err)``, to push it with."""
        if watch.hold_until_us is not None:
            watch.held.append((event, arrival_us))
            if len(watch.held) > self.config.clock_step_max_held and not watch.paused:
                # Backpressure, not diversion: the source is not read until its re-sync ends the hold (what is
                # already on its way is still held).
                watch.paused = True
                actions.append(PauseReading(source_id))
            return None
        if watch.unresolved:
            self.counters.clock_step_unresolved += 1
            outputs.append(self._unresolved_record(source_id, event, arrival_us, arrival_us))
            return None
        mapped = self._mapping.to_reference(source_id, event.source_ts_us)
        ref_us, error_us = mapped
        delay_us = arrival_us - ref_us
        step_us = self._step_us(watch, delay_us, error_us)
        if step_us is None:
            watch.learn(delay_us)
            watch.advance_frontier(event.stream, event.seq, ref_us)
            return mapped
        if step_us < 0 and not self._maps_behind_its_predecessors(watch, event, ref_us, error_us):
            # (c) A delay, not a step: the event is in order with its source's others. A cheap re-sync may find
            # a step the order could not show; nothing waits for it.
            self._ask_resync_for_delay(source_id, watch, event, arrival_us, actions)
            watch.learn(delay_us)
            watch.advance_frontier(event.stream, event.seq, ref_us)
            return mapped
        log.info("%s: %s seq %d maps %+d us off its arrival (error bound %d us): holding its events for a re-sync",
                 source_id, event.stream, event.seq, step_us, error_us)
        watch.trigger = _Trigger(event, arrival_us, ref_us, error_us)
        watch.held = [(event, arrival_us)]
        watch.since_us = arrival_us
        watch.hold_until_us = arrival_us + self.config.clock_step_hold_us
        watch.resolved = False
        self._holding.add(source_id)
        actions.append(SendToSource(source_id, encode_frame(messages.build_resync(RESYNC_REASON, event.stream,
                                                                                  event.seq))))
        # The merge waits for the held source (bounded): released behind the watermark, its events would be late.
        streams = self._streams_of.get(source_id, (event.stream,))
        if self._joining:
            outputs += self._speaking(source_id, streams, arrival_us)
        for stream in streams:
            outputs += self.pipeline.expect(source_id, stream, arrival_us)
        return None

    def _step_us(self, watch: _ClockWatch, delay_us: int, error_us: int) -> int | None:
        """The apparent step an event's apparent delay shows (rule 9 (a) and (b)), or None."""
        if delay_us < -(error_us + self.config.clock_step_future_tolerance_us):
            return -delay_us
        recent_us = watch.delay_bound_us()
        if recent_us is not None and delay_us > recent_us + error_us + self.config.clock_step_delay_margin_us:
            return recent_us - delay_us
        return None

    def _maps_behind_its_predecessors(self, watch: _ClockWatch, event: messages.IncomingEvent, ref_us: int,
                                      error_us: int) -> bool:
        """Rule 9 (b): the event comes after the highest seq pushed of its stream, yet maps before it by more than
        the error bound and the margin. A delayed event is in order with its neighbours (or fills a gap below
        the highest seq); a clock that jumped back maps its next event back by the jump."""
        frontier = watch.frontier.get(event.stream)
        return (frontier is not None and event.seq > frontier[0]
                and frontier[1] - ref_us > error_us + self.config.clock_step_delay_margin_us)

    def _ask_resync_for_delay(self, source_id: str, watch: _ClockWatch, event: messages.IncomingEvent, now_us: int,
                              actions: list[IngestAction]) -> None:
        """Rule 9 (c): at most one re-sync per ``clock_step_hold_us`` per source; the SDK spaces bursts too."""
        last_us = watch.delay_resync_us
        if last_us is not None and now_us - last_us < self.config.clock_step_hold_us:
            return
        watch.delay_resync_us = now_us
        self.counters.clock_delay_resyncs += 1
        log.info("%s: %s seq %d arrived far later than its recent events: a re-sync is asked, nothing held",
                 source_id, event.stream, event.seq)
        actions.append(SendToSource(source_id, encode_frame(messages.build_resync(DELAY_RESYNC_REASON, event.stream,
                                                                                  event.seq))))

    def _check_resolved(self, info: SourceInfo, watch: _ClockWatch) -> None:
        """A new estimate for a held source: one resting on a sample taken after the detection resolves the hold.
        The step is the one that estimate shows: the first held event mapped with it against with the estimate it
        was detected with; within both error bounds (and the tolerance) there was none."""
        trigger = watch.trigger
        if trigger is None or info.estimate.sync_ref_us < watch.since_us:
            return  # an exchange from before the request: it may have been measured before the step
        ref_us = info.to_reference_us(trigger.event.source_ts_us)
        error_us = info.error_bound_us(ref_us)
        moved_us = trigger.ref_us - ref_us
        within_us = error_us + trigger.error_us + self.config.clock_step_future_tolerance_us
        watch.step_us = moved_us if abs(moved_us) > within_us else None
        watch.resolved = True

    def _release_resolved(self, now_us: int) -> list[IngestAction]:
        """Push the held events of the sources whose hold is resolved, in order, mapped with the new estimate.

        They enter the pipeline now, as if they arrived now (their records' ``arrival_ts_us`` is the release): the
        pipeline's clock must not go backwards, or the merge's waits would be due before they started."""
        actions: list[IngestAction] = []
        outputs: list[PipelineOutput] = []
        for source_id in sorted(self._holding):
            watch = self._watches[source_id]
            if not watch.resolved:
                continue
            since_us, step_us, trigger = watch.since_us, watch.step_us, watch.trigger
            assert trigger is not None
            if step_us is None:
                self.counters.clock_step_false_alarms += 1
                log.info("%s: the re-sync shows no clock step: %d held events released as they were", source_id,
                         len(watch.held))
            else:
                self.counters.clock_steps += 1
                self.clock_steps.append(ClockStepDetected(source_id, trigger.event.stream, trigger.event.seq, step_us,
                                                          since_us))
                log.warning("%s: clock step of about %+d us at %s seq %d, confirmed by its re-sync: %d held events "
                            "mapped with the new estimate", source_id, step_us, trigger.event.stream,
                            trigger.event.seq, len(watch.held))
            actions += self._resume_after_hold(source_id, watch)
            held = self._end_hold(source_id, watch)
            self.clock_step_holds.append(ClockStepHold(source_id, len(held), now_us - since_us, "resolved"))
            for event, arrival_us in held:
                mapped = self._mapping.to_reference(source_id, event.source_ts_us)
                watch.learn(arrival_us - mapped[0])  # the network's delay, not the hold's
                watch.advance_frontier(event.stream, event.seq, mapped[0])
                outputs += self.pipeline.push(source_id, event, now_us, mapped=mapped)
        return actions + self._publish(outputs)

    def _resume_after_hold(self, source_id: str, watch: _ClockWatch) -> list[IngestAction]:
        if not watch.paused:
            return []
        watch.paused = False
        return [] if source_id in self._throttled else [ResumeReading(source_id)]  # else rule 4 resumes it

    def _renew_hold(self, source_id: str, watch: _ClockWatch, now_us: int) -> list[IngestAction]:
        """No sample since the detection yet: ask again (a lost request, a slow host) and renew the merge's wait;
        past ``clock_step_give_up_us`` the source is taken not to re-sync at all."""
        outputs: list[PipelineOutput] = []
        if now_us - watch.since_us >= self.config.clock_step_give_up_us:
            actions = self._resume_after_hold(source_id, watch)
            self._end_unresolved(source_id, watch, now_us, outputs)
            return actions + self._publish(outputs)
        trigger = watch.trigger
        assert trigger is not None
        watch.hold_until_us = min(now_us + self.config.clock_step_hold_us,
                                  watch.since_us + self.config.clock_step_give_up_us)
        log.info("%s: no re-sync %d ms after the request: asked again", source_id, (now_us - watch.since_us) // 1000)
        streams = self._streams_of.get(source_id, (trigger.event.stream,))
        if self._joining:
            outputs += self._speaking(source_id, streams, now_us)
        for stream in streams:
            outputs += self.pipeline.expect(source_id, stream, now_us)
        return [SendToSource(source_id, encode_frame(messages.build_resync(
            RESYNC_REASON, trigger.event.stream, trigger.event.seq))), *self._publish(outputs)]

    def _end_hold(self, source_id: str, watch: _ClockWatch) -> list[tuple[messages.IncomingEvent, int]]:
        held, watch.held = watch.held, []
        watch.hold_until_us = None
        watch.trigger = None
        watch.resolved = False
        watch.step_us = None
        self._holding.discard(source_id)
        return held

    def _end_unresolved(self, source_id: str, watch: _ClockWatch, now_us: int, outputs: list[PipelineOutput]) -> None:
        since_us = watch.since_us
        held = self._end_hold(source_id, watch)
        self.clock_step_holds.append(ClockStepHold(source_id, len(held), now_us - since_us, "unresolved"))
        watch.unresolved = True
        self.counters.clock_step_unresolved += len(held)
        log.warning("%s: no time-sync sample %d s after its re-sync request: %d held events to the late topic",
                    source_id, (now_us - since_us) // 1_000_000, len(held))
        outputs += [self._unresolved_record(source_id, event, arrival_us, now_us) for event, arrival_us in held]

    def _unresolved_record(self, source_id: str, event: messages.IncomingEvent, arrival_us: int,
                           now_us: int) -> PipelineOutput:
        # Mapped with the estimate the step made stale: the reference time is known to be off by about the step,
        # which is why the record is on the late topic, with its uncertainty as the estimate states it.
        return self.pipeline.late_record(source_id, event, arrival_us, now_us, UNRESOLVED_REASON)

    def _check_buffer_pressure(self) -> list[IngestAction]:
        held = self.pipeline.buffered()
        total = sum(held.values())
        limit = self.config.max_buffered_events
        if not self._throttled and total > limit:
            self.counters.global_pauses += 1
            self._throttled = frozenset(held)
            log.warning("%d events buffered (limit %d): not reading %d sources that hold events", total, limit,
                        len(self._throttled))
            return [PauseReading(source_id) for source_id in sorted(self._throttled)]
        if self._throttled and total <= limit // 2:
            resumed, self._throttled = self._throttled, frozenset()
            # A source its clock-step hold paused stays paused until the hold ends (rule 9).
            return [ResumeReading(source_id) for source_id in sorted(resumed)
                    if source_id not in self._watches or not self._watches[source_id].paused]
        return []

    def _given_up_reason(self, record: EventRecord, kind: Literal["events", "late"]) -> EventRecord:
        if (kind == "late" and record.late_reason in GIVEN_UP_LATE_REASONS
                and self.tracker.take_given_up(record.source_id, record.stream, record.seq)
                and record.late_reason != LATE_AFTER_SKIP):
            # A given-up seq the reorderer no longer remembered (rule 13): late after its skip all the same.
            return replace(record, late_reason=LATE_AFTER_SKIP)
        return record

    def _publish(self, outputs: list[PipelineOutput]) -> list[IngestAction]:
        gaps = self.pipeline.gaps_given_up
        actions: list[IngestAction] = self._gaps_given_up(gaps) if gaps else []
        builder = self._record_builder
        if builder is None or not outputs:
            for output in outputs:
                self._publish_one(output, actions)
            return actions
        # The builder turns the plain event records into their Produce actions in one call (rule 7's bytes and
        # headers, the same as _publish_one gives them) and hands back, in place, every output it leaves to
        # _publish_one: punctuations, refusals, refused payloads, late records rule 13 relabels, the rare rest.
        produced, handed_back = builder.produce_records(outputs)
        start = 0
        for position in handed_back:
            actions += cast(list[Produce], produced[start:position])
            self._publish_one(cast(PipelineOutput, produced[position]), actions)
            start = position + 1
        actions += cast(list[Produce], produced[start:])
        return actions

    def _publish_one(self, output: PipelineOutput, actions: list[IngestAction]) -> None:
        if type(output) is PublishRecord:
            record = output.record
            kind = output.topic
            topic = self._topic_names.get((record.stream, kind))
            if topic is None:
                topic = self._topic(record.stream, kind)
            if type(record.payload) is messages.RejectedPayload:
                self._settle_unpublished(record.source_id, record.stream, record.seq)
                return
            record = self._given_up_reason(record, kind)
            key, value, timestamp_ms, headers = self._record_bytes(record, kind)
            if isinstance(value, Exception):
                actions.append(self._encode_failed(record.source_id, record.stream, record.seq, value))
            elif len(value) > self.config.max_record_bytes:
                actions.append(self._too_large(record.source_id, record.stream, record.seq, len(value)))
            else:
                if timestamp_ms is None:
                    timestamp_ms = kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us)
                delivery = DeliveryRef(record.source_id, record.stream, record.seq, kind, record.release_ts_us)
                actions.append(Produce(topic, key, value, delivery, timestamp_ms, headers))
        elif type(output) is PublishRefused:
            actions.append(self._refused(output))
        else:
            assert isinstance(output, PublishPunctuation)
            self._progress[output.stream].promise(output.watermark_us)
            self._dirty_streams.add(output.stream)
            value = PunctuationRecord(output.stream, output.watermark_us, output.at_us).to_json()
            actions.append(Produce(self.topics.events(output.stream), PUNCTUATION_KEY, value, None,
                                   kafka_timestamp_ms(output.watermark_us, output.at_us), PUNCTUATION_HEADERS))

    def _record_bytes(self, record: EventRecord, kind: Literal["events", "late"]) -> BuiltRecord:
        """Rule 7's (key, value or the encoder's exception, timestamp_ms, headers) of one event record: the
        specification's (EventRecord.to_json, event_headers, kafka_timestamp_ms), or the builder's."""
        if self._record_builder is not None:
            return self._record_builder.build_events([record], [kind == "late"])[0]
        try:
            value: bytes | Exception = record.to_json()
        except (TypeError, ValueError) as exc:  # orjson.JSONEncodeError is a TypeError
            value = exc
        headers = self._event_headers.get((record.source_id, kind))
        if headers is None:
            headers = self._event_headers[(record.source_id, kind)] = event_headers(record.source_id, kind)
        return record.key, value, kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us), headers

    def _topic(self, stream: str, kind: Literal["events", "late"]) -> str:
        """The topic name (validated once per stream: ``TopicNames`` checks the stream name on every call)."""
        topic = self.topics.events(stream) if kind == "events" else self.topics.late(stream)
        self._topic_names[(stream, kind)] = topic
        return topic

    def _settle_unpublished(self, source_id: str, stream: str, seq: int) -> None:
        """An accepted event that will never be produced (rule 8): settled as if Kafka had confirmed it, or the
        cumulative ack would stop below it forever and the source's resends would all be duplicates."""
        acked = self.tracker.confirmed(source_id, stream, seq)
        if acked is not None:
            self._ack_moved(source_id, stream, acked, True)

    def _ack_moved(self, source_id: str, stream: str, acked: int, moves_progress: bool) -> None:
        self._acks_due[(source_id, stream)] = acked
        # The source forgets everything up to the ack, refused seqs included: the checkpoint must not ask for them
        # (rule 6). A late-topic delivery alone leaves the events topic's progress as it was.
        if moves_progress and self._progress[stream].consumed(source_id, acked):
            self._dirty_streams.add(stream)

    def _refused(self, refused: PublishRefused) -> SendToSource:
        """Rule 12: an event or heartbeat the pipeline refused. Counted; a refused event is settled like a refused
        payload (rule 8: the ack moves over it, it is never produced); the source is told with a non-fatal
        ``invalid_message`` error naming the reason (and the event's stream and seq: the SDK fails its delivery).
        Logged at most ``REFUSAL_LOG_FIRST`` times, then every ``REFUSAL_LOG_EVERY``-th: a source stamping
        garbage at full rate must not flood the log (the counters keep the exact totals)."""
        counters = self.counters
        if refused.stream is None or refused.seq is None:
            counters.heartbeats_refused += 1
            total = counters.heartbeats_refused
            what = "heartbeat"
        else:
            counters.timestamps_refused += 1
            total = counters.timestamps_refused
            what = f"{refused.stream} seq {refused.seq}"
            self._settle_unpublished(refused.source_id, refused.stream, refused.seq)
        if total <= REFUSAL_LOG_FIRST or total % REFUSAL_LOG_EVERY == 0:
            log.warning("refused %s's %s (%s, %d refused so far): %s", refused.source_id, what, refused.reason, total,
                        refused.detail)
        message = f"{refused.reason}: {refused.detail}"
        return SendToSource(refused.source_id, encode_frame(messages.build_error(
            InvalidMessage.code, message[:200], False, refused.stream, refused.seq)))

    def _too_large(self, source_id: str, stream: str, seq: int, size: int) -> SendToSource:
        """Kafka would refuse the record for good (the broker's message.max.bytes): refused here instead, with a
        reason, so that it neither fails a transaction nor comes back with every resend (rule 8)."""
        self.counters.records_too_large += 1
        limited_log(log, logging.WARNING, "record_too_large", "refused %s/%s seq %d: its record is %d bytes, over %d",
                    source_id, stream, seq, size, self.config.max_record_bytes)
        self._settle_unpublished(source_id, stream, seq)
        return SendToSource(source_id, encode_frame(messages.build_error(
            InvalidPayload.code, f"the event's record is {size} bytes, over the Kafka record limit of "
            f"{self.config.max_record_bytes}", False, stream, seq)))

    def _encode_failed(self, source_id: str, stream: str, seq: int, error: Exception) -> SendToSource:
        self.counters.encode_failures += 1
        limited_log(log, logging.ERROR, "encode_failure", "could not encode %s/%s seq %d, refusing it: %r", source_id,
                    stream, seq, error)
        self._settle_unpublished(source_id, stream, seq)
        message = f"the gateway could not encode this event's record: {type(error).__name__}: {error}"
        return SendToSource(source_id, encode_frame(messages.build_error(
            LocalProtocolError.code, message[:200], False, stream, seq)))


def _seq_runs(deliveries: Sequence[DeliveryRef],
              indices: list[int]) -> Iterator[tuple[int, str, int, int, int]]:
    """The runs of consecutive seqs on one topic among ``deliveries[i] for i in indices``: (the run's first position
    in ``indices``, its topic, first seq, last seq, latest release time)."""
    at, count = 0, len(indices)
    while at < count:
        start = at
        delivery = deliveries[indices[at]]
        topic = delivery.topic
        first_seq = last_seq = delivery.seq
        seen_us = delivery.released_us
        at += 1
        while at < count:
            delivery = deliveries[indices[at]]
            if delivery.seq != last_seq + 1 or delivery.topic != topic:
                break
            last_seq += 1
            released_us = delivery.released_us
            seen_us = released_us if released_us > seen_us else seen_us  # max() without its call
            at += 1
        yield start, topic, first_seq, last_seq, seen_us
