"""A shard without transactions (the gateway's idempotent mode) hands Kafka's delivery reports to its core in
batches (``ShardRuntime._deliveries_reported``): the queued reports after each poll, a run of delivered records in
one ``IngestCore.on_delivered_all``. Held here to its specification, ``on_delivered`` per report in the order the
reports came (what the shard did before), with reports in any order, served in any cuts, some failed: the same
acks sent at each poll, the same checkpoints, counters and tracker state. And no ack ever covers a record whose
delivery Kafka has not reported yet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaError
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.client import KafkaClientConfig
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder
from contract.wire.messages import IncomingEvent
from gateway.ingest import ConnectionId, DeliveryRef, IngestConfig, IngestCore, Produce, SendToSource
from gateway.shard import ShardRuntime, ShardSettings
from tests.unit.gateway.test_acks_confirmed_run import SOURCES, STREAMS, T0, state
from timesync.clocks import IdentityMapping
from timesync.store import SourceInfoStore

SHARD = 3


class FakeMessage:
    def __init__(self, offset: int | None) -> None:
        self._offset = offset

    def offset(self) -> int | None:
        return self._offset


class FakePublisher:
    """KafkaPublisher's calls the shard makes; reports are served (their callbacks run) by ``poll`` only."""

    def __init__(self) -> None:
        self.records: list[tuple[str, bytes, Callable[..., None] | None]] = []  # (topic, key, on_delivery)
        self.offsets: list[int | None] = []  # each record's offset in its topic's partition
        self._next_offset: dict[str, int] = {}
        self.served: list[tuple[int, KafkaError | None]] = []  # (record index, error) to run at the next poll
        self.sent_now = 0  # calls of send_now (what lingers sent at once)

    def batch_produce(self) -> Callable[..., None]:
        def produce(topic: str, value: bytes, key: bytes, partition: int, on_delivery: Callable[..., None] | None,
                    _unused: None, timestamp_ms: int, headers: list[tuple[str, bytes]] | None) -> None:
            assert partition == SHARD
            self.records.append((topic, key, on_delivery))
            self.offsets.append(self._next_offset.get(topic, 0))
            self._next_offset[topic] = self._next_offset.get(topic, 0) + 1
        return produce

    @staticmethod
    def report_to(on_delivery: Callable[..., None]) -> Callable[..., None]:
        return on_delivery

    @staticmethod
    def produce_error(exc: Exception) -> Exception:
        return exc

    def poll(self, _timeout_s: float = 0.0, max_callbacks: int | None = None) -> int:
        cut = len(self.served) if max_callbacks is None else max_callbacks
        served, self.served = self.served[:cut], self.served[cut:]
        for index, error in served:
            callback = self.records[index][2]
            assert callback is not None
            callback(error, FakeMessage(None if error is not None else self.offsets[index]))
        return len(served)

    def close(self) -> None: ...

    def send_now(self) -> None:
        self.sent_now += 1

    def pending(self) -> int:
        return 0

    @property
    def reports_waiting(self) -> int:
        return len(self.served)


class FakeHost:
    def __init__(self) -> None:
        self.sent: list[tuple[str, bytes]] = []
        self.failed: list[str] = []

    def send_to_source(self, source_id: str, data: bytes) -> None:
        self.sent.append((source_id, data))

    def send_frame(self, connection: ConnectionId, data: bytes) -> None: ...

    def set_throttled(self, source_id: str, throttled: bool) -> None: ...

    def shard_failed(self, shard: int, reason: str) -> None:
        self.failed.append(reason)


def _prepared(core: IngestCore) -> None:
    for stream in STREAMS:
        core.stream_created(stream)
    for source in SOURCES:
        core.source_registered(source, STREAMS, T0)
    core.poll(T0)


def _runtime(host: FakeHost, now: list[int]) -> tuple[ShardRuntime, FakePublisher]:
    settings = ShardSettings(shard=SHARD, topics=TopicNames(), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(checkpoint_interval_us=1_000_000),
                             transactional=False)
    with mock.patch("gateway.shard.KafkaPublisher", lambda *_args: FakePublisher()):
        runtime = ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), host, lambda: now[0])
    publisher = runtime._publisher
    assert isinstance(publisher, FakePublisher)
    _prepared(runtime.core)
    return runtime, publisher


def produced(runtime: ShardRuntime, actions: list[Any]) -> list[DeliveryRef | None]:
    """Carry out the core's actions, the Kafka writes through the shard's produce loop; their DeliveryRefs."""
    writes = runtime._carry_out_now(actions)
    marks = runtime._report_marks(writes) if runtime._transactional else {}
    assert runtime._produce_from(writes, 0, marks) == len(writes)
    return [w.delivery if type(w) is Produce else None for w in writes]


def _acks(sent: list[tuple[str, bytes]]) -> list[tuple[str, str, int]]:
    acks = []
    for source_id, data in sent:
        for message in FrameDecoder().feed(data):
            if message["type"] == "ack":
                acks.append((source_id, message["stream"], message["seq"]))
    return acks


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_batched_reports_are_on_delivered_per_report_and_no_ack_precedes_its_delivery(data: st.DataObject) -> None:
    host = FakeHost()
    now = [T0 + 100]
    runtime, publisher = _runtime(host, now)
    reference = IngestCore(TopicNames(), IdentityMapping(), IngestConfig(checkpoint_interval_us=1_000_000))
    _prepared(reference)
    next_seq = dict.fromkeys([(s, t) for s in SOURCES for t in STREAMS], 0)
    deliveries: list[DeliveryRef | None] = []  # per produced record (None: no report asked)
    for _ in range(data.draw(st.integers(1, 6))):
        source = data.draw(st.sampled_from(SOURCES))
        events = []
        for _ in range(data.draw(st.integers(1, 10))):
            stream = data.draw(st.sampled_from(STREAMS))
            seq = max(0, next_seq[(source, stream)] + data.draw(st.sampled_from([0, 0, 0, 0, 1, -1])))
            next_seq[(source, stream)] = max(next_seq[(source, stream)], seq + 1)
            events.append(IncomingEvent(stream, seq, T0 + data.draw(st.integers(0, 50)), 1))
        now[0] += data.draw(st.integers(1, 30))
        actions = runtime.core.events_received(ConnectionId(1), source, tuple(events), now[0])
        assert actions == reference.events_received(ConnectionId(1), source, tuple(events), now[0])
        deliveries += produced(runtime, actions)
    now[0] += 2_000_000  # the merge gives up waiting: what it holds is released
    actions = runtime.core.advance(now[0])
    assert actions == reference.advance(now[0])
    deliveries += produced(runtime, actions)
    assert [record[2] is not None for record in publisher.records] == [d is not None for d in deliveries]
    reported = [i for i, delivery in enumerate(deliveries) if delivery is not None]
    order: list[int] = data.draw(st.permutations(reported))
    fail_one: bool = data.draw(st.booleans())
    failing: set[int] = {data.draw(st.sampled_from(reported))} if reported and fail_one else set()
    delivered: set[int] = set()
    at = 0
    while at < len(order):
        end = at + data.draw(st.integers(1, len(order) - at))
        now[0] += data.draw(st.integers(1, 20))
        chunk = [(index, KafkaError(KafkaError._MSG_TIMED_OUT) if index in failing else None)
                 for index in order[at:end]]
        publisher.served = list(chunk)
        sent_before = len(host.sent)
        runtime._serve_reports()
        runtime._carry_out_now(runtime.core.poll(now[0]), queue_writes=False)
        for index, error in chunk:
            delivery = deliveries[index]
            assert delivery is not None
            reference.on_delivered(delivery, None if error is None else str(error),
                                   None if error is not None else publisher.offsets[index], now[0])
            if error is None:
                delivered.add(index)
        expected = [(a.source_id, a.data) for a in reference.poll(now[0]) if isinstance(a, SendToSource)]
        assert host.sent[sent_before:] == expected
        # Rule 2: an ack covers only records Kafka reported delivered.
        for source_id, stream, acked in _acks(host.sent[sent_before:]):
            for index, delivery in enumerate(deliveries):
                if (delivery is not None and (delivery.source_id, delivery.stream) == (source_id, stream)
                        and delivery.seq <= acked):
                    assert index in delivered, f"ack {acked} of {source_id}/{stream} before {delivery}'s delivery"
        at = end
    later = now[0] + 1_000_000
    assert runtime.core.checkpoint_dirty_streams(later) == reference.checkpoint_dirty_streams(later)
    assert runtime.core.counters == reference.counters
    assert list(runtime.core.delivery_latencies_us) == list(reference.delivery_latencies_us)
    assert state(runtime.core.tracker) == state(reference.tracker)
    assert len(host.failed) == (1 if failing else 0)  # every report was served; a shard fails once


def three_records(runtime: ShardRuntime, now: list[int]) -> None:
    """Source a's seqs 0-2 of stream s, released (the merge stops waiting for source b) and produced."""
    events = tuple(IncomingEvent("s", seq, T0 + seq, 1) for seq in range(3))
    produced(runtime, runtime.core.events_received(ConnectionId(1), "a", events, now[0]))
    now[0] += 2_000_000
    produced(runtime, runtime.core.advance(now[0]))


def test_a_record_is_acked_only_after_its_own_report() -> None:
    """Hand-made: three records of one source; the reports of the 2nd and 3rd come first, then the 1st's."""
    host = FakeHost()
    now = [T0 + 100]
    runtime, publisher = _runtime(host, now)
    three_records(runtime, now)
    assert [r[2] is not None for r in publisher.records] == [True, True, True, False]  # and a punctuation

    def poll_with(indices: list[int]) -> list[tuple[str, str, int]]:
        publisher.served = [(i, None) for i in indices]
        sent_before = len(host.sent)
        runtime._serve_reports()
        runtime._carry_out_now(runtime.core.poll(now[0]))
        return _acks(host.sent[sent_before:])

    assert poll_with([]) == []
    assert poll_with([1, 2]) == []
    assert poll_with([0]) == [("a", "s", 2)]
    assert runtime.core.counters.events_published == 3


def test_a_failed_report_fails_the_shard_and_is_counted() -> None:
    host = FakeHost()
    now = [T0 + 100]
    runtime, publisher = _runtime(host, now)
    three_records(runtime, now)
    publisher.served = [(0, None), (1, KafkaError(KafkaError._MSG_TIMED_OUT)), (2, None)]
    runtime._serve_reports()
    runtime._carry_out_now(runtime.core.poll(now[0]))
    assert _acks(host.sent) == [("a", "s", 0)]
    assert runtime.core.counters.delivery_failures == 1
    assert runtime.core.counters.events_published == 2
    assert len(host.failed) == 1 and "a Kafka delivery failed for good" in host.failed[0]


@pytest.fixture(autouse=True)
def _quiet(caplog: pytest.LogCaptureFixture) -> Any:
    caplog.set_level("ERROR")
    yield
