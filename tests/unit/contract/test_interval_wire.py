"""Interval keys of an event map (docs/wire-protocol.md, "Interval events"): exact bytes built, exact messages
parsed, every malformed combination refused with its code and message."""

from __future__ import annotations

from typing import Any

import msgpack
import pytest

from contract.wire.errors import InvalidMessage
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    AtomicInterval,
    IncomingEvent,
    IntervalEndpoint,
    build_event,
    build_events,
    build_hello,
    parse_event,
    parse_events,
)
from gateway.session import CloseConnection, EventsReceived, GatewaySession, SendBytes

DECLARED = frozenset({"m"})


def frame(*events: dict[str, Any]) -> bytes:
    return encode_frame({"type": "events", "events": list(events)})


def test_built_frames_are_the_documented_bytes() -> None:
    atomic = build_event("m", 3, 2_000, {"s": "on"}, AtomicInterval(1_500))
    endpoint = build_event("m", 4, 2_100, None, IntervalEndpoint("run-1", "end"))
    assert atomic == {"stream": "m", "seq": 3, "source_ts_us": 2_000, "payload": {"s": "on"},
                      "source_start_ts_us": 1_500}
    assert endpoint == {"stream": "m", "seq": 4, "source_ts_us": 2_100, "payload": None, "interval_id": "run-1",
                        "endpoint": "end"}
    # A point event's map is the four keys it always was.
    assert build_event("m", 5, 2_200, 1) == {"stream": "m", "seq": 5, "source_ts_us": 2_200, "payload": 1}
    body = (b"\x82\xa4type\xa6events\xa6events\x91\x85\xa6stream\xa1m\xa3seq\x03\xacsource_ts_us\xcd\x07\xd0"
            b"\xa7payload\x81\xa1s\xa2on\xb2source_start_ts_us\xcd\x05\xdc")
    assert encode_frame(build_events([atomic])) == len(body).to_bytes(4, "big") + body


def test_bytes_in_messages_out() -> None:
    wire = frame(
        {"stream": "m", "seq": 0, "source_ts_us": 10, "payload": 1},
        {"stream": "m", "seq": 1, "source_ts_us": 20, "payload": 2, "source_start_ts_us": 20},
        {"stream": "m", "seq": 2, "source_ts_us": 30, "payload": None, "interval_id": "x", "endpoint": "start"},
        {"stream": "m", "seq": 3, "source_ts_us": 40, "interval_id": "x", "endpoint": "end"},
        {"stream": "m", "seq": 4, "source_ts_us": 50, "source_start_ts_us": 0},
        # nil means absent, like every optional key of the protocol; unknown keys are ignored as before
        {"stream": "m", "seq": 5, "source_ts_us": 60, "payload": 6, "source_start_ts_us": None, "interval_id": None,
         "endpoint": None, "note": "ignored"},
        {"stream": "m", "seq": 6, "source_ts_us": 70},
    )
    (raw,) = FrameDecoder().feed(wire)
    assert parse_events(raw, 100, DECLARED).events == (
        IncomingEvent("m", 0, 10, 1),
        IncomingEvent("m", 1, 20, 2, AtomicInterval(20)),
        IncomingEvent("m", 2, 30, None, IntervalEndpoint("x", "start")),
        IncomingEvent("m", 3, 40, None, IntervalEndpoint("x", "end")),
        IncomingEvent("m", 4, 50, None, AtomicInterval(0)),
        IncomingEvent("m", 5, 60, 6),
        IncomingEvent("m", 6, 70, None),
    )


class EventMap(dict[str, Any]):
    """Not a plain dict: takes parse_event's full path (msgpack never makes one; direct API use may)."""


def test_the_full_path_parses_interval_keys_too() -> None:
    raw = EventMap(stream="m", seq=0, source_ts_us=10, source_start_ts_us=3)
    assert parse_event(raw, DECLARED) == IncomingEvent("m", 0, 10, None, AtomicInterval(3))
    raw = EventMap(stream="m", seq=0, source_ts_us=10, interval_id="x", endpoint="bad")
    with pytest.raises(InvalidMessage, match="field 'endpoint' must be 'start' or 'end', got 'bad'"):
        parse_event(raw, DECLARED)


@pytest.mark.parametrize(("keys", "message"), [
    ({"source_start_ts_us": 11}, "interval starts after it ends: source_start_ts_us=11 > source_ts_us=10"),
    ({"source_start_ts_us": -1}, "field 'source_start_ts_us'=-1 outside [0, 9223372036854775807]"),
    ({"source_start_ts_us": True}, "field 'source_start_ts_us' must be an integer, got bool"),
    ({"source_start_ts_us": 1.5}, "field 'source_start_ts_us' must be an integer, got float"),
    ({"source_start_ts_us": "5"}, "field 'source_start_ts_us' must be an integer, got str"),
    ({"interval_id": "x"}, "an interval endpoint needs both 'interval_id' and 'endpoint'"),
    ({"endpoint": "start"}, "an interval endpoint needs both 'interval_id' and 'endpoint'"),
    ({"interval_id": "x", "endpoint": "middle"}, "field 'endpoint' must be 'start' or 'end', got 'middle'"),
    ({"interval_id": "x", "endpoint": 1}, "field 'endpoint' must be 'start' or 'end', got 1"),
    ({"interval_id": "x", "endpoint": ["start"]}, "field 'endpoint' must be 'start' or 'end', got of type list"),
    ({"interval_id": "", "endpoint": "end"}, "field 'interval_id' must be a non-empty string of at most 128 chars"),
    ({"interval_id": "x" * 129, "endpoint": "end"},
     "field 'interval_id' must be a non-empty string of at most 128 chars"),
    ({"interval_id": 7, "endpoint": "end"}, "field 'interval_id' must be a non-empty string of at most 128 chars"),
    ({"interval_id": "x", "endpoint": "end", "source_start_ts_us": 5},
     "an event is an atomic interval ('source_start_ts_us') or an endpoint ('interval_id' + 'endpoint'), not both"),
])
def test_malformed_interval_keys_are_refused(keys: dict[str, Any], message: str) -> None:
    raw = {"stream": "m", "seq": 0, "source_ts_us": 10, "payload": None} | keys
    with pytest.raises(InvalidMessage) as refused:
        parse_event(raw, DECLARED)
    assert str(refused.value) == message
    assert refused.value.code == "invalid_message"


def test_interval_id_of_128_chars_is_taken() -> None:
    raw = {"stream": "m", "seq": 0, "source_ts_us": 10, "interval_id": "x" * 128, "endpoint": "start"}
    assert parse_event(raw, DECLARED).interval == IntervalEndpoint("x" * 128, "start")


def test_a_session_refuses_a_malformed_interval_like_any_malformed_event() -> None:
    session = GatewaySession()
    session.receive_data(encode_frame(build_hello("src", ["m"])))
    ok = session.receive_data(frame({"stream": "m", "seq": 0, "source_ts_us": 10, "source_start_ts_us": 4}))
    assert ok == [EventsReceived("src", (IncomingEvent("m", 0, 10, None, AtomicInterval(4)),))]
    actions = session.receive_data(frame({"stream": "m", "seq": 1, "source_ts_us": 10, "source_start_ts_us": 11}))
    assert isinstance(actions[-1], CloseConnection) and actions[-1].error_code == "invalid_message"
    (reply,) = [msgpack.unpackb(a.data[4:]) for a in actions if isinstance(a, SendBytes)]
    assert reply == {"type": "error", "code": "invalid_message", "fatal": True,
                     "message": "interval starts after it ends: source_start_ts_us=11 > source_ts_us=10"}
