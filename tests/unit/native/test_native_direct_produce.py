"""The native produce loop's direct path (native/src/direct_produce.rs, gateway.native.native_direct_producer): a
plain record handed to librdkafka by ``rd_kafka_produceva`` on the client confluent-kafka's ``Producer`` wraps,
against the same records through ``Producer.produce`` (the specification). Both go to librdkafka's own in-process
mock cluster (``test.mock.num.brokers``: a real librdkafka client and broker protocol, no Kafka process) and are
read back: the same keys, values, headers (a None value included) and timestamps, in the same order, the same
deliveries kept and counts, through a full queue; a refusal other than a full queue raises the KafkaException
``produce`` raises. The handle is refused, and the loop calls ``produce``, for anything but a live Producer."""

from __future__ import annotations

import itertools
import time
import types
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.ingest import DeliveryRef, Produce, WriteCheckpoint
from gateway.native import loaded_librdkafka, native_direct_producer, native_produce_loop
from gateway.shard import ShardRuntime

pytestmark = pytest.mark.timeout(120)

_topics = itertools.count()


class MockCluster:
    """A producer bootstrapped to librdkafka's mock cluster, and what reads it back."""

    def __init__(self, **config: Any) -> None:
        self.producer = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "unused:1", "linger.ms": 0,
                                  "log_level": 0, **config})
        broker = next(iter(self.producer.list_topics(timeout=10).brokers.values()))
        self.bootstrap = f"{broker.host}:{broker.port}"

    def read(self, topic: str, count: int) -> list[tuple[Any, ...]]:
        consumer = Consumer({"bootstrap.servers": self.bootstrap, "group.id": "read", "log_level": 0,
                             "enable.auto.commit": False})
        consumer.assign([TopicPartition(topic, 0, 0)])
        records: list[tuple[Any, ...]] = []
        deadline = time.monotonic() + 30
        try:
            while len(records) < count and time.monotonic() < deadline:
                message = consumer.poll(0.2)
                if message is None or message.error() is not None:
                    continue
                records.append((message.key(), message.value(), message.headers(), message.timestamp()))
        finally:
            consumer.close()
        return records


@pytest.fixture(scope="module")
def cluster() -> Iterator[MockCluster]:
    mock = MockCluster()
    yield mock
    mock.producer.flush(10)


class Publisher:
    """The transactional publisher's produce surface over a real client."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer

    def batch_produce(self) -> Any:
        return self.producer.produce

    @staticmethod
    def produce_error(exc: KafkaException) -> Exception:
        return exc


def shard(producer: Producer, direct: bool) -> Any:
    runtime = types.SimpleNamespace(_publisher=Publisher(producer), shard=0, _transactional=True, _uncommitted=[],
                                    _produced_in_transaction=0, _unproduced_records=0, _reported=None,
                                    _produce_loop=native_produce_loop(),
                                    _direct=native_direct_producer(producer) if direct else None)
    assert not direct or runtime._direct is not None
    runtime._queue_full_at = types.MethodType(ShardRuntime._queue_full_at, runtime)
    return runtime


def produced(producer: Producer, actions: list[Any], marks: dict[int, Any], direct: bool) -> tuple[Any, ...]:
    runtime = shard(producer, direct)
    index = 0
    while index < len(actions):
        index = ShardRuntime._produce_from(runtime, actions, index, marks)
    return runtime._uncommitted, runtime._produced_in_transaction, runtime._unproduced_records


payloads = st.none() | st.binary(max_size=40)
header_values = st.none() | st.binary(max_size=12)
headers = st.none() | st.lists(st.tuples(st.sampled_from(["kind", "source_id", "contract", "x"]), header_values),
                               max_size=4).map(tuple)


@st.composite
def batches(draw: st.DrawFn) -> list[tuple[Any, ...]]:
    """(key, value, timestamp_ms, headers, kind): kind 0 a Produce with a delivery, 1 one without, 2 a
    WriteCheckpoint (the Python loop's), 3 a Produce with headers as a list (through ``produce``)."""
    return draw(st.lists(st.tuples(payloads, payloads, st.sampled_from([0, 1, 1_700_000_000_123]) |
                                   st.integers(1, 2**40), headers, st.integers(0, 3)), max_size=25))


def actions_to(topic: str, batch: list[tuple[Any, ...]]) -> list[Any]:
    actions: list[Any] = []
    for seq, (key, value, timestamp_ms, record_headers, kind) in enumerate(batch):
        if kind == 2:
            actions.append(WriteCheckpoint(topic, key, value, record_headers))
        else:
            delivery = DeliveryRef("a", "s", seq, "events", 7) if kind == 0 else None
            actions.append(Produce(topic, key, value, delivery, timestamp_ms,
                                   list(record_headers) if kind == 3 and record_headers else record_headers))
    return actions


def comparable(records: list[tuple[Any, ...]], batch: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The records read back; a produce-time timestamp (librdkafka's clock: a WriteCheckpoint's, or 0) only as its
    type."""
    return [(key, value, record_headers, timestamp if sent[2] != 0 and sent[4] != 2 else timestamp[0])
            for (key, value, record_headers, timestamp), sent in zip(records, batch, strict=True)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=batches(), mark_seed=st.integers(0, 2**16))
def test_direct_records_read_back_as_those_produce_made(cluster: MockCluster, batch: list[tuple[Any, ...]],
                                                        mark_seed: int) -> None:
    marks_at = {i for i in range(len(batch)) if (mark_seed >> (i % 16)) & 1 and batch[i][4] != 2}
    results = []
    for direct in (False, True):
        topic = f"direct-{next(_topics)}"
        actions = actions_to(topic, batch)
        marks = {index: (lambda error, message: None) for index in marks_at}
        kept = produced(cluster.producer, actions, marks, direct)
        assert cluster.producer.flush(10) == 0
        results.append((kept, comparable(cluster.read(topic, len(batch)), batch)))
    python, native = results
    assert native == python


def test_a_full_queue_stops_the_direct_path_where_produce_would_and_the_rest_follows() -> None:
    mock = MockCluster(**{"queue.buffering.max.messages": 3})
    runtime = shard(mock.producer, direct=True)
    topic = f"direct-{next(_topics)}"
    actions = [Produce(topic, b"k", bytes([i]), DeliveryRef("a", "s", i, "events", 7), 1_000 + i, None)
               for i in range(5)]
    assert ShardRuntime._produce_from(runtime, actions, 0, {}) == 3
    assert len(runtime._uncommitted) == 3 and runtime._produced_in_transaction == 3
    assert mock.producer.flush(10) == 0
    assert ShardRuntime._produce_from(runtime, actions, 3, {}) == 5
    assert mock.producer.flush(10) == 0
    assert [value for _key, value, _headers, _ts in mock.read(topic, 5)] == [bytes([i]) for i in range(5)]


def test_a_refusal_raises_the_kafka_exception_produce_raises() -> None:
    """A transactional client outside a transaction refuses every record (librdkafka's _STATE)."""
    mock = MockCluster(**{"transactional.id": "direct-refusal"})
    mock.producer.init_transactions(10)
    raised = []
    for direct in (False, True):
        runtime = shard(mock.producer, direct)
        with pytest.raises(KafkaException) as caught:
            ShardRuntime._produce_from(runtime, [Produce("t", b"k", b"v", None, 5, None)], 0, {})
        raised.append(caught.value.args[0].code())
    assert raised == [confluent_kafka.KafkaError._STATE] * 2


def test_the_handle_is_refused_for_anything_but_a_live_producer() -> None:
    assert native_direct_producer(object()) is None
    closed = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    assert native_direct_producer(closed) is not None
    closed.close()
    assert native_direct_producer(closed) is None
    import skewless_native

    live = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    path = loaded_librdkafka()
    assert path is not None
    with pytest.raises(ValueError, match="is not confluent-kafka's"):
        skewless_native.DirectProducer.open(live, path, confluent_kafka.libversion()[1] + 1)
    with pytest.raises(ValueError, match="is not loaded"):
        skewless_native.DirectProducer.open(live, "/nonexistent/librdkafka.so.1", confluent_kafka.libversion()[1])


def test_a_producer_closed_after_the_handle_was_had_raises_as_produce_does() -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    direct = native_direct_producer(producer)
    assert direct is not None
    assert direct.produce_one("t", b"v", None, 0, 0, None) is None  # type: ignore[attr-defined]
    producer.purge()  # the record cannot reach a broker: close() would wait for it
    producer.close()
    with pytest.raises(RuntimeError, match="closed"):
        direct.produce_one("t", b"v", None, 0, 0, None)  # type: ignore[attr-defined]
    with pytest.raises(RuntimeError, match="closed"):
        producer.produce("t", b"v")
