"""Read a topic from the beginning to its current end (tests, the demo, operators' spot checks)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from contract.records import PUNCTUATION


def read_topic(bootstrap_servers: str, topic: str, timeout_s: float = 30.0) -> list[tuple[bytes | None, bytes]]:
    """All (key, value) pairs currently in every partition of `topic`, in partition then offset order."""
    consumer = Consumer({
        "bootstrap.servers": bootstrap_servers,
        "group.id": f"skewless-reader-{uuid.uuid4()}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    })
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = sorted(metadata.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                for p in partitions}
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        records: dict[int, list[tuple[bytes | None, bytes]]] = {p: [] for p in partitions}
        positions = dict.fromkeys(partitions, 0)
        deadline = time.monotonic() + timeout_s
        while True:
            while any(positions[p] < ends[p] for p in partitions):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"reading {topic}: got {positions}, expected {ends}")
                message = consumer.poll(0.5)
                if message is None:
                    continue
                if message.error():
                    raise KafkaException(message.error())
                partition, offset, value = message.partition(), message.offset(), message.value()
                assert partition is not None and offset is not None
                records[partition].append((message.key(), value if value is not None else b""))
                positions[partition] = offset + 1
            # The end is re-read once reached: a stale high watermark must not cut the read short.
            latest = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout_s)[1]
                      for p in partitions}
            if latest == ends:
                break
            ends = latest
        return [r for p in partitions for r in records[p]]
    finally:
        consumer.close()


def read_stream(bootstrap_servers: str, topic: str, timeout_s: float = 30.0) -> tuple[list[dict[str, Any]],
                                                                                     list[dict[str, Any]]]:
    """An events topic split into (event records, punctuation records), each in topic order."""
    events: list[dict[str, Any]] = []
    punctuations: list[dict[str, Any]] = []
    for _key, value in read_topic(bootstrap_servers, topic, timeout_s):
        record = orjson.loads(value)
        (punctuations if record.get("kind") == PUNCTUATION else events).append(record)
    return events, punctuations
