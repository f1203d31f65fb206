"""The broker floor's cluster building blocks on the real broker: transactional fencing, committed reads that end
on transaction markers, shard ownership through group membership (join, leave, freeze, static restart), the
cluster control topic's refusals and its owner directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, Message
from confluent_kafka.admin import ConfigResource, ResourceType

from broker.admin import TopicConfigError
from broker.client import KafkaClientConfig
from broker.cluster import (
    ClusterConfigError,
    OwnerDirectory,
    claim_cluster,
    ensure_control_topic,
    ensure_partitions,
)
from broker.launcher import BrokerState
from broker.membership import GroupMembership, MembershipChange, SharesAssigned, SharesLost, SharesRevoked
from broker.reader import end_offset, read_topic, scan_partition
from broker.transactions import ProducerFenced, TransactionalPublisher
from contract.records import ClusterRecord, OwnerRecord
from contract.topics import TopicNames

ALL_SHARDS = frozenset({0, 1, 2, 3})
SESSION_TIMEOUT_MS = 6000  # the broker's group.min.session.timeout.ms: the fastest failover Kafka allows


@pytest.fixture
def names() -> TopicNames:
    return TopicNames(f"t{uuid.uuid4().hex[:10]}")


def scan(servers: str, topic: str, partition: int, start_offset: int = 0,
         timeout_s: float = 10.0) -> list[tuple[int, bytes]]:
    consumer = KafkaClientConfig.of(servers).consumer("test-scan")
    try:
        return [(offset, value) for offset, _key, value in
                scan_partition(consumer, topic, start_offset, timeout_s, partition=partition)]
    finally:
        consumer.close()


def delivered(publisher: TransactionalPublisher, timeout_s: float = 10.0) -> None:
    """Wait until every queued record reached the broker (written, not committed)."""
    deadline = time.monotonic() + timeout_s
    while publisher.pending():
        assert time.monotonic() < deadline, "records not delivered"
        publisher.poll(0.05)


# --- transactions -------------------------------------------------------------------------------------------------

def test_a_second_producer_with_the_same_id_fences_the_first(kafka: BrokerState, names: TopicNames) -> None:
    servers = kafka.bootstrap_servers
    topic = names.events("s")
    ensure_partitions(servers, [topic], 2)
    transactional_id = f"{names.prefix}-shard-1"
    reports: list[tuple[KafkaError | None, bytes | None]] = []

    def report(error: KafkaError | None, message: Message) -> None:
        reports.append((error, message.value()))

    zombie = TransactionalPublisher(servers, transactional_id)
    successor = TransactionalPublisher(servers, transactional_id)
    try:
        zombie.init(30.0)
        zombie.begin()
        zombie.produce(topic, b"src", b"zombie-1", report, partition=1)
        delivered(zombie)
        # The zombie's record is in the log (delivered), only its transaction is open.
        assert reports == [(None, b"zombie-1")]

        successor.init(30.0)
        successor.begin()
        successor.produce(topic, b"src", b"successor-1", None, partition=1)
        successor.produce(topic, b"src", b"successor-2", None, partition=1)
        successor.commit(30.0)

        with pytest.raises(ProducerFenced):
            zombie.commit(10.0)
        assert zombie.fenced
        # Fenced for good: no later call reaches the broker.
        with pytest.raises(ProducerFenced):
            zombie.begin()
        with pytest.raises(ProducerFenced):
            zombie.produce(topic, b"src", b"zombie-2", None, partition=1)
    finally:
        zombie.close()
        successor.close()

    assert [value for _offset, value in scan(servers, topic, 1)] == [b"successor-1", b"successor-2"]
    assert scan(servers, topic, 0) == []


def test_an_aborted_transaction_is_invisible_and_the_scan_still_ends(kafka: BrokerState, names: TopicNames) -> None:
    servers = kafka.bootstrap_servers
    topic = names.events("s")
    ensure_partitions(servers, [topic], 2)
    publisher = TransactionalPublisher(servers, f"{names.prefix}-shard-0")
    reports: list[tuple[KafkaError | None, bytes | None]] = []

    def report(error: KafkaError | None, message: Message) -> None:
        reports.append((error, message.value()))

    try:
        publisher.init(30.0)
        publisher.begin()
        publisher.produce(topic, b"a", b"committed-1", report, partition=0)
        publisher.produce(topic, b"a", b"committed-2", report, partition=0)
        publisher.commit(30.0)
        # commit() served the delivery reports (it flushes) but left their callbacks to the polling thread.
        assert reports == []
        assert publisher.poll(0) == 2
        assert reports == [(None, b"committed-1"), (None, b"committed-2")]
        publisher.begin()
        publisher.produce(topic, b"a", b"aborted-1", None, partition=0)
        publisher.produce(topic, b"a", b"aborted-2", None, partition=0)
        delivered(publisher)
        publisher.abort(30.0)

        # Offsets: 0, 1 committed; 2 commit marker; 3, 4 aborted; 5 abort marker.
        consumer = KafkaClientConfig.of(servers).consumer("test-end")
        try:
            assert end_offset(consumer, topic, 10.0, partition=0) == 6
        finally:
            consumer.close()
        started = time.monotonic()
        assert scan(servers, topic, 0) == [(0, b"committed-1"), (1, b"committed-2")]
        # Started inside the aborted records: nothing to return, and no wait for an offset that never comes.
        assert scan(servers, topic, 0, start_offset=3) == []
        assert time.monotonic() - started < 5.0
        assert read_topic(servers, topic, timeout_s=10.0) == [(b"a", b"committed-1"), (b"a", b"committed-2")]

        # An open transaction's records are not returned: the committed end is the last stable offset.
        publisher.begin()
        publisher.produce(topic, b"a", b"open-1", None, partition=0)
        delivered(publisher)
        assert scan(servers, topic, 0) == [(0, b"committed-1"), (1, b"committed-2")]
        publisher.commit(30.0)
        assert scan(servers, topic, 0, start_offset=2) == [(6, b"open-1")]
    finally:
        publisher.close()


def test_what_lingers_goes_at_send_now_and_at_the_commit(kafka: BrokerState, names: TopicNames) -> None:
    """The transactional producer lingers (TRANSACTION_DEFAULTS): that costs nothing only because what lingers goes
    at once when asked (a shard's first record to a topic, ShardRuntime._settle) and at the commit. Here linger.ms is
    9 s: a record that went any later than asked would miss the bounds below by seconds."""
    servers = kafka.bootstrap_servers
    topic = names.events("s")
    ensure_partitions(servers, [topic], 1)
    publisher = TransactionalPublisher(servers, f"{names.prefix}-shard-0", {"linger.ms": 9_000})
    try:
        publisher.init(30.0)
        publisher.begin()
        publisher.produce(topic, b"a", b"first", None, partition=0)
        publisher.poll(1.0)
        assert publisher.pending() == 1  # it lingers
        deadline = time.monotonic() + 4.0
        while publisher.pending():
            assert time.monotonic() < deadline, "send_now did not send the lingering record"
            publisher.send_now()
            publisher.poll(0.01)
        publisher.produce(topic, b"a", b"second", None, partition=0)
        started = time.monotonic()
        publisher.commit(30.0)
        assert time.monotonic() - started < 4.0  # the commit's flush did not wait out the linger
        assert scan(servers, topic, 0) == [(0, b"first"), (1, b"second")]
    finally:
        publisher.close()


def test_a_settled_read_waits_for_the_last_transaction(kafka: BrokerState, names: TopicNames) -> None:
    """An open transaction stands for a committed one whose markers have not landed yet (a commit returns before
    they do): a read_committed read ends before it, a settled read waits for its markers."""
    servers = kafka.bootstrap_servers
    topic = names.events("s")
    ensure_partitions(servers, [topic], 1)
    publisher = TransactionalPublisher(servers, f"{names.prefix}-shard-0")
    try:
        publisher.init(30.0)
        publisher.begin()
        publisher.produce(topic, b"a", b"committed-1", None, partition=0)
        publisher.commit(30.0)
        publisher.begin()
        publisher.produce(topic, b"a", b"committed-last", None, partition=0)
        delivered(publisher)
        assert read_topic(servers, topic, timeout_s=10.0) == [(b"a", b"committed-1")]
        with pytest.raises(TimeoutError, match=r"last stable offsets \{0: 2\} stayed behind the high watermarks "
                                               r"\{0: 3\}"):
            read_topic(servers, topic, timeout_s=2.0, settled=True)
        with ThreadPoolExecutor(1) as pool:
            settled = pool.submit(partial(read_topic, servers, topic, 30.0, settled=True))
            publisher.commit(30.0)
            assert settled.result() == [(b"a", b"committed-1"), (b"a", b"committed-last")]
    finally:
        publisher.close()


# --- group membership ---------------------------------------------------------------------------------------------

class Member:
    """A GroupMembership and every change it reported, in order."""

    def __init__(self, servers: str, names: TopicNames, instance_id: str | None,
                 max_poll_interval_ms: int = 20_000) -> None:
        self.membership = GroupMembership(servers, names.gateway_group, names.cluster, instance_id=instance_id,
                                          session_timeout_ms=SESSION_TIMEOUT_MS,
                                          max_poll_interval_ms=max_poll_interval_ms)
        self.changes: list[MembershipChange] = []
        self.polling = True

    def poll(self) -> None:
        if self.polling:
            self.changes.extend(self.membership.poll())

    def owned(self) -> frozenset[int]:
        return self.membership.owned()


def poll_until(members: list[Member], done: Callable[[], bool], timeout_s: float) -> float:
    """Polls every member until ``done()``; returns the seconds it took."""
    started = time.monotonic()
    while not done():
        assert time.monotonic() - started < timeout_s, f"not reached in {timeout_s} s: " + ", ".join(
            str(sorted(m.owned())) for m in members)
        for member in members:
            member.poll()
        time.sleep(0.02)
    return time.monotonic() - started


def split_evenly(a: Member, b: Member) -> bool:
    return len(a.owned()) == 2 and len(b.owned()) == 2 and a.owned() | b.owned() == ALL_SHARDS


def report_timing(name: str, seconds: float) -> None:
    # Collected by `pytest -s`; the figures quoted in docs come from these lines.
    print(f"\nTIMING {name}: {seconds:.2f} s")


@pytest.fixture
def control_topic(kafka: BrokerState, names: TopicNames) -> str:
    ensure_control_topic(kafka.bootstrap_servers, names.cluster, 4)
    return names.cluster


def close_all(members: list[Member]) -> None:
    for member in members:
        member.membership.close()


def test_two_members_split_the_shards_and_the_survivor_takes_all(kafka: BrokerState, names: TopicNames,
                                                                  control_topic: str) -> None:
    servers = kafka.bootstrap_servers
    a = Member(servers, names, None)
    members = [a]
    try:
        joined_s = poll_until(members, lambda: a.owned() == ALL_SHARDS, 30.0)
        report_timing("first member owns all 4 shards after subscribe", joined_s)
        assert a.changes == [SharesAssigned(ALL_SHARDS)]

        b = Member(servers, names, None)
        members.append(b)
        split_s = poll_until(members, lambda: split_evenly(a, b), 30.0)
        report_timing("second member joined, 2/2 split", split_s)
        assert a.owned().isdisjoint(b.owned())
        # Cooperative: the first member gave up only the two shards that moved, and kept the others throughout.
        assert a.changes == [SharesAssigned(ALL_SHARDS), SharesRevoked(b.owned())]
        assert b.changes == [SharesAssigned(b.owned())]

        moved = b.owned()
        b.membership.close()  # a dynamic member leaves the group at once
        members.remove(b)
        left_s = poll_until(members, lambda: a.owned() == ALL_SHARDS, 30.0)
        report_timing("dynamic member closed -> survivor owns all 4", left_s)
        assert left_s < SESSION_TIMEOUT_MS / 1000
        assert a.changes[-1] == SharesAssigned(moved)
    finally:
        close_all(members)


def test_a_member_that_stops_polling_loses_its_shards(kafka: BrokerState, names: TopicNames,
                                                      control_topic: str) -> None:
    servers = kafka.bootstrap_servers
    max_poll_interval_ms = 7000
    a = Member(servers, names, None, max_poll_interval_ms=max_poll_interval_ms)
    b = Member(servers, names, None, max_poll_interval_ms=max_poll_interval_ms)
    members = [a, b]
    try:
        poll_until(members, lambda: split_evenly(a, b), 30.0)
        b_shards = b.owned()
        b.polling = False
        taken_s = poll_until(members, lambda: a.owned() == ALL_SHARDS, 30.0)
        report_timing(f"member stopped polling (max.poll.interval.ms={max_poll_interval_ms}) -> other owns all 4",
                      taken_s)
        assert taken_s > 5.0  # a silent member keeps its shards until its poll interval ran out
        b.polling = True
        poll_until(members, lambda: any(isinstance(c, SharesLost) for c in b.changes), 30.0)
        assert SharesLost(b_shards) in b.changes
        # It rejoins as a fresh member, and the sticky assignor gives it half again.
        poll_until(members, lambda: split_evenly(a, b), 30.0)
    finally:
        close_all(members)


MEMBER_SCRIPT = """
import json, signal, sys, time
from broker.membership import GroupMembership
servers, group, topic, instance = sys.argv[1:5]
membership = GroupMembership(servers, group, topic, instance_id=instance, session_timeout_ms=int(sys.argv[5]))
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
while not stop:
    for change in membership.poll():
        print(json.dumps({"change": type(change).__name__, "partitions": sorted(change.partitions),
                          "owned": sorted(membership.owned())}), flush=True)
    time.sleep(0.02)
membership.close()
"""


@pytest.fixture
def member_process(kafka: BrokerState, names: TopicNames, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A static member in a process of its own, so that SIGSTOP freezes it whole (heartbeat thread included)."""
    script = tmp_path / "member.py"
    script.write_text(MEMBER_SCRIPT)
    root = Path(__file__).resolve().parents[2]
    process = subprocess.Popen(
        [sys.executable, str(script), kafka.bootstrap_servers, names.gateway_group, names.cluster, "frozen",
         str(SESSION_TIMEOUT_MS)], stdout=subprocess.PIPE, text=True, cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)})
    try:
        yield process
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.terminate()
            try:
                process.wait(15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)


def read_changes(process: subprocess.Popen[str], count: int) -> list[dict[str, object]]:
    assert process.stdout is not None
    return [json.loads(process.stdout.readline()) for _ in range(count)]


def test_a_frozen_member_loses_its_shards_after_the_session_timeout(
        kafka: BrokerState, names: TopicNames, control_topic: str, member_process: subprocess.Popen[str]) -> None:
    servers = kafka.bootstrap_servers
    [first] = read_changes(member_process, 1)
    assert first == {"change": "SharesAssigned", "partitions": [0, 1, 2, 3], "owned": [0, 1, 2, 3]}
    a = Member(servers, names, "survivor")
    members = [a]
    try:
        poll_until(members, lambda: len(a.owned()) == 2, 30.0)
        [revoked] = read_changes(member_process, 1)
        frozen_shards = ALL_SHARDS - a.owned()
        assert revoked == {"change": "SharesRevoked", "partitions": sorted(a.owned()),
                           "owned": sorted(frozen_shards)}

        os.kill(member_process.pid, signal.SIGSTOP)
        taken_s = poll_until(members, lambda: a.owned() == ALL_SHARDS, 30.0)
        report_timing(f"member SIGSTOPped (session.timeout.ms={SESSION_TIMEOUT_MS}) -> other owns all 4", taken_s)
        assert taken_s > 4.0  # nobody takes a frozen member's shards before its session expired
        assert a.changes[-1] == SharesAssigned(frozen_shards)

        os.kill(member_process.pid, signal.SIGCONT)
        # Woken up, it learns that it lost its shards (no orderly revoke: someone else may already serve them).
        lost = read_changes(member_process, 1)[0]
        assert lost == {"change": "SharesLost", "partitions": sorted(frozen_shards), "owned": []}
    finally:
        close_all(members)


def test_a_restarted_static_member_gets_its_shards_back_at_once(kafka: BrokerState, names: TopicNames,
                                                                control_topic: str) -> None:
    servers = kafka.bootstrap_servers
    a = Member(servers, names, "gw-a")
    b = Member(servers, names, "gw-b")
    members = [a, b]
    try:
        poll_until(members, lambda: split_evenly(a, b), 30.0)
        a_changes, b_shards = list(a.changes), b.owned()
        b.membership.close()  # a static member does not leave the group on close
        members.remove(b)
        restarted = Member(servers, names, "gw-b")
        members.append(restarted)
        back_s = poll_until(members, lambda: restarted.owned() == b_shards, 30.0)
        report_timing("static member restarted with the same instance id -> its shards back", back_s)
        assert back_s < SESSION_TIMEOUT_MS / 1000
        assert restarted.changes == [SharesAssigned(b_shards)]
        # The other member never noticed: no rebalance moved anything.
        assert a.changes == a_changes
        assert a.owned() == ALL_SHARDS - b_shards
    finally:
        close_all(members)


# --- control topic ------------------------------------------------------------------------------------------------

def test_a_shard_count_change_or_a_second_cluster_is_refused(kafka: BrokerState, names: TopicNames) -> None:
    servers = kafka.bootstrap_servers
    assert ensure_control_topic(servers, names.cluster, 4) is True
    assert ensure_control_topic(servers, names.cluster, 4) is False
    with pytest.raises(ClusterConfigError) as refused:
        ensure_control_topic(servers, names.cluster, 6)
    assert str(refused.value) == (
        "deployment has 4 shards, configured 6: changing S on a live deployment moves sources between shards; "
        "configure shards=4, or start a new deployment under another topic prefix")

    claimed = claim_cluster(servers, names.cluster, "prod", 4, now_us=1_000)
    assert claimed == ClusterRecord("prod", 4, 1_000)
    # A later gateway of the same deployment gets the original record.
    assert claim_cluster(servers, names.cluster, "prod", 4, now_us=2_000) == ClusterRecord("prod", 4, 1_000)
    with pytest.raises(ClusterConfigError) as refused:
        claim_cluster(servers, names.cluster, "staging", 4, now_us=3_000)
    assert str(refused.value) == (
        f"topic prefix {names.prefix} already belongs to cluster 'prod', not 'staging': "
        "a second cluster needs a topic prefix of its own")
    with pytest.raises(ClusterConfigError) as refused:
        claim_cluster(servers, names.cluster, "prod", 3, now_us=3_000)
    assert str(refused.value) == (
        "deployment has 4 shards, configured 3: changing S on a live deployment moves sources between shards; "
        "configure shards=4, or start a new deployment under another topic prefix")
    # Refusals write nothing: partition 0 still holds the one cluster record.
    assert [value for _offset, value in scan(servers, names.cluster, 0)] == [ClusterRecord("prod", 4, 1_000).to_json()]


def test_stream_topics_with_another_partition_count_are_refused(kafka: BrokerState, names: TopicNames) -> None:
    servers = kafka.bootstrap_servers
    topics = [names.events("s"), names.late("s")]
    assert ensure_partitions(servers, topics, 2) == sorted(topics)
    assert ensure_partitions(servers, topics, 2) == []
    with pytest.raises(ClusterConfigError) as refused:
        ensure_partitions(servers, topics, 3)
    assert str(refused.value) == (
        f"topic {names.events('s')} has 2 partitions, the deployment has 3 shards: changing S on a live deployment "
        "moves sources between shards; configure shards=2, or use another topic prefix")


def topic_replication(servers: str, topic: str) -> tuple[list[int], str]:
    """(replica count of each partition, min.insync.replicas) as the broker describes the topic."""
    admin = KafkaClientConfig(servers).admin()
    partitions = admin.list_topics(topic=topic, timeout=10).topics[topic].partitions
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(timeout=10)
    return [len(partitions[p].replicas) for p in sorted(partitions)], described["min.insync.replicas"].value


def test_replication_follows_the_broker_count_unless_configured(kafka: BrokerState, names: TopicNames) -> None:
    servers = KafkaClientConfig(kafka.bootstrap_servers, {"client.id": "skewless-rf-test"})
    assert ensure_control_topic(servers, names.cluster, 2) is True
    assert ensure_partitions(servers, [names.events("s")], 2, replication_factor=1) == [names.events("s")]
    # One broker: one replica each, and an acks=all write needs that one.
    assert topic_replication(kafka.bootstrap_servers, names.cluster) == ([1, 1], "1")
    assert topic_replication(kafka.bootstrap_servers, names.events("s")) == ([1, 1], "1")
    with pytest.raises(TopicConfigError) as refused:
        ensure_partitions(servers, [names.late("s")], 2, replication_factor=2)
    assert str(refused.value) == (
        "replication factor 2 needs 2 brokers, the cluster has 1: configure a replication factor of at most 1, "
        "or leave it unset (default min(3, brokers))")
    assert names.late("s") not in KafkaClientConfig(kafka.bootstrap_servers).admin().list_topics(timeout=10).topics


def test_the_owner_directory_shows_the_latest_committed_owner(kafka: BrokerState, names: TopicNames) -> None:
    servers = kafka.bootstrap_servers
    ensure_control_topic(servers, names.cluster, 2)
    owner_a0 = OwnerRecord(0, "gw-a", "10.0.0.1", 7000, 7001, 100)
    owner_a1 = OwnerRecord(1, "gw-a", "10.0.0.1", 7000, 7001, 100)
    owner_b1 = OwnerRecord(1, "gw-b", "10.0.0.2", 7100, None, 200)
    zombie0 = OwnerRecord(0, "gw-z", "10.0.0.9", 7900, None, 300)
    publisher = TransactionalPublisher(servers, f"{names.prefix}-owners")
    directory = OwnerDirectory(servers, names.cluster, 2)
    try:
        publisher.init(30.0)
        for records in ([owner_a0, owner_a1], [owner_b1]):
            publisher.begin()
            for record in records:
                publisher.produce(names.cluster, record.key, record.to_json(), None, partition=record.shard)
            publisher.commit(30.0)
        publisher.begin()
        publisher.produce(names.cluster, zombie0.key, zombie0.to_json(), None, partition=0)
        delivered(publisher)
        publisher.abort(30.0)
        # A non-owner record after the aborted one: the directory must read past both and ignore both.
        cluster_record = ClusterRecord(names.prefix, 2, 50)
        publisher.begin()
        publisher.produce(names.cluster, cluster_record.key, cluster_record.to_json(), None, partition=0)
        publisher.commit(30.0)

        deadline = time.monotonic() + 15.0
        while not directory.caught_up():
            assert time.monotonic() < deadline, "owner directory did not catch up"
            directory.poll()
            time.sleep(0.05)
        assert directory.poll() == {0: owner_a0, 1: owner_b1}
    finally:
        directory.close()
        publisher.close()
