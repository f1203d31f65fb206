"""The results sink's records from a real Spark DataFrame (spark_jobs.results_sink.batch_records: the JVM casts
to binary, Arrow carries the batch): exactly the UTF-8 bytes, every row once, the same records the Row-collecting
sink made from the same frame."""

from __future__ import annotations

from typing import Any

import pytest

from spark_jobs.results_sink import batch_records

pytestmark = [pytest.mark.integration, pytest.mark.spark]


def test_records_of_a_frame_over_several_partitions(spark: Any) -> None:
    texts = ["a|match|7", "s\u00e9nsor", "\u6e29\u5ea6", "\U0001f600", "", '{"stream":"\u00e9","n":1}']
    rows = [(f"{texts[i % 6]}#{i}", texts[(i + 1) % 6]) for i in range(3_000)] + [("k", None), (None, "v")]
    frame = spark.createDataFrame(rows, "key string, value string").repartition(3)
    records = batch_records(frame)
    def utf8(text: str | None) -> bytes | None:
        return None if text is None else text.encode()

    def order(record: tuple[bytes | None, bytes | None]) -> tuple[bytes, bytes]:
        return (record[0] or b"", record[1] or b"")

    collected = [(utf8(row["key"]), utf8(row["value"])) for row in frame.collect()]
    assert sorted(records, key=order) == sorted(collected, key=order)
    expected = [(utf8(k), utf8(v)) for k, v in rows]
    assert sorted(records, key=order) == sorted(expected, key=order)
    assert len(records) == len(expected) == 3_002
    assert (b"\xf0\x9f\x98\x80#3", b"") in records
    assert (b"k", None) in records and (None, b"v") in records


def test_an_empty_frame_has_no_records(spark: Any) -> None:
    assert batch_records(spark.createDataFrame([], "key string, value string")) == []
