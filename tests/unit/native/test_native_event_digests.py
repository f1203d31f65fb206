"""The delivery tracker's native digests (skewless_native.EventDigests, gateway.native.native_event_digests) against
gateway.acks.event_digest, the specification: other values, the same verdicts. Two events get the same native
digest exactly when they get the same Python one, through resends with their map keys in another order, ints against
floats and bools, NaN and infinities (orjson writes them as null), -0.0, bytes and int map keys (orjson refuses them:
the repr stands in), nested payloads and timestamps; a tracker with the native digests gives the same admissions and
the same state (but for the digests' values) as one with the Python digests admitting per event."""

from __future__ import annotations

import math
import random
from typing import Any

import orjson
import pytest
import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.wire.messages import IncomingEvent, RejectedPayload
from gateway.acks import ACCEPTED, CONFLICT, DUPLICATE, DeliveryTracker, digest_body, event_digest
from gateway.native import native_event_digests
from tests.unit.gateway.tracker_ops import COMMON_OPS, SOURCES, STREAMS, apply_to_both, state

scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.integers(-(2**70), 2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 1.0, 2.5, 1e16, 1e-7]),
                    st.text(max_size=4), st.sampled_from(["", "é", "\U0001f600", "\ud800", 'q"\\\n']),
                    st.binary(max_size=3))
payloads = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.text(max_size=3) | st.sampled_from(["a", "b", "A", "é", "\U0001f600"]), inner, max_size=4),
        st.dictionaries(st.integers(0, 2), inner, max_size=2),
    ),
    max_leaves=10,
)


def reordered(value: Any, rng: random.Random) -> Any:
    """The same value with every map's keys in another order (what a resend may do)."""
    if type(value) is dict:
        items = [(k, reordered(v, rng)) for k, v in value.items()]
        rng.shuffle(items)
        return dict(items)
    if type(value) is list:
        return [reordered(v, rng) for v in value]
    if type(value) is tuple:
        return tuple(reordered(v, rng) for v in value)
    return value


@settings(max_examples=600, deadline=None)
@given(payloads, payloads, st.sampled_from([10, 10, 11, -1, -2, 2**61 - 1 + 10]), st.sampled_from([10, 11]),
       st.randoms(use_true_random=False))
def test_same_native_digest_exactly_when_the_same_python_digest(first: Any, other: Any, ts: int, other_ts: int,
                                                                rng: random.Random) -> None:
    native = native_event_digests()
    for second, second_ts in ((reordered(first, rng), ts), (reordered(first, rng), other_ts), (other, ts),
                              (other, other_ts)):
        same_python = event_digest(ts, first) == event_digest(second_ts, second)
        assert (native.event_digest(ts, first) == native.event_digest(second_ts, second)) == same_python


class Opaque:
    """A payload the native writer cannot write: the body function below writes the value inside (orjson)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner


def opaque_body(payload: Any) -> bytes | str:
    return digest_body(payload.inner if type(payload) is Opaque else payload)


@settings(max_examples=600, deadline=None)
@given(payloads)
def test_the_native_sorted_json_is_orjsons_byte_for_byte(payload: Any) -> None:
    """A payload the native writer writes has the digest of the same payload written by orjson (through the body
    function), so a payload's digest does not depend on which of the two wrote it."""
    import skewless_native

    digests = skewless_native.EventDigests(opaque_body)
    assert digests.event_digest(7, payload) == digests.event_digest(7, Opaque(payload))


def test_hand_made_verdicts() -> None:
    native = native_event_digests()

    def same(a: Any, b: Any) -> bool:
        assert (event_digest(1, a) == event_digest(1, b)) == (native.event_digest(1, a) == native.event_digest(1, b))
        return native.event_digest(1, a) == native.event_digest(1, b)

    assert same({"b": 1, "a": {"y": [1, 2.5], "x": None}}, {"a": {"x": None, "y": [1, 2.5]}, "b": 1})
    assert not same({"a": 1}, {"a": 1.0})
    assert not same({"a": 1}, {"a": True})
    assert not same([0.0], [-0.0])
    assert same(math.nan, None)  # orjson writes NaN as null: the Python core takes them as the same payload
    assert same(b"x", b"x") and not same(b"x", b"y")
    assert same({1: "a", 2: "b"}, {1: "a", 2: "b"})
    assert same(RejectedPayload("why"), RejectedPayload("why"))
    assert not same(RejectedPayload("why"), RejectedPayload("other"))
    assert orjson.dumps({"é": 1, "z": 2, "\U0001f600": 3}, option=orjson.OPT_SORT_KEYS) == digest_body(
        {"\U0001f600": 3, "z": 2, "é": 1})


RESENT = [1, 1.0, True, None, math.nan, {"b": 1, "a": [2.5]}, {"a": [2.5], "b": 1}, {1: "int key"}, b"x",
          [{"k": {"n": -0.0}}], [{"k": {"n": 0.0}}]]


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_a_tracker_with_native_digests_admits_as_the_python_one(data: st.DataObject) -> None:
    """``admit_frame`` with the native digests (its runs in ``admit_run``) against ``admit`` per event with the
    Python digests: the same admissions, the same state but for the digests' values (the same seqs hold one)."""
    spec, native = DeliveryTracker(max_seq_jump=50), DeliveryTracker(max_seq_jump=50, digests=native_event_digests())
    for _ in range(data.draw(st.integers(1, 20))):
        source = data.draw(st.sampled_from(SOURCES))
        op = data.draw(st.sampled_from(["frame"] * 5 + COMMON_OPS))
        stream = data.draw(st.sampled_from(STREAMS))
        seq = data.draw(st.integers(0, 40))
        if op == "frame":
            events = [IncomingEvent(data.draw(st.sampled_from(STREAMS[:1] * 3 + STREAMS[1:])),
                                    data.draw(st.integers(0, 40) | st.integers(100, 200)),
                                    data.draw(st.sampled_from([10, 10, 11])), data.draw(st.sampled_from(RESENT)))
                      for _ in range(data.draw(st.integers(0, 8)))]
            if data.draw(st.booleans()):  # an in-order run after what the stream holds
                start = (spec.acked_through(source, stream) or 0) + spec.unacked(source, stream) + 1
                events += [IncomingEvent(stream, start + i, 10, data.draw(st.sampled_from(RESENT)))
                           for i in range(data.draw(st.integers(1, 6)))]
            expected = [spec.admit(source, e.stream, e.seq, (e.source_ts_us, e.payload)) for e in events]
            # The frame the native decoder hands (native/src/frame.rs), or the list.
            given = skewless_native.EventFrame(events) if data.draw(st.booleans()) else events
            admissions = native.admit_frame(source, given)
            assert (admissions if admissions is not None else [ACCEPTED] * len(events)) == expected
        else:
            apply_to_both(op, native, spec, source, stream, seq, data)
        assert without_digest_values(state(native)) == without_digest_values(state(spec))


def without_digest_values(tracker_state: Any) -> Any:
    progress, floors = tracker_state
    for entry in progress.values():
        entry["pending"] = {seq: digest is not None for seq, digest in entry["pending"].items()}
        entry["recent_digests"] = None
    return progress, floors


def test_a_hand_made_frame_with_native_digests() -> None:
    """0-2 accepted; 1 resent with its keys in another order a duplicate; 2 with 1.0 for 1 a conflict; 3 accepted;
    then 0 once acked: with its keys in another order a duplicate, with another value a conflict."""
    tracker = DeliveryTracker(max_seq_jump=100, digests=native_event_digests())
    events = [IncomingEvent("s", seq, 10, {"a": 1, "b": [seq]}) for seq in (0, 1, 2)]
    assert tracker.admit_frame("a", events) is None
    resent = [IncomingEvent("s", 1, 10, {"b": [1], "a": 1}), IncomingEvent("s", 2, 10, {"a": 1.0, "b": [2]}),
              IncomingEvent("s", 3, 10, 1)]
    assert tracker.admit_frame("a", resent) == [DUPLICATE, CONFLICT, ACCEPTED]
    assert tracker.confirmed("a", "s", 0) == 0
    assert tracker.admit("a", "s", 0, (10, {"b": [0], "a": 1})) is DUPLICATE
    assert tracker.admit("a", "s", 0, (10, {"b": [0], "a": 2})) is CONFLICT
    assert tracker.admit("a", "s", 0, (11, {"b": [0], "a": 1})) is CONFLICT


def test_a_body_function_of_the_wrong_type_is_a_clear_error() -> None:
    import skewless_native

    def not_a_body(payload: Any) -> Any:
        return 1

    digests = skewless_native.EventDigests(not_a_body)
    with pytest.raises(TypeError, match="bytes or str"):
        digests.event_digest(1, object())


class StandIn:
    """Not an IncomingEvent: its fields are read by getattr, not from IncomingEvent's slots."""

    def __init__(self, stream: str, seq: int, source_ts_us: int, payload: Any) -> None:
        self.stream, self.seq, self.source_ts_us, self.payload = stream, seq, source_ts_us, payload


def test_admit_run_reads_incoming_events_and_other_objects_alike() -> None:
    digests = native_event_digests()
    for make in (IncomingEvent, StandIn):
        pending: dict[int, int | None] = {}
        events = [make("s", 5, 10, {"a": 1}), make("s", 6, 11, [1]), make("t", 7, 12, None)]
        assert digests.admit_run(events, 0, "s", pending, 4, 4, 10) == (2, 6)
        assert pending == {5: digests.event_digest(10, {"a": 1}), 6: digests.event_digest(11, [1])}
        assert digests.admit_run(tuple(events), 2, "t", pending, -1, -1, 10) == (3, 7)
        if make is not IncomingEvent:
            continue
        frame_pending: dict[int, int | None] = {}
        frame = skewless_native.EventFrame(events)  # the native decoder's frame (native/src/frame.rs)
        assert digests.admit_run(frame, 0, "s", frame_pending, 4, 4, 10) == (2, 6)
        assert digests.admit_run(frame, 2, "t", frame_pending, -1, -1, 10) == (3, 7)
        assert frame_pending == pending and frame.made == 0
