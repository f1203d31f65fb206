"""asyncio shell around GatewaySession: sockets in, Kafka out, acks back after delivery."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import KafkaError, KafkaException, Message

from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.producer import DeliveryCallback, KafkaPublisher, QueueFull
from contract.records import PUNCTUATION_KEY, EventRecord, PunctuationRecord
from contract.topics import TopicNames
from contract.wire import messages
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, encode_frame
from gateway.acks import DeliveryTracker
from gateway.auth import SourceAuthenticator
from gateway.clock_state import clock_state_record
from gateway.ingest import StreamProgress
from gateway.metrics import MetricsServer, make_registry
from gateway.recovery import recover_clocks, recover_stream
from gateway.session import (
    CloseConnection,
    DrainRequested,
    EventsReceived,
    GatewaySession,
    HeartbeatReceived,
    SendBytes,
    SessionAction,
    SessionTimeouts,
    SourceRegistered,
)
from reorder.pipeline import IngestPipeline, PipelineConfig, PipelineOutput, PublishRecord
from timesync.clocks import ClockUs, EstimateMapping, IdentityMapping, ReferenceMapping, system_time_us
from timesync.server import ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfo, SourceInfoStore

log = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.002
PRESSURE_CHECK_EVERY_TICKS = 10
TIMEOUT_SWEEP_INTERVAL_S = 0.5
# Stop reading a connection while this many of its actions wait to be processed: TCP pushes back on the client.
MAX_PENDING_ACTIONS = 64
# While Kafka back-pressures the gateway (librdkafka's queue full), and for this long after, no reorder gap or merge
# wait fires: the sources the merge waits for are silent because the gateway stopped reading them, not because they
# are gone. Timing them out would push their in-order events to the late topic once Kafka is back.
POST_STALL_GRACE_S = 2.0


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
    # Events held in reorder buffers and merge queues, all sources together. Past it the gateway stops reading the
    # sources that hold events (the merge is waiting for the others, which keep being read), until half is left.
    max_buffered_events: int = 1_000_000
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
class GatewayCounters:
    connections_opened: int = 0
    connections_closed: int = 0
    frames_too_large: int = 0
    malformed_frames: int = 0
    protocol_errors: int = 0
    events_received: int = 0
    events_published: int = 0
    duplicates: int = 0
    delivery_failures: int = 0
    heartbeats: int = 0
    timeouts: int = 0
    auth_failures: int = 0
    recovered_sources: int = 0
    global_pauses: int = 0
    kafka_stalls: int = 0

    def count_error(self, code: str) -> None:
        if code == "frame_too_large":
            self.frames_too_large += 1
        elif code == "malformed_frame":
            self.malformed_frames += 1
        elif code == "timeout":
            self.timeouts += 1
        elif code in ("unauthenticated", "unknown_source"):
            self.auth_failures += 1
        else:
            self.protocol_errors += 1


class Gateway:
    def __init__(self, config: GatewayConfig, clock_us: ClockUs = system_time_us) -> None:
        self.config = config
        self.topics = TopicNames(config.topic_prefix)
        self.counters = GatewayCounters()
        self.tracker = DeliveryTracker()
        self._clock_us = clock_us
        self._publisher = KafkaPublisher(config.kafka_client, config.producer_config)
        self._known_streams: set[str] = set()
        self._stream_lock = asyncio.Lock()
        self._connections: dict[str, set[ConnectionHandler]] = {}
        self._server: asyncio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._all_handlers: set[ConnectionHandler] = set()
        self._metrics: MetricsServer | None = None
        self._last_kafka_error: str | None = None
        self._last_delivery_us: int | None = None
        self.store = SourceInfoStore()
        self.timesync: TimeSyncServer | None = None
        reference_clock = config.reference_clock
        if reference_clock is None:
            reference_clock = EstimateMapping(self.store.get) if config.timesync is not None else IdentityMapping()
        self.pipeline = IngestPipeline(reference_clock, config.pipeline)
        self._progress: dict[str, StreamProgress] = {}
        self._progress_dirty: set[str] = set()
        self._acks_due: dict[tuple[str, str], int] = {}
        self._throttled: set[str] = set()
        # The most recent produce -> delivery-report latencies, for the metrics' percentiles.
        self._delivery_latencies_us: deque[int] = deque(maxlen=4096)
        self._publish_lock = asyncio.Lock()
        self._deadline_changed = asyncio.Event()
        self._kafka_blocked_at: float | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._ensure_base_topics)
        if self.config.timesync is not None:
            # Clock state survives a restart: sources map correctly before their next re-sync (their error bounds
            # have kept growing since their last sync, so the uncertainty stays honest).
            try:
                recovered = await loop.run_in_executor(
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
        self._server = await loop.create_server(lambda: ConnectionHandler(self), self.config.host, self.config.port,
                                                ssl=self.config.ssl_context, backlog=self.config.listen_backlog)
        self._tasks = [asyncio.create_task(self._poll_forever(), name="kafka-poll"),
                       asyncio.create_task(self._sweep_timeouts(), name="session-timeouts"),
                       asyncio.create_task(self._run_deadlines(), name="pipeline-deadlines"),
                       asyncio.create_task(self._checkpoint_progress(), name="progress-checkpoints")]
        if self.config.metrics_port is not None:
            self._metrics = MetricsServer(make_registry(self), self.health)
            await self._metrics.start(self.config.metrics_host, self.config.metrics_port)

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics is None else self._metrics.port

    def _on_clock_update(self, info: SourceInfo) -> None:
        now_us = self._clock_us()
        record = clock_state_record(info, now_us, self.store.max_rtt_us())
        with contextlib.suppress(QueueFull):
            self._publisher.produce(self.topics.sources, record.key, record.to_json(), None)

    @property
    def timesync_port(self) -> int | None:
        return None if self.timesync is None else self.timesync.address[1]

    def extra_counters(self) -> dict[str, float]:
        counters = self.pipeline.counters
        return {f"pipeline_{name}": float(getattr(counters, name)) for name in counters.__dataclass_fields__}

    def gauges(self) -> dict[str, float]:
        gauges = {"connections": float(len(self._all_handlers)), "kafka_pending": float(self._publisher.pending())}
        latencies = sorted(self._delivery_latencies_us)
        if latencies:
            gauges["kafka_delivery_p50_us"] = float(latencies[len(latencies) // 2])
            gauges["kafka_delivery_p99_us"] = float(latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)])
        return gauges

    def per_source_gauges(self) -> dict[str, dict[str, float]]:
        gauges: dict[str, dict[str, float]] = {
            source_id: {"connections": float(len(handlers))} for source_id, handlers in self._connections.items()}
        for source_id, held in self.pipeline.buffered().items():
            gauges.setdefault(source_id, {})["buffered_events"] = float(held)
        now_us = self._clock_us()
        for source_id, info in self.store.snapshot().items():
            gauges.setdefault(source_id, {}).update({
                "offset_us": float(info.offset_us), "rtt_us": float(info.rtt_us), "skew_ppm": info.skew_ppm,
                "error_bound_us": float(info.error_bound_us(now_us)), "sync_samples": float(info.sample_count)})
        return gauges

    def health(self) -> dict[str, Any]:
        status = "ok" if self._server is not None and self._server.is_serving() else "stopped"
        return {"status": status, "connections": len(self._all_handlers), "kafka_pending": self._publisher.pending(),
                "last_delivery_us": self._last_delivery_us, "last_kafka_error": self._last_kafka_error,
                "throttled_sources": sorted(self._throttled), "kafka_backpressure": self.kafka_backpressure_active}

    def _ensure_base_topics(self) -> None:
        ensure_topics(self.config.kafka_client, [self.topics.sources], config={"cleanup.policy": "compact"})

    async def stop(self, flush_timeout_s: float = 10.0, graceful: bool = True) -> None:
        """Stop taking events, let Kafka confirm what was published (acks still reach open connections), checkpoint,
        then close. Everything runs on the event loop: delivery callbacks never race the loop's own state.

        graceful=False drops every connection first, as a crash would: the clients never see the last acks and
        resend those events to the next gateway (which must recognise them)."""
        if self._server is not None:
            self._server.close()
        for handler in list(self._all_handlers):
            if graceful:
                handler.pause()
            else:
                handler.close()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._drain(flush_timeout_s)
        self._write_checkpoints()
        remaining = await self._drain(flush_timeout_s)
        if remaining:
            log.error("%d events still unconfirmed by Kafka at shutdown; clients will resend them", remaining)
        for handler in list(self._all_handlers):
            handler.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self._metrics is not None:
            await self._metrics.stop()
        if self.timesync is not None:
            await self.timesync.close()
        self._publisher.close()

    async def _drain(self, timeout_s: float) -> int:
        """Poll until connection workers are idle and librdkafka has no undelivered message; returns what is left."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while asyncio.get_running_loop().time() < deadline:
            self._publisher.poll(0)
            self._send_acks()
            if self._publisher.pending() == 0 and all(h.idle for h in self._all_handlers):
                break
            await asyncio.sleep(POLL_INTERVAL_S)
        return self._publisher.pending()

    async def _poll_forever(self) -> None:
        ticks = 0
        while True:
            self._publisher.poll(0)
            self._send_acks()
            ticks += 1
            if ticks % PRESSURE_CHECK_EVERY_TICKS == 0:
                self._check_buffer_pressure()
            await asyncio.sleep(POLL_INTERVAL_S)

    def _check_buffer_pressure(self) -> None:
        held = self.pipeline.buffered()
        total = sum(held.values())
        if not self._throttled and total > self.config.max_buffered_events:
            self.counters.global_pauses += 1
            self._throttled = set(held)
            log.warning("%d events buffered (limit %d): not reading %d sources that hold events", total,
                        self.config.max_buffered_events, len(self._throttled))
        elif self._throttled and total <= self.config.max_buffered_events // 2:
            self._throttled = set()
        else:
            return
        # Only when the throttled set changed (a connection that registers later is told in register()): walking
        # every handler every check cost 10,000 calls per 20 ms with 10,000 connections.
        for handler in list(self._all_handlers):
            handler.set_throttled(handler.session.source_id in self._throttled)

    @property
    def throttled_sources(self) -> frozenset[str]:
        return frozenset(self._throttled)

    def _send_acks(self) -> None:
        """One cumulative ack per (source, stream) per poll, however many deliveries it covers."""
        if not self._acks_due:
            return
        due, self._acks_due = self._acks_due, {}
        for (source_id, stream), acked in due.items():
            # One live connection of the source is enough: acks are cumulative per (source, stream) and the SDK
            # applies them pool-wide. Writing each ack to all of a pool's connections cost 10 writes per ack with
            # pools of 10 (100,000 writes/s at 10,000 events/s). If that connection dies with the ack unread, the
            # SDK resends what it carried and the gateway re-acks the duplicates.
            for handler in self._connections.get(source_id, ()):
                if handler.writable:
                    handler.send_bytes(encode_frame(messages.build_ack(stream, acked)))
                    break

    async def _sweep_timeouts(self) -> None:
        while True:
            await asyncio.sleep(TIMEOUT_SWEEP_INTERVAL_S)
            now_us = self._clock_us()
            for handler in list(self._all_handlers):
                handler.check_timeouts(now_us)

    async def ensure_streams(self, streams: tuple[str, ...]) -> None:
        missing = [s for s in streams if s not in self._known_streams]
        if not missing:
            return
        async with self._stream_lock:
            missing = [s for s in streams if s not in self._known_streams]
            topics = [t for s in missing for t in (self.topics.events(s), self.topics.late(s))]
            loop = asyncio.get_running_loop()
            created = set(await loop.run_in_executor(None, ensure_topics, self.config.kafka_client, topics))
            for stream in missing:
                if self.topics.events(stream) in created:
                    # A topic created just now is empty: nothing to recover (and its leader may not be known yet).
                    self._progress[stream] = StreamProgress(stream)
                    continue
                started = time.monotonic()
                progress = await loop.run_in_executor(
                    None, recover_stream, self.config.kafka_client, self.topics.sources,
                    self.topics.events(stream), stream)
                log.info("recovered stream %s in %.2f s: %d sources, from offset %d", stream,
                         time.monotonic() - started, len(progress.next_seq), progress.next_offset)
                self._progress[stream] = progress
                outputs: list[PipelineOutput] = []
                if progress.watermark_us is not None:
                    self.pipeline.restore_watermark(stream, progress.watermark_us)
                for source_id, next_seq in progress.next_seq.items():
                    self.pipeline.resume_from(source_id, stream, next_seq)
                    self.tracker.resume(source_id, stream, next_seq)
                    # The merge waits (bounded) for every source that was streaming before the restart.
                    outputs += self.pipeline.expect(source_id, stream, self._clock_us())
                await self.publish(outputs)
                self.counters.recovered_sources += len(progress.next_seq)
            self._known_streams.update(missing)

    def register(self, source_id: str, handler: ConnectionHandler) -> None:
        self._connections.setdefault(source_id, set()).add(handler)
        if source_id in self._throttled:
            handler.set_throttled(True)

    def unregister(self, source_id: str, handler: ConnectionHandler) -> None:
        handlers = self._connections.get(source_id)
        if handlers is not None:
            handlers.discard(handler)
            if not handlers:
                del self._connections[source_id]

    def register_source(self, source_id: str, streams: tuple[str, ...]) -> list[PipelineOutput]:
        return self.pipeline.register(source_id, streams, self._clock_us())

    def accept_events(self, source_id: str, events: tuple[messages.IncomingEvent, ...], arrival_ts_us: int,
                      origin: ConnectionHandler) -> list[PipelineOutput]:
        """Dedup, then the ordering pipeline; returns what is ready to publish, in order."""
        outputs: list[PipelineOutput] = []
        for event in events:
            self.counters.events_received += 1
            if not self.tracker.accept(source_id, event.stream, event.seq):
                self.counters.duplicates += 1
                acked = self.tracker.acked_through(source_id, event.stream)
                if acked is not None and acked >= event.seq:
                    origin.send_frame(messages.build_ack(event.stream, acked))
                continue
            outputs += self.pipeline.push(source_id, event, arrival_ts_us)
        self._wake_deadline_task()
        return outputs

    def accept_heartbeat(self, source_id: str, heartbeat: messages.Heartbeat) -> list[PipelineOutput]:
        self.counters.heartbeats += 1
        outputs = self.pipeline.heartbeat(source_id, heartbeat.next_seq, heartbeat.source_ts_us, self._clock_us())
        self._wake_deadline_task()
        return outputs

    async def publish(self, outputs: list[PipelineOutput]) -> None:
        """Produce in pipeline order; waits (and so stops reading sockets) while librdkafka's queue is full."""
        if not outputs:
            return
        async with self._publish_lock:
            for output in outputs:
                if isinstance(output, PublishRecord):
                    record = output.record
                    topic = self.topics.events(record.stream) if output.topic == "events" else self.topics.late(
                        record.stream)
                    await self._produce(topic, record.key, record.to_json(),
                                        self._delivery_callback(record, output.topic))
                else:
                    value = PunctuationRecord(output.stream, output.watermark_us, output.at_us).to_json()
                    self._progress[output.stream].promise(output.watermark_us)
                    self._progress_dirty.add(output.stream)
                    await self._produce(self.topics.events(output.stream), PUNCTUATION_KEY, value, None)

    def _delivery_callback(self, record: EventRecord, topic_kind: str) -> DeliveryCallback:
        source_id, stream, seq = record.source_id, record.stream, record.seq
        progress = self._progress[stream] if topic_kind == "events" else None
        released_us = record.release_ts_us  # stamped just before produce(): no second clock read per event

        def on_delivery(error: KafkaError | None, message: Message) -> None:
            self._delivery_latencies_us.append(self._clock_us() - released_us)
            if error is None and progress is not None:
                offset = message.offset()
                if offset is not None:
                    progress.observe(source_id, seq, offset)
                    self._progress_dirty.add(stream)
            self._on_delivery(source_id, stream, seq, error)

        return on_delivery

    async def _checkpoint_progress(self) -> None:
        while True:
            await asyncio.sleep(self.config.checkpoint_interval_s)
            self._write_checkpoints()

    def _write_checkpoints(self) -> None:
        dirty, self._progress_dirty = self._progress_dirty, set()
        for stream in dirty:
            # Best effort: a lost checkpoint only makes the next recovery scan a little longer.
            with contextlib.suppress(QueueFull):
                progress = self._progress[stream]
                self._publisher.produce(self.topics.sources, progress.key, progress.to_json(), None)

    async def _produce(self, topic: str, key: bytes, value: bytes, on_delivery: DeliveryCallback | None) -> None:
        while True:
            try:
                self._publisher.produce(topic, key, value, on_delivery)
                return
            except QueueFull:
                if not self.kafka_backpressure_active:
                    self.counters.kafka_stalls += 1
                self._kafka_blocked_at = time.monotonic()
                await asyncio.sleep(0.005)

    @property
    def kafka_backpressure_active(self) -> bool:
        """Kafka refused more events (queue full) within the last POST_STALL_GRACE_S seconds."""
        blocked_at = self._kafka_blocked_at
        return blocked_at is not None and time.monotonic() - blocked_at < POST_STALL_GRACE_S

    async def _run_deadlines(self) -> None:
        """Fires reorder gap timeouts and merge waits when the pipeline says they are due."""
        while True:
            self._deadline_changed.clear()
            deadline_us = self.pipeline.next_deadline_us()
            if deadline_us is None:
                await self._deadline_changed.wait()
                continue
            delay_s = (deadline_us - self._clock_us()) / 1e6
            if delay_s <= 0 and self.kafka_backpressure_active:
                # Due, but the sources may only look silent because Kafka stalled the gateway: wait it out.
                await asyncio.sleep(0.05)
                continue
            if delay_s > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay_s):
                        await self._deadline_changed.wait()
                continue
            await self.publish(self.pipeline.advance(self._clock_us()))

    def _wake_deadline_task(self) -> None:
        self._deadline_changed.set()

    def _on_delivery(self, source_id: str, stream: str, seq: int, error: KafkaError | None) -> None:
        if error is not None:
            self.counters.delivery_failures += 1
            self._last_kafka_error = str(error)
            self.tracker.failed(source_id, stream, seq)
            log.warning("Kafka refused %s/%s seq %d: %s", source_id, stream, seq, error)
            return
        self.counters.events_published += 1
        self._last_delivery_us = self._clock_us()
        acked = self.tracker.confirmed(source_id, stream, seq)
        if acked is not None:
            self._acks_due[(source_id, stream)] = acked


class ConnectionHandler(asyncio.Protocol):
    """One TCP connection: feeds the session and runs its actions in order on a worker task."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.session = GatewaySession(gateway.config.max_frame_bytes, authenticator=gateway.config.authenticator,
                                      timeouts=gateway.config.timeouts, now_us=gateway._clock_us())
        self.transport: asyncio.Transport | None = None
        self._queue: asyncio.Queue[tuple[int, list[SessionAction]]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._paused = False
        self._closing = False
        self._busy = False
        self._throttled = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.gateway.counters.connections_opened += 1
        self.gateway._all_handlers.add(self)
        self._worker = asyncio.create_task(self._run())

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        now_us = self.gateway._clock_us()
        self._enqueue(now_us, self.session.receive_data(data, now_us))

    def check_timeouts(self, now_us: int) -> None:
        if not self._closing:
            self._enqueue(now_us, self.session.check_timeouts(now_us))

    def _enqueue(self, now_us: int, actions: list[SessionAction]) -> None:
        if actions:
            self._queue.put_nowait((now_us, actions))
            if self._queue.qsize() >= MAX_PENDING_ACTIONS and not self._paused and self.transport is not None:
                self.transport.pause_reading()
                self._paused = True

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.connection_lost()
        self._closing = True
        self.gateway.counters.connections_closed += 1
        self.gateway._all_handlers.discard(self)
        if self.session.source_id is not None:
            self.gateway.unregister(self.session.source_id, self)
        if self._worker is not None:
            self._worker.cancel()

    def send_bytes(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    @property
    def writable(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def send_frame(self, message: dict[str, Any]) -> None:
        self.send_bytes(encode_frame(message))

    def close(self) -> None:
        self._closing = True
        if self.transport is not None:
            self.transport.close()

    def set_throttled(self, throttled: bool) -> None:
        if throttled == self._throttled or self.transport is None or self._closing:
            return
        self._throttled = throttled
        if throttled:
            self.transport.pause_reading()
        elif not self._paused:
            self.transport.resume_reading()

    def pause(self) -> None:
        """Shutdown: read nothing more; what was already read is still processed."""
        self._closing = True
        if self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True

    @property
    def idle(self) -> bool:
        return self._queue.empty() and not self._busy

    async def _run(self) -> None:
        while True:
            arrival_ts_us, actions = await self._queue.get()
            self._busy = True
            try:
                for action in actions:
                    await self._apply(action, arrival_ts_us)
            finally:
                self._busy = False
            if (self._paused and not self._closing and not self._throttled
                    and self._queue.qsize() < MAX_PENDING_ACTIONS // 2 and self.transport is not None):
                self.transport.resume_reading()
                self._paused = False

    async def _apply(self, action: SessionAction, arrival_ts_us: int) -> None:
        if isinstance(action, SourceRegistered):
            await self.gateway.ensure_streams(action.hello.streams)
            self.gateway.register(action.hello.source_id, self)
            await self.gateway.publish(self.gateway.register_source(action.hello.source_id, action.hello.streams))
        elif isinstance(action, SendBytes):
            self.send_bytes(action.data)
        elif isinstance(action, EventsReceived):
            await self.gateway.publish(self.gateway.accept_events(action.source_id, action.events, arrival_ts_us, self))
        elif isinstance(action, HeartbeatReceived):
            await self.gateway.publish(self.gateway.accept_heartbeat(action.source_id, action.heartbeat))
        elif isinstance(action, DrainRequested):
            # Acks for this source keep flowing to the source's other connections; this one can go.
            self.close()
        elif isinstance(action, CloseConnection):
            if action.error_code is not None:
                self.gateway.counters.count_error(action.error_code)
                log.warning("closing connection: %s", action.reason)
            self.close()
