"""The production key-group routing (spark_jobs.key_routing) applied to the contract rows the unit tests build."""

from __future__ import annotations

import contextlib
from typing import Any

import orjson

from spark_jobs.key_routing import KeyGroups, record_key_groups


def raw_value(row: dict[str, Any]) -> bytes:
    """The Kafka value of a row whose payload is JSON text (as Spark's column was): the payload as an object, or
    the text as a string where it is not JSON."""
    payload = row.get("payload")
    if isinstance(payload, str):
        with contextlib.suppress(orjson.JSONDecodeError):
            payload = orjson.loads(payload)
    record = {k: v for k, v in row.items() if k not in ("topic", "partition", "offset")}
    return orjson.dumps({**record, "payload": payload})


def routed_group(row: dict[str, Any], key_groups: KeyGroups) -> int:
    """The key group the routing stage gives an event row."""
    rows, groups = record_key_groups([raw_value(row)], [row.get("stream")], [row.get("topic")], key_groups, "")
    assert rows == [0]
    return groups[0]
