"""The gateway's asyncio shell: lifecycle and tasks around the IngestCore (gateway/ingest.py), which makes every
decision. Connections (gateway/connection.py) call in with what their sessions received; Kafka's delivery reports
call in from the poll task; the deadline task calls in when the core says something is due. The shell carries out
the actions that come back: writes to connections, produces to Kafka, pauses and resumes reading.

Tasks, each with a done-callback that logs, counts (`task_failures`) and reports it in /healthz (status "failing"),
as does an exception out of the core during a connection's call (see _core_call):
  kafka-poll          serves delivery reports, then the core's poll (acks, buffer check, checkpoints)
  kafka-produce       hands Produce actions to librdkafka in the order the core gave them, waiting while its queue
                      is full; owned by the gateway, so records already taken out of the ordering pipeline are
                      produced even if the connection that released them goes away
  pipeline-deadlines  fires reorder gap timeouts and merge waits when the core says they are due
  session-timeouts    cuts off slow and silent peers
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message

from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.producer import KafkaPublisher, QueueFull
from contract.topics import TopicNames
from contract.wire import messages
from contract.wire.errors import LocalProtocolError
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, encode_frame
from gateway.auth import SourceAuthenticator
from gateway.connection import WORKER_STAGES, ConnectionHandler, WorkerStage
from gateway.ingest import (
    CLOCK_STEP_HOLD_US,
    CLOCK_STEP_MAX_HELD,
    ConnectionId,
    DeliveryRef,
    GatewayCounters,
    IngestAction,
    IngestConfig,
    IngestCore,
    PauseReading,
    Produce,
    ResumeReading,
    SendFrame,
    SendToSource,
    WriteCheckpoint,
)
from gateway.metrics import MetricsServer, make_registry
from gateway.recovery import recover_clocks, recover_stream
from gateway.session import EventsReceived, GatewaySession, HeartbeatReceived, SessionTimeouts
from reorder.pipeline import IngestPipeline, PipelineConfig
from timesync.clocks import ClockUs, EstimateMapping, IdentityMapping, ReferenceMapping, system_time_us
from timesync.server import ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfo, SourceInfoStore

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.002
TIMEOUT_SWEEP_INTERVAL_S = 0.5
# librdkafka's queue is full: retry this often (each refusal also extends the core's stall grace).
QUEUE_FULL_RETRY_S = 0.005
# How long stop() waits for Kafka to confirm what was read (both drains together): below the 10 s that docker stop
# and most supervisors grant between SIGTERM and SIGKILL, leaving the rest for closing connections and the producer.
STOP_FLUSH_TIMEOUT_S = 8.0
# The failed_tasks entry of /healthz for an exception out of the IngestCore (see Gateway._core_call).
CORE_FAILURE = "ingest-core"


@dataclass
class GatewayConfig:
    host: str = "127.0.0.1"
    port: int = 7700
    bootstrap_servers: str = "127.0.0.1:9092"
    topic_prefix: str = "skewless"
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    # librdkafka properties for every Kafka client of the gateway (security.protocol, sasl.*, ssl.*): [gateway.kafka]
    kafka_settings: dict[str, Any] = field(default_factory=dict)
    # Producer-only properties on top of them: [gateway.producer]
    producer_config: dict[str, Any] = field(default_factory=dict)
    authenticator: SourceAuthenticator = field(default_factory=SourceAuthenticator)
    timeouts: SessionTimeouts = field(default_factory=SessionTimeouts)
    ssl_context: ssl.SSLContext | None = None
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = None
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    checkpoint_interval_s: float = 5.0
    # Events held in reorder buffers and merge queues, all sources together (gateway.ingest, rule 4).
    max_buffered_events: int = 1_000_000
    # A source whose clock stepped between re-syncs is held at most this long / this many events (rule 9).
    clock_step_hold_us: int = CLOCK_STEP_HOLD_US
    clock_step_max_held: int = CLOCK_STEP_MAX_HELD
    # None: trust source clocks (ref = source time, uncertainty 0), for sources already disciplined by NTP/PTP.
    # With `timesync` set, the gateway runs the time-sync server and maps source times through its estimates.
    reference_clock: ReferenceMapping | None = None
    timesync: ServerConfig | None = None
    # Connections the kernel may hold before the gateway accepts them (capped by net.core.somaxconn). asyncio's
    # default of 100 let a burst of a few thousand connects overflow the queue: clients saw an open socket that the
    # gateway never accepted.
    listen_backlog: int = 4096

    @property
    def kafka_client(self) -> KafkaClientConfig:
        return KafkaClientConfig(self.bootstrap_servers, self.kafka_settings)


@dataclass
class _ProduceBatch:
    """Produce actions of one core call, in order; `done` resolves once all of them are with librdkafka."""

    actions: list[Produce]
    done: asyncio.Future[None]


class Gateway:
    def __init__(self, config: GatewayConfig, clock_us: ClockUs = system_time_us) -> None:
        self.config = config
        self.topics = TopicNames(config.topic_prefix)
        self._clock_us = clock_us
        self._publisher = KafkaPublisher(config.kafka_client, config.producer_config)
        self.store = SourceInfoStore()
        self.timesync: TimeSyncServer | None = None
        mapping = config.reference_clock
        if mapping is None:
            mapping = EstimateMapping(self.store.get) if config.timesync is not None else IdentityMapping()
        self.core = IngestCore(self.topics, mapping, IngestConfig(
            pipeline=config.pipeline, max_buffered_events=config.max_buffered_events,
            checkpoint_interval_us=round(config.checkpoint_interval_s * 1_000_000),
            clock_step_hold_us=config.clock_step_hold_us, clock_step_max_held=config.clock_step_max_held))
        self._server: asyncio.Server | None = None
        self._metrics: MetricsServer | None = None
        self._connections: dict[ConnectionId, ConnectionHandler] = {}
        self._connections_by_source: dict[str, set[ConnectionHandler]] = {}
        self._last_connection_id = 0
        self._stream_lock = asyncio.Lock()
        self._deadline_changed = asyncio.Event()
        self._produce_queue: asyncio.Queue[_ProduceBatch] = asyncio.Queue()
        self._unproduced_records = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._producer: asyncio.Task[None] | None = None
        self._failed_tasks: dict[str, str] = {}
        # Connections that failed on a gateway bug, by stage (gateway.connection): kept in the shell because the
        # core never sees them; zero-filled so every stage is exported before its first failure.
        self.worker_errors: dict[WorkerStage, int] = dict.fromkeys(WORKER_STAGES, 0)
        self._last_connection_failure: str | None = None

    # -- lifecycle ----------------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics is None else self._metrics.port

    @property
    def timesync_port(self) -> int | None:
        return None if self.timesync is None else self.timesync.address[1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._ensure_base_topics)
        if self.config.timesync is not None:
            await self._start_timesync()
        self._server = await loop.create_server(self._new_connection, self.config.host, self.config.port,
                                                ssl=self.config.ssl_context, backlog=self.config.listen_backlog)
        self._producer = self._start_task(self._produce_forever(), "kafka-produce")
        self._start_task(self._poll_forever(), "kafka-poll")
        self._start_task(self._sweep_timeouts(), "session-timeouts")
        self._start_task(self._fire_deadlines(), "pipeline-deadlines")
        if self.config.metrics_port is not None:
            self._metrics = MetricsServer(make_registry(self, self.labeled_counters), self.health)
            await self._metrics.start(self.config.metrics_host, self.config.metrics_port)

    async def _start_timesync(self) -> None:
        assert self.config.timesync is not None
        # Clock state survives a restart: sources map correctly before their next re-sync (their error bounds have
        # kept growing since their last sync, so the uncertainty stays honest).
        try:
            recovered = await asyncio.get_running_loop().run_in_executor(
                None, recover_clocks, self.config.kafka_client, self.topics.sources)
        except (KafkaException, TimeoutError) as exc:
            # Not fatal: sources then count as unsynced until their next re-sync, as on a first start.
            log.warning("could not recover clock state from %s: %s", self.topics.sources, exc)
            recovered = {}
        for source_id, (estimate, last_sync_us) in recovered.items():
            self.store.update(source_id, estimate, last_sync_us)
        self.timesync = await start_server(self.config.timesync, store=self.store)
        if self._clock_us is system_time_us:
            # One reference clock for sync replies and gateway stamps (so --clock-offset-us shifts both).
            self._clock_us = self.timesync.clock.now_us
        self.store.add_listener(self._on_clock_update)

    def _ensure_base_topics(self) -> None:
        ensure_topics(self.config.kafka_client, [self.topics.sources], config={"cleanup.policy": "compact"})

    async def stop(self, flush_timeout_s: float = STOP_FLUSH_TIMEOUT_S, graceful: bool = True) -> None:
        """Stop taking events, let Kafka confirm what was published (acks still reach open connections), checkpoint,
        then close. Everything runs on the event loop: delivery callbacks never race the loop's own state.

        ``flush_timeout_s`` bounds both drains together, so a stuck connection or an unreachable Kafka delays the
        stop by that much at most.

        graceful=False drops every connection first, as a crash would: the clients never see the last acks and
        resend those events to the next gateway (which must recognise them)."""
        if self._server is not None:
            self._server.close()
        for handler in list(self._connections.values()):
            if graceful:
                handler.pause()
            else:
                handler.close()
        # The producer keeps running until the drain is over: what connections already read is still published.
        for task in self._tasks:
            if task is not self._producer:
                await self._cancel(task)
        deadline = asyncio.get_running_loop().time() + flush_timeout_s
        await self._drain(deadline)
        try:
            await self._carry_out(self.core.checkpoint_dirty_streams())
        except Exception:
            # The stop goes on (connections, server, publisher still to close): the next start's recovery scan
            # covers a lost checkpoint.
            log.exception("could not write the shutdown checkpoints")
        remaining = await self._drain(deadline)
        if remaining:
            log.error("%d events still unconfirmed by Kafka at shutdown; clients will resend them", remaining)
        if self._producer is not None:
            await self._cancel(self._producer)
        for handler in list(self._connections.values()):
            handler.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self._metrics is not None:
            await self._metrics.stop()
        if self.timesync is not None:
            await self.timesync.close()
        self._publisher.close()

    @staticmethod
    async def _cancel(task: asyncio.Task[None]) -> None:
        # Waited for, not awaited: awaiting a task that already died re-raises its error, which _task_done has
        # logged and counted; stop() must go on to close everything else.
        task.cancel()
        await asyncio.wait([task])

    async def _drain(self, deadline: float) -> int:
        """Poll until connection workers and the producer are idle and librdkafka has no undelivered message, or
        the loop's clock reaches ``deadline``; returns how many records are left (undelivered or not produced)."""
        loop = asyncio.get_running_loop()
        while loop.time() < deadline:
            self._publisher.poll(0)
            await self._carry_out(self.core.due_acks())
            # Records queued for a producer task that died will never be produced: waiting for them would only make
            # a gateway that already failed take the whole timeout to stop.
            producer_dead = self._producer is None or self._producer.done()
            if (self._publisher.pending() == 0 and (self._unproduced_records == 0 or producer_dead)
                    and all(h.idle for h in self._connections.values())):
                break
            await asyncio.sleep(POLL_INTERVAL_S)
        return self._publisher.pending() + self._unproduced_records

    # -- tasks --------------------------------------------------------------------------------------------------

    def _start_task(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._task_done)
        self._tasks.append(task)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is None:
            return
        log.error("gateway task %s died: %r", task.get_name(), error, exc_info=error)
        self.core.task_failed()
        self._failed_tasks[task.get_name()] = repr(error)
        if task is self._producer:
            # As aiokafka's Sender: whoever waits for the producer fails now instead of waiting forever; their
            # connections close and the clients resend what was not acknowledged.
            while not self._produce_queue.empty():
                self._fail_batch(self._produce_queue.get_nowait(), error)

    async def _poll_forever(self) -> None:
        while True:
            self._publisher.poll(0)
            await self._carry_out(self.core.poll(self._clock_us()))
            await asyncio.sleep(POLL_INTERVAL_S)

    async def _produce_forever(self) -> None:
        while True:
            batch = await self._produce_queue.get()
            try:
                for action in batch.actions:
                    await self._produce(action)
                    self._unproduced_records -= 1
            except BaseException as exc:
                self._fail_batch(batch, exc)
                raise
            if not batch.done.done():  # its connection may have gone meanwhile: produced all the same
                batch.done.set_result(None)

    @staticmethod
    def _fail_batch(batch: _ProduceBatch, error: BaseException) -> None:
        if batch.done.done():
            return
        if isinstance(error, Exception):
            batch.done.set_exception(error)
        else:
            batch.done.cancel()

    async def _produce(self, action: Produce) -> None:
        on_delivery = None if action.delivery is None else partial(self._on_delivery, action.delivery)
        while True:
            try:
                self._publisher.produce(action.topic, action.key, action.value, on_delivery)
                return
            except QueueFull:
                self.core.kafka_queue_full(self._clock_us())
                await asyncio.sleep(QUEUE_FULL_RETRY_S)

    def _on_delivery(self, delivery: DeliveryRef, error: KafkaError | None, message: Message) -> None:
        offset = message.offset() if error is None else None
        self.core.on_delivered(delivery, None if error is None else str(error), offset, self._clock_us())

    async def _fire_deadlines(self) -> None:
        """Fires reorder gap timeouts and merge waits when the core says they are due."""
        while True:
            self._deadline_changed.clear()
            deadline_us = self.core.next_deadline_us()
            if deadline_us is None:
                await self._deadline_changed.wait()
                continue
            delay_s = (deadline_us - self._clock_us()) / 1e6
            if delay_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await self._deadline_changed.wait()
                continue
            await self._carry_out(self.core.advance(self._clock_us()))

    async def _sweep_timeouts(self) -> None:
        while True:
            await asyncio.sleep(TIMEOUT_SWEEP_INTERVAL_S)
            now_us = self._clock_us()
            for handler in list(self._connections.values()):
                handler.check_timeouts(now_us)

    # -- carrying out the core's actions ------------------------------------------------------------------------

    async def _carry_out(self, actions: Sequence[IngestAction]) -> None:
        """Everything but Produce at once; Produce actions in their order, after those of earlier calls. Returns
        once they are with librdkafka, so that a caller waiting on a Kafka stall stops reading its socket."""
        produces: list[Produce] = []
        for action in actions:
            if isinstance(action, Produce):
                produces.append(action)
            else:
                self._carry_out_now(action)
        if produces:
            if self._producer is None or self._producer.done():
                # Nobody would produce them: fail the caller (its connection closes, its client resends).
                raise RuntimeError("the gateway's Kafka producer task is not running")
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._produce_queue.put_nowait(_ProduceBatch(produces, done))
            self._unproduced_records += len(produces)
            await done

    def _carry_out_now(self, action: IngestAction) -> None:
        if isinstance(action, SendToSource):
            # One live connection of the source is enough. If that connection dies with the ack unread, the SDK
            # resends what it carried and the core re-acks the duplicates.
            for handler in self._connections_by_source.get(action.source_id, ()):
                if handler.writable:
                    handler.send_bytes(action.data)
                    break
        elif isinstance(action, SendFrame):
            connection = self._connections.get(action.connection)
            if connection is not None:
                connection.send_bytes(action.data)
        elif isinstance(action, WriteCheckpoint):
            # Best effort: a lost checkpoint only makes the next recovery scan a little longer.
            with contextlib.suppress(QueueFull):
                self._publisher.produce(action.topic, action.key, action.value, None)
        elif isinstance(action, PauseReading | ResumeReading):
            throttled = isinstance(action, PauseReading)
            for handler in self._connections_by_source.get(action.source_id, ()):
                handler.set_throttled(throttled)
        else:
            raise TypeError(f"not an action carried out at once: {action!r}")

    def _on_clock_update(self, info: SourceInfo) -> None:
        for action in self.core.clock_changed(info, self.store.max_rtt_us(), self._clock_us()):
            self._carry_out_now(action)

    # -- what connections ask (gateway.connection.ConnectionOwner) ----------------------------------------------

    def _new_connection(self) -> ConnectionHandler:
        session = GatewaySession(self.config.max_frame_bytes, authenticator=self.config.authenticator,
                                 timeouts=self.config.timeouts, now_us=self._clock_us())
        return ConnectionHandler(self, session, self._clock_us)

    def attach(self, connection: ConnectionHandler) -> ConnectionId:
        self._last_connection_id += 1
        connection_id = ConnectionId(self._last_connection_id)
        self._connections[connection_id] = connection
        self.core.connection_opened()
        return connection_id

    def detach(self, connection: ConnectionHandler) -> None:
        self.core.connection_closed()
        self._connections.pop(connection.connection_id, None)
        source_id = connection.source_id
        if source_id is None:
            return
        handlers = self._connections_by_source.get(source_id)
        if handlers is not None:
            handlers.discard(connection)
            if not handlers:
                del self._connections_by_source[source_id]

    async def register_source(self, connection: ConnectionHandler, hello: messages.Hello) -> None:
        await self._ensure_streams(hello.streams)
        self._connections_by_source.setdefault(hello.source_id, set()).add(connection)
        with self._core_call():
            actions = self.core.source_registered(hello.source_id, hello.streams, self._clock_us())
        self._deadline_changed.set()
        await self._carry_out(actions)

    async def receive_events(self, connection: ConnectionHandler, received: EventsReceived, arrival_us: int) -> None:
        with self._core_call():
            actions = self.core.events_received(connection.connection_id, received.source_id, received.events,
                                                arrival_us)
        self._deadline_changed.set()
        await self._carry_out(actions)

    async def receive_heartbeat(self, received: HeartbeatReceived) -> None:
        with self._core_call():
            actions = self.core.heartbeat_received(received.source_id, received.heartbeat, self._clock_us())
        self._deadline_changed.set()
        await self._carry_out(actions)

    @contextlib.contextmanager
    def _core_call(self) -> Iterator[None]:
        """Around a core call made for a connection. The core raising (a bug) takes down that connection, and more:
        records it had released in the call are lost with it, and the seqs it had accepted are never confirmed, so
        their resends are duplicates never acked and that source's acks stop for good. Only a restart (recovery
        from Kafka, the clients resending what was not acked) serves it again: /healthz says so."""
        try:
            yield
        except Exception as exc:
            if CORE_FAILURE not in self._failed_tasks:
                log.exception("the ingest core raised: /healthz is failing until the gateway restarts")
                self._failed_tasks[CORE_FAILURE] = repr(exc)
            self.core.task_failed()
            raise

    def session_failed(self, error_code: str) -> None:
        self.core.session_failed(error_code)

    def worker_failed(self, connection: ConnectionHandler, stage: WorkerStage, error: BaseException) -> None:
        # One connection's failure is not the gateway's: /healthz stays "ok" unless a gateway task died too (the
        # producer, typically, which is then what every connection's failure says).
        log.error("connection %d (source %s, peer %s) failed at stage %s, closing it: %r", connection.connection_id,
                  connection.source_id, connection.peer, stage, error, exc_info=error)
        self.worker_errors[stage] += 1
        self._last_connection_failure = f"source {connection.source_id} ({stage}): {error!r}"
        # Told why before the close, so the client does not take it for a network fault.
        connection.send_bytes(encode_frame(messages.build_error(
            LocalProtocolError.code,
            f"the gateway failed processing this connection ({stage}): {type(error).__name__}", fatal=True)))

    async def _ensure_streams(self, streams: tuple[str, ...]) -> None:
        """Create the topics of streams not seen yet and recover what Kafka already holds of them."""
        if all(self.core.knows_stream(s) for s in streams):
            return
        async with self._stream_lock:
            missing = [s for s in streams if not self.core.knows_stream(s)]
            topics = [t for s in missing for t in (self.topics.events(s), self.topics.late(s))]
            loop = asyncio.get_running_loop()
            created = set(await loop.run_in_executor(None, ensure_topics, self.config.kafka_client, topics))
            for stream in missing:
                if self.topics.events(stream) in created:
                    # A topic created just now is empty: nothing to recover (and its leader may not be known yet).
                    self.core.stream_created(stream)
                    continue
                started_s = loop.time()
                progress = await loop.run_in_executor(
                    None, recover_stream, self.config.kafka_client, self.topics.sources,
                    self.topics.events(stream), stream)
                log.info("recovered stream %s in %.2f s: %d sources, from offset %d", stream,
                         loop.time() - started_s, len(progress.next_seq), progress.next_offset)
                actions = self.core.stream_recovered(progress, self._clock_us())
                self._deadline_changed.set()
                await self._carry_out(actions)

    # -- what the metrics server, /healthz and tests read -------------------------------------------------------

    @property
    def counters(self) -> GatewayCounters:
        return self.core.counters

    @property
    def pipeline(self) -> IngestPipeline:
        return self.core.pipeline

    @property
    def throttled_sources(self) -> frozenset[str]:
        return self.core.throttled_sources

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def connections_of(self, source_id: str) -> tuple[ConnectionHandler, ...]:
        """The registered connections of a source (a pool has several)."""
        return tuple(self._connections_by_source.get(source_id, ()))

    def labeled_counters(self) -> dict[str, tuple[str, dict[str, float]]]:
        return {"worker_errors": ("stage", {stage: float(n) for stage, n in self.worker_errors.items()})}

    def extra_counters(self) -> dict[str, float]:
        counters = self.core.pipeline.counters
        return {f"pipeline_{name}": float(getattr(counters, name)) for name in counters.__dataclass_fields__}

    def gauges(self) -> dict[str, float]:
        return {"connections": float(len(self._connections)), "kafka_pending": float(self._publisher.pending()),
                **self.core.delivery_latency_percentiles_us()}

    def per_source_gauges(self) -> dict[str, dict[str, float]]:
        gauges: dict[str, dict[str, float]] = {
            source_id: {"connections": float(len(handlers))}
            for source_id, handlers in self._connections_by_source.items()}
        for source_id, held in self.core.pipeline.buffered().items():
            gauges.setdefault(source_id, {})["buffered_events"] = float(held)
        now_us = self._clock_us()
        for source_id, info in self.store.snapshot().items():
            gauges.setdefault(source_id, {}).update({
                "offset_us": float(info.offset_us), "rtt_us": float(info.rtt_us), "skew_ppm": info.skew_ppm,
                "error_bound_us": float(info.error_bound_us(now_us)), "sync_samples": float(info.sample_count)})
        return gauges

    def health(self) -> dict[str, Any]:
        serving = self._server is not None and self._server.is_serving()
        status = "failing" if self._failed_tasks else "ok" if serving else "stopped"
        return {"status": status, "connections": len(self._connections),
                "kafka_pending": self._publisher.pending(), "last_delivery_us": self.core.last_delivery_us,
                "last_kafka_error": self.core.last_kafka_error,
                "throttled_sources": sorted(self.core.throttled_sources),
                "kafka_backpressure": self.core.kafka_stalled(self._clock_us()),
                "failed_tasks": dict(self._failed_tasks), "last_connection_failure": self._last_connection_failure}
