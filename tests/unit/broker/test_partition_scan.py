"""The takeover's scan of a shard's events partition (issue 24 item 10): read while the fencing runs, up to the last
stable offset, then on to the end the fencing left, on the same consumer. Against a model of a read_committed
partition: what the first read cannot see (the previous owner's open transaction) the second returns if a commit
made it visible, and nothing if the fencing aborted it; no record is returned twice."""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, TopicPartition

from broker.reader import PartitionScan

TOPIC = "p.events.s"
PARTITION = 2


@dataclass
class Entry:
    value: bytes | None  # None: a commit or abort marker (never delivered)
    txn: str  # "committed", "aborted" or "open"


@dataclass
class Message:
    entry: Entry
    at: int

    def error(self) -> None:
        return None

    def topic(self) -> str:
        return TOPIC

    def partition(self) -> int:
        return PARTITION

    def offset(self) -> int:
        return self.at

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes | None:
        return self.entry.value


@dataclass
class ReadCommittedPartition:
    """One partition as a read_committed consumer sees it: the end is the last stable offset (the first offset of
    the open transaction), markers and aborted records are passed over without being delivered."""

    log: list[Entry] = field(default_factory=list)
    assigned_at: int | None = None
    fetched: int = 0  # the consumer's position
    end_queries: int = 0

    def last_stable_offset(self) -> int:
        return next((i for i, e in enumerate(self.log) if e.txn == "open"), len(self.log))

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        assert (tp.topic, tp.partition) == (TOPIC, PARTITION)
        self.end_queries += 1
        return 0, self.last_stable_offset()

    def assign(self, partitions: list[TopicPartition]) -> None:
        assert self.assigned_at is None, "assigned twice: prefetched records could be handed out again"
        [tp] = partitions
        self.assigned_at = 0 if tp.offset == OFFSET_BEGINNING else tp.offset
        self.fetched = self.assigned_at

    def poll(self, timeout: float) -> Message | None:
        assert self.assigned_at is not None
        while self.fetched < self.last_stable_offset():
            at, entry = self.fetched, self.log[self.fetched]
            self.fetched += 1
            if entry.value is not None and entry.txn == "committed":
                return Message(entry, at)
        return None

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, PARTITION, self.fetched)]

    def decide(self, txn: str) -> None:
        """The open transaction ends (the previous owner's commit, or the fencing's abort), with its marker."""
        for entry in self.log:
            if entry.txn == "open":
                entry.txn = txn
        self.log.append(Entry(None, txn))


def transaction(values: list[bytes], txn: str) -> list[Entry]:
    return [Entry(v, txn) for v in values] + ([] if txn == "open" else [Entry(None, txn)])


def read(scan: PartitionScan) -> list[tuple[int, bytes]]:
    return [(offset, value) for offset, _key, value in scan.read_to_end(5.0)]


def a_partition_with_an_open_transaction() -> ReadCommittedPartition:
    # Offsets: 0-1 committed, 2 marker, 3 aborted, 4 marker, 5-6 committed, 7 marker, 8-9 the open transaction.
    return ReadCommittedPartition(transaction([b"a", b"b"], "committed") + transaction([b"x"], "aborted")
                                  + transaction([b"c", b"d"], "committed") + transaction([b"e", b"f"], "open"))


def test_a_commit_that_lands_before_the_fencing_is_read_on_to_and_nothing_twice() -> None:
    partition = a_partition_with_an_open_transaction()
    scan = PartitionScan(partition, TOPIC, 0, PARTITION)  # type: ignore[arg-type]
    assert read(scan) == [(0, b"a"), (1, b"b"), (5, b"c"), (6, b"d")]
    assert scan.position == 8
    partition.decide("committed")  # a paused owner's commit, just before the new owner's fencing
    assert read(scan) == [(8, b"e"), (9, b"f")]
    assert scan.position == 11
    assert read(scan) == []


def test_an_aborted_transaction_gives_the_second_read_nothing_and_it_still_ends() -> None:
    partition = a_partition_with_an_open_transaction()
    scan = PartitionScan(partition, TOPIC, 0, PARTITION)  # type: ignore[arg-type]
    assert read(scan) == [(0, b"a"), (1, b"b"), (5, b"c"), (6, b"d")]
    partition.decide("aborted")  # what the fencing does to a dead owner's open transaction
    assert read(scan) == []
    assert scan.position == 11


def test_a_read_from_a_checkpoint_starts_there() -> None:
    partition = a_partition_with_an_open_transaction()
    scan = PartitionScan(partition, TOPIC, 5, PARTITION)  # type: ignore[arg-type]
    assert read(scan) == [(5, b"c"), (6, b"d")]
    assert partition.assigned_at == 5


def test_nothing_past_the_checkpoint_reads_nothing_and_assigns_nothing() -> None:
    partition = ReadCommittedPartition(transaction([b"a"], "committed"))
    scan = PartitionScan(partition, TOPIC, 2, PARTITION)  # type: ignore[arg-type]
    assert read(scan) == []
    assert read(scan) == []
    assert partition.assigned_at is None
    assert partition.end_queries == 2
