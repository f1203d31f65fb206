"""``RecordBuilder.produce_records`` and ``build_merged`` (native/src/records/produce.rs) against their
specification, the Python path: ``_publish_one`` of gateway/ingest.py for a plain event record, after
``IngestPipeline._records`` for a release of the merge. The same Produce (topic, key, value bytes, DeliveryRef, Kafka
timestamp, headers) for each item they take, and every other item handed back in its place, itself."""

from __future__ import annotations

import gc
import sys
from dataclasses import dataclass
from typing import Any, cast

import pytest
import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.records import EventRecord, event_headers, kafka_timestamp_ms
from contract.wire.messages import AtomicInterval, IncomingEvent, IntervalEndpoint, RejectedPayload
from gateway.ingest import GIVEN_UP_LATE_REASONS, DeliveryRef, Produce, RecordBuilderCore
from gateway.native import native_record_builder
from reorder.pipeline import IngestPipeline, PipelineOutput, PublishPunctuation, PublishRecord, PublishRefused
from reorder.records import Late, Merged, Punctuation, SourceEvent
from tests.unit.native.test_native_records import event_records, json_values, odd_values
from timesync.clocks import FixedOffsetMapping

MAX_RECORD_BYTES = 400
TOPICS = {("s1", "events"): "t.s1", ("s1", "late"): "t.s1.late", ("doors", "events"): "t.doors"}  # doors late: none

payloads = st.one_of(json_values, odd_values, st.just(RejectedPayload("not JSON")), st.just("x" * 500))
outputs = st.one_of(
    st.builds(PublishRecord, event_records(payloads), st.sampled_from(["events", "late"])),
    st.builds(PublishRecord, event_records(), st.sampled_from(["events", "late"])),
    st.builds(PublishPunctuation, st.just("s1"), st.integers(0, 2**62), st.integers(0, 2**62)),
    st.builds(PublishRefused, st.just("src"), st.just("s1"), st.integers(0, 9), st.just("timestamp_out_of_range"),
              st.just("detail")),
)


def builder(max_record_bytes: int = MAX_RECORD_BYTES) -> RecordBuilderCore:
    built = native_record_builder()
    built.publish_to(dict(TOPICS), max_record_bytes)
    return built


def specified(output: PipelineOutput, max_record_bytes: int = MAX_RECORD_BYTES) -> Any:
    """What ``_publish_one`` produces for a plain event record, else the output itself (``_publish_one``'s)."""
    if type(output) is not PublishRecord:
        return output
    record, kind = output.record, output.topic
    topic = TOPICS.get((record.stream, kind))
    if (type(record.payload) is RejectedPayload or topic is None
            or (kind == "late" and record.late_reason in GIVEN_UP_LATE_REASONS)):
        return output
    try:
        value = record.to_json()
    except (TypeError, ValueError):
        return output
    if len(value) > max_record_bytes:
        return output
    return Produce(topic, record.key, value,
                   DeliveryRef(record.source_id, record.stream, record.seq, kind, record.release_ts_us),
                   kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us), event_headers(record.source_id, kind))


@settings(max_examples=400, deadline=None)
@given(st.lists(outputs, max_size=8))
def test_produce_records_gives_the_python_produce_or_hands_the_output_back(batch: list[PipelineOutput]) -> None:
    produced, handed_back = builder().produce_records(batch)
    expected = [specified(output) for output in batch]
    assert produced == expected
    assert handed_back == [i for i, (item, output) in enumerate(zip(expected, batch, strict=True)) if item is output]
    assert all(produced[i] is batch[i] for i in handed_back)


def test_a_hand_made_batch() -> None:
    """One of each: produced, a refused payload, a relabelled late record, no topic, too large, orjson refuses."""
    def record(stream: str = "s1", payload: Any = 1, late_reason: str | None = None) -> EventRecord:
        return EventRecord(stream, "src", 3, 10, 2_000_000, 5, 2_000_100, 2_000_200, late_reason is not None, payload,
                           late_reason)
    batch: list[PipelineOutput] = [
        PublishRecord(record(), "events"), PublishRecord(record(payload=RejectedPayload("no")), "events"),
        PublishRecord(record(late_reason="duplicate"), "late"), PublishRecord(record("doors"), "late"),
        PublishRecord(record(payload="x" * 500), "events"), PublishRecord(record(payload={"n": 2**70}), "events"),
        PublishRecord(record(late_reason="after_punctuation"), "late"), PublishPunctuation("s1", 1, 2)]
    produced, handed_back = builder().produce_records(batch)
    assert handed_back == [1, 2, 3, 4, 5, 7]
    assert produced[1:6] == batch[1:6] and produced[7] is batch[7]
    assert produced[0] == Produce(
        "t.s1", b"src", record().to_json(), DeliveryRef("src", "s1", 3, "events", 2_000_200), 2_000,
        event_headers("src", "events"))
    assert produced[6] == Produce(
        "t.s1.late", b"src", record(late_reason="after_punctuation").to_json(),
        DeliveryRef("src", "s1", 3, "late", 2_000_200), 2_000, event_headers("src", "late"))


class RttMapping(FixedOffsetMapping):
    """A mapping with a round trip per source (None for one), as an estimate gives it."""

    def rtt_us(self, source_id: str) -> int | None:
        return None if source_id == "src" else 400


MERGED_MAX_RECORD_BYTES = 700  # most releases fit, the "x" * 500 payload does not
sources = st.sampled_from(["src", "é-source", "a\"b"])
source_events = st.builds(
    SourceEvent, sources, st.sampled_from(["s1", "doors"]), st.integers(0, 2**63 - 1),
    st.one_of(*[st.integers(0, 2**62)] * 6, st.integers(2**63, 2**64)),  # past 64 bits: orjson refuses it
    st.one_of(*[json_values] * 6, payloads),
    st.sampled_from([*[None] * 6, AtomicInterval(10), IntervalEndpoint("i", "end")]))
plain_events = st.builds(SourceEvent, sources, st.sampled_from(["s1", "doors"]), st.integers(0, 2**63 - 1),
                         st.integers(0, 2**62), json_values, st.none())
merge_outputs = st.one_of(
    st.builds(Merged, plain_events, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62),
              st.just(0)),
    st.builds(Merged, source_events, st.integers(0, 2**62), st.integers(0, 2**62), st.integers(0, 2**62),
              st.sampled_from([0, 0, 0, 5])),
    st.builds(Punctuation, st.just("s1"), st.integers(0, 2**62), st.integers(0, 2**62)),
    st.builds(Late, source_events, st.integers(0, 2**62), st.just("after_punctuation"), st.integers(0, 9),
              st.just(False)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(merge_outputs, max_size=8), st.data())
def test_build_merged_gives_what_records_and_publish_give(merged: list[Any], data: st.DataObject) -> None:
    """``build_merged`` against ``IngestPipeline._records`` then ``_publish_one``'s specification: each release it
    builds is the Produce those give; every item it hands back is the item itself; a run's events carry the error
    bound of the mapping they were pushed with, the others the clock's."""
    clock = RttMapping({"src": 0, "é-source": 1_500, "a\"b": -700}, error_bound_us=3)
    run = [(item.event, item.arrival_us, (item.ref_ts_us, data.draw(st.integers(0, 99))))
           for item in merged if type(item) is Merged and data.draw(st.booleans())]
    built, handed_back = builder(MERGED_MAX_RECORD_BYTES).build_merged(merged, run, clock)
    pipeline = IngestPipeline(clock)
    errors = {id(event): mapped[1] for event, _arrival_us, mapped in run}
    for position, item in enumerate(merged):
        records: list[PipelineOutput] = []
        pipeline._records([item], records, None, None, None, errors)
        if position in handed_back:
            assert built[position] is item
        else:
            assert type(item) is Merged
            assert [specified(record, MERGED_MAX_RECORD_BYTES) for record in records] == [built[position]]
            assert type(built[position]) is Produce


# A few times only: consecutive records share their release time and their Kafka timestamp (the builder converts
# the last of each once, records/produce.rs's LastInt), then change, then come back.
few_times = st.sampled_from([2_000_000, 2_000_400, 2_001_000, 2_999_999, 2**62])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.builds(Merged, plain_events, few_times, few_times, few_times, st.just(0)), min_size=1,
                max_size=12), st.integers(0, 12))
def test_records_that_share_times_and_sources_each_get_their_own(merged: list[Merged], cut: int) -> None:
    """The builder keeps the last Kafka timestamp and release time it converted and each source's key, one Python
    object for every record with that value: each record still carries its own values, against ``_records`` then
    ``_publish_one``'s specification, within one call and across two calls on one builder."""
    clock = RttMapping({"src": 0, "é-source": 1_500, "a\"b": -700}, error_bound_us=3)
    kept = builder(MERGED_MAX_RECORD_BYTES)
    built: list[Any] = []
    for part in (merged[:cut], merged[cut:]):
        built += kept.build_merged(list[Any](part), [], clock)[0]
    pipeline = IngestPipeline(clock)
    for item, out in zip(merged, built, strict=True):
        records: list[PipelineOutput] = []
        pipeline._records([item], records, None, None, None, {})
        if type(out) is Produce:
            assert [specified(record, MERGED_MAX_RECORD_BYTES) for record in records] == [out]
            assert out.key == item.event.source_id.encode()
        else:
            assert out is item


def test_records_with_one_time_and_source_share_the_objects_and_the_next_gets_its_own() -> None:
    """Hand-made: two releases at one time share the timestamp's, the release time's and the key's object; a
    third at another time gets its own values."""
    clock = RttMapping({"src": 0}, error_bound_us=3)
    merged = [Merged(SourceEvent("src", "s1", seq, 1_000, seq, None), 2_000_000, release_us, 2_000_100, 0)
              for seq, release_us in ((0, 2_000_500), (1, 2_000_500), (2, 3_000_700))]
    first, second, third = cast(list[Produce], builder().build_merged(list[Any](merged), [], clock)[0])
    released = [cast(DeliveryRef, produced.delivery).released_us for produced in (first, second, third)]
    assert first.timestamp_ms is second.timestamp_ms and released[0] is released[1]
    assert first.key is second.key is third.key == b"src"
    assert [first.timestamp_ms, third.timestamp_ms] == [kafka_timestamp_ms(2_000_100, 2_000_500),
                                                        kafka_timestamp_ms(2_000_100, 3_000_700)]
    assert released == [2_000_500, 2_000_500, 3_000_700]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_push_run_built_is_build_merged_of_push_run(data: st.DataObject) -> None:
    """The native merger's ``push_run_built`` (no Merged record for a release the builder produces) against
    ``build_merged`` of its ``push_run``: two mergers, the same runs, the same lists and positions. Stamps that go
    back within the error bound make raised releases (handed back), sources stamping ahead make the merge wait."""
    from gateway.native import native_merger
    from reorder.merger import MergeOutput, MergerConfig

    clock = RttMapping({"src": 0, "é-source": 1_500, "a\"b": -700}, error_bound_us=3)
    mergers = [cast(skewless_native.MultiSourceMerger,
                    native_merger("s1", clock, MergerConfig(), lambda _source, _now: 1_000_000)) for _ in range(2)]
    builders = [builder(MERGED_MAX_RECORD_BYTES), builder(MERGED_MAX_RECORD_BYTES)]
    now = 1_000_000
    for source in ("src", "é-source", "a\"b"):
        assert mergers[0].register(source, now) == mergers[1].register(source, now)
    seqs = {"src": 0, "é-source": 0, "a\"b": 0}
    for _ in range(data.draw(st.integers(1, 10))):
        now += data.draw(st.sampled_from([10, 1_000, 2_000_000]))
        source = data.draw(st.sampled_from(sorted(seqs)))
        run = []
        for _ in range(data.draw(st.integers(1, 6))):
            stamp = now - data.draw(st.sampled_from([500, 400, 300, 2]))
            payload = data.draw(st.one_of(st.integers(0, 9), payloads))
            interval = data.draw(st.sampled_from([None] * 6 + [AtomicInterval(stamp - 5)]))
            event = SourceEvent(source, "s1", seqs[source], stamp, payload, interval)
            seqs[source] += 1
            run.append((event, now, clock.to_reference(source, stamp)))
        fused = mergers[0].push_run_built(source, run, now, builders[0], clock)
        merged = cast(list[MergeOutput], mergers[1].push_run(source, run, now))  # built by the record classes
        built = builders[1].build_merged(merged, run, clock)
        assert fused == built


# -- Produce and DeliveryRef built without their Python __init__ (native/src/records/slots.rs) ------------------


def one_record() -> PublishRecord:
    return PublishRecord(EventRecord("s1", "src", 3, 10, 2_000_000, 5, 2_000_100, 2_000_200, False, 1), "events")


def test_the_gateway_actions_are_built_directly_and_equal_the_called_ones() -> None:
    built = builder()
    assert cast(Any, built).builds_actions_directly
    (produced,), _ = built.produce_records([one_record()])
    assert type(produced) is Produce and type(produced.delivery) is DeliveryRef
    assert produced == specified(one_record())
    # Every field readable and each a reference of its own (the instance holds what __init__ would store).
    assert (produced.topic, produced.key, produced.delivery.seq, produced.delivery.topic) == ("t.s1", b"src", 3,
                                                                                              "events")
    # Off the cyclic collector's lists (they cannot close a cycle; records/slots.rs, `untracked`), unlike the
    # called ones, and freed by reference counting alone, the collector off.
    assert not gc.is_tracked(produced) and not gc.is_tracked(produced.delivery)
    assert gc.is_tracked(Produce("t", b"k", b"v", None)) and gc.is_tracked(DeliveryRef("a", "s", 1, "events", 2))
    value, delivery = produced.value, produced.delivery
    before = sys.getrefcount(value), sys.getrefcount(delivery)
    gc.disable()
    try:
        del produced
        assert (sys.getrefcount(value), sys.getrefcount(delivery)) == (before[0] - 1, before[1] - 1)
    finally:
        gc.enable()


@dataclass(slots=True)
class CheckedDeliveryRef:
    """A DeliveryRef whose __init__ must run: the builder has to call it."""

    source_id: str
    stream: str
    seq: int
    topic: str
    released_us: int

    def __post_init__(self) -> None:
        self.seq = -self.seq


@dataclass
class DictProduce:
    """No slots: the builder has to call it."""

    topic: str
    key: bytes
    value: bytes
    delivery: Any
    timestamp_ms: int = 0
    headers: Any = None


@dataclass(frozen=True, slots=True)
class FrozenDeliveryRef:
    """Frozen: the probe's stores are refused, so the builder has to call it."""

    source_id: str
    stream: str
    seq: int
    topic: str
    released_us: int


@pytest.mark.parametrize("classes", [(Produce, CheckedDeliveryRef), (DictProduce, DeliveryRef),
                                     (Produce, FrozenDeliveryRef)])
def test_classes_that_need_their_init_are_called(classes: tuple[type, type]) -> None:
    produce_class, delivery_class = classes
    built = cast(Any, skewless_native.RecordBuilder(produce=(
        PublishRecord, RejectedPayload, produce_class, delivery_class, GIVEN_UP_LATE_REASONS, Merged, SourceEvent)))
    built.publish_to(dict(TOPICS), MAX_RECORD_BYTES)
    assert not built.builds_actions_directly
    (produced,), _ = built.produce_records([one_record()])
    expected = cast(Produce, specified(one_record()))
    assert produced == produce_class(expected.topic, expected.key, expected.value,
                                     delivery_class("src", "s1", 3, "events", 2_000_200), expected.timestamp_ms,
                                     expected.headers)


class RefusedSubclass(RejectedPayload):
    """Not exactly a RejectedPayload: ``type(payload) is RejectedPayload`` is false for it, in both."""


@dataclass
class EventStandIn:
    """Not an IncomingEvent: its payload is read by getattr."""

    payload: Any


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([1, None, {"a": [1]}, "x", RejectedPayload("why"), RefusedSubclass("sub")]),
                max_size=12),
       st.booleans(), st.booleans())
def test_any_payload_of_class_is_the_generator(payloads: list[Any], as_list: bool, stand_ins: bool) -> None:
    """``RecordBuilder.any_payload_of_class`` against ``IngestCore.events_received``'s own check of a frame."""
    events: Any = [EventStandIn(p) if stand_ins else IncomingEvent("s", i, 5, p) for i, p in enumerate(payloads)]
    events = events if as_list else tuple(events)
    expected = any(type(event.payload) is RejectedPayload for event in events)
    assert builder().any_payload_of_class(events, RejectedPayload) is expected
    if not stand_ins:  # the frame the native decoder hands (native/src/frame.rs), its payloads read natively
        frame = skewless_native.EventFrame(events)
        assert builder().any_payload_of_class(frame, RejectedPayload) is expected and frame.made == 0
