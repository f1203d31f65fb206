"""The connection pool of one source: handshake, redirects, supervision (reconnect with backoff), liveness.

The decisions are pure (``clients.core``: ``GatewayRouter`` and its ``RouteRound`` pick the address, ``Backoff``,
``PoolScheduler``, ``IdleTimer``, ``GatewayLiveness``); this module opens the sockets, reads them (one supervisor
task per pool connection) and hands each gateway message to the room it concerns: acks, refusals and gaps to the
send window, resync requests to the time sync, redirects and error frames to the connection itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl as ssl_module
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clients.core import Backoff, GatewayAddress, GatewayLiveness, GatewayRouter, IdleTimer, PoolScheduler, RouteRound
from clients.errors import GatewayFailed, GatewayRejected, GatewayUnreachable
from clients.options import ClientSettings
from clients.stats import ClientStats
from clients.time_sync import OwnerTimeSync
from clients.window import RefusedEvent, SendWindow
from contract.wire.errors import ROUTING_ERROR_CODES, SHARD_MOVED, SHARD_UNAVAILABLE, RemoteProtocolError
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from contract.wire.messages import (
    Ack,
    ErrorReply,
    GapNotice,
    Redirect,
    ResyncRequest,
    Welcome,
    build_bye,
    parse_gateway_message,
)
from timesync.client import TimeSyncError as _AnyTimeSyncError

__all__ = ["OWNER_UNRESPONSIVE", "RETRYABLE_ERROR_CODES", "TOO_MANY_REDIRECTS", "GatewayPool", "GatewayRerouted",
           "PoolConnection", "write_frame"]

# Every room of the SDK logs under the name applications (and the reliability tests) filter on.
log = logging.getLogger("clients.client")

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
# A hello answered slower than this is logged (the gateway creates missing topics before it answers).
_SLOW_HELLO_S = 5.0

_Handshake = tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder, Welcome | Redirect, list[dict[str, Any]]]


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


def write_frame(writer: asyncio.StreamWriter, data: bytes) -> bool:
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
    if not write_frame(writer, data):
        raise ConnectionError("the connection closed before the write")


@dataclass
class PoolConnection:
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


class GatewayPool:
    """The ``pool_size`` connections of one source to the gateway that owns its shard."""

    def __init__(self, settings: ClientSettings, source_id: str, router: GatewayRouter, stats: ClientStats,
                 window: SendWindow, time: OwnerTimeSync, hello: Callable[[], dict[str, Any]]) -> None:
        self._settings = settings
        self._source_id = source_id
        self._router = router
        self._stats = stats
        self._window = window
        self._time = time
        self._hello = hello
        pool_size, heartbeat_interval_s = settings.pool_size, settings.heartbeat_interval_s
        self.scheduler = PoolScheduler(pool_size)
        self.idle = IdleTimer(pool_size, heartbeat_interval_s, settings.keepalive_interval_s)
        # A heartbeat probes a connection that has waited this long for an ack (Kafka may be slow, the gateway not).
        self.liveness = GatewayLiveness(pool_size, settings.liveness_timeout_s, heartbeat_interval_s)
        base_backoff = settings.backoff if settings.backoff is not None else Backoff()
        self.connections = [PoolConnection(i, base_backoff.copy()) for i in range(pool_size)]

    def describe_addresses(self) -> str:
        return ", ".join(f"{a.host}:{a.port}" for a in self._router.addresses)

    # -- opening ---------------------------------------------------------------------------------------------------

    async def open_at_connect(self, conn: PoolConnection) -> None:
        """``connect()``'s opening of one connection: a wrong address or credentials fail at once, but a cluster that
        says "not now" (a shard error, redirects still moving) is retried with backoff for ``connect_timeout_s``."""
        loop = asyncio.get_running_loop()
        deadline_s = loop.time() + self._settings.connect_timeout_s
        while True:
            try:
                await self.open(conn)
            except GatewayRerouted as exc:
                self._rerouted(conn, exc)
                if exc.retry_after_ms is not None:
                    conn.backoff.reset()  # paced by the cluster's retry_after_ms (as in supervise)
                delay = conn.backoff.next_delay()
                if delay is None or loop.time() + max(delay, conn.retry_after_s) > deadline_s:
                    raise
                await asyncio.sleep(max(delay, conn.retry_after_s))
                conn.retry_after_s = 0.0
                continue
            conn.backoff.reset()
            return

    async def open(self, conn: PoolConnection) -> None:
        """Open one pool connection: one dialing round (``clients.core.RouteRound``: the owner, else the address
        list in order, following redirects), then the owner's time sync, then the connection goes live.

        Raises the last dialing failure when no gateway welcomed it, ``GatewayRerouted`` for a shard error or too
        many redirects, ``GatewayRejected`` for a refusal."""
        loop = asyncio.get_running_loop()
        route = self._router.round(loop.time())
        failure: BaseException | None = None
        while (target := route.next_target()) is not None:
            try:
                reader, writer, decoder, reply, rest = await self._handshake(conn, target)
            except GatewayRerouted:
                raise  # the cluster answered: another address would say the same now
            except (ConnectionError, OSError, TimeoutError) as exc:
                log.info("%s conn%d: %s:%d: %r", self._source_id, conn.index, target.host, target.port, exc)
                route.unreachable(target)
                if isinstance(exc, ConnectionRefusedError):
                    # Nobody listens there now: redirects naming it are waited out, not followed in a loop.
                    self._router.suspect(target, loop.time() + REFUSED_SUSPECT_S)
                failure = exc
                continue
            if isinstance(reply, Redirect):
                writer.close()
                self._follow_redirect(conn, route, target, reply)
                continue
            owner = self._router.welcomed(target, reply.timesync_port)
            try:
                await self._time.follow_owner(owner, reply.clock_known)
            except BaseException:
                writer.close()
                raise
            try:
                self._go_live(conn, owner, reader, writer, decoder, reply, rest)
            except BaseException:
                # A frame that came with the welcome ended the session (a shard_moved, say): undo the connection.
                await self.drop(conn)
                raise
            return
        if failure is not None:
            # The OS's own error (refused, timed out, a TLS certificate refused) names the cause best.
            raise failure
        raise GatewayUnreachable(f"no gateway address left to dial of {self.describe_addresses()}")

    def _follow_redirect(self, conn: PoolConnection, route: RouteRound, target: GatewayAddress,
                         reply: Redirect) -> None:
        """A gateway that does not own the shard named the owner: dial it next, unless the redirects loop or name a
        gateway this source found dead (``GatewayRerouted`` then)."""
        self._stats.redirects += 1
        to = GatewayAddress(reply.host, reply.port, reply.timesync_port)
        log.info("%s conn%d: %s:%d redirects shard %d to %s at %s:%d", self._source_id, conn.index,
                 target.host, target.port, reply.shard, reply.gateway_id, to.host, to.port)
        if route.redirect_to_suspect(to):
            # The cluster still names a gateway this source found dead: its shard has not moved yet.
            self._stats.redirects_to_suspects += 1
            raise GatewayRerouted(OWNER_UNRESPONSIVE, f"redirected to {to.host}:{to.port}, which did not "
                                  "answer: waiting for the cluster to move the shard",
                                  round(UNRESPONSIVE_OWNER_RETRY_S * 1000), target)
        if not route.redirected(to):
            raise GatewayRerouted(TOO_MANY_REDIRECTS, f"more than {self._router.max_redirects} redirects in a "
                                  f"row, the last to {to.host}:{to.port}")

    async def _handshake(self, conn: PoolConnection, target: GatewayAddress) -> _Handshake:
        """Connect to ``target`` and say hello; the answer is a welcome or a redirect, an error frame raises."""
        settings = self._settings
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(settings.connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                target.host, target.port, ssl=settings.ssl,
                server_hostname=settings.server_hostname if settings.ssl is not None else None)
            decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
            try:
                _write_or_raise(writer, encode_frame(self._hello()))
                messages = await _read_first_frames(reader, decoder)
            except BaseException:
                writer.close()
                raise
        elapsed_s = asyncio.get_running_loop().time() - started
        if elapsed_s > _SLOW_HELLO_S:
            log.warning("%s conn%d: the gateway took %.1f s to answer the hello", self._source_id, conn.index,
                        elapsed_s)
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

    def _go_live(self, conn: PoolConnection, owner: GatewayAddress, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter, decoder: FrameDecoder, welcome: Welcome,
                 rest: list[dict[str, Any]]) -> None:
        conn.max_frame_bytes = welcome.max_frame_bytes
        self._window.max_frame_bytes = min(c.max_frame_bytes for c in self.connections)
        conn.reader, conn.writer, conn.decoder, conn.gateway = reader, writer, decoder, owner
        self.scheduler.up(conn.index)
        self.idle.wrote(conn.index, asyncio.get_running_loop().time())
        self.liveness.opened(conn.index)
        self._router.cleared(owner)
        self._stats.connects += 1
        for message in rest:
            self.on_message(message)
        self._window.wake_sender()
        self._window.progressed()

    def _shard_error(self, reply: ErrorReply, gateway: GatewayAddress | None) -> GatewayRerouted:
        if reply.code == SHARD_MOVED:
            self._stats.shard_moves += 1
        elif reply.code == SHARD_UNAVAILABLE:
            self._stats.shard_unavailable += 1
        log.warning("%s: gateway %s: %s: %s", self._source_id,
                    "?" if gateway is None else f"{gateway.host}:{gateway.port}", reply.code, reply.message)
        return GatewayRerouted(reply.code, reply.message, reply.retry_after_ms, gateway)

    def _rerouted(self, conn: PoolConnection, exc: GatewayRerouted) -> None:
        """A shard error or unsettled redirects: that gateway is no longer taken for the owner, and the next dialing
        round of this connection waits at least the gateway's ``retry_after_ms``."""
        gateway = exc.gateway if exc.gateway is not None else conn.gateway
        if gateway is not None and exc.code != "redirect":
            self._router.forget(gateway)
        if exc.retry_after_ms is not None:
            conn.retry_after_s = max(conn.retry_after_s, exc.retry_after_ms / 1000)

    # -- running ---------------------------------------------------------------------------------------------------

    async def drop(self, conn: PoolConnection) -> None:
        """Forget one connection: requeue what it carried, close the socket."""
        was_up = self.scheduler.is_up(conn.index)
        self.scheduler.down(conn.index)
        if was_up:
            requeued = self._window.store.connection_lost(conn.index)
            if requeued:
                log.info("%s conn%d lost; %d unacked events requeued", self._source_id, conn.index, requeued)
            # A new connection may land on a gateway that restarted: start pinned again.
            self._window.acked_streams.clear()
        writer, conn.writer, conn.reader = conn.writer, None, None
        if writer is not None:
            writer.close()
            with contextlib.suppress(ConnectionError, OSError, ssl_module.SSLError):
                await writer.wait_closed()

    async def supervise(self, conn: PoolConnection) -> None:
        """Read one connection until it breaks, then reconnect with backoff; forever, until closed or failed."""
        window = self._window
        while not window.closed:
            if conn.reader is not None:
                try:
                    await self._read_until_closed(conn)
                except GatewayRerouted as exc:
                    self._rerouted(conn, exc)
                except (ConnectionError, OSError, RemoteProtocolError) as exc:
                    log.info("%s conn%d: %r", self._source_id, conn.index, exc)
                self._stats.connection_losses += 1
                await self.drop(conn)
                if window.error is not None:
                    return
            delay = conn.backoff.next_delay()
            if delay is None:
                window.fail(GatewayUnreachable(f"gateway {self.describe_addresses()} unreachable after "
                                               f"{conn.backoff.attempts} reconnect attempts"))
                return
            delay, conn.retry_after_s = max(delay, conn.retry_after_s), 0.0
            await asyncio.sleep(delay)
            try:
                live = await self._reopen(conn)
            except GatewayRejected as exc:
                window.fail(exc)
                return
            if live:
                conn.backoff.reset()
                self._stats.reconnects += 1

    async def _reopen(self, conn: PoolConnection) -> bool:
        """One reconnect attempt of ``supervise``: True when the connection is live again, False when it is to be
        retried; a refusal (``GatewayRejected``) raises."""
        try:
            await self.open(conn)
        except GatewayRerouted as exc:
            self._rerouted(conn, exc)
            if exc.retry_after_ms is not None:
                # The cluster answered and said when to ask again: that, not a growing backoff, paces the
                # retries, so the source is back within retry_after_ms of the shard being served again.
                conn.backoff.reset()
        except (ConnectionError, OSError, TimeoutError, RemoteProtocolError, _AnyTimeSyncError) as exc:
            log.info("%s conn%d reconnect failed: %r", self._source_id, conn.index, exc)
        else:
            return True
        return False

    async def _read_until_closed(self, conn: PoolConnection) -> None:
        reader = conn.reader
        assert reader is not None
        loop = asyncio.get_running_loop()
        while True:
            data = await reader.read(_READ_CHUNK)
            if not data:
                return
            now_s = loop.time()
            for message in conn.decoder.feed(data):
                self.on_message(message)
                if self._window.error is not None:
                    return
            # After the messages: whether events are still unacknowledged is judged with this read's acks applied.
            # Before them, the read that acked everything left the connection owing an answer that nothing would
            # send (no events left to ack), and an idle client took its gateway for dead one timeout later.
            self._heard_from(conn, now_s)

    def _heard_from(self, conn: PoolConnection, now_s: float) -> None:
        """Bytes from ``conn``'s gateway: it is alive, for every pool connection open to it (an answer may come on
        another connection of the source than the one that asked)."""
        store = self._window.store
        outstanding = len(store) > store.pending_count
        for index in self.scheduler.live:
            other = self.connections[index]
            if other is conn or (conn.gateway is not None and conn.gateway.same_gateway(other.gateway)):
                self.liveness.received(index, now_s, outstanding)

    def check_liveness(self, now_s: float) -> None:
        """Abort the connections whose gateway owes an answer past ``liveness_timeout_s``: their supervisors see
        the loss, requeue what they carried and dial the cluster again, that gateway last."""
        timeout_s = self._settings.liveness_timeout_s
        for index in self.liveness.dead(self.scheduler.live, now_s):
            conn = self.connections[index]
            self._stats.liveness_timeouts += 1
            self.liveness.opened(index)  # judged once; the supervisor drops it
            gateway = conn.gateway
            log.warning("%s conn%d: gateway %s sent nothing for %.1f s while owing an answer: taken for dead, "
                        "reconnecting", self._source_id, index,
                        "?" if gateway is None else f"{gateway.host}:{gateway.port}", timeout_s)
            if gateway is not None and timeout_s is not None:
                self._router.suspect(gateway, now_s + 2 * timeout_s)
            if conn.writer is not None:
                conn.writer.transport.abort()  # close() would wait to flush to a peer that does not read

    async def stop(self) -> None:
        """Stop the supervisors and say ``bye`` on every live connection (the sockets stay for ``drop``)."""
        for conn in self.connections:
            if conn.task is not None:
                conn.task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await conn.task
        for conn in self.connections:
            if conn.writer is not None and self.scheduler.is_up(conn.index):
                with contextlib.suppress(ConnectionError, OSError):
                    if write_frame(conn.writer, encode_frame(build_bye())):
                        await conn.writer.drain()

    # -- the gateway's messages ------------------------------------------------------------------------------------

    def on_message(self, raw: dict[str, Any]) -> None:
        """One message from the gateway, to the room it concerns. Redirects and fatal routing or retryable errors
        raise to the connection's supervisor, which drops the connection and dials again."""
        try:
            message = parse_gateway_message(raw)
        except RemoteProtocolError as exc:
            # A newer gateway may send types this client does not know: ignored, not fatal.
            log.warning("%s: ignored a gateway message: %s", self._source_id, exc)
            return
        if isinstance(message, Ack):
            self._window.on_ack(message)
        elif isinstance(message, GapNotice):
            self._window.on_gap(message)
        elif isinstance(message, ResyncRequest):
            self._time.on_resync_request(message, self._window.closed)
        elif isinstance(message, Redirect):
            # Only an answer to a hello should carry one; later it still means the owner is elsewhere: go there.
            self._stats.redirects += 1
            self._router.owner = GatewayAddress(message.host, message.port, message.timesync_port)
            raise GatewayRerouted("redirect", f"redirected to {message.host}:{message.port} after the welcome")
        elif isinstance(message, ErrorReply):
            self._on_error(message)

    def _on_error(self, message: ErrorReply) -> None:
        if message.fatal and message.code in ROUTING_ERROR_CODES:
            # Raised to the connection's supervisor: dropped, the list dialed again after retry_after_ms, the
            # unacked events resent to whichever gateway owns the shard now.
            raise self._shard_error(message, None)
        if message.fatal and message.code in RETRYABLE_ERROR_CODES:
            # Raised to the connection's supervisor: dropped, re-opened, its unacked events resent.
            raise GatewayFailed(message.code, message.message)
        error = GatewayRejected(message.code, message.message)
        if message.fatal:
            log.error("%s: gateway error %s", self._source_id, error)
            self._window.fail(error)
        elif message.stream is not None and message.seq is not None:
            self._window.on_refused(RefusedEvent(message.stream, message.seq, message.code, message.message))
        else:
            log.warning("%s: gateway warning %s", self._source_id, error)


async def _read_first_frames(reader: asyncio.StreamReader, decoder: FrameDecoder) -> list[dict[str, Any]]:
    while True:
        data = await reader.read(_READ_CHUNK)
        if not data:
            raise ConnectionError("gateway closed the connection during the handshake")
        messages = decoder.feed(data)
        if messages:
            return messages
