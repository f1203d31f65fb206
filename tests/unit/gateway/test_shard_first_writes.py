"""The first record a shard runtime writes to a topic goes to librdkafka alone, and the rest of the batch waits
until Kafka answered it (``ShardRuntime._settle``): with a later batch in flight, a refused first batch on a
partition the broker keeps no producer state for would be counted delivered by librdkafka ("implicitly acked")
and never written. Seen with librdkafka's debug log in the throughput benchmark; here the publisher is a script."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest

from broker.client import KafkaClientConfig
from contract.topics import TopicNames
from contract.wire.messages import IncomingEvent
from gateway.ingest import ConnectionId, IngestConfig
from gateway.shard import ShardRuntime, ShardSettings
from tests.unit.gateway.test_acks_confirmed_run import T0
from tests.unit.gateway.test_shard_delivery_reports import SHARD, FakeHost, FakePublisher, _prepared
from timesync.clocks import IdentityMapping
from timesync.store import SourceInfoStore

pytestmark = pytest.mark.timeout(30)


class AnsweringPublisher(FakePublisher):
    """``pending()``: the records Kafka has not answered yet; the test answers them by moving ``answered``."""

    def __init__(self) -> None:
        super().__init__()
        self.answered = 0

    def pending(self) -> int:
        return len(self.records) - self.answered


def runtime_with(publisher: AnsweringPublisher, now: list[int]) -> ShardRuntime:
    settings = ShardSettings(shard=SHARD, topics=TopicNames(), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(checkpoint_interval_us=1_000_000),
                             transactional=False)
    with mock.patch("gateway.shard.KafkaPublisher", lambda *_args: publisher):
        runtime = ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), FakeHost(), lambda: now[0])
    _prepared(runtime.core)
    return runtime


def released_writes(runtime: ShardRuntime, now: list[int], seqs: range) -> list:
    events = tuple(IncomingEvent("s", seq, T0 + seq, 1) for seq in seqs)
    writes = runtime._carry_out_now(runtime.core.events_received(ConnectionId(1), "a", events, now[0]))
    now[0] += 2_000_000
    return writes + runtime._carry_out_now(runtime.core.advance(now[0]))


async def test_the_first_record_to_a_topic_waits_for_kafkas_answer_before_the_next_goes() -> None:
    now = [T0 + 100]
    publisher = AnsweringPublisher()
    runtime = runtime_with(publisher, now)
    events_topic = TopicNames().events("s")
    runtime._expect_first_writes(events_topic)
    writes = released_writes(runtime, now, range(3))
    topics = [w.topic for w in writes]
    first = topics.index(events_topic)
    assert len(writes) > first + 1  # more records follow the first to the events topic in this batch
    producing = asyncio.create_task(runtime._produce_batch(writes))
    for _ in range(5):
        await asyncio.sleep(0.005)
    assert [topic for topic, _key, _callback in publisher.records] == topics[:first + 1]  # alone, and waiting
    # ... and not for librdkafka's linger.ms: it is asked to send the record now, again on each turn of the wait.
    assert publisher.sent_now >= 5
    publisher.answered = len(publisher.records)
    await asyncio.wait_for(producing, 5)
    assert [topic for topic, _key, _callback in publisher.records] == topics
    # Settled: a later batch goes at once, whatever is in flight.
    more = released_writes(runtime, now, range(3, 6))
    await asyncio.wait_for(runtime._produce_batch(more), 5)
    assert len(publisher.records) == len(writes) + len(more)
    assert publisher.pending() == len(writes) - (first + 1) + len(more)  # it did not wait for them


async def test_a_topic_not_expected_is_written_at_once() -> None:
    now = [T0 + 100]
    publisher = AnsweringPublisher()
    runtime = runtime_with(publisher, now)
    writes = released_writes(runtime, now, range(3))
    await asyncio.wait_for(runtime._produce_batch(writes), 5)
    assert len(publisher.records) == len(writes)


class PolledPublisher(AnsweringPublisher):
    """Kafka answered everything, but the answers count as pending until a ``poll`` serves them."""

    def poll(self, _timeout_s: float = 0.0) -> int:
        served = len(self.records) - self.answered
        self.answered = len(self.records)
        return served


async def test_the_wait_serves_the_reports_itself_when_no_poll_task_runs() -> None:
    """At a stop the poll task is cancelled first and the drain's commit waits for the producer's lock: the first
    write's wait must serve Kafka's reports itself, or the stop never ends."""
    now = [T0 + 100]
    publisher = PolledPublisher()
    runtime = runtime_with(publisher, now)
    runtime._expect_first_writes(TopicNames().events("s"))
    writes = released_writes(runtime, now, range(3))
    await asyncio.wait_for(runtime._produce_batch(writes), 5)
    assert len(publisher.records) == len(writes)
