"""The gateway's decisions (gateway.ingest.IngestCore) on virtual time: calls in, exact actions out."""

from __future__ import annotations

import logging
from collections import deque

import orjson
import pytest

from contract.records import PUNCTUATION_KEY, EventRecord, ProgressRecord, PunctuationRecord
from contract.topics import TopicNames
from contract.wire.frames import encode_frame
from contract.wire.messages import Heartbeat, IncomingEvent, RejectedPayload, build_ack, build_error, build_resync
from gateway.clock_state import clock_state_record
from gateway.ingest import (
    PROGRESS_HEADERS,
    PUNCTUATION_HEADERS,
    ConnectionId,
    DeliveryRef,
    IngestAction,
    IngestConfig,
    IngestCore,
    PauseReading,
    Produce,
    ResumeReading,
    SendFrame,
    SendToSource,
    StreamProgress,
    WriteCheckpoint,
)
from reorder.pipeline import DEFAULT_JOIN_GRACE_US
from tests.mapping_reference import map_at_every_stage
from timesync.clocks import IdentityMapping
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo

T0 = 1_700_000_000_000_000
TOPICS = TopicNames("t")
EVENTS = TOPICS.events("s")
CONN = ConnectionId(7)


def make_core(**config: int) -> IngestCore:
    core = IngestCore(TOPICS, IdentityMapping(), IngestConfig(**config))
    core.stream_created("s")
    return core


def events(seqs: range, stream: str = "s") -> tuple[IncomingEvent, ...]:
    return tuple(IncomingEvent(stream, q, T0 + 10 * (q + 1), q) for q in seqs)


def ack(stream: str, seq: int) -> bytes:
    return encode_frame(build_ack(stream, seq))


def produced(actions: list[IngestAction]) -> list[DeliveryRef]:
    """The deliveries of the events a list of actions publishes (punctuations left out)."""
    return [a.delivery for a in actions if isinstance(a, Produce) and a.delivery is not None]


def seqs(actions: list[IngestAction]) -> list[int]:
    return [d.seq for d in produced(actions)]


def deliver(core: IngestCore, actions: list[IngestAction], now_us: int, first_offset: int = 0) -> None:
    for offset, delivery in enumerate(produced(actions), start=first_offset):
        core.on_delivered(delivery, None, offset, now_us)


# -- records ------------------------------------------------------------------------------------------------------


def test_a_released_event_is_produced_as_its_event_record_with_a_delivery_ref():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    (first, *_rest) = core.events_received(CONN, "a", (IncomingEvent("s", 0, T0 + 10, {"i": 0}),), T0 + 100)
    record = EventRecord(stream="s", source_id="a", seq=0, source_ts_us=T0 + 10, ref_ts_us=T0 + 10,
                         uncertainty_us=0, arrival_ts_us=T0 + 100, release_ts_us=T0 + 100, payload={"i": 0})
    # Issue 15 item 2: the Kafka timestamp is the reference time in ms; the headers name kind, source, contract.
    assert first == Produce(EVENTS, b"a", record.to_json(), DeliveryRef("a", "s", 0, "events", T0 + 100),
                            (T0 + 10) // 1000, (("kind", b"event"), ("source_id", b"a"), ("contract_version", b"2")))


def test_punctuation_record_bytes_and_watermark_promise():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    actions = core.events_received(CONN, "a", events(range(1)), T0 + 100)
    punctuation = PunctuationRecord("s", T0 + 10, T0 + 100)
    # A punctuation's Kafka timestamp is its watermark (ms).
    assert actions[1] == Produce(EVENTS, PUNCTUATION_KEY, punctuation.to_json(), None, (T0 + 10) // 1000,
                                 (("kind", b"punctuation"), ("contract_version", b"2")))
    assert core.stream_progress("s") == StreamProgress("s", 0, {"a": 0}, T0 + 10)
    # The promise alone makes the stream dirty: a restart must keep it even if no event was confirmed since.
    assert core.checkpoint_dirty_streams() == [
        WriteCheckpoint(TOPICS.sources, b"progress|s", ProgressRecord("s", 0, {"a": 0}, T0 + 10).to_json(),
                        (("kind", b"progress"), ("contract_version", b"2")))]


# -- rule 1: dedup and re-ack -------------------------------------------------------------------------------------


def test_a_resent_seq_already_acked_is_a_duplicate_and_is_re_acked_on_its_connection_at_once():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    deliver(core, core.events_received(CONN, "a", events(range(3)), T0 + 100), T0 + 200)
    assert core.poll(T0 + 200) == [SendToSource("a", ack("s", 2))]

    other = ConnectionId(8)
    actions = core.events_received(other, "a", events(range(1, 4)), T0 + 300)
    # Issue 24 item 4: one cumulative re-ack for the frame's duplicates, not one per duplicate.
    assert [a for a in actions if isinstance(a, SendFrame)] == [SendFrame(other, ack("s", 2))]
    assert actions[0] == SendFrame(other, ack("s", 2))
    assert seqs(actions) == [3]  # only the new seq is published
    assert core.counters.duplicates == 2
    assert core.counters.events_received == 6


def test_a_resent_seq_still_in_flight_is_a_duplicate_without_re_ack():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    core.events_received(CONN, "a", events(range(2)), T0 + 100)
    assert core.events_received(CONN, "a", events(range(1, 2)), T0 + 200) == []
    assert core.counters.duplicates == 1


def test_re_acks_come_before_the_produces_of_the_same_batch():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    deliver(core, core.events_received(CONN, "a", events(range(1)), T0 + 100), T0 + 200)
    actions = core.events_received(CONN, "a", (*events(range(1, 2)), *events(range(1))), T0 + 300)
    assert isinstance(actions[0], SendFrame)
    assert all(isinstance(a, Produce) for a in actions[1:])


# -- rule 2: ack coalescing ---------------------------------------------------------------------------------------


def test_acks_cover_only_contiguous_confirmed_seqs_and_are_coalesced_per_poll():
    core = make_core()
    core.source_registered("a", ("s", "u"), T0)
    core.stream_created("u")
    actions = core.events_received(CONN, "a", events(range(4)), T0 + 100)
    refs = {d.seq: d for d in produced(actions)}
    core.on_delivered(refs[1], None, 1, T0 + 200)
    core.on_delivered(refs[3], None, 3, T0 + 200)
    assert core.poll(T0 + 200) == []  # seq 0 unconfirmed: nothing may be acked
    core.on_delivered(refs[0], None, 0, T0 + 300)
    core.on_delivered(refs[2], None, 2, T0 + 300)
    other_stream = core.events_received(ConnectionId(8), "a", events(range(1), "u"), T0 + 300)
    deliver(core, other_stream, T0 + 300, first_offset=0)
    # Three deliveries since the last poll -> one ack per (source, stream), to the source's pool, not per connection.
    assert core.poll(T0 + 400) == [SendToSource("a", ack("s", 3)), SendToSource("a", ack("u", 0))]
    assert core.poll(T0 + 500) == []


def test_the_current_acks_of_a_source_are_its_cumulative_acks_per_stream_as_they_stand():
    core = make_core()
    assert core.current_acks("a") == []
    core.source_registered("a", ("s", "u"), T0)
    core.stream_created("u")
    assert core.current_acks("a") == []  # nothing confirmed yet: no ack to repeat
    deliver(core, core.events_received(CONN, "a", events(range(3)), T0 + 100), T0 + 200)
    assert core.current_acks("a") == [SendToSource("a", ack("s", 2))]
    core.poll(T0 + 300)
    # the poll sent it once; it stays what a lost connection's replacement is sent again
    assert core.current_acks("a") == [SendToSource("a", ack("s", 2))]


def test_an_ack_never_covers_an_unconfirmed_seq_between_confirmed_ones():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    refs = produced(core.events_received(CONN, "a", events(range(3)), T0 + 100))
    core.on_delivered(refs[0], None, 0, T0 + 200)
    core.on_delivered(refs[2], None, 2, T0 + 200)
    assert core.poll(T0 + 200) == [SendToSource("a", ack("s", 0))]


# -- rule 3: delivery failures ------------------------------------------------------------------------------------


def test_a_refused_delivery_is_counted_not_acked_and_its_resend_is_published_again():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    (ref,) = produced(core.events_received(CONN, "a", events(range(1)), T0 + 100))
    core.on_delivered(ref, "KafkaError{code=MSG_SIZE_TOO_LARGE}", None, T0 + 300)
    assert core.counters.delivery_failures == 1
    assert core.counters.events_published == 0
    assert core.last_kafka_error == "KafkaError{code=MSG_SIZE_TOO_LARGE}"
    assert core.last_delivery_us is None
    assert list(core.delivery_latencies_us) == [200]
    assert core.poll(T0 + 300) == []
    assert core.checkpoint_dirty_streams() == [  # the promise and the registered source: no offset
        WriteCheckpoint(TOPICS.sources, b"progress|s", ProgressRecord("s", 0, {"a": 0}, T0 + 10).to_json(),
                        PROGRESS_HEADERS)]
    # The client resends it (no ack came): accepted, not a duplicate.
    resent = core.events_received(CONN, "a", events(range(1)), T0 + 400)
    assert seqs(resent) == [0]
    assert core.counters.duplicates == 0


def test_a_confirmed_delivery_counts_and_stamps_the_last_delivery():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    deliver(core, core.events_received(CONN, "a", events(range(2)), T0 + 100), T0 + 1_100)
    assert core.counters.events_published == 2
    assert core.last_delivery_us == T0 + 1_100
    assert core.delivery_latency_percentiles_us() == {"kafka_delivery_p50_us": 1_000.0,
                                                      "kafka_delivery_p99_us": 1_000.0}


# -- rule 4: buffer pressure --------------------------------------------------------------------------------------


def throttling_core() -> IngestCore:
    """Limit 4; b is silent, so the merge holds a's events."""
    core = make_core(max_buffered_events=4)
    core.source_registered("a", ("s",), T0)
    core.source_registered("b", ("s",), T0)
    return core


def test_at_the_limit_nothing_is_paused_above_it_the_sources_holding_events_are():
    core = throttling_core()
    core.events_received(CONN, "a", events(range(4)), T0 + 100)
    assert core.poll(T0 + 100) == []
    core.events_received(CONN, "a", events(range(4, 5)), T0 + 200)
    assert core.poll(T0 + 20_100) == [PauseReading("a")]  # b holds nothing: it is still read
    assert core.throttled_sources == frozenset({"a"})
    assert core.counters.global_pauses == 1
    core.events_received(CONN, "a", events(range(5, 7)), T0 + 300)
    assert core.poll(T0 + 40_100) == []  # already paused: no repeated action, no second count
    assert core.counters.global_pauses == 1


def test_the_buffer_is_checked_once_per_interval():
    core = throttling_core()
    assert core.poll(T0) == []
    core.events_received(CONN, "a", events(range(5)), T0 + 100)
    assert core.poll(T0 + 19_999) == []
    assert core.poll(T0 + 20_000) == [PauseReading("a")]


def test_resumed_only_once_at_most_half_the_limit_is_held():
    core = throttling_core()
    core.events_received(CONN, "a", events(range(6)), T0 + 100)
    assert core.poll(T0 + 100) == [PauseReading("a")]
    # b's heartbeat lets the merge release a's events up to its time: 6 held -> 3 (above half of 4).
    core.heartbeat_received("b", Heartbeat(T0 + 35, {"s": 0}), T0 + 200)
    assert core.pipeline.buffered() == {"a": 3}
    assert core.poll(T0 + 20_100) == []
    assert core.throttled_sources == frozenset({"a"})
    core.heartbeat_received("b", Heartbeat(T0 + 45, {"s": 0}), T0 + 300)
    assert core.pipeline.buffered() == {"a": 2}
    assert core.poll(T0 + 40_100) == [ResumeReading("a")]
    assert core.throttled_sources == frozenset()


def test_a_source_registering_while_throttled_is_paused_at_once():
    core = throttling_core()
    core.events_received(CONN, "a", events(range(5)), T0 + 100)
    core.poll(T0 + 100)
    assert core.source_registered("a", ("s",), T0 + 200) == [PauseReading("a")]  # a second connection of a
    assert core.source_registered("c", ("s",), T0 + 200) == []


# -- rule 5: Kafka-stall grace ------------------------------------------------------------------------------------


def stalled_merge() -> IngestCore:
    """a's three events wait in the merge for b, silent since its hello: due at the join grace."""
    core = make_core()
    core.source_registered("a", ("s",), T0)
    core.source_registered("b", ("s",), T0)
    assert core.events_received(CONN, "a", events(range(3)), T0 + 100) == []
    assert core.next_deadline_us() == T0 + DEFAULT_JOIN_GRACE_US
    return core


def test_no_merge_timeout_fires_while_kafka_is_stalled_and_they_resume_after_the_grace():
    core = stalled_merge()
    core.kafka_queue_full(T0 + 1_500_000)
    assert core.next_deadline_us() == T0 + 3_500_000  # held back to the end of the grace
    assert core.advance(T0 + 2_000_000) == []
    assert core.advance(T0 + 3_499_999) == []
    assert core.pipeline.counters.source_timeouts == 0
    actions = core.advance(T0 + 3_500_000)
    assert seqs(actions) == [0, 1, 2]
    assert core.pipeline.counters.source_timeouts == 1


def test_each_refusal_extends_the_grace_and_a_stall_is_counted_once():
    core = stalled_merge()
    core.kafka_queue_full(T0 + 1_500_000)
    core.kafka_queue_full(T0 + 3_000_000)
    assert core.counters.kafka_stalls == 1
    assert core.kafka_stalled(T0 + 4_999_999)
    assert not core.kafka_stalled(T0 + 5_000_000)
    assert core.advance(T0 + 4_000_000) == []
    assert seqs(core.advance(T0 + 5_000_000)) == [0, 1, 2]
    core.kafka_queue_full(T0 + 9_000_000)
    assert core.counters.kafka_stalls == 2


def test_without_a_stall_the_merge_timeout_fires_at_its_deadline():
    core = stalled_merge()
    assert core.advance(T0 + DEFAULT_JOIN_GRACE_US - 1) == []
    assert seqs(core.advance(T0 + DEFAULT_JOIN_GRACE_US)) == [0, 1, 2]
    assert not core.kafka_stalled(T0 + DEFAULT_JOIN_GRACE_US)


# -- rule 6: checkpoints ------------------------------------------------------------------------------------------


def test_checkpoints_carry_observed_offsets_and_promises_and_are_written_at_the_interval():
    core = make_core(checkpoint_interval_us=1_000_000)
    core.stream_created("quiet")
    core.source_registered("a", ("s",), T0)
    # A new source is checkpointed soon after its hello (next seq 0), then the interval starts.
    registered = ProgressRecord("s", next_offset=0, next_seq={"a": 0}, seen_us={"a": T0 + 100_000})
    assert core.poll(T0 + 99_999) == []
    assert core.poll(T0 + 100_000) == [WriteCheckpoint(TOPICS.sources, b"progress|s", registered.to_json(),
                                                       PROGRESS_HEADERS)]
    deliver(core, core.events_received(CONN, "a", events(range(3)), T0 + 100), T0 + 200, first_offset=40)
    core.poll(T0 + 999_999)  # acks only
    assert core.poll(T0 + 1_099_999) == []
    # seen_us: its retention started at the registration checkpoint, later than its first events' release. The
    # frame's three events leave the merge in one run: its punctuation follows them, at the last one's time.
    checkpoint = ProgressRecord("s", next_offset=43, next_seq={"a": 3}, watermark_us=T0 + 30,
                                seen_us={"a": T0 + 100_000})
    assert core.poll(T0 + 1_100_000) == [WriteCheckpoint(TOPICS.sources, b"progress|s", checkpoint.to_json(),
                                                         PROGRESS_HEADERS)]
    assert core.poll(T0 + 2_100_000) == []  # nothing changed: no stream is dirty
    assert core.checkpoint_dirty_streams() == []


def test_late_topic_deliveries_do_not_move_the_events_topic_progress():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    core.checkpoint_dirty_streams()
    core.tracker.accept("a", "s", 0)  # as events_received does before the pipeline routes it to the late topic
    core.on_delivered(DeliveryRef("a", "s", 0, "late", T0), None, 5, T0 + 100)
    assert core.poll(T0 + 100) == [SendToSource("a", ack("s", 0))]
    assert core.stream_progress("s") == StreamProgress("s", 0, {"a": 0})  # registered, nothing on the events topic
    assert core.checkpoint_dirty_streams() == []


def test_a_recovered_stream_treats_resends_below_its_progress_as_duplicates():
    core = IngestCore(TOPICS, IdentityMapping())
    assert not core.knows_stream("s")
    core.stream_recovered(StreamProgress("s", 120, {"a": 5}, T0 + 40), T0)
    assert core.knows_stream("s")
    assert core.counters.recovered_sources == 1
    assert core.pipeline.watermark_us("s") == T0 + 40
    actions = core.events_received(CONN, "a", events(range(3, 6)), T0 + 100)
    assert actions[:2] == [SendFrame(CONN, ack("s", 4)), *actions[1:2]]  # one re-ack for the frame (issue 24 item 4)
    assert isinstance(actions[1], Produce)
    assert seqs(actions) == [5]


def test_a_clock_change_is_written_to_the_sources_topic_best_effort():
    core = make_core()
    info = SourceInfo("a", ClockEstimate(offset_us=-250, skew_ppm=1.5, rtt_us=80, sync_ref_us=T0, sample_count=8), T0)
    record = clock_state_record(info, T0 + 1_000, 90)
    assert core.clock_changed(info, 90, T0 + 1_000) == [
        WriteCheckpoint(TOPICS.sources, b"a", record.to_json(), (("kind", b"clock"), ("contract_version", b"2")))]
    assert record.offset_us == -250


# -- counters -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("code", "counter"), [
    ("frame_too_large", "frames_too_large"), ("malformed_frame", "malformed_frames"), ("timeout", "timeouts"),
    ("unauthenticated", "auth_failures"), ("bad_version", "protocol_errors")])
def test_session_failures_are_counted_by_code(code: str, counter: str):
    core = make_core()
    core.session_failed(code)
    assert getattr(core.counters, counter) == 1


def test_heartbeats_and_connections_are_counted():
    core = make_core()
    core.connection_opened()
    core.connection_opened()
    core.connection_closed()
    core.source_registered("a", ("s",), T0)
    core.heartbeat_received("a", Heartbeat(T0, {"s": 0}), T0)
    assert (core.counters.connections_opened, core.counters.connections_closed, core.counters.heartbeats) == (2, 1, 1)


# -- rule 8: refused payloads -------------------------------------------------------------------------------------


def _error(code: str, message: str, seq: int) -> bytes:
    return encode_frame(build_error(code, message, False, "s", seq))


def test_a_refused_payload_is_answered_counted_not_produced_and_the_ack_moves_over_it():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    bad = IncomingEvent("s", 1, T0 + 20, RejectedPayload("payload: NaN is not JSON"))
    actions = core.events_received(CONN, "a", (*events(range(1)), bad, *events(range(2, 3))), T0 + 100)
    assert actions[0] == SendFrame(CONN, _error("invalid_payload", "payload: NaN is not JSON", 1))
    assert seqs(actions) == [0, 2]  # seq 1 held its place in the order (no gap wait) but is not produced
    assert all(b"NaN" not in a.value for a in actions if isinstance(a, Produce))
    assert core.counters.invalid_payloads == 1
    assert core.counters.events_received == 3
    assert core.poll(T0 + 150) == []  # nothing confirmed by Kafka yet: no ack, not even for the refused seq
    deliver(core, actions, T0 + 200)
    assert core.poll(T0 + 200) == [SendToSource("a", ack("s", 2))]
    assert core.counters.events_published == 2
    # A resend of the refused seq is a duplicate: refused again, re-acked, never produced.
    again = core.events_received(CONN, "a", (bad,), T0 + 300)
    assert again == [SendFrame(CONN, _error("invalid_payload", "payload: NaN is not JSON", 1)),
                     SendFrame(CONN, ack("s", 2))]
    assert core.counters.invalid_payloads == 2 and core.counters.duplicates == 1


def test_a_record_that_fails_to_encode_is_refused_without_losing_the_records_released_with_it():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    # Bypasses parse-time validation, as a gateway bug would: orjson refuses bytes.
    unencodable = IncomingEvent("s", 1, T0 + 20, b"raw")
    actions = core.events_received(CONN, "a", (*events(range(1)), unencodable, *events(range(2, 3))), T0 + 100)
    assert seqs(actions) == [0, 2]
    assert SendToSource("a", _error("internal_error", "the gateway could not encode this event's record: "
                                    "TypeError: Type is not JSON serializable: bytes", 1)) in actions
    assert core.counters.encode_failures == 1 and core.counters.invalid_payloads == 0
    deliver(core, actions, T0 + 200)
    assert core.poll(T0 + 200) == [SendToSource("a", ack("s", 2))]


# -- rule 9: clock steps between re-syncs -------------------------------------------------------------------------

# Three synced sources, one event each every 10 ms of true time, 1 ms of network delay; the reference clock is the
# true clock. "a" may step; "b" and "c" never do, and their records must come out the same with or without a's step.
TICK_US = 10_000
NET_US = 1_000
RESYNC_TAKES_US = 30_000  # request -> the new estimate in the store (an SDK burst on loopback takes a few ms)


def _estimate(offset_us: int, sync_ref_us: int) -> ClockEstimate:
    return ClockEstimate(offset_us=offset_us, skew_ppm=0.0, rtt_us=200, sync_ref_us=sync_ref_us, sample_count=10,
                         root_error_us=100.0, skew_error_ppm=0.0)


class StepRun:
    """Virtual time around an IngestCore with an EstimateMapping, as the gateway wires it: the time-sync server
    updates the mapping, then calls clock_changed; the SDK obeys a resync RESYNC_TAKES_US later."""

    def __init__(self, obey_resync: bool = True, **config: int) -> None:
        from timesync.clocks import EstimateMapping

        self.mapping = EstimateMapping()
        self.core = IngestCore(TOPICS, self.mapping, IngestConfig(**config))
        self.core.stream_created("s")
        self.ahead = {"a": 0, "b": 0, "c": 0}
        self.next_seq = dict.fromkeys(self.ahead, 0)
        self.truth: dict[tuple[str, int], int] = {}
        self.actions: list[IngestAction] = []
        self.seen = 0
        self.resync_due_us: int | None = None
        self.obey_resync = obey_resync
        self.now_us = T0
        for source in self.ahead:
            self.core.source_registered(source, ("s",), T0)
            self.sync(source, T0)

    def sync(self, source: str, now_us: int, sync_ref_us: int | None = None) -> None:
        estimate = _estimate(-self.ahead[source], now_us if sync_ref_us is None else sync_ref_us)
        self.mapping.update(source, estimate)
        self.actions += self.core.clock_changed(SourceInfo(source, estimate, now_us), 0, now_us)

    def tick(self, sources: tuple[str, ...] = ("a", "b", "c")) -> None:
        true_us = self.now_us
        self.now_us += TICK_US
        for source in sources:
            seq = self.next_seq[source]
            self.next_seq[source] += 1
            self.truth[(source, seq)] = true_us
            event = IncomingEvent("s", seq, true_us + self.ahead[source], true_us)
            self.actions += self.core.events_received(CONN, source, (event,), true_us + NET_US)
        self.housekeeping()

    def housekeeping(self) -> None:
        if self.resync_due_us is not None and self.now_us >= self.resync_due_us:
            self.resync_due_us = None
            self.sync("a", self.now_us)
        due = self.core.next_deadline_us()
        if due is not None and due <= self.now_us:
            self.actions += self.core.advance(self.now_us)
        self.actions += self.core.poll(self.now_us)
        fresh, self.seen = self.actions[self.seen:], len(self.actions)
        if self.obey_resync and self.resync_due_us is None and any(
                isinstance(a, SendToSource) and a.source_id == "a" and b"resync" in a.data for a in fresh):
            self.resync_due_us = self.now_us + RESYNC_TAKES_US

    def run(self, ticks: int, sources: tuple[str, ...] = ("a", "b", "c")) -> None:
        for _ in range(ticks):
            self.tick(sources)

    def drain(self) -> None:
        """Let every wait run out: all events leave the pipeline."""
        for _ in range(100):
            self.now_us += 100_000
            self.housekeeping()

    def records(self, topic: str) -> list[dict[str, object]]:
        import orjson

        return [orjson.loads(a.value) for a in self.actions
                if isinstance(a, Produce) and a.topic == topic and a.key != PUNCTUATION_KEY]

    def resyncs(self) -> list[SendToSource]:
        return [a for a in self.actions if isinstance(a, SendToSource) and b"resync" in a.data]


def _others(run: StepRun) -> list[tuple[object, object, object]]:
    return [(r["source_id"], r["seq"], r["ref_ts_us"]) for r in run.records(EVENTS) if r["source_id"] != "a"]


@pytest.mark.parametrize("step_us", [5_000_000, -2_000_000], ids=["+5s", "-2s"])
def test_a_clock_step_is_caught_at_the_first_event_after_it_resynced_and_mapped_with_the_new_estimate(step_us):
    steady = StepRun()
    steady.run(100)
    steady.drain()
    stepped = StepRun()
    stepped.run(50)
    stepped.ahead["a"] += step_us  # the source's clock steps between two of its events
    stepped.run(50)
    stepped.drain()

    # Caught at seq 50, the first event stamped after the step: one resync request, naming that event.
    assert stepped.resyncs() == [SendToSource("a", encode_frame(build_resync("clock_step", "s", 50)))]
    (detected,) = stepped.core.clock_steps
    assert (detected.source_id, detected.stream, detected.seq) == ("a", "s", 50)
    assert detected.apparent_step_us == pytest.approx(step_us, abs=2 * NET_US)
    assert stepped.core.counters.clock_steps == 1
    # Every event of the stepped source is published on the events topic within its error bound of the truth.
    published = stepped.records(EVENTS)
    mine = [r for r in published if r["source_id"] == "a"]
    assert [r["seq"] for r in mine] == list(range(100))
    for record in mine:
        truth = stepped.truth[("a", record["seq"])]
        assert abs(record["ref_ts_us"] - truth) <= record["uncertainty_us"], record
    assert stepped.records(TOPICS.late("s")) == []
    # The events topic stays ordered, and the other sources' records are exactly those of the run without a step.
    refs = [r["ref_ts_us"] for r in published]
    assert refs == sorted(refs)
    assert _others(stepped) == _others(steady)
    assert stepped.core.counters.clock_step_unresolved == 0
    # Held from the detection until the poll after the new estimate: the resync's own time, one tick at most more.
    (hold,) = stepped.core.clock_step_holds
    assert (hold.source_id, hold.outcome) == ("a", "resolved")
    assert RESYNC_TAKES_US <= hold.held_us <= RESYNC_TAKES_US + TICK_US


def test_without_a_step_nothing_is_held_and_no_resync_is_asked():
    run = StepRun()
    run.run(100)
    assert run.resyncs() == [] and run.core.counters.clock_steps == 0


def test_a_step_the_source_never_resyncs_for_goes_late_after_the_hold_with_its_reason():
    # Asked again every 100 ms; the source gives no sample at all for 200 ms: it does not re-sync, it is not slow.
    run = StepRun(obey_resync=False, clock_step_hold_us=100_000, clock_step_give_up_us=200_000)
    run.run(50)
    run.ahead["a"] += 5_000_000
    run.run(10)  # 100 ms: still held
    assert [r["seq"] for r in run.records(TOPICS.late("s"))] == []
    run.run(20)  # past the 200 ms hold
    late = run.records(TOPICS.late("s"))
    assert [r["seq"] for r in late][:20] == list(range(50, 70))
    assert {r["late_reason"] for r in late} == {"clock_step_unresolved"}
    assert run.core.counters.clock_step_unresolved >= 20
    # The other sources' merge was held back by the hold at most, then went on: all of b and c is on the events topic.
    run.drain()
    others = [(r["source_id"], r["seq"]) for r in run.records(EVENTS) if r["source_id"] != "a"]
    assert sorted(others) == [(s, q) for s in ("b", "c") for q in range(80)]


def test_a_full_hold_pauses_its_source_instead_of_diverting_its_events_and_resumes_it_when_resolved():
    run = StepRun(obey_resync=False, clock_step_max_held=5)
    run.run(50)
    run.ahead["a"] += 5_000_000
    run.run(5)
    assert [a for a in run.actions if isinstance(a, (PauseReading, ResumeReading))] == []
    run.run(1)  # the 6th held event is one too many: the source is not read until its hold ends
    assert [a for a in run.actions if isinstance(a, (PauseReading, ResumeReading))] == [PauseReading("a")]
    run.run(3)  # what was already on its way still arrives, and is held, never diverted
    assert run.records(TOPICS.late("s")) == []
    run.sync("a", run.now_us)  # the slow re-sync comes after all
    run.run(1)
    assert [a for a in run.actions if isinstance(a, (PauseReading, ResumeReading))] == [
        PauseReading("a"), ResumeReading("a")]
    run.drain()
    mine = [r for r in run.records(EVENTS) if r["source_id"] == "a"]
    assert [r["seq"] for r in mine] == list(range(60))
    assert all(abs(r["ref_ts_us"] - run.truth[("a", r["seq"])]) <= r["uncertainty_us"] for r in mine)
    assert run.records(TOPICS.late("s")) == [] and run.core.counters.clock_step_unresolved == 0


def test_a_delay_within_the_learned_bound_is_not_a_step_and_a_longer_one_only_asks_for_a_resync():
    run = StepRun()
    run.run(20)
    # One event delayed by 100 ms in the network: within the backward margin, nothing happens.
    true_us = run.now_us
    run.actions += run.core.events_received(CONN, "a", (IncomingEvent("s", 20, true_us, true_us),),
                                            true_us + 100_000)
    run.next_seq["a"] = 21
    run.truth[("a", 20)] = true_us
    assert run.resyncs() == []
    # A 3 s stall looks like a -3 s step: asked to resync, and the resync confirms the old clock: released as is.
    true_us = run.now_us
    run.actions += run.core.events_received(CONN, "a", (IncomingEvent("s", 21, true_us, true_us),),
                                            true_us + 3_000_000)
    run.next_seq["a"] = 22
    run.truth[("a", 21)] = true_us
    run.now_us += 3_000_000  # the stall is over: it arrived now
    # A delay alone is no step (the event is in order with the source's others): at most a re-sync is asked, cheap,
    # and nothing is held.
    assert [r.data for r in run.resyncs()] == [encode_frame(build_resync("delay", "s", 21))]
    run.run(10)
    run.drain()
    assert [r["seq"] for r in run.records(EVENTS) if r["source_id"] == "a"] == list(range(32))
    assert run.records(TOPICS.late("s")) == []
    assert (run.core.counters.clock_steps, run.core.counters.clock_step_false_alarms) == (0, 0)
    assert run.core.clock_step_holds == deque()


def _frames_of(run: StepRun, source: str, ticks: int, start_us: int, size: int = 50) -> list[tuple[IncomingEvent, ...]]:
    """``ticks`` events of ``source`` stamped every TICK_US from ``start_us``, in seq order, in frames of ``size``."""
    out: list[IncomingEvent] = []
    for k in range(ticks):
        true_us = start_us + k * TICK_US
        seq = run.next_seq[source]
        run.next_seq[source] += 1
        run.truth[(source, seq)] = true_us
        out.append(IncomingEvent("s", seq, true_us + run.ahead[source], true_us))
    return [tuple(out[i:i + size]) for i in range(0, len(out), size)]


def test_a_gateway_waking_from_a_12_s_pause_reports_no_step_holds_nothing_and_loses_no_order():
    run = StepRun()
    run.run(20)
    # A zombie gateway (SIGSTOP, a VM freeze) for 12 s: the sources go on sending, and on waking it reads it all at
    # once, the oldest events 12 s after they happened. Perfect clocks: nothing here is a step.
    paused_us = run.now_us
    frames = {source: _frames_of(run, source, 1_200, paused_us) for source in ("a", "b", "c")}
    run.now_us = paused_us + 12_000_000
    for batch in zip(*frames.values(), strict=True):
        for source, frame in zip(frames, batch, strict=True):
            run.actions += run.core.events_received(CONN, source, frame, run.now_us)
    run.housekeeping()
    run.run(20)
    run.drain()
    counters = run.core.counters
    assert (counters.clock_steps, counters.clock_step_false_alarms, counters.clock_step_unresolved) == (0, 0, 0)
    assert run.core.clock_steps == deque() and run.core.clock_step_holds == deque()
    # At most one cheap re-sync per source, asked for the delay, none for a step.
    assert sorted(r.source_id for r in run.resyncs()) == ["a", "b", "c"]
    assert all(b"delay" in r.data for r in run.resyncs())
    assert run.records(TOPICS.late("s")) == []
    published = run.records(EVENTS)
    for source in ("a", "b", "c"):
        assert [r["seq"] for r in published if r["source_id"] == source] == list(range(1_240))
    refs = [r["ref_ts_us"] for r in published]
    assert refs == sorted(refs)


def test_after_a_pause_of_the_gateway_itself_no_merge_timeout_fires_before_its_sources_were_read():
    # Issue 25 item 9: a frozen gateway (SIGSTOP, a VM pause, a starved CPU) wakes with every source silent for
    # longer than the merge would wait. The first source read must not make the merge give the others up before
    # their connections are read: their silence was the gateway's own (rule 5, like a Kafka stall).
    from gateway.ingest import GATEWAY_PAUSE_US

    run = StepRun(gateway_pause_us=GATEWAY_PAUSE_US)
    run.run(20)
    paused_us = run.now_us
    frames = {source: _frames_of(run, source, 300, paused_us) for source in ("a", "b", "c")}
    run.now_us = paused_us + 12_000_000
    for frame in frames["a"]:
        run.actions += run.core.events_received(CONN, "a", frame, run.now_us)
    run.now_us += 1_000  # the deadline task runs before b's and c's connections are read
    run.actions += run.core.advance(run.now_us)
    for source in ("b", "c"):
        for frame in frames[source]:
            run.actions += run.core.events_received(CONN, source, frame, run.now_us)
    run.housekeeping()
    run.run(20)
    run.drain()
    assert run.records(TOPICS.late("s")) == []
    assert run.core.pipeline.counters.source_timeouts == 0
    assert run.core.counters.gateway_pauses == 1
    published = run.records(EVENTS)
    for source in ("a", "b", "c"):
        assert [r["seq"] for r in published if r["source_id"] == source] == list(range(340))


def test_a_frame_stamped_before_the_last_poll_is_no_pause_of_the_gateway():
    # events_received gets the time its frame was read, which may come before the last poll (the connection's
    # worker ran later): the gateway ran all along, and no grace must start.
    from gateway.ingest import GATEWAY_PAUSE_US

    core = make_core(gateway_pause_us=GATEWAY_PAUSE_US)
    core.source_registered("a", ("s",), T0)
    core.poll(T0 + 1_000_000)
    core.events_received(CONN, "a", events(range(1)), T0 + 700_000)  # read 300 ms before that poll
    core.poll(T0 + 1_002_000)
    assert core.counters.gateway_pauses == 0 and not core.kafka_stalled(T0 + 1_002_000)


def _delay_burst_run(monkeypatch: pytest.MonkeyPatch | None) -> StepRun:
    """dataset1's delay burst on a perfect clock: three of a's events arrive 800 ms late, after their successors."""
    if monkeypatch is not None:  # the reference: rule 9 sees nothing at all
        monkeypatch.setattr(IngestCore, "_step_us", lambda self, *args: None)
    run = StepRun(obey_resync=False)  # a re-sync would renew the estimate and, with it, the later error bounds
    run.run(20)
    burst_us = run.now_us
    (delayed,) = _frames_of(run, "a", 3, burst_us)
    run.run(3, ("b", "c"))
    run.run(80)
    run.actions += run.core.events_received(CONN, "a", delayed, burst_us + 800_000)
    run.housekeeping()
    run.run(20)
    run.drain()
    return run


def test_a_delay_burst_on_a_perfect_clock_is_published_exactly_as_without_the_clock_check(monkeypatch):
    burst = _delay_burst_run(None)
    counters = burst.core.counters
    assert (counters.clock_steps, counters.clock_step_false_alarms, counters.clock_step_unresolved) == (0, 0, 0)
    assert burst.core.clock_step_holds == deque()
    assert [r.data for r in burst.resyncs()] == [encode_frame(build_resync("delay", "s", 20))]
    reference = _delay_burst_run(monkeypatch)
    assert [a for a in burst.actions if a not in burst.resyncs()] == reference.actions


def test_a_resync_slower_than_the_hold_is_asked_again_and_its_events_are_released_not_diverted():
    run = StepRun(obey_resync=False)
    run.run(50)
    run.ahead["a"] -= 2_000_000
    run.run(700)  # 7 s without a sample: past the 5 s hold, the request is repeated and the merge waits on
    assert run.records(TOPICS.late("s")) == []
    assert [r.data for r in run.resyncs()] == [encode_frame(build_resync("clock_step", "s", 50))] * 2
    run.sync("a", run.now_us)
    run.run(10)
    run.drain()
    published = run.records(EVENTS)
    mine = [r for r in published if r["source_id"] == "a"]
    assert [r["seq"] for r in mine] == list(range(760))
    assert all(abs(r["ref_ts_us"] - run.truth[("a", r["seq"])]) <= r["uncertainty_us"] for r in mine)
    assert run.records(TOPICS.late("s")) == []
    assert [r["ref_ts_us"] for r in published] == sorted(r["ref_ts_us"] for r in published)
    counters = run.core.counters
    assert (counters.clock_steps, counters.clock_step_false_alarms, counters.clock_step_unresolved) == (1, 0, 0)
    (detected,) = run.core.clock_steps
    assert (detected.seq, detected.apparent_step_us) == (50, -2_000_000)


def test_sources_without_a_clock_estimate_are_never_checked():
    core = make_core()  # IdentityMapping, no clock_changed: a gateway without time sync
    core.source_registered("a", ("s",), T0)
    actions = core.events_received(CONN, "a", (IncomingEvent("s", 0, T0 + 60_000_000, 0),), T0)
    assert seqs(actions) == [0] and core.counters.clock_steps == 0


def test_an_estimate_measured_before_the_detection_does_not_end_the_hold():
    run = StepRun(obey_resync=False)
    run.run(50)
    run.ahead["a"] += 5_000_000
    detected_us = run.now_us + NET_US  # seq 50's arrival: the hold starts there
    run.run(1)
    run.sync("a", run.now_us, sync_ref_us=detected_us - 1)  # a sample from a burst that began before the step
    run.run(3)
    assert run.core.clock_step_holds == deque()
    assert [r["seq"] for r in run.records(EVENTS) if r["source_id"] == "a" and r["seq"] >= 50] == []
    run.sync("a", run.now_us)
    run.run(1)  # the next call in releases seqs 50-53 first; seq 54 is checked and pushed as usual
    (hold,) = run.core.clock_step_holds
    assert (hold.events, hold.outcome) == (4, "resolved")


def test_heartbeats_of_a_held_source_are_ignored():
    run = StepRun(obey_resync=False)
    run.run(50)
    run.ahead["a"] += 5_000_000
    run.run(1)
    assert run.core.heartbeat_received("a", Heartbeat(run.now_us + 5_000_000, {"s": 51}), run.now_us) == []
    assert run.core.counters.heartbeats == 1


def _resynced_b(sync_ref_us: int) -> ClockEstimate:
    return ClockEstimate(offset_us=-300, skew_ppm=0.0, rtt_us=900, sync_ref_us=sync_ref_us, sample_count=10,
                         root_error_us=450.0, skew_error_ppm=0.0)


def _resync_and_step_run(step_us: int) -> StepRun:
    """StepRun with b re-synced while its events wait in the merge, then a's clock stepping by ``step_us``."""
    run = StepRun()
    run.run(30)
    run.tick(("a", "b"))  # a's and b's events wait in the merge for c's
    run.ahead["b"] += 300
    resynced = _resynced_b(run.now_us)
    run.mapping.update("b", resynced)  # b's estimate changes under its queued event
    run.actions += run.core.clock_changed(SourceInfo("b", resynced, run.now_us), 0, run.now_us)
    run.tick(("c",))
    run.run(20)
    run.ahead["a"] += step_us
    run.run(50)
    run.drain()
    return run


@pytest.mark.parametrize("step_us", [0, 5_000_000, -2_000_000], ids=["none", "+5s", "-2s"])
def test_pushing_with_the_clock_step_checks_mapping_leaves_every_action_byte_identical(step_us, monkeypatch):
    carried = _resync_and_step_run(step_us)
    # The reference, as before the check's mapping was carried: the pipeline and the merger map each event again.
    map_at_every_stage(monkeypatch)
    reference = _resync_and_step_run(step_us)
    assert carried.actions == reference.actions
    events, late = carried.records(EVENTS), carried.records(TOPICS.late("s"))
    assert (len(events), len(late)) == (303, 0)
    assert len(carried.resyncs()) == (0 if step_us == 0 else 1)
    # b's seq 30 was pushed before b's re-sync and released after it: mapped at push, its error bound at release.
    b30 = next(r for r in events if r["source_id"] == "b" and r["seq"] == 30)
    resynced = _resynced_b(T0 + 31 * TICK_US)
    assert (b30["ref_ts_us"], b30["uncertainty_us"], b30["rtt_us"]) == (
        T0 + 30 * TICK_US, resynced.error_bound_us(resynced.to_reference_us(T0 + 30 * TICK_US)), 900)
    assert b30["uncertainty_us"] > 450 > _estimate(0, T0).error_bound_us(T0 + 30 * TICK_US)


def test_a_source_silent_past_the_retention_leaves_the_checkpoint():
    retention_us = 60_000_000
    core = make_core(source_retention_us=retention_us)
    core.source_registered("old", ("s",), T0)
    deliver(core, core.events_received(CONN, "old", events(range(2)), T0 + 100), T0 + 200)
    (kept,) = core.checkpoint_dirty_streams(T0 + 100 + retention_us)  # exactly the retention: kept
    assert ProgressRecord.from_dict(orjson.loads(kept.value)).next_seq == {"old": 2}
    core._dirty_streams.add("s")  # as another source's punctuation would make it
    (expired,) = core.checkpoint_dirty_streams(T0 + 101 + retention_us)
    record = ProgressRecord.from_dict(orjson.loads(expired.value))
    assert (record.next_seq, record.seen_us, core.counters.sources_expired) == ({}, {}, 1)


def test_expiry_keeps_recent_sources_and_starts_the_clock_of_sources_from_older_checkpoints():
    progress = StreamProgress("s", 10, {"recent": 5, "stale": 9, "legacy": 3}, None, {"recent": 900, "stale": 100})
    assert progress.expire(1_000, 500) == ["stale"]
    assert (progress.next_seq, progress.seen_us) == ({"recent": 5, "legacy": 3}, {"recent": 900, "legacy": 1_000})


def test_a_record_kafka_would_refuse_for_good_is_refused_with_a_reason_and_acked_over():
    core = make_core(max_record_bytes=400)
    core.source_registered("a", ("s",), T0)
    big = IncomingEvent("s", 0, T0 + 10, "x" * 400)
    actions = core.events_received(CONN, "a", (big, IncomingEvent("s", 1, T0 + 20, "small")), T0 + 100)
    refusals = [a for a in actions if isinstance(a, SendToSource)]
    size = len(EventRecord("s", "a", 0, T0 + 10, T0 + 10, 0, T0 + 100, T0 + 100, payload="x" * 400).to_json())
    assert refusals == [SendToSource("a", encode_frame(build_error(
        "invalid_payload", f"the event's record is {size} bytes, over the Kafka record limit of 400", False, "s", 0)))]
    assert seqs(actions) == [1] and core.counters.records_too_large == 1
    deliver(core, actions, T0 + 200)
    assert core.due_acks() == [SendToSource("a", ack("s", 1))]  # the ack moves over the refused seq


def test_a_stream_the_shard_holds_nothing_of_is_punctuated_behind_the_clock_and_its_merge_floor_moves():
    lag_us = 5_000_000
    core = make_core()
    now_us = T0 + 60_000_000
    assert core.punctuate_idle("s", now_us, lag_us) == [
        Produce(EVENTS, PUNCTUATION_KEY, PunctuationRecord("s", now_us - lag_us, now_us).to_json(), None,
                (now_us - lag_us) // 1000, PUNCTUATION_HEADERS)]
    assert core.punctuate_idle("s", now_us + 10, lag_us) == [
        Produce(EVENTS, PUNCTUATION_KEY, PunctuationRecord("s", now_us + 10 - lag_us, now_us + 10).to_json(), None,
                (now_us + 10 - lag_us) // 1000, PUNCTUATION_HEADERS)]
    assert core.counters.idle_punctuations == 2
    # The promise is kept: a quiet source resuming with an event older than it finds it late.
    core.source_registered("a", ("s",), now_us + 20)
    actions = core.events_received(CONN, "a", (IncomingEvent("s", 0, now_us - lag_us, 0),), now_us + 30)
    (late,) = [a for a in actions if isinstance(a, Produce) and a.topic == TOPICS.late("s")]
    assert orjson.loads(late.value)["late_reason"] == "after_punctuation"
    assert core.punctuate_idle("unknown", now_us, lag_us) == []  # only streams the shard has recovered


def test_a_stream_with_sources_is_left_to_the_merge_even_when_they_are_quiet():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    assert core.pipeline.has_sources("s")
    assert core.punctuate_idle("s", T0 + 60_000_000, 5_000_000) == []


def test_a_committed_transaction_confirms_its_records_as_their_delivery_reports_one_by_one_would():
    def run(batched):
        core = make_core(checkpoint_interval_us=1_000_000)
        for source_id in ("a", "b"):
            core.source_registered(source_id, ("s",), T0)
        core.poll(T0)
        actions = core.events_received(CONN, "a", events(range(4)), T0 + 100)
        actions += core.events_received(CONN, "b", events(range(3)), T0 + 101)
        refs = produced(actions)
        (late,) = produced(core.events_received(CONN, "b", (IncomingEvent("s", 3, 5, None),), T0 + 102))
        refs.append(late)  # behind the punctuation: to the late topic, its delivery moves the ack, not the progress
        if batched:
            core.on_committed(refs, {"s": 42 + len(refs) - 2}, T0 + 300)  # the last event record's offset
        else:
            for offset, ref in enumerate(refs, start=42):
                core.on_delivered(ref, None, offset if ref.topic == "events" else 7, T0 + 300)
        return core, core.poll(T0 + 1_000_000), core.checkpoint_dirty_streams(T0 + 1_000_000)

    one_by_one, batched = run(False), run(True)
    assert batched[1:] == one_by_one[1:]
    # a's seq 3 waits in the merge for b; b's late seq 3 moves its ack, not its progress (rule 6).
    assert batched[1][:2] == [SendToSource("a", ack("s", 2)), SendToSource("b", ack("s", 3))]
    progress = ProgressRecord.from_dict(orjson.loads(batched[1][2].value))
    assert (progress.next_offset, progress.next_seq) == (48, {"a": 3, "b": 3})
    assert (batched[0].counters, list(batched[0].delivery_latencies_us)) == (
        one_by_one[0].counters, list(one_by_one[0].delivery_latencies_us))


def test_a_records_kafka_timestamp_is_its_reference_time_within_an_hour_before_and_a_minute_after_its_release():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    core.events_received(CONN, "a", events(range(2)), T0 + 100)  # punctuated at T0 + 20
    ahead = core.events_received(CONN, "a", (IncomingEvent("s", 2, T0 + 3_600_000_000, None),), T0 + 200)
    behind = core.events_received(CONN, "a", (IncomingEvent("s", 3, T0 + 5, None),), T0 + 5_000)
    ancient = core.events_received(CONN, "a", (IncomingEvent("s", 4, 1_000, None),), T0 + 6_000)
    late = [a for a in ahead + behind + ancient if isinstance(a, Produce) and a.topic == TOPICS.late("s")]
    # A runaway clock's time would be refused by a broker bounding future timestamps, a 1970 one deleted by the next
    # retention check: bounded by the release; a late event's own reference time otherwise.
    assert [(a.delivery.seq, a.timestamp_ms, a.headers[0]) for a in late if a.delivery is not None] == [
        (2, (T0 + 200 + 60_000_000) // 1000, ("kind", b"late")), (3, (T0 + 5) // 1000, ("kind", b"late")),
        (4, (T0 + 6_000 - 3_600_000_000) // 1000, ("kind", b"late"))]


# -- issue 24 items 2, 3, 4, 8: given-up gaps, seq jumps, one re-ack per frame, conflicts ---------------------------


def _gap(stream: str, first_seq: int, last_seq: int, reason: str = "timeout") -> bytes:
    from contract.wire.messages import build_gap

    return encode_frame(build_gap(stream, first_seq, last_seq, reason))


def test_a_frame_full_of_duplicates_is_answered_with_one_ack_per_stream():
    core = make_core()
    core.stream_created("u")
    core.source_registered("a", ("s", "u"), T0)
    deliver(core, core.events_received(CONN, "a", (*events(range(100)), *events(range(10), "u")), T0 + 100), T0 + 200)
    core.poll(T0 + 200)
    actions = core.events_received(CONN, "a", (*events(range(100)), *events(range(10), "u")), T0 + 300)
    assert actions == [SendFrame(CONN, ack("s", 99)), SendFrame(CONN, ack("u", 9))]
    assert core.counters.duplicates == 110


def test_a_given_up_gap_is_told_to_the_source_and_the_ack_passes_it_and_its_seq_is_published_late_once():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    deliver(core, core.events_received(CONN, "a", events(range(2)), T0 + 100), T0 + 150)
    sent = core.events_received(CONN, "a", tuple(e for e in events(range(2, 6)) if e.seq != 3), T0 + 200)
    deliver(core, sent, T0 + 250, 2)
    assert core.poll(T0 + 300) == [SendToSource("a", ack("s", 2))]  # 3 is missing: the ack stops below it
    due = core.next_deadline_us()
    assert due is not None
    actions = core.advance(due)
    assert [a for a in actions if isinstance(a, SendToSource)] == [SendToSource("a", _gap("s", 3, 3))]
    deliver(core, actions, due + 10, 3)
    assert seqs(actions) == [4, 5]
    assert _sent(core.poll(due + 20)) == [SendToSource("a", ack("s", 5))]  # past the given-up seq
    assert (core.counters.gaps_given_up, core.counters.seqs_given_up) == (1, 1)
    # The given-up seq, resent after all: published once, on the late topic, with its reason; then a duplicate.
    late = core.events_received(CONN, "a", events(range(3, 4)), due + 30)
    (delivery,) = produced(late)
    assert (delivery.seq, delivery.topic) == (3, "late")
    record = orjson.loads(next(a for a in late if isinstance(a, Produce)).value)
    assert record["late_reason"] == "late_after_skip"
    deliver(core, late, due + 40, 9)
    assert _sent(core.poll(due + 50)) == []  # the ack was past it already
    again = core.events_received(CONN, "a", events(range(3, 6)), due + 60)
    assert again == [SendFrame(CONN, ack("s", 5))]
    assert core.tracker.unacked("a", "s") == 0


def test_a_source_starting_at_seq_1_is_told_seq_0_was_given_up_and_acked_through_its_last():
    core = make_core()
    core.source_registered("a", ("s",), T0)
    deliver(core, core.events_received(CONN, "a", events(range(1, 21)), T0 + 100), T0 + 200)
    assert core.poll(T0 + 200) == []
    due = core.next_deadline_us()
    assert due is not None
    actions = core.advance(due)
    assert [a for a in actions if isinstance(a, SendToSource)] == [SendToSource("a", _gap("s", 0, 0))]
    assert seqs(actions) == list(range(1, 21))
    deliver(core, actions, due + 10)
    assert _sent(core.poll(due + 20)) == [SendToSource("a", ack("s", 20))]


def _sent(actions: list[IngestAction]) -> list[IngestAction]:
    return [a for a in actions if isinstance(a, (SendToSource, SendFrame))]


def test_a_seq_jump_past_the_limit_is_refused_with_a_non_fatal_error_and_nothing_kept():
    from contract.wire.messages import SEQ_JUMP

    core = make_core(max_seq_jump=1000)
    core.source_registered("a", ("s",), T0)
    actions = core.events_received(CONN, "a", (*events(range(1)), *events(range(1002, 1003))), T0 + 100)
    refused = [a for a in actions if isinstance(a, SendFrame)]
    assert len(refused) == 1
    error = refused[0].data
    assert SEQ_JUMP.encode() in error and b"1002" in error
    assert seqs(actions) == [0]
    assert core.counters.seq_jumps == 1
    assert core.tracker.unacked("a", "s") == 1  # seq 0 only
    # A jump within the limit is accepted and costs one range, not one entry per missing seq.
    assert seqs(core.events_received(CONN, "a", events(range(1001, 1002)), T0 + 200)) == []


def test_a_duplicate_with_another_payload_is_a_conflict_answered_with_an_error_and_never_acked_to_its_sender():
    from contract.wire.messages import SEQ_CONFLICT

    core = make_core()
    core.source_registered("a", ("s",), T0)
    real = core.events_received(CONN, "a", events(range(3)), T0 + 100)
    forged = tuple(IncomingEvent("s", q, T0 + 10 * (q + 1), {"forged": q}) for q in range(3))
    other = ConnectionId(8)
    # Still in flight: compared with the accepted event itself.
    actions = core.events_received(other, "a", forged[:2], T0 + 150)
    assert [a.connection for a in actions if isinstance(a, SendFrame)] == [other, other]
    assert all(SEQ_CONFLICT.encode() in a.data for a in actions if isinstance(a, SendFrame))
    assert core.counters.conflicts == 2 and core.counters.duplicates == 0
    deliver(core, real, T0 + 200)
    assert core.poll(T0 + 200) == [SendToSource("a", ack("s", 2))]
    # Acked: compared with the digest kept for the recent acks; the conflict's error comes before any re-ack.
    actions = core.events_received(other, "a", (forged[2], *events(range(1, 2))), T0 + 300)
    assert actions == [SendFrame(other, _conflict(2)), SendFrame(other, ack("s", 2))]
    assert core.counters.conflicts == 3 and core.counters.duplicates == 1
    # Another timestamp is a conflict too.
    (moved,) = core.events_received(other, "a", (IncomingEvent("s", 1, T0 + 999, 1),), T0 + 400)
    assert moved == SendFrame(other, _conflict(1))


def _conflict(seq: int) -> bytes:
    from contract.wire.messages import SEQ_CONFLICT

    return encode_frame(build_error(SEQ_CONFLICT, f"seq {seq} of stream s was already accepted with another payload "
                                    "or source_ts_us: this event is not published", False, "s", seq))


def test_a_jump_of_a_million_on_many_streams_in_one_frame_costs_o_of_the_frame():
    import tracemalloc

    streams = [f"j{i}" for i in range(8)]
    core = make_core()
    for stream in streams:
        core.stream_created(stream)
    core.source_registered("a", tuple(streams), T0)
    frame = tuple(e for stream in streams for e in (IncomingEvent(stream, 0, T0 + 10, 0),
                                                    IncomingEvent(stream, 1_000_000, T0 + 20, 1)))
    tracemalloc.start()
    try:
        before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        actions = core.events_received(CONN, "a", frame, T0 + 100)
        deliver(core, actions, T0 + 200)
        due = core.next_deadline_us()
        assert due is not None
        skipped = core.advance(due)
        deliver(core, skipped, due + 10, 100)
        core.poll(due + 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    gaps = [a for a in skipped if isinstance(a, SendToSource) and b"gap" in a.data]
    assert len(gaps) == len(streams)
    assert all(core.tracker.acked_through("a", s) == 1_000_000 for s in streams)
    assert peak - before < 2 * 1024 * 1024  # per-seq bookkeeping took ~45 MB for these 8 streams


# -- rule 12 (issue 24 items 1 and 7): heartbeats validated like events, timestamps inside the contract -----------


def _errors(actions: list[IngestAction]) -> list[dict[str, object]]:
    from contract.wire.frames import FrameDecoder

    frames = [a.data for a in actions if isinstance(a, SendToSource | SendFrame)]
    decoded = [FrameDecoder().feed(data)[0] for data in frames]
    return [f for f in decoded if f["type"] == "error"]


def test_a_runaway_heartbeat_is_refused_told_and_never_reaches_the_watermark_or_the_checkpoint():
    core = make_core()
    core.source_registered("runaway", ("s",), T0)
    actions = core.heartbeat_received("runaway", Heartbeat(T0 + 86_400_000_000, {"s": 0}), T0 + 10)
    (error,) = _errors(actions)
    assert (error["code"], error["fatal"], "stream" in error) == ("invalid_message", False, False)
    assert str(error["message"]).startswith("future_dated: ")
    assert [a for a in actions if isinstance(a, Produce)] == []
    assert (core.counters.heartbeats, core.counters.heartbeats_refused) == (1, 1)
    assert core.pipeline.watermark_us("s") is None
    # A newcomer's on-time event is published on the events topic, not diverted behind a day-ahead watermark.
    core.source_registered("a", ("s",), T0 + 20)
    actions = core.events_received(CONN, "a", events(range(1)), T0 + 30)
    actions += core.advance(T0 + 3_000_000)
    assert [(d.seq, d.topic) for d in produced(actions)] == [(0, "events")]
    assert core.stream_progress("s").watermark_us == T0 + 10


def test_a_heartbeat_showing_a_forward_clock_step_is_refused():
    run = StepRun(obey_resync=False)
    run.run(5)
    actions = run.core.heartbeat_received("b", Heartbeat(run.now_us + 2_000_000, {"s": 5}), run.now_us)
    (error,) = _errors(actions)
    assert str(error["message"]).startswith("clock_step: ")
    assert run.core.counters.heartbeats_refused == 1
    # Within its bound and the tolerance it is taken.
    assert _errors(run.core.heartbeat_received("b", Heartbeat(run.now_us, {"s": 5}), run.now_us)) == []
    assert run.core.counters.heartbeats_refused == 1


def test_a_checkpoint_watermark_far_ahead_of_the_clock_is_not_restored_and_leaves_the_checkpoint():
    core = IngestCore(TOPICS, IdentityMapping())
    core.stream_recovered(StreamProgress("s", 0, {}, T0 + 86_400_000_000), T0)
    assert core.pipeline.watermark_us("s") is None
    assert core.counters.watermarks_distrusted == 1
    assert core.stream_progress("s").watermark_us is None
    core.source_registered("a", ("s",), T0)
    actions = core.events_received(CONN, "a", events(range(1)), T0 + 30)
    assert [(d.seq, d.topic) for d in produced(actions)] == [(0, "events")]


def test_an_event_mapped_outside_0_to_2_63_is_refused_told_and_acked_over():
    from timesync.clocks import FixedOffsetMapping

    core = IngestCore(TOPICS, FixedOffsetMapping({"a": 3_600_000_000}), IngestConfig())
    core.stream_created("s")
    core.source_registered("a", ("s",), T0)
    frame = (IncomingEvent("s", 0, T0 - 3_600_000_000, 0), IncomingEvent("s", 1, 2**63 - 1_000, 1),
             IncomingEvent("s", 2, T0 - 3_600_000_000 + 5, 2))
    actions = core.events_received(CONN, "a", frame, T0 + 100)
    (error,) = _errors(actions)
    assert (error["code"], error["stream"], error["seq"], error["fatal"]) == ("invalid_message", "s", 1, False)
    assert str(error["message"]).startswith("timestamp_out_of_range: ")
    assert [(d.seq, d.topic) for d in produced(actions)] == [(0, "events"), (2, "events")]
    assert core.counters.timestamps_refused == 1
    deliver(core, actions, T0 + 200)
    assert core.poll(T0 + 200)[0] == SendToSource("a", ack("s", 2))  # the ack moves over the refused seq


def test_a_bye_releases_what_waited_for_its_source_at_once():
    """Rule 14 (issue 25 item 7): b said bye; a's event no longer waits for b's join grace or learned wait."""
    core = make_core()
    core.source_registered("a", ("s",), T0)
    core.source_registered("b", ("s",), T0)
    assert seqs(core.events_received(CONN, "a", events(range(1)), T0 + 100)) == []
    actions = core.source_left("b", T0 + 200)
    assert [(d.seq, d.topic) for d in produced(actions)] == [(0, "events")]
    assert core.source_left("b", T0 + 201) == []  # a pool's second bye changes nothing
    assert (core.counters.byes, core.pipeline.counters.departures) == (2, 1)


def test_a_long_lived_source_the_gateway_has_no_progress_for_publishes_after_one_gap():
    # Review B6: a source whose seqs are past max_seq_jump (it dropped out of the checkpoint, a new deployment) had
    # every event refused as seq_jump, forever. Its first seq is accepted; 0..first-1 is one given-up gap.
    from contract.wire.messages import build_gap

    core = make_core()
    core.source_registered("meter-17", ("s",), T0)
    first = 2_500_000
    actions = core.events_received(CONN, "meter-17", events(range(first, first + 100)), T0 + 200)
    assert [a for a in actions if isinstance(a, SendFrame)] == [] and core.counters.seq_jumps == 0
    released: list[IngestAction] = list(actions)
    now = T0 + 200
    while len(seqs(released)) < 100:
        deadline = core.next_deadline_us()
        assert deadline is not None and deadline - T0 < 10_000_000
        now = max(now, deadline)
        released += core.advance(now)
    assert seqs(released) == list(range(first, first + 100))
    deliver(core, released, now + 10)
    sent = _sent(released) + _sent(core.poll(now + 20))
    assert sent == [SendToSource("meter-17", encode_frame(build_gap("s", 0, first - 1, "timeout"))),
                    SendToSource("meter-17", ack("s", first + 99))]
    assert core.tracker.ranges("meter-17", "s") == 1


def test_churned_source_ids_are_compacted_when_freed_and_gone_at_the_source_retention():
    # Review B5: each freed source id kept its full delivery tracker entries (a 2 KiB digest ring per stream), its
    # seq hints and its clock watch forever: 25.9 KiB per churned id on 8 streams. Freed (rule 11): only the acked
    # seq per stream stays (the dedup floor). Past the source retention (rule 6, it left the checkpoint): nothing.
    from gateway.ingest import IDLE_SOURCE_RETENTION_US

    retention_us = 600_000_000
    core = make_core(source_retention_us=retention_us)
    core.stream_created("t")
    n = 20
    estimate = ClockEstimate(offset_us=0, skew_ppm=0.0, rtt_us=80, sync_ref_us=T0, sample_count=8)
    released: list[IngestAction] = []
    for i in range(n):
        source = f"dev-{i}"
        core.source_registered(source, ("s", "t"), T0)
        if i % 2 == 0:
            core.clock_changed(SourceInfo(source, estimate, T0), 0, T0)
        released += core.events_received(CONN, source, (*events(range(1)), *events(range(1), "t")), T0 + 100)
        core.source_disconnected(source, T0 + 300)
    now = T0 + 300
    while core.counters.sources_forgotten < n:
        now += 1_000_000
        assert now < T0 + 2 * IDLE_SOURCE_RETENTION_US
        released += core.advance(now)
        deliver(core, released, now)
        released = []
        core.poll(now)
    assert core.tracker.footprint() == (0, 2 * n)  # (full entries, acked seqs alone)
    assert {core.tracker.acked_through(f"dev-{i}", s) for i in range(n) for s in ("s", "t")} == {0}
    assert len(core.pipeline._next_seq_hint) == 2 * n and len(core._watches) == n // 2
    # A freed source's resend of an acked seq is still a duplicate, re-acked.
    core.source_registered("dev-3", ("s", "t"), now)
    assert _sent(core.events_received(CONN, "dev-3", events(range(1)), now)) == [SendFrame(CONN, ack("s", 0))]
    core.source_disconnected("dev-3", now)
    core._dirty_streams.update(("s", "t"))  # as other sources' events would make them
    now = T0 + 101 + retention_us
    core.checkpoint_dirty_streams(now)
    assert core.counters.sources_expired == 2 * n
    # dev-3 is registered again (its retention for rule 11 runs): kept until freed.
    assert core.tracker.footprint() == (0, 2) and core.tracker.acked_through("dev-3", "s") == 0
    assert core.tracker.acked_through("dev-0", "s") is None  # as after a restart: unknown
    assert set(core.pipeline._next_seq_hint) == {("dev-3", "s"), ("dev-3", "t")} and set(core._watches) == set()
    # Freed after it left the checkpoints: nothing of it is kept.
    core.poll(now + IDLE_SOURCE_RETENTION_US)
    assert core.counters.sources_forgotten == n + 1 and core.known_sources() == set()
    assert core.tracker.footprint() == (0, 0) and core.pipeline._next_seq_hint == {}


def _late_reasons(actions: list[IngestAction]) -> list[tuple[int, str]]:
    return [(a.delivery.seq, orjson.loads(a.value)["late_reason"]) for a in actions
            if isinstance(a, Produce) and a.delivery is not None and a.delivery.topic == "late"]


def test_a_given_up_seq_the_reorderer_forgot_but_the_tracker_kept_goes_late_as_late_after_skip():
    # Review (minor): while the ack is held back (an undelivered event), the tracker keeps every given-up seq above
    # it, but the reorderer only its newest max_skipped_tracked: the first copy of an older one was accepted and
    # published late as `duplicate`. It is a given-up seq arriving late: `late_after_skip`.
    from dataclasses import replace

    from reorder.pipeline import PipelineConfig
    from reorder.sequence import SequenceConfig

    sequence = SequenceConfig(drop_late=True, max_skipped_tracked=2)
    core = IngestCore(TOPICS, IdentityMapping(), IngestConfig(pipeline=replace(PipelineConfig(), sequence=sequence)))
    core.stream_created("s")
    core.source_registered("a", ("s",), T0)
    now = T0 + 100
    actions = core.events_received(CONN, "a", events(range(1)), now)  # seq 0, never delivered: the ack stays at -1
    for seq in (2, 4, 6):  # each gives up seq - 1
        actions += core.events_received(CONN, "a", events(range(seq, seq + 1)), now)
        deadline = core.next_deadline_us()
        assert deadline is not None
        now = deadline
        actions += core.advance(now)
    assert seqs(actions) == [0, 2, 4, 6] and core.tracker.acked_through("a", "s") == -1
    late = core.events_received(CONN, "a", (*events(range(1, 2)), *events(range(5, 6))), now + 1)
    assert _late_reasons(late) == [(1, "late_after_skip"), (5, "late_after_skip")]
    assert core.events_received(CONN, "a", events(range(1, 2)), now + 2) == []  # the second copy: a duplicate
    assert core.counters.duplicates == 1


def test_a_given_up_seq_of_a_freed_source_is_a_duplicate_as_after_a_restart():
    # Review (minor): once a source was freed (rule 11), a given-up seq that turned up went late as `before_start`.
    # Its given-up seqs are forgotten with it (the tracker keeps its acked seq alone): a duplicate, re-acked.
    from gateway.ingest import IDLE_SOURCE_RETENTION_US

    core = make_core()
    core.source_registered("a", ("s",), T0)
    actions = core.events_received(CONN, "a", (*events(range(1)), *events(range(2, 3))), T0 + 100)
    deadline = core.next_deadline_us()
    assert deadline is not None
    actions += core.advance(deadline)
    assert seqs(actions) == [0, 2]
    deliver(core, actions, deadline + 1)
    assert core.tracker.acked_through("a", "s") == 2
    core.source_disconnected("a", deadline + 2)
    now = deadline + 3 + IDLE_SOURCE_RETENTION_US
    core.poll(now)
    assert core.known_sources() == set() and core.tracker.footprint() == (0, 1)
    core.source_registered("a", ("s",), now)
    again = core.events_received(CONN, "a", events(range(1, 2)), now + 1)
    assert again == [SendFrame(CONN, ack("s", 2))] and core.counters.duplicates == 1


def test_pauses_of_a_starved_gateway_are_all_counted_and_their_lines_rate_limited(caplog: pytest.LogCaptureFixture):
    # A host starved for CPU pauses the gateway again and again: every pause counts, but the log gets a burst and
    # then about a line a second (the limiter's), not a line per pause.
    from gateway.ingest import GATEWAY_PAUSE_US

    core = make_core(gateway_pause_us=GATEWAY_PAUSE_US)
    core.source_registered("a", ("s",), T0)
    caplog.set_level(logging.INFO, logger="gateway.ingest")
    now_us = T0
    core.poll(now_us)  # the first call: a pause is a gap between calls
    for _ in range(100):
        now_us += GATEWAY_PAUSE_US + 10_000
        core.poll(now_us)
    lines = [r for r in caplog.records if "the gateway did not run" in r.getMessage()]
    assert core.counters.gateway_pauses == 100
    seconds = (now_us - T0) / 1e6  # 26 s of pauses: a burst of 10, then one a second
    assert 1 <= len(lines) <= 10 + seconds + 1
