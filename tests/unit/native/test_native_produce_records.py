"""``RecordBuilder.produce_records`` (native/src/records.rs) against its specification, the Python ``_publish_one``
path of gateway/ingest.py for a plain event record: the same Produce (topic, key, value bytes, DeliveryRef, Kafka
timestamp, headers) for each record it takes, and every other output handed back in its place, itself."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.records import EventRecord, event_headers, kafka_timestamp_ms
from contract.wire.messages import RejectedPayload
from gateway.ingest import GIVEN_UP_LATE_REASONS, DeliveryRef, Produce
from gateway.native import native_record_builder
from reorder.pipeline import PipelineOutput, PublishPunctuation, PublishRecord, PublishRefused
from tests.unit.native.test_native_records import event_records, json_values, odd_values

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


def specified(output: PipelineOutput) -> Any:
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
    if len(value) > MAX_RECORD_BYTES:
        return output
    return Produce(topic, record.key, value,
                   DeliveryRef(record.source_id, record.stream, record.seq, kind, record.release_ts_us),
                   kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us), event_headers(record.source_id, kind))


@settings(max_examples=400, deadline=None)
@given(st.lists(outputs, max_size=8))
def test_produce_records_gives_the_python_produce_or_hands_the_output_back(batch: list[PipelineOutput]) -> None:
    produced, handed_back = native_record_builder().produce_records(batch, dict(TOPICS), MAX_RECORD_BYTES)
    expected = [specified(output) for output in batch]
    assert produced == expected
    assert [item is output for item, output in zip(produced, batch, strict=True)] == [
        item is output for item, output in zip(expected, batch, strict=True)]
    assert handed_back == sum(item is output for item, output in zip(expected, batch, strict=True))


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
    produced, handed_back = native_record_builder().produce_records(batch, dict(TOPICS), MAX_RECORD_BYTES)
    assert handed_back == 6
    assert produced[1:6] == batch[1:6] and produced[7] is batch[7]
    assert produced[0] == Produce(
        "t.s1", b"src", record().to_json(), DeliveryRef("src", "s1", 3, "events", 2_000_200), 2_000,
        event_headers("src", "events"))
    assert produced[6] == Produce(
        "t.s1.late", b"src", record(late_reason="after_punctuation").to_json(),
        DeliveryRef("src", "s1", 3, "late", 2_000_200), 2_000, event_headers("src", "late"))
