"""A topic written one micro-batch per Kafka transaction, each batch exactly once (the IO of broker.batch_ledger).

``open()`` registers the sink's transactional id (fencing any earlier producer with it: a dead or paused driver's
open transaction is aborted, a commit it had started is completed first) and only then reads the sink's record,
the last committed batch id, from its consumer group. ``write(batch_id, records)`` skips a batch the record says
is committed, else writes the records and the new record in one transaction (:class:`TransactionalPublisher`,
the gateway's transactional producer). Readers with ``isolation.level=read_committed`` see each batch's records
once, or not at all while its transaction is open or after it aborted.

One sink per driver thread: its calls block on broker round trips and must not overlap (foreachBatch calls it
for one batch at a time).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from broker.batch_ledger import (
    RECORD_PARTITION,
    BatchDecision,
    BatchLedger,
    SinkFault,
    SinkStep,
    offset_of_batch_id,
    parse_sink_fault,
)
from broker.client import KafkaClientConfig, Servers
from broker.producer import QueueFull
from broker.transactions import TransactionAbortable, TransactionalPublisher, TransactionRetriable

__all__ = ["SINK_DEFAULTS", "SINK_FAULT_ENV", "SINK_FAULT_EXIT_CODE", "StepHook", "TransactionalBatchSink",
           "sink_fault_from_env"]

log = logging.getLogger(__name__)

SINK_DEFAULTS: dict[str, Any] = {
    # From the first record of a batch to its commit. A driver that dies mid-transaction holds back committed
    # readers of the topic until its restart fences it (at once) or this passes, whichever comes first.
    "transaction.timeout.ms": 60_000,
    # Java's default partitioner for keyed records (murmur2 of the key): every key lands on the partition Spark's
    # own Kafka sink gave it, so the revisions of a key stay in one partition (compaction keeps its last value).
    "partitioner": "murmur2_random",
}
# librdkafka's RD_KAFKA_PARTITION_UA: the partitioner chooses (confluent-kafka does not export the constant).
_PARTITIONER_CHOOSES = -1
# A transaction that fails with an abortable error (a broker lost leadership mid-batch) is aborted and written
# again this many times in all before the batch fails; the records are still in memory.
_MAX_ATTEMPTS = 3

StepHook = Callable[[SinkStep, int], None]
# A record's key and value; None is Kafka's null (no key; a null value is a tombstone on a compacted topic).
SinkRecord = tuple[bytes | None, bytes | None]

SINK_FAULT_ENV = "SKEWLESS_SINK_FAULT"
SINK_FAULT_EXIT_CODE = 86


class TransactionalBatchSink:
    """Micro-batches of (key, value) records to ``topic``, one transaction each, replays skipped."""

    def __init__(self, servers: Servers, topic: str, transactional_id: str, *, timeout_s: float = 60.0,
                 overrides: Mapping[str, Any] | None = None) -> None:
        self.topic = topic
        self.transactional_id = transactional_id
        self.timeout_s = timeout_s
        self._config = KafkaClientConfig.of(servers)
        self._publisher = TransactionalPublisher(servers, transactional_id, {**SINK_DEFAULTS, **(overrides or {})})
        self._group_metadata: Any = None
        self.ledger: BatchLedger | None = None

    def open(self) -> BatchLedger:
        """Fence earlier holders of the transactional id, then read the record (in this order: a commit the
        previous holder had started is complete once ``init`` returns, so its record is read too)."""
        self._publisher.init(self.timeout_s)
        # The record's group: named like the transactional id, never joined (no member, no rebalance); Kafka
        # accepts transactional offset commits for such a group.
        consumer = self._config.consumer(self.transactional_id, {"group.id": self.transactional_id})
        try:
            committed_offset = self._committed_offset(consumer)
            self._group_metadata = consumer.consumer_group_metadata()
        finally:
            consumer.close()
        self.ledger = BatchLedger.at_restart(committed_offset)
        log.debug("results sink %s on %s: last committed batch %s", self.transactional_id, self.topic,
                  self.ledger.last_committed_batch_id)
        return self.ledger

    def _committed_offset(self, consumer: Any) -> int:
        """The record's offset. read_committed (the consumers' default here) asks for stable offsets: a pending
        transactional commit is waited for, not read. A group coordinator that is not ready yet (the offsets
        topic of a fresh cluster is still being created or loaded: NOT_COORDINATOR) is asked again."""
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                (committed,) = consumer.committed([TopicPartition(self.topic, RECORD_PARTITION)],
                                                  timeout=self.timeout_s)
                error = committed.error
            except KafkaException as exc:
                error = exc.args[0] if exc.args and isinstance(exc.args[0], KafkaError) else None
                if error is None:
                    raise
            if error is None:
                return int(committed.offset)
            if not _coordinator_not_ready(error) or time.monotonic() > deadline:
                raise KafkaException(error)
            log.debug("reading the record of %s: %s; asking again", self.transactional_id, error)
            time.sleep(0.5)

    def write(self, batch_id: int, records: Sequence[SinkRecord],
              on_step: StepHook | None = None) -> BatchDecision:
        """Write batch ``batch_id`` unless it is committed already; returns what was decided. ``on_step`` (tests)
        is called at each :class:`SinkStep` of the transaction. Raises ProducerFenced when another driver took
        the transactional id over (this one must stop), KafkaException when the transaction could not commit."""
        if self.ledger is None:
            raise RuntimeError("open() the sink before writing")
        decision = self.ledger.decide(batch_id)
        if decision is BatchDecision.SKIP:
            log.info("batch %s of %s is a replay of a committed batch (last committed %s): skipped", batch_id,
                     self.topic, self.ledger.last_committed_batch_id)
            return decision
        if decision is BatchDecision.WRITE_UNRECORDED:
            log.warning("results sink %s has no record of batches before %s (its consumer group's offsets expired, "
                        "or the checkpoint predates the sink): if batch %s was written before, it is written again",
                        self.transactional_id, batch_id, batch_id)
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                self._transaction(batch_id, records, on_step)
                break
            except TransactionAbortable as exc:
                self._publisher.abort(self.timeout_s)
                if attempt == _MAX_ATTEMPTS:
                    raise
                log.warning("transaction of batch %s aborted (%s): written again", batch_id, exc)
        self.ledger.committed(batch_id)
        if on_step is not None:
            on_step(SinkStep.COMMITTED, batch_id)
        return decision

    def close(self) -> None:
        self._publisher.close()

    def _transaction(self, batch_id: int, records: Sequence[SinkRecord], on_step: StepHook | None) -> None:
        self._publisher.begin()
        half = (len(records) + 1) // 2
        for written, (key, value) in enumerate(records, start=1):
            self._produce(key, value)
            if on_step is not None and written == half:
                self._drain()  # the first half is in the broker's log, uncommitted
                on_step(SinkStep.MID_TRANSACTION, batch_id)
        record = TopicPartition(self.topic, RECORD_PARTITION, offset_of_batch_id(batch_id))
        self._publisher.send_offsets([record], self._group_metadata, self.timeout_s)
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                self._publisher.commit(self.timeout_s)
                return
            except TransactionRetriable:
                if attempt == _MAX_ATTEMPTS:
                    raise

    def _produce(self, key: bytes | None, value: bytes | None) -> None:
        while True:
            try:
                self._publisher.produce(self.topic, key, value, None, _PARTITIONER_CHOOSES)
                return
            except QueueFull:
                self._publisher.poll(0.1)

    def _drain(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self._publisher.pending() and time.monotonic() < deadline:
            self._publisher.send_now()  # not after the transactional producer's linger
            self._publisher.poll(0.01)


_COORDINATOR_NOT_READY = frozenset({KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_NOT_AVAILABLE,
                                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS})


def _coordinator_not_ready(error: KafkaError) -> bool:
    return error.code() in _COORDINATOR_NOT_READY or error.retriable()


def sink_fault_from_env(environ: Mapping[str, str] | None = None) -> StepHook | None:
    """Test fault injection: ``SKEWLESS_SINK_FAULT=<step>@<batch id>`` (broker.batch_ledger.parse_sink_fault)
    ends the driver process with exit code 86 at that step, a real process death (no cleanup, no flush)."""
    fault = parse_sink_fault((os.environ if environ is None else environ).get(SINK_FAULT_ENV, ""))
    return None if fault is None else _exit_at(fault)


def _exit_at(fault: SinkFault) -> StepHook:
    def hook(step: SinkStep, batch_id: int) -> None:
        if fault.fires(step, batch_id):
            log.warning("%s=%s%s: the driver exits now", SINK_FAULT_ENV, step.value, f"@{batch_id}")
            os._exit(SINK_FAULT_EXIT_CODE)
    return hook
