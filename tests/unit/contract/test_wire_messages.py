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


# -- cluster routing: welcome's optional fields, redirect, shard errors (docs/wire-protocol.md, "Shards and routing")


def test_welcome_leaves_out_the_cluster_fields_it_was_not_given() -> None:
    # gateway/session.py's call and a client that predates the cluster fields see exactly the old map.
    assert build_welcome(4096) == {"type": "welcome", "version": 1, "max_frame_bytes": 4096}
    assert build_welcome(4096, gateway_id="gw-2", shard=5, timesync_port=7453) == {
        "type": "welcome", "version": 1, "max_frame_bytes": 4096, "gateway_id": "gw-2", "shard": 5,
        "timesync_port": 7453}
    assert build_welcome(4096, shard=0) == {"type": "welcome", "version": 1, "max_frame_bytes": 4096, "shard": 0}


def test_welcome_with_cluster_fields_round_trips() -> None:
    (raw,) = FrameDecoder().feed(encode_frame(build_welcome(4096, gateway_id="gw-2", shard=5, timesync_port=7453)))
    assert parse_gateway_message(raw) == Welcome(PROTOCOL_VERSION, 4096, "gw-2", 5, 7453)
    assert parse_gateway_message(build_welcome(4096)) == Welcome(PROTOCOL_VERSION, 4096, None, None, None)
    # nil is "not said", like an absent field.
    assert parse_gateway_message({**build_welcome(10), "timesync_port": None}) == Welcome(PROTOCOL_VERSION, 10)


def test_redirect_is_the_documented_map_and_round_trips() -> None:
    from contract.wire.messages import Redirect, build_redirect

    built = build_redirect(3, "gw-1", "10.0.0.7", 7700, 7452)
    assert built == {"type": "redirect", "shard": 3, "gateway_id": "gw-1", "host": "10.0.0.7", "port": 7700,
                     "timesync_port": 7452}
    (raw,) = FrameDecoder().feed(encode_frame(built))
    assert parse_gateway_message(raw) == Redirect(3, "gw-1", "10.0.0.7", 7700, 7452)
    assert build_redirect(0, "gw-1", "h", 1) == {"type": "redirect", "shard": 0, "gateway_id": "gw-1", "host": "h",
                                                 "port": 1}
    assert parse_gateway_message(build_redirect(0, "gw-1", "h", 1)) == Redirect(0, "gw-1", "h", 1, None)


REDIRECT = {"type": "redirect", "shard": 3, "gateway_id": "gw-1", "host": "h", "port": 7700}


@pytest.mark.parametrize("raw", [
    {**REDIRECT, "port": 0},
    {**REDIRECT, "port": 65536},
    {**REDIRECT, "port": True},
    {**REDIRECT, "host": ""},
    {**REDIRECT, "host": "h" * 256},
    {k: v for k, v in REDIRECT.items() if k != "host"},
    {**REDIRECT, "gateway_id": 7},
    {**REDIRECT, "shard": -1},
    {**REDIRECT, "timesync_port": 70000},
    {**build_welcome(10), "shard": -1},
    {**build_welcome(10), "timesync_port": "7452"},
    {**build_welcome(10), "gateway_id": ""},
])
def test_a_redirect_or_welcome_that_cannot_be_followed_is_invalid(raw: dict[str, object]) -> None:
    with pytest.raises(InvalidMessage):
        parse_gateway_message(raw)


def test_shard_error_codes_and_retry_after_ms() -> None:
    from contract.wire.errors import ROUTING_ERROR_CODES, SHARD_MOVED, SHARD_UNAVAILABLE

    assert (SHARD_UNAVAILABLE, SHARD_MOVED) == ("shard_unavailable", "shard_moved")
    assert frozenset({"shard_unavailable", "shard_moved"}) == ROUTING_ERROR_CODES
    built = build_error(SHARD_MOVED, "shard 3 revoked", True, retry_after_ms=250)
    assert built == {"type": "error", "code": "shard_moved", "message": "shard 3 revoked", "fatal": True,
                     "retry_after_ms": 250}
    assert parse_gateway_message(built) == ErrorReply("shard_moved", "shard 3 revoked", True, retry_after_ms=250)
    assert build_error("x", "m", True) == {"type": "error", "code": "x", "message": "m", "fatal": True}
    assert parse_gateway_message(build_error("x", "m", True)).retry_after_ms is None  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [-1, True, 1.5, "100", 3_600_001])
def test_a_bad_retry_after_ms_is_dropped_and_the_error_kept(bad: object) -> None:
    # The error itself is what matters: the client falls back to its own backoff.
    raw = {"type": "error", "code": "shard_unavailable", "message": "m", "fatal": True, "retry_after_ms": bad}
    assert parse_gateway_message(raw) == ErrorReply("shard_unavailable", "m", True)


def test_a_gap_notice_round_trips_and_a_bad_range_is_refused() -> None:
    from contract.wire.errors import InvalidMessage
    from contract.wire.messages import GapNotice, build_gap, parse_gateway_message

    assert parse_gateway_message(build_gap("s", 3, 7, "timeout")) == GapNotice("s", 3, 7, "timeout")
    with pytest.raises(InvalidMessage):
        parse_gateway_message({"type": "gap", "stream": "s", "first_seq": 7, "last_seq": 3, "reason": "timeout"})
    with pytest.raises(InvalidMessage):
        parse_gateway_message({"type": "gap", "stream": 1, "first_seq": 0, "last_seq": 0})


def test_welcome_says_whether_the_gateway_already_knows_the_source_clock() -> None:
    # Left out when false: a client that predates the field reads the same map as before.
    assert "clock_known" not in build_welcome(4096, gateway_id="g", shard=1, timesync_port=7452)
    known = build_welcome(4096, gateway_id="g", shard=1, timesync_port=7452, clock_known=True)
    assert known["clock_known"] is True
    assert parse_gateway_message(known) == Welcome(1, 4096, "g", 1, 7452, clock_known=True)
    assert parse_gateway_message(build_welcome(4096)) == Welcome(1, 4096)
    assert parse_gateway_message({**build_welcome(4096), "clock_known": "yes"}).clock_known is False
