"""Topic creation for the record contract, on top of confluent-kafka's AdminClient.

Replication. Every topic the project creates (events, late, sources, the cluster control topic, results) gets the
replication factor its caller asks for, or by default ``min(3, brokers)`` with the brokers counted in the cluster's
metadata when the topic is created: 1 on a laptop's single broker, 3 (Kafka's own production advice) from three
brokers on. Every one of them also gets ``min.insync.replicas = min(2, RF)`` unless the caller configures it: all
of them are written with ``acks=all`` (the gateway's producers, the monitor's, and Spark's Kafka sink, whose Java
client defaults to acks=all), and an ack then means "on at least two brokers" as soon as there are two replicas,
which is what lets a source drop an acked event from its spool. The price, stated: with RF 2 a single broker down
stops the writes to the partitions it replicates (durability over availability); RF 3 tolerates one broker down.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewTopic

from broker.client import KafkaClientConfig, Servers

__all__ = ["COMPACTED", "DEFAULT_MAX_MIN_INSYNC_REPLICAS", "DEFAULT_MAX_REPLICATION_FACTOR", "TopicConfigError",
           "default_replication_factor", "ensure_topics", "min_insync_replicas", "new_topic_config",
           "partition_count", "replication_factor_for"]

COMPACTED = {"cleanup.policy": "compact"}
# Kafka's own production advice: three replicas, two of them in sync for an acks=all write.
DEFAULT_MAX_REPLICATION_FACTOR = 3
DEFAULT_MAX_MIN_INSYNC_REPLICAS = 2
_MIN_INSYNC = "min.insync.replicas"


class TopicConfigError(ValueError):
    """A topic setting the cluster cannot honour (e.g. more replicas than brokers); the message says which."""


def default_replication_factor(brokers: int) -> int:
    """``min(3, brokers)``: every broker holds a replica until there are three."""
    return max(1, min(DEFAULT_MAX_REPLICATION_FACTOR, brokers))


def min_insync_replicas(replication_factor: int) -> int:
    """``min(2, RF)``: an acks=all write is on two brokers as soon as there are two replicas."""
    return max(1, min(DEFAULT_MAX_MIN_INSYNC_REPLICAS, replication_factor))


def replication_factor_for(requested: int | None, brokers: int) -> int:
    """The replication factor a new topic gets: ``requested``, or the default for ``brokers`` when None."""
    if requested is None:
        return default_replication_factor(brokers)
    if requested < 1:
        raise TopicConfigError(f"replication factor must be at least 1, got {requested}")
    if requested > brokers:
        raise TopicConfigError(
            f"replication factor {requested} needs {requested} brokers, the cluster has {brokers}: "
            f"configure a replication factor of at most {brokers}, or leave it unset (default min(3, brokers))")
    return requested


def new_topic_config(replication_factor: int, config: Mapping[str, str] | None = None) -> dict[str, str]:
    """A new topic's configuration: ``min.insync.replicas`` for ``replication_factor``, then ``config`` (wins)."""
    return {_MIN_INSYNC: str(min_insync_replicas(replication_factor)), **(config or {})}


def ensure_topics(servers: Servers, topics: Iterable[str], partitions: int = 1,
                  config: Mapping[str, str] | None = None, timeout_s: float = 30.0, *,
                  replication_factor: int | None = None) -> list[str]:
    """Create the topics that do not exist yet; an existing topic is left as it is. Returns the created ones.

    ``replication_factor`` None: ``min(3, brokers)`` (module docstring); ``config`` may set any topic property,
    ``min.insync.replicas`` included (default ``min(2, RF)``)."""
    admin = KafkaClientConfig.of(servers).admin()
    wanted = sorted(set(topics))
    metadata = admin.list_topics(timeout=timeout_s)
    missing = [t for t in wanted if t not in metadata.topics]
    if not missing:
        return []
    replicas = replication_factor_for(replication_factor, len(metadata.brokers))
    settings = new_topic_config(replicas, config)
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=replicas, config=dict(settings))
         for t in missing],
        operation_timeout=timeout_s, request_timeout=timeout_s,
    )
    created = []
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(topic)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise RuntimeError(f"creating topic {topic} failed: {exc}") from exc
    return created


def partition_count(servers: Servers, topic: str, timeout_s: float = 30.0) -> int:
    """How many partitions ``topic`` has; raises LookupError if it does not exist (or has none yet)."""
    metadata = KafkaClientConfig.of(servers).admin().list_topics(topic=topic, timeout=timeout_s)
    described = metadata.topics.get(topic)
    if described is None or described.error is not None or not described.partitions:
        reason = "absent" if described is None else (described.error or "no partitions")
        raise LookupError(f"topic {topic!r}: {reason}")
    return len(described.partitions)
