"""The results sink's records from an Arrow batch (spark_jobs.results_sink.table_records): exactly the UTF-8 bytes
the Row-collecting sink wrote (``str(value).encode()``), every row once, in the batch's order."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest

from spark_jobs.results_sink import table_records

# Keys and values as a core emits them: ASCII, accented, CJK, emoji (4 bytes in UTF-8), empty, a JSON value.
TEXTS = ["a|match|7", "s\u00e9nsor", "\u6e29\u5ea6", "\U0001f600", "", '{"job":"pattern","stream":"\u00e9"}']


def old_records(keys: Sequence[str | None], values: Sequence[str | None]) -> list[tuple[bytes, bytes]]:
    """What the sink wrote when it collected Rows."""
    return [(str(k).encode(), str(v).encode()) for k, v in zip(keys, values, strict=True)]


@pytest.mark.parametrize("column_type", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_exact_utf8_bytes_of_each_text(column_type: pa.DataType) -> None:
    keys = TEXTS
    values = list(reversed(TEXTS))

    def column(texts: list[str]) -> pa.Array:
        if pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type):
            return pa.array([t.encode() for t in texts], column_type)
        return pa.array(texts, column_type)

    table = pa.table({"key": column(keys), "value": column(values)})
    assert table_records(table) == [
        (b"a|match|7", b'{"job":"pattern","stream":"\xc3\xa9"}'),
        (b"s\xc3\xa9nsor", b""),
        (b"\xe6\xb8\xa9\xe5\xba\xa6", b"\xf0\x9f\x98\x80"),
        (b"\xf0\x9f\x98\x80", b"\xe6\xb8\xa9\xe5\xba\xa6"),
        (b"", b"s\xc3\xa9nsor"),
        (b'{"job":"pattern","stream":"\xc3\xa9"}', b"a|match|7"),
    ]
    assert table_records(table) == old_records(keys, values)


def test_every_row_once_in_order_across_chunks() -> None:
    # Spark hands a collected batch over as several record batches (one per partition): a lost, repeated or
    # reordered row, or one chunk's offsets applied to another's data, shows here.
    rows = [(f"k{i}", f"v{i}-" + "\u00e9" * (i % 5)) for i in range(2_500)]
    chunks = [rows[0:1], rows[1:1], rows[1:1000], rows[1000:2500]]
    batches = [pa.record_batch({"key": pa.array([k for k, _ in c], pa.binary()),
                                "value": pa.array([v.encode() for _, v in c], pa.binary())}) for c in chunks]
    table = pa.Table.from_batches(batches)
    assert table.column("key").num_chunks == 4
    assert table_records(table) == [(k.encode(), v.encode()) for k, v in rows]
    # A slice starts at an offset inside its buffers.
    assert table_records(table.slice(999, 3)) == [(k.encode(), v.encode()) for k, v in rows[999:1002]]


@pytest.mark.parametrize("column_type", [pa.binary(), pa.string(), pa.large_binary(), pa.large_string()])
def test_a_null_is_kafkas_null_not_a_text(column_type: pa.DataType) -> None:
    """As Spark's own Kafka sink writes it: a null key is no key, a null value a tombstone; an empty text stays
    empty bytes (the Row-collecting sink wrote a null as the text ``None``)."""
    def column(texts: list[str | None]) -> pa.Array:
        if pa.types.is_binary(column_type) or pa.types.is_large_binary(column_type):
            return pa.array([None if t is None else t.encode() for t in texts], column_type)
        return pa.array(texts, column_type)

    table = pa.table({"key": column(["k", None, ""]), "value": column([None, "\u00e9", "v"])})
    assert table_records(table) == [(b"k", None), (None, b"\xc3\xa9"), (b"", b"v")]


def test_an_empty_batch_has_no_records() -> None:
    empty = pa.table({"key": pa.array([], pa.binary()), "value": pa.array([], pa.binary())})
    assert table_records(empty) == []
    assert table_records(pa.Table.from_batches([], empty.schema)) == []
