"""Recover, at startup, how far each source got in Kafka, so a restarted gateway never publishes an event twice.

The gateway periodically checkpoints per stream `{events_offset, next_seq per source}` into the compacted
sources topic (key `progress|<stream>`). Recovery reads the latest checkpoint and scans the events topic only
from the checkpointed offset to its end: exact, and bounded by the checkpoint interval rather than the topic size.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from gateway.clock_state import estimate_from_record
from timesync.estimator import ClockEstimate

PROGRESS_KEY_PREFIX = "progress|"


@dataclass
class StreamProgress:
    """What is known to be in the events topic of one stream."""

    next_offset: int = 0
    next_seq: dict[str, int] = field(default_factory=dict)
    watermark_us: int | None = None
    """The highest watermark promised by a punctuation record of this stream."""

    def observe(self, source_id: str, seq: int, offset: int) -> None:
        if seq + 1 > self.next_seq.get(source_id, 0):
            self.next_seq[source_id] = seq + 1
        self.next_offset = max(self.next_offset, offset + 1)

    def promise(self, watermark_us: int) -> None:
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us

    def to_json(self, stream: str) -> bytes:
        return orjson.dumps({"kind": "progress", "stream": stream, "next_offset": self.next_offset,
                             "next_seq": self.next_seq, "watermark_us": self.watermark_us})

    @classmethod
    def from_json(cls, value: bytes) -> StreamProgress:
        raw = orjson.loads(value)
        watermark = raw.get("watermark_us")
        return cls(int(raw["next_offset"]), {str(k): int(v) for k, v in raw["next_seq"].items()},
                   None if watermark is None else int(watermark))


def progress_key(stream: str) -> bytes:
    return (PROGRESS_KEY_PREFIX + stream).encode()


def _consumer(bootstrap_servers: str) -> Consumer:
    return Consumer({"bootstrap.servers": bootstrap_servers, "group.id": f"skewless-recovery-{uuid.uuid4()}",
                     "enable.auto.commit": False, "enable.partition.eof": False})


# A topic created a moment ago may not have a partition leader yet: these errors mean "ask again shortly".
_NOT_READY = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
              KafkaError._TIMED_OUT}


def _end_offset(consumer: Consumer, topic: str, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=max(1.0, timeout_s / 10))
            return int(high)
        except KafkaException as exc:
            if exc.args[0].code() not in _NOT_READY or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _scan(consumer: Consumer, topic: str, start_offset: int, timeout_s: float) -> Iterable[tuple[int, Any, bytes]]:
    """(offset, key, value) from start_offset to the end of partition 0 as it is now."""
    high = _end_offset(consumer, topic, timeout_s)
    if start_offset >= high:
        return
    consumer.assign([TopicPartition(topic, 0, start_offset if start_offset > 0 else OFFSET_BEGINNING)])
    deadline = time.monotonic() + timeout_s
    while True:
        message = consumer.poll(0.5)
        if time.monotonic() > deadline:
            raise TimeoutError(f"recovery scan of {topic} did not reach offset {high}")
        if message is None:
            continue
        if message.error():
            raise KafkaException(message.error())
        if message.topic() != topic:
            continue
        offset = message.offset()
        value = message.value()
        assert offset is not None
        if value is not None:
            yield offset, message.key(), value
        if offset + 1 >= high:
            return


def recover_stream(bootstrap_servers: str, sources_topic: str, events_topic: str, stream: str,
                   timeout_s: float = 60.0) -> StreamProgress:
    progress = StreamProgress()
    wanted = progress_key(stream)
    # One consumer per topic: a reassigned consumer may still hand out messages prefetched for the old topic.
    consumer = _consumer(bootstrap_servers)
    try:
        for _offset, key, value in _scan(consumer, sources_topic, 0, timeout_s):
            if key == wanted:
                progress = StreamProgress.from_json(value)
    finally:
        consumer.close()
    consumer = _consumer(bootstrap_servers)
    try:
        for offset, _key, value in _scan(consumer, events_topic, progress.next_offset, timeout_s):
            record = orjson.loads(value)
            if record.get("kind") == "event":
                progress.observe(record["source_id"], int(record["seq"]), offset)
            else:
                if record.get("kind") == "punctuation":
                    progress.promise(int(record["watermark_us"]))
                progress.next_offset = max(progress.next_offset, offset + 1)
    finally:
        consumer.close()
    return progress


def recover_clocks(bootstrap_servers: str, sources_topic: str,
                   timeout_s: float = 60.0) -> dict[str, tuple[ClockEstimate, int]]:
    """Every source's latest clock estimate (and its last sync) from the compacted sources topic: a restarted
    gateway maps a source's timestamps at once instead of treating it as unsynced until its next re-sync."""
    latest: dict[str, tuple[ClockEstimate, int]] = {}
    consumer = _consumer(bootstrap_servers)
    try:
        for _offset, _key, value in _scan(consumer, sources_topic, 0, timeout_s):
            try:
                record = orjson.loads(value)
            except orjson.JSONDecodeError:
                continue
            parsed = estimate_from_record(record) if isinstance(record, dict) else None
            if parsed is not None:
                latest[parsed[0]] = (parsed[1], parsed[2])
    finally:
        consumer.close()
    return latest
