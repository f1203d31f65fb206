"""The Kafka record contract (docs/record-contract.md is its twin): every record kind, encoded and decoded here.

Events topics carry ``event`` and ``punctuation`` records, late topics ``event`` records with a reason, the
compacted sources topic ``clock`` records (key: source id) and ``progress`` checkpoints (key ``progress|<stream>``),
results topics one value per result with ``job`` and ``record``. All times are integer microseconds since the epoch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Literal

import orjson

CONTRACT_VERSION = 2
"""2: interval and endpoint event records carry ``start_ts_us``, ``end_ts_us``, ``start_uncertainty_us``,
``source_start_ts_us`` (and ``interval_id`` + ``endpoint`` for an endpoint event); a record without them, a point
event's or any version 1 record, means start = end."""

# The "kind" of a record on the events, late and sources topics.
EVENT = "event"
PUNCTUATION = "punctuation"
CLOCK = "clock"
PROGRESS = "progress"
# The "kind" of a record on the cluster control topic (``<prefix>.cluster``).
CLUSTER = "cluster"
OWNER = "owner"
CLUSTER_KEY = b"cluster"
OWNER_KEY = b"owner"

# Kafka record headers on every record the gateway writes (docs/record-contract.md, "Record headers"): a reader
# can route or filter by kind and source without parsing the JSON value. Values are UTF-8 bytes.
HEADER_KIND = "kind"  # EVENT, PUNCTUATION, LATE, PROGRESS, CLOCK or OWNER
HEADER_SOURCE_ID = "source_id"  # event records (events and late topics) only
HEADER_CONTRACT_VERSION = "contract_version"  # str(CONTRACT_VERSION)
# The header "kind" of an event record on a late topic (its JSON "kind" is EVENT, with "late": true).
LATE = "late"

PUNCTUATION_KEY = b"__punctuation__"
PROGRESS_KEY_PREFIX = "progress|"

Headers = tuple[tuple[str, bytes], ...]
"""A Kafka record's headers as written: (name, UTF-8 value) pairs."""
_VERSION_HEADER = (HEADER_CONTRACT_VERSION, str(CONTRACT_VERSION).encode())
PUNCTUATION_HEADERS: Headers = ((HEADER_KIND, PUNCTUATION.encode()), _VERSION_HEADER)
PROGRESS_HEADERS: Headers = ((HEADER_KIND, PROGRESS.encode()), _VERSION_HEADER)
CLOCK_HEADERS: Headers = ((HEADER_KIND, CLOCK.encode()), _VERSION_HEADER)


def event_headers(source_id: str, topic: Literal["events", "late"]) -> Headers:
    """The headers of an event record of ``source_id`` on the events or the late topic."""
    return ((HEADER_KIND, (EVENT if topic == "events" else LATE).encode()), (HEADER_SOURCE_ID, source_id.encode()),
            _VERSION_HEADER)


# A record's Kafka timestamp is its reference time (a punctuation's: its watermark), held within these bounds of its
# release. Time-based retention counts from the timestamp: an event replayed from a long-held spool (or a test's
# synthetic 1970 times) would be deleted at the broker's next retention check; and a broker bounding future
# timestamps (log.message.timestamp.after.max.ms, 1 h by default since Kafka 4.0) would refuse a runaway clock's
# record and fail the writer's transaction. Live events are well inside both bounds.
KAFKA_TIMESTAMP_BEHIND_US = 3_600_000_000
KAFKA_TIMESTAMP_AHEAD_US = 60_000_000


def kafka_timestamp_ms(ref_us: int, release_us: int) -> int:
    """The Kafka timestamp (ms) of a record with reference time ``ref_us`` released at ``release_us``."""
    return max(release_us - KAFKA_TIMESTAMP_BEHIND_US, min(ref_us, release_us + KAFKA_TIMESTAMP_AHEAD_US)) // 1000

# The range of every timestamp field of an event or punctuation record (ref_ts_us, start_ts_us, end_ts_us,
# uncertainty_us, start_uncertainty_us, arrival_ts_us, release_ts_us, watermark_us): microseconds since the epoch
# that fit a signed 64-bit integer (Kafka, Spark and the JVM read them as longs) and are never negative. The gateway
# refuses an event whose mapped time falls outside it (docs/record-contract.md, "Timestamp ranges").
MIN_TS_US = 0
MAX_TS_US = 2**63 - 1
# Event-record fields beyond the table's core: the merge raised the record's ref_ts_us by this much to keep the
# partition in reference order (a regression of its source's stamps within its error bound).
REF_RAISED_US = "ref_raised_us"

# The "record" of a results-topic value.
RESULT_WINDOW = "window"
RESULT_FINAL = "final"
RESULT_MATCH = "match"
RESULT_ADD = "add"
RESULT_RETRACT = "retract"
RESULT_LATE = "late"
RESULT_REJECTED = "rejected"
# A late event past the job's allowed lateness: its window's state is gone, so no correction can carry it.
RESULT_TOO_LATE = "too_late"
# SASE conservative mode on a late event: a match it completed, and a released match it negated.
RESULT_LATE_MATCH = "late_match"
RESULT_INVALIDATED = "invalidated"
# Rows Spark's own late-row filter dropped (numRowsDroppedByWatermark): never expected, never silent.
RESULT_DROPPED_BY_WATERMARK = "dropped_by_watermark"
# Constraint-aware sequence queries (docs/constraints.md): a match became certain whatever the workflow does next,
# and a trace that can no longer match was released (Li 2010, Algorithm 5).
RESULT_EARLY_ALERT = "early_alert"
RESULT_MONITOR_TERMINATED = "monitor_terminated"
# A cap cut results short (pattern job: matches past max_matches_per_event, candidates evicted by max_candidates):
# the record says why and how many, so nothing is truncated silently.
RESULT_TRUNCATED = "truncated"
# Window results carry a revision: 0 when first released, n for the n-th correction (same key: a compacted
# results topic keeps the final truth).
REVISION = "revision"


class RecordError(ValueError):
    """A record that does not follow the contract (wrong kind, missing or mistyped field)."""


# Not frozen: a frozen dataclass pays object.__setattr__ per field, and one record is built per event.
@dataclass(slots=True)
class EventRecord:
    """An event as published by the gateway. All times are integer microseconds since the Unix epoch.

    ref_ts_us = source_ts_us + the source's estimated clock offset (and skew) at that time; uncertainty_us bounds
    |ref_ts_us - true time|. arrival_ts_us and release_ts_us are read from the gateway's reference clock.

    An interval event (contract version 2) spans [start_ts_us, end_ts_us] on the reference clock; its end is
    ref_ts_us (``end_ts_us`` is that field), start_uncertainty_us bounds |start_ts_us - true start|, and
    source_start_ts_us is its start on the source's clock. A point event has start = end: the start fields left
    None mean exactly that (ref_ts_us, uncertainty_us, source_ts_us), and ``to_json`` then leaves the four interval
    fields out of the JSON (readers apply those defaults to any record without them; ``from_dict`` fills them in).
    interval_id and endpoint are set only on an endpoint event (IO3: one endpoint of an interval, paired by id),
    whose start fields are its own time (start = end); they are written only with the start fields.
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
    rtt_us: int | None = None
    """The round trip of the clock estimate that mapped this event (its source's T_s): jobs take T_a, the maximum
    over a stream's sources, from the records themselves, so it follows re-syncs live and deterministically."""
    start_ts_us: int | None = None
    start_uncertainty_us: int | None = None
    source_start_ts_us: int | None = None
    interval_id: str | None = None
    endpoint: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    lateness_us: int | None = None
    """A late record's lateness: how far behind what was already promised (the watermark, its source's releases,
    or its own arrival for an event diverted before the merge) its reference time lies. None on an on-time record."""

    @property
    def end_ts_us(self) -> int:
        return self.ref_ts_us

    def to_json(self) -> bytes:
        value: dict[str, Any] = {
            "v": CONTRACT_VERSION,
            "kind": EVENT,
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
        start_ts_us = self.start_ts_us
        if start_ts_us is None and self.interval_id is not None:
            start_ts_us = self.ref_ts_us  # an endpoint is a point in time: its start is its end
        if start_ts_us is not None:
            # A point event's record leaves its start fields out (readers take absent as start = end): they would
            # add half again to its bytes and its encoding time, on the gateway's per-event path.
            value["start_ts_us"] = start_ts_us
            value["end_ts_us"] = self.ref_ts_us
            value["start_uncertainty_us"] = (self.uncertainty_us if self.start_uncertainty_us is None
                                             else self.start_uncertainty_us)
            value["source_start_ts_us"] = (self.source_ts_us if self.source_start_ts_us is None
                                           else self.source_start_ts_us)
            if self.interval_id is not None:
                value["interval_id"] = self.interval_id
                value["endpoint"] = self.endpoint
        if self.late_reason is not None:
            value["late_reason"] = self.late_reason
        if self.rtt_us is not None:
            value["rtt_us"] = self.rtt_us
        if self.lateness_us is not None:
            value["lateness_us"] = self.lateness_us
        value.update(self.extra)
        return orjson.dumps(value)

    @property
    def key(self) -> bytes:
        return self.source_id.encode()

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> EventRecord:
        """A version 2 record, or a version 1 one (a point event: its start fields default to its end's)."""
        ref_ts_us = _int(raw, "ref_ts_us")
        uncertainty_us = _int(raw, "uncertainty_us")
        source_ts_us = _int(raw, "source_ts_us")
        start_ts_us = _optional_int(raw, "start_ts_us")
        start_ts_us = ref_ts_us if start_ts_us is None else start_ts_us
        end_ts_us = _optional_int(raw, "end_ts_us")
        if end_ts_us is not None and end_ts_us != ref_ts_us:
            raise RecordError(f"event record: 'end_ts_us'={end_ts_us} differs from 'ref_ts_us'={ref_ts_us}")
        if start_ts_us > ref_ts_us:
            raise RecordError(f"event record: 'start_ts_us'={start_ts_us} after its end {ref_ts_us}")
        start_uncertainty_us = _optional_int(raw, "start_uncertainty_us")
        source_start_ts_us = _optional_int(raw, "source_start_ts_us")
        interval_id = raw.get("interval_id")
        endpoint = raw.get("endpoint")
        if (interval_id is not None or endpoint is not None) and not (
                isinstance(interval_id, str) and endpoint in ENDPOINTS):
            raise RecordError(f"event record: an endpoint event needs a string 'interval_id' and an 'endpoint' in "
                              f"{ENDPOINTS}, got {interval_id!r}, {endpoint!r}")
        return cls(stream=_str(raw, "stream"), source_id=_str(raw, "source_id"), seq=_int(raw, "seq"),
                   source_ts_us=source_ts_us, ref_ts_us=ref_ts_us, uncertainty_us=uncertainty_us,
                   arrival_ts_us=_int(raw, "arrival_ts_us"), release_ts_us=_int(raw, "release_ts_us"),
                   late=bool(raw.get("late", False)), payload=raw.get("payload"), late_reason=raw.get("late_reason"),
                   rtt_us=_optional_int(raw, "rtt_us"), start_ts_us=start_ts_us,
                   start_uncertainty_us=uncertainty_us if start_uncertainty_us is None else start_uncertainty_us,
                   source_start_ts_us=source_ts_us if source_start_ts_us is None else source_start_ts_us,
                   interval_id=interval_id, endpoint=endpoint,
                   extra={k: v for k, v in raw.items() if k not in _EVENT_FIELDS},
                   lateness_us=_optional_int(raw, "lateness_us"))


_EVENT_FIELDS = frozenset({
    "v", "kind", "stream", "source_id", "seq", "source_ts_us", "ref_ts_us", "uncertainty_us", "arrival_ts_us",
    "release_ts_us", "late", "payload", "late_reason", "rtt_us", "start_ts_us", "end_ts_us", "start_uncertainty_us",
    "source_start_ts_us", "interval_id", "endpoint", "lateness_us"})
# An endpoint event's "endpoint" (the wire's values: contract.wire.messages.ENDPOINTS).
ENDPOINTS = ("start", "end")


@dataclass(frozen=True, slots=True)
class PunctuationRecord:
    """No event with ``ref_ts_us < watermark_us`` follows this record in its topic."""

    stream: str
    watermark_us: int
    release_ts_us: int

    def to_json(self) -> bytes:
        return orjson.dumps({"v": CONTRACT_VERSION, "kind": PUNCTUATION, "stream": self.stream,
                             "watermark_us": self.watermark_us, "release_ts_us": self.release_ts_us})

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> PunctuationRecord:
        return cls(_str(raw, "stream"), _int(raw, "watermark_us"), _int(raw, "release_ts_us"))


@dataclass(frozen=True, slots=True)
class ClockRecord:
    """A source's clock as the gateway knows it (sign: ``ref = source + offset_us``); ``estimate`` is the complete
    estimate a restarted gateway loads (None in records of older gateways)."""

    source_id: str
    offset_us: int
    rtt_us: int
    skew_ppm: float
    error_bound_us: int
    last_sync_us: int
    sample_count: int
    t_a_us: int
    updated_us: int
    estimate: dict[str, int | float] | None = None

    @property
    def key(self) -> bytes:
        return self.source_id.encode()

    def to_json(self) -> bytes:
        value: dict[str, Any] = {"v": CONTRACT_VERSION, "kind": CLOCK, **asdict(self)}
        if self.estimate is None:
            del value["estimate"]
        return orjson.dumps(value)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClockRecord:
        estimate = raw.get("estimate")
        if estimate is not None and not (isinstance(estimate, dict) and all(
                isinstance(v, int | float) and not isinstance(v, bool) for v in estimate.values())):
            raise RecordError("clock record: 'estimate' must map names to numbers")
        skew = raw.get("skew_ppm")
        if not isinstance(skew, int | float) or isinstance(skew, bool):
            raise RecordError("clock record: 'skew_ppm' must be a number")
        return cls(_str(raw, "source_id"), _int(raw, "offset_us"), _int(raw, "rtt_us"), float(skew),
                   _int(raw, "error_bound_us"), _int(raw, "last_sync_us"), _int(raw, "sample_count"),
                   _int(raw, "t_a_us"), _int(raw, "updated_us"), estimate)


@dataclass(slots=True)
class ProgressRecord:
    """The gateway's restart checkpoint of one stream (one shard's partition): its events topic holds everything
    below ``next_offset``, each source's seqs below ``next_seq[source]``, and punctuations up to ``watermark_us``.
    ``seen_us[source]`` is the release time of the source's newest event: a source silent for longer than the
    gateway's source retention is dropped from the checkpoint (optional field; absent in older checkpoints)."""

    stream: str
    next_offset: int = 0
    next_seq: dict[str, int] = field(default_factory=dict)
    watermark_us: int | None = None
    seen_us: dict[str, int] = field(default_factory=dict)

    @property
    def key(self) -> bytes:
        return progress_key(self.stream)

    def to_json(self) -> bytes:
        # Version 1 progress records carry no "v"; kept so that checkpoints written before stay readable both ways.
        return orjson.dumps({"kind": PROGRESS, "stream": self.stream, "next_offset": self.next_offset,
                             "next_seq": self.next_seq, "watermark_us": self.watermark_us, "seen_us": self.seen_us})

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ProgressRecord:
        next_seq = raw.get("next_seq")
        if not isinstance(next_seq, dict):
            raise RecordError("progress record: 'next_seq' must be a map")
        watermark = raw.get("watermark_us")
        seen = raw.get("seen_us") or {}
        if not isinstance(seen, dict):
            raise RecordError("progress record: 'seen_us' must be a map")
        return cls(_str(raw, "stream"), _int(raw, "next_offset"), {str(k): int(v) for k, v in next_seq.items()},
                   None if watermark is None else int(watermark), {str(k): int(v) for k, v in seen.items()})


def progress_key(stream: str) -> bytes:
    return (PROGRESS_KEY_PREFIX + stream).encode()


@dataclass(frozen=True, slots=True)
class _ControlRecord:
    """A record of the cluster control topic: its key is fixed by its kind, its JSON is the version, the kind and
    every field in order."""

    KIND: ClassVar[str]
    KEY: ClassVar[bytes]

    @property
    def key(self) -> bytes:
        return self.KEY

    def to_json(self) -> bytes:
        return orjson.dumps({"v": CONTRACT_VERSION, "kind": self.KIND, **asdict(self)})


@dataclass(frozen=True, slots=True)
class ClusterRecord(_ControlRecord):
    """Partition 0 of the control topic: which cluster owns the topic prefix and how many shards it has. Written
    once when the deployment is created; every gateway checks its own configuration against it."""

    KIND: ClassVar[str] = CLUSTER
    KEY: ClassVar[bytes] = CLUSTER_KEY
    cluster: str
    shards: int
    created_us: int

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClusterRecord:
        shards = _int_at_least(raw, "shards", 1, CLUSTER)  # first: what a record bad in several fields reports
        return cls(_str(raw, "cluster"), shards, _int(raw, "created_us"))


@dataclass(frozen=True, slots=True)
class OwnerRecord(_ControlRecord):
    """Partition ``shard`` of the control topic: the gateway serving that shard since ``since_us`` and where sources
    reach it (a non-owner redirects a source's hello there). Written inside the owner's transaction on the shard,
    so a fenced gateway's claim never becomes visible to committed readers."""

    KIND: ClassVar[str] = OWNER
    KEY: ClassVar[bytes] = OWNER_KEY
    shard: int
    gateway_id: str
    host: str
    port: int
    timesync_port: int | None
    since_us: int

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> OwnerRecord:
        return cls(_int_at_least(raw, "shard", 0, OWNER), _str(raw, "gateway_id"), _str(raw, "host"),
                   _int(raw, "port"), _optional_int(raw, "timesync_port"), _int(raw, "since_us"))


ContractRecord = EventRecord | PunctuationRecord | ClockRecord | ProgressRecord | ClusterRecord | OwnerRecord
_DECODERS: dict[str, Any] = {EVENT: EventRecord.from_dict, PUNCTUATION: PunctuationRecord.from_dict,
                             CLOCK: ClockRecord.from_dict, PROGRESS: ProgressRecord.from_dict,
                             CLUSTER: ClusterRecord.from_dict, OWNER: OwnerRecord.from_dict}


def decode_record(value: bytes | dict[str, Any]) -> ContractRecord:
    """A record of an events, late, sources or cluster control topic, typed by its ``kind``; anything else raises
    RecordError."""
    if isinstance(value, dict):
        raw = value
    else:
        try:
            raw = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise RecordError(f"not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise RecordError(f"a record must be a JSON object, got {type(raw).__name__}")
    decoder = _DECODERS.get(raw.get("kind"))  # type: ignore[arg-type]
    if decoder is None:
        raise RecordError(f"unknown record kind {raw.get('kind')!r}")
    record: ContractRecord = decoder(raw)
    return record


def result_value(job: str, record: str, stream: str, **fields: Any) -> dict[str, Any]:
    """The value of a results-topic record (serialised by the job's sink)."""
    return {"job": job, "record": record, "stream": stream, **fields}


def result_key(*parts: object) -> str:
    """Results keys join their parts with ``|`` (docs/record-contract.md lists each job's parts)."""
    return "|".join(str(p) for p in parts)


def _int(raw: dict[str, Any], name: str) -> int:
    if name not in raw:
        raise RecordError(f"record without {name!r}")
    value = raw[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise RecordError(f"record field {name!r} must be an integer, got {type(value).__name__}")
    return value


def _int_at_least(raw: dict[str, Any], name: str, minimum: int, kind: str) -> int:
    """An integer field of a ``kind`` record no smaller than ``minimum``."""
    value = _int(raw, name)
    if value < minimum:
        bound = "must not be negative" if minimum == 0 else f"must be at least {minimum}"
        raise RecordError(f"{kind} record: {name!r} {bound}, got {value}")
    return value


def _optional_int(raw: dict[str, Any], name: str) -> int | None:
    return None if raw.get(name) is None else _int(raw, name)


def _str(raw: dict[str, Any], name: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str):
        raise RecordError(f"record field {name!r} must be a string, got {type(value).__name__}")
    return value
