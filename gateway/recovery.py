"""Recover, at startup, how far each source got in Kafka, so a restarted gateway never publishes an event twice.

Each shard's owner periodically checkpoints per stream `{events_offset, next_seq per source}` into its partition
of the compacted sources topic (key `progress|<stream>`). Recovery reads the latest checkpoint and scans the
shard's partition of the events topic only from the checkpointed offset to its end: exact, and bounded by the
checkpoint interval rather than the topic size.
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field

from broker.client import KafkaClientConfig, Servers
from broker.reader import PartitionScan, scan_partition
from contract.records import (
    PROGRESS_KEY_PREFIX,
    EventRecord,
    ProgressRecord,
    PunctuationRecord,
    RecordError,
    decode_record,
    progress_key,
)
from gateway.clock_state import estimate_from_record
from gateway.ingest import StreamProgress
from timesync.estimator import ClockEstimate


def recover_stream(servers: Servers, sources_topic: str, events_topic: str, stream: str,
                   timeout_s: float = 60.0, *, partition: int = 0) -> StreamProgress:
    """What partition ``partition`` (one shard) of the stream's events topic holds, from the shard's checkpoint in
    the same partition of the sources topic. Reads committed data only: a fenced owner's open transaction is not
    there."""
    wanted = progress_key(stream)
    checkpoint: ProgressRecord | None = None
    # One consumer per topic: a reassigned consumer may still hand out messages prefetched for the old topic.
    consumer = KafkaClientConfig.of(servers).consumer("skewless-recovery")
    try:
        for _offset, key, value in scan_partition(consumer, sources_topic, 0, timeout_s, partition=partition):
            if key == wanted:
                record = decode_record(value)
                if isinstance(record, ProgressRecord):
                    checkpoint = record
    finally:
        consumer.close()
    return recover_stream_from(servers, events_topic, stream, checkpoint, timeout_s, partition=partition)


def recover_stream_from(servers: Servers, events_topic: str, stream: str, checkpoint: ProgressRecord | None,
                        timeout_s: float = 60.0, *, partition: int = 0) -> StreamProgress:
    """``recover_stream`` given the stream's checkpoint (None: none yet): the scan of the events partition from the
    checkpointed offset to its end (read_committed)."""
    scan = StreamScan(servers, events_topic, stream, checkpoint, partition=partition)
    try:
        return scan.read_to_end(timeout_s)
    finally:
        scan.close()


# A scan that waits at the last stable offset for the fencing has a fetch parked at the broker, which answers it
# after fetch.wait.max.ms (librdkafka: 500 ms) if no record came, and a broker answers a connection's requests in
# order: the next read's end-offset request waited behind it (0.5-0.6 s of a takeover, issue 24 item 10).
_HELD_SCAN_CONSUMER = {"fetch.wait.max.ms": 20}


class StreamScan:
    """``recover_stream_from`` in steps, on one consumer: a new owner reads each stream's partition while its
    fencing runs (up to the last stable offset: the previous owner's open transaction is not there yet), then on to
    the end once the fencing decided that transaction (committed by a paused owner just before, or aborted). The
    progress after the last read is the one ``recover_stream_from`` returns."""

    def __init__(self, servers: Servers, events_topic: str, stream: str, checkpoint: ProgressRecord | None, *,
                 partition: int = 0) -> None:
        self.progress = StreamProgress(stream)
        if checkpoint is not None:
            self.progress = StreamProgress(stream, checkpoint.next_offset, checkpoint.next_seq,
                                           checkpoint.watermark_us, checkpoint.seen_us)
        self._consumer = KafkaClientConfig.of(servers).consumer("skewless-recovery", _HELD_SCAN_CONSUMER)
        self._scan = PartitionScan(self._consumer, events_topic, self.progress.next_offset, partition)
        # Reads and close run in executor threads: a close (the takeover cancelled) waits for a read still running.
        self._lock = threading.Lock()
        self._closed = False

    def read_to_end(self, timeout_s: float = 60.0) -> StreamProgress:
        with self._lock:
            if self._closed:
                raise RuntimeError("the stream scan is closed")
            return self._read_to_end(timeout_s)

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._consumer.close()

    def _read_to_end(self, timeout_s: float) -> StreamProgress:
        progress = self.progress
        for offset, _key, value in self._scan.read_to_end(timeout_s):
            record = decode_record(value)
            if isinstance(record, EventRecord):
                progress.observe(record.source_id, record.seq, offset, record.release_ts_us)
                # The merge released this event only once nothing earlier could follow (every other source was
                # past it or timed out): the next owner's merge must not release anything earlier after it either,
                # or the partition would leave reference order across a failover.
                progress.promise(record.ref_ts_us)
            else:
                if isinstance(record, PunctuationRecord):
                    progress.promise(record.watermark_us)
                progress.next_offset = max(progress.next_offset, offset + 1)
        return progress


@dataclass
class ShardState:
    """What one scan of a shard's partition of the sources topic holds: every source's latest clock estimate (and
    its last sync), and every stream's latest progress checkpoint."""

    clocks: dict[str, tuple[ClockEstimate, int]] = field(default_factory=dict)
    checkpoints: dict[str, ProgressRecord] = field(default_factory=dict)


def recover_shard(servers: Servers, sources_topic: str, timeout_s: float = 60.0, *,
                  partition: int = 0) -> ShardState:
    """A shard's clock state and checkpoints in one scan: a new owner then recovers the shard's streams at once,
    in parallel (``recover_stream_from``), instead of one stream at a time when its first source says hello."""
    state = ShardState()
    consumer = KafkaClientConfig.of(servers).consumer("skewless-recovery")
    try:
        for _offset, key, value in scan_partition(consumer, sources_topic, 0, timeout_s, partition=partition):
            if key is not None and key.startswith(PROGRESS_KEY_PREFIX.encode()):
                with contextlib.suppress(RecordError):
                    record = decode_record(value)
                    if isinstance(record, ProgressRecord):
                        state.checkpoints[record.stream] = record
                continue
            parsed = estimate_from_record(value)
            if parsed is not None:
                state.clocks[parsed[0]] = (parsed[1], parsed[2])
    finally:
        consumer.close()
    return state


def recover_clocks(servers: Servers, sources_topic: str, timeout_s: float = 60.0, *,
                   partition: int = 0) -> dict[str, tuple[ClockEstimate, int]]:
    """Every source's latest clock estimate (and its last sync) from the compacted sources topic: a restarted
    gateway maps a source's timestamps at once instead of treating it as unsynced until its next re-sync."""
    latest: dict[str, tuple[ClockEstimate, int]] = {}
    consumer = KafkaClientConfig.of(servers).consumer("skewless-recovery")
    try:
        for _offset, _key, value in scan_partition(consumer, sources_topic, 0, timeout_s, partition=partition):
            parsed = estimate_from_record(value)
            if parsed is not None:
                latest[parsed[0]] = (parsed[1], parsed[2])
    finally:
        consumer.close()
    return latest
