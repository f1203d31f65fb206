"""Checking Kafka's word before a transaction commits: every record the shard wrote sits where the count says.

The shard's owner is the only writer of its partition of each stream's events and late topics (one transactional
id per shard, fencing: docs/cluster.md), so the records it produces to one such partition take consecutive
offsets, and each committed transaction that touched the partition adds one control record (the commit marker).
From the delivery report of the last record of each produce batch (per topic) and the number of records the batch
wrote there, the offset every report must carry follows exactly once one report anchored the partition: the
first report after this owner started, or offset 0 for a topic the gateway created just now.

Why: a successful delivery report is librdkafka's word that the broker appended the record. A report that skips,
repeats or lacks an offset means a record is not where the client believes (a batch the broker answered as a
duplicate of another, a partition's producer state reset under it): committing would make an ack lie. The shard
aborts instead, and its sources resend to the restarted shard (ingest rule 2: no ack before the commit).

Sans-IO: the shard tells it what it produced, what Kafka reported and when a transaction committed; ``verdict``
says whether the open transaction may commit. What it costs: one report per topic per batch (the ones the
progress checkpoint already asks for, plus one for a late topic or a punctuation that ends a batch)."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

__all__ = ["OffsetAudit"]


@dataclass
class _Partition:
    next_offset: int | None = None  # the offset the next record must get; None until a report anchors it
    batches: collections.deque[int] = field(default_factory=collections.deque)  # records per report to come
    touched: bool = False  # written in the open transaction: its commit adds a marker


class OffsetAudit:
    """Per partition (named by its topic: the shard writes one partition of each) the offsets Kafka must report."""

    def __init__(self) -> None:
        self._partitions: dict[str, _Partition] = {}
        self.failure: str | None = None  # the first discrepancy of the open transaction, if any

    def starts_empty(self, topic: str) -> None:
        """``topic`` was created just now: its first record must get offset 0."""
        self._partition(topic).next_offset = 0

    def produced(self, topic: str, records: int) -> None:
        """A batch wrote ``records`` records to ``topic``; its last one's delivery report comes later, in order."""
        partition = self._partition(topic)
        partition.batches.append(records)
        partition.touched = True

    def reported(self, topic: str, offset: int | None, failed: bool) -> None:
        """The delivery report of the last record of the oldest batch not reported yet on ``topic``. A failed one
        fails the commit by itself (librdkafka's rule): nothing to check, and nothing to anchor on."""
        partition = self._partitions[topic]
        records = partition.batches.popleft()
        if failed:
            partition.next_offset = None
            return
        if offset is None or offset < 0:
            self._fail(f"{topic}: a record reported delivered without an offset ({offset})")
            partition.next_offset = None
            return
        start = partition.next_offset
        if start is not None and offset != start + records - 1:
            self._fail(f"{topic}: the last of {records} records reported at offset {offset}, expected "
                       f"{start + records - 1} (the first of them belongs at {start})")
        partition.next_offset = offset + 1

    def verdict(self) -> str | None:
        """Before the commit, once every record was delivered: None if the transaction may commit, else why not."""
        if self.failure is not None:
            return self.failure
        waiting = sorted(topic for topic, partition in self._partitions.items() if partition.batches)
        if waiting:
            return f"no delivery report yet for the last record of {', '.join(waiting)}"
        return None

    def committed(self) -> None:
        """The open transaction committed: a marker follows the records of every partition it wrote."""
        for partition in self._partitions.values():
            if partition.touched and partition.next_offset is not None:
                partition.next_offset += 1
            partition.touched = False

    def _partition(self, topic: str) -> _Partition:
        partition = self._partitions.get(topic)
        if partition is None:
            partition = self._partitions[topic] = _Partition()
        return partition

    def _fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = reason
