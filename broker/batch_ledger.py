"""Which micro-batches a transactional batch sink writes: the pure decisions of an exactly-once Kafka sink.

Flink's two-phase-commit sink pre-commits a Kafka transaction per checkpoint and commits it when the checkpoint
completes; its checkpoint remembers which transaction belongs to which checkpoint, so a restart commits or aborts
each one exactly once. Spark's ``foreachBatch`` hands the sink a micro-batch and its ``batch_id`` instead, and
replays the last batch it did not record as done in its checkpoint (the driver died after the sink wrote it but
before Spark wrote ``commits/<batch_id>``). The sink therefore keeps its own record, in Kafka, in the same
transaction as the batch's records: the id of the last batch it committed. Committed together, they are visible
together or not at all, so a replayed batch is either wholly in the topic (skip it) or wholly absent (write it).

The record is a consumer-group offset (``send_offsets_to_transaction``): the sink's group commits offset
``batch_id + 1`` on partition 0 of the topic it writes, Kafka Streams' own way of tying offsets to a transaction.
Nothing here touches Kafka: :mod:`broker.batch_sink` carries these decisions out.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

__all__ = ["RECORD_PARTITION", "BatchDecision", "BatchLedger", "SinkFault", "SinkStep", "batch_id_of_offset",
           "offset_of_batch_id", "parse_sink_fault", "sink_transactional_id"]

# The partition of the written topic whose group offset holds the sink's record (every topic has a partition 0).
RECORD_PARTITION = 0


def sink_transactional_id(topic: str, query_id: str) -> str:
    """The transactional id, and the name of the record's consumer group, of the sink writing ``topic`` for one
    streaming query. ``query_id`` is Spark's ``StreamingQuery.id``, kept in the query's checkpoint: the same after
    every restart from that checkpoint, another for any other query (a fresh checkpoint is a new query)."""
    if not topic or not query_id:
        raise ValueError(f"a sink needs a topic and a query id, got {topic!r} and {query_id!r}")
    return f"{topic}.sink.{query_id}"


def offset_of_batch_id(batch_id: int) -> int:
    """The group offset that records ``batch_id`` as committed (Kafka's convention: the next one to do)."""
    if batch_id < 0:
        raise ValueError(f"batch ids start at 0, got {batch_id}")
    return batch_id + 1


def batch_id_of_offset(offset: int) -> int | None:
    """The last committed batch id a group offset records; None when there is no record (Kafka reports a group
    without an offset as a negative sentinel, -1001)."""
    return offset - 1 if offset > 0 else None


class BatchDecision(enum.Enum):
    WRITE = "write"
    """The batch is not in the topic: write its records and the record of its id in one transaction."""
    WRITE_UNRECORDED = "write_unrecorded"
    """As WRITE, but the sink has no record at all and this is not the query's first batch: whether the batch
    before it was written cannot be known (the record expired with the group's offsets, or the checkpoint is
    older than the sink). The caller logs a warning: at most this batch may be in the topic twice."""
    SKIP = "skip"
    """A replay of a batch the sink already committed: its records are in the topic once, write nothing."""


@dataclass
class BatchLedger:
    """The sink's view of what it committed: the last committed batch id (None: nothing yet)."""

    last_committed_batch_id: int | None = None

    @classmethod
    def at_restart(cls, committed_offset: int) -> BatchLedger:
        """The ledger of a sink that just fenced its predecessors, from the record's group offset."""
        return cls(batch_id_of_offset(committed_offset))

    def decide(self, batch_id: int) -> BatchDecision:
        if batch_id < 0:
            raise ValueError(f"batch ids start at 0, got {batch_id}")
        last = self.last_committed_batch_id
        if last is None:
            return BatchDecision.WRITE if batch_id == 0 else BatchDecision.WRITE_UNRECORDED
        # Spark replays only its last unrecorded batch (batch_id == last); a lower one is a checkpoint restored
        # from an older copy: its results are in the topic too.
        return BatchDecision.SKIP if batch_id <= last else BatchDecision.WRITE

    def committed(self, batch_id: int) -> None:
        """The transaction holding ``batch_id`` committed."""
        if self.last_committed_batch_id is not None and batch_id <= self.last_committed_batch_id:
            raise ValueError(f"batch {batch_id} committed after batch {self.last_committed_batch_id}: the sink "
                             f"writes each batch once, in increasing order")
        self.last_committed_batch_id = batch_id


class SinkStep(enum.Enum):
    """The moments of a batch's transaction at which a test may kill the driver (:class:`SinkFault`)."""

    MID_TRANSACTION = "mid_transaction"
    """Half of the batch's records are written to the broker, the transaction is open."""
    COMMITTED = "committed"
    """The transaction committed, the sink has not returned to Spark: Spark has not recorded the batch."""


@dataclass(frozen=True)
class SinkFault:
    """Test fault injection: the driver process exits at ``step`` of batch ``batch_id``."""

    step: SinkStep
    batch_id: int

    def fires(self, step: SinkStep, batch_id: int) -> bool:
        return step is self.step and batch_id == self.batch_id


_FAULT = re.compile(r"(?P<step>[a-z_]+)@(?P<batch_id>\d+)")


def parse_sink_fault(text: str) -> SinkFault | None:
    """``<step>@<batch_id>`` (e.g. ``committed@0``); "" is no fault. Anything else is refused, not ignored: a
    misspelled fault would make a crash test pass without crashing."""
    if not text.strip():
        return None
    match = _FAULT.fullmatch(text.strip())
    steps = {step.value: step for step in SinkStep}
    if match is None or match["step"] not in steps:
        raise ValueError(f"sink fault {text!r}: expected <step>@<batch id>, step one of {', '.join(steps)}")
    return SinkFault(steps[match["step"]], int(match["batch_id"]))
