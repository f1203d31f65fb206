"""``MultiSourceMerger.push_in_order`` (native/src/pipeline.rs): ``push_many``'s ``take_run`` and ``_push_run`` of a
run in one native call, against the same native core taking the two calls (``take_run``, then ``push_run_built``)
and against the Python cores (the specification): the same actions, byte for byte, counters and progress, through
frames mixing streams, gaps, duplicates, late and out-of-range stamps, interval events, refused payloads, clock
mappings with error bounds, and merges that release events pushed by earlier calls."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.records import MAX_TS_US, MIN_TS_US
from contract.topics import TopicNames
from contract.wire.messages import AtomicInterval, IncomingEvent, RejectedPayload
from gateway.ingest import ConnectionId, IngestConfig, IngestCore, Produce
from gateway.native import native_event_digests, native_record_builder, native_reference_mapping, with_core
from reorder.pipeline import PushInOrder, _StreamPipeline
from reorder.records import SourceEvent
from timesync.clocks import FixedOffsetMapping, IdentityMapping

T0 = 1_700_000_000_000_000
SOURCES = ("a", "é-b", "c")
STREAMS = ("s", "t")


def build_core(core: str, fused: bool = True) -> IngestCore:
    config = IngestConfig(max_record_bytes=900)
    if core == "native":
        config = IngestConfig(max_record_bytes=900, record_builder=native_record_builder,
                              event_digests=native_event_digests, pipeline=with_core(config.pipeline, "native"),
                              reference_mapping=native_reference_mapping)
    ingest = IngestCore(TopicNames("t"), FixedOffsetMapping({"a": 0, "é-b": 1_500, "c": -700}, error_bound_us=3),
                        config)
    if not fused:
        ingest.pipeline._push_in_order_of = lambda pipeline: None  # type: ignore[method-assign]
    for stream in STREAMS:
        ingest.stream_created(stream)
    return ingest


class Counting:
    """Counts the runs ``push_in_order`` pushed itself (not handed back as items)."""

    def __init__(self, ingest: IngestCore) -> None:
        self.pushed = 0
        of = ingest.pipeline._push_in_order_of

        def counting_of(pipeline: _StreamPipeline) -> PushInOrder | None:
            push_in_order = of(pipeline)
            if push_in_order is None:
                return None

            def call(*args: Any) -> Any:
                result = push_in_order(*args)
                self.pushed += result[1] is None and result[0] > args[3]
                return result

            return call

        ingest.pipeline._push_in_order_of = counting_of  # type: ignore[method-assign]


payloads = st.one_of(st.integers(0, 9), st.just({"b": 1, "a": [2.5]}), st.just(RejectedPayload("not JSON")),
                     st.just("x" * 700), st.just({"big": 2**70}))


@settings(max_examples=120, deadline=None)
@given(st.data())
def test_push_in_order_gives_the_two_calls_actions_and_the_python_ones(data: st.DataObject) -> None:
    cores = [build_core("python"), build_core("native", fused=False), build_core("native")]
    now = T0
    next_seq = {(source, stream): 0 for source in SOURCES for stream in STREAMS}
    for source in SOURCES:
        registered = [core.source_registered(source, STREAMS, now) for core in cores]
        assert registered[1] == registered[0] and registered[2] == registered[0]
    for _ in range(data.draw(st.integers(2, 10))):
        now += data.draw(st.sampled_from([100, 1_000, 5_000, 400_000]))
        for source in SOURCES:
            batch = []
            for _ in range(data.draw(st.integers(1, 7))):
                stream = data.draw(st.sampled_from(STREAMS[:1] * 3 + STREAMS[1:]))
                seq = max(0, next_seq[source, stream] + data.draw(st.sampled_from([0] * 10 + [1, 2, -1])))
                next_seq[source, stream] = max(next_seq[source, stream], seq + 1)
                stamp = T0 + 10 * seq + data.draw(st.sampled_from([0] * 8 + [-30_000, 200_000_000]))
                interval = data.draw(st.sampled_from([None] * 8 + [AtomicInterval(stamp - 30)]))
                batch.append(IncomingEvent(stream, seq, stamp, data.draw(payloads), interval))
            # The fused native core gets the frame as the native decoder hands it (native/src/frame.rs): its
            # events' fields read natively, no IncomingEvent made.
            frames = [tuple(batch), tuple(batch), skewless_native.EventFrame(batch)]
            results = [core.events_received(ConnectionId(1), source, frame, now)
                       for core, frame in zip(cores, frames, strict=True)]
            assert results[1] == results[0]
            assert results[2] == results[0]
        if data.draw(st.booleans()):
            polled = [core.poll(now) for core in cores]
            assert polled[1] == polled[0] and polled[2] == polled[0]
    now += 10_000_000
    advanced = [core.advance(now) for core in cores]
    assert advanced[1] == advanced[0] and advanced[2] == advanced[0]
    for core in cores[1:]:
        assert vars(core.counters) == vars(cores[0].counters)
        assert vars(core.pipeline.counters) == vars(cores[0].pipeline.counters)
        assert [core.stream_progress(s) for s in STREAMS] == [cores[0].stream_progress(s) for s in STREAMS]


def test_plain_rounds_are_pushed_in_one_call_each() -> None:
    """Rounds of in-order frames, two streams in each frame: every run is pushed by ``push_in_order`` itself (two per
    frame), with the Python cores' actions; a frame whose run stops before a gap of its own stream hands the run back
    (``push_many`` pushes it with the gap's event after)."""
    cores = [build_core("python"), build_core("native")]
    counting = Counting(cores[1])
    for source in SOURCES:
        assert cores[1].source_registered(source, STREAMS, T0) == cores[0].source_registered(source, STREAMS, T0)
    produced = 0
    for round_index in range(4):
        now = T0 + 5_000 * (round_index + 1)
        for source in SOURCES:
            batch = tuple(IncomingEvent(stream, 3 * round_index + i, T0 + 30 * round_index + 10 * i, {"i": i})
                          for stream in STREAMS for i in range(3))
            results = [core.events_received(ConnectionId(1), source, batch, now) for core in cores]
            assert results[1] == results[0]
            produced += sum(isinstance(action, Produce) for action in results[1])
    assert counting.pushed == 4 * len(SOURCES) * len(STREAMS)
    assert produced > 0
    gap = (IncomingEvent("s", 12, T0 + 200, 1), IncomingEvent("s", 14, T0 + 220, 1))
    results = [core.events_received(ConnectionId(1), "a", gap, T0 + 30_000) for core in cores]
    assert results[1] == results[0]
    assert counting.pushed == 4 * len(SOURCES) * len(STREAMS)


class ShiftingBound:
    """The identity mapping, with an error bound the test changes between frames (an estimate that moved)."""

    def __init__(self) -> None:
        self.error_us = 3

    def to_reference(self, source_id: str, source_ts_us: int) -> tuple[int, int]:
        return source_ts_us, self.error_us

    def rtt_us(self, source_id: str) -> int | None:
        return None


def test_a_held_event_released_by_a_later_push_carries_the_clocks_bound_then() -> None:
    """The merge holds a's run (b is registered and silent), the estimate's bound moves from 3 to 50 us, then b's
    frame releases both: a's records carry 50 (the clock's bound at release: `_records` looks up only the releasing
    run's mappings), b's the bound its run was mapped with, also 50; a third frame of a, released at once, carries
    its own run's 50 too. The native cores hold a's events as fields (merger/held.rs) and must say the same."""
    mappings = [ShiftingBound(), ShiftingBound()]
    cores = []
    for core, mapping in zip(("python", "native"), mappings, strict=True):
        config = IngestConfig()
        if core == "native":
            config = IngestConfig(record_builder=native_record_builder, event_digests=native_event_digests,
                                  pipeline=with_core(config.pipeline, "native"))
        ingest = IngestCore(TopicNames("t"), mapping, config)
        ingest.stream_created("s")
        for source in ("a", "b"):
            ingest.source_registered(source, ("s",), T0)
        cores.append(ingest)
    counting = Counting(cores[1])
    frames = [("a", tuple(IncomingEvent("s", i, T0 + 10 * i, {"i": i}) for i in range(3))),
              ("b", tuple(IncomingEvent("s", i, T0 + 5 + 10 * i, {"i": i}) for i in range(4))),
              ("a", tuple(IncomingEvent("s", i, T0 + 10 * i, {"i": i}) for i in range(3, 6)))]
    bounds = []
    for index, (source, batch) in enumerate(frames):
        if index == 1:
            for mapping in mappings:
                mapping.error_us = 50
        results = [core.events_received(ConnectionId(1), source, batch, T0 + 1_000 * (index + 1)) for core in cores]
        assert results[1] == results[0]
        bounds += [orjson.loads(action.value)["uncertainty_us"] for action in results[1] if isinstance(action, Produce)
                   and action.value is not None and b'"kind":"event"' in action.value]
    assert counting.pushed == 3
    assert bounds[:3] == [50, 50, 50]  # a's first run, pushed with 3, released by b's push
    assert len(bounds) >= 6 and set(bounds) == {50}


def test_bad_arguments_are_python_errors_and_a_python_builder_gets_the_items() -> None:
    """A reorderer that is not the native one is a TypeError (nothing taken); with a builder that is not the native
    one the run comes back as ``take_run``'s items, for that builder's own ``build_merged``."""
    merger = skewless_native.MultiSourceMerger("s", IdentityMapping(), None, None)
    reorderer = skewless_native.SequenceReorderer("a", "s")
    limits = (60_000_000, MIN_TS_US, MAX_TS_US, MIN_TS_US)
    events = [IncomingEvent("s", 0, T0, 1), IncomingEvent("s", 1, T0 + 1, 2)]
    with pytest.raises(TypeError):
        merger.push_in_order(object(), object(), events, 0, "a", T0, None, IdentityMapping(), SourceEvent, limits)
    assert reorderer.expected_seq == 0
    result = merger.push_in_order(reorderer, object(), events, 0, "a", T0, None, IdentityMapping(), SourceEvent,
                                  limits)
    assert result == (2, [(SourceEvent("a", "s", 0, T0, 1, None), T0, (T0, 0)),
                          (SourceEvent("a", "s", 1, T0 + 1, 2, None), T0, (T0 + 1, 0))], None, None, None)
