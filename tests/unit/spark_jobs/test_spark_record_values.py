"""The state function fed raw Kafka values (parsed in the worker) against the same function fed the contract columns
Spark's ``from_json`` gave before: every job's records and state are the same, non-records are reported the same,
and a record whose stream is not its topic's is reported, never fed."""

from typing import Any

import orjson

from contract.records import RESULT_REJECTED
from spark_jobs.stateful import KAFKA_COLUMNS, UNPARSED_GROUP, LiveCores, make_stream_function
from tests.unit.spark_jobs.test_spark_job_cores import BASE, mixed_stream_batches

LATENESS_US = 2_000_000
PATTERN = "SEQ(a: k == 'A', b: k == 'B') PARTITION BY id WITHIN 30 ms MODE per_event MAX_UNCERTAINTY 1 ms"
SEQUENCE = "EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 100 ms"
ISEQ = "EVENT ISEQ[a.te < b.ts AND b.te < c.ts](A a, B b, C c; 100 ms) WHERE a.id = b.id AND b.id = c.id"


class GroupState:
    def __init__(self) -> None:
        self.exists = False
        self.get: tuple[bytes] | None = None

    def update(self, value: tuple[bytes]) -> None:
        self.exists, self.get = True, value


def jobs() -> dict[str, tuple[tuple[str, ...], Any]]:
    """job -> (the columns it parses from each value, its core factory)."""
    from cep.intervals import parse_iseq
    from cep.patterns import PatternSpec
    from cep.sase import EngineConfig, parse_query
    from spark_jobs import iseq, pattern, sequence, three_window, window_count

    spec, query = PatternSpec.parse(PATTERN), parse_query(SEQUENCE)
    iseq_options = iseq.IseqOptions(bootstrap_servers="", query=ISEQ)
    config = EngineConfig(mode="conservative", allowed_lateness_us=LATENESS_US)
    window_columns = ("kind", "stream", "source_id", "seq", "ref_ts_us", "watermark_us", "rtt_us", "late_reason")
    return {
        "three_window": (three_window.THREE_WINDOW_COLUMNS, lambda _s, blob: three_window.ThreeWindowCore(
            "s", three_window.ThreeWindowOptions(bootstrap_servers="", width_us=100_000, max_shift_us=1_000,
                                                 allowed_lateness_us=LATENESS_US), 0, blob)),
        "window_count": (window_columns, lambda _s, blob: window_count.WindowCountCore(
            "s", window_count.WindowCountOptions(bootstrap_servers="", width_us=100_000,
                                                 allowed_lateness_us=LATENESS_US), blob)),
        "pattern": (pattern.PATTERN_COLUMNS,
                    lambda _s, blob: pattern.PatternStreamCore("s", spec, 0, False, LATENESS_US, blob)),
        "sequence": (sequence.SEQUENCE_COLUMNS,
                     lambda _s, blob: sequence.SequenceStreamCore("s", query, config, "type", blob)),
        "iseq": (iseq.ISEQ_COLUMNS, lambda _s, blob: iseq.IseqStreamCore(
            "s", parse_iseq(ISEQ), iseq.engine_config(iseq_options), iseq_options, blob)),
    }


def kafka_value(row: dict[str, Any]) -> bytes:
    """The Kafka value of a row of contract columns (its payload text as the JSON it is)."""
    record = {k: v for k, v in row.items() if k not in KAFKA_COLUMNS}
    if isinstance(record.get("payload"), str):
        record["payload"] = orjson.loads(record["payload"])
    return orjson.dumps(record)


def frame(rows: list[dict[str, Any]]) -> Any:
    import pandas as pd

    return pd.DataFrame(rows)


def outputs(function: Any, key: tuple[Any, ...], state: GroupState, rows: list[dict[str, Any]]) -> list[Any]:
    return [(k, orjson.loads(v)) for out in function(key, iter([frame(rows)]), state)
            for k, v in zip(out["key"], out["value"], strict=True)]


def raw_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"value": kafka_value(row), **{c: row[c] for c in KAFKA_COLUMNS}} for row in rows]


# The trace reaches the interesting branches of each job.
EXPECTED_RECORDS = {"three_window": {"window", "final", "too_late"}, "window_count": {"window", "too_late"},
                    "pattern": {"match", RESULT_REJECTED, "too_late"},
                    "sequence": {"match", RESULT_REJECTED, "too_late"}, "iseq": {"match", RESULT_REJECTED}}


def test_raw_values_give_every_job_the_records_and_state_of_spark_s_columns() -> None:
    batches = [[{**row, "late": row["topic"] == "p.late.s", "late_reason": "x" if row["topic"] == "p.late.s"
                 else None} for row in batch] for batch in mixed_stream_batches()]
    for job, (columns, factory) in jobs().items():
        parsing = make_stream_function(job, factory, lambda _s: ("p.events.s", 1), LiveCores(),
                                       value_columns=columns)
        given = make_stream_function(job, factory, lambda _s: ("p.events.s", 1), LiveCores())
        state_raw, state_columns = GroupState(), GroupState()
        seen = []
        for batch in batches:
            by_values = outputs(parsing, ("s",), state_raw, raw_rows(batch))
            assert by_values == outputs(given, ("s",), state_columns, batch), job
            seen += by_values
        assert state_raw.get == state_columns.get, job
        assert {v["record"] for _k, v in seen} >= EXPECTED_RECORDS[job], job


def not_records() -> list[dict[str, Any]]:
    values = [b"not json", b"[1, 2]", b"", None, b'{"kind": "event", "seq": 3, "ref_ts_us": 1}', b"{'stream': 's'}"]
    return [{"value": value, "topic": "p.events.s", "partition": 0, "offset": 100 + i}
            for i, value in enumerate(values)]


def test_values_that_are_not_records_are_reported_as_spark_s_null_stream_group_did() -> None:
    _columns, factory = jobs()["sequence"]
    parsing = make_stream_function("sequence", factory, lambda _s: ("p.events.s", 1), LiveCores(),
                                   value_columns=jobs()["sequence"][0])
    by_values = outputs(parsing, ("s",), GroupState(), not_records())
    # Before: from_json's columns (all null but what parsed: seq 3 of the record without a stream) in the group of
    # rows without a stream.
    spark_rows = [{"kind": None, "stream": None, "seq": None, "source_id": None, "ref_ts_us": None,
                   **{c: row[c] for c in KAFKA_COLUMNS}} for row in not_records()]
    spark_rows[4].update(kind="event", seq=3, ref_ts_us=1)
    spark_rows[5].update(kind="event")  # Spark read the single-quoted record (no stream: rejected the same)
    given = make_stream_function("sequence", factory, lambda _s: ("p.events.s", 1), LiveCores())
    assert by_values == outputs(given, (UNPARSED_GROUP,), GroupState(), spark_rows)
    assert [(v["reason"], v["offset"], v["seq"]) for _k, v in by_values] == [
        ("not_a_record", 100 + i, 3 if i == 4 else None) for i in range(6)]


def test_a_record_of_another_stream_on_the_topic_is_reported_not_fed() -> None:
    _columns, factory = jobs()["window_count"]
    parsing = make_stream_function("window_count", factory, lambda _s: ("p.events.s", 1), LiveCores(),
                                   value_columns=jobs()["window_count"][0])
    record = {"kind": "event", "stream": "t", "source_id": "a", "seq": 1, "ref_ts_us": BASE}
    punctuation = {"kind": "punctuation", "stream": "t", "watermark_us": BASE + 10**9}
    rows = [{"value": orjson.dumps(r), "topic": "p.events.s", "partition": 0, "offset": i}
            for i, r in enumerate([record, punctuation])]
    by_values = outputs(parsing, ("s",), GroupState(), rows)
    assert [(k, v["reason"], v["offset"]) for k, v in by_values] == [
        ("s|rejected|p.events.s|0|0", "misplaced_record", 0), ("s|rejected|p.events.s|0|1", "misplaced_record", 1)]
    # A punctuation reaches every key group: only group 0 reports it.
    in_group_1 = make_stream_function("window_count", factory, lambda _s: ("p.events.s", 1), LiveCores(),
                                      key_groups=2, value_columns=jobs()["window_count"][0])
    assert [v["offset"] for _k, v in outputs(in_group_1, ("s", 1), GroupState(), rows)] == [0]
