"""Read a topic from the beginning to its current end (tests, the demo, operators' spot checks)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from broker.client import KafkaClientConfig, Servers
from contract.records import PUNCTUATION


def read_topic(servers: Servers, topic: str, timeout_s: float = 30.0, *,
               settled: bool = False) -> list[tuple[bytes | None, bytes]]:
    """All committed (key, value) pairs currently in every partition of `topic`, in partition then offset order
    (read_committed: aborted records and open transactions are not returned).

    ``settled``: first wait, within ``timeout_s``, until no transaction on the topic is open or awaiting its commit
    markers (``settled_ends``), then read to there. A commit returns once the transaction coordinator logged it; its
    markers reach the partitions after that, and until they do a read_committed read ends before that transaction.
    For a read once every writer stopped (a benchmark or test after its gateway exited): a running writer may keep
    a transaction open, and a dead writer's open transaction holds the end back until the broker aborts it
    (``transaction.timeout.ms``)."""
    consumer = KafkaClientConfig.of(servers).consumer("skewless-reader", {"isolation.level": "read_committed"})
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[topic].partitions)
        deadline = time.monotonic() + timeout_s
        if settled:
            uncommitted = KafkaClientConfig.of(servers).consumer("skewless-reader",
                                                                 {"isolation.level": "read_uncommitted"})
            try:
                ends = settled_ends(consumer, uncommitted, topic, partitions, deadline)
            finally:
                uncommitted.close()
        else:
            ends = _ends(consumer, topic, partitions, timeout_s)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: dict[int, list[tuple[bytes | None, bytes]]] = {p: [] for p in partitions}
        positions = dict.fromkeys(partitions, 0)
        while True:
            while remaining := [p for p in partitions if positions[p] < ends[p]]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}: got {positions}, expected {ends}")
                message = consumer.poll(_IDLE_POLL_S)
                if message is None:
                    # A partition may end in transaction markers or aborted records, which are never delivered:
                    # only the consumer's position tells that it went past them.
                    for tp in consumer.position([TopicPartition(topic, p) for p in remaining]):
                        positions[tp.partition] = max(positions[tp.partition], tp.offset)
                    continue
                if message.error():
                    raise KafkaException(message.error())
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None
                records[partition].append((message.key(), value if value is not None else b""))
                positions[partition] = offset + 1
            # The end is re-read once reached: a stale high watermark must not cut the read short.
            latest = _ends(consumer, topic, partitions, timeout_s)
            if latest == ends:
                break
            ends = latest
        return [r for p in partitions for r in records[p]]
    finally:
        consumer.close()


def _ends(consumer: Consumer, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    """Per partition, its end as the consumer sees it now (the last stable offset for a read_committed one)."""
    return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1] for p in partitions}


def settled_ends(committed: Consumer, uncommitted: Consumer, topic: str, partitions: list[int],
                 deadline: float, sleep: Callable[[float], None] = time.sleep) -> dict[int, int]:
    """Per partition, its end once no transaction there is open or awaiting its markers: once the last stable offset
    (``committed``'s end, a read_committed consumer) reached the high watermark (``uncommitted``'s, read_uncommitted),
    asked again every ``_SETTLE_POLL_S``. TimeoutError past ``deadline`` (``time.monotonic``), naming both."""
    while True:
        remaining_s = max(1.0, deadline - time.monotonic())
        stable = _ends(committed, topic, partitions, remaining_s)
        high = _ends(uncommitted, topic, partitions, remaining_s)
        if all(stable[p] >= high[p] for p in partitions):
            return stable
        if time.monotonic() > deadline:
            raise TimeoutError(f"{topic}: the last stable offsets {stable} stayed behind the high watermarks {high} "
                               "(a transaction still open, or its markers not written)")
        sleep(_SETTLE_POLL_S)


def read_stream(servers: Servers, topic: str, timeout_s: float = 30.0, *,
                settled: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """An events topic split into (event records, punctuation records), each in topic order (``settled``: as
    ``read_topic``'s)."""
    events: list[dict[str, Any]] = []
    punctuations: list[dict[str, Any]] = []
    for _key, value in read_topic(servers, topic, timeout_s, settled=settled):
        record = orjson.loads(value)
        (punctuations if record.get("kind") == PUNCTUATION else events).append(record)
    return events, punctuations


# A topic created a moment ago may not have a partition leader yet: these errors mean "ask again shortly".
_NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
              KafkaError._TIMED_OUT, KafkaError._UNKNOWN_PARTITION}
# How long a reader waits for a message before it asks the consumer's position whether the end was passed.
_IDLE_POLL_S = 0.2
# How often a settled read asks again whether the last transaction's markers landed (tens of ms after its commit).
_SETTLE_POLL_S = 0.01


def end_offset(consumer: Consumer, topic: str, timeout_s: float, partition: int = 0) -> int:
    """The partition's end as the broker reports it now: the last stable offset for a read_committed consumer
    (below the high watermark while a transaction is open), the high watermark otherwise."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                        timeout=max(1.0, timeout_s / 10))
            return int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in _NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def scan_partition(consumer: Consumer, topic: str, start_offset: int, timeout_s: float,
                   partition: int = 0) -> Iterable[tuple[int, Any, bytes]]:
    """(offset, key, value) of ``partition`` from ``start_offset`` to its end as it is now (the caller owns the
    consumer: one consumer per topic, since a reassigned consumer may still hand out messages prefetched for the
    old topic). ``PartitionScan`` is the same read, resumable to a later end."""
    return PartitionScan(consumer, topic, start_offset, partition).read_to_end(timeout_s)


# How long a scan waits for a message before it asks the consumer's position whether the end was passed. Every
# transactional partition ends in a commit marker that is never delivered, so every scan ends on this wait: a new
# shard owner's takeover runs two scans one after the other (issue 24 item 10: 0.2 s each cost 0.4 s of failover).
_SCAN_IDLE_POLL_S = 0.01


class PartitionScan:
    """A read of one partition from ``start_offset`` to its end, which can go on to a later end with the same
    consumer (a new shard owner reads up to the last stable offset while the fencing runs, then on to the end the
    fencing left).

    The consumer must read committed data (broker.client's consumers do). A transactional partition may end in a
    commit/abort marker or in aborted records, none of which is ever delivered, so a read ends when the consumer's
    position reaches the end, not on the last delivered offset. For a read_committed consumer the end is the last
    stable offset: records of a transaction still open are neither returned nor waited for. Before the new owner's
    ``TransactionalPublisher.init()`` (fencing) returns, its predecessor may still commit that transaction; after
    it, nothing of the predecessor is open and the last stable offset is the high watermark: a second
    ``read_to_end()`` then returns what such a commit made visible, and nothing else."""

    def __init__(self, consumer: Consumer, topic: str, start_offset: int, partition: int = 0) -> None:
        self._consumer = consumer
        self.topic = topic
        self.partition = partition
        self.start_offset = start_offset
        # Where the reads got to: every offset below is read (delivered, or a marker or aborted record passed).
        self.position = start_offset
        self._assigned = False

    def read_to_end(self, timeout_s: float) -> Iterable[tuple[int, Any, bytes]]:
        """(offset, key, value) from where the last read ended to the end as the broker reports it now."""
        consumer, topic, partition = self._consumer, self.topic, self.partition
        high = end_offset(consumer, topic, timeout_s, partition)
        if self.position >= high:
            return
        watched = TopicPartition(topic, partition)
        if not self._assigned:
            start = self.start_offset
            consumer.assign([TopicPartition(topic, partition, start if start > 0 else OFFSET_BEGINNING)])
            self._assigned = True
        deadline = time.monotonic() + timeout_s
        while True:
            message = consumer.poll(_SCAN_IDLE_POLL_S)
            if time.monotonic() > deadline:
                raise TimeoutError(f"recovery scan of {topic} [{partition}] did not reach offset {high}")
            if message is None:
                self.position = max(self.position, consumer.position([watched])[0].offset)
                if self.position >= high:
                    return
                continue
            if message.error():
                raise KafkaException(message.error())
            if message.topic() != topic or message.partition() != partition:
                continue
            offset = message.offset()
            value = message.value()
            assert offset is not None
            self.position = max(self.position, offset + 1)
            if value is not None:
                yield offset, message.key(), value
            if self.position >= high:
                return
