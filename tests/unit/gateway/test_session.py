import msgpack

from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import IncomingEvent
from gateway.session import (
    CloseConnection,
    DrainRequested,
    EventsReceived,
    GatewaySession,
    SendBytes,
    SessionState,
    SourceRegistered,
)

HELLO = {"type": "hello", "version": 1, "source_id": "rfid-1", "streams": ["doors", "doors", "temps"]}


def replies(actions):
    decoder = FrameDecoder()
    return [m for a in actions if isinstance(a, SendBytes) for m in decoder.feed(a.data)]


def event(stream="doors", seq=0, ts=1_000, payload=None):
    return {"stream": stream, "seq": seq, "source_ts_us": ts, "payload": payload}


def test_handshake_then_events_then_bye():
    session = GatewaySession()
    actions = session.receive_data(encode_frame(HELLO))
    assert isinstance(actions[0], SourceRegistered)
    assert actions[0].hello.streams == ("doors", "temps")
    assert replies(actions) == []  # the gateway answers (welcome or redirect), knowing who owns the source's shard
    assert session.state is SessionState.STREAMING

    actions = session.receive_data(encode_frame({"type": "events", "events": [event(seq=0), event(seq=1, ts=7)]}))
    assert actions == [EventsReceived("rfid-1", (IncomingEvent("doors", 0, 1_000, None),
                                                 IncomingEvent("doors", 1, 7, None)))]
    assert session.receive_data(encode_frame({"type": "bye"})) == [DrainRequested()]
    assert session.state is SessionState.DRAINING


def assert_fatal(actions, code):
    assert isinstance(actions[-1], CloseConnection)
    assert actions[-1].error_code == code
    (reply,) = replies(actions)
    assert reply["type"] == "error"
    assert reply["code"] == code
    assert reply["fatal"] is True


def test_events_before_hello_is_a_protocol_error():
    session = GatewaySession()
    actions = session.receive_data(encode_frame({"type": "events", "events": [event()]}))
    assert_fatal(actions, "unexpected_message")
    assert session.state is SessionState.ERROR
    # Once in ERROR nothing more is processed.
    assert session.receive_data(encode_frame(HELLO)) == []


def test_second_hello_is_a_protocol_error():
    session = GatewaySession()
    session.receive_data(encode_frame(HELLO))
    assert_fatal(session.receive_data(encode_frame(HELLO)), "unexpected_message")


def test_undeclared_stream_rejected():
    session = GatewaySession()
    session.receive_data(encode_frame(HELLO))
    assert_fatal(session.receive_data(encode_frame({"type": "events", "events": [event("other")]})),
                 "unexpected_message")


def test_wrong_version_rejected():
    session = GatewaySession()
    assert_fatal(session.receive_data(encode_frame({**HELLO, "version": 9})), "unsupported_version")


def test_oversized_frame_rejected():
    session = GatewaySession(max_frame_bytes=128)
    assert isinstance(session.receive_data(encode_frame(HELLO))[0], SourceRegistered)
    actions = session.receive_data(encode_frame({"type": "events", "events": [event(payload="x" * 200)]}))
    assert_fatal(actions, "frame_too_large")


def test_garbage_rejected():
    session = GatewaySession()
    assert_fatal(session.receive_data(b"\x00\x00\x00\x03\xc1\xc1\xc1"), "malformed_frame")


def test_valid_frames_before_a_bad_one_are_kept():
    session = GatewaySession()
    session.receive_data(encode_frame(HELLO))
    data = encode_frame({"type": "events", "events": [event(seq=4)]}) + b"\x00\x00\x00\x01\xc1"
    actions = session.receive_data(data)
    assert actions[0] == EventsReceived("rfid-1", (IncomingEvent("doors", 4, 1_000, None),))
    assert_fatal(actions[1:], "malformed_frame")


def test_wrong_field_types_rejected():
    for bad in (event(seq="3"), event(seq=True), event(seq=-1), event(ts=1.5), "not a map", event(stream="a b")):
        session = GatewaySession()
        session.receive_data(encode_frame(HELLO))
        actions = session.receive_data(encode_frame({"type": "events", "events": [bad]}))
        assert_fatal(actions, "invalid_message")


def test_batch_size_limit():
    session = GatewaySession(max_events_per_batch=2)
    session.receive_data(encode_frame(HELLO))
    events = [event(seq=i) for i in range(3)]
    assert_fatal(session.receive_data(encode_frame({"type": "events", "events": events})), "invalid_message")


def test_raw_msgpack_helper_matches_codec():
    # The SDK and third-party clients build frames the same way.
    assert encode_frame({"type": "bye"})[4:] == msgpack.packb({"type": "bye"})


def test_heartbeat_accepted_for_declared_streams_only():
    from contract.wire.messages import Heartbeat
    from gateway.session import HeartbeatReceived

    session = GatewaySession()
    session.receive_data(encode_frame(HELLO))
    actions = session.receive_data(encode_frame({"type": "heartbeat", "source_ts_us": 99, "next_seq": {"doors": 5}}))
    assert actions == [HeartbeatReceived("rfid-1", Heartbeat(99, {"doors": 5}))]
    actions = session.receive_data(encode_frame({"type": "heartbeat", "source_ts_us": 99, "next_seq": {"x": 5}}))
    assert_fatal(actions, "unexpected_message")
