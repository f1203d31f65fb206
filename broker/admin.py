"""Topic creation for the record contract, on top of confluent-kafka's AdminClient."""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.cimpl import NewTopic

from broker.client import KafkaClientConfig, Servers

COMPACTED = {"cleanup.policy": "compact"}


def ensure_topics(servers: Servers, topics: Iterable[str], partitions: int = 1,
                  config: dict[str, str] | None = None, timeout_s: float = 30.0) -> list[str]:
    """Create the topics that do not exist yet; an existing topic is left as it is. Returns the created ones."""
    admin = KafkaClientConfig.of(servers).admin()
    wanted = sorted(set(topics))
    existing = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [t for t in wanted if t not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t, num_partitions=partitions, replication_factor=1, config=dict(config or {})) for t in missing],
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
