"""A new shard owner reads its streams while its fencing runs (issue 24 item 10), on the real broker: the first read
stops at the previous owner's open transaction; whatever the fencing leaves of it (committed by a paused owner just
before, or aborted) the second read on the same consumer gets exactly, and the fencing producer still fences."""

from __future__ import annotations

import time
import uuid

import pytest

from broker.cluster import ensure_partitions
from broker.launcher import BrokerState
from broker.transactions import ProducerFenced, TransactionalPublisher
from contract.records import EventRecord
from contract.topics import TopicNames
from gateway.recovery import StreamScan

PARTITION = 1


@pytest.fixture
def names() -> TopicNames:
    return TopicNames(f"t{uuid.uuid4().hex[:10]}")


def event(seq: int) -> bytes:
    return EventRecord(stream="s", source_id="a", seq=seq, source_ts_us=1_000 + seq, ref_ts_us=1_000 + seq,
                       uncertainty_us=0, arrival_ts_us=2_000, release_ts_us=3_000 + seq).to_json()


def write(publisher: TransactionalPublisher, topic: str, seqs: range) -> None:
    for seq in seqs:
        publisher.produce(topic, b"a", event(seq), None, partition=PARTITION)
    deadline = time.monotonic() + 10.0
    while publisher.pending():  # on the broker, not committed
        assert time.monotonic() < deadline, "records not delivered"
        publisher.poll(0.05)


@pytest.mark.parametrize("previous_owner_commits", [True, False])
def test_the_read_beside_the_fencing_goes_on_to_what_the_fencing_left(
        kafka: BrokerState, names: TopicNames, previous_owner_commits: bool) -> None:
    servers = kafka.bootstrap_servers
    topic = names.events("s")
    ensure_partitions(servers, [topic], 2)
    transactional_id = f"{names.prefix}.shard-{PARTITION}"
    previous = TransactionalPublisher(servers, transactional_id)
    successor = TransactionalPublisher(servers, transactional_id)
    scan = StreamScan(servers, topic, "s", None, partition=PARTITION)
    try:
        previous.init(30.0)
        previous.begin()
        write(previous, topic, range(3))
        previous.commit(30.0)
        previous.begin()
        write(previous, topic, range(3, 5))  # open when the successor takes over

        beside_fencing = scan.read_to_end(10.0)
        assert beside_fencing.next_seq == {"a": 3}
        assert beside_fencing.next_offset == 3  # seqs 0-2; the commit marker at 3 is not passed yet

        if previous_owner_commits:
            previous.commit(30.0)  # a paused owner's commit, landing just before the successor's fencing
        successor.init(30.0, connect_topic=topic)

        after_fencing = scan.read_to_end(10.0)
        # Offsets 0-2 seqs 0-2, 3 marker, 4-5 seqs 3-4, 6 its commit or the fencing's abort marker.
        assert after_fencing.next_seq == {"a": 5 if previous_owner_commits else 3}
        assert after_fencing.next_offset == (6 if previous_owner_commits else 3)
        assert scan.read_to_end(10.0).next_seq == after_fencing.next_seq
        with pytest.raises(ProducerFenced):
            if previous_owner_commits:
                previous.begin()
                previous.produce(topic, b"a", event(9), None, partition=PARTITION)
            previous.commit(30.0)
    finally:
        scan.close()
        previous.close()
        successor.close()
