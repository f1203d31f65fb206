"""``DeliveryTracker.admit_frame`` (a frame's admissions with the in-order seqs accepted without a call each) against
``admit`` called per event, its specification: the same admissions and the same state (digests included), through
duplicates, conflicts, payloads orjson refuses (an int key), seq jumps, confirmations, give-ups, failures,
compaction, forgetting and resumes."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.wire.messages import IncomingEvent
from gateway.acks import ACCEPTED, CONFLICT, DUPLICATE, SEQ_JUMP, DeliveryTracker
from tests.unit.gateway.tracker_ops import COMMON_OPS, SOURCES, STREAMS, apply_to_both, state


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_admit_frame_is_admit_per_event(data: st.DataObject) -> None:
    spec, frames = DeliveryTracker(max_seq_jump=50), DeliveryTracker(max_seq_jump=50)
    for _ in range(data.draw(st.integers(1, 20))):
        source = data.draw(st.sampled_from(SOURCES))
        op = data.draw(st.sampled_from(["frame"] * 5 + COMMON_OPS))
        stream = data.draw(st.sampled_from(STREAMS))
        seq = data.draw(st.integers(0, 40))
        if op == "frame":
            events = [IncomingEvent(data.draw(st.sampled_from(STREAMS[:1] * 3 + STREAMS[1:])),
                                    data.draw(st.integers(0, 40) | st.integers(100, 200)),
                                    data.draw(st.sampled_from([10, 10, 11])),
                                    data.draw(st.sampled_from([1, 1, 2, {"b": 1, "a": [2.5]}, {1: "int key"}])))
                      for _ in range(data.draw(st.integers(0, 8)))]
            if data.draw(st.booleans()):  # an in-order run after what the stream holds
                start = (spec.acked_through(source, stream) or 0) + spec.unacked(source, stream) + 1
                events += [IncomingEvent(stream, start + i, 10, 1) for i in range(data.draw(st.integers(1, 6)))]
            expected = [spec.admit(source, e.stream, e.seq, (e.source_ts_us, e.payload)) for e in events]
            admissions = frames.admit_frame(source, events)
            assert (admissions if admissions is not None else [ACCEPTED] * len(events)) == expected
            assert admissions is None or any(a is not ACCEPTED for a in admissions)
        else:
            apply_to_both(op, frames, spec, source, stream, seq, data)
        assert state(frames) == state(spec)


def test_a_hand_made_frame() -> None:
    """0-2 accepted; 1 again a duplicate; 2 with another payload a conflict; 500 past the jump limit; 3 accepted."""
    tracker = DeliveryTracker(max_seq_jump=100)
    events = [IncomingEvent("s", seq, 10, 1) for seq in (0, 1, 2)]
    assert tracker.admit_frame("a", events) is None
    events = [IncomingEvent("s", 1, 10, 1), IncomingEvent("s", 2, 10, 2), IncomingEvent("s", 500, 10, 1),
              IncomingEvent("s", 3, 10, 1)]
    assert tracker.admit_frame("a", events) == [DUPLICATE, CONFLICT, SEQ_JUMP, ACCEPTED]
    assert tracker.unacked("a", "s") == 4
