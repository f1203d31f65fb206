"""Key-group routing in the Python worker, before the shuffle: no JSON parse in the JVM for G > 1.

A job with key groups (docs/spark-jobs.md, "Key groups") runs a first stage, ``mapInArrow`` over the raw Kafka
records (:func:`route_record_batches`), that parses each value once with orjson (:func:`spark_jobs.record_columns.
parse_record`, the same verdicts the state function's parse gives), finds the event's key (:class:`PayloadKey`,
:class:`TypedKey`, :class:`ReadingsBySource`), and adds the column ``key_group``; a punctuation of the stream's
events topic is emitted once per group. Spark then groups by (stream, key group) as before.

The group is the one the JVM routing of the builds before gave (``pmod(crc32(canonical text), G)``), so a
checkpoint made by them keeps its keys in their groups: :func:`canonical_key_text` is the text that routing made
of the key's JSON text (a number, a numeric string and ``true``/``false`` by Spark's double and Java's text of it,
any other value by its text, no key ``""``; an integration test compares both on a table of texts). Equal keys
(the engines compare them as Python values, ``1 == 1.0 == True``) always share a group; a few unequal ones
(``"1"`` and ``1``) do too, which is harmless.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from cep.key_groups import key_group
from contract.records import PUNCTUATION
from spark_jobs.record_columns import java_double_text, json_text, parse_record

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["KEY_GROUP", "KeyGroups", "PayloadKey", "ReadingsBySource", "TypedKey", "canonical_key_text",
           "record_key_groups", "route_record_batches", "spark_double"]

KEY_GROUP = "key_group"
"""The column the routing stage adds (an int in ``[0, G)``)."""
_LONG_MIN, _LONG_MAX = -(2 ** 63), 2 ** 63 - 1

# java.lang.Double.parseDouble's grammar (after String.trim: every char <= U+0020 off both ends), which Spark's
# cast of a string to double uses first; ASCII digits only.
_JAVA_DECIMAL = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)")
_JAVA_HEX = re.compile(r"([+-]?)0[xX]((?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)[pP][+-]?[0-9]+)[fFdD]?")
# Spark's fallback when parseDouble refuses (Cast.processFloatingPointSpecialLiterals), on the trimmed lower case.
_SPARK_SPECIAL = {"inf": math.inf, "+inf": math.inf, "infinity": math.inf, "+infinity": math.inf,
                  "-inf": -math.inf, "-infinity": -math.inf, "nan": math.nan}
_JAVA_TRIMMED = "".join(map(chr, range(0x21)))


def spark_double(text: str) -> float | None:
    """What Spark's ``try_cast(text as double)`` gives: Java's ``Double.parseDouble`` (decimal or hexadecimal, an
    ``f``/``d`` suffix, ``NaN``, ``Infinity``), then Spark's literals ``inf``, ``infinity``, ``nan`` in any case;
    None where both refuse."""
    trimmed = text.strip(_JAVA_TRIMMED)
    if _JAVA_DECIMAL.fullmatch(trimmed):
        # One suffix at most, after digits (NaN and Infinity take none): Python's float reads the rest alike.
        return float(trimmed.rstrip("fFdD").replace("Infinity", "inf"))
    hexadecimal = _JAVA_HEX.fullmatch(trimmed)
    if hexadecimal:
        try:
            magnitude = float.fromhex(hexadecimal.group(2))
        except OverflowError:
            magnitude = math.inf
        return -magnitude if hexadecimal.group(1) == "-" else magnitude
    return _SPARK_SPECIAL.get(trimmed.lower())


def _double_text(number: float) -> str:
    """Spark's ``cast(number + 0.0 as string)``: Java's ``Double.toString``, ``-0.0`` as ``0.0``."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "Infinity" if number > 0 else "-Infinity"
    return java_double_text(number + 0.0)


def canonical_key_text(value: Any) -> str:
    """The text a key routes by (:func:`cep.key_groups.key_group`): the JVM routing's canonical text of the key's
    JSON text (a string as it is, any other value as its JSON text): ``true``/``false`` as ``1``/``0``, then
    whatever Spark reads as a double by Java's text of that double plus 0.0, anything else by its text, no key
    (None) as ``""``."""
    if value is None:
        return ""
    kind = type(value)
    if kind is bool:
        return "1.0" if value else "0.0"
    if kind is int:
        try:
            return _double_text(float(value))
        except OverflowError:
            return "Infinity" if value > 0 else "-Infinity"
    if kind is float:
        return _double_text(value)
    if kind is str:
        number = 1.0 if value == "true" else 0.0 if value == "false" else spark_double(value)
        return value if number is None else _double_text(number)
    return json_text(value)


def _payload(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """The record's payload as an object: as parsed, or a string holding one (as Spark's ``get_json_object`` read
    the payload's text), else None."""
    payload = record.get("payload")
    if type(payload) is dict:
        return payload
    if isinstance(payload, str):
        try:
            parsed = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return parsed if isinstance(parsed, dict) else None
    return None


def _path_value(payload: Mapping[str, Any] | None, path: Sequence[str]) -> Any:
    value: Any = payload
    for name in path:
        if type(value) is not dict:
            return None
        value = value.get(name)
    return value


def _text(value: Any) -> str | None:
    """A contract ``string`` column's verdict on a value: a string as it is, any other value as its JSON text."""
    return value if value is None or type(value) is str else json_text(value)


@dataclass(frozen=True)
class PayloadKey:
    """The key is the payload field at ``path`` (a pattern's ``PARTITION BY``)."""

    path: tuple[str, ...]

    def key_of(self, record: Mapping[str, Any]) -> Any:
        return _path_value(_payload(record), self.path)


@dataclass(frozen=True)
class TypedKey:
    """The key is the payload attribute that the event's type (payload field ``type_field``) names: a query's
    equality class (``attribute_of_type``); ``otherwise``: the attribute of a type the class does not name (None:
    such an event has no key)."""

    type_field: str
    attribute_of_type: Mapping[str, str]
    otherwise: str | None = None

    def key_of(self, record: Mapping[str, Any]) -> Any:
        payload = _payload(record)
        if payload is None:
            return None
        attribute = self.attribute_of_type.get(_text(payload.get(self.type_field)) or "", self.otherwise)
        return None if attribute is None else payload.get(attribute)


def _long(value: Any) -> int | None:
    """A contract ``long`` column's verdict: a JSON integer in the 64-bit range, else None."""
    return value if type(value) is int and _LONG_MIN <= value <= _LONG_MAX else None


def _reads_as_double(value: Any) -> bool:
    if type(value) is int or type(value) is float:
        return True
    text = _text(value)
    return text is not None and spark_double(text) is not None


@dataclass(frozen=True)
class ReadingsBySource:
    """The iseq job with ``--from-points``: a reading (a point event, not an endpoint, whose payload field
    ``value_field`` Spark reads as a double) is keyed by its ``source_id``, any other event by ``events``."""

    value_field: str
    events: TypedKey

    def key_of(self, record: Mapping[str, Any]) -> Any:
        ref_ts_us = _long(record.get("ref_ts_us"))
        start_ts_us = _long(record.get("start_ts_us"))
        if (record.get("endpoint") is None and ref_ts_us is not None
                and (ref_ts_us if start_ts_us is None else start_ts_us) == ref_ts_us
                and _reads_as_double(_path_value(_payload(record), (self.value_field,)))):
            return record.get("source_id")
        return self.events.key_of(record)


@dataclass(frozen=True)
class KeyGroups:
    """How a job spreads each stream over key groups (:func:`spark_jobs.stateful.apply_stream_cores`)."""

    groups: int
    """G: key groups per stream."""
    key: PayloadKey | TypedKey | ReadingsBySource
    """Where an event's key is in its record."""


def record_key_groups(values: Sequence[bytes | None], streams: Sequence[str | None], topics: Sequence[str | None],
                      key_groups: KeyGroups, events_topic_prefix: str) -> tuple[list[int], list[int]]:
    """For each record (its raw value, the stream of its topic, its topic): the rows to emit (indices into the
    records) and each row's key group. A punctuation on its stream's events topic is emitted once per group, so
    every group sees the stream's whole promise; every other record once, in the group of its key (a record
    that is not a JSON object, or has no key: the group of ``""``)."""
    groups = key_groups.groups
    key_of = key_groups.key.key_of
    every_group = list(range(groups))
    no_key_group = key_group("", groups)
    # Python-equal keys (1 == 1.0 == True) have one canonical text, so a key's group is memoised by its value.
    group_of_key: dict[Any, int] = {}
    rows: list[int] = []
    row_groups: list[int] = []
    for index, (value, stream, topic) in enumerate(zip(values, streams, topics, strict=True)):
        record = parse_record(value)
        if record is None:
            rows.append(index)
            row_groups.append(no_key_group)
        elif (record.get("kind") == PUNCTUATION and stream is not None
              and topic == events_topic_prefix + stream):
            rows.extend([index] * groups)
            row_groups.extend(every_group)
        else:
            rows.append(index)
            key = key_of(record)
            if type(key) not in _SCALARS:
                row_groups.append(key_group(canonical_key_text(key), groups))
                continue
            group = group_of_key.get(key)
            if group is None:
                group = group_of_key[key] = key_group(canonical_key_text(key), groups)
            row_groups.append(group)
    return rows, row_groups


_SCALARS = frozenset((str, int, float, bool, type(None)))


def route_record_batches(batches: Iterable[pa.RecordBatch], key_groups: KeyGroups, events_topic_prefix: str,
                         value_column: str = "value") -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function of the routing stage: each batch of records (columns ``value_column``,
    ``stream``, ``topic`` and any others) with the column :data:`KEY_GROUP` added, punctuations replicated
    (:func:`record_key_groups`)."""
    import pyarrow as pa

    def column(batch: pa.RecordBatch, name: str) -> list[Any]:
        # Through numpy: to_pylist makes an Arrow scalar per value first, 15x slower (nulls come as None either way).
        values: list[Any] = batch.column(name).to_numpy(zero_copy_only=False).tolist()
        return values

    for batch in batches:
        rows, row_groups = record_key_groups(column(batch, value_column), column(batch, "stream"),
                                             column(batch, "topic"), key_groups, events_topic_prefix)
        routed = batch if len(rows) == batch.num_rows else batch.take(pa.array(rows, pa.int64()))
        yield routed.append_column(KEY_GROUP, pa.array(row_groups, pa.int32()))
