"""Async client SDK for event sources: time sync, a pool of connections, per-stream seqs, acks, resend.

The logic lives in the sans-IO core (``clients.core``: seqs, the unacked store, batching, pool scheduling,
backoff, idleness; ``clients.spool``: the file spool); this module is the asyncio shell that moves bytes and owns
the background tasks (one sender, one supervisor per pool connection, the time-sync re-sync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl as ssl_module
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import msgpack

from clients.auth import TokenProvider, hmac_provider, static_token
from clients.core import (
    Backoff,
    EventTooLarge,
    IdleTimer,
    PoolScheduler,
    ResyncGate,
    SeqAssigner,
    UnackedStore,
    encode_batches,
    heartbeat_next_seq,
    payload_fits,
)
from clients.spool import DEFAULT_SPOOL_MAX_BYTES, FileSpool
from contract.wire.errors import RemoteProtocolError
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from contract.wire.messages import (
    MAX_SEQ,
    Ack,
    ErrorReply,
    ResyncRequest,
    Welcome,
    build_bye,
    build_heartbeat,
    build_hello,
    parse_gateway_message,
)
from timesync.client import DEFAULT_COUNT, PeriodicSync, TimeSyncError
from timesync.clocks import ClockUs, for_time_sync, system_time_us
from timesync.estimator import ClockEstimate

__all__ = ["DEFAULT_BATCH_EVENTS", "DEFAULT_MAX_UNACKED", "ClientStats", "GatewayFailed", "GatewayRejected",
           "RefusedEvent", "SkewlessClient", "connect"]

log = logging.getLogger(__name__)

DEFAULT_BATCH_EVENTS = 500
# 100k events of ~100 bytes: ~10 MB of memory per source, ~0.5 s of a fast source's output.
DEFAULT_MAX_UNACKED = 100_000
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_RESYNC_INTERVAL_S = 60.0
# How long the sender waits for a batch to fill before writing a partial one.
DEFAULT_LINGER_S = 0.002
_READ_CHUNK = 65536
# The integers msgpack can encode (int64 and uint64).
_MIN_MSGPACK_INT = -(2**63)
_MAX_MSGPACK_INT = 2**64 - 1
# SkewlessClient.refused keeps the most recent refusals only: a source that sends nothing but bad payloads must not
# grow the client's memory without bound (stats.events_refused counts them all).
REFUSED_KEPT = 1000
# Fatal errors that are the gateway's fault (a bug contained to the connection) or the network's (a frame stalled
# past the session timeout), not the source's: the client reconnects and resends what was not acknowledged, as on a
# lost connection. Every other fatal code means the same hello or frames would be refused again.
RETRYABLE_ERROR_CODES = frozenset({"internal_error", "timeout"})


def _write(writer: asyncio.StreamWriter, data: bytes) -> bool:
    """Write unless the connection is already gone; False then.

    asyncio's own loop drops a write to a closed transport with a log line, uvloop raises RuntimeError ("the handler
    is closed"): without this, a connection lost under uvloop killed the sender task and failed the whole client
    instead of reconnecting."""
    if writer.transport.is_closing():
        return False
    try:
        writer.write(data)
    except (ConnectionError, OSError, RuntimeError):
        return False
    return True


def _write_or_raise(writer: asyncio.StreamWriter, data: bytes) -> None:
    if not _write(writer, data):
        raise ConnectionError("the connection closed before the write")


class GatewayRejected(Exception):
    """The gateway sent a fatal error frame (refused hello, bad credentials, a protocol error)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class GatewayFailed(ConnectionError):
    """The gateway closed the connection with a fatal error that is not the source's fault (RETRYABLE_ERROR_CODES):
    handled as a lost connection, re-opened with backoff."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """An event the gateway refused on its own (``invalid_payload``: its payload cannot travel in a JSON record).
    It is acknowledged with the events around it and never resent; it is not in Kafka."""

    stream: str
    seq: int
    code: str
    message: str


class ClientClosed(RuntimeError):
    """``send()`` after ``close()``."""


@dataclass
class ClientStats:
    """Counters of one client (read them any time)."""

    events_sent: int = 0
    """Events written to a socket, resends included."""
    events_resent: int = 0
    """Events written again after their connection was lost (or recovered from the spool)."""
    events_acked: int = 0
    """Events the gateway acknowledged, refused ones included (they are done with too)."""
    events_refused: int = 0
    """Events the gateway refused (``SkewlessClient.refused`` has the latest, with the reason)."""
    frames_sent: int = 0
    heartbeats_sent: int = 0
    connects: int = 0
    reconnects: int = 0
    connection_losses: int = 0
    syncs: int = 0
    resyncs_requested: int = 0  # resync requests from the gateway (a clock step it saw), each obeyed or covered
    recovered_from_spool: int = 0


@dataclass
class _Slot:
    """One pool connection."""

    index: int
    backoff: Backoff
    reader: asyncio.StreamReader | None = None
    writer: asyncio.StreamWriter | None = None
    decoder: FrameDecoder = field(default_factory=FrameDecoder)
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    task: asyncio.Task[None] | None = None


class SkewlessClient:
    """One event source, async. ``send()`` stamps an event with the source clock and the next seq of its stream.

    Lifecycle: ``await connect()`` (time sync first when ``udp_port`` is set, then ``pool_size`` TCP connections)
    … ``await send(...)`` … ``await flush()`` … ``await close()``; or ``async with SkewlessClient(...)`` (flushes on
    a clean exit). ``send()`` works before ``connect()`` too: events queue until a connection is up.

    Delivery: every event stays in memory (and in the spool file when ``spool_path`` is set) until the gateway
    acknowledges it, cumulatively per stream, after Kafka confirmed it. A lost connection is re-opened with
    exponential backoff and jitter, and the events written on it that were not acknowledged are written again; the
    gateway drops duplicates. ``send()`` blocks while ``max_unacked`` events are outstanding.

    Parameters (keyword-only after ``streams``):
        udp_port: the gateway's time-sync UDP port; None for a gateway without time sync (no sync at all).
        sync_attempts: requests per sync burst (the thesis' 10).
        resync_interval_s: seconds between background re-syncs; None syncs only once, at ``connect()``.
        sync_timeout_s: how long one sync request waits for its reply.
        timesync_key: key authenticating the time-sync extension, when the time-sync server requires one.
        clock_us: the source clock (integer µs since the epoch); inject a ``SimulatedClock`` to simulate drift.
        token: the hello's static token, or a callable returning one per connection attempt.
        hmac_secret: sign an HMAC token per connection attempt instead (see ``clients.auth``).
        ssl: a client ``ssl.SSLContext`` for TLS; ``server_hostname`` overrides the name it checks.
        pool_size: TCP connections of this source; batches go round-robin over the live ones.
        batch_events: events per frame at most (frames are also kept under the gateway's ``max_frame_bytes``).
        linger_s: how long a partial batch waits for more events before it is written.
        max_unacked: bound on events kept for resend; ``send()`` blocks at the bound.
        heartbeat_interval_s: idle time after which a connection sends a heartbeat; None disables heartbeats.
        backoff: reconnect policy (each pool connection gets its own copy); ``max_attempts`` bounds retries.
        connect_timeout_s: bound on one TCP connect + handshake (the gateway creates missing topics before it
            answers the hello, which can take seconds on a busy broker).
        spool_path: append-only file keeping unacked events across restarts (``clients.spool``).
        spool_max_bytes, spool_fsync: the spool's bound and whether each batch is fsynced.
    """

    def __init__(self, host: str, port: int, source_id: str, streams: Sequence[str], *,
                 udp_port: int | None = None, sync_attempts: int = DEFAULT_COUNT,
                 resync_interval_s: float | None = DEFAULT_RESYNC_INTERVAL_S, sync_timeout_s: float = 0.5,
                 timesync_key: bytes | None = None,
                 clock_us: ClockUs = system_time_us,
                 token: str | TokenProvider | None = None, hmac_secret: bytes | None = None,
                 ssl: ssl_module.SSLContext | None = None, server_hostname: str | None = None,
                 pool_size: int = 1, batch_events: int = DEFAULT_BATCH_EVENTS, linger_s: float = DEFAULT_LINGER_S,
                 max_unacked: int = DEFAULT_MAX_UNACKED,
                 heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S,
                 backoff: Backoff | None = None, connect_timeout_s: float = 60.0,
                 spool_path: str | os.PathLike[str] | None = None, spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
                 spool_fsync: bool = False) -> None:
        if not streams:
            raise ValueError("declare at least one stream")
        if batch_events < 1:
            raise ValueError("batch_events must be >= 1")
        if sync_attempts < 1:
            raise ValueError("sync_attempts must be >= 1")
        if token is not None and hmac_secret is not None:
            raise ValueError("pass either token or hmac_secret, not both")
        self.host = host
        self.port = port
        self.udp_port = udp_port
        self.source_id = source_id
        self.streams = list(dict.fromkeys(streams))
        self._declared = frozenset(self.streams)
        self.clock_us = clock_us
        self.sync_attempts = sync_attempts
        self.resync_interval_s = resync_interval_s
        self.sync_timeout_s = sync_timeout_s
        self.timesync_key = timesync_key
        self.ssl = ssl
        self.server_hostname = server_hostname
        self.pool_size = pool_size
        self.batch_events = batch_events
        self.linger_s = linger_s
        self.max_unacked = max_unacked
        self.connect_timeout_s = connect_timeout_s
        self.stats = ClientStats()
        self.refused: deque[RefusedEvent] = deque(maxlen=REFUSED_KEPT)
        # Refused seqs not acked yet, so that the refusal of a resend (the connection dropped before the ack) is
        # not counted twice; pruned by the acks.
        self._refused_unacked: set[tuple[str, int]] = set()
        self._token: TokenProvider | None
        if hmac_secret is not None:
            self._token = hmac_provider(hmac_secret, source_id, self.reference_now_us)
        elif isinstance(token, str):
            self._token = static_token(token)
        else:
            self._token = token

        self._spool: FileSpool | None = None
        start_seq: dict[str, int] = {}
        acked: dict[str, int] = {}
        recovered: list[tuple[str, int, int, Any]] = []
        if spool_path is not None:
            self._spool = FileSpool(spool_path, source_id, max_bytes=spool_max_bytes, fsync=spool_fsync)
            state = self._spool.state
            undeclared = (set(state.next_seq) | {e[0] for e in state.events}) - set(self.streams)
            if undeclared:
                self._spool.close()
                raise ValueError(f"spool {spool_path} holds streams {sorted(undeclared)} that are not declared")
            start_seq, acked, recovered = state.next_seq, state.acked_through, state.events
        self._seqs = SeqAssigner(self.streams, start_seq)
        # Recovered events may exceed max_unacked: they were accepted before the restart.
        self._store = UnackedStore(self.streams, max_unacked, acked)
        for stream, seq, ts_us, payload in recovered:
            self._store.add_recovered(stream, seq, ts_us, payload)
        self.stats.recovered_from_spool = len(recovered)

        self._scheduler = PoolScheduler(pool_size)
        self._idle = IdleTimer(pool_size, heartbeat_interval_s)
        base_backoff = backoff if backoff is not None else Backoff()
        self._slots = [_Slot(i, base_backoff.copy()) for i in range(pool_size)]
        self._acked_streams: set[str] = set()
        self._sync: PeriodicSync | None = None
        self._resync_gate = ResyncGate()
        self._resync_task: asyncio.Task[None] | None = None
        self._sender: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._progress: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self._flush_now = False
        self._error: BaseException | None = None
        self._connected = False
        self._closed = False
        self._max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        # (highest source_ts_us sent, clock_us() when it was sent): what heartbeats extrapolate from.
        self._ts_anchor: tuple[int, int] | None = None

    # -- properties ------------------------------------------------------------------------------------------------

    @property
    def unacked_count(self) -> int:
        """Events handed to ``send()`` and not yet acknowledged (queued, on the wire, or waiting for Kafka)."""
        return len(self._store)

    @property
    def pending_count(self) -> int:
        """Events not yet written to any connection."""
        return self._store.pending_count

    @property
    def connected_count(self) -> int:
        """Pool connections currently up."""
        return len(self._scheduler.live)

    @property
    def clock_estimate(self) -> ClockEstimate | None:
        """The latest time-sync estimate (``t_ref = t_source + offset_us``), None before the first sync."""
        return None if self._sync is None else self._sync.estimate

    @property
    def error(self) -> BaseException | None:
        """Why the client failed (a fatal gateway error, reconnect attempts used up), or None."""
        return self._error

    def next_seq(self, stream: str) -> int:
        """The seq the stream's next event will carry."""
        return self._seqs.peek(stream)

    def acked_through(self, stream: str) -> int:
        """Highest seq of the stream the gateway acknowledged (cumulatively), -1 if none."""
        return self._store.acked_through(stream)

    def heartbeat_ts_us(self) -> int | None:
        """The source time a heartbeat carries, None before the first event (then no heartbeat is sent).

        The gateway's merge takes a heartbeat as a promise that no older event follows, so the SDK only claims
        what it knows: the highest ``source_ts_us`` sent so far, advanced by the source clock time elapsed since
        it was sent. With ``clock_us()`` stamps that is simply ``clock_us()`` now; with the application's own
        ``source_ts_us`` values it is their latest one carried forward at the clock's rate (an application whose
        timestamps run slower than ``clock_us()`` should pass its own clock as ``clock_us``).
        """
        anchor = self._ts_anchor
        if anchor is None:
            return None
        return anchor[0] + max(0, self.clock_us() - anchor[1])

    def reference_now_us(self) -> int:
        """The source's best idea of the reference clock now: its clock mapped through the latest sync estimate."""
        now = self.clock_us()
        estimate = self.clock_estimate
        return now if estimate is None else estimate.to_reference_us(now)

    # -- lifecycle -------------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        try:
            if exc is None:
                await self.flush()
        finally:
            await self.close()

    def _events(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        if self._wake is None or self._progress is None or self._room is None:
            self._wake, self._progress, self._room = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._room.set()
        return self._wake, self._progress, self._room

    async def connect(self) -> None:
        """Sync the clock (when ``udp_port`` is set), open the pool, start the background tasks.

        Raises ``TimeSyncError`` if the first sync burst got no usable reply, ``GatewayRejected`` if the gateway
        refused the hello, ``OSError``/``TimeoutError`` if a connection could not be opened.
        """
        if self._closed:
            raise ClientClosed("client is closed")
        if self._connected:
            return
        self._events()
        if self.udp_port is not None:
            await self._start_sync(self.udp_port)
        try:
            for slot in self._slots:
                await self._open(slot)
        except BaseException:
            await self._teardown()
            raise
        self._connected = True
        for slot in self._slots:
            slot.task = asyncio.create_task(self._supervise(slot), name=f"skewless-{self.source_id}-conn{slot.index}")
            slot.task.add_done_callback(self._task_done)
        self._sender = asyncio.create_task(self._run_sender(), name=f"skewless-{self.source_id}-sender")
        self._sender.add_done_callback(self._task_done)
        self._wake_sender()

    async def _start_sync(self, udp_port: int) -> None:
        def on_estimate(_estimate: ClockEstimate) -> None:
            self.stats.syncs += 1

        interval = self.resync_interval_s
        self._sync = PeriodicSync(self.host, udp_port, self.source_id, for_time_sync(self.clock_us),
                                  count=self.sync_attempts,
                                  interval_s=interval if interval is not None else 1.0, timeout_s=self.sync_timeout_s,
                                  key=self.timesync_key, on_estimate=on_estimate)
        if interval is None:
            await self._sync.sync_now()
        else:
            await self._sync.start()

    async def sync_now(self) -> ClockEstimate:
        """Run one sync burst now (requires ``udp_port``)."""
        if self._sync is None:
            if self.udp_port is None:
                raise RuntimeError("no udp_port: this client does not sync")
            await self._start_sync(self.udp_port)
            assert self._sync is not None
            estimate = self._sync.estimate
            assert estimate is not None
            return estimate
        return await self._sync.sync_now()

    async def close(self) -> None:
        """Say ``bye`` on every live connection and stop. Unacknowledged events stay in the spool, if any."""
        if self._closed:
            return
        self._closed = True
        if self._sender is not None:
            self._sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sender
        for slot in self._slots:
            if slot.task is not None:
                slot.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await slot.task
        for slot in self._slots:
            if slot.writer is not None and self._scheduler.is_up(slot.index):
                with contextlib.suppress(ConnectionError, OSError):
                    if _write(slot.writer, encode_frame(build_bye())):
                        await slot.writer.drain()
        await self._teardown()
        if self._room is not None:
            self._room.set()

    async def _teardown(self) -> None:
        if self._resync_task is not None:
            self._resync_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._resync_task
        for slot in self._slots:
            await self._drop(slot)
        if self._sync is not None:
            await self._sync.close()
        if self._spool is not None:
            self._spool.close()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s: background task %s died: %r", self.source_id, task.get_name(), exc)
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if self._error is None:
            self._error = exc
        for event in (self._wake, self._progress, self._room):
            if event is not None:
                event.set()

    # -- sending ---------------------------------------------------------------------------------------------------

    async def send(self, stream: str, payload: Any, source_ts_us: int | None = None, *, seq: int | None = None) -> int:
        """Queue one event; returns its seq. Blocks while ``max_unacked`` events are unacknowledged.

        ``source_ts_us`` defaults to ``clock_us()`` now. ``seq`` is for replaying recorded traces (events with
        their original seqs, in any order); normally the client assigns the next seq of the stream.
        """
        _wake, _progress, room = self._events()
        while True:
            if self._error is not None:
                raise self._error
            if self._closed:
                raise ClientClosed("client is closed")
            if self._store.has_room and (self._spool is None or self._spool.has_room):
                break
            room.clear()
            await room.wait()
        if stream not in self._declared:
            raise ValueError(f"stream {stream!r} was not declared; declared: {self.streams}")
        if isinstance(payload, int) and not isinstance(payload, bool):
            if not _MIN_MSGPACK_INT <= payload <= _MAX_MSGPACK_INT:
                # What packb raises for a nested one. Queued, it would fail the sender task when framed, and with it
                # the whole client.
                raise OverflowError(f"integer payload {payload} is beyond msgpack's 64 bits")
        elif not isinstance(payload, float) and payload is not None:
            size = len(msgpack.packb(payload, use_bin_type=True))
            if not payload_fits(size, self._max_frame_bytes):
                raise EventTooLarge(f"payload of {size} bytes does not fit a {self._max_frame_bytes}-byte frame")
        if seq is None:
            seq = self._seqs.next(stream)
        else:
            self._seqs.claim(stream, seq)
        anchor = self._ts_anchor
        if source_ts_us is None:
            ts_us = self.clock_us()
            if anchor is None or ts_us >= anchor[0]:
                self._ts_anchor = (ts_us, ts_us)
        else:
            ts_us = source_ts_us
            if not 0 <= ts_us <= MAX_SEQ:
                raise ValueError(f"source_ts_us {ts_us} is outside [0, 2**63)")
            if anchor is None or ts_us >= anchor[0]:
                self._ts_anchor = (ts_us, self.clock_us())
        self._store.add(stream, seq, ts_us, payload)
        if self._spool is not None:
            self._spool.append_event(stream, seq, ts_us, payload)
        self._wake_sender()
        return seq

    def _wake_sender(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def send_pending(self) -> None:
        """Write every queued event to a connection now (no linger) and wait until they are written."""
        _wake, progress, _room = self._events()
        self._flush_now = True
        try:
            while self._store.pending_count and self._sender is not None and not self._sender.done():
                if self._error is not None:
                    raise self._error
                progress.clear()
                self._wake_sender()
                await progress.wait()
        finally:
            self._flush_now = False
        if self._error is not None:
            raise self._error

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until the gateway acknowledged every event sent so far (reconnecting as needed).

        Raises ``TimeoutError`` after ``timeout_s``, or the client's fatal error. Before ``connect()`` it raises
        ``RuntimeError`` when events are pending, since nothing could deliver them.
        """
        _wake, progress, _room = self._events()
        if not self._connected and len(self._store):
            raise RuntimeError("flush() before connect(): nothing can deliver the queued events")
        self._flush_now = True
        try:
            async with asyncio.timeout(timeout_s):
                while len(self._store):
                    if self._error is not None:
                        raise self._error
                    if self._closed:
                        raise ClientClosed("client closed with events unacknowledged")
                    progress.clear()
                    self._wake_sender()
                    await progress.wait()
        finally:
            self._flush_now = False
        if self._error is not None:
            raise self._error

    async def _run_sender(self) -> None:
        wake, progress, _room = self._events()
        loop = asyncio.get_running_loop()
        while True:
            live = self._scheduler.live
            timeout = self._idle.next_due_in(live, loop.time())
            if not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await wake.wait()
            wake.clear()
            if (self._store.pending_count and self._store.pending_count < self.batch_events and self.linger_s > 0
                    and not self._flush_now):
                await asyncio.sleep(self.linger_s)
            before = self._store.pending_count
            wrote = await self._write_pending(loop)
            self._send_heartbeats(loop)
            # Only real progress wakes flush()/send_pending(): while no connection is up they wait for one.
            if wrote or self._store.pending_count != before:
                progress.set()

    async def _write_pending(self, loop: asyncio.AbstractEventLoop) -> bool:
        wrote = False
        while self._store.pending_count and self._scheduler.live:
            events = self._store.take_batch(self.batch_events)
            if not events:
                break
            # Until the gateway acked a stream, its first seqs must not race each other over two sockets.
            pinned = any(e.stream not in self._acked_streams for e in events)
            index = self._scheduler.next_slot(pinned=pinned)
            assert index is not None
            slot = self._slots[index]
            writer = slot.writer
            assert writer is not None
            frames = encode_batches(events, self.batch_events, slot.max_frame_bytes)
            if self._spool is not None:
                self._spool.flush()  # on disk before the gateway can have seen them
            for chunk, frame in frames:
                # If the connection is gone, its supervisor requeues what was marked sent on it.
                if _write(writer, frame):
                    self.stats.frames_sent += 1
                    self.stats.events_sent += len(chunk)
            resent = sum(1 for e in events if e.resend)
            self.stats.events_resent += resent
            self._store.mark_sent(events, index)
            self._idle.wrote(index, loop.time())
            wrote = True
            try:
                await writer.drain()
            except (ConnectionError, OSError):
                # The supervisor sees the loss and requeues what this connection carried.
                await asyncio.sleep(0)
        return wrote

    def _send_heartbeats(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        due = self._idle.due(self._scheduler.live, now)
        if not due or self._store.pending_count:
            return
        ts_us = self.heartbeat_ts_us()
        if ts_us is None:
            for index in due:
                self._idle.wrote(index, now)
            return
        frame = encode_frame(build_heartbeat(ts_us, heartbeat_next_seq(self._seqs, self._store)))
        for index in due:
            writer = self._slots[index].writer
            if writer is not None and _write(writer, frame):
                self.stats.heartbeats_sent += 1
            self._idle.wrote(index, now)

    # -- connections -----------------------------------------------------------------------------------------------

    def _hello(self) -> dict[str, Any]:
        return build_hello(self.source_id, self.streams, None if self._token is None else self._token())

    async def _open(self, slot: _Slot) -> None:
        """Connect and handshake one pool connection; raises on failure (the caller retries or gives up)."""
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(self.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                self.host, self.port, ssl=self.ssl,
                server_hostname=self.server_hostname if self.ssl is not None else None)
            decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
            try:
                _write_or_raise(writer, encode_frame(self._hello()))
                messages = await _read_first_frames(reader, decoder)
            except BaseException:
                writer.close()
                raise
        elapsed_s = asyncio.get_running_loop().time() - started
        if elapsed_s > 5.0:
            log.warning("%s conn%d: the gateway took %.1f s to answer the hello", self.source_id, slot.index, elapsed_s)
        try:
            reply = parse_gateway_message(messages[0])
        except RemoteProtocolError as exc:
            writer.close()
            raise GatewayRejected(exc.code, f"expected welcome: {exc}") from exc
        if not isinstance(reply, Welcome):
            writer.close()
            if isinstance(reply, ErrorReply):
                if reply.code in RETRYABLE_ERROR_CODES:
                    raise GatewayFailed(reply.code, reply.message)
                raise GatewayRejected(reply.code, reply.message)
            raise GatewayRejected("unexpected_reply", f"expected welcome, got {messages[0].get('type')!r}")
        slot.max_frame_bytes = reply.max_frame_bytes
        self._max_frame_bytes = min(s.max_frame_bytes for s in self._slots)
        slot.reader, slot.writer, slot.decoder = reader, writer, decoder
        self._scheduler.up(slot.index)
        self._idle.wrote(slot.index, asyncio.get_running_loop().time())
        self.stats.connects += 1
        for message in messages[1:]:
            self._on_message(message)
        self._wake_sender()
        if self._progress is not None:
            self._progress.set()

    async def _drop(self, slot: _Slot) -> None:
        """Forget one connection: requeue what it carried, close the socket."""
        was_up = self._scheduler.is_up(slot.index)
        self._scheduler.down(slot.index)
        if was_up:
            requeued = self._store.connection_lost(slot.index)
            if requeued:
                log.info("%s conn%d lost; %d unacked events requeued", self.source_id, slot.index, requeued)
            # A new connection may land on a gateway that restarted: start pinned again.
            self._acked_streams.clear()
        writer, slot.writer, slot.reader = slot.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError, ssl_module.SSLError):
                await writer.wait_closed()

    async def _supervise(self, slot: _Slot) -> None:
        """Read one connection until it breaks, then reconnect with backoff; forever, until closed or failed."""
        while not self._closed:
            if slot.reader is not None:
                try:
                    await self._read_until_closed(slot)
                except (ConnectionError, OSError, RemoteProtocolError) as exc:
                    log.info("%s conn%d: %r", self.source_id, slot.index, exc)
                self.stats.connection_losses += 1
                await self._drop(slot)
                if self._error is not None:
                    return
            delay = slot.backoff.next_delay()
            if delay is None:
                self._fail(ConnectionError(f"gateway {self.host}:{self.port} unreachable after "
                                           f"{slot.backoff.attempts} reconnect attempts"))
                return
            await asyncio.sleep(delay)
            try:
                await self._open(slot)
            except GatewayRejected as exc:
                self._fail(exc)
                return
            except (ConnectionError, OSError, TimeoutError, RemoteProtocolError) as exc:
                log.info("%s conn%d reconnect failed: %r", self.source_id, slot.index, exc)
                continue
            slot.backoff.reset()
            self.stats.reconnects += 1

    async def _read_until_closed(self, slot: _Slot) -> None:
        reader = slot.reader
        assert reader is not None
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                return
            for message in slot.decoder.feed(data):
                self._on_message(message)
                if self._error is not None:
                    return

    def _on_message(self, raw: dict[str, Any]) -> None:
        try:
            message = parse_gateway_message(raw)
        except RemoteProtocolError as exc:
            # A newer gateway may send types this client does not know: ignored, not fatal.
            log.warning("%s: ignored a gateway message: %s", self.source_id, exc)
            return
        if isinstance(message, Ack):
            stream, seq = message.stream, message.seq
            released = self._store.ack(stream, seq)
            self._acked_streams.add(stream)
            if self._refused_unacked:
                self._refused_unacked = {r for r in self._refused_unacked if r[0] != stream or r[1] > seq}
            if released:
                self.stats.events_acked += released
                if self._spool is not None:
                    self._spool.append_ack(stream, seq)
                if self._room is not None:
                    self._room.set()
                if self._progress is not None:
                    self._progress.set()
        elif isinstance(message, ResyncRequest):
            self._on_resync_request(message)
        elif isinstance(message, ErrorReply):
            if message.fatal and message.code in RETRYABLE_ERROR_CODES:
                # Raised to the connection's supervisor: dropped, re-opened, its unacked events resent.
                raise GatewayFailed(message.code, message.message)
            error = GatewayRejected(message.code, message.message)
            if message.fatal:
                log.error("%s: gateway error %s", self.source_id, error)
                self._fail(error)
            elif message.stream is not None and message.seq is not None:
                self._refused_event(RefusedEvent(message.stream, message.seq, message.code, message.message))
            else:
                log.warning("%s: gateway warning %s", self.source_id, error)

    def _refused_event(self, refused: RefusedEvent) -> None:
        key = (refused.stream, refused.seq)
        if (refused.stream not in self._declared or refused.seq <= self._store.acked_through(refused.stream)
                or key in self._refused_unacked):
            return  # a resend's refusal: counted the first time
        self._refused_unacked.add(key)
        self.stats.events_refused += 1
        self.refused.append(refused)
        log.warning("%s: the gateway refused %s seq %d (%s): %s", self.source_id, refused.stream, refused.seq,
                    refused.code, refused.message)


    def _on_resync_request(self, request: ResyncRequest) -> None:
        """The gateway saw this source's clock step and holds its events until a sync after the step: one burst now
        (clients.core.ResyncGate decides when), beside the periodic ones; sending goes on meanwhile."""
        self.stats.resyncs_requested += 1
        if self._sync is None or self._closed:
            return  # no time sync (no udp_port): the gateway has no estimate of this clock to renew
        log.warning("%s: the gateway asks for a re-sync (%s at %s seq %s)", self.source_id, request.reason,
                    request.stream, request.seq)
        delay_s = self._resync_gate.request(asyncio.get_running_loop().time())
        if delay_s is not None:
            self._resync_task = asyncio.create_task(self._resync(delay_s), name=f"skewless-{self.source_id}-resync")
            self._resync_task.add_done_callback(self._task_done)

    async def _resync(self, delay_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        while delay_s is not None and self._sync is not None:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            self._resync_gate.started(loop.time())
            try:
                await self._sync.sync_now()
            except (TimeSyncError, OSError) as exc:
                # Not fatal: the gateway sends its held events to the late topic when its hold runs out, and the
                # periodic re-sync tries again.
                log.warning("%s: the re-sync the gateway asked for failed: %s", self.source_id, exc)
            delay_s = self._resync_gate.finished(loop.time())


async def _read_first_frames(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list[dict[str, Any]]:
    while True:
        data = await reader.read(_READ_CHUNK)
        if not data:
            raise ConnectionError("gateway closed the connection during the handshake")
        messages = decoder.feed(data)
        if messages:
            return messages


async def connect(host: str, tcp_port: int, udp_port: int | None, source_id: str,
                  sync_attempts: int = DEFAULT_COUNT, *, streams: Sequence[str], **options: Any) -> SkewlessClient:
    """Sample Code 4.1: ``await connect("10.100.1.138", 9892, 7452, "Sensor1", 10, streams=["temps"])``.

    Syncs the source clock with ``sync_attempts`` requests against ``udp_port`` (None: no time sync), opens the
    connection pool and returns the connected client; ``options`` are ``SkewlessClient``'s keyword arguments.
    """
    client = SkewlessClient(host, tcp_port, source_id, streams, udp_port=udp_port, sync_attempts=sync_attempts,
                            **options)
    await client.connect()
    return client

