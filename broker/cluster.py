"""The cluster control topic ``<prefix>.cluster`` (docs/record-contract.md): the deployment's identity and shard
count on partition 0, and the owner of shard k on partition k, all compacted.

A deployment's shard count S is fixed once: every stream's topics have S partitions and a source's shard is a
hash of its id mod S, so changing S on a live deployment would move sources between shards (their order and
duplicate detection live in the old shard's state). Every check here refuses such a configuration with one line.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from broker.admin import COMPACTED, ensure_topics
from broker.client import KafkaClientConfig, Servers
from broker.reader import scan_partition
from contract.records import ClusterRecord, OwnerRecord, RecordError, decode_record

__all__ = ["ClusterConfigError", "OwnerDirectory", "claim_cluster", "ensure_control_topic", "ensure_partitions"]

# Partition 0 of the control topic carries the cluster record (besides shard 0's owner).
_CLUSTER_PARTITION = 0


class ClusterConfigError(ValueError):
    """A configuration that contradicts the live deployment; the message says what differs and what to do."""


def _shard_count_error(recorded: int, configured: int) -> ClusterConfigError:
    return ClusterConfigError(
        f"deployment has {recorded} shards, configured {configured}: changing S on a live deployment moves sources "
        f"between shards; configure shards={recorded}, or start a new deployment under another topic prefix")


def ensure_partitions(servers: Servers, topics: Iterable[str], partitions: int,
                      config: dict[str, str] | None = None, timeout_s: float = 30.0, *,
                      replication_factor: int | None = None) -> list[str]:
    """Create the missing topics with ``partitions`` partitions and ``replication_factor`` replicas (None: the
    default of broker.admin, ``min(3, brokers)``); an existing topic with another partition count raises
    ClusterConfigError (naming it and both counts). Returns the created topics."""
    admin = KafkaClientConfig.of(servers).admin()
    wanted = sorted(set(topics))
    described = admin.list_topics(timeout=timeout_s).topics
    for topic in wanted:
        existing = described.get(topic)
        if existing is not None and existing.partitions and len(existing.partitions) != partitions:
            raise ClusterConfigError(
                f"topic {topic} has {len(existing.partitions)} partitions, the deployment has {partitions} shards: "
                f"changing S on a live deployment moves sources between shards; configure "
                f"shards={len(existing.partitions)}, or use another topic prefix")
    missing = [t for t in wanted if t not in described]
    if not missing:
        return []
    created = ensure_topics(servers, missing, partitions=partitions, config=config, timeout_s=timeout_s,
                            replication_factor=replication_factor)
    # A concurrent creator may have won the race with another count.
    lost_race = sorted(set(missing) - set(created))
    if lost_race:
        ensure_partitions(servers, lost_race, partitions, config, timeout_s, replication_factor=replication_factor)
    return sorted(created)


def ensure_control_topic(servers: Servers, topic: str, shards: int, timeout_s: float = 30.0, *,
                         replication_factor: int | None = None) -> bool:
    """Create the compacted control topic with one partition per shard (``replication_factor`` as in
    :func:`ensure_partitions`); True if this call created it. An existing control topic with another partition
    count raises ClusterConfigError."""
    admin = KafkaClientConfig.of(servers).admin()
    existing = admin.list_topics(timeout=timeout_s).topics.get(topic)
    if existing is not None and existing.partitions:
        if len(existing.partitions) != shards:
            raise _shard_count_error(len(existing.partitions), shards)
        return False
    return bool(ensure_partitions(servers, [topic], shards, dict(COMPACTED), timeout_s,
                                  replication_factor=replication_factor))


def _cluster_records(servers: Servers, topic: str, timeout_s: float) -> list[ClusterRecord]:
    consumer = KafkaClientConfig.of(servers).consumer("skewless-cluster")
    try:
        found = []
        for _offset, _key, value in scan_partition(consumer, topic, 0, timeout_s, _CLUSTER_PARTITION):
            try:
                record = decode_record(value)
            except RecordError:
                continue
            if isinstance(record, ClusterRecord):
                found.append(record)
        return found
    finally:
        consumer.close()


def claim_cluster(servers: Servers, topic: str, cluster: str, shards: int, now_us: int,
                  timeout_s: float = 30.0) -> ClusterRecord:
    """The deployment's cluster record: written by the first gateway of a new deployment, checked by every later
    one. Raises ClusterConfigError when the prefix belongs to another cluster or the shard count differs.

    Two first gateways racing both write; the first record in the partition wins and the loser writes the
    winner's record again, so that compaction (which keeps the latest) keeps the winner."""
    records = _cluster_records(servers, topic, timeout_s)
    if not records:
        _write_cluster_record(servers, topic, ClusterRecord(cluster, shards, now_us), timeout_s)
        records = _cluster_records(servers, topic, timeout_s)
        if not records:
            raise RuntimeError(f"the cluster record written to {topic} could not be read back")
        if records[0].cluster != cluster or records[0].created_us != now_us:
            _write_cluster_record(servers, topic, records[0], timeout_s)
    recorded = records[0]
    if recorded.cluster != cluster:
        prefix = topic.removesuffix(".cluster")
        raise ClusterConfigError(
            f"topic prefix {prefix} already belongs to cluster {recorded.cluster!r}, not {cluster!r}: "
            f"a second cluster needs a topic prefix of its own")
    if recorded.shards != shards:
        raise _shard_count_error(recorded.shards, shards)
    return recorded


def _write_cluster_record(servers: Servers, topic: str, record: ClusterRecord, timeout_s: float) -> None:
    producer = KafkaClientConfig.of(servers).producer()
    failures: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: Any) -> None:
        if error is not None:
            failures.append(error)
    producer.produce(topic, value=record.to_json(), key=record.key, partition=_CLUSTER_PARTITION,
                     on_delivery=delivered)
    if producer.flush(timeout_s) > 0:
        raise TimeoutError(f"writing the cluster record to {topic} timed out")
    if failures:
        raise KafkaException(failures[0])


class OwnerDirectory:
    """The latest committed owner of every shard, read from the control topic without a consumer group (all
    partitions from the beginning, read_committed: an owner record of a fenced gateway's aborted transaction is
    never seen). ``poll()`` never blocks."""

    def __init__(self, servers: Servers, topic: str, shards: int) -> None:
        self.topic = topic
        self._owners: dict[int, OwnerRecord] = {}
        self._shards = range(shards)
        self._consumer = KafkaClientConfig.of(servers).consumer(
            "skewless-owners", {"isolation.level": "read_committed"})
        self._consumer.assign([TopicPartition(topic, shard, OFFSET_BEGINNING) for shard in range(shards)])

    def poll(self) -> dict[int, OwnerRecord]:
        """Latest owner per shard after everything fetched so far (shards without an owner record are absent)."""
        while messages := self._consumer.consume(num_messages=1000, timeout=0):
            for message in messages:
                error = message.error()
                if error is not None:
                    if error.fatal():
                        raise KafkaException(error)
                    continue
                self._take(message.partition(), message.value())
        return dict(self._owners)

    def caught_up(self) -> bool:
        """Whether every shard's partition was read to the end last fetched (never blocks): before that, a shard
        absent from ``poll()`` may just not be read yet."""
        for shard in self._shards:
            partition = TopicPartition(self.topic, shard)
            low, high = self._consumer.get_watermark_offsets(partition, cached=True)
            position = self._consumer.position([partition])[0].offset
            # Nothing fetched yet: the cached offsets are invalid (negative). An empty partition has no position.
            if high < 0 or max(position, low) < high:
                return False
        return True

    def close(self) -> None:
        self._consumer.close()

    def _take(self, partition: int | None, value: bytes | None) -> None:
        if value is None:
            return
        try:
            raw = decode_record(value)
        except RecordError:
            return
        # A record of another kind (the cluster record on partition 0), or one filed under the wrong partition,
        # says nothing about this shard's owner.
        if isinstance(raw, OwnerRecord) and raw.shard == partition:
            self._owners[raw.shard] = raw
