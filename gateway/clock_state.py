"""The per-source clock state records of the compacted sources topic."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

import orjson

from contract.records import CONTRACT_VERSION
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo


def clock_state_record(info: SourceInfo, now_us: int, t_a_us: int) -> bytes:
    """Value of a `<prefix>.sources` record (key: source_id): the source's clock as the gateway knows it now."""
    return orjson.dumps({
        "v": CONTRACT_VERSION,
        "kind": "clock",
        "source_id": info.source_id,
        "offset_us": info.offset_us,
        "rtt_us": info.rtt_us,
        "skew_ppm": info.skew_ppm,
        "error_bound_us": info.error_bound_us(now_us),
        "last_sync_us": info.last_sync_us,
        "sample_count": info.sample_count,
        "t_a_us": t_a_us,
        "updated_us": now_us,
        # The whole estimate, so a restarted gateway maps this source's timestamps before it syncs again.
        "estimate": asdict(info.estimate),
    })


_ESTIMATE_FIELDS = {f.name: f.type for f in fields(ClockEstimate)}


def estimate_from_record(record: dict[str, Any]) -> tuple[str, ClockEstimate, int] | None:
    """(source_id, estimate, last_sync_us) from a sources-topic clock record; None for records that are not a
    clock state or carry no full estimate (older gateways, hand-written records)."""
    raw = record.get("estimate")
    if record.get("kind") != "clock" or not isinstance(raw, dict) or set(raw) != set(_ESTIMATE_FIELDS):
        return None
    source_id, last_sync_us = record.get("source_id"), record.get("last_sync_us")
    if not isinstance(source_id, str) or not isinstance(last_sync_us, int):
        return None
    if not all(isinstance(value, int | float) and not isinstance(value, bool) for value in raw.values()):
        return None
    values: dict[str, Any] = {name: (float(v) if _ESTIMATE_FIELDS[name] in ("float", float) else int(v))
                              for name, v in raw.items()}
    return source_id, ClockEstimate(**values), last_sync_us
