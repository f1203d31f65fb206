"""A transactional shard's stop (the gateway's SIGTERM path, ``ShardRuntime.stop``): what the core released and the
producer took is committed, and only then acked; the transaction opened after that commit is aborted. A stop whose
commit fails acks nothing: the sources resend to the next owner, which recovers what Kafka committed."""

from __future__ import annotations

from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.client import KafkaClientConfig
from broker.transactions import TransactionAbortable, TransactionalPublisher
from contract.topics import TopicNames
from gateway.ingest import ConnectionId, IngestConfig
from gateway.shard import ShardRuntime, ShardSettings
from tests.unit.gateway.test_acks_confirmed_run import T0
from tests.unit.gateway.test_shard_delivery_reports import SHARD, FakePublisher, _acks, _prepared, three_records
from timesync.clocks import IdentityMapping
from timesync.store import SourceInfoStore

pytestmark = pytest.mark.timeout(30)

Step = tuple[Any, ...]


class FakeTransactionalPublisher(FakePublisher, TransactionalPublisher):
    """The calls the shard makes, logged in order with the host's acks; ``commit`` raises ``commit_error``."""

    def __init__(self, steps: list[Step], commit_error: Exception | None) -> None:
        FakePublisher.__init__(self)
        self._fenced = False
        self.steps = steps
        self.commit_error = commit_error

    def begin(self) -> None:
        self.steps.append(("begin",))

    def commit(self, timeout_s: float) -> None:
        self.steps.append(("commit", len(self.records)))
        if self.commit_error is not None:
            raise self.commit_error

    def abort(self, timeout_s: float) -> None:
        self.steps.append(("abort",))

    def close(self) -> None:
        self.steps.append(("close",))


class LoggingHost:
    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps
        self.failed: list[str] = []

    def send_to_source(self, source_id: str, data: bytes) -> None:
        self.steps += [("ack", *ack) for ack in _acks([(source_id, data)])]

    def send_frame(self, connection: ConnectionId, data: bytes) -> None: ...

    def set_throttled(self, source_id: str, throttled: bool) -> None: ...

    def shard_failed(self, shard: int, reason: str) -> None:
        self.failed.append(reason)


def transactional_runtime(steps: list[Step], now: list[int],
                          commit_error: Exception | None = None) -> ShardRuntime:
    """A shard as ``start()`` leaves it (its transaction open), without its tasks: ``stop`` drains it alone."""
    settings = ShardSettings(shard=SHARD, topics=TopicNames(), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(checkpoint_interval_us=1_000_000),
                             transactional=True)

    def make(*_args: object) -> FakeTransactionalPublisher:
        return FakeTransactionalPublisher(steps, commit_error)

    with mock.patch("gateway.shard.TransactionalPublisher", make):
        runtime = ShardRuntime(settings, IdentityMapping(), SourceInfoStore(), LoggingHost(steps), lambda: now[0])
    _prepared(runtime.core)
    runtime._in_transaction = True
    return runtime


async def test_stop_commits_what_was_produced_before_it_acks_it_then_aborts_the_next_transaction() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    three_records(runtime, now)  # source a's seqs 0-2 and a punctuation, with the producer, not committed
    runtime._carry_out_now(runtime.core.poll(now[0]))
    assert steps == []  # nothing is acked before its commit
    await runtime.stop(5.0)
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2), ("abort",), ("close",)]
    assert runtime.closed


@pytest.mark.parametrize("error", [KafkaException(KafkaError(KafkaError._TIMED_OUT)),
                                   TransactionAbortable("the transaction must be aborted")])
async def test_a_stop_whose_commit_fails_acks_nothing(error: Exception) -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now, commit_error=error)
    three_records(runtime, now)
    await runtime.stop(5.0)
    assert [step for step in steps if step[0] == "ack"] == []
    # An abortable transaction is aborted at once; a commit that failed otherwise leaves the broker to decide it.
    aborted = [("abort",)] if isinstance(error, TransactionAbortable) else []
    assert steps == [("commit", 4), *aborted, ("close",)]
