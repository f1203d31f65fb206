"""The one configuration every confluent-kafka client of the project is built from.

``settings`` are librdkafka properties shared by every client (``security.protocol``, ``sasl.*``, ``ssl.*``,
``client.id``, ...), so a secured cluster is configured once and reaches the producer, the admin client that creates
topics and the consumers that recover state and read topics alike. Role-specific properties come on top.

Every client built here logs through the ``librdkafka`` Python logger (not raw lines on file descriptor 2), so its
lines take the format the command chose (gateway/logs.py). confluent-kafka hands them over in ``poll()`` (a
consumer's ``poll``/``consume``, a producer's ``poll``/``flush``): the long-lived clients are polled all the time;
a short-lived admin client is not, its failures surface as exceptions and its log lines are dropped with it.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

__all__ = ["LIBRDKAFKA_LOGGER", "PRODUCER_DEFAULTS", "KafkaClientConfig", "Servers", "librdkafka_logger"]

LIBRDKAFKA_LOGGER = "librdkafka"

PRODUCER_DEFAULTS: dict[str, Any] = {
    # Exactly-once per partition from the producer's side: acks=all + idempotence survive broker retries.
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "batch.num.messages": 10_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 500_000,
}
_CONSUMER_DEFAULTS: dict[str, Any] = {
    # Our consumers read ranges they choose themselves: no group offsets, no end-of-partition events.
    "enable.auto.commit": False,
    "auto.offset.reset": "earliest",
    "enable.partition.eof": False,
    # Shards are written in transactions: aborted records (a fenced gateway's) and open transactions must stay
    # invisible to every reader of ours. librdkafka's default already; stated because correctness rests on it.
    "isolation.level": "read_committed",
}


@dataclass(frozen=True)
class KafkaClientConfig:
    bootstrap_servers: str
    settings: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, servers: Servers) -> KafkaClientConfig:
        """A plain ``host:port[,host:port]`` string is a config without shared settings."""
        return servers if isinstance(servers, KafkaClientConfig) else cls(servers)

    def properties(self, role_defaults: Mapping[str, Any] | None = None,
                   overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """bootstrap + role defaults + shared settings + overrides (later wins)."""
        return {"bootstrap.servers": self.bootstrap_servers, **(role_defaults or {}), **self.settings,
                **(overrides or {})}

    def producer(self, overrides: Mapping[str, Any] | None = None, role_defaults: Mapping[str, Any] | None = None,
                 **callbacks: Any) -> Producer:
        """``role_defaults``: a kind of producer's own defaults on top of PRODUCER_DEFAULTS (a transactional one's):
        the shared settings still beat them."""
        return Producer({**self.properties({**PRODUCER_DEFAULTS, **(role_defaults or {})}, overrides),
                         "logger": librdkafka_logger(), **callbacks})

    def admin(self) -> AdminClient:
        properties: dict[str, Any] = {**self.properties(), "logger": librdkafka_logger()}
        return AdminClient(properties)

    def consumer(self, group_prefix: str, overrides: Mapping[str, Any] | None = None) -> Consumer:
        """A consumer in a group of its own (``<group_prefix>-<uuid>``): it assigns partitions itself."""
        return Consumer({**self.properties({**_CONSUMER_DEFAULTS, "group.id": f"{group_prefix}-{uuid.uuid4()}"},
                                           overrides), "logger": librdkafka_logger()})


def librdkafka_logger() -> logging.Logger:
    logger = logging.getLogger(LIBRDKAFKA_LOGGER)
    if not any(isinstance(f, _CoordinatorLoading) for f in logger.filters):
        logger.addFilter(_CoordinatorLoading())
    return logger


class _CoordinatorLoading(logging.Filter):
    """librdkafka warns "Failed to acquire transactional (or idempotence) PID ... retrying" while the broker's
    transaction coordinator loads its state (3 lines from a fresh gateway against a healthy, just started broker).
    The producer retries by itself: one INFO line says so, and the lines themselves are DEBUG (issue 28 item 1)."""

    def __init__(self) -> None:
        super().__init__()
        self.explained = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not ("Failed to acquire" in message and "PID" in message and "retrying" in message):
            return True
        logger = logging.getLogger(record.name)
        if not self.explained:
            self.explained = True
            logger.info("Kafka's transaction coordinator is still loading (a broker that just started or moved a "
                        "coordinator): the producer retries until it answers; not an error (librdkafka's \"Failed "
                        "to acquire transactional PID\" retry lines are logged at DEBUG)")
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logger.isEnabledFor(logging.DEBUG)


Servers = str | KafkaClientConfig
