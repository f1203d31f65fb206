"""The key-group routing stage (spark_jobs.key_routing): canonical key texts, Spark's string-to-double verdicts, the
keys of a record, and the rows the stage emits (punctuations once per group)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from cep.key_groups import key_group
from spark_jobs.key_routing import (
    KEY_GROUP,
    KeyGroups,
    PayloadKey,
    ReadingsBySource,
    TypedKey,
    canonical_key_text,
    record_key_groups,
    route_record_batches,
    spark_double,
)

EVENTS = "p.events."


@pytest.mark.parametrize(("text", "number"), [
    ("1", 1.0), (" 2 ", 2.0), ("\t3\n", 3.0), ("+4", 4.0), ("-5.5", -5.5), ("1e3", 1000.0), ("1.E2", 100.0),
    (".5", 0.5), ("5.", 5.0), ("1d", 1.0), ("2F", 2.0), ("0x1p3", 8.0), ("-0X.8P1", -1.0), ("0x1p99999", math.inf),
    ("NaN", math.nan), ("-Infinity", -math.inf), ("inf", math.inf), ("+INF", math.inf), ("Infinity", math.inf),
    ("-infinity", -math.inf), (" nan ", math.nan), ("1e400", math.inf), ("007", 7.0),
    ("x", None), ("", None), (".", None), ("1e", None), ("1_0", None), ("1dd", None), ("0x1", None), ("NaNd", None),
    ("\u0661", None), ("true", None), ("1 2", None), ("infinit", None),
])
def test_a_string_reads_as_a_double_where_sparks_cast_reads_it(text: str, number: float | None) -> None:
    got = spark_double(text)
    if number is None or got is None:
        assert got is number
    elif math.isnan(number):
        assert math.isnan(got)
    else:
        assert got == number


@pytest.mark.parametrize(("value", "canonical"), [
    (None, ""), (1, "1.0"), (1.0, "1.0"), (True, "1.0"), (False, "0.0"), ("true", "1.0"), ("false", "0.0"),
    ("1", "1.0"), ("007", "7.0"), ("1e0", "1.0"), (-0.0, "0.0"), ("-0.0", "0.0"), (0, "0.0"), (1e20, "1.0E20"),
    (0.001, "0.001"), (1e-4, "1.0E-4"), (1234567.0, "1234567.0"), (1e7, "1.0E7"), (2 ** 70, "1.1805916207174113E21"),
    (10 ** 400, "Infinity"), (-(10 ** 400), "-Infinity"), ("NaN", "NaN"), ("inf", "Infinity"), (" 2 ", "2.0"),
    ("x", "x"), ("", ""), ("True", "True"), ({"a": 1.5, "b": [1, "x"]}, '{"a":1.5,"b":[1,"x"]}'), ([1e20], "[1.0E20]"),
])
def test_a_key_routes_by_the_canonical_text_of_the_jvm_routing(value: Any, canonical: str) -> None:
    assert canonical_key_text(value) == canonical


@given(st.integers(min_value=-(2 ** 80), max_value=2 ** 80))
def test_python_equal_numbers_have_one_canonical_text(number: int) -> None:
    as_float = float(number)
    if as_float == number:
        assert canonical_key_text(number) == canonical_key_text(as_float)
    assert canonical_key_text(number) == canonical_key_text(str(number))


def _value(payload: Any, **fields: Any) -> bytes:
    return orjson.dumps({"kind": "event", "stream": "s", "ref_ts_us": 5, "payload": payload, **fields})


def test_a_typed_key_reads_the_attribute_of_the_events_type() -> None:
    key = TypedKey("type", {"A": "id", "B": "tag"}, otherwise="id")
    records = [orjson.loads(_value(p)) for p in (
        {"type": "A", "id": 7, "tag": 1}, {"type": "B", "id": 7, "tag": 1}, {"type": "Z", "id": 3},
        {"id": 4}, '{"type": "B", "tag": "x"}', "not json", None, [1], {"type": ["A"], "id": 2})]
    assert [key.key_of(r) for r in records] == [7, 1, 3, 4, "x", None, None, None, 2]
    assert TypedKey("type", {"A": "id"}).key_of(records[2]) is None


def test_a_payload_key_follows_its_path() -> None:
    key = PayloadKey(("a", "b"))
    payloads = [{"a": {"b": 1}}, {"a": 5}, {"b": 1}, '{"a": {"b": "t"}}', None]
    assert [key.key_of(orjson.loads(_value(p))) for p in payloads] == [1, None, None, "t", None]


def test_a_reading_goes_by_its_source_and_anything_else_by_its_event_key() -> None:
    key = ReadingsBySource("temp", TypedKey("type", {"HIGH": "source"}))

    def key_of(payload: Any, **fields: Any) -> Any:
        return key.key_of(orjson.loads(_value(payload, source_id="t1", **fields)))

    assert key_of({"temp": 70.5}) == "t1"
    assert key_of({"temp": "71"}) == "t1"  # Spark's cast reads the string; the core rejects it, in either group
    assert key_of({"temp": 70, "type": "HIGH", "source": "t9"}, start_ts_us=5) == "t1"
    assert key_of({"temp": True, "type": "HIGH", "source": "t9"}) == "t9"
    assert key_of({"temp": "warm", "type": "HIGH", "source": "t9"}) == "t9"
    assert key_of({"temp": 70, "type": "HIGH", "source": "t9"}, start_ts_us=1) == "t9"  # an interval
    assert key_of({"temp": 70, "type": "HIGH", "source": "t9"}, endpoint="end") == "t9"
    assert key_of({"type": "HIGH", "source": "t9"}) == "t9"


def test_the_stage_sends_a_streams_punctuation_to_every_group_and_each_event_to_its_keys() -> None:
    groups = KeyGroups(3, PayloadKey(("id",)))
    punctuation = orjson.dumps({"kind": "punctuation", "stream": "s", "watermark_us": 9, "partition": 0})
    values = [_value({"id": 1}), punctuation, punctuation, b"{not json", _value({"id": "x"}), punctuation]
    streams = ["s", "s", "s", "s", "s", None]
    topics = ["p.events.s", "p.events.s", "p.late.s", "p.events.s", "p.late.s", "q.events.s"]
    rows, row_groups = record_key_groups(values, streams, topics, groups, EVENTS)
    # Only the punctuation of the stream's events topic is replicated: one on its late topic or another topic's is
    # a record like any other (reported once, by the group it lands in).
    assert rows == [0, 1, 1, 1, 2, 3, 4, 5]
    assert row_groups == [key_group("1.0", 3), 0, 1, 2, key_group("", 3), key_group("", 3), key_group("x", 3),
                          key_group("", 3)]


def test_the_arrow_stage_keeps_every_column_and_adds_the_key_group() -> None:
    punctuation = orjson.dumps({"kind": "punctuation", "stream": "s", "watermark_us": 9, "partition": 0})
    batch = pa.RecordBatch.from_pydict({
        "stream": ["s", "s", None], "value": pa.array([_value({"id": 2}), punctuation, None], pa.binary()),
        "topic": ["p.events.s", "p.events.s", "q"], "partition": pa.array([0, 1, 0], pa.int32()),
        "offset": pa.array([10, 11, 3], pa.int64())})
    out = list(route_record_batches([batch], KeyGroups(2, PayloadKey(("id",))), EVENTS))
    assert len(out) == 1
    assert out[0].to_pydict() == {
        "stream": ["s", "s", "s", None], "value": [_value({"id": 2}), punctuation, punctuation, None],
        "topic": ["p.events.s", "p.events.s", "p.events.s", "q"], "partition": [0, 1, 1, 0],
        "offset": [10, 11, 11, 3], KEY_GROUP: [key_group("2.0", 2), 0, 1, key_group("", 2)]}
    assert out[0].schema.field(KEY_GROUP).type == pa.int32()
