"""Payloads the JSON record contract can carry unchanged, and the exact refusal of everything else
(contract.wire.messages.payload_problem; docs/wire-protocol.md, "Payloads")."""

from __future__ import annotations

import math
from typing import Any

import msgpack
import orjson
import pytest

from contract.records import EventRecord
from contract.topics import TopicNames
from contract.wire.errors import InvalidPayload
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    MAX_PAYLOAD_DEPTH,
    ErrorReply,
    IncomingEvent,
    RejectedPayload,
    build_ack,
    build_error,
    build_event,
    build_events,
    parse_event,
    parse_events,
    parse_gateway_message,
    payload_problem,
)
from gateway.ingest import ConnectionId, IngestCore, Produce, SendToSource, StreamProgress
from timesync.clocks import IdentityMapping

DECLARED = frozenset({"s"})


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def over_the_wire(payload: Any) -> Any:
    """The payload as the gateway sees it: msgpack-encoded by a client, decoded by the frame decoder."""
    (message,) = FrameDecoder().feed(encode_frame(build_events([build_event("s", 0, 1, payload)])))
    return message["events"][0]["payload"]


@pytest.mark.parametrize(("payload", "problem"), [
    (b"\x00\x01", "payload: bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending"),
    (2**64, "payload: integer 18446744073709551616 is outside signed 64 bits"),
    (2**63, "payload: integer 9223372036854775808 is outside signed 64 bits"),
    (-(2**63) - 1, "payload: integer -9223372036854775809 is outside signed 64 bits"),
    (math.nan, "payload: NaN is not JSON"),
    (math.inf, "payload: Infinity is not JSON"),
    (-math.inf, "payload: -Infinity is not JSON"),
    (nested(MAX_PAYLOAD_DEPTH + 1), "payload" + "[0]" * MAX_PAYLOAD_DEPTH + f": nested deeper than {MAX_PAYLOAD_DEPTH}"
                                    " levels"),
    ({b"k": 1}, "payload: map key b'k' is not a string"),
    ({"a": {1: 2}}, "payload.a: map key 1 is not a string"),
    (msgpack.ExtType(5, b"x"), "payload: msgpack ext type 5 is not JSON"),
    (msgpack.Timestamp(1, 0), "payload: msgpack timestamp (ext -1) is not JSON; send integer microseconds"),
    ({"a": [1, {"b": math.nan}]}, "payload.a[1].b: NaN is not JSON"),
    ({"x" * 100: b""}, "payload." + "x" * 40 + "...: bytes (msgpack bin) are not JSON; encode them into a string "
                                               "(e.g. base64) before sending"),
    (object(), "payload: object is not JSON"),
])
def test_each_payload_class_the_contract_cannot_carry_is_refused_with_its_path_and_reason(payload: Any,
                                                                                          problem: str):
    assert payload_problem(payload) == problem


VALID = {"i": 3, "f": -1.5, "s": "é", "n": None, "b": True, "l": [1, [2, {"k": "v"}]], "big": 2**63 - 1,
         "small": -(2**63), "empty": {}, "deep": nested(MAX_PAYLOAD_DEPTH - 1)}


@pytest.mark.parametrize("payload", [VALID, None, 0, "x", [], nested(MAX_PAYLOAD_DEPTH), 2**63 - 1, -(2**63), 1e308])
def test_json_representable_payloads_pass(payload: Any):
    assert payload_problem(payload) is None


def test_a_valid_nested_payload_travels_unchanged_into_the_record():
    event = parse_event(over_the_wire(VALID) and {"stream": "s", "seq": 4, "source_ts_us": 9,
                                                   "payload": over_the_wire(VALID)}, DECLARED)
    assert event == IncomingEvent("s", 4, 9, VALID)
    record = EventRecord("s", "a", 4, 9, 9, 0, 10, 11, payload=event.payload)
    assert orjson.loads(record.to_json())["payload"] == VALID


# msgpack cannot even encode integers beyond 64 bits (-2**63 - 1, 2**64): from the wire, the out-of-range ones are
# the unsigned 64-bit values above 2**63 - 1.
@pytest.mark.parametrize("payload", [b"bin", 2**63, 2**64 - 1, math.nan, math.inf, -math.inf,
                                     nested(MAX_PAYLOAD_DEPTH + 1), {b"k": 1}, msgpack.ExtType(3, b"")])
def test_a_refused_payload_from_the_wire_becomes_a_rejected_payload_and_keeps_the_batch(payload: Any):
    raw = over_the_wire({"p": payload})
    batch = parse_events({"type": "events", "events": [
        {"stream": "s", "seq": 0, "source_ts_us": 1, "payload": 1},
        {"stream": "s", "seq": 1, "source_ts_us": 2, "payload": raw},
        {"stream": "s", "seq": 2, "source_ts_us": 3, "payload": {"ok": True}}]}, 10, DECLARED)
    assert [e.seq for e in batch.events] == [0, 1, 2]
    assert batch.events[0].payload == 1 and batch.events[2].payload == {"ok": True}
    rejected = batch.events[1].payload
    assert rejected == RejectedPayload(payload_problem(raw) or "")
    assert rejected.reason.startswith("payload.p")


@pytest.mark.parametrize(("payload", "problem"), [
    ({1: 2}, "payload.p: map key 1 is not a string"),
    ({"a": 1, -7: "x"}, "payload.p: map key -7 is not a string"),
    ({1.5: None}, "payload.p: map key 1.5 is not a string"),
    ({None: 1}, "payload.p: map key None is not a string"),
    ({"ok": {"in": {2: [b""]}}}, "payload.p.ok.in: map key 2 is not a string"),
    # Keys msgpack decodes to unhashable or deep values: described by type, never hashed or repr'd in full.
    ({(1, (2,)): 0}, "payload.p: map key of type list is not a string"),
    ({msgpack.ExtType(4, b"k"): 0}, "payload.p: map key of type ExtType is not a string"),
])
def test_non_string_map_keys_in_a_payload_refuse_that_event_not_the_frame(payload: Any, problem: str) -> None:
    # A map key that is not a string only breaks its own event: the frame decodes and the batch goes on.
    (message,) = FrameDecoder().feed(encode_frame(build_events([
        build_event("s", 0, 1, 1), build_event("s", 1, 2, {"p": payload}), build_event("s", 2, 3, {"ok": True})])))
    batch = parse_events(message, 10, DECLARED)
    assert [(e.seq, e.payload) for e in batch.events] == [
        (0, 1), (1, RejectedPayload(problem)), (2, {"ok": True})]


def test_a_non_string_key_in_the_event_map_itself_is_an_invalid_message_for_the_frame() -> None:
    from contract.wire.errors import InvalidMessage

    (message,) = FrameDecoder().feed(encode_frame(build_events([{**build_event("s", 0, 1, 1), 7: "x"}])))
    with pytest.raises(InvalidMessage, match=r"^an event map has a non-string key$"):
        parse_events(message, 10, DECLARED)


def test_a_thousand_levels_of_keys_that_are_arrays_cost_no_recursion() -> None:
    key: Any = 0
    for _ in range(1000):
        key = [key]
    body = msgpack.packb({"type": "events", "events": [{"stream": "s", "seq": 0, "source_ts_us": 1,
                                                          "payload": {"p": {0: 0}}}]})
    # A map whose only key is 1,000 nested arrays, spliced in as the payload of seq 0 (msgpack's packb cannot
    # build it: tuple keys nest only as deep as its recursion limit allows).
    deep_key = b"\x91" * 1000 + b"\x00"
    body = body.replace(b"\x81\xa1p\x81\x00\x00", b"\x81\xa1p\x81" + deep_key + b"\x00")
    assert deep_key in body
    (message,) = FrameDecoder().feed(len(body).to_bytes(4, "big") + body)
    (event,) = parse_events(message, 10, DECLARED).events
    assert event.payload == RejectedPayload("payload.p: map key of type list is not a string")


def test_the_invalid_payload_error_frame_names_its_event_and_is_not_fatal():
    frame = build_error(InvalidPayload.code, "payload: NaN is not JSON", False, "s", 7)
    assert frame == {"type": "error", "code": "invalid_payload", "message": "payload: NaN is not JSON",
                     "fatal": False, "stream": "s", "seq": 7}
    assert parse_gateway_message(frame) == ErrorReply("invalid_payload", "payload: NaN is not JSON", False, "s", 7)
    # Without an event the frame is unchanged from before, and a malformed stream/seq is not trusted.
    assert build_error("x", "m", True) == {"type": "error", "code": "x", "message": "m", "fatal": True}
    assert parse_gateway_message({**frame, "seq": True}) == ErrorReply("invalid_payload", frame["message"], False)


def test_a_refused_seq_counts_as_consumed_in_the_checkpoint_so_a_restarted_gateway_does_not_wait_for_it() -> None:
    topics = TopicNames("t")
    t0 = 1_700_000_000_000_000
    core = IngestCore(topics, IdentityMapping())
    core.stream_created("s")
    core.source_registered("a", ("s",), t0)
    bad = IncomingEvent("s", 1, t0 + 20, RejectedPayload("payload: NaN is not JSON"))
    actions = core.events_received(ConnectionId(1), "a", (IncomingEvent("s", 0, t0 + 10, 0), bad), t0 + 100)
    (produce,) = [a for a in actions if isinstance(a, Produce) and a.delivery is not None]
    assert produce.delivery is not None and produce.delivery.seq == 0
    # Kafka confirms seq 0 after seq 1 was settled: the ack and the checkpoint both move over the refused seq.
    core.on_delivered(produce.delivery, None, 0, t0 + 200)
    assert core.poll(t0 + 200) == [SendToSource("a", encode_frame(build_ack("s", 1)))]
    (checkpoint,) = core.checkpoint_dirty_streams()
    progress = orjson.loads(checkpoint.value)
    assert (progress["next_seq"], progress["next_offset"]) == ({"a": 2}, 1)

    # The restarted gateway: the source (which forgot seq 1 with its ack) goes on at seq 2, published at once.
    restarted = IngestCore(topics, IdentityMapping())
    restarted.stream_recovered(StreamProgress("s", progress["next_offset"], progress["next_seq"]), t0 + 1_000)
    restarted.source_registered("a", ("s",), t0 + 1_000)
    actions = restarted.events_received(ConnectionId(2), "a", (IncomingEvent("s", 2, t0 + 30, 2),), t0 + 1_100)
    assert [a.delivery.seq for a in actions if isinstance(a, Produce) and a.delivery is not None] == [2]


def test_a_refused_last_seq_settled_after_the_confirmed_ones_moves_the_checkpoint_too() -> None:
    t0 = 1_700_000_000_000_000
    core = IngestCore(TopicNames("t"), IdentityMapping())
    core.stream_created("s")
    core.source_registered("a", ("s",), t0)
    actions = core.events_received(ConnectionId(1), "a", (IncomingEvent("s", 0, t0 + 10, 0),), t0 + 100)
    (produce,) = [a for a in actions if isinstance(a, Produce) and a.delivery is not None]
    assert produce.delivery is not None
    core.on_delivered(produce.delivery, None, 0, t0 + 200)
    bad = IncomingEvent("s", 1, t0 + 20, RejectedPayload("payload: NaN is not JSON"))
    core.events_received(ConnectionId(1), "a", (bad,), t0 + 300)
    assert core.poll(t0 + 300) == [SendToSource("a", encode_frame(build_ack("s", 1)))]
    (checkpoint,) = core.checkpoint_dirty_streams()
    assert orjson.loads(checkpoint.value)["next_seq"] == {"a": 2}
