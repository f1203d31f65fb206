"""The one wrapper around confluent-kafka's Producer used by the gateway.

Delivery reports are served by `poll()`, which the asyncio shell calls on its own loop, so callbacks never run
on a foreign thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]

PRODUCER_DEFAULTS: dict[str, Any] = {
    # Exactly-once per partition from the producer's side: acks=all + idempotence survive broker retries.
    "acks": "all",
    "enable.idempotence": True,
    "linger.ms": 2,
    "batch.num.messages": 10_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 500_000,
}


class QueueFull(Exception):
    """librdkafka's local queue is full: the shell must stop reading sockets until poll() drains it."""


class KafkaPublisher:
    def __init__(self, bootstrap_servers: str, extra_config: dict[str, Any] | None = None) -> None:
        config = {"bootstrap.servers": bootstrap_servers, **PRODUCER_DEFAULTS, **(extra_config or {}),
                  "error_cb": self._on_error}
        self._producer: Producer | None = Producer(config)

    def _client(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("publisher is closed")
        return self._producer

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback | None) -> None:
        try:
            self._client().produce(topic, value=value, key=key, on_delivery=on_delivery)
        except BufferError as exc:
            raise QueueFull(str(exc)) from exc

    def poll(self, timeout_s: float = 0.0) -> int:
        return 0 if self._producer is None else int(self._producer.poll(timeout_s))

    def pending(self) -> int:
        return 0 if self._producer is None else len(self._producer)

    def flush(self, timeout_s: float) -> int:
        """Returns the number of messages still undelivered after the timeout."""
        return 0 if self._producer is None else int(self._producer.flush(timeout_s))

    def close(self) -> None:
        """Destroy the client now: a stopped gateway's producer must not keep reconnecting to the cluster until the
        garbage collector finds it."""
        if self._producer is None:
            return
        self._producer.purge()
        self._producer.poll(0)
        self._producer = None

    @staticmethod
    def _on_error(error: KafkaError) -> None:
        if error.fatal():
            log.error("fatal Kafka producer error: %s", error)
        else:
            log.warning("Kafka producer error (retried by librdkafka): %s", error)
