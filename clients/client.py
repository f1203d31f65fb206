"""Async client SDK for event sources: time sync, a pool of connections, per-stream seqs, acks, resend.

The logic lives in the sans-IO core (``clients.core``: seqs, the unacked store, batching, pool scheduling,
backoff, idleness; ``clients.spool``: the file spool). The asyncio shell is in rooms, one concept each:
``clients.options`` (every option, once), ``clients.connection`` (handshake, redirects, supervision, liveness),
``clients.time_sync`` (the clock follows the shard's owner), ``clients.window`` (the send/ack window),
``clients.sender`` (batches and heartbeats onto the pool). This module is the facade that composes them and owns
their lifecycle.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, Self, Unpack

from clients.auth import TokenProvider, hmac_provider, static_token
from clients.connection import GatewayPool, GatewayRerouted, PoolConnection
from clients.core import DeliveryWatch, GatewayAddress, GatewayRouter, IdleTimer, UnackedStore
from clients.errors import ClientClosed, FlushTimeout, GatewayFailed, GatewayRejected
from clients.options import (
    DEFAULT_BATCH_EVENTS,
    DEFAULT_MAX_UNACKED,
    ClientOptions,
    ClientSettings,
    ConnectOptions,
    keyword_signature,
)
from clients.sender import Sender
from clients.stats import ClientStats
from clients.time_sync import OwnerTimeSync
from clients.window import InvalidInterval, RefusedEvent, SendWindow, interval_endpoint, is_int
from contract.wire.errors import RemoteProtocolError
from contract.wire.messages import ENDPOINT_END, ENDPOINT_START, MAX_SEQ, AtomicInterval, build_hello
from timesync.client import DEFAULT_COUNT
from timesync.estimator import ClockEstimate

__all__ = ["DEFAULT_BATCH_EVENTS", "DEFAULT_MAX_UNACKED", "ClientClosed", "ClientOptions", "ClientStats",
           "ConnectOptions", "GatewayFailed", "GatewayRejected", "GatewayRerouted", "InvalidInterval", "RefusedEvent",
           "SkewlessClient", "connect"]

log = logging.getLogger(__name__)


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
        self.settings = settings = ClientSettings.of("SkewlessClient.__init__", options)
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

        self._time = OwnerTimeSync(settings, source_id, self._router, self.stats, self._task_done)
        self._pool = GatewayPool(settings, source_id, self._router, self.stats, self._window, self._time, self._hello)
        self._sending = Sender(settings, self._pool, self._window, self.stats, self.heartbeat_ts_us)
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
        return len(self._pool.scheduler.live)

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

    # The rooms' state under the names the tests and benchmarks reach for.

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
    def _slots(self) -> list[PoolConnection]:
        return self._pool.connections

    @property
    def _idle(self) -> IdleTimer:
        return self._pool.idle

    @_idle.setter
    def _idle(self, idle: IdleTimer) -> None:
        self._pool.idle = idle

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
            for conn in self._pool.connections:
                await self._pool.open_at_connect(conn)
        except RemoteProtocolError as exc:
            # The gateway's own frames broke the protocol (a malformed or oversized frame in the handshake).
            await self._teardown()
            raise GatewayRejected(exc.code, str(exc)) from exc
        except BaseException:
            await self._teardown()
            raise
        self._connected = True
        for conn in self._pool.connections:
            conn.task = asyncio.create_task(self._pool.supervise(conn),
                                            name=f"skewless-{self.source_id}-conn{conn.index}")
            conn.task.add_done_callback(self._task_done)
        self._sender = asyncio.create_task(self._sending.run(), name=f"skewless-{self.source_id}-sender")
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
        await self._pool.stop()
        await self._teardown()
        self._window.closing()

    async def _teardown(self) -> None:
        await self._time.stop_tasks()
        for conn in self._pool.connections:
            await self._pool.drop(conn)
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
        seq = await self.send_interval_start(stream, interval_id, payload, source_ts_us, seq=seq)
        return self._window.track(stream, seq)

    async def send_interval_end_tracked(self, stream: str, interval_id: str, payload: Any,
                                        source_ts_us: int | None = None, *,
                                        seq: int | None = None) -> asyncio.Future[int]:
        """``send_interval_end()`` with a delivery future, as ``send_tracked()`` gives one."""
        seq = await self.send_interval_end(stream, interval_id, payload, source_ts_us, seq=seq)
        return self._window.track(stream, seq)

    async def send_pending(self) -> None:
        """Write every queued event to a connection now (no linger) and wait until they are written."""
        with self._window.writing_now():
            while self._window.store.pending_count and self._sender is not None and not self._sender.done():
                await self._window.next_progress()

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Wait until the gateway acknowledged every event sent so far (reconnecting as needed), and every queued
        event was written (a given-up seq's one send for the late topic included: docs/sdk.md, "Gaps").

        Raises ``FlushTimeout`` (a ``TimeoutError``) after ``timeout_s``, or the client's fatal error. Before
        ``connect()`` it raises ``RuntimeError`` when events are pending, since nothing could deliver them.
        """
        if not self._connected and len(self._window.store):
            raise RuntimeError("flush() before connect(): nothing can deliver the queued events")
        with self._window.writing_now():
            async with _flush_deadline(timeout_s, self):
                # A seq the gateway gave up is not unacknowledged, but its one send is still queued: written first,
                # or close() right after flush() would drop it.
                while len(self._window.store) or self._window.store.pending_count:
                    await self._window.next_progress(closed_fails=True)

    # -- connections -----------------------------------------------------------------------------------------------

    def _hello(self) -> dict[str, Any]:
        return build_hello(self.source_id, self.streams, None if self._token is None else self._token())

    def _on_message(self, raw: dict[str, Any]) -> None:
        self._pool.on_message(raw)


@contextlib.asynccontextmanager
async def _flush_deadline(timeout_s: float, client: SkewlessClient) -> AsyncIterator[None]:
    try:
        async with asyncio.timeout(timeout_s):
            yield
    except TimeoutError as exc:
        raise FlushTimeout(f"{client.unacked_count} events still unacknowledged after {timeout_s} s") from exc


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
