"""The plain confluent-kafka producer loop the gateway benchmarks compare against: produce as fast as librdkafka
takes records, serving delivery reports every thousand records and when its queue is full."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Producer

POLL_EVERY = 1000


def produce_waiting(producer: Producer, index: int, topic: str, value: bytes, key: bytes | None,
                    **options: Any) -> None:
    """``producer.produce`` that waits for room while librdkafka's queue is full (serving delivery reports), and
    serves them every ``POLL_EVERY`` records (``index``: the record's position in the run)."""
    while True:
        try:
            producer.produce(topic, value, key, **options)
            break
        except BufferError:
            producer.poll(0.001)
    if index % POLL_EVERY == 0:
        producer.poll(0)


class RunRates:
    """Events/s and CPU per event of a run with ``events``, ``seconds`` and ``cpu_s`` (a result dataclass)."""

    events: int
    seconds: float
    cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s * 1e6 / self.events
