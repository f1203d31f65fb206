"""The gateway's asyncio shell: connections, time sync, metrics and cluster membership around the shards it owns.

A deployment has S shards (contract.sharding.shard_of maps a source to one). Gateways join one cluster through
Kafka's group membership: every gateway is a member of the consumer group ``<prefix>.gateways`` subscribed to the
control topic ``<prefix>.cluster``, which has S partitions; the group coordinator assigns partition k — shard k —
to one live member and moves it when a member dies, joins or leaves. For each shard it owns, the gateway runs a
gateway.shard.ShardRuntime (its own IngestCore, transactional producer and tasks); the runtime's first transaction
writes an owner record (address, time-sync port) to partition k of the control topic, which every gateway reads to
redirect a source whose shard it does not own.

A connection's hello is routed by the source's shard: served here (welcome), redirected to the owner, or refused
with ``shard_unavailable`` while no gateway serves the shard (recovering, failing over); the SDK retries.

Tasks, each with a done-callback that logs, counts (`task_failures`) and reports it in /healthz (status "failing"):
  cluster-membership  follows the group's assignment and the owner directory; starts and stops shard runtimes
  session-timeouts    cuts off slow and silent peers
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import ssl
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field, fields
from functools import partial
from typing import Any

from confluent_kafka import KafkaException

from broker.client import KafkaClientConfig
from broker.cluster import ClusterConfigError, OwnerDirectory, claim_cluster, ensure_control_topic, ensure_partitions
from broker.membership import GroupMembership, SharesAssigned, SharesLost, SharesRevoked
from contract.records import OwnerRecord
from contract.sharding import shard_of
from contract.topics import TopicNames
from contract.wire import messages
from contract.wire.errors import SHARD_MOVED, SHARD_UNAVAILABLE, LocalProtocolError
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, encode_frame
from contract.wire.messages import MAX_STREAMS_PER_SOURCE
from gateway.acks import DEFAULT_MAX_SEQ_JUMP
from gateway.auth import SourceAuthenticator
from gateway.connection import (
    SLOW_READER_TIMEOUT_US,
    WORKER_STAGES,
    WRITE_BUFFER_MAX_BYTES,
    ConnectionHandler,
    WorkerStage,
)
from gateway.histograms import DELIVERY_LATENCY_BUCKETS_US, Histogram
from gateway.ingest import (
    CLOCK_STEP_HOLD_US,
    CLOCK_STEP_MAX_HELD,
    GATEWAY_PAUSE_US,
    IDLE_SOURCE_RETENTION_US,
    SOURCE_RETENTION_US,
    TAKEOVER_GRACE_US,
    ConnectionId,
    GatewayCounters,
    IngestConfig,
    IngestCore,
)
from gateway.logs import LIMITER as LOG_LIMITER
from gateway.logs import limited_log
from gateway.metrics import MetricsServer, make_registry
from gateway.native import (
    Core,
    NativeGatewaySession,
    native_delivery_runs,
    native_direct_producer,
    native_event_digests,
    native_produce_loop,
    native_record_builder,
    native_reference_mapping,
    resolve_core,
    with_core,
)
from gateway.scheduling import DEFAULT_LOOP_SLICE_US
from gateway.session import (
    EventsReceived,
    GatewaySession,
    HeartbeatReceived,
    SessionTimeouts,
    StreamRefused,
    TimeoutSweepClock,
)
from gateway.shard import ShardLost, ShardRuntime, ShardSettings
from gateway.tasks import SupervisedTasks
from reorder.pipeline import IngestPipeline, PipelineConfig
from timesync.clocks import (
    ClockUs,
    EstimateMapping,
    IdentityMapping,
    ReferenceErrorMapping,
    ReferenceMapping,
    system_time_us,
)
from timesync.refclock import ReferenceClockError, read_chrony_error_bound_us
from timesync.server import ServerConfig, TimeSyncServer, start_server
from timesync.store import SourceInfo, SourceInfoStore

__all__ = ["ClusterConfigError", "Gateway", "GatewayConfig"]

log = logging.getLogger(__name__)

TIMEOUT_SWEEP_INTERVAL_S = 0.5
MEMBERSHIP_POLL_INTERVAL_S = 0.05
# How long stop() waits for Kafka to confirm what was read: below the 10 s that docker stop and most supervisors
# grant between SIGTERM and SIGKILL, leaving the rest for closing connections and the producer.
STOP_FLUSH_TIMEOUT_S = 8.0
STOP_POLL_INTERVAL_S = 0.002
# A revoked shard's runtime gets this long to commit what it released before its connections are moved on: the
# new owner is waiting (it fences us when it starts anyway).
REVOKE_FLUSH_TIMEOUT_S = 2.0
# A hello for a shard being recovered here waits this long for it before the client is told to retry.
HELLO_ROUTE_WAIT_S = 10.0
# A source is redirected to the owner its shard's owner record names only if that gateway accepts a TCP connection:
# a killed owner keeps its record until the group's session timeout moves the shard, and every source sent there
# would come back for another redirect (a loop). Meanwhile the answer is shard_unavailable with retry_after_ms. One
# check per owner address at a time, its result kept this long, each bounded by the probe timeout.
OWNER_PROBE_TIMEOUT_S = 0.5
OWNER_PROBE_CACHE_S = 1.0
HELLO_ROUTE_POLL_S = 0.02
# start() waits for the group's assignment this much beyond one session timeout (a dead member's shards move then).
JOIN_WAIT_EXTRA_S = 10.0
# What a client is told to wait before retrying a shard nobody serves (failover in progress).
SHARD_UNAVAILABLE_RETRY_MS = 500
# After a runtime failed (fenced, aborted), a shard still assigned here is taken up again after this pause.
SHARD_RESTART_BACKOFF_S = 0.5
REFERENCE_ERROR_REFRESH_S = 16.0
IDLE_PUNCTUATION_INTERVAL_S = 1.0
STREAM_DISCOVERY_INTERVAL_S = 10.0


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
    # Events held in reorder buffers and merge queues, all sources together (gateway.ingest, rule 4); each shard
    # gets its share (limit / shards), so a gateway owning every shard holds at most this many.
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
    # -- the cluster (docs/cluster.md) --
    # S: fixed for the life of a deployment (the control topic and every stream's topics have S partitions).
    shards: int = 1
    # Name of the deployment: a second cluster configured on the same topic prefix is refused.
    cluster: str = "skewless"
    # This gateway in logs, owner records and redirects; default: advertised address + a random suffix.
    gateway_id: str | None = None
    # The address clients are redirected to; default: `host`, or this machine's name when `host` is a wildcard.
    advertised_host: str | None = None
    # Kafka static group membership (group.instance.id): a gateway restarted with the same id takes its shards back
    # at once instead of after the session timeout (but a clean stop hands them on only after it, too). None: the
    # gateway's advertised host:port when its port is fixed, else dynamic membership (a clean stop hands shards on
    # at once).
    instance_id: str | None = None
    # How long the group coordinator waits for a silent gateway before moving its shards (failover time).
    session_timeout_s: float = 6.0
    # Kafka transactions (fencing); False: idempotent producer only, safe with one gateway and no failover.
    transactions: bool = True
    # How often a shard commits its transaction; sources are acked at commits (docs/transactions-benchmark.md).
    commit_interval_s: float = 0.1
    # This host's clock against common time, added to every event's uncertainty_us: 0 when every gateway shares
    # one host's clock; a fixed bound; or chrony's own bound, re-read every REFERENCE_ERROR_REFRESH_S.
    reference_error_us: int = 0
    reference_error_from_chrony: bool = False
    # A stream a shard holds nothing of is punctuated this far behind the reference clock (gateway.ingest, rule
    # 10), so a quiet shard does not hold the stream's Spark watermark back; None: never.
    idle_punctuation_lag_s: float | None = 5.0
    # Sources silent for longer leave the progress checkpoints (gateway.ingest, rule 6).
    source_retention_us: int = SOURCE_RETENTION_US
    # After a takeover (or a restart) each recovered stream's merge waits this long for sources its checkpoint does
    # not name (gateway.ingest, rule 15); 0: not at all.
    takeover_grace_us: int = TAKEOVER_GRACE_US
    # Replicas of every topic the gateway creates; None: broker.admin's default, min(3, brokers).
    replication_factor: int | None = None
    # -- limits on what a source can make the gateway hold or create (docs/operations.md, "Limits") --
    # Streams one hello may name (the wire protocol's own bound is 64).
    max_streams_per_source: int = MAX_STREAMS_PER_SOURCE
    # Streams (two topics each) this gateway serves at most, created or not; None: no cap.
    max_streams: int | None = 1000
    # Only these streams may be named in a hello; None: any valid name.
    allowed_streams: frozenset[str] | None = None
    # A source with no connection that holds nothing is freed after this (gateway.ingest, rule 11).
    idle_source_retention_us: int = IDLE_SOURCE_RETENTION_US
    # A peer that does not read its socket (gateway.connection): bytes queued for it beyond this close it at once;
    # past the write high-water mark the gateway stops reading it, and closes it if it does not drain in time.
    write_buffer_max_bytes: int = WRITE_BUFFER_MAX_BYTES
    slow_reader_timeout_us: int = SLOW_READER_TIMEOUT_US
    # A seq more than this above its (source, stream)'s highest is refused with seq_jump (gateway.ingest, rule 13).
    max_seq_jump: int = DEFAULT_MAX_SEQ_JUMP
    # The per-event cores (gateway.native): "native" (Rust: the connection decoder, the sequence reorderers and the
    # record bytes), "python" (their executable specification), "auto" (native when the extension is built).
    core: str = "auto"
    # With the native core: plain records to librdkafka's C API on the producer's client (gateway.native).
    direct_produce: bool = True
    # The scheduler slice the event loop's thread asks for (gateway.scheduling); 0: the kernel's default.
    loop_slice_us: int = DEFAULT_LOOP_SLICE_US

    @property
    def kafka_client(self) -> KafkaClientConfig:
        return KafkaClientConfig(self.bootstrap_servers, self.kafka_settings)


def sum_counters(parts: list[GatewayCounters]) -> GatewayCounters:
    total = GatewayCounters()
    for part in parts:
        for spec in fields(GatewayCounters):
            setattr(total, spec.name, getattr(total, spec.name) + getattr(part, spec.name))
    return total


def _shard_ingest_config(config: GatewayConfig, core_name: Core) -> IngestConfig:
    """What each shard's ingest core runs with: ``config``'s settings, the event buffer split over the shards, and
    the per-event cores of ``core_name`` ('native' or 'python')."""
    return IngestConfig(
        pipeline=with_core(config.pipeline, core_name),
        max_buffered_events=max(1, config.max_buffered_events // config.shards),
        checkpoint_interval_us=round(config.checkpoint_interval_s * 1_000_000),
        clock_step_hold_us=config.clock_step_hold_us, clock_step_max_held=config.clock_step_max_held,
        gateway_pause_us=GATEWAY_PAUSE_US,  # the shard polls every 2 ms: a longer gap is the gateway's own pause
        source_retention_us=config.source_retention_us,
        idle_source_retention_us=config.idle_source_retention_us, max_seq_jump=config.max_seq_jump,
        takeover_grace_us=config.takeover_grace_us,
        record_builder=native_record_builder if core_name == "native" else None,
        event_digests=native_event_digests if core_name == "native" else None,
        reference_mapping=native_reference_mapping if core_name == "native" else None,
        delivery_runs=native_delivery_runs if core_name == "native" else None)


class Gateway:
    def __init__(self, config: GatewayConfig, clock_us: ClockUs = system_time_us) -> None:
        if config.shards < 1:
            raise ClusterConfigError(f"shards must be >= 1, got {config.shards}")
        self.config = config
        self.topics = TopicNames(config.topic_prefix)
        self._clock_us = clock_us
        self.store = SourceInfoStore()
        self.timesync: TimeSyncServer | None = None
        mapping = config.reference_clock
        if mapping is None:
            mapping = EstimateMapping(self.store.get) if config.timesync is not None else IdentityMapping()
        self.reference_error_us = config.reference_error_us
        self.reference_error_problem: str | None = None
        if config.reference_error_us or config.reference_error_from_chrony:
            mapping = ReferenceErrorMapping(mapping, lambda: self.reference_error_us)
        self._mapping = mapping
        self.core_name = resolve_core(config.core)
        self._session_type = NativeGatewaySession if self.core_name == "native" else GatewaySession
        self._ingest_config = _shard_ingest_config(config, self.core_name)
        # Every transactional commit of the shards this gateway served, kept here (not by a runtime, which a failed
        # shard replaces) so that the exposed histogram only grows.
        self.commit_durations = Histogram(DELIVERY_LATENCY_BUCKETS_US)
        self.gateway_id = config.gateway_id or ""
        self.instance_id: str | None = None
        self._server: asyncio.Server | None = None
        self._metrics: MetricsServer | None = None
        self._membership: GroupMembership | None = None
        self._directory: OwnerDirectory | None = None
        self._owners: dict[int, OwnerRecord] = {}
        self._shards: dict[int, ShardRuntime] = {}
        self._latest: dict[int, ShardRuntime] = {}  # the last runtime of each shard served here, for tests' reads
        self._starting: dict[int, asyncio.Task[None]] = {}
        self._restart_after: dict[int, float] = {}
        self._stopping_shards: set[asyncio.Task[None]] = set()
        self._shards_changed = asyncio.Event()
        self._connections: dict[ConnectionId, ConnectionHandler] = {}
        self._connections_by_source: dict[str, set[ConnectionHandler]] = {}
        self._last_connection_id = 0
        self._known_streams: set[str] = set()
        self._stream_lock = asyncio.Lock()
        self._tasks = SupervisedTasks(self._task_failed)
        self._failed_tasks: dict[str, str] = {}
        # Counters of the process (connections, sessions) and of shard runtimes that are gone: Prometheus counters
        # must not go down when a shard moves away.
        self._own_counters = GatewayCounters()
        self._retired_counters = GatewayCounters()
        self.shard_handovers = 0
        # Runtimes that ended because a newer owner fenced them: the normal end of a paused or cut-off owner.
        self.shards_fenced = 0
        # Hellos answered shard_unavailable because no live gateway was known to own the shard.
        self.owner_unavailable_answers = 0
        # Owner address -> (loop time checked, reachable), and the check in flight per address.
        self._owner_probes: dict[tuple[str, int], tuple[float, bool]] = {}
        self._owner_probing: dict[tuple[str, int], asyncio.Task[bool]] = {}
        self.last_shard_failure: str | None = None
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
    def advertised_host(self) -> str:
        if self.config.advertised_host:
            return self.config.advertised_host
        if self.config.host in ("0.0.0.0", "::", ""):
            return socket.gethostname()
        return self.config.host

    @property
    def metrics_port(self) -> int | None:
        return None if self._metrics is None else self._metrics.port

    @property
    def timesync_port(self) -> int | None:
        return None if self.timesync is None else self.timesync.address[1]

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.config.reference_error_from_chrony:
            try:
                self.reference_error_us = await loop.run_in_executor(None, read_chrony_error_bound_us)
            except ReferenceClockError as exc:
                raise ClusterConfigError(f"reference_clock_error = chrony, but {exc}") from exc
            self._start_task(self._follow_reference_error(), "reference-clock-error")
        await loop.run_in_executor(None, self._prepare_cluster)
        if self.config.timesync is not None:
            await self._start_timesync()
        self._server = await loop.create_server(self._new_connection, self.config.host, self.config.port,
                                                ssl=self.config.ssl_context, backlog=self.config.listen_backlog)
        if not self.gateway_id:
            self.gateway_id = f"{self.advertised_host}:{self.port}/{uuid.uuid4().hex[:8]}"
        client = self.config.kafka_client
        self._directory = OwnerDirectory(client, self.topics.cluster, self.config.shards)
        # A gateway on a fixed address is a static member by default: restarted (crash, upgrade) on the same address
        # it takes its shards back at once instead of after the session timeout. On port 0 it has no stable identity.
        self.instance_id = self.config.instance_id or (
            f"{self.advertised_host}:{self.port}" if self.config.port else None)
        self._membership = GroupMembership(
            client, self.topics.gateway_group, self.topics.cluster, instance_id=self.instance_id,
            session_timeout_ms=round(self.config.session_timeout_s * 1000))
        self._start_task(self._follow_membership(), "cluster-membership")
        if self.config.idle_punctuation_lag_s is not None:
            self._start_task(self._punctuate_idle_shards(), "idle-punctuation")
        self._start_task(self._sweep_timeouts(), "session-timeouts")
        if self.config.metrics_port is not None:
            self._metrics = MetricsServer(make_registry(self, self.labeled_counters), self.health)
            await self._metrics.start(self.config.metrics_host, self.config.metrics_port)
        await self._wait_settled(self.config.session_timeout_s + JOIN_WAIT_EXTRA_S)
        log.info("gateway %s joined cluster %s (%d shards) on prefix %s, serving shards %s (%s cores)",
                 self.gateway_id, self.config.cluster, self.config.shards, self.config.topic_prefix,
                 sorted(self._shards), self.core_name)

    async def _wait_settled(self, timeout_s: float) -> None:
        """Until the group gave this gateway its shards and it serves them, or every shard has an owner elsewhere
        (a gateway joining a full cluster may get none). Bounded: a gateway whose shards are still held by a dead
        member (until its session timeout) starts anyway and takes them when they come."""
        assert self._membership is not None
        membership = self._membership
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while loop.time() < deadline:
            owned = membership.owned()
            if owned and all(k in self._shards and self._shards[k].serving for k in owned):
                return
            if not owned and len(self._owners) == self.config.shards:
                return
            self._shards_changed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(HELLO_ROUTE_POLL_S * 5):
                    await self._shards_changed.wait()
        log.warning("gateway %s: no shard served %.1f s after joining; serving them as they come", self.gateway_id,
                    timeout_s)

    def _prepare_cluster(self) -> None:
        """The control topic with S partitions, this deployment's claim on the prefix, the sources topic."""
        client = self.config.kafka_client
        ensure_control_topic(client, self.topics.cluster, self.config.shards,
                             replication_factor=self.config.replication_factor)
        claim_cluster(client, self.topics.cluster, self.config.cluster, self.config.shards, self._clock_us())
        ensure_partitions(client, [self.topics.sources], self.config.shards, config={"cleanup.policy": "compact"},
                          replication_factor=self.config.replication_factor)

    async def _start_timesync(self) -> None:
        assert self.config.timesync is not None
        self.timesync = await start_server(self.config.timesync, store=self.store)
        if self._clock_us is system_time_us:
            # One reference clock for sync replies and gateway stamps (so --clock-offset-us shifts both).
            self._clock_us = self.timesync.clock.now_us
        self.store.add_listener(self._on_clock_update)

    async def wait_serving(self, shards: set[int] | None = None, timeout_s: float = 60.0) -> None:
        """Until this gateway serves ``shards`` (default: all of them); tests and single-gateway tools use it."""
        wanted = set(range(self.config.shards)) if shards is None else shards
        async with asyncio.timeout(timeout_s):
            while not all(k in self._shards and self._shards[k].serving for k in wanted):
                self._shards_changed.clear()
                await self._shards_changed.wait()

    async def stop(self, flush_timeout_s: float = STOP_FLUSH_TIMEOUT_S, graceful: bool = True) -> None:
        """Stop taking events, let Kafka commit what was read (acks still reach open connections), checkpoint, leave
        the group (the shards move at once), then close.

        graceful=False drops every connection first, as a crash would: the clients never see the last acks and
        resend those events to the next gateway (which must recognise them)."""
        if self._server is not None:
            self._server.close()
        for handler in list(self._connections.values()):
            if graceful:
                handler.pause()
            else:
                handler.close()
        for task in self._tasks:
            await _cancel(task)
        for task in list(self._starting.values()):
            await _cancel(task)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + flush_timeout_s
        # What connections already read is still published: their workers finish first (one shared budget).
        while graceful and loop.time() < deadline and not all(h.idle for h in self._connections.values()):  # noqa: ASYNC110 - no event says "every worker idle"
            await asyncio.sleep(STOP_POLL_INTERVAL_S)
        remaining = 0
        for shard, runtime in sorted(self._shards.items()):
            try:
                # Even when the connections were dropped (graceful=False), what the core released is committed:
                # the clients, who never saw those acks, resend it to the next owner, which must recognise it.
                remaining += await runtime.stop(max(0.0, deadline - loop.time()))
            except Exception:
                log.exception("shard %d: stop failed", shard)
            self._retire(runtime)
        self._shards.clear()
        if remaining:
            log.error("%d events still unconfirmed by Kafka at shutdown; clients will resend them", remaining)
        if self._stopping_shards:
            await asyncio.wait(self._stopping_shards)
        for handler in list(self._connections.values()):
            handler.close()
        if self._server is not None:
            await self._server.wait_closed()
        if self._membership is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._membership.close)
        if self._directory is not None:
            self._directory.close()
        if self._metrics is not None:
            await self._metrics.stop()
        if self.timesync is not None:
            await self.timesync.close()

    # -- tasks --------------------------------------------------------------------------------------------------

    def _start_task(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return self._tasks.start(coroutine, name)

    def _task_failed(self, task: asyncio.Task[None], error: BaseException) -> None:
        log.error("gateway task %s died: %r", task.get_name(), error, exc_info=error)
        self._own_counters.task_failures += 1
        self._failed_tasks[task.get_name()] = repr(error)

    async def _follow_reference_error(self) -> None:
        """chrony's bound moves with its measurements: re-read it; an unreadable one keeps the last (logged, and
        shown in /healthz)."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(REFERENCE_ERROR_REFRESH_S)
            try:
                self.reference_error_us = await loop.run_in_executor(None, read_chrony_error_bound_us)
                self.reference_error_problem = None
            except ReferenceClockError as exc:
                if self.reference_error_problem is None:
                    log.warning("keeping the last reference clock error bound (%d us): %s", self.reference_error_us,
                                exc)
                self.reference_error_problem = str(exc)

    async def _punctuate_idle_shards(self) -> None:
        """Every second, every owned shard punctuates the deployment's streams it holds nothing of (rule 10). The
        streams are the events topics under the prefix (listed every STREAM_DISCOVERY_INTERVAL_S) plus those
        sources named here."""
        assert self.config.idle_punctuation_lag_s is not None
        lag_us = round(self.config.idle_punctuation_lag_s * 1_000_000)
        loop = asyncio.get_running_loop()
        discovered: set[str] = set()
        next_discovery_s = 0.0
        while True:
            await asyncio.sleep(IDLE_PUNCTUATION_INTERVAL_S)
            if loop.time() >= next_discovery_s:
                next_discovery_s = loop.time() + STREAM_DISCOVERY_INTERVAL_S
                try:
                    discovered = await loop.run_in_executor(None, self._list_streams)
                except KafkaException as exc:
                    log.warning("could not list the deployment's streams: %s", exc)
            streams = discovered | self._known_streams
            if not streams:
                continue
            for runtime in list(self._shards.values()):
                with contextlib.suppress(ShardLost):  # its failure path gives it up
                    await runtime.punctuate_idle(streams, lag_us)

    def _list_streams(self) -> set[str]:
        prefix = f"{self.topics.prefix}.events."
        topics = self.config.kafka_client.admin().list_topics(timeout=10).topics
        return {name.removeprefix(prefix) for name in topics if name.startswith(prefix)}

    async def _sweep_timeouts(self) -> None:
        sweep_clock = TimeoutSweepClock()
        while True:
            await asyncio.sleep(TIMEOUT_SWEEP_INTERVAL_S)
            judged_us = sweep_clock.judging_time(self._clock_us())
            if judged_us is None:
                continue
            for handler in list(self._connections.values()):
                handler.check_timeouts(judged_us)

    async def _follow_membership(self) -> None:
        """The group's assignment is the truth: shards assigned here get a runtime, shards taken away lose theirs,
        a runtime that failed is replaced while its shard stays here."""
        assert self._membership is not None and self._directory is not None
        membership, directory = self._membership, self._directory
        loop = asyncio.get_running_loop()
        while True:
            for change in membership.poll():
                if isinstance(change, SharesRevoked):
                    for shard in sorted(change.partitions):
                        self._give_up(shard, "revoked by the group coordinator", graceful=True)
                elif isinstance(change, SharesLost):
                    self._lost(change.partitions)
                elif isinstance(change, SharesAssigned):
                    log.info("gateway %s: assigned shards %s", self.gateway_id, sorted(change.partitions))
            self._owners = directory.poll()
            self._give_up_shards_owned_elsewhere(membership.owned())
            now_s = loop.time()
            for shard in sorted(membership.owned()):
                if shard in self._shards or shard in self._starting:
                    continue
                if self._restart_after.get(shard, 0.0) > now_s:
                    continue
                self._starting[shard] = asyncio.create_task(self._take(shard), name=f"take-shard-{shard}")
            await asyncio.sleep(MEMBERSHIP_POLL_INTERVAL_S)

    def _lost(self, shards: frozenset[int]) -> None:
        """The consumer lost contact with the group coordinator for a session timeout (Kafka unreachable, or this
        process paused). With transactions the shards are kept: if another gateway took them over, it fenced this
        one, and the next commit says so; if Kafka was only away, nothing moved and the sources were never cut off.
        Without fencing, a lost shard must be given up at once."""
        if self.config.transactions:
            log.warning("gateway %s: group membership lost for shards %s; serving them until fenced or reassigned",
                        self.gateway_id, sorted(shards))
            return
        for shard in sorted(shards):
            self._give_up(shard, "group membership lost (no fencing without transactions)", graceful=False)

    def _give_up_shards_owned_elsewhere(self, owned: frozenset[int]) -> None:
        """A shard kept after a lost membership, now assigned elsewhere: its new owner's record is newer than this
        runtime. An idle runtime would learn of its fencing only at its next commit."""
        for shard, runtime in list(self._shards.items()):
            if shard in owned:
                continue
            owner = self._owners.get(shard)
            if owner is not None and owner.gateway_id != self.gateway_id and owner.since_us > runtime.started_us:
                self.shards_fenced += 1  # superseded like a fenced one (its next commit would be): INFO, counted
                self._give_up(shard, f"now owned by {owner.gateway_id}", graceful=False)

    async def _take(self, shard: int) -> None:
        runtime = ShardRuntime(
            ShardSettings(shard=shard, topics=self.topics, kafka_client=self.config.kafka_client,
                          producer_config=self.config.producer_config, ingest=self._ingest_config,
                          transactional=self.config.transactions, commit_interval_s=self.config.commit_interval_s,
                          produce_loop=native_produce_loop if self.core_name == "native" else None,
                          direct_produce=(native_direct_producer if self.core_name == "native"
                                          and self.config.direct_produce else None),
                          commit_durations=self.commit_durations),
            self._mapping, self.store, self, self._clock_us, owner_record=self._owner_record(shard))
        started_s = time.monotonic()
        try:
            await runtime.start()
        except Exception as exc:  # noqa: BLE001 - whatever stopped the takeover, the shard is tried again
            log.warning("shard %d: could not take it over: %s", shard, exc)
            self.last_shard_failure = f"shard {shard}: {exc}"
            self._restart_after[shard] = asyncio.get_running_loop().time() + SHARD_RESTART_BACKOFF_S
            with contextlib.suppress(Exception):
                await runtime.stop(0.0, graceful=False)
            return
        finally:
            self._starting.pop(shard, None)
        if self._membership is None or shard not in self._membership.owned():
            await runtime.stop(REVOKE_FLUSH_TIMEOUT_S)
            return
        self._shards[shard] = runtime
        self._latest[shard] = runtime
        self._shards_changed.set()
        log.info("gateway %s serves shard %d (took %.2f s)", self.gateway_id, shard, time.monotonic() - started_s)

    def _owner_record(self, shard: int) -> tuple[str, bytes, bytes]:
        record = OwnerRecord(shard=shard, gateway_id=self.gateway_id, host=self.advertised_host, port=self.port,
                             timesync_port=self.timesync_port, since_us=self._clock_us())
        return self.topics.cluster, record.key, record.to_json()

    def _give_up(self, shard: int, reason: str, graceful: bool) -> None:
        """Stop serving a shard: its connections are told `shard_moved` (their clients go through their address list
        and are redirected to the new owner) once its runtime committed what it could."""
        starting = self._starting.pop(shard, None)
        if starting is not None:
            starting.cancel()
        runtime = self._shards.pop(shard, None)
        if runtime is None:
            return
        self.shard_handovers += 1
        log.info("gateway %s gives up shard %d: %s", self.gateway_id, shard, reason)
        runtime.serving = False
        for source_id, handlers in self._connections_by_source.items():
            if shard_of(source_id, self.config.shards) == shard:
                for handler in handlers:
                    handler.pause()  # what they sent is committed and acked first, then they move on
        task = asyncio.create_task(self._stop_runtime(runtime, graceful), name=f"stop-shard-{shard}")
        self._stopping_shards.add(task)
        task.add_done_callback(self._stopping_shards.discard)

    async def _stop_runtime(self, runtime: ShardRuntime, graceful: bool) -> None:
        try:
            await runtime.stop(REVOKE_FLUSH_TIMEOUT_S if graceful else 0.0, graceful=graceful)
        except Exception:
            log.exception("shard %d: stop failed", runtime.shard)
        finally:
            self._retire(runtime)
            self._move_sources_of(runtime.shard)

    def _retire(self, runtime: ShardRuntime) -> None:
        self._retired_counters = sum_counters([self._retired_counters, runtime.core.counters])

    def _move_sources_of(self, shard: int) -> None:
        for source_id, handlers in list(self._connections_by_source.items()):
            if shard_of(source_id, self.config.shards) != shard or self._serving(source_id) is not None:
                continue
            for handler in list(handlers):
                self._moved(handler)

    # -- what shard runtimes ask (gateway.shard.ShardHost) ------------------------------------------------------

    def send_to_source(self, source_id: str, data: bytes) -> None:
        # One live connection of the source is enough. If that connection dies with the ack unread, the SDK
        # resends what it carried and the core re-acks the duplicates.
        for handler in self._connections_by_source.get(source_id, ()):
            if handler.writable:
                handler.send_bytes(data)
                break

    def send_frame(self, connection: ConnectionId, data: bytes) -> None:
        handler = self._connections.get(connection)
        if handler is not None:
            handler.send_bytes(data)

    def set_throttled(self, source_id: str, throttled: bool) -> None:
        for handler in self._connections_by_source.get(source_id, ()):
            handler.set_throttled(throttled)

    def shard_failed(self, shard: int, reason: str) -> None:
        runtime = self._shards.get(shard)
        if runtime is not None and runtime.fenced:
            self.shards_fenced += 1  # a newer owner took it over: counted and logged (INFO), not a failure
        self.last_shard_failure = f"shard {shard}: {reason}"
        self._restart_after[shard] = asyncio.get_running_loop().time() + SHARD_RESTART_BACKOFF_S
        self._give_up(shard, reason, graceful=False)

    # -- routing ------------------------------------------------------------------------------------------------

    def _serving(self, source_id: str) -> ShardRuntime | None:
        runtime = self._shards.get(shard_of(source_id, self.config.shards))
        return runtime if runtime is not None and runtime.serving else None

    def _on_clock_update(self, info: SourceInfo) -> None:
        runtime = self._serving(info.source_id)
        if runtime is not None:
            runtime.clock_changed(info, self.store.max_rtt_us())

    # -- what connections ask (gateway.connection.ConnectionOwner) ----------------------------------------------

    def _new_connection(self) -> ConnectionHandler:
        session = self._session_type(self.config.max_frame_bytes, authenticator=self.config.authenticator,
                                 timeouts=self.config.timeouts, now_us=self._clock_us(),
                                 max_streams_per_source=self.config.max_streams_per_source,
                                 allowed_streams=self.config.allowed_streams)
        return ConnectionHandler(self, session, self._clock_us,
                                 write_buffer_max_bytes=self.config.write_buffer_max_bytes,
                                 slow_reader_timeout_us=self.config.slow_reader_timeout_us)

    def attach(self, connection: ConnectionHandler) -> ConnectionId:
        self._last_connection_id += 1
        connection_id = ConnectionId(self._last_connection_id)
        self._connections[connection_id] = connection
        self._own_counters.connections_opened += 1
        return connection_id

    def detach(self, connection: ConnectionHandler) -> None:
        self._own_counters.connections_closed += 1
        self._connections.pop(connection.connection_id, None)
        source_id = connection.source_id
        if source_id is None:
            return
        handlers = self._connections_by_source.get(source_id)
        if handlers is not None:
            handlers.discard(connection)
            if not handlers:
                del self._connections_by_source[source_id]
                runtime = self._serving(source_id)
                if runtime is not None:  # rule 11: freed after the idle retention unless it comes back
                    runtime.core.source_disconnected(source_id, self._clock_us())
                return
            # The source's latest acks may have gone to this connection unread: its other connections get them
            # again (the SDK resends only what a lost connection carried, not events acked on it).
            runtime = self._serving(source_id)
            if runtime is not None:
                for ack in runtime.core.current_acks(source_id):
                    self.send_to_source(ack.source_id, ack.data)

    async def register_source(self, connection: ConnectionHandler, hello: messages.Hello) -> None:
        shard = shard_of(hello.source_id, self.config.shards)
        runtime = await self._runtime_for_hello(shard)
        if runtime is None:
            await self._route_elsewhere(connection, shard)
            return
        try:
            created = await self._ensure_stream_topics(hello.streams)
        except StreamRefused as refusal:
            self._own_counters.count_error(StreamRefused.code)
            limited_log(log, logging.WARNING, "stream-cap", "refused source %s: %s", hello.source_id, refusal)
            connection.send_bytes(encode_frame(messages.build_error(StreamRefused.code, str(refusal), fatal=True)))
            connection.close(after_error=True)
            return
        self._connections_by_source.setdefault(hello.source_id, set()).add(connection)
        with self._core_call(runtime):
            await runtime.register_source(hello.source_id, hello.streams, created)
        # clock_known: this gateway maps the source's events with the estimate it holds (after a failover, the one
        # restored from the shard's clock state), so the SDK resends at once and syncs beside (docs/cluster.md).
        connection.send_bytes(encode_frame(messages.build_welcome(
            self.config.max_frame_bytes, gateway_id=self.gateway_id, shard=shard, timesync_port=self.timesync_port,
            clock_known=self.config.timesync is not None and self.store.get(hello.source_id) is not None)))

    async def _runtime_for_hello(self, shard: int) -> ShardRuntime | None:
        """The runtime serving ``shard`` here, waiting (bounded) while it is being taken over here or while nobody
        is known to own it (a gateway just started, a failover in progress); None: route the source elsewhere."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HELLO_ROUTE_WAIT_S
        while True:
            runtime = self._shards.get(shard)
            if runtime is not None and runtime.serving:
                return runtime
            starting = self._starting.get(shard)
            if starting is not None:
                with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                    async with asyncio.timeout(max(0.0, deadline - loop.time())):
                        await asyncio.shield(starting)
                continue_waiting = loop.time() < deadline
            else:
                owner = self._owners.get(shard)
                owned_here = self._membership is not None and shard in self._membership.owned()
                if (owner is not None and owner.gateway_id != self.gateway_id and not owned_here
                        and await self._owner_reachable(owner.host, owner.port)):
                    return None
                # A recorded owner that refuses connections is dead: the hello waits here for its successor (its
                # owner record, or the shard assigned here) like one for a shard nobody owns yet, so the source is
                # redirected the moment the new owner serves, not after a retry_after_ms round trip.
                continue_waiting = loop.time() < deadline
                if continue_waiting:
                    await asyncio.sleep(HELLO_ROUTE_POLL_S)
            if not continue_waiting:
                return None

    async def _route_elsewhere(self, connection: ConnectionHandler, shard: int) -> None:
        owner = self._owners.get(shard)
        if (owner is not None and owner.gateway_id != self.gateway_id
                and await self._owner_reachable(owner.host, owner.port)):
            frame = messages.build_redirect(shard=shard, gateway_id=owner.gateway_id, host=owner.host,
                                            port=owner.port, timesync_port=owner.timesync_port)
        else:
            self.owner_unavailable_answers += 1
            frame = messages.build_error(
                SHARD_UNAVAILABLE, f"no gateway serves shard {shard} right now (failover in progress)", fatal=True,
                retry_after_ms=SHARD_UNAVAILABLE_RETRY_MS)
        connection.send_bytes(encode_frame(frame))
        connection.close(after_error=True)

    async def _owner_reachable(self, host: str, port: int) -> bool:
        """Whether the gateway at ``host:port`` accepts a TCP connection (checked at most once per
        OWNER_PROBE_CACHE_S): a dead owner's record must not send sources into a redirect loop."""
        key = (host, port)
        loop = asyncio.get_running_loop()
        cached = self._owner_probes.get(key)
        if cached is not None and loop.time() - cached[0] < OWNER_PROBE_CACHE_S:
            return cached[1]
        probing = self._owner_probing.get(key)
        if probing is None:
            probing = self._owner_probing[key] = asyncio.create_task(_accepts_connections(host, port),
                                                                     name=f"owner-probe-{host}:{port}")
            probing.add_done_callback(lambda _task: self._owner_probing.pop(key, None))
        reachable = await asyncio.shield(probing)
        self._owner_probes[key] = (loop.time(), reachable)
        if not reachable and (cached is None or cached[1]):
            log.info("gateway %s: the owner at %s:%d does not accept connections: its shards' sources are told "
                     "shard_unavailable until the group moves them", self.gateway_id, host, port)
        return reachable

    def _moved(self, connection: ConnectionHandler) -> None:
        connection.send_bytes(encode_frame(messages.build_error(
            SHARD_MOVED, "this gateway no longer serves the source's shard", fatal=True)))
        connection.close(after_error=True)

    def receive_events(self, connection: ConnectionHandler, received: EventsReceived,
                       arrival_us: int) -> Coroutine[Any, Any, None] | None:
        runtime = self._serving(received.source_id)
        if runtime is None:
            self._moved(connection)
            return None
        # Per frame: _core_call's handling inline (a generator-based context manager cost more than the call's own
        # Python around the native core at a few events per frame). The wait returned, if any, raises only
        # ShardLost (the producer task failed, and reports it).
        try:
            return runtime.receive_events(connection.connection_id, received.source_id, received.events, arrival_us)
        except ShardLost:
            raise
        except Exception as exc:
            self._core_raised(runtime, exc)
            raise

    async def receive_heartbeat(self, received: HeartbeatReceived) -> None:
        runtime = self._serving(received.source_id)
        if runtime is None:
            for handler in list(self._connections_by_source.get(received.source_id, ())):
                self._moved(handler)
            return
        # Answered at once with the source's cumulative acks (whatever Kafka's pace): how the SDK knows this gateway
        # is alive (its liveness timeout, docs/sdk.md); a repeated cumulative ack changes nothing there.
        for ack in runtime.core.current_acks(received.source_id):
            self.send_to_source(ack.source_id, ack.data)
        with self._core_call(runtime):
            await runtime.receive_heartbeat(received.source_id, received.heartbeat)

    async def source_left(self, source_id: str) -> None:
        """A connection of the source said bye (issue 25 item 7): its shard's merge stops waiting for it once every
        connection the source has open said bye. A pool's connections are separate TCP streams with no order between
        them: one's bye may be read before another's last events, which the merge would then send late (review B7).
        One that closes without a bye leaves the rest to the merge's wait, as any disconnection does."""
        if not all(handler.said_bye for handler in self._connections_by_source.get(source_id, ())):
            return
        runtime = self._serving(source_id)
        if runtime is None:
            return
        with self._core_call(runtime):
            await runtime.source_left(source_id)

    @contextlib.contextmanager
    def _core_call(self, runtime: ShardRuntime) -> Iterator[None]:
        """Around a core call made for a connection. The core raising (a bug) leaves that shard's core unusable:
        records it had released in the call are lost with it, and the seqs it had accepted are never confirmed.
        The shard is given up and taken up again from what Kafka committed (its open transaction, with whatever
        the broken call released, is aborted); its sources are moved on, reconnect and resend what was not
        acknowledged. Counted (`task_failures`) and shown in /healthz (`last_shard_failure`)."""
        try:
            yield
        except ShardLost:
            raise
        except Exception as exc:
            self._core_raised(runtime, exc)
            raise

    def _core_raised(self, runtime: ShardRuntime, exc: Exception) -> None:
        log.exception("shard %d: the ingest core raised; the shard restarts from Kafka", runtime.shard)
        self._own_counters.task_failures += 1
        runtime.fail(f"the ingest core raised {exc!r}")

    def session_failed(self, error_code: str) -> None:
        self._own_counters.count_error(error_code)

    def slow_reader_closed(self, connection: ConnectionHandler, reason: str) -> None:
        self._own_counters.slow_readers_closed += 1
        limited_log(log, logging.WARNING, "slow-reader", "closed connection %d (source %s, peer %s): %s",
                    connection.connection_id, connection.source_id, connection.peer, reason)

    def worker_failed(self, connection: ConnectionHandler, stage: WorkerStage, error: BaseException) -> None:
        if isinstance(error, ShardLost):
            self._moved(connection)
            return
        # One connection's failure is not the gateway's: /healthz stays "ok" unless a gateway task died too.
        log.error("connection %d (source %s, peer %s) failed at stage %s, closing it: %r", connection.connection_id,
                  connection.source_id, connection.peer, stage, error, exc_info=error)
        self.worker_errors[stage] += 1
        self._last_connection_failure = f"source {connection.source_id} ({stage}): {error!r}"
        # Told why before the close, so the client does not take it for a network fault.
        connection.send_bytes(encode_frame(messages.build_error(
            LocalProtocolError.code,
            f"the gateway failed processing this connection ({stage}): {type(error).__name__}", fatal=True)))

    def known_sources(self) -> set[str]:
        """Every source this gateway holds state for: connected, or registered in a served shard's core."""
        known = set(self._connections_by_source)
        for runtime in self._shards.values():
            known |= runtime.core.known_sources()
        return known

    async def _ensure_stream_topics(self, streams: tuple[str, ...]) -> frozenset[str]:
        """Create the topics of streams not seen yet, S partitions each; returns the streams created just now.
        StreamRefused when they would take this gateway past ``max_streams``."""
        if all(s in self._known_streams for s in streams):
            return frozenset()
        async with self._stream_lock:
            missing = [s for s in streams if s not in self._known_streams]
            if not missing:
                return frozenset()
            cap = self.config.max_streams
            if cap is not None and len(self._known_streams) + len(missing) > cap:
                # Before any topic is created: a source inventing stream names creates nothing past the cap.
                raise StreamRefused(f"streams {missing} would take this gateway past its cap of {cap} streams "
                                    f"(max_streams); it serves {len(self._known_streams)}")
            topics = [t for s in missing for t in (self.topics.events(s), self.topics.late(s))]
            created = set(await asyncio.get_running_loop().run_in_executor(
                None, partial(ensure_partitions, self.config.kafka_client, topics, self.config.shards,
                              replication_factor=self.config.replication_factor)))
            self._known_streams.update(missing)
            return frozenset(s for s in missing if self.topics.events(s) in created)

    # -- what the metrics server, /healthz and tests read -------------------------------------------------------

    @property
    def shards(self) -> dict[int, ShardRuntime]:
        return dict(self._shards)

    @property
    def core(self) -> IngestCore:
        """The core of the one shard this gateway serves, or last served (single-shard deployments and tests)."""
        if len(self._shards) == 1:
            return next(iter(self._shards.values())).core
        if not self._shards and len(self._latest) == 1:
            return next(iter(self._latest.values())).core
        raise LookupError(f"gateway {self.gateway_id} serves {len(self._shards)} shards, not exactly one")

    @property
    def counters(self) -> GatewayCounters:
        return sum_counters([self._own_counters, self._retired_counters,
                             *(runtime.core.counters for runtime in self._shards.values())])

    @property
    def pipeline(self) -> IngestPipeline:
        return self.core.pipeline

    @property
    def throttled_sources(self) -> frozenset[str]:
        return frozenset().union(*(runtime.core.throttled_sources for runtime in self._shards.values()))

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def connections_of(self, source_id: str) -> tuple[ConnectionHandler, ...]:
        """The registered connections of a source (a pool has several)."""
        return tuple(self._connections_by_source.get(source_id, ()))

    def histograms(self) -> dict[str, Histogram]:
        return {"transaction_commit": self.commit_durations}

    def labeled_counters(self) -> dict[str, tuple[str, dict[str, float]]]:
        return {"worker_errors": ("stage", {stage: float(n) for stage, n in self.worker_errors.items()})}

    def extra_counters(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for runtime in self._shards.values():
            counters = runtime.core.pipeline.counters
            for name in counters.__dataclass_fields__:
                totals[f"pipeline_{name}"] = totals.get(f"pipeline_{name}", 0.0) + float(getattr(counters, name))
        totals["shard_handovers"] = float(self.shard_handovers)
        totals["shards_fenced"] = float(self.shards_fenced)
        totals["owner_unavailable_answers"] = float(self.owner_unavailable_answers)
        totals["log_lines_suppressed"] = float(LOG_LIMITER.suppressed_total)
        return totals

    def gauges(self) -> dict[str, float]:
        # Delivery latency is a Histogram the collector reads from the shards' cores (gateway.metrics).
        return {"connections": float(len(self._connections)),
                "kafka_pending": float(sum(runtime.pending() for runtime in self._shards.values())),
                "shards_served": float(sum(1 for runtime in self._shards.values() if runtime.serving))}

    def per_source_gauges(self) -> dict[str, dict[str, float]]:
        gauges: dict[str, dict[str, float]] = {
            source_id: {"connections": float(len(handlers))}
            for source_id, handlers in self._connections_by_source.items()}
        for runtime in self._shards.values():
            for source_id, held in runtime.core.pipeline.buffered().items():
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
        now_us = self._clock_us()
        runtimes = list(self._shards.values())
        last_delivery = [r.core.last_delivery_us for r in runtimes if r.core.last_delivery_us is not None]
        last_error = [r.core.last_kafka_error for r in runtimes if r.core.last_kafka_error is not None]
        return {"status": status, "gateway_id": self.gateway_id, "instance_id": self.instance_id,
                "cluster": self.config.cluster,
                "shards": self.config.shards, "pid": os.getpid(),
                "serving_shards": sorted(k for k, r in self._shards.items() if r.serving),
                "starting_shards": sorted(self._starting), "shard_handovers": self.shard_handovers,
                "takeover_windows_open_ms": {str(k): (until_us - now_us + 999) // 1000
                                             for k, r in sorted(self._shards.items())
                                             if (until_us := r.core.takeover_window_holds_until_us()) is not None},
                "last_shard_failure": self.last_shard_failure,
                "connections": len(self._connections),
                "kafka_pending": sum(r.pending() for r in runtimes),
                "last_delivery_us": max(last_delivery) if last_delivery else None,
                "last_kafka_error": last_error[-1] if last_error else None,
                "throttled_sources": sorted(self.throttled_sources),
                "kafka_backpressure": any(r.core.kafka_stalled(now_us) for r in runtimes),
                "reference_clock_error_us": self.reference_error_us,
                "reference_clock_problem": self.reference_error_problem,
                "failed_tasks": dict(self._failed_tasks), "last_connection_failure": self._last_connection_failure}


async def _accepts_connections(host: str, port: int) -> bool:
    try:
        async with asyncio.timeout(OWNER_PROBE_TIMEOUT_S):
            _reader, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


async def _cancel(task: asyncio.Task[None]) -> None:
    # Waited for, not awaited: awaiting a task that already died re-raises its error, which _task_done has logged.
    task.cancel()
    await asyncio.wait([task])
