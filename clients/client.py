"""Async client SDK for event sources: time sync, a pool of connections, per-stream seqs, acks, resend.

The logic lives in the sans-IO core (``clients.core``: seqs, the unacked store, batching, pool scheduling,
backoff, idleness; ``clients.spool``: the file spool); this module is the asyncio shell that moves bytes and owns
the background tasks (one sender, one supervisor per pool connection, the time-sync re-sync).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self, Unpack

from clients.auth import TokenProvider, hmac_provider, static_token
from clients.core import (
    Backoff,
    DeliveryWatch,
    GatewayAddress,
    GatewayLiveness,
    GatewayRouter,
    IdleTimer,
    PoolScheduler,
    UnackedStore,
    encode_batches,
    heartbeat_next_seq,
)
from clients.errors import (
    ClientClosed,
    FlushTimeout,
    GatewayFailed,
    GatewayRejected,
    GatewayUnreachable,
)
from clients.options import (
    DEFAULT_BATCH_EVENTS,
    DEFAULT_MAX_UNACKED,
    ClientOptions,
    ClientSettings,
    ConnectOptions,
    keyword_signature,
)
from clients.stats import ClientStats
from clients.time_sync import OwnerTimeSync
from clients.window import InvalidInterval, RefusedEvent, SendWindow, interval_endpoint, is_int
from contract.wire.errors import ROUTING_ERROR_CODES, SHARD_MOVED, SHARD_UNAVAILABLE, RemoteProtocolError
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from contract.wire.messages import (
    ENDPOINT_END,
    ENDPOINT_START,
    MAX_SEQ,
    Ack,
    AtomicInterval,
    ErrorReply,
    GapNotice,
    Redirect,
    ResyncRequest,
    Welcome,
    build_bye,
    build_heartbeat,
    build_hello,
    parse_gateway_message,
)
from timesync.client import DEFAULT_COUNT
from timesync.client import TimeSyncError as _AnyTimeSyncError
from timesync.estimator import ClockEstimate

__all__ = ["DEFAULT_BATCH_EVENTS", "DEFAULT_MAX_UNACKED", "ClientClosed", "ClientOptions", "ClientStats",
           "ConnectOptions", "GatewayFailed", "GatewayRejected", "GatewayRerouted", "InvalidInterval", "RefusedEvent",
           "SkewlessClient", "connect"]

log = logging.getLogger(__name__)

_READ_CHUNK = 65536
# Fatal errors that are the gateway's fault (a bug contained to the connection) or the network's (a frame stalled
# past the session timeout), not the source's: the client reconnects and resends what was not acknowledged, as on a
# lost connection. Every other fatal code means the same hello or frames would be refused again.
RETRYABLE_ERROR_CODES = frozenset({"internal_error", "timeout"})
# Not a wire code: the client's own, when redirects did not settle within max_redirects hops.
TOO_MANY_REDIRECTS = "too_many_redirects"
# Not a wire code either: a redirect named a gateway this source found dead (the liveness timeout, or a refused
# connection); the cluster has not moved the shard yet. Waited out like ``shard_unavailable``.
OWNER_UNRESPONSIVE = "owner_unresponsive"
# Between two dialing rounds while the cluster names an owner this source found dead (as a ``shard_unavailable``'s
# retry_after_ms would).
UNRESPONSIVE_OWNER_RETRY_S = 0.5
# A gateway that refused the connection is a suspect this long: the redirects still naming it (the cluster has not
# noticed yet) are waited out instead of followed into a loop; a restarted gateway is dialed again soon after.
REFUSED_SUSPECT_S = 1.0


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


class GatewayRerouted(GatewayFailed):
    """The source's shard is not served where this connection went: ``shard_unavailable`` or ``shard_moved`` from
    the gateway, a redirect after the welcome, or redirects that did not settle (``too_many_redirects``). Handled as
    a lost connection, except that the gateway is no longer taken for the owner and the next attempt waits at least
    ``retry_after_ms`` and starts from the address list."""

    def __init__(self, code: str, message: str, retry_after_ms: int | None = None,
                 gateway: GatewayAddress | None = None) -> None:
        super().__init__(code, message)
        self.retry_after_ms = retry_after_ms
        self.gateway = gateway


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
    gateway: GatewayAddress | None = None
    """The gateway this connection is (or was last) open to."""
    retry_after_s: float = 0.0
    """The least wait before the next dialing round (a shard error's ``retry_after_ms``)."""


class SkewlessClient:
    """One event source, async. ``send()`` stamps an event with the source clock and the next seq of its stream.

    Lifecycle: ``await connect()`` (the first TCP connection finds the gateway that owns this source, then the clock
    syncs with that gateway's time-sync server, at the port its welcome announces, then the rest of the ``pool_size``
    connections open) … ``await send(...)`` … ``await flush()`` … ``await close()``; or ``async with
    SkewlessClient(...)`` (flushes on a clean exit). ``send()`` works before ``connect()`` too: events queue until
    a connection is up.

    Gateways: ``host:port`` and then ``gateways`` are tried in order; a gateway that does not own the source's shard
    answers with a redirect to the owner, which every pool connection then dials first (docs/sdk.md, "Several
    gateways").

    Delivery: every event stays in memory (and in the spool file when ``spool_path`` is set) until the gateway
    acknowledges it, cumulatively per stream, after Kafka confirmed it. A lost connection is re-opened with
    exponential backoff and jitter, and the events written on it that were not acknowledged are written again; the
    gateway drops duplicates. ``send()`` blocks while ``max_unacked`` events are outstanding.

    Options (keyword-only after ``streams``): :class:`clients.options.ClientSettings` has each one's default,
    unit and meaning; ``self.settings`` holds the checked values.
    """

    def __init__(self, host: str, port: int, source_id: str, streams: Sequence[str],
                 **options: Unpack[ClientOptions]) -> None:
        if not streams:
            raise ValueError("declare at least one stream")
        self.settings = settings = ClientSettings(**options)
        self.host = host
        self.port = port
        self.gateways = list(settings.gateways)
        self._router = GatewayRouter([(host, port), *self.gateways], settings.max_redirects)
        self.source_id = source_id
        self.streams = list(dict.fromkeys(streams))
        self.clock_us = settings.clock_us
        self.stats = ClientStats()
        self._hmac_secret = settings.hmac_secret is not None
        self._token: TokenProvider | None
        if settings.hmac_secret is not None:
            self._token = hmac_provider(settings.hmac_secret, source_id, self.reference_now_us)
        elif isinstance(settings.token, str):
            self._token = static_token(settings.token)
        else:
            self._token = settings.token

        self._window = SendWindow(settings, source_id, self.streams, self.stats)
        self.refused = self._window.refused
        # The gateway's gap notices, newest last (docs/sdk.md, "Gaps"): which seqs it gave up and acked past.
        self.gaps = self._window.gaps

        pool_size, heartbeat_interval_s = settings.pool_size, settings.heartbeat_interval_s
        self._scheduler = PoolScheduler(pool_size)
        self._idle = IdleTimer(pool_size, heartbeat_interval_s, settings.keepalive_interval_s)
        # A heartbeat probes a connection that has waited this long for an ack (Kafka may be slow, the gateway not).
        self._liveness = GatewayLiveness(pool_size, settings.liveness_timeout_s, heartbeat_interval_s)
        base_backoff = settings.backoff if settings.backoff is not None else Backoff()
        self._slots = [_Slot(i, base_backoff.copy()) for i in range(pool_size)]
        self._time = OwnerTimeSync(settings, source_id, self._router, self.stats, self._task_done)
        self._sender: asyncio.Task[None] | None = None
        self._connected = False

    # -- properties ------------------------------------------------------------------------------------------------

    @property
    def unacked_count(self) -> int:
        """Events handed to ``send()`` and not yet acknowledged (queued, on the wire, or waiting for Kafka)."""
        return len(self._window.store)

    @property
    def pending_count(self) -> int:
        """Events not yet written to any connection."""
        return self._window.store.pending_count

    @property
    def connected_count(self) -> int:
        """Pool connections currently up."""
        return len(self._scheduler.live)

    @property
    def clock_estimate(self) -> ClockEstimate | None:
        """The latest time-sync estimate (``t_ref = t_source + offset_us``), None before the first sync."""
        return self._time.estimate

    @property
    def owner(self) -> GatewayAddress | None:
        """The gateway this source talks to (the last one that welcomed it, or that a redirect named), None while
        the client does not know (before ``connect()``, or after a shard error until the next welcome)."""
        return self._router.owner

    @property
    def error(self) -> BaseException | None:
        """Why the client failed (a fatal gateway error, reconnect attempts used up), or None."""
        return self._window.error

    def next_seq(self, stream: str) -> int:
        """The seq the stream's next event will carry."""
        return self._window.seqs.peek(stream)

    def acked_through(self, stream: str) -> int:
        """Highest seq of the stream the gateway acknowledged (cumulatively), -1 if none."""
        return self._window.store.acked_through(stream)

    def heartbeat_ts_us(self) -> int | None:
        """The source time a heartbeat carries, None before the first event (then no heartbeat is sent).

        The gateway's merge takes a heartbeat as a promise that no older event follows, so the SDK only claims what
        the stamps so far imply (:class:`clients.core.HeartbeatPromise`): with ``clock_us()`` stamps that is simply
        ``clock_us()`` now; with the application's own ``source_ts_us`` it is now less the largest recent delay between
        an event's stamp and its ``send()``. An application whose stamps run slower than ``clock_us()`` should pass
        the clock its stamps follow as ``clock_us``.
        """
        return self._window.promise.promise_us(self.clock_us())

    def reference_now_us(self) -> int:
        """The source's best idea of the reference clock now: its clock mapped through the latest sync estimate."""
        now = self.clock_us()
        estimate = self.clock_estimate
        return now if estimate is None else estimate.to_reference_us(now)

    @property
    def _store(self) -> UnackedStore:
        return self._window.store

    @property
    def _deliveries(self) -> DeliveryWatch[asyncio.Future[int]]:
        return self._window.deliveries

    @property
    def _acked_streams(self) -> set[str]:
        return self._window.acked_streams

    @property
    def _move_sync_task(self) -> asyncio.Task[None] | None:
        return self._time.move_task

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

    async def connect(self) -> None:
        """Find the owning gateway, sync the clock with it (unless ``time_sync=False`` or it has no time-sync
        server), open the pool, start the background tasks.

        Raises ``TimeSyncError`` if the first sync burst got no usable reply, ``GatewayRejected`` if the gateway
        refused the hello (or broke the protocol), ``GatewayRerouted`` if the shard stayed unserved (or redirects did
        not settle) for ``connect_timeout_s`` (all ``SkewlessError``); the last dial's ``OSError`` (a
        ``ConnectionRefusedError``, ``TimeoutError``, ``ssl.SSLError``...) as the OS raised it if no gateway address
        could be reached.
        """
        if self._window.closed:
            raise ClientClosed("client is closed")
        if self._connected:
            return
        self._window.signals()
        try:
            if self.settings.time_sync and self.settings.udp_port is not None and self._hmac_secret:
                # An HMAC token is stamped with the synced clock, so this source syncs before its first hello (with
                # the first gateway of the list that answers: any gateway's clock makes a fresh token), then again
                # with the owner once it knows it.
                await self._time.presync(self.settings.udp_port)
            for slot in self._slots:
                await self._open_at_connect(slot)
        except RemoteProtocolError as exc:
            # The gateway's own frames broke the protocol (a malformed or oversized frame in the handshake).
            await self._teardown()
            raise GatewayRejected(exc.code, str(exc)) from exc
        except BaseException:
            await self._teardown()
            raise
        self._connected = True
        for slot in self._slots:
            slot.task = asyncio.create_task(self._supervise(slot), name=f"skewless-{self.source_id}-conn{slot.index}")
            slot.task.add_done_callback(self._task_done)
        self._sender = asyncio.create_task(self._run_sender(), name=f"skewless-{self.source_id}-sender")
        self._sender.add_done_callback(self._task_done)
        self._window.wake_sender()

    async def sync_now(self) -> ClockEstimate:
        """Run one sync burst now with the owner's time-sync server (raises ``TimeSyncError`` when it gets no usable
        reply, or when no server is known: ``time_sync=False``, or no announced port and no ``udp_port``)."""
        return await self._time.sync_now()

    async def close(self) -> None:
        """Say ``bye`` on every live connection and stop. Unacknowledged events stay in the spool, if any."""
        if self._window.closed:
            return
        self._window.closed = True
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
        self._window.closing()

    async def _teardown(self) -> None:
        await self._time.stop_tasks()
        for slot in self._slots:
            await self._drop(slot)
        await self._time.close()
        if self._window.spool is not None:
            self._window.spool.close()

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            log.error("%s: background task %s died: %r", self.source_id, task.get_name(), exc)
            self._window.fail(exc)

    # -- sending ---------------------------------------------------------------------------------------------------

    async def send(self, stream: str, payload: Any, source_ts_us: int | None = None, *, seq: int | None = None) -> int:
        """Queue one event; returns its seq. Blocks while ``max_unacked`` events are unacknowledged.

        ``source_ts_us`` defaults to ``clock_us()`` now. ``seq`` is for replaying recorded traces (events with
        their original seqs, in any order); normally the client assigns the next seq of the stream.
        """
        await self._window.wait_for_room()
        return self._window.enqueue(stream, payload, source_ts_us, seq, None)

    async def send_interval(self, stream: str, payload: Any, start_ts_us: int, end_ts_us: int, *,
                            seq: int | None = None) -> int:
        """Queue an interval event that lasted from ``start_ts_us`` to ``end_ts_us`` (source clock, integer µs,
        ``start_ts_us <= end_ts_us``); returns its seq. Send it once it ended (Li 2010's atomic interval): the
        gateway maps both endpoints to the reference clock, and the events topic orders it by its end
        (docs/wire-protocol.md, "Interval events"). Raises :class:`InvalidInterval` for a start after the end or a
        time outside ``[0, 2**63)``; otherwise like ``send()``."""
        if not (is_int(start_ts_us) and is_int(end_ts_us) and 0 <= start_ts_us <= end_ts_us <= MAX_SEQ):
            raise InvalidInterval(f"an interval needs integer times 0 <= start_ts_us <= end_ts_us < 2**63, got "
                                  f"start_ts_us={start_ts_us!r}, end_ts_us={end_ts_us!r}")
        await self._window.wait_for_room()
        return self._window.enqueue(stream, payload, end_ts_us, seq, AtomicInterval(start_ts_us))

    async def send_interval_start(self, stream: str, interval_id: str, payload: Any,
                                  source_ts_us: int | None = None, *, seq: int | None = None) -> int:
        """Queue the start of interval ``interval_id`` as an event of its own (IO3's model: each endpoint arrives on
        its own, paired downstream by id); ``source_ts_us`` defaults to now. Returns its seq."""
        interval = interval_endpoint(interval_id, ENDPOINT_START)
        await self._window.wait_for_room()
        return self._window.enqueue(stream, payload, source_ts_us, seq, interval)

    async def send_interval_end(self, stream: str, interval_id: str, payload: Any,
                                source_ts_us: int | None = None, *, seq: int | None = None) -> int:
        """Queue the end of interval ``interval_id`` (see :meth:`send_interval_start`). Returns its seq."""
        interval = interval_endpoint(interval_id, ENDPOINT_END)
        await self._window.wait_for_room()
        return self._window.enqueue(stream, payload, source_ts_us, seq, interval)

    async def send_tracked(self, stream: str, payload: Any, source_ts_us: int | None = None, *,
                           seq: int | None = None) -> asyncio.Future[int]:
        """``send()``, and a future of this event's delivery: it resolves to the seq when a cumulative ack covers it
        (Kafka has it), fails with ``EventRefused`` if the gateway refuses it (``invalid_payload``), with
        ``ClientClosed`` if the client closes with it unacknowledged, or with the client's fatal error.

        The future exists only for events sent this way, until their ack: ``send()`` pays nothing for it, and at
        most ``max_unacked`` futures are ever pending.
        """
        return self._window.track(stream, await self.send(stream, payload, source_ts_us, seq=seq))

    async def send_interval_tracked(self, stream: str, payload: Any, start_ts_us: int, end_ts_us: int, *,
                                    seq: int | None = None) -> asyncio.Future[int]:
        """``send_interval()`` with a delivery future, as ``send_tracked()`` gives one."""
        return self._window.track(stream, await self.send_interval(stream, payload, start_ts_us, end_ts_us, seq=seq))

    async def send_interval_start_tracked(self, stream: str, interval_id: str, payload: Any,
                                          source_ts_us: int | None = None, *,
                                          seq: int | None = None) -> asyncio.Future[int]:
        """``send_interval_start()`` with a delivery future, as ``send_tracked()`` gives one."""
        return self._window.track(stream, await self.send_interval_start(stream, interval_id, payload, source_ts_us,
                                                                  seq=seq))

    async def send_interval_end_tracked(self, stream: str, interval_id: str, payload: Any,
                                        source_ts_us: int | None = None, *,
                                        seq: int | None = None) -> asyncio.Future[int]:
        """``send_interval_end()`` with a delivery future, as ``send_tracked()`` gives one."""
        seq = await self.send_interval_end(stream, interval_id, payload, source_ts_us, seq=seq)
        return self._window.track(stream, seq)

    async def send_pending(self) -> None:
        """Write every queued event to a connection now (no linger) and wait until they are written."""
        _wake, progress, _room = self._window.signals()
        self._window.flush_now = True
        try:
            while self._window.store.pending_count and self._sender is not None and not self._sender.done():
                if self._window.error is not None:
                    raise self._window.error
                progress.clear()
                self._window.wake_sender()
                await progress.wait()
        finally:
            self._window.flush_now = False
        if self._window.error is not None:
            raise self._window.error

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until the gateway acknowledged every event sent so far (reconnecting as needed).

        Raises ``FlushTimeout`` (a ``TimeoutError``) after ``timeout_s``, or the client's fatal error. Before
        ``connect()`` it raises ``RuntimeError`` when events are pending, since nothing could deliver them.
        """
        _wake, progress, _room = self._window.signals()
        if not self._connected and len(self._window.store):
            raise RuntimeError("flush() before connect(): nothing can deliver the queued events")
        self._window.flush_now = True
        try:
            async with _flush_deadline(timeout_s, self):
                while len(self._window.store):
                    if self._window.error is not None:
                        raise self._window.error
                    if self._window.closed:
                        raise ClientClosed("client closed with events unacknowledged")
                    progress.clear()
                    self._window.wake_sender()
                    await progress.wait()
        finally:
            self._window.flush_now = False
        if self._window.error is not None:
            raise self._window.error

    async def _run_sender(self) -> None:
        wake, progress, _room = self._window.signals()
        loop = asyncio.get_running_loop()
        while True:
            live = self._scheduler.live
            now_s = loop.time()
            timeout = _earliest(self._idle.next_due_in(live, now_s), self._liveness.next_due_in(live, now_s))
            if not wake.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout):
                        await wake.wait()
            wake.clear()
            pending = self._window.store.pending_count
            if (pending and pending < self.settings.batch_events and self.settings.linger_s > 0
                    and not self._window.flush_now):
                await asyncio.sleep(self.settings.linger_s)
            before = self._window.store.pending_count
            wrote = await self._write_pending(loop)
            self._send_heartbeats(loop)
            self._check_liveness(loop)
            # Only real progress wakes flush()/send_pending(): while no connection is up they wait for one.
            if wrote or self._window.store.pending_count != before:
                progress.set()

    async def _write_pending(self, loop: asyncio.AbstractEventLoop) -> bool:
        wrote = False
        while self._window.store.pending_count and self._scheduler.live:
            events = self._window.store.take_batch(self.settings.batch_events)
            if not events:
                break
            # Until the gateway acked a stream, its first seqs must not race each other over two sockets.
            pinned = any(e.stream not in self._window.acked_streams for e in events)
            index = self._scheduler.next_slot(pinned=pinned)
            assert index is not None
            slot = self._slots[index]
            writer = slot.writer
            assert writer is not None
            frames = encode_batches(events, self.settings.batch_events, slot.max_frame_bytes)
            if self._window.spool is not None:
                self._window.spool.flush()  # on disk before the gateway can have seen them
            for chunk, frame in frames:
                # If the connection is gone, its supervisor requeues what was marked sent on it.
                if _write(writer, frame):
                    self.stats.frames_sent += 1
                    self.stats.events_sent += len(chunk)
            resent = sum(1 for e in events if e.resend)
            self.stats.events_resent += resent
            self._window.store.mark_sent(events, index)
            self._idle.wrote(index, loop.time())
            self._liveness.wrote(index, loop.time(), True)
            wrote = True
            with contextlib.suppress(ConnectionError, OSError):
                await writer.drain()  # a lost connection: its supervisor requeues what it carried
            # drain() returns at once while the socket takes everything: yield, or a long queue goes out in one go
            # while the other clients of this event loop (a replay's sources) send nothing.
            await asyncio.sleep(0)
        return wrote

    def _send_heartbeats(self, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        live = self._scheduler.live
        due = self._idle.due(live, now)
        if self._window.store.pending_count:
            return  # a heartbeat must not claim seqs still queued here; they go out first
        probes = self._liveness.probe_due(live, now)
        if probes:
            due = sorted({*due, *probes})
        if not due:
            return
        ts_us = self.heartbeat_ts_us()
        if ts_us is None:
            for index in due:
                self._idle.wrote(index, now)
            return
        frame = encode_frame(build_heartbeat(ts_us, heartbeat_next_seq(self._window.seqs, self._window.store)))
        # The gateway answers a heartbeat with the source's cumulative acks, which exist once one was acked.
        answerable = any(self._window.store.acked_through(stream) >= 0 for stream in self.streams)
        for index in due:
            writer = self._slots[index].writer
            if writer is not None and _write(writer, frame):
                self.stats.heartbeats_sent += 1
                self._liveness.wrote(index, now, answerable, heartbeat=True)
            self._idle.wrote(index, now)

    def _check_liveness(self, loop: asyncio.AbstractEventLoop) -> None:
        """Abort the connections whose gateway owes an answer past ``liveness_timeout_s``: their supervisors see
        the loss, requeue what they carried and dial the cluster again, that gateway last."""
        now = loop.time()
        for index in self._liveness.dead(self._scheduler.live, now):
            slot = self._slots[index]
            self.stats.liveness_timeouts += 1
            self._liveness.opened(index)  # judged once; the supervisor drops it
            gateway = slot.gateway
            log.warning("%s conn%d: gateway %s sent nothing for %.1f s while owing an answer: taken for dead, "
                        "reconnecting", self.source_id, index,
                        "?" if gateway is None else f"{gateway.host}:{gateway.port}", self.settings.liveness_timeout_s)
            if gateway is not None and self.settings.liveness_timeout_s is not None:
                self._router.suspect(gateway, now + 2 * self.settings.liveness_timeout_s)
            if slot.writer is not None:
                slot.writer.transport.abort()  # close() would wait to flush to a peer that does not read

    # -- connections -----------------------------------------------------------------------------------------------

    def _hello(self) -> dict[str, Any]:
        return build_hello(self.source_id, self.streams, None if self._token is None else self._token())

    async def _open_at_connect(self, slot: _Slot) -> None:
        """``connect()``'s opening of one connection: a wrong address or credentials fail at once, but a cluster that
        says "not now" (a shard error, redirects still moving) is retried with backoff for ``connect_timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self.settings.connect_timeout_s
        while True:
            try:
                await self._open(slot)
            except GatewayRerouted as exc:
                self._rerouted(slot, exc)
                if exc.retry_after_ms is not None:
                    slot.backoff.reset()  # paced by the cluster's retry_after_ms (as in _supervise)
                delay = slot.backoff.next_delay()
                if delay is None or loop.time() + max(delay, slot.retry_after_s) > deadline_s:
                    raise
                await asyncio.sleep(max(delay, slot.retry_after_s))
                slot.retry_after_s = 0.0
                continue
            slot.backoff.reset()
            return

    async def _open(self, slot: _Slot) -> None:
        """Open one pool connection: one dialing round (``clients.core.RouteRound``: the owner, else the address
        list in order, following redirects), then the owner's time sync, then the connection goes live.

        Raises the last dialing failure when no gateway welcomed it, ``GatewayRerouted`` for a shard error or too
        many redirects, ``GatewayRejected`` for a refusal."""
        loop = asyncio.get_running_loop()
        route = self._router.round(loop.time())
        failure: BaseException | None = None
        while (target := route.next_target()) is not None:
            try:
                reader, writer, decoder, reply, rest = await self._handshake(slot, target)
            except GatewayRerouted:
                raise  # the cluster answered: another address would say the same now
            except (ConnectionError, OSError, TimeoutError) as exc:
                log.info("%s conn%d: %s:%d: %r", self.source_id, slot.index, target.host, target.port, exc)
                route.unreachable(target)
                if isinstance(exc, ConnectionRefusedError):
                    # Nobody listens there now: redirects naming it are waited out, not followed in a loop.
                    self._router.suspect(target, loop.time() + REFUSED_SUSPECT_S)
                failure = exc
                continue
            if isinstance(reply, Redirect):
                writer.close()
                self.stats.redirects += 1
                to = GatewayAddress(reply.host, reply.port, reply.timesync_port)
                log.info("%s conn%d: %s:%d redirects shard %d to %s at %s:%d", self.source_id, slot.index,
                         target.host, target.port, reply.shard, reply.gateway_id, to.host, to.port)
                if route.redirect_to_suspect(to):
                    # The cluster still names a gateway this source found dead: its shard has not moved yet.
                    self.stats.redirects_to_suspects += 1
                    raise GatewayRerouted(OWNER_UNRESPONSIVE, f"redirected to {to.host}:{to.port}, which did not "
                                          "answer: waiting for the cluster to move the shard",
                                          round(UNRESPONSIVE_OWNER_RETRY_S * 1000), target)
                if not route.redirected(to):
                    raise GatewayRerouted(TOO_MANY_REDIRECTS, f"more than {self._router.max_redirects} redirects in a "
                                          f"row, the last to {to.host}:{to.port}")
                continue
            owner = self._router.welcomed(target, reply.timesync_port)
            try:
                await self._time.follow_owner(owner, reply.clock_known)
            except BaseException:
                writer.close()
                raise
            try:
                self._go_live(slot, owner, reader, writer, decoder, reply, rest)
            except BaseException:
                # A frame that came with the welcome ended the session (a shard_moved, say): undo the slot.
                await self._drop(slot)
                raise
            return
        if failure is not None:
            # The OS's own error (refused, timed out, a TLS certificate refused) names the cause best.
            raise failure
        raise GatewayUnreachable(f"no gateway address left to dial of {self._describe_addresses()}")

    async def _handshake(self, slot: _Slot, target: GatewayAddress) -> tuple[
            asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder, Welcome | Redirect, list[dict[str, Any]]]:
        """Connect to ``target`` and say hello; the answer is a welcome or a redirect, an error frame raises."""
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(self.settings.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                target.host, target.port, ssl=self.settings.ssl,
                server_hostname=self.settings.server_hostname if self.settings.ssl is not None else None)
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
        if isinstance(reply, Welcome | Redirect):
            return reader, writer, decoder, reply, messages[1:]
        writer.close()
        if isinstance(reply, ErrorReply):
            if reply.code in ROUTING_ERROR_CODES:
                raise self._shard_error(reply, target)
            if reply.code in RETRYABLE_ERROR_CODES:
                raise GatewayFailed(reply.code, reply.message)
            raise GatewayRejected(reply.code, reply.message)
        raise GatewayRejected("unexpected_reply", f"expected welcome, got {messages[0].get('type')!r}")

    def _go_live(self, slot: _Slot, owner: GatewayAddress, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, decoder: FrameDecoder, welcome: Welcome,
                 rest: list[dict[str, Any]]) -> None:
        slot.max_frame_bytes = welcome.max_frame_bytes
        self._window.max_frame_bytes = min(s.max_frame_bytes for s in self._slots)
        slot.reader, slot.writer, slot.decoder, slot.gateway = reader, writer, decoder, owner
        self._scheduler.up(slot.index)
        self._idle.wrote(slot.index, asyncio.get_running_loop().time())
        self._liveness.opened(slot.index)
        self._router.cleared(owner)
        self.stats.connects += 1
        for message in rest:
            self._on_message(message)
        self._window.wake_sender()
        self._window.progressed()

    def _shard_error(self, reply: ErrorReply, gateway: GatewayAddress | None) -> GatewayRerouted:
        if reply.code == SHARD_MOVED:
            self.stats.shard_moves += 1
        elif reply.code == SHARD_UNAVAILABLE:
            self.stats.shard_unavailable += 1
        log.warning("%s: gateway %s: %s: %s", self.source_id,
                    "?" if gateway is None else f"{gateway.host}:{gateway.port}", reply.code, reply.message)
        return GatewayRerouted(reply.code, reply.message, reply.retry_after_ms, gateway)

    def _rerouted(self, slot: _Slot, exc: GatewayRerouted) -> None:
        """A shard error or unsettled redirects: that gateway is no longer taken for the owner, and the next dialing
        round of this connection waits at least the gateway's ``retry_after_ms``."""
        gateway = exc.gateway if exc.gateway is not None else slot.gateway
        if gateway is not None and exc.code != "redirect":
            self._router.forget(gateway)
        if exc.retry_after_ms is not None:
            slot.retry_after_s = max(slot.retry_after_s, exc.retry_after_ms / 1000)

    async def _drop(self, slot: _Slot) -> None:
        """Forget one connection: requeue what it carried, close the socket."""
        was_up = self._scheduler.is_up(slot.index)
        self._scheduler.down(slot.index)
        if was_up:
            requeued = self._window.store.connection_lost(slot.index)
            if requeued:
                log.info("%s conn%d lost; %d unacked events requeued", self.source_id, slot.index, requeued)
            # A new connection may land on a gateway that restarted: start pinned again.
            self._window.acked_streams.clear()
        writer, slot.writer, slot.reader = slot.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError, ssl_module.SSLError):
                await writer.wait_closed()

    async def _supervise(self, slot: _Slot) -> None:
        """Read one connection until it breaks, then reconnect with backoff; forever, until closed or failed."""
        while not self._window.closed:
            if slot.reader is not None:
                try:
                    await self._read_until_closed(slot)
                except GatewayRerouted as exc:
                    self._rerouted(slot, exc)
                except (ConnectionError, OSError, RemoteProtocolError) as exc:
                    log.info("%s conn%d: %r", self.source_id, slot.index, exc)
                self.stats.connection_losses += 1
                await self._drop(slot)
                if self._window.error is not None:
                    return
            delay = slot.backoff.next_delay()
            if delay is None:
                self._window.fail(GatewayUnreachable(f"gateway {self._describe_addresses()} unreachable after "
                                           f"{slot.backoff.attempts} reconnect attempts"))
                return
            delay, slot.retry_after_s = max(delay, slot.retry_after_s), 0.0
            await asyncio.sleep(delay)
            try:
                await self._open(slot)
            except GatewayRejected as exc:
                self._window.fail(exc)
                return
            except GatewayRerouted as exc:
                self._rerouted(slot, exc)
                if exc.retry_after_ms is not None:
                    # The cluster answered and said when to ask again: that, not a growing backoff, paces the
                    # retries, so the source is back within retry_after_ms of the shard being served again.
                    slot.backoff.reset()
                continue
            except (ConnectionError, OSError, TimeoutError, RemoteProtocolError, _AnyTimeSyncError) as exc:
                log.info("%s conn%d reconnect failed: %r", self.source_id, slot.index, exc)
                continue
            slot.backoff.reset()
            self.stats.reconnects += 1

    async def _read_until_closed(self, slot: _Slot) -> None:
        reader = slot.reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                return
            self._heard_from(slot, loop.time())
            for message in slot.decoder.feed(data):
                self._on_message(message)
                if self._window.error is not None:
                    return

    def _heard_from(self, slot: _Slot, now_s: float) -> None:
        """Bytes from ``slot``'s gateway: it is alive, for every pool connection open to it (an answer may come on
        another connection of the source than the one that asked)."""
        outstanding = len(self._window.store) > self._window.store.pending_count
        for index in self._scheduler.live:
            other = self._slots[index]
            if other is slot or (slot.gateway is not None and slot.gateway.same_gateway(other.gateway)):
                self._liveness.received(index, now_s, outstanding)

    def _on_message(self, raw: dict[str, Any]) -> None:
        try:
            message = parse_gateway_message(raw)
        except RemoteProtocolError as exc:
            # A newer gateway may send types this client does not know: ignored, not fatal.
            log.warning("%s: ignored a gateway message: %s", self.source_id, exc)
            return
        if isinstance(message, Ack):
            self._window.on_ack(message)
        elif isinstance(message, GapNotice):
            self._window.on_gap(message)
        elif isinstance(message, ResyncRequest):
            self._time.on_resync_request(message, self._window.closed)
        elif isinstance(message, Redirect):
            # Only an answer to a hello should carry one; later it still means the owner is elsewhere: go there.
            self.stats.redirects += 1
            self._router.owner = GatewayAddress(message.host, message.port, message.timesync_port)
            raise GatewayRerouted("redirect", f"redirected to {message.host}:{message.port} after the welcome")
        elif isinstance(message, ErrorReply):
            if message.fatal and message.code in ROUTING_ERROR_CODES:
                # Raised to the connection's supervisor: dropped, the list dialed again after retry_after_ms, the
                # unacked events resent to whichever gateway owns the shard now.
                raise self._shard_error(message, None)
            if message.fatal and message.code in RETRYABLE_ERROR_CODES:
                # Raised to the connection's supervisor: dropped, re-opened, its unacked events resent.
                raise GatewayFailed(message.code, message.message)
            error = GatewayRejected(message.code, message.message)
            if message.fatal:
                log.error("%s: gateway error %s", self.source_id, error)
                self._window.fail(error)
            elif message.stream is not None and message.seq is not None:
                self._window.on_refused(RefusedEvent(message.stream, message.seq, message.code, message.message))
            else:
                log.warning("%s: gateway warning %s", self.source_id, error)

    def _describe_addresses(self) -> str:
        return ", ".join(f"{a.host}:{a.port}" for a in self._router.addresses)

def _earliest(*waits_s: float | None) -> float | None:
    known = [w for w in waits_s if w is not None]
    return min(known) if known else None


@contextlib.asynccontextmanager
async def _flush_deadline(timeout_s: float, client: SkewlessClient) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise FlushTimeout(f"{client.unacked_count} events still unacknowledged after {timeout_s} s") from exc


async def _read_first_frames(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list[dict[str, Any]]:
    while True:
        data = await reader.read(_READ_CHUNK)
        if not data:
            raise ConnectionError("gateway closed the connection during the handshake")
        messages = decoder.feed(data)
        if messages:
            return messages


async def connect(host: str, tcp_port: int, udp_port: int | None, source_id: str,
                  sync_attempts: int = DEFAULT_COUNT, *, streams: Sequence[str],
                  **options: Unpack[ConnectOptions]) -> SkewlessClient:
    """Sample Code 4.1: ``await connect("10.100.1.138", 9892, 7452, "Sensor1", 10, streams=["temps"])``.

    Syncs the source clock with ``sync_attempts`` requests against the gateway's announced time-sync port, else
    ``udp_port`` (``time_sync=False``: no sync), opens the connection pool and returns the connected client;
    ``options`` are ``SkewlessClient``'s keyword arguments (``ConnectOptions``).
    """
    client = SkewlessClient(host, tcp_port, source_id, streams, udp_port=udp_port, sync_attempts=sync_attempts,
                            **options)
    await client.connect()
    return client



# help() and inspect show every option with its default, from the one place they are written.
SkewlessClient.__init__.__signature__ = keyword_signature(  # type: ignore[attr-defined]
    SkewlessClient.__init__, ClientSettings)
