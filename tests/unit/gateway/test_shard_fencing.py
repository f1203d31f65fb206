"""A shard runtime that a newer owner fenced (issue 24, item 10): the normal end of a gateway that was paused or cut
off past its session timeout. It is counted as fencing and logged at INFO, never as a task failure with a traceback
(which would fire the documented SkewlessTaskFailures alert for a normal event); a task that dies of anything else
still is one."""

from __future__ import annotations

import asyncio
import logging

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.client import KafkaClientConfig, librdkafka_logger
from broker.transactions import ProducerFenced, TransactionalPublisher
from contract.topics import TopicNames
from gateway.ingest import ConnectionId, IngestConfig
from gateway.shard import ShardRuntime, ShardSettings
from timesync.clocks import IdentityMapping
from timesync.store import SourceInfoStore

pytestmark = pytest.mark.timeout(30)


class FakeHost:
    def __init__(self) -> None:
        self.failed: list[tuple[int, str]] = []

    def send_to_source(self, source_id: str, data: bytes) -> None: ...

    def send_frame(self, connection: ConnectionId, data: bytes) -> None: ...

    def set_throttled(self, source_id: str, throttled: bool) -> None: ...

    def shard_failed(self, shard: int, reason: str) -> None:
        self.failed.append((shard, reason))


def runtime_on(host: FakeHost) -> ShardRuntime:
    # Nothing here talks to Kafka: the producer is made (librdkafka connects lazily) and closed unused.
    settings = ShardSettings(shard=2, topics=TopicNames("fencing"), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(), transactional=True)
    return ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), host, lambda: 1_000_000)


async def died_with(runtime: ShardRuntime, error: Exception, name: str) -> None:
    async def fail() -> None:
        raise error

    task = runtime._start_task(fail(), name)
    await asyncio.wait([task])
    await asyncio.sleep(0)  # the done-callback


async def test_a_fenced_producer_is_fencing_logged_at_info_counted_and_no_task_failure(
        caplog: pytest.LogCaptureFixture) -> None:
    host = FakeHost()
    runtime = runtime_on(host)
    caplog.set_level(logging.DEBUG)
    try:
        await died_with(runtime, ProducerFenced("transactional id 'fencing.shard-2' was taken over by another "
                                                "producer"), "kafka-produce-2")
        assert runtime.fenced
        assert [shard for shard, _reason in host.failed] == [2]
        assert runtime.core.counters.task_failures == 0
        # (The producer's own attempts to reach the unreachable bootstrap address may log meanwhile: not ours.)
        ours = [r for r in caplog.records if r.name.startswith("gateway")]
        assert [(r.levelname, r.getMessage()) for r in ours if r.levelno > logging.INFO] == []
        assert not any(r.exc_info for r in caplog.records)
        assert any("fenced by a newer owner" in r.getMessage() and r.levelno == logging.INFO
                   for r in caplog.records)
        # librdkafka's own lines about the fencing (ERROR, CRITICAL at its end) are INFO here.
        librdkafka_logger().error("ADDPARTS [rdkafka#producer-16] [thrd:main]: TxnCoordinator/1: Failed to add "
                                  "partition: Broker: Producer attempted an operation with an old epoch")
        librdkafka_logger().critical("FATAL [rdkafka#producer-16]: Fatal error: Local: This instance has been "
                                     "fenced by a newer instance")
        # And so is its line about the open transaction a gateway that lost its shard aborts.
        librdkafka_logger().error("TXNERR [rdkafka#producer-16]: Current transaction failed in state BeginCommit: "
                                  "Local: Purged in flight: current transaction must be aborted (_PURGE_INFLIGHT)")
        librdkafka_logger().error("FAIL [rdkafka#producer-16]: broker down")  # anything else keeps its level
        levels = [r.levelname for r in caplog.records
                  if r.name == librdkafka_logger().name and "producer-16" in r.getMessage()]
        assert levels == ["INFO", "INFO", "INFO", "ERROR"]
    finally:
        await runtime.stop(0.0, graceful=False)


async def test_a_produce_that_fails_with_the_generic_fatal_error_of_a_fencing_is_fencing_too(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """librdkafka fails a produce with _FATAL before the error callback saying why (fenced) was served."""
    host = FakeHost()
    runtime = runtime_on(host)
    publisher = runtime._publisher
    assert isinstance(publisher, TransactionalPublisher)

    def poll(_timeout_s: float = 0.0) -> int:  # serves the error callback, as librdkafka's poll would
        publisher._on_error(KafkaError(KafkaError._FENCED, "This instance has been fenced by a newer instance",
                                       fatal=True))
        return 0

    monkeypatch.setattr(publisher, "poll", poll)
    caplog.set_level(logging.INFO)
    try:
        await died_with(runtime, KafkaException(KafkaError(KafkaError._FATAL, "Unable to produce message: Local: "
                                                           "Fatal error", fatal=True)), "kafka-produce-2")
        assert runtime.fenced and runtime.core.counters.task_failures == 0
        ours = [r for r in caplog.records if r.name.startswith("gateway")]
        assert [r.getMessage() for r in ours if r.levelno > logging.INFO] == []
    finally:
        monkeypatch.undo()
        await runtime.stop(0.0, graceful=False)


async def test_a_task_that_dies_of_anything_else_is_still_a_task_failure_with_its_traceback(
        caplog: pytest.LogCaptureFixture) -> None:
    host = FakeHost()
    runtime = runtime_on(host)
    caplog.set_level(logging.INFO)
    try:
        await died_with(runtime, RuntimeError("a bug"), "kafka-poll-2")
        assert not runtime.fenced
        assert runtime.core.counters.task_failures == 1
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name.startswith("gateway")]
        assert len(errors) == 1 and errors[0].exc_info is not None
        assert [shard for shard, _reason in host.failed] == [2]
    finally:
        await runtime.stop(0.0, graceful=False)
