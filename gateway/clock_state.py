"""Per-source clock state <-> the clock records of the compacted sources topic (contract.records.ClockRecord)."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from contract.records import ClockRecord, RecordError, decode_record
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfo


def clock_state_record(info: SourceInfo, now_us: int, t_a_us: int) -> ClockRecord:
    """The source's clock as the gateway knows it now; ``estimate`` is complete so that a restarted gateway maps
    this source's timestamps before it syncs again."""
    return ClockRecord(
        source_id=info.source_id, offset_us=info.offset_us, rtt_us=info.rtt_us, skew_ppm=info.skew_ppm,
        error_bound_us=info.error_bound_us(now_us), last_sync_us=info.last_sync_us,
        sample_count=info.sample_count, t_a_us=t_a_us, updated_us=now_us, estimate=asdict(info.estimate))


_ESTIMATE_FIELDS = {f.name: f.type for f in fields(ClockEstimate)}


def estimate_from_record(record: bytes | dict[str, Any]) -> tuple[str, ClockEstimate, int] | None:
    """(source_id, estimate, last_sync_us) from a sources-topic record; None for records that are not a clock state
    or carry no full estimate (older gateways, hand-written records, progress checkpoints)."""
    try:
        decoded = decode_record(record)
    except RecordError:
        return None
    if not isinstance(decoded, ClockRecord) or decoded.estimate is None:
        return None
    raw = decoded.estimate
    if set(raw) != set(_ESTIMATE_FIELDS):
        return None
    values: dict[str, Any] = {name: (float(v) if _ESTIMATE_FIELDS[name] in ("float", float) else int(v))
                              for name, v in raw.items()}
    return decoded.source_id, ClockEstimate(**values), decoded.last_sync_us
