"""``DeliveryTracker.confirmed_run`` against ``confirmed`` called per seq, its specification: the same answer (the
first seq whose call moved the ack, the last ack those calls returned) and the same state (pending digests, the
ring of acked digests, ranges), from states made by admissions, confirmations, give-ups, failures, compaction,
forgetting and resumes; and
``IngestCore.on_committed``, which confirms a transaction's deliveries by runs, against ``on_delivered`` per
record on random transactions."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.records import ProgressRecord
from contract.topics import TopicNames
from contract.wire.messages import IncomingEvent
from gateway.acks import DeliveryTracker
from gateway.ingest import ConnectionId, DeliveryRef, IngestConfig, IngestCore, Produce
from tests.unit.gateway.tracker_ops import SOURCES, STREAMS, apply_to_both, state
from timesync.clocks import IdentityMapping

T0 = 1_700_000_000_000_000


def confirmed_per_seq(tracker: DeliveryTracker, source: str, stream: str, first: int,
                      last: int) -> tuple[int, int] | None:
    """(the first seq whose confirmation moved the ack, the last ack), or None."""
    moved_at, acked = None, None
    for seq in range(first, last + 1):
        moved = tracker.confirmed(source, stream, seq)
        if moved is not None:
            moved_at = seq if moved_at is None else moved_at
            acked = moved
    return None if moved_at is None or acked is None else (moved_at, acked)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_confirmed_run_is_confirmed_per_seq(data: st.DataObject) -> None:
    check_confirmed_run(data, lambda: DeliveryTracker(max_seq_jump=50))


def check_confirmed_run(data: st.DataObject, tracker: Callable[[], DeliveryTracker]) -> None:
    """Random operations on two trackers made by ``tracker``, runs confirmed by ``confirmed_run`` in one and by
    ``confirmed`` per seq in the other: the same answers and the same state after each."""
    spec, runs = tracker(), tracker()
    for _ in range(data.draw(st.integers(1, 25))):
        source = data.draw(st.sampled_from(SOURCES))
        stream = data.draw(st.sampled_from(STREAMS))
        op = data.draw(st.sampled_from(["admit"] * 4 + ["run"] * 4 + ["confirm", "give_up", "fail", "compact",
                                                                     "forget", "resume"]))
        seq = data.draw(st.integers(0, 40))
        if op == "admit":
            for offset in range(data.draw(st.integers(1, 8))):
                payload = data.draw(st.sampled_from([1, 2, {"a": 1}]))
                # one in ten admitted without a digest (``accept``)
                event: tuple[int, Any] | None = None if data.draw(st.integers(0, 9)) == 0 else (10, payload)
                assert runs.admit(source, stream, seq + offset, event) == spec.admit(source, stream, seq + offset,
                                                                                    event)
        elif op == "run":
            acked = spec.acked_through(source, stream)
            first = (acked if acked is not None else -1) + 1 if data.draw(st.booleans()) else seq
            last = first + data.draw(st.integers(-1, 200 if data.draw(st.booleans()) else 10))
            assert runs.confirmed_run(source, stream, first, last) == confirmed_per_seq(spec, source, stream, first,
                                                                                        last)
        else:
            apply_to_both(op, runs, spec, source, stream, seq, data)
        assert state(runs) == state(spec)


def test_a_run_past_the_ring_keeps_the_newest_digests() -> None:
    """300 seqs confirmed in one run: the ack is 299 and a resend of 299 with another payload is a conflict, of 100
    (out of the 128-digest ring) a plain duplicate, as after 300 single confirmations."""
    tracker = DeliveryTracker()
    for seq in range(300):
        tracker.admit("a", "s", seq, (10, seq))
    assert tracker.confirmed_run("a", "s", 0, 299) == (0, 299)
    assert tracker.unacked("a", "s") == 0
    assert tracker.admit("a", "s", 299, (10, -1)) == "conflict"
    assert tracker.admit("a", "s", 299, (10, 299)) == "duplicate"
    assert tracker.admit("a", "s", 100, (10, -1)) == "duplicate"
    assert tracker.confirmed_run("a", "s", 300, 299) is None  # an empty run


def _core(config: IngestConfig | None = None) -> IngestCore:
    core = IngestCore(TopicNames(), IdentityMapping(), config or IngestConfig(checkpoint_interval_us=1_000_000))
    for stream in STREAMS:
        core.stream_created(stream)
    for source in SOURCES:
        core.source_registered(source, STREAMS, T0)
    core.poll(T0)
    return core


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_on_committed_is_on_delivered_per_record(data: st.DataObject) -> None:
    """The same frames into two cores; one is told each record's delivery, the other each transaction's commit
    (records in the order they were produced, some transactions cut in the middle of a frame's run)."""
    on_committed_against_on_delivered(data, IngestConfig(checkpoint_interval_us=1_000_000))


def on_committed_against_on_delivered(data: st.DataObject, batched_config: IngestConfig) -> None:
    """The test above with ``batched_config`` for the core told the commits (tests/unit/native: the native
    on_committed loops)."""
    cores = _core(), _core(batched_config)
    next_seq = dict.fromkeys([(s, t) for s in SOURCES for t in STREAMS], 0)
    refs: list[DeliveryRef] = []
    now_us = T0 + 100
    for _ in range(data.draw(st.integers(1, 8))):
        source = data.draw(st.sampled_from(SOURCES))
        events = []
        for _ in range(data.draw(st.integers(1, 12))):
            stream = data.draw(st.sampled_from(STREAMS))
            seq = next_seq[(source, stream)] + data.draw(st.sampled_from([0, 0, 0, 0, 1, -1]))
            seq = max(seq, 0)
            next_seq[(source, stream)] = max(next_seq[(source, stream)], seq + 1)
            events.append(IncomingEvent(stream, seq, T0 + data.draw(st.integers(0, 50)), 1))
        now_us += data.draw(st.integers(1, 30))
        produced = [[a.delivery for a in core.events_received(ConnectionId(1), source, tuple(events), now_us)
                     if type(a) is Produce and a.delivery is not None] for core in cores]
        assert produced[0] == produced[1]
        refs += [ref for ref in produced[0] if ref is not None]
    one_by_one, batched = cores
    offsets = iter(range(42, 42 + len(refs)))
    cut = 0
    while cut < len(refs):
        end = cut + data.draw(st.integers(1, len(refs) - cut))
        now_us += 5
        transaction = refs[cut:end]
        highest: dict[str, int] = {}
        for ref in transaction:
            offset = next(offsets) if ref.topic == "events" else 7
            if ref.topic == "events":
                highest[ref.stream] = offset
            one_by_one.on_delivered(ref, None, offset if ref.topic == "events" else None, now_us)
        batched.on_committed(transaction, highest, now_us)
        cut = end
    later = now_us + 1_000_000
    polled = [core.poll(later) for core in cores]
    assert polled[0] == polled[1]
    checkpoints = [core.checkpoint_dirty_streams(later) for core in cores]
    assert checkpoints[0] == checkpoints[1]
    for checkpoint in checkpoints[0]:
        assert isinstance(checkpoint, Produce)
        ProgressRecord.from_dict(orjson.loads(checkpoint.value))  # a checkpoint, readable
    assert one_by_one.counters == batched.counters
    assert list(one_by_one.delivery_latencies_us) == list(batched.delivery_latencies_us)
    assert state(one_by_one.tracker) == state(batched.tracker)
