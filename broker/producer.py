"""The gateway's producer: confluent-kafka's Producer built from the shared client configuration.

Delivery reports are served by `poll()`, which the asyncio shell calls on its own loop, so callbacks never run
on a foreign thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker.client import KafkaClientConfig, Servers

log = logging.getLogger(__name__)

DeliveryCallback = Callable[[KafkaError | None, Message], None]
# confluent-kafka's Producer.produce called by position: (topic, value, key, partition, on_delivery, None,
# timestamp_ms, headers as a list or None); see `KafkaPublisher.batch_produce`.
ProduceCall = Callable[[str, bytes, bytes, int, DeliveryCallback | None, None, int,
                        list[tuple[str, str | bytes | None]] | None], None]
# Kafka record headers: (name, value) pairs in order, names may repeat.
Headers = Sequence[tuple[str, bytes]]
_PARTITIONER_CHOOSES = -1


def kafka_headers(headers: Headers | None) -> list[tuple[str, str | bytes | None]] | None:
    """confluent-kafka's own type for headers (a list; its element type is wider than ours)."""
    return None if headers is None else list(headers)

class QueueFull(Exception):
    """librdkafka's local queue is full: the shell must stop reading sockets until poll() drains it."""


class KafkaPublisher:
    def __init__(self, servers: Servers, overrides: Mapping[str, Any] | None = None) -> None:
        self._producer: Producer | None = KafkaClientConfig.of(servers).producer(overrides, error_cb=self._on_error)

    def _client(self) -> Producer:
        if self._producer is None:
            raise RuntimeError("publisher is closed")
        return self._producer

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback | None,
                partition: int | None = None, *, timestamp_ms: int = 0, headers: Headers | None = None) -> None:
        """``partition`` None leaves the choice to the partitioner (hash of the key); ``timestamp_ms`` 0: the
        record's CreateTime is the produce time."""
        try:
            # Positional, as TransactionalPublisher.produce says why; -1 is librdkafka's RD_KAFKA_PARTITION_UA (the
            # partitioner chooses), the default of produce's partition.
            self._client().produce(topic, value, key, _PARTITIONER_CHOOSES if partition is None else partition,
                                   on_delivery, None, timestamp_ms, kafka_headers(headers))
        except BufferError as exc:
            raise QueueFull(str(exc)) from exc

    def batch_produce(self) -> ProduceCall:
        """``produce`` for a loop of records that runs nothing else in between (no poll, flush or close): the
        client's own produce, checked once here instead of per record (its positional arguments are ProduceCall's,
        the ones ``produce`` passes; its BufferError is QueueFull, see ``produce``). A callback goes through
        ``report_to`` first; ``produce_error`` is what to raise for a KafkaException."""
        return self._client().produce

    @staticmethod
    def report_to(on_delivery: DeliveryCallback) -> DeliveryCallback:
        """The callback ``batch_produce``'s call takes for ``on_delivery``: run by ``poll`` on its caller's thread."""
        return on_delivery

    def produce_error(self, exc: KafkaException) -> Exception:
        return exc

    def poll(self, timeout_s: float = 0.0) -> int:
        return 0 if self._producer is None else int(self._producer.poll(timeout_s))

    def pending(self) -> int:
        return 0 if self._producer is None else len(self._producer)

    def flush(self, timeout_s: float) -> int:
        """Returns the number of messages still undelivered after the timeout."""
        return 0 if self._producer is None else int(self._producer.flush(timeout_s))

    def send_now(self) -> None:
        """Ask librdkafka to send what lingers now, without waiting (TransactionalPublisher.send_now)."""
        if self._producer is not None:
            self._producer.flush(0)

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
