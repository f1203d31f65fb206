"""Both directions of the wire protocol, built and parsed by contract.wire: exact maps, and every bad field refused."""

from __future__ import annotations

import pytest

from contract.wire.errors import InvalidMessage, RemoteProtocolError, UnexpectedMessage, UnsupportedVersion
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    PROTOCOL_VERSION,
    Ack,
    ErrorReply,
    RejectedPayload,
    Welcome,
    build_ack,
    build_bye,
    build_error,
    build_event,
    build_events,
    build_heartbeat,
    build_hello,
    build_welcome,
    parse_events,
    parse_gateway_message,
    parse_heartbeat,
    parse_hello,
)


def test_client_messages_are_the_documented_maps() -> None:
    assert build_hello("s1", ["a", "b"]) == {"type": "hello", "version": 1, "source_id": "s1", "streams": ["a", "b"]}
    assert build_hello("s1", ["a"], token="t")["token"] == "t"
    assert build_events([build_event("a", 3, 17, {"x": 1})]) == {
        "type": "events", "events": [{"stream": "a", "seq": 3, "source_ts_us": 17, "payload": {"x": 1}}]}
    assert build_heartbeat(99, {"a": 4}) == {"type": "heartbeat", "source_ts_us": 99, "next_seq": {"a": 4}}
    assert build_bye() == {"type": "bye"}


def test_client_messages_round_trip_through_frames_and_the_gateway_parsers() -> None:
    decoder = FrameDecoder()
    wire = b"".join(encode_frame(m) for m in (
        build_hello("s1", ["a"], token="t"), build_events([build_event("a", 0, 5, b"\x00")]),
        build_heartbeat(6, {"a": 1})))
    hello, events, heartbeat = decoder.feed(wire)
    assert parse_hello(hello).streams == ("a",)
    (event,) = parse_events(events, 10, frozenset({"a"})).events
    # A bin payload is not JSON (docs/wire-protocol.md, "Payloads"): the event parses, carrying its refusal.
    assert (event.stream, event.seq, event.source_ts_us) == ("a", 0, 5)
    assert event.payload == RejectedPayload(
        "payload: bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending")
    assert parse_heartbeat(heartbeat).next_seq == {"a": 1}


def test_gateway_messages_round_trip() -> None:
    decoder = FrameDecoder()
    wire = b"".join(encode_frame(m) for m in (build_welcome(4096), build_ack("a", 7), build_error("x", "no", False)))
    assert [parse_gateway_message(m) for m in decoder.feed(wire)] == [
        Welcome(PROTOCOL_VERSION, 4096), Ack("a", 7), ErrorReply("x", "no", False)]


@pytest.mark.parametrize(("raw", "error"), [
    ({"type": "ack", "stream": 1, "seq": 2}, InvalidMessage),
    ({"type": "ack", "stream": "a", "seq": -1}, InvalidMessage),
    ({"type": "ack", "stream": "a", "seq": True}, InvalidMessage),
    ({"type": "welcome", "version": 2, "max_frame_bytes": 10}, UnsupportedVersion),
    ({"type": "welcome", "version": 1}, InvalidMessage),
    ({"type": "nope"}, UnexpectedMessage),
])
def test_bad_gateway_messages_raise_remote_errors(raw: dict[str, object], error: type[RemoteProtocolError]) -> None:
    with pytest.raises(error):
        parse_gateway_message(raw)


def test_an_error_without_a_fatal_flag_is_fatal() -> None:
    assert parse_gateway_message({"type": "error", "code": "c", "message": "m"}) == ErrorReply("c", "m", True)


def test_resync_request_is_the_documented_map_and_parses_to_a_typed_request() -> None:
    from contract.wire.messages import ResyncRequest, build_resync

    built = build_resync("clock_step", "a", 42)
    assert built == {"type": "resync", "reason": "clock_step", "stream": "a", "seq": 42}
    decoded = FrameDecoder().feed(encode_frame(built))
    assert parse_gateway_message(decoded[0]) == ResyncRequest("clock_step", "a", 42)
    assert build_resync("clock_step") == {"type": "resync", "reason": "clock_step"}
    assert parse_gateway_message(build_resync("clock_step")) == ResyncRequest("clock_step")
    # A malformed event name still asks for the re-sync: the request is what matters.
    assert parse_gateway_message({"type": "resync", "reason": "x", "stream": "a", "seq": True}) == ResyncRequest("x")
