"""The gateway's ingest core with its native cores (gateway.native: the record builder, the tracker's digests, and
the pipeline's reorderers and mergers) against the same core running the Python ones (the specification): the same
calls in, the same actions out, byte for byte, through gaps, give-ups, late events, duplicates, heartbeats, byes and
returns, a restart from the checkpointed progress, payloads the encoder refuses, payloads the decoder refused
(RejectedPayload), interval events, two streams, and records over the size limit."""

from __future__ import annotations

import copy
from typing import Any

import skewless_native
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.topics import TopicNames
from contract.wire.messages import AtomicInterval, Heartbeat, IncomingEvent, IntervalEndpoint, RejectedPayload
from gateway.ingest import ConnectionId, IngestAction, IngestConfig, IngestCore, Produce
from gateway.native import native_event_digests, native_record_builder, native_reference_mapping, with_core
from timesync.clocks import EstimateMapping, FixedOffsetMapping, ReferenceMapping
from timesync.estimator import ClockEstimate
from timesync.store import SourceInfoStore

T0 = 1_700_000_000_000_000
SOURCES = ("a", "é-b", 'c"q')
payloads = st.one_of(
    st.none(), st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.text(max_size=8),
    st.dictionaries(st.text(max_size=4), st.integers() | st.floats() | st.text(max_size=4), max_size=3),
    st.just({"big": 2**70}),  # orjson refuses it: an encode failure, told to the source
    st.just("x" * 700),  # over the record limit below: refused as too large
    st.just(RejectedPayload("not JSON")),  # the decoder refused it: settled, never produced
)
STREAMS = ("s", "t")


def native_events(data: st.DataObject, batch: list[IncomingEvent]) -> Any:
    """The native core gets a frame's events as a tuple or as the frame the native decoder hands
    (native/src/frame.rs), drawn."""
    return skewless_native.EventFrame(batch) if data.draw(st.booleans()) else tuple(batch)


def build_core(native: bool, mapping: ReferenceMapping | None = None) -> IngestCore:
    config = IngestConfig(max_record_bytes=900)
    if native:
        config = IngestConfig(max_record_bytes=900, record_builder=native_record_builder,
                              event_digests=native_event_digests, pipeline=with_core(config.pipeline, "native"),
                              reference_mapping=native_reference_mapping)
    if mapping is None:
        mapping = FixedOffsetMapping({"a": 0, "é-b": 1_500, 'c"q': -700}, error_bound_us=3)
    core = IngestCore(TopicNames("t"), mapping, config)
    for stream in STREAMS:
        core.stream_created(stream)
    return core


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_native_record_bytes_give_the_same_actions_as_the_python_ones(data: st.DataObject) -> None:
    cores = [build_core(native=False), build_core(native=True)]
    now = T0
    next_seq = {(source, stream): 0 for source in SOURCES for stream in STREAMS}

    def both(call: str, *args: Any, native_args: tuple[Any, ...] | None = None) -> None:
        results: list[list[IngestAction]] = [getattr(cores[0], call)(*args),
                                             getattr(cores[1], call)(*(native_args or args))]
        assert results[1] == results[0]
        for offset, action in enumerate(results[0]):
            if isinstance(action, Produce) and action.delivery is not None and data.draw(st.booleans()):
                for core in cores:
                    core.on_delivered(action.delivery, None, offset, now)

    for source in SOURCES:
        both("source_registered", source, STREAMS, now)
    for _ in range(data.draw(st.integers(1, 25))):
        now += data.draw(st.sampled_from([0, 100, 5_000, 300_000, 2_500_000]))
        op = data.draw(st.sampled_from(["events"] * 4 + ["advance", "poll", "heartbeat", "bye", "restart"]))
        if op == "events":
            source = data.draw(st.sampled_from(SOURCES))
            stream = data.draw(st.sampled_from(STREAMS))
            batch = []
            for _ in range(data.draw(st.integers(1, 5))):
                seq = max(0, next_seq[source, stream] + data.draw(st.sampled_from([0, 0, 0, 1, 2, -1, -3])))
                next_seq[source, stream] = max(next_seq[source, stream], seq + 1)
                stamp = T0 + 10 * seq + data.draw(st.sampled_from([0, 0, 50, -20_000]))
                interval = data.draw(st.sampled_from([None, None, None, AtomicInterval(stamp - 30),
                                                      IntervalEndpoint("i", "start")]))
                batch.append(IncomingEvent(stream, seq, stamp, data.draw(payloads), interval))
            both("events_received", ConnectionId(1), source, tuple(batch), now,
                 native_args=(ConnectionId(1), source, native_events(data, batch), now))
        elif op == "advance":
            both("advance", now)
        elif op == "heartbeat":
            source = data.draw(st.sampled_from(SOURCES))
            both("heartbeat_received", source, Heartbeat(T0 + 10 * next_seq[source, "s"],
                                                         {stream: next_seq[source, stream] for stream in STREAMS}), now)
        elif op == "bye":
            source = data.draw(st.sampled_from(SOURCES))
            both("source_left", source, now)
            both("source_registered", source, STREAMS, now + 1)
        elif op == "restart":
            # A cut: each core comes back with what its Kafka would hold (the progress of its committed records).
            progress = [[core.stream_progress(stream) for stream in STREAMS] for core in cores]
            assert progress[1] == progress[0]
            cores = [build_core(native=False), build_core(native=True)]
            for core, held in zip(cores, progress, strict=True):
                for stream_progress in held:
                    if stream_progress is not None:
                        core.stream_recovered(copy.deepcopy(stream_progress), now)
            for source in SOURCES:  # the sources reconnect
                both("source_registered", source, STREAMS, now)
        else:
            both("poll", now)
    now += 10_000_000
    both("advance", now)
    assert vars(cores[1].counters) == vars(cores[0].counters)
    assert vars(cores[1].pipeline.counters) == vars(cores[0].pipeline.counters)
    assert [cores[1].stream_progress(stream) for stream in STREAMS] == [cores[0].stream_progress(stream)
                                                                         for stream in STREAMS]


class CountingMergedRecords:
    """The native core's merged-records builder, counting the releases it built (not handed back to _records)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.built = 0

    def build_merged(self, merged: list[Any], run: list[Any], clock: Any) -> tuple[list[object], list[int]]:
        built, handed_back = self.inner.build_merged(merged, run, clock)
        self.built += len(built) - len(handed_back)
        return built, handed_back


@settings(max_examples=80, deadline=None)
@given(st.data())
def test_rounds_of_in_order_frames_give_the_same_actions(data: st.DataObject) -> None:
    """Every source sends a frame per round, mostly in order: the merge releases inside ``push_run``, where the native
    builder builds the records of the plain releases (``build_merged``) and hands the rest back to ``_records``.
    Duplicates, gaps, stamps going back, refused and oversized payloads, interval events, two streams."""
    cores = [build_core(native=False), build_core(native=True)]
    spy = CountingMergedRecords(cores[1].pipeline.merged_records)
    cores[1].pipeline.merged_records = spy
    now = T0
    next_seq = {(source, stream): 0 for source in SOURCES for stream in STREAMS}
    for source in SOURCES:
        assert cores[1].source_registered(source, STREAMS, now) == cores[0].source_registered(source, STREAMS, now)
    for _ in range(data.draw(st.integers(3, 8))):
        now += data.draw(st.sampled_from([100, 1_000, 5_000]))
        stream = data.draw(st.sampled_from(STREAMS))
        for source in SOURCES:
            batch = []
            for _ in range(data.draw(st.integers(1, 6))):
                seq = next_seq[source, stream] + data.draw(st.sampled_from([0] * 12 + [1, -1]))
                next_seq[source, stream] = max(next_seq[source, stream], seq + 1)
                stamp = T0 + 10 * seq + data.draw(st.sampled_from([0] * 8 + [-30_000]))
                payload = data.draw(st.one_of(st.integers(0, 9), payloads))
                interval = data.draw(st.sampled_from([None] * 8 + [AtomicInterval(stamp - 30)]))
                batch.append(IncomingEvent(stream, max(0, seq), stamp, payload, interval))
            results = [core.events_received(ConnectionId(1), source, tuple(batch), now) for core in cores]
            assert results[1] == results[0]
    now += 10_000_000
    assert cores[1].advance(now) == cores[0].advance(now)
    assert vars(cores[1].counters) == vars(cores[0].counters)
    assert vars(cores[1].pipeline.counters) == vars(cores[0].pipeline.counters)


def test_plain_rounds_are_built_by_the_native_builder() -> None:
    """The rounds above without disorder: the releases are built by ``build_merged``, with the same actions."""
    cores = [build_core(native=False), build_core(native=True)]
    spy = CountingMergedRecords(cores[1].pipeline.merged_records)
    cores[1].pipeline.merged_records = spy
    for source in SOURCES:
        assert cores[1].source_registered(source, ("s",), T0) == cores[0].source_registered(source, ("s",), T0)
    actions: list[IngestAction] = []
    for round_index in range(6):
        for source in SOURCES:
            batch = tuple(IncomingEvent("s", seq, T0 + 10 * seq, {"v": seq})
                          for seq in range(5 * round_index, 5 * round_index + 5))
            results = [core.events_received(ConnectionId(1), source, batch, T0 + 1_000 * round_index)
                       for core in cores]
            assert results[1] == results[0]
            actions += results[0]
    assert vars(cores[1].pipeline.counters) == vars(cores[0].pipeline.counters)
    produced = [action for action in actions if isinstance(action, Produce) and action.delivery is not None]
    # The merge holds each source's newest round back (a source's next events may come before the others'): 30 of
    # the 90 events are released, every one of them built natively (the stream's topics were cached at creation).
    assert (len(produced), spy.built) == (30, 30)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_synced_sources_give_the_same_actions(data: st.DataObject) -> None:
    """Time sync on, as the gateway wires it: an EstimateMapping over a SourceInfoStore, the native core's the Rust
    one (native_reference_mapping) over the same store. Estimates come, change (offsets, skews, bounds: rule 9's
    clock-step check sees every event of a synced source) and go (a source time sync forgot maps as unknown again)
    between frames; the events of a frame are mapped at the take and again when an earlier frame's are released."""
    store = SourceInfoStore()
    cores = [build_core(False, EstimateMapping(store.get)), build_core(True, EstimateMapping(store.get))]
    assert type(cores[1].pipeline.clock).__name__ == "ReferenceClocks"
    now = T0
    next_seq = {(source, stream): 0 for source in SOURCES for stream in STREAMS}

    def both(call: str, *args: Any, native_args: tuple[Any, ...] | None = None) -> None:
        results: list[list[IngestAction]] = [getattr(cores[0], call)(*args),
                                             getattr(cores[1], call)(*(native_args or args))]
        assert results[1] == results[0]

    for source in SOURCES:
        both("source_registered", source, STREAMS, now)
    for _ in range(data.draw(st.integers(2, 20))):
        now += data.draw(st.sampled_from([100, 1_000, 5_000, 300_000]))
        source = data.draw(st.sampled_from(SOURCES))
        op = data.draw(st.sampled_from(["events"] * 4 + ["clock", "forget", "advance"]))
        if op == "clock":
            estimate = ClockEstimate(
                offset_us=data.draw(st.sampled_from([0, -1_000, 2_500, -40_000, 7])),
                skew_ppm=data.draw(st.sampled_from([0.0, 20.0, -3.5, 0.5]) | st.floats(-1000, 1000)),
                rtt_us=data.draw(st.integers(0, 5_000)), sync_ref_us=now - data.draw(st.integers(0, 10_000_000)),
                sample_count=10, root_error_us=data.draw(st.floats(0, 5_000)),
                skew_error_ppm=data.draw(st.floats(0, 100)), dispersion_ppm=data.draw(st.sampled_from([15.0, 0.0])))
            info = store.update(source, estimate, now)
            both("clock_changed", info, store.max_rtt_us(), now)
        elif op == "forget":
            store.remove(source)  # as timesync's forget_source: no call into the cores
        elif op == "advance":
            both("advance", now)
        else:
            stream = data.draw(st.sampled_from(STREAMS))
            batch = []
            for _ in range(data.draw(st.integers(1, 6))):
                seq = max(0, next_seq[source, stream] + data.draw(st.sampled_from([0] * 8 + [1, -1])))
                next_seq[source, stream] = max(next_seq[source, stream], seq + 1)
                stamp = now + data.draw(st.sampled_from([0, 0, -2_000, 1_500, -30_000]))
                batch.append(IncomingEvent(stream, seq, stamp, {"v": seq}))
            both("events_received", ConnectionId(1), source, tuple(batch), now,
                 native_args=(ConnectionId(1), source, native_events(data, batch), now))
    now += 10_000_000
    both("advance", now)
    assert vars(cores[1].counters) == vars(cores[0].counters)
    assert vars(cores[1].pipeline.counters) == vars(cores[0].pipeline.counters)


def test_a_freed_source_leaves_the_native_builders_header_cache() -> None:
    """Rule 11 frees an idle source's state, its cached record headers included: the native builder's cache too
    (``forget_source``), not only ``_event_headers``."""
    from gateway.ingest import IDLE_SOURCE_RETENTION_US

    core = build_core(native=True)
    builder: Any = core._record_builder
    core.source_registered("a", ("s",), T0)
    released = core.events_received(ConnectionId(1), "a", (IncomingEvent("s", 0, T0, {"v": 1}),), T0 + 100)
    produced = [action for action in released if isinstance(action, Produce) and action.delivery is not None]
    assert len(produced) == 1 and builder.cached_sources == 1
    core.on_delivered(produced[0].delivery, None, 0, T0 + 200)
    core.source_disconnected("a", T0 + 300)
    now = T0 + 300
    while core.counters.sources_forgotten < 1:
        now += 1_000_000
        assert now < T0 + 2 * IDLE_SOURCE_RETENTION_US
        core.poll(now)
    assert builder.cached_sources == 0 and core._event_headers == {}
