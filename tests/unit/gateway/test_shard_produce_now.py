"""A frame's Kafka writes go to librdkafka within the frame's own call when the producer task is idle
(``ShardRuntime._producer_idle``, ``_produce_now``): no task switch per frame. Held here: the records and their order
are the producer task's (behind a queued batch, a commit holding the lock, or an unsettled topic, a frame's writes
wait for the task as before); a full librdkafka queue leaves the rest to the task from where it stopped, each record
produced once and counted once by the offset audit; a produce error fails the shard through the producer task, not
the caller's connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
from confluent_kafka import KafkaError, KafkaException

from contract.topics import TopicNames
from contract.wire.messages import IncomingEvent
from gateway.ingest import ConnectionId, IngestAction
from gateway.shard import ShardRuntime
from tests.unit.gateway.test_acks_confirmed_run import T0
from tests.unit.gateway.test_shard_stop import FakeTransactionalPublisher, Step, transactional_runtime

pytestmark = pytest.mark.timeout(30)


def released(runtime: ShardRuntime, now: list[int], seqs: range) -> list[IngestAction]:
    """Source a's events ``seqs`` of stream s, and the merge's release of them (it stops waiting for source b)."""
    events = tuple(IncomingEvent("s", seq, T0 + seq, 1) for seq in seqs)
    actions = runtime.core.events_received(ConnectionId(1), "a", events, now[0])
    now[0] += 2_000_000
    return actions + runtime.core.advance(now[0])


def keys(runtime: ShardRuntime) -> list[tuple[str, bytes]]:
    publisher = runtime._publisher
    assert isinstance(publisher, FakeTransactionalPublisher)
    return [(topic, key) for topic, key, _callback in publisher.records]


async def started(steps: list[Step], now: list[int]) -> ShardRuntime:
    runtime = transactional_runtime(steps, now)
    runtime._producer_task = runtime._start_task(runtime._produce_forever(), f"kafka-produce-{runtime.shard}")
    runtime._unsettled_topics.clear()  # as once its first checkpoint was settled
    await asyncio.sleep(0)  # the task waits for a batch
    return runtime


async def settle() -> None:
    for _ in range(10):
        await asyncio.sleep(0)


def writes_of(runtime: ShardRuntime, actions: list[IngestAction]) -> list[tuple[str, bytes]]:
    """The (topic, key) of the Kafka writes among ``actions``, in order."""
    return [(a.topic, a.key) for a in actions if hasattr(a, "topic")]


async def test_with_the_producer_idle_a_frames_writes_are_produced_within_its_call() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    actions = released(runtime, now, range(3))
    assert runtime._carry_out_start(actions) is None
    assert keys(runtime) == writes_of(runtime, actions) and len(keys(runtime)) == 4  # 3 events and a punctuation
    assert runtime._unproduced_records == 0 and runtime._produce_queue.empty()
    assert runtime._produced_in_transaction == 4
    assert {topic: list(p.batches) for topic, p in runtime._audit._partitions.items()} == {
        TopicNames().events("s"): [4]}  # the batch counted once, its report asked for


async def test_behind_a_commit_or_a_queued_batch_writes_wait_for_the_task_in_their_order() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    first, second = released(runtime, now, range(3)), released(runtime, now, range(3, 5))
    async with runtime._txn_lock:  # a commit's round trip
        assert runtime._carry_out_start(first) is None
        assert runtime._carry_out_start(second) is None
        await settle()
        assert keys(runtime) == []  # queued behind the commit
    third = released(runtime, now, range(5, 6))
    assert runtime._carry_out_start(third) is None  # the task has not run yet: queued behind the two
    assert keys(runtime) == []
    await settle()
    assert keys(runtime) == writes_of(runtime, first) + writes_of(runtime, second) + writes_of(runtime, third)
    fourth = released(runtime, now, range(6, 7))
    assert runtime._carry_out_start(fourth) is None  # idle again: within the call
    assert keys(runtime)[-len(writes_of(runtime, fourth)):] == writes_of(runtime, fourth)
    assert runtime._unproduced_records == 0


async def test_a_write_to_an_unsettled_topic_leaves_the_frame_to_the_task_and_others_do_not() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    runtime._expect_first_writes("elsewhere")  # a topic these frames do not write (a stream's late topic, say)
    first = released(runtime, now, range(2))
    assert runtime._carry_out_start(first) is None
    assert keys(runtime) == writes_of(runtime, first)  # within the call
    runtime._expect_first_writes(TopicNames().events("s"))
    second = released(runtime, now, range(2, 4))
    assert runtime._carry_out_start(second) is None
    assert keys(runtime) == writes_of(runtime, first) and not runtime._produce_queue.empty()  # the task settles it


def failing_after(runtime: ShardRuntime, records: int, error: Callable[[], Exception]) -> list[int]:
    """The publisher's produce raises ``error()`` once it holds ``records`` records, until the test lifts it (the
    returned list: append anything)."""
    publisher = runtime._publisher
    assert isinstance(publisher, FakeTransactionalPublisher)
    produce = publisher.batch_produce()
    lifted: list[int] = []

    def limited(*args: Any) -> None:
        if not lifted and len(publisher.records) >= records:
            raise error()
        produce(*args)

    publisher.batch_produce = lambda: limited  # type: ignore[method-assign]
    return lifted


async def test_a_full_librdkafka_queue_leaves_the_rest_to_the_task_each_record_once() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    lifted = failing_after(runtime, 2, BufferError)
    actions = released(runtime, now, range(3))
    assert runtime._carry_out_start(actions) is None
    assert keys(runtime) == writes_of(runtime, actions)[:2]
    assert runtime._unproduced_records == 2 and not runtime._produce_queue.empty()
    lifted.append(1)
    await asyncio.sleep(0.05)  # the task retries after QUEUE_FULL_RETRY_S
    assert keys(runtime) == writes_of(runtime, actions)
    assert runtime._unproduced_records == 0 and runtime._produced_in_transaction == 4
    assert {topic: list(p.batches) for topic, p in runtime._audit._partitions.items()} == {
        TopicNames().events("s"): [4]}  # counted once, not again for the rest


async def test_a_produce_error_fails_the_shard_through_its_producer_task_not_the_caller() -> None:
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    failing_after(runtime, 1, lambda: KafkaException(KafkaError(KafkaError._FATAL)))
    actions = released(runtime, now, range(3))
    assert runtime._carry_out_start(actions) is None  # the caller goes on: its connection is not the failure
    assert keys(runtime) == writes_of(runtime, actions)[:1]
    await settle()
    task = runtime._producer_task
    assert task is not None and task.done() and isinstance(task.exception(), KafkaException)
    assert runtime.failure is not None and runtime.failure.startswith("kafka-produce-3: KafkaException")
    assert not runtime.serving


async def test_a_batch_the_task_took_while_a_commit_held_the_lock_goes_before_a_later_frame() -> None:
    """The window after a commit releases the lock: the task holds a batch it took and waits for the lock, which
    reads unlocked until the task runs; a frame read in that window must not go first."""
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    first, second = released(runtime, now, range(3)), released(runtime, now, range(3, 5))
    await runtime._txn_lock.acquire()  # a commit's round trip
    assert runtime._carry_out_start(first) is None
    await settle()  # the task took the batch and waits for the lock
    assert runtime._produce_queue.empty() and keys(runtime) == []
    runtime._txn_lock.release()
    assert not runtime._txn_lock.locked() and not runtime._producer_idle(list(second))
    assert runtime._carry_out_start(second) is None
    await settle()
    assert keys(runtime) == writes_of(runtime, first) + writes_of(runtime, second)
    assert runtime._unproduced_records == 0


@pytest.mark.parametrize("step_records", [1, 5, 1_000])
async def test_a_backlog_goes_a_few_records_per_loop_turn_in_order(step_records: int) -> None:
    # The frames read while a commit held the lock queue a batch each; produced in one step the backlog kept the
    # sockets unread for milliseconds. A callback scheduled once the lock is let go runs after the batches that
    # reached ``PRODUCE_STEP_RECORDS`` records (the batches here: 2 events, with a punctuation after the 1st and 3rd).
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    batches = [released(runtime, now, range(first, first + 2)) for first in (0, 2, 4)]
    sizes = [len(writes_of(runtime, batch)) for batch in batches]
    assert sizes == [3, 2, 3]
    seen: list[int] = []
    with mock.patch("gateway.shard.PRODUCE_STEP_RECORDS", step_records):
        async with runtime._txn_lock:
            for batch in batches:
                assert runtime._carry_out_start(batch) is None
            await settle()
            assert keys(runtime) == []
        asyncio.get_running_loop().call_soon(lambda: seen.append(len(keys(runtime))))
        await settle()
    assert seen == [{1: 3, 5: 5, 1_000: 8}[step_records]]
    assert keys(runtime) == [key for batch in batches for key in writes_of(runtime, batch)]
    assert runtime._unproduced_records == 0


async def test_a_commit_waits_for_the_rest_of_a_batch_a_full_queue_cut_and_commits_all_of_it() -> None:
    """A frame's batch begun within its call and cut by librdkafka's full queue is counted by the offset audit whole:
    its rest, queued for the task, belongs to the open transaction. A commit that took the lock first audited a
    transaction whose last records were not produced yet, retried without letting the task run, and gave the shard
    up (a CI run: Kafka stopped 5 s with a 500-record queue, "commit kept failing: no delivery report yet")."""
    steps: list[Step] = []
    now = [T0 + 100]
    runtime = await started(steps, now)
    lifted = failing_after(runtime, 2, BufferError)
    actions = released(runtime, now, range(3))
    # The commit task woke in the same loop turn as the frame's read, before it: it runs before the producer task.
    commit = asyncio.create_task(runtime._commit())
    assert runtime._carry_out_start(actions) is None
    assert keys(runtime) == writes_of(runtime, actions)[:2]
    await settle()
    assert not commit.done() and steps == []  # it waits for the batch it would otherwise audit half-produced
    lifted.append(1)  # Kafka takes records again
    await asyncio.wait_for(commit, 5)
    assert runtime.failure is None
    assert steps[:2] == [("commit", 4), ("begin",)]  # all four records in the transaction that committed
    assert ("ack", "a", "s", 2) in steps
    assert runtime._unproduced_records == 0 and runtime._produced_in_transaction == 0
