"""The Kafka record contract (docs/record-contract.md): one JSON object per ordered or late event."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

CONTRACT_VERSION = 1


# Not frozen: a frozen dataclass pays object.__setattr__ per field, and one record is built per event.
@dataclass(slots=True)
class EventRecord:
    """An event as published by the gateway. All times are integer microseconds since the Unix epoch.

    ref_ts_us = source_ts_us + the source's estimated clock offset (and skew) at that time; uncertainty_us bounds
    |ref_ts_us - true time|. arrival_ts_us and release_ts_us are read from the gateway's reference clock.
    """

    stream: str
    source_id: str
    seq: int
    source_ts_us: int
    ref_ts_us: int
    uncertainty_us: int
    arrival_ts_us: int
    release_ts_us: int
    late: bool = False
    payload: Any = None
    late_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        value: dict[str, Any] = {
            "v": CONTRACT_VERSION,
            "kind": "event",
            "stream": self.stream,
            "source_id": self.source_id,
            "seq": self.seq,
            "source_ts_us": self.source_ts_us,
            "ref_ts_us": self.ref_ts_us,
            "uncertainty_us": self.uncertainty_us,
            "arrival_ts_us": self.arrival_ts_us,
            "release_ts_us": self.release_ts_us,
            "late": self.late,
            "payload": self.payload,
        }
        if self.late_reason is not None:
            value["late_reason"] = self.late_reason
        value.update(self.extra)
        return orjson.dumps(value)

    @property
    def key(self) -> bytes:
        return self.source_id.encode()
