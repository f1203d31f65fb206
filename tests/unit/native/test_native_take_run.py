"""``SequenceReorderer.take_run`` (native/src/sequence/run.rs), ``IngestPipeline.push_many``'s in-order fast path in
one call, against the pipeline running the Python cores (the specification): the same ``push_many`` calls give the
same outputs, counters and reorderer state, through gaps, duplicates, late and future-dated events, timestamps out
of the contract's range, interval events, frames mixing streams and the mappings the gateway passes with them."""

from __future__ import annotations

import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.records import MAX_TS_US, MIN_TS_US
from contract.wire.messages import AtomicInterval, IncomingEvent
from gateway.native import with_core
from reorder.pipeline import IngestPipeline, PipelineConfig
from reorder.records import SourceEvent
from timesync.clocks import FixedOffsetMapping, IdentityMapping

T0 = 1_700_000_000_000_000
SOURCES = ("a", "b")
STREAMS = ("s", "t")
CLOCK = FixedOffsetMapping({"a": 0, "b": 2_000}, error_bound_us=5)


def pipelines() -> list[IngestPipeline]:
    return [IngestPipeline(CLOCK, PipelineConfig()), IngestPipeline(CLOCK, with_core(PipelineConfig(), "native"))]


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_push_many_with_take_run_gives_the_python_cores_outputs(data: st.DataObject) -> None:
    both = pipelines()
    now = T0
    next_seq = {(source, stream): 0 for source in SOURCES for stream in STREAMS}
    for source in SOURCES:
        assert both[1].register(source, STREAMS, now) == both[0].register(source, STREAMS, now)
    for _ in range(data.draw(st.integers(1, 12))):
        now += data.draw(st.sampled_from([0, 500, 50_000, 400_000]))
        if data.draw(st.integers(0, 5)) == 0:
            assert both[1].advance(now) == both[0].advance(now)
            continue
        source = data.draw(st.sampled_from(SOURCES))
        events, mappings = [], []
        for _ in range(data.draw(st.integers(1, 8))):
            stream = data.draw(st.sampled_from(STREAMS[:1] * 4 + STREAMS[1:]))
            seq = max(0, next_seq[source, stream] + data.draw(st.sampled_from([0] * 8 + [1, 3, -1, -2])))
            next_seq[source, stream] = max(next_seq[source, stream], seq + 1)
            stamp = data.draw(st.sampled_from([T0 + 10 * seq] * 6 + [now + 120_000_000, -(2**62), 2**63]))
            interval = data.draw(st.sampled_from([None] * 6 + [AtomicInterval(stamp - 50)]))
            events.append(IncomingEvent(stream, seq, stamp, {"n": seq}, interval))
            mappings.append(CLOCK.to_reference(source, stamp))
        given_mappings = mappings if data.draw(st.booleans()) else None
        # The native pipeline gets a list, or the frame the native decoder hands (native/src/frame.rs).
        frame = skewless_native.EventFrame(events) if data.draw(st.booleans()) else list(events)
        outputs = [pipeline.push_many(source, given, now, given_mappings)
                   for pipeline, given in zip(both, (list(events), frame), strict=True)]
        assert outputs[1] == outputs[0]
    now += 60_000_000
    assert both[1].advance(now) == both[0].advance(now)
    assert vars(both[1].counters) == vars(both[0].counters)
    for stream in STREAMS:
        assert both[1].watermark_us(stream) == both[0].watermark_us(stream)
    assert both[1].buffered() == both[0].buffered()


def test_a_run_stops_before_the_first_event_off_the_fast_path() -> None:
    """Taken: seqs 0 and 1; not seq 3 (a gap). From seq 2: not the other stream's event, nor an interval event, nor
    a future-dated one: each run stops before it, taking nothing of it."""
    reorderer = skewless_native.SequenceReorderer("a", "s")
    limits = (60_000_000, MIN_TS_US, MAX_TS_US, MIN_TS_US)
    clock = IdentityMapping()

    def take(events: list[IncomingEvent], start: int) -> tuple[list[tuple[SourceEvent, int, tuple[int, int]]], int]:
        return reorderer.take_run(events, start, "a", T0, None, clock, SourceEvent, limits)

    events = [IncomingEvent("s", 0, T0 - 5, 1), IncomingEvent("s", 1, T0 - 4, None), IncomingEvent("s", 3, T0, 3)]
    run, next_index = take(events, 0)
    assert next_index == 2
    assert run == [(SourceEvent("a", "s", 0, T0 - 5, 1, None), T0, (T0 - 5, 0)),
                   (SourceEvent("a", "s", 1, T0 - 4, None, None), T0, (T0 - 4, 0))]
    assert all(type(item[0]) is SourceEvent for item in run)
    for stopper in (IncomingEvent("t", 2, T0, 0), IncomingEvent("s", 2, T0 - 50, 0, AtomicInterval(T0 - 60)),
                    IncomingEvent("s", 2, T0 + 60_000_001, 0)):
        assert take([stopper], 0) == ([], 0)
    assert reorderer.expected_seq == 2 and reorderer.counters.in_order == 2
