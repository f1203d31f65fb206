"""The native record builder (native/src/records.rs) against its specification: contract.records' to_json (orjson)
and key, contract.records' event_headers, PUNCTUATION_HEADERS and kafka_timestamp_ms. Same records in, the same
key, value bytes, timestamp and headers out; a value orjson refuses is the same exception."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract import records as contract_records
from contract.records import (
    CONTRACT_VERSION,
    PUNCTUATION_HEADERS,
    EventRecord,
    PunctuationRecord,
    event_headers,
    kafka_timestamp_ms,
)

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(width=32),
    st.sampled_from([1e16, 1e15, 9.999999999999999e15, 1e-5, 1e-6, 9.99e-6, 1.5e-5, 0.1, -0.0, 5e-324, 1e308,
                     1113178120592002.25, 111659285584252.125]),  # ties: the even last digit
    st.integers(-(2**53), 2**53).map(lambda i: i / 4),
    st.text(max_size=10), st.sampled_from(["\x00\x1f\x7f\"\\/", "é€😀\u2028", "a" * 300]),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4),
                            st.lists(inner, max_size=3).map(tuple)),  # orjson writes tuples as arrays
    max_leaves=16,
)
# What orjson handles (or refuses) beyond the exact JSON types: the builder leaves these to orjson.
odd_values = st.one_of(
    st.integers(2**64, 2**70), st.integers(-(2**70), -(2**63) - 1),
    st.dictionaries(st.integers(0, 3), json_scalars, min_size=1, max_size=2),
    st.just("\ud800"), st.just(b"bytes"), st.just({"k": {1, 2}}),
)
times = st.integers(0, 2**63 - 1)


@st.composite
def event_records(draw: st.DrawFn, payloads: st.SearchStrategy[Any] = json_values) -> EventRecord:
    interval = draw(st.sampled_from(["point", "atomic", "endpoint"]))
    start: dict[str, Any] = {}
    if interval == "atomic":
        start = {"start_ts_us": draw(times), "start_uncertainty_us": draw(st.none() | times),
                 "source_start_ts_us": draw(st.none() | times)}
    elif interval == "endpoint":
        start = {"interval_id": draw(st.text(min_size=1, max_size=8)),
                 "endpoint": draw(st.sampled_from(["start", "end", None]))}
    return EventRecord(
        stream=draw(st.sampled_from(["s1", "doors"])), source_id=draw(st.sampled_from(["src", "é-source", "a\"b"])),
        seq=draw(times), source_ts_us=draw(times), ref_ts_us=draw(times), uncertainty_us=draw(times),
        arrival_ts_us=draw(times), release_ts_us=draw(times), late=draw(st.booleans()), payload=draw(payloads),
        late_reason=draw(st.none() | st.sampled_from(["late_after_skip", "duplicate", "é"])),
        rtt_us=draw(st.none() | times), lateness_us=draw(st.none() | times),
        extra=draw(st.sampled_from([{}, {"ref_raised_us": 7}, {"seq": 1}, {"lateness_us": 3}])), **start)


def python_built(record: EventRecord, late: bool) -> tuple[Any, ...]:
    try:
        value: Any = record.to_json()
    except (TypeError, ValueError) as exc:
        value = (type(exc).__name__, str(exc))
    return (record.key, value, kafka_timestamp_ms(record.ref_ts_us, record.release_ts_us),
            event_headers(record.source_id, "late" if late else "events"))


def native_built(records: list[EventRecord], late: list[bool]) -> list[tuple[Any, ...]]:
    built = skewless_native.RecordBuilder().build_events(records, late)
    return [(k, (type(v).__name__, str(v)) if isinstance(v, Exception) else v, ts, h) for k, v, ts, h in built]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(event_records(), st.booleans()), max_size=6))
def test_event_records_are_byte_identical(batch: list[tuple[EventRecord, bool]]) -> None:
    records, late = [r for r, _ in batch], [lt for _, lt in batch]
    assert native_built(records, late) == [python_built(r, lt) for r, lt in batch]


@settings(max_examples=200, deadline=None)
@given(st.lists(event_records(odd_values), min_size=1, max_size=3))
def test_values_orjson_refuses_or_writes_its_own_way_go_to_orjson(records: list[EventRecord]) -> None:
    late = [False] * len(records)
    builder = skewless_native.RecordBuilder()
    built = builder.build_events(records, late)
    expected = [python_built(r, False) for r in records]
    assert [(k, (type(v).__name__, str(v)) if isinstance(v, Exception) else v, ts, h)
            for k, v, ts, h in built] == expected
    assert builder.fallbacks == len(records)


@settings(max_examples=300, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True) | st.floats(width=32))
def test_floats_are_written_as_orjson_writes_them(x: float) -> None:
    record = EventRecord("s", "src", 0, 0, 0, 0, 0, 0, payload=[x, {"x": -x}])
    ((_, value, _, _),) = skewless_native.RecordBuilder().build_events([record], [False])
    assert value == record.to_json()
    assert orjson.loads(value)["payload"][0] == orjson.loads(orjson.dumps(x))


@pytest.mark.parametrize(("ref_us", "release_us"), [
    (0, 0), (-1_500, 1_000), (5_000, 1_000), (2**63 - 1, 0), (0, 2**63 - 1), (10**12, 10**12 + 10**11),
])
def test_kafka_timestamps_and_punctuations(ref_us: int, release_us: int) -> None:
    key, value, ts, headers = skewless_native.RecordBuilder().build_punctuation("s1", ref_us, release_us)
    assert (key, value, ts, headers) == (b"__punctuation__", PunctuationRecord("s1", ref_us, release_us).to_json(),
                                         kafka_timestamp_ms(ref_us, release_us), PUNCTUATION_HEADERS)


def test_the_rust_constants_are_the_python_ones() -> None:
    record = EventRecord("s", "src", 0, 0, 0, 0, 0, 0)
    ((_, value, _, _),) = skewless_native.RecordBuilder().build_events([record], [False])
    assert orjson.loads(value)["v"] == CONTRACT_VERSION
    # kafka_timestamp_ms at both of its clamps
    behind, ahead = contract_records.KAFKA_TIMESTAMP_BEHIND_US, contract_records.KAFKA_TIMESTAMP_AHEAD_US
    for ref_us in (0, 10 * behind):
        record = EventRecord("s", "src", 0, 0, ref_us, 0, 0, 5 * behind)
        ((_, _, ts, _),) = skewless_native.RecordBuilder().build_events([record], [False])
        assert ts == kafka_timestamp_ms(ref_us, 5 * behind)
        assert ts in ((5 * behind - behind) // 1000, (5 * behind + ahead) // 1000)


def test_headers_are_cached_per_source_and_topic() -> None:
    builder = skewless_native.RecordBuilder()
    record = EventRecord("s", "src", 0, 0, 0, 0, 0, 0)
    first = builder.build_events([record, record], [False, True])
    assert first[0][3] is builder.build_events([record], [False])[0][3]
    assert first[1][3] == event_headers("src", "late")


def test_mismatched_lengths_are_refused() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        skewless_native.RecordBuilder().build_events([EventRecord("s", "src", 0, 0, 0, 0, 0, 0)], [])


def test_times_beyond_64_bits_are_orjsons_error_and_no_timestamp() -> None:
    record = EventRecord("s", "src", 0, 0, 2**64, 0, 0, 0)
    ((_, value, ts, _),) = skewless_native.RecordBuilder().build_events([record], [False])
    with pytest.raises(TypeError) as expected:
        record.to_json()
    assert (type(value), str(value), ts) == (type(expected.value), str(expected.value), None)
