"""Typed messages of the client <-> gateway protocol, both directions (docs/wire-protocol.md).

Client -> gateway: hello, events, heartbeat, bye. Gateway -> client: welcome, ack, error. Each has a ``build_*``
function (the map that goes into one frame) and a ``parse_*`` function (validation into a typed message; a
violation raises a RemoteProtocolError, because whoever parses it received it from the other side).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.topics import InvalidStreamName, validate_stream_name
from contract.wire.errors import InvalidMessage, UnexpectedMessage, UnsupportedVersion

PROTOCOL_VERSION = 1
MAX_SEQ = 2**63 - 1
MAX_SOURCE_ID_CHARS = 128
MAX_STREAMS_PER_SOURCE = 64

# Message types ("type" of the frame map).
HELLO, EVENTS, HEARTBEAT, BYE = "hello", "events", "heartbeat", "bye"
WELCOME, ACK, ERROR = "welcome", "ack", "error"


@dataclass(frozen=True, slots=True)
class Hello:
    version: int
    source_id: str
    streams: tuple[str, ...]
    token: str | None = None


@dataclass(slots=True)  # built per event: not frozen, see contract.records.EventRecord
class IncomingEvent:
    stream: str
    seq: int
    source_ts_us: int
    payload: Any


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


def parse_event(raw: Any, declared: frozenset[str]) -> IncomingEvent:
    if not isinstance(raw, dict):
        raise InvalidMessage(f"an event must be a map, got {type(raw).__name__}")
    stream = raw.get("stream")
    # Hot path: a declared stream was validated at hello; only other values need the full checks.
    if type(stream) is not str or stream not in declared:
        raise UnexpectedMessage(f"stream {_stream(stream)!r} was not declared in hello")
    return IncomingEvent(
        stream=stream,
        seq=_int_field(raw, "seq", 0, MAX_SEQ),
        source_ts_us=_int_field(raw, "source_ts_us", 0, MAX_SEQ),
        payload=raw.get("payload"),
    )


def parse_events(raw: dict[str, Any], max_events: int, declared: frozenset[str]) -> EventBatch:
    events = raw.get("events")
    if not isinstance(events, list) or not events:
        raise InvalidMessage("'events' must be a non-empty list")
    if len(events) > max_events:
        raise InvalidMessage(f"batch of {len(events)} events exceeds the limit of {max_events}")
    return EventBatch(tuple(parse_event(e, declared) for e in events))


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


def build_event(stream: str, seq: int, source_ts_us: int, payload: Any) -> dict[str, Any]:
    """One element of an events message (not a message by itself)."""
    return {"stream": stream, "seq": seq, "source_ts_us": source_ts_us, "payload": payload}


def build_events(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``events``: maps from :func:`build_event`."""
    return {"type": EVENTS, "events": list(events)}


def build_heartbeat(source_ts_us: int, next_seq: Mapping[str, int]) -> dict[str, Any]:
    return {"type": HEARTBEAT, "source_ts_us": source_ts_us, "next_seq": dict(next_seq)}


def build_bye() -> dict[str, Any]:
    return {"type": BYE}


# --------------------------------------------------------------------------------------------- gateway -> client


@dataclass(frozen=True, slots=True)
class Welcome:
    version: int
    max_frame_bytes: int


@dataclass(frozen=True, slots=True)
class Ack:
    """Every event of ``stream`` up to and including ``seq`` is in Kafka."""

    stream: str
    seq: int


@dataclass(frozen=True, slots=True)
class ErrorReply:
    """The gateway refused something; ``fatal`` means it closes the connection after this frame."""

    code: str
    message: str
    fatal: bool


GatewayMessage = Welcome | Ack | ErrorReply


def build_welcome(max_frame_bytes: int) -> dict[str, Any]:
    return {"type": WELCOME, "version": PROTOCOL_VERSION, "max_frame_bytes": max_frame_bytes}


def build_ack(stream: str, seq: int) -> dict[str, Any]:
    return {"type": ACK, "stream": stream, "seq": seq}


def build_error(code: str, message: str, fatal: bool) -> dict[str, Any]:
    return {"type": ERROR, "code": code, "message": message, "fatal": fatal}


def parse_gateway_message(raw: dict[str, Any]) -> GatewayMessage:
    """A frame the gateway sent, typed; an unknown type or a bad field raises a RemoteProtocolError."""
    kind = raw.get("type")
    if kind == ACK:
        stream = raw.get("stream")
        if not isinstance(stream, str):
            raise InvalidMessage("ack: 'stream' must be a string")
        return Ack(stream, _int_field(raw, "seq", 0, MAX_SEQ))
    if kind == WELCOME:
        version = _int_field(raw, "version", 0, 2**31)
        if version != PROTOCOL_VERSION:
            raise UnsupportedVersion(f"gateway speaks protocol version {version}; this client speaks "
                                     f"{PROTOCOL_VERSION}")
        return Welcome(version, _int_field(raw, "max_frame_bytes", 1, 2**31))
    if kind == ERROR:
        fatal = raw.get("fatal", True)
        return ErrorReply(str(raw.get("code")), str(raw.get("message")), fatal if isinstance(fatal, bool) else True)
    raise UnexpectedMessage(f"unknown gateway message type {kind!r}")
