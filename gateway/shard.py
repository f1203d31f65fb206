"""One shard of the gateway cluster: its IngestCore, its Kafka producer and the tasks that carry the core's actions
out. A deployment has S shards (contract.sharding.shard_of maps a source to one); the shard's owner writes
partition k of every events, late and sources topic, with its own merge, punctuations, progress checkpoints and
clock state, so everything a single gateway guarantees holds within a shard.

Fencing (the Kafka Streams exactly-once model): every Kafka write of shard k goes through a transactional producer
whose transactional.id is ``<prefix>.shard-<k>``. A new owner's ``init`` bumps the id's epoch: the previous owner
(dead, paused past its session timeout, partitioned away) can no longer commit, and whatever it had not committed is
aborted, invisible to every read_committed reader (recovery scans, Spark jobs, our tools). Sources are acknowledged
only for what a commit made visible: delivery reports are held until the transaction that carried them commits.

A failed commit cannot be undone in the core (its merge already released those records; its tracker already
accepted those seqs): the runtime gives the shard up instead (``ShardHost.shard_failed``). The gateway closes the
shard's connections with ``shard_moved`` and, if it still owns the shard, starts a new runtime that recovers from
what Kafka committed; the sources resend what was not acknowledged and the new core drops what Kafka already has.

Tasks, each with a done-callback that reports a failure to the host (which gives the shard up):
  kafka-poll-<k>          serves delivery reports, then the core's poll (acks, buffer check, checkpoints)
  kafka-produce-<k>       hands Produce actions to librdkafka in the order the core gave them (inside a transaction)
  kafka-commit-<k>        commits the open transaction every commit interval, then releases the acks it earned
  pipeline-deadlines-<k>  fires reorder gap timeouts and merge waits when the core says they are due
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from broker.client import KafkaClientConfig, librdkafka_logger
from broker.producer import DeliveryCallback, KafkaPublisher, ProduceCall
from broker.transactions import ProducerFenced, TransactionAbortable, TransactionalPublisher, TransactionRetriable
from contract.records import CONTRACT_VERSION, HEADER_CONTRACT_VERSION, HEADER_KIND, OWNER
from contract.topics import TopicNames
from contract.wire import messages
from gateway.histograms import Histogram
from gateway.ingest import (
    ConnectionId,
    DeliveryRef,
    IngestAction,
    IngestConfig,
    IngestCore,
    PauseReading,
    Produce,
    ResumeReading,
    SendFrame,
    SendToSource,
    StreamProgress,
    WriteCheckpoint,
)
from gateway.offset_audit import OffsetAudit
from gateway.recovery import ShardState, StreamScan, recover_shard, recover_stream, recover_stream_from
from gateway.tasks import SupervisedTasks
from timesync.clocks import ClockUs, ReferenceMapping
from timesync.store import SourceInfo, SourceInfoStore

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.002
# librdkafka's queue is full: retry this often (each refusal also extends the core's stall grace).
QUEUE_FULL_RETRY_S = 0.005
# One init/commit/abort call: the transaction coordinator answers in milliseconds; a call this long means the
# cluster is unreachable, and the shard is given up (its sources fail over or wait for it to come back).
TRANSACTION_CALL_TIMEOUT_S = 30.0
# Records released by the core and not yet with librdkafka: up to this many, a connection goes on reading; past it,
# it waits for the producer (Kafka's back-pressure reaches the sources as TCP back-pressure). A commit holds the
# producer for ~10-50 ms: at a shard's ~25k events/s that is ~1,200 records.
MAX_UNPRODUCED_RECORDS = 4_096
# The producer task lets the event loop turn (the sockets be read) after this many records of a backlog. At 20 x 500
# events/s a step of the task took up to 3.5 ms with 256, 1.8 ms with 128, 1.05 ms with 64 (8 s each, the same task
# CPU in all three); with 16, p99 0.35 ms (benchmarks/gateway_loop_timeline.py). The backlog is the frames read while
# a commit held the producer: produced after it, with the commit's own steps, it kept the loop busy for 10-23 ms.
PRODUCE_STEP_RECORDS = 16
# With transactions, delivery reports are handed to their callbacks at most this many per loop turn (~0.1 ms), by the
# poll task and by the audit before a commit.
REPORT_STEP_CALLBACKS = 64
# A connection waiting for the producer tells the core this often (well within its 2 s Kafka-stall grace).
KAFKA_WAIT_SIGNAL_S = 0.5
# A commit still running after this long counts as a Kafka stall (gateway.ingest rule 5).
COMMIT_STALL_US = 250_000
# A Kafka outage shorter than this leaves a shard's open transaction alive (librdkafka's and Kafka Streams' default
# is shorter): the commit goes through once Kafka is back and no source is cut off. The price: a gateway that dies
# with nobody taking its shard over holds committed readers of its partitions back this long.
TRANSACTION_TIMEOUT_MS = 60_000
# A takeover reads at most this many streams beside the fencing, each holding its consumer (a librdkafka client)
# until the fencing returns; the others are read after it, as many at a time as the executor has threads.
EARLY_SCANNED_STREAMS_MAX = 16
# The ingest actions _carry_out_now sorts: Kafka writes, queued for the producer; the rest, carried out at once.
_KAFKA_WRITES: tuple[type, ...] = (Produce, WriteCheckpoint)
_OTHER_ACTIONS: tuple[type, ...] = (SendToSource, SendFrame, PauseReading, ResumeReading)
OWNER_HEADERS = ((HEADER_KIND, OWNER.encode()), (HEADER_CONTRACT_VERSION, str(CONTRACT_VERSION).encode()))
# A retriable commit error (coordinator moving, a timeout) is retried this many times before the shard is given up.
COMMIT_ATTEMPTS = 5
# A committed transaction's records are confirmed at least this many per loop turn, and at least this many per source
# of the shard (``_commit``).
COMMIT_CONFIRM_CHUNK = 512
COMMIT_CONFIRM_PER_SOURCE = 32
# How long a new stream's first records wait for its partition's leader to show in the producer's metadata.
NEW_PARTITION_LEADER_WAIT_S = 5.0


# What librdkafka says when a newer owner fenced this producer, or when a gateway that lost its shard aborts its open
# transaction with records in flight: it logs them as ERROR and CRITICAL (it cannot know that this is how a gateway
# cluster hands a shard over); here they are INFO, like the shard's own line about it.
_FENCING_MARKERS = ("fenced by a newer instance", "attempted an operation with an old epoch", "_PURGE_INFLIGHT")


class _FencingIsInfo(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno > logging.INFO:
            message = record.getMessage()
            if any(marker in message for marker in _FENCING_MARKERS):
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


_FENCING_FILTER = _FencingIsInfo()


class ShardLost(Exception):
    """The shard cannot go on: fenced by a newer owner, or a transaction failed. Carries the reason for logs."""


class ShardFenced(ShardLost):
    """A newer owner took the shard's transactional id over: the normal end of a gateway that lost its shard while
    paused or cut off (docs/cluster.md, "Fencing"). Logged at INFO and counted as ``shards_fenced``, not as a
    failure: nothing it wrote since is visible, and its sources resend to the new owner."""


class ShardHost(Protocol):
    """What a shard asks of the gateway that runs it (the gateway owns the connections)."""

    def send_to_source(self, source_id: str, data: bytes) -> None: ...

    def send_frame(self, connection: ConnectionId, data: bytes) -> None: ...

    def set_throttled(self, source_id: str, throttled: bool) -> None: ...

    def shard_failed(self, shard: int, reason: str) -> None:
        """The runtime stopped working (fenced, a failed transaction, a dead task): give the shard up."""


@dataclass
class ShardSettings:
    shard: int
    topics: TopicNames
    kafka_client: KafkaClientConfig
    producer_config: dict[str, Any]
    ingest: IngestConfig
    transactional: bool = True
    commit_interval_s: float = 0.1
    # The transactional produce loop's plain records: None produces each in the Python loop (_produce_from); a
    # factory of a ProduceLoopCore (gateway.native: the Rust one) produces runs of them in one call, the same calls.
    produce_loop: Callable[[], ProduceLoopCore] | None = None
    # With produce_loop: the client's librdkafka handle for it (gateway.native.native_direct_producer), or None
    # when it cannot be had (then each record goes through the client's produce).
    direct_produce: Callable[[Producer], object | None] | None = None
    # Transactions: where each commit's duration goes (the gateway's, shared by its shards' runtimes so that a
    # restarted runtime does not reset what /metrics exposes), or None.
    commit_durations: Histogram | None = None


class ProduceLoopCore(Protocol):
    """``_produce_from``'s loop over a transactional shard's plain records (no mark, headers None or a tuple),
    calling ``produce`` as it does: ``(the first index not produced, whether its produce raised BufferError)``."""

    def run(self, produce: ProduceCall, actions: list[Produce | WriteCheckpoint], start: int, shard: int,
            marks: dict[int, DeliveryCallback], uncommitted: list[DeliveryRef],
            direct: object | None = None) -> tuple[int, bool]:
        """``direct``: the same client's librdkafka handle (``ShardSettings.direct_produce``), which takes a plain
        record without the ``produce`` call, with the same arguments and errors."""
        ...

    def wanted_reports(self, actions: list[Produce | WriteCheckpoint]
                       ) -> tuple[dict[int, tuple[str | None, str | None]], dict[str, int]] | None:
        """``ShardRuntime._wanted_reports``' pass, or None where it does not take the actions (the Python pass runs)."""
        ...

    def split_writes(self, actions: list[Any], writes: tuple[type, ...], others: tuple[type, ...]
                     ) -> tuple[list[Any], list[Any]] | None:
        """``_carry_out_now``'s sorting: (the actions of exactly the ``writes`` classes, the others), in order; None
        when an action is of neither (the Python loop sorts them)."""
        ...

    def first_write_end(self, actions: list[Produce | WriteCheckpoint], start: int, topics: set[str]) -> int:
        """``_first_write_end``'s scan: one past the first of ``actions[start:]`` bound for one of ``topics``."""
        ...


@dataclass
class _Takeover:
    """When (loop time) a takeover's scans beside the fencing were done, for its log line."""

    sources_scanned_s: float
    events_scanned_s: float = 0.0


@dataclass
class _ProduceBatch:
    """Produce actions of one core call, in order; `done` resolves once all of them are with librdkafka. A batch
    begun in the caller's call (``_produce_now``) comes with where librdkafka's full queue stopped it and its
    delivery-report marks, or with the error its produce raised, which the producer task raises as its own."""

    actions: list[Produce | WriteCheckpoint]
    done: asyncio.Future[None] | None
    start: int = 0
    marks: dict[int, DeliveryCallback] | None = None
    error: Exception | None = None


def next_commit_delay_s(interval_s: float, started_s: float, now_s: float) -> float:
    """How long the commit task sleeps after a round that started at ``started_s``: what is left of the interval."""
    return max(0.0, interval_s - (now_s - started_s))


class ShardRuntime:
    def __init__(self, settings: ShardSettings, mapping: ReferenceMapping, store: SourceInfoStore,
                 host: ShardHost, clock_us: ClockUs, owner_record: tuple[str, bytes, bytes] | None = None) -> None:
        self.shard = settings.shard
        self.settings = settings
        self.topics = settings.topics
        self.core = IngestCore(settings.topics, mapping, settings.ingest)
        self.store = store
        self._host = host
        self._clock_us = clock_us
        self._monotonic_s: Callable[[], float] = time.monotonic  # paces the commits (not the event clock)
        self._owner_record = owner_record
        self._transactional = settings.transactional
        self._produce_loop = None if settings.produce_loop is None else settings.produce_loop()
        # Holds the client (dropped at close, so that the client goes when the publisher lets it go).
        self._direct: object | None = None
        client = settings.kafka_client
        self._publisher: TransactionalPublisher | KafkaPublisher
        if self._transactional:
            librdkafka_logger().addFilter(_FENCING_FILTER)  # once: a logger keeps one of each filter
            self._publisher = TransactionalPublisher(
                client, f"{settings.topics.prefix}.shard-{settings.shard}",
                {"transaction.timeout.ms": TRANSACTION_TIMEOUT_MS, **settings.producer_config})
            if self._produce_loop is not None and settings.direct_produce is not None:
                self._direct = settings.direct_produce(self._publisher.client())
        else:
            self._publisher = KafkaPublisher(client, settings.producer_config)
        self.ready = asyncio.Event()
        self.serving = self.closed = False
        self._stream_lock = asyncio.Lock()
        self._txn_lock = asyncio.Lock()
        # Transactional batches begun within a caller's call (_produce_now) and cut by librdkafka's full queue: the
        # offset audit counted each whole, so its rest, queued for the producer task, belongs to the open
        # transaction, and no commit may take the lock before the task produced it (_whole_transaction).
        self._cut_batches = 0
        self._cut_batches_produced = asyncio.Event()
        self._cut_batches_produced.set()
        self._committing = False
        self._commit_started_us = 0
        self._in_transaction = False
        self._produced_in_transaction = 0
        # The event records of the open transaction, confirmed to the core once it commits (a commit succeeds only
        # when every record of its transaction was delivered), and per stream the highest events-topic offset
        # they got. Only the last event record of each produce batch (per stream) asks for a delivery report, for
        # that offset: one Python callback per batch, not per record.
        self._uncommitted: list[DeliveryRef] = []
        self._uncommitted_offsets: dict[str, int] = {}
        # Transactions: the offsets those reports must carry; a transaction whose reports break the count is
        # aborted, not committed (gateway.offset_audit).
        self._audit = OffsetAudit()
        # Topics this runtime has not written yet (see _settle); its streams' topics join as it learns them.
        self._unsettled_topics = {settings.topics.sources, *([owner_record[0]] if owner_record is not None else [])}
        # Without transactions every event record asks for its delivery report, which only queues it here; after
        # each poll the queued reports go to the core together (_deliveries_reported): one Python call per record
        # less, and the core confirms a run of records in one step.
        self._delivery_reports: list[tuple[DeliveryRef, KafkaError | None, Message]] = []
        reports = self._delivery_reports

        def reported(delivery: DeliveryRef, error: KafkaError | None, message: Message) -> None:
            reports.append((delivery, error, message))
        self._reported = reported
        self._armed_deadline_us: int | None = None  # what _fire_deadlines sleeps until (None: until woken)
        self._deadline_wake: asyncio.Future[None] | None = None
        self._produce_queue: asyncio.Queue[_ProduceBatch] = asyncio.Queue()
        self._unproduced_records = 0
        self._batch_taken = False  # see _produce_forever
        self._tasks = SupervisedTasks(self._task_failed)
        self._producer_task: asyncio.Task[None] | None = None
        self.failure: str | None = None
        # Whether the runtime ended because a newer owner fenced it (the host counts it, not as a failure).
        self.fenced = False
        self.started_us = clock_us()

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Fence the previous owner, recover the shard's clock state and streams, then serve."""
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        # The recovery scans run while the fencing runs (issue 24 item 10: the takeover is on the failover's path,
        # and the fencing alone takes 0.5-1 s when the previous owner died inside a transaction: librdkafka asks
        # the coordinator again only every 500 ms while it aborts that transaction). See _recover for what that
        # changes for what the scans can see.
        fencing = asyncio.ensure_future(self._fence())
        recovery = asyncio.ensure_future(self._recover(fencing))
        try:
            await asyncio.wait([fencing, recovery])
        except BaseException:
            fencing.cancel()
            recovery.cancel()
            raise
        if fencing.cancelled() or fencing.exception() is not None:
            if not recovery.cancelled():
                recovery.exception()  # the recovery stopped for the fencing's failure, which is the one raised
            if fencing.cancelled():
                raise asyncio.CancelledError
            error = fencing.exception()
            assert error is not None
            if isinstance(error, ProducerFenced):
                raise ShardFenced(f"shard {self.shard}: fenced while taking it over: {error}") from error
            raise error
        fenced_s = fencing.result()
        state, progresses, timing = recovery.result()
        if isinstance(self._publisher, TransactionalPublisher):
            self._publisher.begin()
            self._in_transaction = True
        for source_id, (estimate, last_sync_us) in state.clocks.items():
            self.store.update(source_id, estimate, last_sync_us)
        if state.clocks:
            log.info("shard %d: recovered the clock state of %d sources", self.shard, len(state.clocks))
        self.core.taken_over(self._clock_us())  # ingest rule 15: sources no checkpoint names may come back too
        recovered_actions: list[IngestAction] = []
        for progress in progresses:
            self._expect_first_writes(self.topics.events(progress.stream), self.topics.late(progress.stream))
            recovered_actions += self.core.stream_recovered(progress, self._clock_us())
        if progresses:
            log.info("shard %d: recovered %d streams (%d sources) in %.2f s", self.shard, len(progresses),
                     sum(len(p.next_seq) for p in progresses), loop.time() - started_s)
        now_s = loop.time()
        log.info("shard %d: takeover %.2f s: fencing %.2f s; beside it the sources scan %.2f s and the events scans "
                 "to the open transaction %.2f s; then on to the end %.2f s", self.shard, now_s - started_s,
                 fenced_s - started_s, timing.sources_scanned_s - started_s,
                 timing.events_scanned_s - timing.sources_scanned_s, now_s - max(fenced_s, timing.events_scanned_s))
        self._producer_task = self._start_task(self._produce_forever(), f"kafka-produce-{self.shard}")
        self._start_task(self._poll_forever(), f"kafka-poll-{self.shard}")
        self._start_task(self._fire_deadlines(), f"pipeline-deadlines-{self.shard}")
        if self._transactional:
            self._start_task(self._commit_forever(), f"kafka-commit-{self.shard}")
        if self._owner_record is not None:
            topic, key, value = self._owner_record
            self._enqueue([WriteCheckpoint(topic, key, value, OWNER_HEADERS)])
        self._carry_out_now(recovered_actions, queue_writes=True)
        self._deadline_may_be_earlier()
        self.serving = True
        self.ready.set()

    async def _fence(self) -> float:
        """Register the shard's transactional id (fences the previous owner and decides its open transaction);
        returns when it did (loop time). Without transactions there is nothing to fence."""
        loop = asyncio.get_running_loop()
        if isinstance(self._publisher, TransactionalPublisher):
            await loop.run_in_executor(None, partial(self._publisher.init, TRANSACTION_CALL_TIMEOUT_S,
                                                     connect_topic=self.topics.sources))
        return loop.time()

    async def _recover(self, fencing: asyncio.Future[float]) -> tuple[ShardState, list[StreamProgress], _Takeover]:
        """The shard's clock state and checkpoints (one scan of its sources partition), then every stream that has a
        checkpoint, in parallel: after a failover the first source back would otherwise wait for its stream's
        scans, one stream at a time. Streams without a checkpoint yet are recovered at their first hello.

        Before the fencing returns, read_committed stops short of the previous owner's open transaction, which a
        paused owner may still commit: a checkpoint missed in it only makes the events scans start from an older
        one, and a clock state missed is an older estimate; the events scans read on to the end the fencing left
        (``StreamScan``), so an event committed that way is never missed (a resend of it would be a duplicate)."""
        loop = asyncio.get_running_loop()
        client = self.settings.kafka_client
        state = await loop.run_in_executor(None, partial(
            recover_shard, client, self.topics.sources, partition=self.shard))
        timing = _Takeover(sources_scanned_s=loop.time())
        streams = sorted(state.checkpoints)
        early = set(streams[:EARLY_SCANNED_STREAMS_MAX])

        async def recover(stream: str) -> StreamProgress:
            checkpoint = state.checkpoints[stream]
            if stream not in early:
                await asyncio.wait([fencing])
                if fencing.cancelled() or fencing.exception() is not None:
                    return StreamProgress(stream)  # not used: the takeover fails with the fencing's error
                return await loop.run_in_executor(None, partial(
                    recover_stream_from, client, self.topics.events(stream), stream, checkpoint,
                    partition=self.shard))
            scan = await loop.run_in_executor(None, partial(
                StreamScan, client, self.topics.events(stream), stream, checkpoint, partition=self.shard))
            try:
                await loop.run_in_executor(None, scan.read_to_end)
                timing.events_scanned_s = max(timing.events_scanned_s, loop.time())
                await asyncio.wait([fencing])
                if fencing.cancelled() or fencing.exception() is not None:
                    return scan.progress  # not used: the takeover fails with the fencing's error
                return await loop.run_in_executor(None, scan.read_to_end)
            finally:
                # Not waited for (tens of ms on a busy machine, on the failover's path); a failure is only logged.
                loop.run_in_executor(None, scan.close).add_done_callback(_log_close_failure)

        progresses = list(await asyncio.gather(*(recover(stream) for stream in streams)))
        timing.events_scanned_s = max(timing.events_scanned_s, timing.sources_scanned_s)
        return state, progresses, timing

    async def stop(self, flush_timeout_s: float, graceful: bool = True) -> int:
        """Stop serving. Graceful: publish and commit what the core already released (its acks are sent before the
        gateway closes the connections), within ``flush_timeout_s``. Returns the records left unconfirmed."""
        self.serving = False
        self.ready.set()
        remaining = 0
        if graceful and self.failure is None:
            for task in self._tasks:
                if task is not self._producer_task and not task.get_name().startswith("kafka-commit"):
                    await _cancel(task)
            try:
                self._enqueue(self.core.checkpoint_dirty_streams(self._clock_us()))
                remaining = await self._drain(asyncio.get_running_loop().time() + flush_timeout_s)
            except Exception:
                log.exception("shard %d: could not flush at stop", self.shard)
        for task in self._tasks:
            await _cancel(task)
        if self._in_transaction and isinstance(self._publisher, TransactionalPublisher):
            with contextlib.suppress(Exception):
                await asyncio.get_running_loop().run_in_executor(None, self._publisher.abort, 5.0)
        self._direct = None
        self._publisher.close()
        if self._delivery_reports:  # the purged records' reports, which the close served
            self._deliveries_reported()
        self.closed = True
        return remaining

    async def _drain(self, deadline: float) -> int:
        """Until the producer is idle and (transactional) a commit covered everything, or the deadline."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            if not self._committing:
                self._serve_reports()
            self._carry_out_now(self.core.due_acks())
            producer_dead = self._producer_task is None or self._producer_task.done()
            if self._unproduced_records == 0 or producer_dead:
                if self._transactional:
                    if self._produced_in_transaction:
                        await self._commit()
                    self._carry_out_now(self.core.due_acks())
                    return self._unproduced_records
                if self._publisher.pending() == 0:
                    break
            await asyncio.sleep(POLL_INTERVAL_S)
        return self._publisher.pending() + self._unproduced_records

    # -- tasks --------------------------------------------------------------------------------------------------

    def _start_task(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._tasks.start(coroutine, name)

    def _task_failed(self, task: asyncio.Task[None], error: BaseException) -> None:
        if isinstance(error, ShardFenced | ProducerFenced) or self._fenced_after_all(error):
            # librdkafka reports fencing from whichever call comes first (a produce, a poll, the commit).
            self.fenced = True
            log.info("shard %d: fenced by a newer owner (%s: %s); giving it up", self.shard, task.get_name(), error)
        elif isinstance(error, ShardLost):
            log.warning("%s", error)
        else:
            log.error("shard %d: task %s died: %r", self.shard, task.get_name(), error, exc_info=error)
            self.core.task_failed()
        if task is self._producer_task:
            while not self._produce_queue.empty():
                _fail_batch(self._produce_queue.get_nowait(), error)
        self.fail(f"{task.get_name()}: {error!r}")

    def _fenced_after_all(self, error: BaseException) -> bool:
        """A produce can fail with librdkafka's generic fatal error before the error callback naming the cause
        (fencing) was served: serve it, then ask."""
        publisher = self._publisher
        if not isinstance(publisher, TransactionalPublisher) or not isinstance(error, KafkaException):
            return False
        with contextlib.suppress(Exception):  # a fatal producer raises from poll too, once it has said why
            publisher.poll(0)
        return publisher.fenced

    def fail(self, reason: str) -> None:
        if self.failure is not None:
            return
        self.failure = reason
        self.serving = False
        self._host.shard_failed(self.shard, reason)

    async def _poll_forever(self) -> None:
        while True:
            if not self._committing:
                self._serve_reports()
            elif self._clock_us() - self._commit_started_us > COMMIT_STALL_US:
                # A commit this slow is Kafka holding the shard back (rule 5): the sources the merge waits for are
                # silent because the producer cannot take their records, not because they are gone.
                self.core.kafka_queue_full(self._clock_us())
            self._carry_out_now(self.core.poll(self._clock_us()), queue_writes=True)
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _produce_forever(self) -> None:
        try:
            await self._produce_batches()
        finally:
            # The task is gone (failed or stopped): no commit waits for it any longer; one that runs audits the cut
            # batch's rest as missing and gives the transaction up, as it must.
            self._cut_batches = 0
            self._cut_batches_produced.set()

    async def _produce_batches(self) -> None:
        produced_in_step = 0  # records handed to librdkafka since the task last let the loop turn
        while True:
            batch = await self._produce_queue.get()
            if batch.error is not None:  # _produce_now's produce raised it: the task fails as if it were its own
                raise batch.error
            # Taken from the queue, not produced yet (it may wait for the lock a commit just released, which reads
            # unlocked until this task runs): _producer_idle must not let a later frame's records go first.
            self._batch_taken = True
            try:
                async with self._txn_lock:
                    self._require_open_transaction()
                    await self._produce_batch(batch.actions, batch.start, batch.marks)
            except BaseException as exc:
                _fail_batch(batch, exc)
                raise
            finally:
                self._batch_taken = False
                if batch.marks is not None and self._transactional:
                    self._cut_batches -= 1
                    if not self._cut_batches:
                        self._cut_batches_produced.set()
            if batch.done is not None and not batch.done.done():
                batch.done.set_result(None)
            produced_in_step += len(batch.actions) - batch.start
            if self._produce_queue.empty():
                produced_in_step = 0  # the next get() waits: the loop turns
            elif produced_in_step >= PRODUCE_STEP_RECORDS:
                # A backlog (the frames read while a commit held the lock, a batch each) is produced some tens of
                # records per loop turn: in one step it kept the sockets unread for up to 15 ms after a commit, and
                # a turn per batch would cost a loop turn per frame at saturation, where frames come in thousands.
                produced_in_step = 0
                await asyncio.sleep(0)

    async def _produce_batch(self, actions: list[Produce | WriteCheckpoint], index: int = 0,
                             marks: dict[int, DeliveryCallback] | None = None) -> None:
        """Hand a batch to librdkafka in order from ``index``, waiting while its queue is full; the first record of a
        topic this runtime has not written yet goes alone (``_first_write_end``, ``_settle``). ``marks``: the
        batch's delivery-report marks when ``_produce_now`` began it (they were counted then)."""
        if marks is None:
            marks = self._report_marks(actions) if self._transactional else {}
        while index < len(actions):
            end = self._first_write_end(actions, index) if self._unsettled_topics else len(actions)
            index = self._produce_from(actions if end == len(actions) else actions[:end], index, marks)
            if index == end:
                if actions[end - 1].topic in self._unsettled_topics:
                    await self._settle(actions[end - 1].topic)
                continue
            # librdkafka's queue is full.
            if isinstance(actions[index], WriteCheckpoint) and not self._transactional:
                index += 1  # best effort: the next checkpoint, or the recovery scan, covers it
                self._unproduced_records -= 1
                continue
            self.core.kafka_queue_full(self._clock_us())
            await asyncio.sleep(QUEUE_FULL_RETRY_S)

    def _first_write_end(self, actions: list[Produce | WriteCheckpoint], start: int) -> int:
        """One past the first of ``actions[start:]`` bound for a topic this runtime has not written yet, else
        ``len(actions)``."""
        unsettled = self._unsettled_topics
        if self._produce_loop is not None:
            return self._produce_loop.first_write_end(actions, start, unsettled)
        for index in range(start, len(actions)):
            if actions[index].topic in unsettled:
                return index + 1
        return len(actions)

    async def _settle(self, topic: str) -> None:
        """Wait until the producer has nothing in flight, so that this runtime's first record to ``topic`` was
        Kafka's answer alone before any other goes there.

        Why: the broker keeps no state yet for this producer on that partition, so it takes a batch with any
        sequence number. If the first batch is refused (a partition created a moment ago answers NOT_LEADER until
        its log is ready) while the next one, already in flight, is appended, librdkafka counts the first as
        delivered because a later batch succeeded ("implicitly acked", with no offset): records acknowledged and
        never written. Seen in the throughput benchmark with librdkafka's debug log; docs/cluster.md, "The offset
        audit". Once one record is on the partition the broker checks every later sequence, so this is paid once
        per topic and runtime (one round trip)."""
        while self._publisher.pending() > 0:
            # Sent now, not after linger.ms (100 ms with transactions): a runtime settles each of its topics in turn,
            # and its first frames wait for them.
            self._publisher.send_now()
            # Served here too: at a stop the poll task is gone, and the drain's commit waits for this task's lock.
            self._serve_reports()
            await asyncio.sleep(POLL_INTERVAL_S)
        self._unsettled_topics.discard(topic)

    def _expect_first_writes(self, *topics: str) -> None:
        """Topics this runtime will write for the first time: their first record is settled alone."""
        self._unsettled_topics.update(topics)

    def _require_open_transaction(self) -> None:
        """Transactions: raises if the commit gave the open transaction up (aborted, or fenced) while a batch waited
        for the lock. The shard is being given up (the commit task says why, once): the batch fails with it instead
        of producing outside a transaction, which librdkafka refuses with _STATE and which would read as a second,
        unrelated failure."""
        if not self._transactional or self._in_transaction:
            return
        publisher = self._publisher
        if isinstance(publisher, TransactionalPublisher) and publisher.fenced:
            raise ShardFenced(f"shard {self.shard}: fenced by a newer owner")
        raise ShardLost(f"shard {self.shard}: its transaction was given up; not producing outside one")

    def _report_marks(self, actions: list[Produce | WriteCheckpoint]) -> dict[int, DeliveryCallback]:
        """Transactions: the records of a batch whose delivery reports the shard asks for, with their callbacks: per
        topic the last record (the offset audit counts the batch's records there), and per stream the last event
        record of its events topic (its offset is what the progress checkpoint needs: the records before it in the
        partition got lower ones). One report per topic per batch, not per record."""
        wanted, records = self._wanted_reports(actions)
        for topic, count in records.items():
            self._audit.produced(topic, count)
        report_to = self._publisher.report_to
        return {index: report_to(partial(self._on_report, topic, stream)) for index, (topic, stream) in wanted.items()}

    def _wanted_reports(self, actions: list[Produce | WriteCheckpoint]
                        ) -> tuple[dict[int, tuple[str | None, str | None]], dict[str, int]]:
        """``_report_marks``' pass over the batch, from its end: ``{index: (topic if the topic's last record, stream
        if the stream's last events record)}`` and the records per topic; by the native pass when it takes them."""
        if self._produce_loop is not None:
            found = self._produce_loop.wanted_reports(actions)
            if found is not None:
                return found
        wanted: dict[int, tuple[str | None, str | None]] = {}
        records: dict[str, int] = {}
        streams: set[str] = set()
        for index in range(len(actions) - 1, -1, -1):
            action = actions[index]
            if type(action) is not Produce:
                continue
            seen = records.get(action.topic)
            records[action.topic] = 1 if seen is None else seen + 1
            topic = action.topic if seen is None else None
            stream = None
            delivery = action.delivery
            if delivery is not None and delivery.topic == "events" and delivery.stream not in streams:
                stream = delivery.stream
                streams.add(stream)
            if topic is not None or stream is not None:
                wanted[index] = (topic, stream)
        return wanted, records

    def _produce_from(self, actions: list[Produce | WriteCheckpoint], start: int,
                      marks: dict[int, DeliveryCallback]) -> int:
        """Hand ``actions[start:]`` to librdkafka, in order; returns the index of the first one its full queue
        refused, or ``len(actions)``."""
        publisher = self._publisher
        shard = self.shard
        transactional = self._transactional
        uncommitted = self._uncommitted
        reported = self._reported
        index = start
        # The publisher's checks once per batch, the client's produce per record (see batch_produce): nothing in
        # this loop polls, commits or closes.
        produce = publisher.batch_produce()
        produce_loop = self._produce_loop if transactional else None
        try:
            while index < len(actions):
                if produce_loop is not None:
                    index, queue_full = produce_loop.run(produce, actions, index, shard, marks, uncommitted,
                                                         self._direct)
                    if queue_full:  # the produce of actions[index] raised BufferError
                        return self._queue_full_at(start, index)
                    if index == len(actions):
                        break
                action = actions[index]
                headers = action.headers
                if type(action) is Produce:
                    delivery = action.delivery
                    on_delivery: DeliveryCallback | None
                    if transactional:
                        on_delivery = marks.get(index)
                    else:
                        on_delivery = None if delivery is None else partial(reported, delivery)
                    produce(action.topic, action.value, action.key, shard, on_delivery, None, action.timestamp_ms,
                            None if headers is None else list(headers))
                    if delivery is not None and transactional:
                        uncommitted.append(delivery)
                else:
                    produce(action.topic, action.value, action.key, shard, None, None, 0,
                            None if headers is None else list(headers))
                index += 1
        except BufferError:  # librdkafka's queue is full (QueueFull)
            return self._queue_full_at(start, index)
        except KafkaException as exc:
            error = publisher.produce_error(exc)
            if error is exc:
                raise
            raise error from exc
        produced = len(actions) - start
        self._produced_in_transaction += produced
        self._unproduced_records -= produced
        return len(actions)

    def _queue_full_at(self, start: int, index: int) -> int:
        """``_produce_from``'s end on librdkafka's full queue: ``actions[start:index]`` were produced."""
        self._produced_in_transaction += index - start
        self._unproduced_records -= index - start
        return index

    def _on_report(self, topic: str | None, stream: str | None, error: KafkaError | None, message: Message) -> None:
        offset = None if error is not None else message.offset()
        if topic is not None:
            self._audit.reported(topic, offset, error is not None)
        # A failed record fails the commit, which gives the shard up: only a delivered one has an offset to keep.
        if stream is not None and offset is not None and offset > self._uncommitted_offsets.get(stream, -1):
            self._uncommitted_offsets[stream] = offset

    def _serve_reports(self) -> None:
        """Serve Kafka's delivery reports; without transactions, then hand the queued ones to the core. With them,
        at most REPORT_STEP_CALLBACKS callbacks a call: the rest wait for the next (their offsets are read at the
        commit, whose audit runs every one first); a backlog's reports after a commit took up to 4 ms in one."""
        publisher = self._publisher
        if isinstance(publisher, TransactionalPublisher):
            publisher.poll(0, REPORT_STEP_CALLBACKS)
        else:
            publisher.poll(0)
        if self._delivery_reports:
            self._deliveries_reported()

    def _deliveries_reported(self) -> None:
        """Without transactions: Kafka's reports queued since the last call, to the core in the order they came,
        as ``on_delivered`` one by one would take them: a run of delivered records in one ``on_delivered_all``
        (with per stream the highest offset of its events-topic records), a failed record, or an events-topic one
        without an offset, on its own. Only a record whose report came is confirmed, so no ack covers a record
        before Kafka reported it delivered (rule 2)."""
        reports = self._delivery_reports[:]  # the report callback appends to this very list
        self._delivery_reports.clear()
        core = self.core
        now_us = self._clock_us()
        run: list[DeliveryRef] = []
        offsets: dict[str, int] = {}
        for delivery, error, message in reports:
            if error is None:
                if delivery.topic != "events":
                    run.append(delivery)
                    continue
                offset = message.offset()
                if offset is not None:
                    run.append(delivery)
                    if offset > offsets.get(delivery.stream, -1):
                        offsets[delivery.stream] = offset
                    continue
            if run:
                core.on_delivered_all(run, offsets, now_us)
                run, offsets = [], {}
            core.on_delivered(delivery, None if error is None else str(error), None, now_us)
            if error is not None:
                # librdkafka retried it until message.timeout.ms: the source would wait for its ack forever. The
                # shard restarts from what Kafka has; its sources are told shard_moved, reconnect and resend.
                self.fail(f"a Kafka delivery failed for good: {error}")
        if run:
            core.on_delivered_all(run, offsets, now_us)

    async def _commit_forever(self) -> None:
        # The first transaction carries the owner record: committed as soon as it is with librdkafka, so that the
        # other gateways redirect the shard's sources here a commit interval sooner after a takeover.
        for _ in range(max(1, round(self.settings.commit_interval_s / POLL_INTERVAL_S))):
            if self._produced_in_transaction:
                break
            await asyncio.sleep(POLL_INTERVAL_S)
        while True:
            started_s = self._monotonic_s()
            if self._produced_in_transaction:
                await self._commit()
            # An interval from the commit's start, not its end: at saturation a commit's confirm phase (its acks, a
            # chunk per loop turn) took up to 500 ms, and an interval after that made the shard commit (and ack) every
            # 600 ms where the setting said 100. Once a commit took the whole interval, the next starts at once.
            await asyncio.sleep(next_commit_delay_s(self.settings.commit_interval_s, started_s, self._monotonic_s()))

    async def _commit(self) -> None:
        """Commit the open transaction, then hand its delivery reports to the core (the acks they earn go out at
        once) and open the next transaction. Any failure gives the shard up (ShardLost)."""
        publisher = self._publisher
        assert isinstance(publisher, TransactionalPublisher)
        loop = asyncio.get_running_loop()
        async with self._whole_transaction():
            self._committing = True
            self._commit_started_us = self._clock_us()
            started_s = self._monotonic_s()
            try:
                for attempt in range(COMMIT_ATTEMPTS):
                    try:
                        await self._audit_transaction(publisher)
                        await loop.run_in_executor(None, publisher.commit, TRANSACTION_CALL_TIMEOUT_S)
                        if self.settings.commit_durations is not None:
                            self.settings.commit_durations.observe_us(
                                round((self._monotonic_s() - started_s) * 1e6))
                        break
                    except TransactionRetriable as exc:
                        if attempt + 1 == COMMIT_ATTEMPTS:
                            raise ShardLost(f"shard {self.shard}: commit kept failing: {exc}") from exc
                    except ProducerFenced as exc:
                        self._in_transaction = False
                        raise ShardFenced(f"shard {self.shard}: fenced by a newer owner: {exc}") from exc
                    except TransactionAbortable as exc:
                        with contextlib.suppress(Exception):
                            await loop.run_in_executor(None, publisher.abort, TRANSACTION_CALL_TIMEOUT_S)
                        self._in_transaction = False
                        raise ShardLost(f"shard {self.shard}: transaction aborted: {exc}") from exc
                    except KafkaException as exc:
                        self._in_transaction = False
                        raise ShardLost(f"shard {self.shard}: commit failed: {exc}") from exc
            finally:
                self._committing = False
            self._audit.committed()
            publisher.poll(0)  # the reports commit_transaction flushed run here, on the loop's thread
            deliveries, self._uncommitted = self._uncommitted, []
            offsets, self._uncommitted_offsets = self._uncommitted_offsets, {}
            self._produced_in_transaction = 0
            # Off the loop's thread: librdkafka opens the transaction on its own main thread and answers through a
            # queue, which took 60 us at p50 but 270 us at p90 and 0.7-0.9 ms at p99 (20 x 500 events/s on 2 cores,
            # its thread waiting for a core), the sockets unread meanwhile. Frames read in between find the lock
            # held: their records wait for the producer task, as during the commit.
            try:
                await _finished(loop.run_in_executor(None, publisher.begin))
            except BaseException:
                # Committed all the same: confirmed and acked before the stop (or the failure) goes on.
                self._confirm_committed(deliveries, offsets)
                raise
        # The frames read during the commit go first (their records into the new transaction), then the committed
        # records are confirmed in chunks, the sockets read between them (1,100 records, a 100 ms commit at 10,000
        # events/s, took 1.2 ms in one call); a chunk holds at least COMMIT_CONFIRM_PER_SOURCE records per source,
        # as each chunk repeats the per-source work (in chunks of 512 at 100 sources at saturation the gateway's
        # CPU per event went from 10.9 to 15.2 us). The acks go out once, after the last chunk, as from one call
        # (they are cumulative: one per source and stream); the progress offsets go with the last chunk, so no
        # checkpoint claims an offset before its records were observed. Cancelled meanwhile (the shard stopping),
        # the rest are confirmed and acked all the same: they are in Kafka.
        chunk = max(COMMIT_CONFIRM_CHUNK, COMMIT_CONFIRM_PER_SOURCE * len(self.core.known_sources()))
        confirmed = 0
        try:
            await asyncio.sleep(0)
            while len(deliveries) - confirmed > chunk:
                self.core.on_committed(deliveries[confirmed:confirmed + chunk], {}, self._clock_us())
                confirmed += chunk
                await asyncio.sleep(0)
        finally:
            self._confirm_committed(deliveries[confirmed:] if confirmed else deliveries, offsets)

    def _confirm_committed(self, deliveries: list[DeliveryRef], offsets: dict[str, int]) -> None:
        """The last (or only) chunk of a commit's records: confirmed with the progress offsets; the acks go out."""
        self.core.on_committed(deliveries, offsets, self._clock_us())
        self._carry_out_now(self.core.due_acks())

    @contextlib.asynccontextmanager
    async def _whole_transaction(self) -> AsyncIterator[None]:
        """The transaction's lock, held once no batch the offset audit counted waits for its rest (``_cut_batches``).
        Taken at once, a commit could audit (and retry, the lock held) a transaction whose last records the producer
        task could not produce: a CI run gave its shard up so after Kafka stalled with librdkafka's queue full."""
        while True:
            await self._txn_lock.acquire()
            if not self._cut_batches:
                break
            self._txn_lock.release()  # to the producer task, which waits for it with the cut batch
            await self._cut_batches_produced.wait()
        try:
            yield
        finally:
            self._txn_lock.release()

    async def _audit_transaction(self, publisher: TransactionalPublisher) -> None:
        """Deliver every record of the open transaction, then check Kafka's reports against the offset audit:
        TransactionRetriable while a report is missing, TransactionAbortable (the shard aborts and restarts from
        what Kafka holds, nothing of the transaction acked) when they break the count."""
        await asyncio.get_running_loop().run_in_executor(None, publisher.flush, TRANSACTION_CALL_TIMEOUT_S)
        # The reports the flush queued run here, on the loop's thread, a step at a time: a transaction's worth (one
        # per produce batch, ~400 at 20 x 500 events/s) took 2.3 ms in one call, the sockets unread meanwhile. Nothing
        # else serves reports or produces while the commit holds the lock (_committing, _txn_lock).
        publisher.poll(0, REPORT_STEP_CALLBACKS)
        while publisher.reports_waiting:
            await asyncio.sleep(0)
            publisher.poll(0, REPORT_STEP_CALLBACKS)
        verdict = self._audit.verdict()
        if verdict is None:
            return
        if self._audit.failure is None:
            raise TransactionRetriable(verdict)
        self.core.offset_audit_failed()
        log.error("shard %d: Kafka's delivery reports break the offset count: %s; aborting the transaction (nothing "
                  "of it is acked), the shard restarts from what Kafka holds", self.shard, verdict)
        raise TransactionAbortable(f"offset audit: {verdict}")

    async def _fire_deadlines(self) -> None:
        """The core's ``advance`` at its next deadline. Woken early only when a core call moved that deadline earlier
        (``_deadline_may_be_earlier``): a frame that moves it later, or leaves it, costs no wake-up (at 20 sources
        that was a task switch, a timer and a future per frame); the task then wakes at the deadline it slept for,
        finds the later one and sleeps again."""
        loop = asyncio.get_running_loop()
        while True:
            deadline_us = self.core.next_deadline_us()
            now_us = self._clock_us()
            if deadline_us is not None and deadline_us <= now_us:
                # Awake: what a core call meanwhile moves is read on the next turn.
                self._armed_deadline_us = now_us
                await self._carry_out(self.core.advance(now_us))
                continue
            self._armed_deadline_us = deadline_us
            wake = self._deadline_wake = loop.create_future()
            timer = None if deadline_us is None else loop.call_later((deadline_us - now_us) / 1e6, _wake, wake)
            try:
                await wake
            finally:
                if timer is not None:
                    timer.cancel()

    def _deadline_may_be_earlier(self) -> None:
        """After a core call: wake ``_fire_deadlines`` if the core's next deadline is now before the one it sleeps
        until."""
        deadline_us = self.core.next_deadline_us()
        if deadline_us is None:
            return
        armed_us = self._armed_deadline_us
        if armed_us is None or deadline_us < armed_us:
            _wake(self._deadline_wake)

    # -- carrying out the core's actions ------------------------------------------------------------------------

    def _enqueue(self, actions: Sequence[Produce | WriteCheckpoint], done: asyncio.Future[None] | None = None, *,
                 start: int = 0, marks: dict[int, DeliveryCallback] | None = None) -> None:
        self._produce_queue.put_nowait(_ProduceBatch(list(actions), done, start, marks))
        self._unproduced_records += len(actions) - start
        if marks is not None and self._transactional:  # begun by _produce_now: the audit counted it whole
            self._cut_batches += 1
            self._cut_batches_produced.clear()

    async def _carry_out(self, actions: Sequence[IngestAction]) -> None:
        """Everything but Kafka writes at once; Kafka writes in their order, after those of earlier calls. Returns
        once they are with librdkafka, so that a caller waiting on a Kafka stall stops reading its socket."""
        waiting = self._carry_out_start(actions)
        if waiting is not None:
            await waiting

    def _carry_out_start(self, actions: Sequence[IngestAction]) -> Coroutine[Any, Any, None] | None:
        """``_carry_out`` up to its wait: None when nothing is left to wait for, else the wait (a coroutine, to be
        awaited before the caller's next call: a connection's worker does)."""
        writes = self._carry_out_now(actions)
        if not writes:
            return None
        if self._producer_task is None or self._producer_task.done():
            if self.fenced:
                raise ShardFenced(f"shard {self.shard}: fenced by a newer owner")
            raise ShardLost(f"shard {self.shard}: its Kafka producer task is not running")
        start, marks = 0, None
        if self._producer_idle(writes):
            start, marks = self._produce_now(writes)
            if start == len(writes):
                return None
        if self._unproduced_records + len(writes) - start <= MAX_UNPRODUCED_RECORDS:
            # Not waited for: a commit holds the producer for its round trip, and a connection waiting through it
            # would stop reading its source, which the merge would then time out (its events late, not slow).
            self._enqueue(writes, start=start, marks=marks)
            return None
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(writes, done, start=start, marks=marks)
        return self._await_produced(done)

    def _producer_idle(self, writes: list[Produce | WriteCheckpoint]) -> bool:
        """Whether the producer task has nothing to do and nothing holds the transaction: it waits for a batch (one
        put for it is in the queue until it runs, then ``_batch_taken`` until produced), no commit runs, and no write
        goes to a topic whose first record is still to be settled. Then writes handed to librdkafka here keep their
        order after the task's."""
        if not self._produce_queue.empty() or self._batch_taken or self._txn_lock.locked():
            return False
        if self._transactional and not self._in_transaction:
            return False
        if self._unsettled_topics:
            end = self._first_write_end(writes, 0)
            return end == len(writes) and writes[end - 1].topic not in self._unsettled_topics
        return True

    def _produce_now(self, writes: list[Produce | WriteCheckpoint]) -> tuple[int, dict[int, DeliveryCallback]]:
        """The producer task's work on ``writes`` done in the caller's call, without its task switch (one per frame
        at a steady rate): returns where librdkafka's full queue stopped it (``len(writes)``: it did not) and the
        batch's marks, for the task to go on from there. An error is queued for the task to raise, as if its own
        produce had raised it: the shard fails as it would have."""
        marks = self._report_marks(writes) if self._transactional else {}
        self._unproduced_records += len(writes)  # _produce_from takes off what it produced
        try:
            start = self._produce_from(writes, 0, marks)
        except Exception as exc:  # noqa: BLE001 - the task raises it (above)
            self._produce_queue.put_nowait(_ProduceBatch([], None, error=exc))
            return len(writes), marks
        self._unproduced_records -= len(writes) - start  # the rest is counted where it is queued (_enqueue)
        return start, marks

    async def _await_produced(self, done: asyncio.Future[None]) -> None:
        try:
            # While a connection waits here it is not read: Kafka back-pressures the gateway, and the sources the
            # merge waits for may be silent only because of that (ingest rule 5). Said again until the wait ends,
            # so no merge timeout fires during a long one (issue 25 item 9: their events went late).
            while not done.done():
                self.core.kafka_queue_full(self._clock_us())
                await asyncio.wait((done,), timeout=KAFKA_WAIT_SIGNAL_S)
            self.core.kafka_queue_full(self._clock_us())
            done.result()
        except Exception as exc:
            # The producer task failed (and reports it): the shard is lost, not the caller's connection broken.
            if isinstance(exc, ShardFenced | ProducerFenced):
                raise ShardFenced(f"shard {self.shard}: fenced by a newer owner") from exc
            raise ShardLost(f"shard {self.shard}: its Kafka producer failed: {exc!r}") from exc

    def _carry_out_now(self, actions: Sequence[IngestAction],
                       queue_writes: bool = False) -> list[Produce | WriteCheckpoint]:
        """Everything but Kafka writes at once; the writes are returned, or with ``queue_writes`` queued behind the
        records already released and not waited for (checkpoints, clock state, the poll's releases)."""
        split = (None if self._produce_loop is None or type(actions) is not list
                 else self._produce_loop.split_writes(actions, _KAFKA_WRITES, _OTHER_ACTIONS))
        writes: list[Produce | WriteCheckpoint]
        if split is None:
            writes, others = [], actions
        else:  # the writes sorted out in one native pass; the rest (acks, throttling) is a handful per call
            writes, others = split
        for action in others:
            if type(action) is Produce:  # most actions, by far
                writes.append(action)
            elif isinstance(action, SendToSource):
                self._host.send_to_source(action.source_id, action.data)
            elif isinstance(action, SendFrame):
                self._host.send_frame(action.connection, action.data)
            elif isinstance(action, Produce | WriteCheckpoint):
                writes.append(action)
            elif isinstance(action, PauseReading | ResumeReading):
                self._host.set_throttled(action.source_id, isinstance(action, PauseReading))
            else:
                raise TypeError(f"not an ingest action: {action!r}")
        if queue_writes and writes:
            self._enqueue(writes)
            return []
        return writes

    # -- what the gateway forwards ------------------------------------------------------------------------------

    async def register_source(self, source_id: str, streams: tuple[str, ...], created: frozenset[str]) -> None:
        """``created``: streams whose topics the gateway created just now (empty: nothing to recover)."""
        await self._ensure_streams(streams, created)
        actions = self.core.source_registered(source_id, streams, self._clock_us())
        self._deadline_may_be_earlier()
        await self._carry_out(actions)

    def receive_events(self, connection: ConnectionId, source_id: str, events: tuple[messages.IncomingEvent, ...],
                       arrival_us: int) -> Coroutine[Any, Any, None] | None:
        """A frame's events, carried out at once (no task switch per frame); returns what is left to wait for when
        Kafka holds the shard back (``_carry_out_start``), which the caller awaits before its next frame."""
        actions = self.core.events_received(connection, source_id, events, arrival_us)
        self._deadline_may_be_earlier()
        return self._carry_out_start(actions)

    async def receive_heartbeat(self, source_id: str, heartbeat: messages.Heartbeat) -> None:
        actions = self.core.heartbeat_received(source_id, heartbeat, self._clock_us())
        self._deadline_may_be_earlier()
        await self._carry_out(actions)

    async def source_left(self, source_id: str) -> None:
        actions = self.core.source_left(source_id, self._clock_us())
        self._deadline_may_be_earlier()
        await self._carry_out(actions)

    def clock_changed(self, info: SourceInfo, t_a_us: int) -> None:
        self._carry_out_now(self.core.clock_changed(info, t_a_us, self._clock_us()), queue_writes=True)

    async def _ensure_streams(self, streams: tuple[str, ...], created: frozenset[str]) -> None:
        """Recover what Kafka holds of this shard's partition of streams not seen yet (the gateway created their
        topics)."""
        if all(self.core.knows_stream(s) for s in streams):
            return
        async with self._stream_lock:
            loop = asyncio.get_running_loop()
            for stream in [s for s in streams if not self.core.knows_stream(s)]:
                self._expect_first_writes(self.topics.events(stream), self.topics.late(stream))
                if stream in created:
                    # A topic created just now is empty: nothing to recover, and its first record gets offset 0.
                    await self._await_new_partition(self.topics.events(stream))
                    self.core.stream_created(stream)
                    continue
                started_s = loop.time()
                progress = await loop.run_in_executor(None, partial(
                    recover_stream, self.settings.kafka_client, self.topics.sources, self.topics.events(stream),
                    stream, partition=self.shard))
                log.info("shard %d: recovered stream %s in %.2f s: %d sources, from offset %d", self.shard, stream,
                         loop.time() - started_s, len(progress.next_seq), progress.next_offset)
                actions = self.core.stream_recovered(progress, self._clock_us())
                self._deadline_may_be_earlier()
                await self._carry_out(actions)

    async def _await_new_partition(self, topic: str) -> None:
        """Transactions: wait until the producer's metadata shows the shard's partition of a topic created just now
        with its leader (``TransactionalPublisher.await_leader``), and audit its offsets from 0."""
        publisher = self._publisher
        if not isinstance(publisher, TransactionalPublisher):
            return
        self._audit.starts_empty(topic)
        has_leader = await asyncio.get_running_loop().run_in_executor(
            None, publisher.await_leader, topic, self.shard, NEW_PARTITION_LEADER_WAIT_S)
        if not has_leader:
            log.warning("shard %d: %s [%d] has no leader in the producer's metadata %.0f s after its creation; "
                        "producing to it all the same", self.shard, topic, self.shard, NEW_PARTITION_LEADER_WAIT_S)

    async def punctuate_idle(self, streams: set[str], idle_lag_us: int) -> None:
        """Rule 10 for every stream of the deployment (recovering the ones this shard has not seen yet)."""
        if not self.serving:
            return
        await self._ensure_streams(tuple(sorted(streams)), frozenset())
        now_us = self._clock_us()
        actions: list[IngestAction] = []
        for stream in sorted(streams):
            actions += self.core.punctuate_idle(stream, now_us, idle_lag_us)
        if actions:
            await self._carry_out(actions)

    # -- what metrics read --------------------------------------------------------------------------------------

    def pending(self) -> int:
        return self._publisher.pending() + self._unproduced_records


async def _cancel(task: asyncio.Task[None]) -> None:
    # Waited for, not awaited: awaiting a task that already died re-raises its error, which _task_done has reported.
    task.cancel()
    await asyncio.wait([task])


async def _finished(call: asyncio.Future[None]) -> None:
    """Await an executor call to its end even when cancelled (then re-raised): a stop's abort must not reach
    librdkafka while a transaction call still runs on another thread."""
    try:
        await asyncio.shield(call)
    except asyncio.CancelledError:
        await asyncio.wait([call])
        if not call.cancelled() and (error := call.exception()) is not None:
            # Its error goes with the cancellation, which the stop is already handling: read, so asyncio does
            # not report it as never retrieved.
            log.debug("a transaction call cancelled by a stop then failed: %r", error)
        raise


def _wake(future: asyncio.Future[None] | None) -> None:
    if future is not None and not future.done():
        future.set_result(None)


def _fail_batch(batch: _ProduceBatch, error: BaseException) -> None:
    if batch.done is None or batch.done.done():
        return
    if isinstance(error, Exception):
        batch.done.set_exception(error)
    else:
        batch.done.cancel()


def _log_close_failure(future: asyncio.Future[None]) -> None:
    if not future.cancelled() and future.exception() is not None:
        log.warning("closing a recovery consumer failed: %r", future.exception())
