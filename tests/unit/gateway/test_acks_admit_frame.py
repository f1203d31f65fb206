"""``DeliveryTracker.admit_frame`` (a frame's admissions with the in-order seqs accepted without a call each) against
``admit`` called per event, its specification: the same admissions and the same state (digests included), through
duplicates, conflicts, payloads orjson refuses (an int key), seq jumps, confirmations, give-ups, failures,
compaction, forgetting and resumes."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from contract.wire.messages import IncomingEvent
from gateway.acks import ACCEPTED, CONFLICT, DUPLICATE, SEQ_JUMP, DeliveryTracker

SOURCES = ("a", "b")
STREAMS = ("s", "t")


def state(tracker: DeliveryTracker) -> Any:
    progress = {key: {name: copy.deepcopy(getattr(entry, name)) for name in type(entry).__slots__}
                for key, entry in tracker._progress.items()}
    for entry in progress.values():
        entry["confirmed"], entry["given_up"] = list(entry["confirmed"]), list(entry["given_up"])
    return progress, dict(tracker._floors)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_admit_frame_is_admit_per_event(data: st.DataObject) -> None:
    spec, frames = DeliveryTracker(max_seq_jump=50), DeliveryTracker(max_seq_jump=50)
    for _ in range(data.draw(st.integers(1, 20))):
        source = data.draw(st.sampled_from(SOURCES))
        op = data.draw(st.sampled_from(["frame"] * 5 + ["confirm", "give_up", "fail", "compact", "forget", "resume"]))
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
        elif op == "confirm":
            assert frames.confirmed(source, stream, seq) == spec.confirmed(source, stream, seq)
        elif op == "give_up":
            last = seq + data.draw(st.integers(0, 5))
            assert frames.give_up(source, stream, seq, last) == spec.give_up(source, stream, seq, last)
        elif op == "fail":
            frames.failed(source, stream, seq)
            spec.failed(source, stream, seq)
        elif op == "compact":
            frames.compact(source, STREAMS)
            spec.compact(source, STREAMS)
        elif op == "forget":
            frames.forget(source, STREAMS)
            spec.forget(source, STREAMS)
        else:
            frames.resume(source, stream, seq)
            spec.resume(source, stream, seq)
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
