"""Contract records parsed in the Python worker: the columns Spark's ``from_json`` gave the cores, one parse each.

The CEP jobs used to parse every Kafka value in the JVM (``from_json`` with the whole contract schema, PERMISSIVE)
and ship the columns to Python; that parse was the JVM's largest part of a job's CPU (docs/spark-cpu-split.md).
Now the JVM groups a record by its topic's stream and ships the raw value; :func:`record_columns` parses each value once
with orjson and gives the columns a core reads, with ``from_json``'s verdict per field (a unit test compares them
on a table of values whose verdicts Spark itself gave):

* a value that is not a JSON object (not JSON, an array, a scalar, empty, null) has every column null;
* each field on its own: a ``long`` column holds a JSON integer in the 64-bit range (null otherwise: a float, a
  string, a bool, a larger integer); a ``boolean`` column ``true``/``false``; a ``string`` column a JSON string as
  it is and any other value as its JSON text (doubles as Java prints them: ``1.0E20``); a missing field or
  JSON ``null`` is null; a bad field leaves the others as they are;
* like Spark's reader (Jackson), what follows the first JSON object is ignored, ``NaN`` and ``Infinity`` are read
  (a number no long column takes; in the payload the strings ``"NaN"``/``"Infinity"``, as Spark wrote them back),
  and invalid UTF-8 reads as U+FFFD.

The ``payload`` column holds the payload as parsed (an object as a dict; a string as the string, which
:func:`spark_jobs.stateful.decode_payload` parses as Spark's text was; null as None) instead of Spark's JSON text
of it: the cores parse it either way, and the dict saves a second parse. Not followed: Spark's reader also takes
single-quoted strings; such a value is not JSON, and the shell reports it as ``not_a_record``.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import operator
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import orjson

from spark_jobs.contract import RECORD_COLUMNS

COLUMN_TYPES: dict[str, str] = dict(RECORD_COLUMNS)
"""Contract column -> its Spark type (``long``, ``string``, ``boolean``)."""
PAYLOAD = "payload"
_LONG_MIN, _LONG_MAX = -(2 ** 63), 2 ** 63 - 1
_JSON_WHITESPACE = " \t\n\r"


def _non_finite(name: str) -> str:
    # Spark (Jackson) reads NaN/Infinity as doubles and writes them back as strings inside the payload's text.
    return name


def _float_or_non_finite(text: str) -> float | str:
    value = float(text)
    return value if math.isfinite(value) else ("Infinity" if value > 0 else "-Infinity")


_LENIENT = json.JSONDecoder(parse_constant=_non_finite, parse_float=_float_or_non_finite)


def _lenient_object(value: bytes) -> Any:
    """What Spark's reader makes of a value orjson refuses (trailing text, NaN, invalid UTF-8), or None."""
    text = value.decode("utf-8", errors="replace").lstrip(_JSON_WHITESPACE)
    try:
        parsed, _end = _LENIENT.raw_decode(text)
    except ValueError:
        return None
    return parsed


def parse_record(value: bytes | None) -> dict[str, Any] | None:
    """The record's JSON object, or None when the value is not one (every column null, as ``from_json``)."""
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        parsed = _lenient_object(value)
    return parsed if isinstance(parsed, dict) else None


def java_double_text(value: float) -> str:
    """A double in the layout of Java's ``Double.toString`` (Jackson's): ``0.1``, ``100.0``, ``1.0E20``, ``1.0E-7``;
    the digits are the shortest that read back as the double (Java 19's; earlier JDKs and subnormals can differ in
    the last digits: only a rejected record's detail or a misplaced number's text shows them)."""
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    assert isinstance(exponent, int)
    text = "".join(map(str, digits))
    scientific = len(text) + exponent - 1
    if 1e-3 <= abs(value) < 1e7:
        point = len(text) + exponent
        if point <= 0:
            body = "0." + "0" * -point + text
        elif point >= len(text):
            body = text + "0" * (point - len(text)) + ".0"
        else:
            body = text[:point] + "." + text[point:]
    else:
        body = f"{text[0]}.{text[1:] or '0'}E{scientific}"
    return ("-" if sign else "") + body


def json_text(value: Any) -> str:
    """The JSON text Spark writes back for a parsed value (compact; doubles as Java prints them)."""
    if type(value) is float:
        return java_double_text(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json_text(str(k))}:{json_text(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(json_text(v) for v in value) + "]"
    return orjson.dumps(value).decode()


def _checked(raw: list[Any], kind: str) -> list[Any]:
    """A column's raw values with the column's verdict: C-level type checks first (a column of the right types, the
    common case, is kept as it is), a pass per value only when some value is not of the column's type."""
    types = set(map(type, raw))
    if kind == "long":
        if types <= _LONG_TYPES:
            present = list(filter(_is_present, raw)) if _NONE_TYPE in types else raw
            if not present or (min(present) >= _LONG_MIN and max(present) <= _LONG_MAX):
                return raw
        return [v if type(v) is int and _LONG_MIN <= v <= _LONG_MAX else None for v in raw]
    if kind == "string":
        return raw if types <= _STRING_TYPES else [v if v is None or type(v) is str else json_text(v) for v in raw]
    if kind == "boolean":
        return raw if types <= _BOOLEAN_TYPES else [v if type(v) is bool else None for v in raw]
    return raw


_NONE_TYPE = type(None)
_LONG_TYPES = frozenset((int, _NONE_TYPE))
_STRING_TYPES = frozenset((str, _NONE_TYPE))
_BOOLEAN_TYPES = frozenset((bool, _NONE_TYPE))
_is_present = functools.partial(operator.is_not, None)


def record_columns(values: Sequence[bytes | None], names: Sequence[str]) -> dict[str, list[Any]]:
    """The contract columns ``names`` of the Kafka values, each value parsed once (the module docstring)."""
    empty: dict[str, Any] = {}
    records = [parse_record(value) or empty for value in values]
    return {name: _checked(list(map(dict.get, records, itertools.repeat(name))),
                           "payload" if name == PAYLOAD else COLUMN_TYPES[name]) for name in names}
