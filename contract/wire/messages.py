"""Typed messages of the client <-> gateway protocol, both directions (docs/wire-protocol.md).

Client -> gateway: hello, events, heartbeat, bye. Gateway -> client: welcome, redirect, ack, error, resync, gap. Each
has a ``build_*`` function (the map that goes into one frame) and a ``parse_*`` function (validation into a typed
message; a violation raises a RemoteProtocolError, because whoever parses it received it from the other side).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from contract.topics import InvalidStreamName, validate_stream_name
from contract.wire.errors import InvalidMessage, UnexpectedMessage, UnsupportedVersion
from contract.wire.frames import NonStringKeyMap

PROTOCOL_VERSION = 1
MAX_SEQ = 2**63 - 1
MAX_SOURCE_ID_CHARS = 128
MAX_STREAMS_PER_SOURCE = 64
# A payload travels into the JSON record unchanged, so it must be JSON every consumer reads the same way: integers
# within signed 64 bits (Spark's LongType, Java's long; orjson itself stops at 2**64 - 1), finite floats (orjson
# writes NaN and infinities as null: a silent rewrite), string map keys, and a bounded depth (orjson refuses
# beyond 254 levels; 32 is far above any event schema and keeps this check and every consumer's recursion cheap).
MIN_PAYLOAD_INT = -(2**63)
MAX_PAYLOAD_INT = 2**63 - 1
MAX_PAYLOAD_DEPTH = 32

# Message types ("type" of the frame map).
HELLO, EVENTS, HEARTBEAT, BYE = "hello", "events", "heartbeat", "bye"
WELCOME, REDIRECT, ACK, ERROR, RESYNC = "welcome", "redirect", "ack", "error", "resync"
GAP = "gap"
# Why a gap was given up (GapNotice.reason): its wait ran out, or the source's reorder buffer was full.
GAP_REASONS = ("timeout", "buffer_full")
# Non-fatal error codes naming one event (docs/wire-protocol.md, "Errors"): a seq already accepted with another
# payload or source_ts_us (the event is not published, not acknowledged as delivered), and a seq too far above the
# stream's seqs (refused, not accepted: nothing is allocated for the gap it would open).
SEQ_CONFLICT = "seq_conflict"
SEQ_JUMP = "seq_jump"
MAX_PORT = 65535
MAX_HOST_CHARS = 255  # a DNS name's limit
MAX_GATEWAY_ID_CHARS = 128
MAX_SHARD = 2**31 - 1  # shards are Kafka partitions: a Java int
# A retry_after_ms the gateway may ask for: one hour. Larger values are a gateway bug; the client bounds its own wait.
MAX_RETRY_AFTER_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    source_id: str
    streams: tuple[str, ...]
    token: str | None = None


@dataclass(frozen=True, slots=True)
class RejectedPayload:
    """Stands in for a payload the record contract cannot carry (see ``payload_problem``). The event keeps its place
    in the source's sequence, so the gateway neither waits for its seq as a gap nor publishes it: it answers the
    source with an ``invalid_payload`` error frame and counts it. msgpack never decodes to this type."""

    reason: str


# Interval events (docs/wire-protocol.md, "Interval events"): the optional keys of an event map.
SOURCE_START_TS_US = "source_start_ts_us"
INTERVAL_ID = "interval_id"
ENDPOINT = "endpoint"
ENDPOINT_START, ENDPOINT_END = "start", "end"
ENDPOINTS = (ENDPOINT_START, ENDPOINT_END)
MAX_INTERVAL_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class AtomicInterval:
    """Li 2010's atomic interval: sent once it ended; ``source_start_ts_us`` is its start on the source's clock and
    the event's ``source_ts_us`` its end (``source_start_ts_us <= source_ts_us``)."""

    source_start_ts_us: int


@dataclass(frozen=True, slots=True)
class IntervalEndpoint:
    """IO3's model: one endpoint of interval ``interval_id`` (its start or its end), a point event at that time;
    the two endpoints are paired by id downstream."""

    interval_id: str
    endpoint: str  # ENDPOINT_START or ENDPOINT_END


EventInterval = AtomicInterval | IntervalEndpoint


@dataclass(slots=True)  # built per event: not frozen, see contract.records.EventRecord
class IncomingEvent:
    stream: str
    seq: int
    source_ts_us: int
    payload: Any  # a RejectedPayload when the payload is not JSON-representable
    interval: EventInterval | None = None  # None: a point event


@dataclass(frozen=True, slots=True)
class EventBatch:
    events: tuple[IncomingEvent, ...]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """An idle source proving it is alive: its clock now and, per stream, the seq its next event will carry."""

    source_ts_us: int
    next_seq: dict[str, int]


@dataclass(frozen=True, slots=True)
class Bye:
    pass


ClientMessage = Hello | EventBatch | Heartbeat | Bye


def _int_field(raw: dict[str, Any], name: str, low: int, high: int) -> int:
    value = raw.get(name)
    # bool is an int subclass; a True seq is a client bug, not seq 1.
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidMessage(f"field {name!r} must be an integer, got {type(value).__name__}")
    if not low <= value <= high:
        raise InvalidMessage(f"field {name!r}={value} outside [{low}, {high}]")
    return value


def _str_field(raw: dict[str, Any], name: str, max_chars: int) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value or len(value) > max_chars:
        raise InvalidMessage(f"field {name!r} must be a non-empty string of at most {max_chars} chars")
    return value


def _optional_int(raw: dict[str, Any], name: str, low: int, high: int) -> int | None:
    """An optional field: absent and nil both mean None; anything else must be a valid integer."""
    return None if raw.get(name) is None else _int_field(raw, name, low, high)


def _optional_str(raw: dict[str, Any], name: str, max_chars: int) -> str | None:
    return None if raw.get(name) is None else _str_field(raw, name, max_chars)


def _stream(value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidMessage(f"stream must be a string, got {type(value).__name__}")
    try:
        return validate_stream_name(value)
    except InvalidStreamName as exc:
        raise InvalidMessage(str(exc)) from exc


def parse_hello(raw: dict[str, Any]) -> Hello:
    version = _int_field(raw, "version", 0, 2**31)
    if version != PROTOCOL_VERSION:
        raise UnsupportedVersion(f"protocol version {version} not supported; this gateway speaks {PROTOCOL_VERSION}")
    source_id = _str_field(raw, "source_id", MAX_SOURCE_ID_CHARS)
    streams = raw.get("streams")
    if not isinstance(streams, list) or not streams or len(streams) > MAX_STREAMS_PER_SOURCE:
        raise InvalidMessage(f"'streams' must be a list of 1..{MAX_STREAMS_PER_SOURCE} stream names")
    token = raw.get("token")
    if token is not None and not isinstance(token, str):
        raise InvalidMessage("'token' must be a string")
    return Hello(version, source_id, tuple(dict.fromkeys(_stream(s) for s in streams)), token)


def payload_problem(payload: Any) -> str | None:
    """Why ``payload`` cannot travel unchanged in a JSON record (docs/wire-protocol.md, "Payloads"), or None."""
    if type(payload) is str or payload is None:
        return None
    problem = _payload_problem(payload, 0)
    if problem is None:
        return None
    path, reason = problem
    return f"payload{''.join(reversed(path))}: {reason}"


def _payload_problem(value: Any, depth: int) -> tuple[list[str], str] | None:
    """(path from the offending value up, reason) or None; ``depth`` = containers around ``value``. The path is
    built only on the way out of a failure: the valid case (every event) pays for the walk alone."""
    kind = type(value)
    # Exact types first: msgpack decodes to exactly these, and this is the per-event hot path.
    if kind is str or value is None or kind is bool:
        return None
    if kind is int:
        if MIN_PAYLOAD_INT <= value <= MAX_PAYLOAD_INT:
            return None
        return [], f"integer {value} is outside signed 64 bits"
    if kind is float:
        if math.isfinite(value):
            return None
        return [], f"{'NaN' if math.isnan(value) else 'Infinity' if value > 0 else '-Infinity'} is not JSON"
    if kind is dict or kind is list or kind is tuple or kind is NonStringKeyMap:
        if depth >= MAX_PAYLOAD_DEPTH:
            return [], f"nested deeper than {MAX_PAYLOAD_DEPTH} levels"
        if kind is dict or kind is NonStringKeyMap:
            for key, item in (value.items() if kind is dict else value.pairs):
                if type(key) is not str:
                    return [], f"map key {_describe_key(key)} is not a string"
                problem = _payload_problem(item, depth + 1)
                if problem is not None:
                    problem[0].append(f".{_short(key)}")
                    return problem
        else:
            for index, item in enumerate(value):
                problem = _payload_problem(item, depth + 1)
                if problem is not None:
                    problem[0].append(f"[{index}]")
                    return problem
        return None
    if kind is bytes or kind is bytearray or kind is memoryview:
        # Refused rather than carried as base64: any in-band marker ({"$base64": ...}) is also a valid JSON object
        # a source may send, so consumers could not tell the two apart without a contract change.
        return [], "bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending"
    if isinstance(value, msgpack.ExtType):
        return [], f"msgpack ext type {value.code} is not JSON"
    if isinstance(value, msgpack.Timestamp):
        return [], "msgpack timestamp (ext -1) is not JSON; send integer microseconds"
    # Subclasses of the JSON types (only from direct API use; msgpack never makes them): judged as their base.
    for base in _JSON_BASES:
        if isinstance(value, base):
            return _payload_problem(base(value), depth)
    return [], f"{kind.__name__} is not JSON"


_JSON_BASES: tuple[type[Any], ...] = (str, int, float, dict, list)


def _describe_key(key: Any) -> str:
    # Only scalars are quoted: repr of a 1,000-level array key (msgpack decodes up to 1,023) would hit the
    # recursion limit, and a parse error here would fail the whole connection.
    if type(key) in _QUOTED_KEY_TYPES:
        return _short(repr(key))
    return f"of type {'list' if type(key) is tuple else type(key).__name__}"


_QUOTED_KEY_TYPES: frozenset[type[Any]] = frozenset({int, float, bool, type(None), bytes})


def _short(text: str, max_chars: int = 40) -> str:
    """Error messages quote keys: a 60 KiB key must not make a 60 KiB error frame."""
    return text if len(text) <= max_chars else text[:max_chars] + "..."


def parse_event(raw: Any, declared: frozenset[str]) -> IncomingEvent:
    if type(raw) is dict:
        # Hot path, one call per event: a valid event's checks in one expression, the same ones as below (exact
        # int, not bool, within range; a declared stream). Anything else takes the full path for its error.
        stream, seq, source_ts_us = raw.get("stream"), raw.get("seq"), raw.get("source_ts_us")
        if (type(seq) is int and type(source_ts_us) is int and type(stream) is str and stream in declared
                and 0 <= seq <= MAX_SEQ and 0 <= source_ts_us <= MAX_SEQ):
            payload = raw.get("payload", _ABSENT)
            # A point event is these three keys and at most a payload: the map's size proves it has no interval
            # key, so it pays no lookup for them. Any other map has its interval keys checked.
            if payload is not _ABSENT and len(raw) == 4:
                problem = payload_problem(payload)
                return IncomingEvent(stream, seq, source_ts_us,
                                     payload if problem is None else RejectedPayload(problem))
            if payload is _ABSENT:
                payload = None
            problem = payload_problem(payload)
            return IncomingEvent(stream, seq, source_ts_us, payload if problem is None else RejectedPayload(problem),
                                 None if len(raw) == 3 else _interval(raw, source_ts_us))
    if not isinstance(raw, dict):
        if type(raw) is NonStringKeyMap:
            raise InvalidMessage("an event map has a non-string key")
        raise InvalidMessage(f"an event must be a map, got {type(raw).__name__}")
    stream = raw.get("stream")
    # Hot path: a declared stream was validated at hello; only other values need the full checks.
    if type(stream) is not str or stream not in declared:
        raise UnexpectedMessage(f"stream {_stream(stream)!r} was not declared in hello")
    payload = raw.get("payload")
    # Refused per event, not per frame: the rest of the batch is fine, and a fatal error would make the SDK
    # reconnect and resend the same event forever.
    problem = payload_problem(payload)
    source_ts_us = _int_field(raw, "source_ts_us", 0, MAX_SEQ)
    return IncomingEvent(
        stream=stream,
        seq=_int_field(raw, "seq", 0, MAX_SEQ),
        source_ts_us=source_ts_us,
        payload=payload if problem is None else RejectedPayload(problem),
        interval=_interval(raw, source_ts_us),
    )


_ABSENT = object()  # a key's value when the key is missing (nil is a value)


def _interval(raw: dict[str, Any], source_ts_us: int) -> EventInterval | None:
    """The event's interval keys (absent and nil both mean absent), or None for a point event."""
    start = _optional_int(raw, SOURCE_START_TS_US, 0, MAX_SEQ)
    interval_id = raw.get(INTERVAL_ID)
    endpoint = raw.get(ENDPOINT)
    if interval_id is None and endpoint is None:
        if start is None:
            return None
        if start > source_ts_us:
            raise InvalidMessage(f"interval starts after it ends: {SOURCE_START_TS_US}={start} > "
                                 f"source_ts_us={source_ts_us}")
        return AtomicInterval(start)
    if start is not None:
        raise InvalidMessage(f"an event is an atomic interval ({SOURCE_START_TS_US!r}) or an endpoint "
                             f"({INTERVAL_ID!r} + {ENDPOINT!r}), not both")
    if interval_id is None or endpoint is None:
        raise InvalidMessage(f"an interval endpoint needs both {INTERVAL_ID!r} and {ENDPOINT!r}")
    interval_id = _str_field(raw, INTERVAL_ID, MAX_INTERVAL_ID_CHARS)
    if type(endpoint) is not str or endpoint not in ENDPOINTS:
        shown = _short(repr(endpoint)) if type(endpoint) is str else _describe_key(endpoint)
        raise InvalidMessage(f"field {ENDPOINT!r} must be {ENDPOINT_START!r} or {ENDPOINT_END!r}, got {shown}")
    return IntervalEndpoint(interval_id, endpoint)


def parse_events(raw: dict[str, Any], max_events: int, declared: frozenset[str]) -> EventBatch:
    events = raw.get("events")
    if not isinstance(events, list) or not events:
        raise InvalidMessage("'events' must be a non-empty list")
    if len(events) > max_events:
        raise InvalidMessage(f"batch of {len(events)} events exceeds the limit of {max_events}")
    return EventBatch(tuple([parse_event(e, declared) for e in events]))


def parse_heartbeat(raw: dict[str, Any]) -> Heartbeat:
    source_ts_us = _int_field(raw, "source_ts_us", 0, MAX_SEQ)
    next_seq = raw.get("next_seq")
    if not isinstance(next_seq, dict) or len(next_seq) > MAX_STREAMS_PER_SOURCE:
        raise InvalidMessage(f"'next_seq' must be a map of at most {MAX_STREAMS_PER_SOURCE} streams to seqs")
    return Heartbeat(source_ts_us, {_stream(k): _int_field(next_seq, k, 0, MAX_SEQ) for k in next_seq})


# ------------------------------------------------------------------------------------- client -> gateway, build


def build_hello(source_id: str, streams: Sequence[str], token: str | None = None) -> dict[str, Any]:
    hello: dict[str, Any] = {"type": HELLO, "version": PROTOCOL_VERSION, "source_id": source_id,
                             "streams": list(streams)}
    if token is not None:
        hello["token"] = token
    return hello


def build_event(stream: str, seq: int, source_ts_us: int, payload: Any,
                interval: EventInterval | None = None) -> dict[str, Any]:
    """One element of an events message (not a message by itself); ``interval``: its interval keys, None for a
    point event (whose map stays the four keys it always was)."""
    event = {"stream": stream, "seq": seq, "source_ts_us": source_ts_us, "payload": payload}
    if interval is not None:
        if type(interval) is AtomicInterval:
            event[SOURCE_START_TS_US] = interval.source_start_ts_us
        else:
            assert isinstance(interval, IntervalEndpoint)
            event[INTERVAL_ID] = interval.interval_id
            event[ENDPOINT] = interval.endpoint
    return event


def build_events(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``events``: maps from :func:`build_event`."""
    return {"type": EVENTS, "events": list(events)}


def _packb(value: Any) -> bytes:
    packed: bytes = msgpack.packb(value, use_bin_type=True)
    return packed


# The msgpack of {"type": "events", "events": [...]} up to the array header (dicts keep their order).
_EVENTS_PREFIX = _packb({"type": EVENTS, "events": []})[:-1]
_EVENT_KEYS = {name: _packb(name) for name in ("stream", "seq", "source_ts_us", "payload", SOURCE_START_TS_US,
                                               INTERVAL_ID, ENDPOINT)}


def encode_event(stream: str, seq: int, source_ts_us: int, payload_msgpack: bytes,
                 interval: EventInterval | None = None) -> bytes:
    """The msgpack of :func:`build_event`'s map, around a payload encoded once by the sender (its size check did
    it): the SDK never encodes a payload twice, and a resend reuses these bytes."""
    keys = _EVENT_KEYS
    parts = [b"", keys["stream"], _packb(stream), keys["seq"], _packb(seq), keys["source_ts_us"],
             _packb(source_ts_us), keys["payload"], payload_msgpack]
    if interval is None:
        parts[0] = b"\x84"
    elif type(interval) is AtomicInterval:
        parts[0] = b"\x85"
        parts += (keys[SOURCE_START_TS_US], _packb(interval.source_start_ts_us))
    else:
        assert isinstance(interval, IntervalEndpoint)
        parts[0] = b"\x86"
        parts += (keys[INTERVAL_ID], _packb(interval.interval_id), keys[ENDPOINT], _packb(interval.endpoint))
    return b"".join(parts)


def events_body_bytes(count: int, encoded_bytes: int) -> int:
    """The body size of an events message carrying ``count`` encoded events of ``encoded_bytes`` bytes in all."""
    array_header = 1 if count < 16 else 3 if count < 1 << 16 else 5
    return len(_EVENTS_PREFIX) + array_header + encoded_bytes


def events_frame_body(encoded_events: Sequence[bytes]) -> bytes:
    """An events message's msgpack from events :func:`encode_event` encoded (the frame's body)."""
    count = len(encoded_events)
    if count < 16:
        header = bytes((0x90 | count,))
    elif count < 1 << 16:
        header = b"\xdc" + count.to_bytes(2, "big")
    else:
        header = b"\xdd" + count.to_bytes(4, "big")
    return b"".join((_EVENTS_PREFIX, header, *encoded_events))


def build_heartbeat(source_ts_us: int, next_seq: Mapping[str, int]) -> dict[str, Any]:
    return {"type": HEARTBEAT, "source_ts_us": source_ts_us, "next_seq": dict(next_seq)}


def build_bye() -> dict[str, Any]:
    return {"type": BYE}


# --------------------------------------------------------------------------------------------- gateway -> client


@dataclass(frozen=True, slots=True)
class Welcome:
    """The hello is accepted. A clustered gateway also names itself, the source's shard, and the UDP port of its
    time-sync server (the client syncs there); a single gateway may leave them out (None)."""

    version: int
    max_frame_bytes: int
    gateway_id: str | None = None
    shard: int | None = None
    timesync_port: int | None = None
    # The gateway already holds an estimate of this source's clock (restored from the shard's clock state after a
    # failover): it maps the source's events at once, so the source need not finish a sync burst before sending.
    clock_known: bool = False


@dataclass(frozen=True, slots=True)
class Redirect:
    """Sent instead of welcome: this gateway does not own the source's ``shard``; ``gateway_id`` at ``host:port``
    does (its time-sync server on UDP ``timesync_port``, None: the client's configured port). The gateway closes
    the connection after it."""

    shard: int
    gateway_id: str
    host: str
    port: int
    timesync_port: int | None = None


@dataclass(frozen=True, slots=True)
class Ack:
    """Every event of ``stream`` up to and including ``seq`` is in Kafka."""

    stream: str
    seq: int


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """The gateway refused something; ``fatal`` means it closes the connection after this frame. ``stream`` and
    ``seq`` name the one event refused by a non-fatal error (``invalid_payload``)."""

    code: str
    message: str
    fatal: bool
    stream: str | None = None
    seq: int | None = None
    retry_after_ms: int | None = None
    """The least wait before reconnecting (``shard_unavailable``, ``shard_moved``), None if the gateway gave none."""


@dataclass(frozen=True, slots=True)
class ResyncRequest:
    """The gateway saw this source's clock jump beyond its error bound (a step between re-syncs): run a time-sync
    burst now. ``stream`` and ``seq`` name the first event that showed the step; the gateway holds the source's
    events from there until the new estimate arrives (docs/wire-protocol.md, "Resync")."""

    reason: str
    stream: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class GapNotice:
    """The gateway stopped waiting for ``first_seq..last_seq`` of ``stream`` (inclusive), none of which it received:
    the cumulative ack passes them. One of them that arrives later is published once, on the late topic
    (``late_after_skip``); resending them is optional (docs/wire-protocol.md, "Gaps")."""

    stream: str
    first_seq: int
    last_seq: int
    reason: str


GatewayMessage = Welcome | Redirect | Ack | ErrorReply | ResyncRequest | GapNotice


def build_welcome(max_frame_bytes: int, *, gateway_id: str | None = None, shard: int | None = None,
                  timesync_port: int | None = None, clock_known: bool = False) -> dict[str, Any]:
    """The cluster fields are left out when None (``clock_known`` when false): a client that predates them reads the
    same map as before."""
    welcome: dict[str, Any] = {"type": WELCOME, "version": PROTOCOL_VERSION, "max_frame_bytes": max_frame_bytes}
    if gateway_id is not None:
        welcome["gateway_id"] = gateway_id
    if shard is not None:
        welcome["shard"] = shard
    if timesync_port is not None:
        welcome["timesync_port"] = timesync_port
    if clock_known:
        welcome["clock_known"] = True
    return welcome


def build_redirect(shard: int, gateway_id: str, host: str, port: int,
                   timesync_port: int | None = None) -> dict[str, Any]:
    """``host`` must be an address the source can reach (the owner's advertised one, not its bind address)."""
    redirect: dict[str, Any] = {"type": REDIRECT, "shard": shard, "gateway_id": gateway_id, "host": host,
                                "port": port}
    if timesync_port is not None:
        redirect["timesync_port"] = timesync_port
    return redirect


def build_ack(stream: str, seq: int) -> dict[str, Any]:
    return {"type": ACK, "stream": stream, "seq": seq}


def build_gap(stream: str, first_seq: int, last_seq: int, reason: str) -> dict[str, Any]:
    return {"type": GAP, "stream": stream, "first_seq": first_seq, "last_seq": last_seq, "reason": reason}


def build_error(code: str, message: str, fatal: bool, stream: str | None = None,
                seq: int | None = None, *, retry_after_ms: int | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"type": ERROR, "code": code, "message": message, "fatal": fatal}
    if stream is not None and seq is not None:
        error["stream"] = stream
        error["seq"] = seq
    if retry_after_ms is not None:
        error["retry_after_ms"] = retry_after_ms
    return error


def build_resync(reason: str, stream: str | None = None, seq: int | None = None) -> dict[str, Any]:
    resync: dict[str, Any] = {"type": RESYNC, "reason": reason}
    if stream is not None and seq is not None:
        resync["stream"] = stream
        resync["seq"] = seq
    return resync


def parse_gateway_message(raw: dict[str, Any]) -> GatewayMessage:
    """A frame the gateway sent, typed; an unknown type or a bad field raises a RemoteProtocolError."""
    kind = raw.get("type")
    if kind == ACK:
        stream = raw.get("stream")
        if not isinstance(stream, str):
            raise InvalidMessage("ack: 'stream' must be a string")
        return Ack(stream, _int_field(raw, "seq", 0, MAX_SEQ))
    if kind == GAP:
        stream = raw.get("stream")
        if not isinstance(stream, str):
            raise InvalidMessage("gap: 'stream' must be a string")
        first_seq = _int_field(raw, "first_seq", 0, MAX_SEQ)
        last_seq = _int_field(raw, "last_seq", first_seq, MAX_SEQ)
        return GapNotice(stream, first_seq, last_seq, str(raw.get("reason", "")))
    if kind == WELCOME:
        version = _int_field(raw, "version", 0, 2**31)
        if version != PROTOCOL_VERSION:
            raise UnsupportedVersion(f"gateway speaks protocol version {version}; this client speaks "
                                     f"{PROTOCOL_VERSION}")
        return Welcome(version, _int_field(raw, "max_frame_bytes", 1, 2**31),
                       _optional_str(raw, "gateway_id", MAX_GATEWAY_ID_CHARS),
                       _optional_int(raw, "shard", 0, MAX_SHARD), _optional_int(raw, "timesync_port", 1, MAX_PORT),
                       raw.get("clock_known") is True)
    if kind == REDIRECT:
        # Strict, unlike error: a redirect the client cannot follow (no host, a port out of range) is no answer.
        return Redirect(_int_field(raw, "shard", 0, MAX_SHARD), _str_field(raw, "gateway_id", MAX_GATEWAY_ID_CHARS),
                        _str_field(raw, "host", MAX_HOST_CHARS), _int_field(raw, "port", 1, MAX_PORT),
                        _optional_int(raw, "timesync_port", 1, MAX_PORT))
    if kind == ERROR:
        fatal = raw.get("fatal", True)
        stream, seq = raw.get("stream"), raw.get("seq")
        named = isinstance(stream, str) and isinstance(seq, int) and not isinstance(seq, bool)
        retry_after_ms = raw.get("retry_after_ms")
        # Lenient: a bad hint must not hide the error itself; the client then uses its own backoff.
        if (not isinstance(retry_after_ms, int) or isinstance(retry_after_ms, bool)
                or not 0 <= retry_after_ms <= MAX_RETRY_AFTER_MS):
            retry_after_ms = None
        return ErrorReply(str(raw.get("code")), str(raw.get("message")), fatal if isinstance(fatal, bool) else True,
                          stream if named else None, seq if named else None, retry_after_ms)
    if kind == RESYNC:
        # Lenient like error: the request itself is what matters; a bad reason or event name must not make a client
        # ignore it and keep sending timestamps the gateway cannot map.
        stream, seq = raw.get("stream"), raw.get("seq")
        named = isinstance(stream, str) and isinstance(seq, int) and not isinstance(seq, bool)
        return ResyncRequest(str(raw.get("reason", "")), stream if named else None, seq if named else None)
    raise UnexpectedMessage(f"unknown gateway message type {kind!r}")
