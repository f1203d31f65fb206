"""The native connection decoder (native/src/decode.rs) against its specification, the Python path: FrameDecoder +
contract.wire.messages in GatewaySession.receive_data's loop. Both get the same bytes, split the same way, and must
give the same actions, errors (code and message), session state and buffered bytes, compared field by field with
exact types (1, 1.0 and True differ; dict order counts)."""

from __future__ import annotations

import dataclasses
import gc
import struct
import sys
from typing import Any

import msgpack
import orjson
import pytest
import skewless_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.topics import TopicNames
from contract.wire.errors import MalformedFrame, RemoteProtocolError, UnexpectedMessage
from contract.wire.frames import _decode_body, encode_frame
from contract.wire.messages import Bye, EventBatch, IncomingEvent, RejectedPayload, parse_events
from gateway.ingest import ConnectionId, IngestConfig, IngestCore
from gateway.native import native_event_digests, native_record_builder, with_core
from gateway.session import GatewaySession
from tests.native_session import DECLARED, HELLO, canon, run_both
from timesync.clocks import IdentityMapping

# --------------------------------------------------------------------------------------------- msgpack building


@dataclasses.dataclass
class Pairs:
    """A msgpack map written pair by pair: repeated keys and keys of any type."""

    pairs: list[tuple[Any, Any]]


def pack(value: Any) -> bytes:
    if type(value) is Pairs:
        n = len(value.pairs)
        head = bytes([0x80 | n]) if n < 16 else b"\xde" + struct.pack(">H", n)
        return head + b"".join(pack(k) + pack(v) for k, v in value.pairs)
    if type(value) is list:
        n = len(value)
        head = bytes([0x90 | n]) if n < 16 else b"\xdc" + struct.pack(">H", n)
        return head + b"".join(pack(v) for v in value)
    if type(value) is dict:
        return pack(Pairs(list(value.items())))
    return bytes(msgpack.packb(value, use_bin_type=True))


NO_PAYLOAD = object()  # an event map without its payload key


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


scalars = st.one_of(
    st.none(), st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), 2**64 - 1, 0, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(width=32, allow_nan=True),
    st.text(max_size=12),
    st.sampled_from(["", "a" * 60, "é" * 45, "\x00\n\"'\\", "😀", "\u2028"]),
    st.binary(max_size=8),
    st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=4)),
    st.builds(msgpack.Timestamp, st.integers(0, 2**34 - 1), st.integers(0, 999_999_999)),
)
keys = st.one_of(st.text(max_size=6), st.sampled_from(["a", "b", "payload"]), st.binary(max_size=3),
                 st.integers(-5, 2**64 - 1), st.floats(), st.none(), st.booleans())


def payloads(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(
        scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(st.text(max_size=5), inner, max_size=4),
            st.lists(st.tuples(keys, inner), max_size=4).map(Pairs),
            st.lists(st.tuples(st.sampled_from(["k", "j"]), inner), max_size=4).map(Pairs),  # repeats
        ),
        max_leaves=max_leaves,
    )


PAYLOADS, SMALL_PAYLOADS, BIG_PAYLOADS = payloads(), payloads(4), payloads(20)


def nested(depth: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"d": value}
    return value


stream_names = st.sampled_from([*DECLARED, "undeclared", "bad name", "é", "", "x" * 201, 7, None, b"s1"])
ints = st.one_of(st.integers(0, 2**63 - 1), st.sampled_from([-1, 2**63, 2**64 - 1, True, 1.0, "1", None]))
interval_keys = st.fixed_dictionaries({}, optional={
    "source_start_ts_us": st.one_of(ints, st.integers(0, 20)),
    "interval_id": st.one_of(st.sampled_from(["i", "", "x" * 129, "é" * 128]), scalars),
    "endpoint": st.one_of(st.sampled_from(["start", "end", "middle", "é" * 50]), scalars),
})


valid_intervals = st.one_of(
    st.fixed_dictionaries({"source_start_ts_us": st.integers(0, 5)}),
    st.fixed_dictionaries({"interval_id": st.text(min_size=1, max_size=5),
                           "endpoint": st.sampled_from(["start", "end"]), "source_start_ts_us": st.none()}),
)


@st.composite
def event_maps(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 9)) < 8:  # a valid event, most of the time: a batch is refused at its first bad one
        event = {"stream": draw(st.sampled_from(DECLARED)), "seq": draw(st.integers(0, 2**63 - 1)),
                 "source_ts_us": draw(st.integers(5, 2**63 - 1))}
        if draw(st.integers(0, 4)):
            event["payload"] = draw(PAYLOADS)
        if draw(st.integers(0, 4)) == 0:
            event.update(draw(valid_intervals))
        return Pairs(draw(st.permutations(list(event.items()))))
    fields: dict[str, Any] = {}
    if draw(st.integers(0, 9)):
        fields["stream"] = draw(st.sampled_from(DECLARED)) if draw(st.booleans()) else draw(stream_names)
    if draw(st.integers(0, 9)):
        fields["seq"] = draw(st.integers(0, 100)) if draw(st.booleans()) else draw(ints)
    if draw(st.integers(0, 9)):
        fields["source_ts_us"] = draw(st.integers(0, 30)) if draw(st.booleans()) else draw(ints)
    if draw(st.booleans()):
        fields["payload"] = draw(PAYLOADS)
    if draw(st.integers(0, 3)) == 0:
        fields.update(draw(interval_keys))
    if draw(st.integers(0, 5)) == 0:
        fields[draw(st.sampled_from(["extra", "seq", "payload"]))] = draw(scalars)
    pairs = list(fields.items())
    if draw(st.integers(0, 6)) == 0:  # a repeated key, or a non-string one
        pairs.insert(draw(st.integers(0, len(pairs))), (draw(keys), draw(scalars)))
    if draw(st.integers(0, 30)) == 0:
        return draw(scalars)
    return Pairs(draw(st.permutations(pairs)))


@st.composite
def messages(draw: st.DrawFn) -> Any:
    kind = draw(st.sampled_from(["events"] * 12 + ["heartbeat", "bye", "hello", "other", 5, b"events", None]))
    if kind == "events":
        events: Any = draw(st.lists(event_maps(), min_size=0 if draw(st.integers(0, 9)) == 0 else 1, max_size=9))
        if draw(st.integers(0, 20)) == 0:
            events = draw(scalars)
        return {"type": kind, "events": events}
    if kind == "heartbeat":
        next_seq = draw(st.one_of(
            st.dictionaries(st.sampled_from([*DECLARED, "nope", "bad name"]), ints, max_size=4),
            st.lists(st.tuples(keys, ints), max_size=3).map(Pairs), scalars))
        return {"type": kind, "source_ts_us": draw(ints), "next_seq": next_seq}
    if kind == "hello":
        return HELLO
    message: dict[Any, Any] = {} if kind is None else {"type": kind}
    if draw(st.booleans()):
        message["x"] = draw(SMALL_PAYLOADS)
    return message


@st.composite
def streams_of_frames(draw: st.DrawFn) -> list[bytes]:
    """A connection's bytes (hello first, most of the time), cut into the chunks the socket hands over."""
    parts = [frame(pack(HELLO))] if draw(st.integers(0, 9)) else []
    for _ in range(draw(st.integers(1, 5))):
        body = pack(draw(messages()))
        damage = draw(st.sampled_from([9] * 16 + [0, 1, 2, 3]))
        if damage == 0:
            body = body[:draw(st.integers(0, len(body)))]  # truncated: the frame's length says less
        elif damage == 1 and body:
            at = draw(st.integers(0, len(body) - 1))
            body = body[:at] + bytes([draw(st.integers(0, 255))]) + body[at + 1:]
        elif damage == 2:
            body += draw(st.binary(min_size=1, max_size=3))  # extra data
        if damage == 3:
            parts.append(struct.pack(">I", draw(st.sampled_from([0, 2**32 - 1, 600]))))
        else:
            parts.append(frame(body))
    data = b"".join(parts)
    cuts = sorted(draw(st.lists(st.integers(0, len(data)), max_size=4)))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(streams_of_frames(), st.sampled_from([1024 * 1024, 512, 64]))
def test_random_connections_decode_the_same(chunks: list[bytes], max_frame_bytes: int) -> None:
    run_both(chunks, max_frame_bytes=max_frame_bytes)


@FUZZ
@given(BIG_PAYLOADS)
def test_any_value_decodes_to_the_same_python_objects(value: Any) -> None:
    """A hello's raw map is handed over whole: every msgpack value in it must come out as msgpack-python's."""
    body = pack(Pairs([("type", "hello"), ("value", value)]))
    decoder = skewless_native.ConnectionDecoder()
    (got,) = decoder.receive_data(frame(body))
    try:
        expected = _decode_body(body)
    except RemoteProtocolError as exc:
        expected = exc
    assert canon(got) == canon(expected)


@FUZZ
@given(BIG_PAYLOADS)
def test_payloads_are_judged_the_same(payload: Any) -> None:
    event = Pairs([("stream", "s1"), ("seq", 1), ("source_ts_us", 2), ("payload", payload)])
    run_both([frame(pack(HELLO)) + frame(pack({"type": "events", "events": [event]}))])


@FUZZ
@given(st.lists(st.tuples(st.one_of(st.just(NO_PAYLOAD), PAYLOADS), st.integers(0, 2**63 - 1)), min_size=1,
                max_size=4))
def test_the_decoder_digests_each_event_as_the_tracker_does(events: list[tuple[Any, int]]) -> None:
    """The digest the decoder makes of each event (native/src/frame.rs; the tracker's admit_run uses it while the
    event's IncomingEvent is not made) is the tracker's native `event_digest` of the decoded payload and timestamp:
    maps with repeated keys, keys out of order, nesting, every scalar; None for a refused payload, and for every
    event once Python made it."""
    body = {"type": "events", "events": [
        Pairs([("stream", "s1"), ("seq", seq), ("source_ts_us", ts)]
              + ([] if payload is NO_PAYLOAD else [("payload", payload)]))
        for seq, (payload, ts) in enumerate(events)]}
    decoder = skewless_native.ConnectionDecoder()
    decoder.receive_data(frame(pack(HELLO)))
    decoder.accept_hello(DECLARED)
    (batch,) = decoder.receive_data(frame(pack(body)))
    decoded = batch.events.decoded_digests
    digests = native_event_digests()
    want = [None if type(event.payload) is RejectedPayload else digests.event_digest(event.source_ts_us, event.payload)
            for event in batch.events]
    assert decoded == want
    assert batch.events.decoded_digests == [None] * len(events)


@FUZZ
@given(st.binary(max_size=40))
def test_arbitrary_bodies_fail_or_decode_the_same(body: bytes) -> None:
    run_both([frame(pack(HELLO)), frame(body) if body else b"\x00\x00\x00\x00"])


@FUZZ
@given(st.binary(max_size=60), st.integers(0, 200))
def test_a_valid_events_body_with_one_byte_changed(tail: bytes, at: int) -> None:
    event = {"stream": "s1", "seq": 3, "source_ts_us": 9, "payload": {"k": [1, 2.5, "é", None, True]}}
    body = bytearray(pack({"type": "events", "events": [event, event]}) + tail[:3])
    body[at % len(body)] = tail[0] if tail else 0xc1
    run_both([frame(pack(HELLO)), frame(bytes(body))])


@pytest.mark.parametrize("body", [
    b"\x91" * 1023 + b"\x90",  # 1024 nested containers: msgpack-python's limit
    b"\x91" * 1024 + b"\x90",  # one more: StackError
    b"\x91" * 1024 + b"\xdd\xff\xff\xff\xff",  # the stack is checked before the length
    b"\xdd\xff\xff\xff\xff",  # a length above the body's, checked before any element
    b"\xdf\x00\x01\x00\x00",
    b"\xd4\xff\x00",  # a timestamp of 1 byte
    b"\xd4\x80\x00",  # ext codes below 0 but -1: msgpack.ExtType refuses them
    b"\xd7\xff\xff\xff\xff\xfc\x00\x00\x00\x01",  # nanoseconds above 999,999,999
    b"\xa3\xed\xa0\x80",  # an encoded surrogate
    b"\x81\x01\x02\xc1",  # a non-string key, then extra data
    pack(nested(100, Pairs([(1, "x"), ("k", [b"b", 1.5, {"a": None}])]))),  # converted without recursion
])
def test_msgpack_edge_cases(body: bytes) -> None:
    wrapped = frame(b"\x82\xa4type\xa5hello\xa1v" + body)
    run_both([wrapped])
    run_both([frame(pack(HELLO)), frame(body)])


@pytest.mark.parametrize("payload", [
    nested(31), nested(32), nested(33), nested(200),
    {"a" * 50: {"é" * 41: 2**64 - 1}},
    Pairs([("k", 1), (b"k", 2)]),
    Pairs([("k", 1), (1.5e300, 2)]),
    Pairs([("k", 1), (1113178120592002.25, 2)]),  # repr breaks the tie to the even digit
    Pairs([("k", 1), (b"'\"\x00\xff" * 12, 2)]),
    Pairs([([1, 2], 1)]),
    Pairs([(Pairs([(1, 2)]), 1)]),
    Pairs([(msgpack.ExtType(3, b""), 1)]),
    [float("nan")], {"x": float("-inf")}, 2**63, msgpack.Timestamp(1, 2),
])
def test_payload_edge_cases(payload: Any) -> None:
    event = Pairs([("stream", "s1"), ("seq", 1), ("source_ts_us", 2), ("payload", payload)])
    run_both([frame(pack(HELLO)) + frame(pack({"type": "events", "events": [event]}))])


def test_a_type_with_non_ascii_is_quoted_by_python_repr() -> None:
    kind = "évé\u200b\x85nts"
    (error,) = skewless_native.ConnectionDecoder().receive_data(encode_frame({"type": kind}))
    assert type(error) is UnexpectedMessage
    assert str(error) == f"message {kind!r} not allowed in state await_hello"


def test_a_hello_pauses_decoding_until_the_shell_accepts_it() -> None:
    decoder = skewless_native.ConnectionDecoder()
    event = {"stream": "s1", "seq": 0, "source_ts_us": 5, "payload": {"x": 1}}
    data = encode_frame(HELLO) + encode_frame({"type": "events", "events": [event]}) + encode_frame({"type": "bye"})
    assert decoder.receive_data(data) == [HELLO]
    assert decoder.state == "hello_pending"
    assert decoder.decode() == []
    decoder.accept_hello(DECLARED)
    assert decoder.decode() == [EventBatch((IncomingEvent("s1", 0, 5, {"x": 1}),)), Bye()]
    assert decoder.state == "draining"
    assert decoder.receive_data(b"\x00\x00") == []
    assert decoder.buffered_bytes == 2


def test_a_refused_payload_keeps_its_place() -> None:
    decoder = skewless_native.ConnectionDecoder()
    decoder.receive_data(encode_frame(HELLO))
    decoder.accept_hello(DECLARED)
    events = [{"stream": "s1", "seq": i, "source_ts_us": 5, "payload": p} for i, p in enumerate([b"x", 1])]
    (batch,) = decoder.receive_data(encode_frame({"type": "events", "events": events}))
    assert batch.events == (
        IncomingEvent("s1", 0, 5, RejectedPayload(
            "payload: bytes (msgpack bin) are not JSON; encode them into a string (e.g. base64) before sending")),
        IncomingEvent("s1", 1, 5, 1))


def test_events_are_built_in_their_slots_off_the_collector() -> None:
    """Each IncomingEvent allocated without its __init__ (events.rs, ``new_incoming_event``): of the class, every
    field set, untracked by the cyclic collector (its payload, made for it alone, is tracked as CPython decides),
    and freed by reference counting alone; so is the frame that holds the events' fields (native/src/frame.rs)."""
    decoder = skewless_native.ConnectionDecoder()
    decoder.receive_data(encode_frame(HELLO))
    decoder.accept_hello(DECLARED)
    events = [{"stream": "s1", "seq": 7, "source_ts_us": 5, "payload": {"x": [1]}}]
    (batch,) = decoder.receive_data(encode_frame({"type": "events", "events": events}))
    (event,) = batch.events
    assert type(event) is IncomingEvent and event == IncomingEvent("s1", 7, 5, {"x": [1]}, None)
    assert not gc.is_tracked(event) and gc.is_tracked(event.payload) and not gc.is_tracked(batch.events)
    payload = event.payload
    before = sys.getrefcount(payload)
    gc.disable()
    try:
        del batch, event
        # the event's reference alone: the frame kept the map payload as its JSON (native/src/payload.rs)
        assert sys.getrefcount(payload) == before - 1
    finally:
        gc.enable()


def test_an_error_is_the_last_item_and_the_decoder_takes_no_more_bytes() -> None:
    decoder = skewless_native.ConnectionDecoder()
    items = decoder.receive_data(encode_frame(HELLO) + frame(b"\xc1"))
    assert items == [HELLO]
    decoder.accept_hello(DECLARED)
    (error,) = decoder.decode()
    assert type(error) is MalformedFrame
    assert str(error) == "frame body is not valid msgpack: FormatError"
    assert decoder.receive_data(encode_frame({"type": "bye"})) == []
    assert decoder.buffered_bytes == 0


def test_a_panic_is_a_runtime_error_and_poisons_the_decoder() -> None:
    decoder = skewless_native.ConnectionDecoder()
    with pytest.raises(RuntimeError, match="internal error: a panic raised on purpose"):
        decoder._panic_for_test()
    with pytest.raises(RuntimeError, match="failed with an internal error earlier"):
        decoder.receive_data(b"")


def test_max_frame_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_frame_bytes must be positive"):
        skewless_native.ConnectionDecoder(0)


def test_the_deepest_hello_fits_a_thread_with_a_small_stack() -> None:
    """msgpack-python's 1,024 nested containers: decoded and converted without recursion (dropping the decoded
    value recurses, in frames of a few dozen bytes)."""
    import threading

    body = b"\x82\xa4type\xa5hello\xa1v" + b"\x91" * 1022 + b"\x90"
    got: list[Any] = []
    previous = threading.stack_size(128 * 1024)  # musl's default thread stack
    try:
        thread = threading.Thread(target=lambda: got.extend(skewless_native.ConnectionDecoder().receive_data(
            frame(body))))
        thread.start()
        thread.join()
    finally:
        threading.stack_size(previous)
    assert len(got) == 1 and type(got[0]) is dict


@FUZZ
@given(st.lists(BIG_PAYLOADS, min_size=1, max_size=5))
def test_the_rust_side_payload_json_is_orjsons(payloads: list[Any]) -> None:
    """The Rust path keeps an accepted payload as its record JSON: orjson's bytes for the object Python decodes."""
    events = [Pairs([("stream", "s1"), ("seq", i), ("source_ts_us", 2), ("payload", p)])
              for i, p in enumerate(payloads)]
    body = pack({"type": "events", "events": events})
    try:
        batch = parse_events(_decode_body(body), 100, frozenset(DECLARED))
    except RemoteProtocolError:
        return  # a frame refused whole (by msgpack-python's limits): no events on either path
    expected = [e.payload.reason if type(e.payload) is RejectedPayload else orjson.dumps(e.payload)
                for e in batch.events]
    rust = skewless_native.ConnectionDecoder()
    rust.receive_data(frame(pack(HELLO)))
    rust.accept_hello(DECLARED)
    assert rust._payload_json_rust_only(frame(body)) == expected


def test_a_frame_of_events_is_the_tuple_it_stands_for() -> None:
    """The native decoder's EventFrame (native/src/frame.rs): equal to the Python decoder's tuple, read by index
    (negative too), slice and iteration, each IncomingEvent made once and then the same object."""
    body = {"type": "events", "events": [{"stream": "s1", "seq": i, "source_ts_us": 5 + i, "payload": {"v": i}}
                                         for i in range(3)]}
    python = GatewaySession()
    python.receive_data(encode_frame(HELLO))
    (expected,) = python.receive_data(encode_frame(body))
    decoder = skewless_native.ConnectionDecoder()
    decoder.receive_data(encode_frame(HELLO))
    decoder.accept_hello(DECLARED)
    (batch,) = decoder.receive_data(encode_frame(body))
    frame = batch.events
    assert type(frame) is skewless_native.EventFrame and len(frame) == 3 and frame.made == 0
    assert frame[-1] == IncomingEvent("s1", 2, 7, {"v": 2}) and frame[2] is frame[-1] and frame.made == 1
    assert frame == expected.events and expected.events == frame
    assert (frame != expected.events) is False
    assert frame[1:] == expected.events[1:] and list(frame) == list(expected.events) and frame.made == 3
    assert frame == skewless_native.EventFrame(expected.events) and frame != list(expected.events)
    with pytest.raises(IndexError):
        frame[3]
    with pytest.raises(TypeError):
        frame["0"]
    with pytest.raises(TypeError):
        hash(frame)


def test_an_in_order_frame_goes_through_the_native_core_without_its_incoming_events() -> None:
    """Frames of one stream's in-order events through the native ingest core: the records of the Python core, and
    after the source's first frame (its stream's first admissions and its joining take the Python paths) of each
    frame's events only the first made (the tracker and the pipeline read its stream in Python), none of the rest."""
    def core(native: bool) -> IngestCore:
        config = IngestConfig()
        if native:
            config = IngestConfig(record_builder=native_record_builder, event_digests=native_event_digests,
                                  pipeline=with_core(config.pipeline, "native"))
        made = IngestCore(TopicNames("t"), IdentityMapping(), config)
        made.stream_created("s1")
        made.source_registered("src", ("s1",), 10)
        return made

    python, native = core(False), core(True)
    for first in range(0, 150, 50):
        events = [IncomingEvent("s1", i, 10 + i, {"v": i}) for i in range(first, first + 50)]
        frame = skewless_native.EventFrame(events)
        assert native.events_received(ConnectionId(1), "src", frame, 100 + first) == python.events_received(
            ConnectionId(1), "src", tuple(events), 100 + first)
        assert frame.made == (50 if first == 0 else 1)


def test_a_made_event_of_a_frame_is_read_as_it_is_now() -> None:
    """Once an IncomingEvent of a frame was made, the native readers read that object, as they read a tuple's: an
    assignment to it is seen (the tuple path sees it too)."""
    frame = skewless_native.EventFrame([IncomingEvent("s1", i, 5, {"v": i}) for i in range(3)])
    builder = native_record_builder()
    assert not builder.any_payload_of_class(frame, RejectedPayload)
    frame[1].payload = RejectedPayload("changed after it was made")
    assert builder.any_payload_of_class(frame, RejectedPayload) and frame.made == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 6), st.lists(st.integers(-8, 8) | st.none(), min_size=3, max_size=3), st.integers(-8, 8))
def test_a_frame_indexes_and_slices_as_its_tuple(count: int, bounds: list[int | None], at: int) -> None:
    """EventFrame's index (negative too, out of range an IndexError), slice (any step) and iteration against the
    tuple of the same events."""
    events = tuple(IncomingEvent("s1", i, 5 + i, {"v": i}) for i in range(count))
    frame = skewless_native.EventFrame(events)
    start, stop, step = bounds
    if step == 0:
        step = None
    assert frame[start:stop:step] == events[start:stop:step]
    if -count <= at < count:
        assert frame[at] == events[at] and frame[at] is frame[at % count]
    else:
        with pytest.raises(IndexError):
            frame[at]
    assert tuple(frame) == events and len(frame) == count and bool(frame) == bool(events)
