"""A transactional shard's stop (the gateway's SIGTERM path, ``ShardRuntime.stop``): what the core released and the
producer took is committed, and only then acked; the transaction opened after that commit is aborted. A stop whose
commit fails acks nothing: the sources resend to the next owner, which recovers what Kafka committed."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException

from broker.client import KafkaClientConfig
from broker.transactions import TransactionAbortable, TransactionalPublisher
from contract.topics import TopicNames
from contract.wire.messages import IncomingEvent
from gateway.ingest import ConnectionId, IngestConfig
from gateway.shard import COMMIT_STALL_US, ShardLost, ShardRuntime, ShardSettings, _cancel
from tests.unit.gateway.test_acks_confirmed_run import T0
from tests.unit.gateway.test_shard_delivery_reports import (
    SHARD,
    FakePublisher,
    _acks,
    _prepared,
    produced,
    three_records,
)
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
        self.flushed = 0  # records[:flushed] were delivered (their reports queued for poll)
        self.committed = 0  # records[:committed] belong to committed transactions

    def begin(self) -> None:
        self.steps.append(("begin",))

    @staticmethod
    def await_leader(topic: str, partition: int, timeout_s: float) -> bool:
        return True

    def flush(self, timeout_s: float) -> int:
        self.served += [(index, None) for index in range(self.flushed, len(self.records))
                        if self.records[index][2] is not None]
        self.flushed = len(self.records)
        return 0

    def commit(self, timeout_s: float) -> None:
        self.steps.append(("commit", len(self.records)))
        if self.commit_error is not None:
            raise self.commit_error
        # Kafka's commit marker: one offset in each partition the transaction wrote.
        for topic in {topic for topic, _key, _callback in self.records[self.committed:]}:
            self._next_offset[topic] += 1
        self.committed = len(self.records)

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


def transactional_runtime(steps: list[Step], now: list[int], commit_error: Exception | None = None,
                          publisher_class: Callable[[list[Step], Exception | None], FakeTransactionalPublisher]
                          = FakeTransactionalPublisher) -> ShardRuntime:
    """A shard as ``start()`` leaves it (its transaction open), without its tasks: ``stop`` drains it alone."""
    settings = ShardSettings(shard=SHARD, topics=TopicNames(), kafka_client=KafkaClientConfig.of("127.0.0.1:9"),
                             producer_config={}, ingest=IngestConfig(checkpoint_interval_us=1_000_000),
                             transactional=True)

    def make(*_args: object) -> FakeTransactionalPublisher:
        return publisher_class(steps, commit_error)

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


async def test_a_commit_cancelled_before_it_confirmed_its_records_still_confirms_and_acks_them() -> None:
    # After the commit the task lets the frames read meanwhile go first; a stop cancelling it there must not lose the
    # committed records' confirmation (the deliveries were already taken from the shard's list).
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    three_records(runtime, now)
    runtime._carry_out_now(runtime.core.poll(now[0]))
    commit = asyncio.create_task(runtime._commit())
    # Loop turns until the commit (its flush and commit run on the executor's threads) is through; a timed sleep here
    # would let the task run past the point this test stops it at.
    for _ in range(10_000_000):
        if ("begin",) in steps:
            break
        await asyncio.sleep(0)
    assert steps == [("commit", 4), ("begin",)]  # committed, not confirmed yet
    commit.cancel()
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]


class BlockingBeginPublisher(FakeTransactionalPublisher):
    """``begin`` holds its thread until ``release`` is set (librdkafka's main thread waiting for a core), and notes
    the thread it ran on."""

    def __init__(self, steps: list[Step], commit_error: Exception | None) -> None:
        super().__init__(steps, commit_error)
        self.entered = threading.Event()
        self.release = threading.Event()
        self.begun_on: list[int] = []

    def begin(self) -> None:
        self.begun_on.append(threading.get_ident())
        self.entered.set()
        # On the loop's thread this would hold the loop, and the test that sets release could never run.
        if not self.release.wait(2.0):
            raise TimeoutError("begin was never released: it held the loop's thread")
        super().begin()


def with_three_records(steps: list[Step], publisher_class: type[FakeTransactionalPublisher]) -> ShardRuntime:
    """``transactional_runtime`` with source a's seqs 0-2 and a punctuation produced, not committed."""
    runtime = transactional_runtime(steps, now := [T0 + 100], publisher_class=publisher_class)
    three_records(runtime, now)
    runtime._carry_out_now(runtime.core.poll(now[0]))
    return runtime


def committed_and_beginning(steps: list[Step]) -> tuple[ShardRuntime, BlockingBeginPublisher]:
    runtime = with_three_records(steps, BlockingBeginPublisher)
    publisher = runtime._publisher
    assert isinstance(publisher, BlockingBeginPublisher)
    return runtime, publisher


async def test_the_next_transaction_opens_off_the_loops_thread_and_the_loop_runs_meanwhile() -> None:
    steps: list[Step] = []
    runtime, publisher = committed_and_beginning(steps)
    commit = asyncio.create_task(runtime._commit())
    assert await asyncio.to_thread(publisher.entered.wait, 2.0)
    assert publisher.begun_on != [threading.get_ident()]
    # Meanwhile the lock stays held: a frame's records wait for the producer task, which opens no transaction.
    assert runtime._txn_lock.locked()
    assert not runtime._producer_idle([])
    assert steps == [("commit", 4)]  # nothing acked yet
    publisher.release.set()
    await commit
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]
    assert not runtime._txn_lock.locked()


async def test_a_commit_cancelled_while_the_next_transaction_opens_waits_for_it_and_acks_what_it_committed() -> None:
    # A stop's abort must not reach librdkafka while begin_transaction still runs on the executor's thread.
    steps: list[Step] = []
    runtime, publisher = committed_and_beginning(steps)
    commit = asyncio.create_task(runtime._commit())
    assert await asyncio.to_thread(publisher.entered.wait, 2.0)
    commit.cancel()
    for _ in range(100):
        await asyncio.sleep(0)
    assert not commit.done()
    publisher.release.set()
    with pytest.raises(asyncio.CancelledError):
        await commit
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]


class FailingBeginPublisher(FakeTransactionalPublisher):
    def begin(self) -> None:
        raise KafkaException(KafkaError(KafkaError._STATE, "begin refused"))


async def test_a_begin_that_fails_after_the_commit_still_acks_what_the_commit_made_durable() -> None:
    steps: list[Step] = []
    runtime = with_three_records(steps, FailingBeginPublisher)
    with pytest.raises(KafkaException):
        await runtime._commit()
    assert steps == [("commit", 4), ("ack", "a", "s", 2)]


async def committed_in_chunks(cancel_after_calls: int | None, per_source: int = 0
                              ) -> tuple[list[Step], list[tuple[int, bool]]]:
    """A commit of source a's seqs 0-2 with one record confirmed per chunk; (the steps, per on_committed call the
    deliveries it got and whether it got the offsets). ``cancel_after_calls``: the commit task is cancelled once
    the core confirmed that many chunks. ``per_source``: records per chunk at least per source the core knows."""
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    three_records(runtime, now)
    calls: list[tuple[int, bool]] = []
    on_committed = runtime.core.on_committed

    def counted(deliveries: Any, offsets: Any, now_us: int) -> None:
        calls.append((len(deliveries), bool(offsets)))
        on_committed(deliveries, offsets, now_us)

    with (mock.patch.object(runtime.core, "on_committed", counted), mock.patch("gateway.shard.COMMIT_CONFIRM_CHUNK", 1),
          mock.patch("gateway.shard.COMMIT_CONFIRM_PER_SOURCE", per_source)):
        commit = asyncio.create_task(runtime._commit())
        for _ in range(10_000_000):  # loop turns (not a timed sleep, which would let the task run past the check)
            if commit.done() or (cancel_after_calls is not None and len(calls) == cancel_after_calls):
                break
            await asyncio.sleep(0)
        if cancel_after_calls is not None:
            assert not commit.done() and ("ack", "a", "s", 2) not in steps
            commit.cancel()
            with pytest.raises(asyncio.CancelledError):
                await commit
        else:
            await commit
    return steps, calls


async def test_a_commits_records_are_confirmed_a_chunk_per_loop_turn_and_acked_once_after_the_last() -> None:
    steps, calls = await committed_in_chunks(None)
    assert calls == [(1, False), (1, False), (1, True)]  # the progress offsets with the last chunk
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]


async def test_a_chunk_holds_at_least_its_share_per_source_the_shard_knows() -> None:
    # Each chunk repeats the per-source work: with sources a and b known, 2 records per source make chunks of 4.
    steps, calls = await committed_in_chunks(None, per_source=2)
    assert calls == [(3, True)]
    steps, calls = await committed_in_chunks(None, per_source=1)
    assert calls == [(2, False), (1, True)]
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]


async def test_a_commit_cancelled_between_its_chunks_confirms_the_rest_and_acks_them() -> None:
    steps, calls = await committed_in_chunks(1)
    assert calls == [(1, False), (2, True)]
    assert steps == [("commit", 4), ("begin",), ("ack", "a", "s", 2)]


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


class FirstRecordLostPublisher(FakeTransactionalPublisher):
    """Kafka's suspected loss on a partition created just now: the first record to ``lost_topic`` never takes an
    offset (the records after it take 0, 1, ...) while librdkafka reports the batch delivered."""

    def __init__(self, steps: list[Step], lost_topic: str) -> None:
        super().__init__(steps, None)
        self.lost_topic = lost_topic

    def batch_produce(self) -> Any:
        produce = super().batch_produce()

        def losing(topic: str, *args: Any) -> None:
            produce(topic, *args)
            if topic == self.lost_topic and self.lost_topic:
                self.lost_topic = ""
                self._next_offset[topic] -= 1
                self.offsets[-1] = -1
        return losing

    @staticmethod
    def await_leader(topic: str, partition: int, timeout_s: float) -> bool:
        return True


def _first_record_lost_runtime(steps: list[Step], now: list[int], topic: str) -> ShardRuntime:
    return transactional_runtime(steps, now, publisher_class=lambda *_args: FirstRecordLostPublisher(steps, topic))


async def test_a_new_partitions_first_record_lost_aborts_the_transaction_and_acks_nothing() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    topic = TopicNames().events("s")
    runtime = _first_record_lost_runtime(steps, now, topic)
    await runtime._await_new_partition(topic)  # as for a stream whose topic the gateway created just now
    three_records(runtime, now)
    with pytest.raises(ShardLost) as lost:
        await runtime._commit()
    assert str(lost.value) == (f"shard {SHARD}: transaction aborted: offset audit: {topic}: the last of 4 records "
                               "reported at offset 2, expected 3 (the first of them belongs at 0)")
    runtime._carry_out_now(runtime.core.due_acks())
    assert steps == [("abort",)]  # never committed, nothing acked
    assert runtime.core.counters.offset_audit_failures == 1


async def test_a_batch_waiting_while_the_audit_aborts_is_not_produced_and_is_no_second_failure() -> None:
    """The produce task waits for the commit's lock with a batch; the audit aborts the transaction: the batch fails
    with the give-up (not produced outside a transaction, where librdkafka says _STATE), and no task failure is
    counted beside the audit's."""
    steps: list[Step] = []
    now = [T0 + 100]
    topic = TopicNames().events("s")
    runtime = _first_record_lost_runtime(steps, now, topic)
    publisher = runtime._publisher
    assert isinstance(publisher, FakeTransactionalPublisher)
    await runtime._await_new_partition(topic)
    three_records(runtime, now)
    producing = asyncio.create_task(runtime._produce_forever())
    committing = asyncio.create_task(runtime._commit())
    await asyncio.sleep(0)  # the commit holds the lock
    events = tuple(IncomingEvent("s", seq, T0 + seq, 1) for seq in range(3, 5))
    writes = runtime._carry_out_now(runtime.core.events_received(ConnectionId(1), "a", events, now[0]))
    writes += runtime._carry_out_now(runtime.core.advance(now[0] + 2_000_000))
    assert writes
    done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    runtime._enqueue(writes, done)
    with pytest.raises(ShardLost, match="offset audit"):
        await committing
    with pytest.raises(ShardLost) as gone:
        await producing
    assert str(gone.value) == f"shard {SHARD}: its transaction was given up; not producing outside one"
    assert done.exception() is gone.value
    assert len(publisher.records) == 4  # the three events and the punctuation of the aborted transaction, no more
    assert steps == [("abort",)]
    assert runtime.core.counters.offset_audit_failures == 1
    assert runtime.core.counters.task_failures == 0


async def test_truthful_reports_over_two_transactions_commit_and_ack_both() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    publisher = runtime._publisher
    assert isinstance(publisher, FakeTransactionalPublisher)
    await runtime._await_new_partition(TopicNames().events("s"))
    three_records(runtime, now)
    await runtime._commit()
    events = tuple(IncomingEvent("s", seq, T0 + seq, 1) for seq in range(3, 5))
    produced(runtime, runtime.core.events_received(ConnectionId(1), "a", events, now[0]))
    now[0] += 2_000_000
    produced(runtime, runtime.core.advance(now[0]))
    await runtime._commit()
    assert [step for step in steps if step[0] in ("commit", "ack", "abort")] == [
        ("commit", 4), ("ack", "a", "s", 2), ("commit", 6), ("ack", "a", "s", 4)]
    assert publisher.offsets == [0, 1, 2, 3, 5, 6]  # the first commit's marker took offset 4
    assert runtime.core.counters.offset_audit_failures == 0


async def test_the_audits_reports_run_a_step_per_loop_turn_and_all_before_the_commit() -> None:
    # The transaction's reports (one per produce batch) are handed to their callbacks REPORT_STEP_CALLBACKS per loop
    # turn, not all in one step; the commit waits for the last of them (the offset audit's verdict needs them all).
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    on_report = runtime._on_report

    def reported(*args: Any) -> None:
        steps.append(("report",))
        on_report(*args)

    async def turns() -> None:
        while True:
            if steps[-1:] != [("turn",)]:
                steps.append(("turn",))
            await asyncio.sleep(0)

    with mock.patch.object(runtime, "_on_report", reported), mock.patch("gateway.shard.REPORT_STEP_CALLBACKS", 1):
        three_records(runtime, now)  # two produce batches (the events, the punctuation): one report each
        turner = asyncio.create_task(turns())
        await runtime._commit()
        turner.cancel()
    at = [index for index, step in enumerate(steps) if step[0] in ("report", "commit")]
    assert [steps[index] for index in at] == [("report",), ("report",), ("commit", 4)]
    assert ("turn",) in steps[at[0]:at[1]]  # the loop turned between the two reports
    assert ("ack", "a", "s", 2) in steps
    assert runtime.core.counters.offset_audit_failures == 0


def test_the_poll_task_hands_at_most_a_steps_worth_of_reports_to_their_callbacks_per_call() -> None:
    # With transactions the reports only feed the audit and the checkpoint offsets, both read at the commit (whose
    # audit runs what is left): the poll task runs REPORT_STEP_CALLBACKS of them per turn, the rest on the next.
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    publisher = runtime._publisher
    assert isinstance(publisher, FakeTransactionalPublisher)
    on_report = runtime._on_report

    def reported(*args: Any) -> None:
        steps.append(("report",))
        on_report(*args)

    with mock.patch.object(runtime, "_on_report", reported), mock.patch("gateway.shard.REPORT_STEP_CALLBACKS", 1):
        three_records(runtime, now)  # two produce batches: one report each
        publisher.flush(0)  # delivered: both reports wait for a poll
        runtime._serve_reports()
        assert (steps.count(("report",)), publisher.reports_waiting) == (1, 1)
        runtime._serve_reports()
        assert (steps.count(("report",)), publisher.reports_waiting) == (2, 0)


@pytest.mark.parametrize(("running_us", "stalled"), [(COMMIT_STALL_US - 1_000, False), (COMMIT_STALL_US + 1_000, True)])
async def test_a_commit_running_past_the_stall_bound_holds_the_merges_timeouts(running_us: int, stalled: bool) -> None:
    # Rule 5 of gateway.ingest from the shell: no produce was refused, but a commit this slow is Kafka holding the
    # shard's acks back, and the sources bound by their unacknowledged events fall silent for it.
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = transactional_runtime(steps, now)
    runtime._committing = True
    runtime._commit_started_us = now[0] - running_us
    poll = asyncio.create_task(runtime._poll_forever())
    await asyncio.sleep(0)
    await _cancel(poll)
    assert runtime.core.kafka_stalled(now[0]) is stalled
    assert runtime.core.counters.kafka_stalls == int(stalled)
