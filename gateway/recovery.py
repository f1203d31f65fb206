"""Recover, at startup, how far each source got in Kafka, so a restarted gateway never publishes an event twice.

The gateway periodically checkpoints per stream `{events_offset, next_seq per source}` into the compacted
sources topic (key `progress|<stream>`). Recovery reads the latest checkpoint and scans the events topic only
from the checkpointed offset to its end: exact, and bounded by the checkpoint interval rather than the topic size.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from contract.records import EventRecord, ProgressRecord, PunctuationRecord, decode_record, progress_key
from gateway.clock_state import estimate_from_record
from timesync.estimator import ClockEstimate


class StreamProgress(ProgressRecord):
    """What is known to be in the events topic of one stream (the checkpoint record plus its bookkeeping)."""

    __slots__ = ()

    def observe(self, source_id: str, seq: int, offset: int) -> None:
        if seq + 1 > self.next_seq.get(source_id, 0):
            self.next_seq[source_id] = seq + 1
        self.next_offset = max(self.next_offset, offset + 1)

    def promise(self, watermark_us: int) -> None:
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us


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
    progress = StreamProgress(stream)
    wanted = progress_key(stream)
    # One consumer per topic: a reassigned consumer may still hand out messages prefetched for the old topic.
    consumer = _consumer(bootstrap_servers)
    try:
        for _offset, key, value in _scan(consumer, sources_topic, 0, timeout_s):
            if key == wanted:
                checkpoint = decode_record(value)
                if isinstance(checkpoint, ProgressRecord):
                    progress = StreamProgress(stream, checkpoint.next_offset, checkpoint.next_seq,
                                              checkpoint.watermark_us)
    finally:
        consumer.close()
    consumer = _consumer(bootstrap_servers)
    try:
        for offset, _key, value in _scan(consumer, events_topic, progress.next_offset, timeout_s):
            record = decode_record(value)
            if isinstance(record, EventRecord):
                progress.observe(record.source_id, record.seq, offset)
            else:
                if isinstance(record, PunctuationRecord):
                    progress.promise(record.watermark_us)
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
            parsed = estimate_from_record(value)
            if parsed is not None:
                latest[parsed[0]] = (parsed[1], parsed[2])
    finally:
        consumer.close()
    return latest
