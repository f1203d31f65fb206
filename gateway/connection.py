"""One TCP connection as an asyncio Protocol: bytes go into its GatewaySession, and the session's actions run in
order on a worker task. The connection knows the gateway only through ConnectionOwner.

Failure containment: the session answers every protocol violation itself, so anything raised while decoding or
carrying out an action is a gateway bug. Whatever it is, it is caught here, reported once to the owner with its
stage (who logs and counts it and writes an ``internal_error`` frame), and the connection is closed: it never stalls
with its client waiting, never propagates into asyncio or the timeout sweep, and never holds up shutdown's drain.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from contract.wire import messages
from gateway.ingest import ConnectionId
from gateway.logs import limited_log
from gateway.session import (
    CloseConnection,
    DrainRequested,
    EventsReceived,
    GatewaySession,
    HeartbeatReceived,
    SendBytes,
    SessionAction,
    SourceRegistered,
)
from timesync.clocks import ClockUs

log = logging.getLogger(__name__)

# Stop reading a connection while this many of its reads wait to be processed: TCP pushes back on the client.
MAX_PENDING_ACTIONS = 64
# ... or while this many bytes read from it wait to be processed. A read is decoded at once (into every frame it
# completes) and uvloop reads up to 256,000 bytes at a time: 64 reads of one-event frames (74 bytes, 392 B decoded)
# held 83 MiB of decoded frames per connection; a duplicate flood grew the gateway by 44 MiB this way (issue 24
# item 4). Bounded by bytes, a connection holds at most this plus one read, decoded (docs/operations.md, "Limits").
MAX_PENDING_READ_BYTES = 1024 * 1024
# How much of the loop's time one connection's read may take before the loop turns (timers, the other sockets, the
# commit and the delivery reports run, then the rest of the read): a read holds up to ~10 frames of 500 events, and at
# saturation a lagging source's frames each completed a merge round (10,000 records from one frame, 25-45 ms each), so
# one read kept every timer waiting: the commit due every 100 ms came 360-430 ms late, and the ingest core logged "the
# gateway did not run for 375 ms". A turn costs one task switch (~10 us), under 1 % of a slice.
WORK_SLICE_S = 0.002
# How long a connection closed after an error frame still reads (and drops) what its peer sends: see close().
ERROR_CLOSE_LINGER_S = 1.0
# A peer that does not read (issue 24 item 4): past the write high-water mark the connection stops reading it (its
# own sends then block in TCP), until its buffer drains below the low-water mark. Without this, every answer to a
# peer that never reads (an error frame per refused event, an ack per duplicate) queued in the gateway's memory:
# 62 -> 269 MiB in 27 s. A peer still undrained after SLOW_READER_TIMEOUT_US, or with more than
# WRITE_BUFFER_MAX_BYTES queued (answers to what was read before the pause), is closed with a reason and counted.
WRITE_HIGH_WATER_BYTES = 256 * 1024
WRITE_LOW_WATER_BYTES = 64 * 1024
WRITE_BUFFER_MAX_BYTES = 4 * 1024 * 1024
SLOW_READER_TIMEOUT_US = 60_000_000

# Where a connection failed (the `stage` label of skewless_gateway_worker_errors_total): the session decoding and
# parsing bytes, one of the worker's actions, or the worker task itself outside any action.
WorkerStage = Literal["session", "register", "events", "heartbeat", "worker"]
WORKER_STAGES: tuple[WorkerStage, ...] = ("session", "register", "events", "heartbeat", "worker")


@dataclass(frozen=True, slots=True)
class _Waiting:
    """What is left of a frame carried out in ``data_received``: the worker awaits it before the read's next
    actions."""

    waiting: Awaitable[None]


QueuedAction = SessionAction | _Waiting


class ConnectionOwner(Protocol):
    """What a connection asks of the gateway. The coroutines return once their Kafka records are handed to the
    producer: a connection that waits here stops reading (MAX_PENDING_ACTIONS), so a Kafka stall reaches the
    clients as TCP back-pressure."""

    def attach(self, connection: ConnectionHandler) -> ConnectionId: ...

    def detach(self, connection: ConnectionHandler) -> None: ...

    async def register_source(self, connection: ConnectionHandler, hello: messages.Hello) -> None: ...

    def receive_events(self, connection: ConnectionHandler, received: EventsReceived,
                       arrival_us: int) -> Awaitable[None] | None:
        """Carried out at once (called from ``data_received`` when nothing of the connection waits: no task switch
        per frame), returning None, or what is left to wait for, which the connection's worker awaits before its
        next action."""

    async def receive_heartbeat(self, received: HeartbeatReceived) -> None: ...

    async def source_left(self, source_id: str) -> None:
        """The source said bye on a connection (``said_bye`` set on it): once every connection it has open did, the
        merge stops waiting for it (issue 25 item 7, review B7)."""

    def session_failed(self, error_code: str) -> None: ...

    def worker_failed(self, connection: ConnectionHandler, stage: WorkerStage, error: BaseException) -> None:
        """Log and count it, and tell the client why before the connection closes."""

    def slow_reader_closed(self, connection: ConnectionHandler, reason: str) -> None:
        """The connection was closed because its peer does not read: count it and log it (rate-limited)."""


class ConnectionHandler(asyncio.Protocol):
    """One TCP connection: feeds the session and runs its actions in order on a worker task."""

    def __init__(self, owner: ConnectionOwner, session: GatewaySession, clock_us: ClockUs, *,
                 write_buffer_max_bytes: int = WRITE_BUFFER_MAX_BYTES,
                 slow_reader_timeout_us: int = SLOW_READER_TIMEOUT_US,
                 work_clock_s: Callable[[], float] = time.perf_counter, work_slice_s: float = WORK_SLICE_S) -> None:
        """``work_clock_s``: a monotonic clock (seconds) that measures this connection's work against
        ``work_slice_s`` (WORK_SLICE_S); not the event clock ``clock_us``."""
        self.session = session
        self.connection_id = ConnectionId(-1)  # the owner's id, from connection_made on
        self.transport: asyncio.Transport | None = None
        self.peer = "?"  # host:port of the client, for log lines
        self.said_bye = False  # the source said bye on this connection (the owner's rule 14 asks every one of them)
        self._owner = owner
        self._clock_us = clock_us
        self._queue: asyncio.Queue[tuple[int, int, Sequence[QueuedAction]]] = asyncio.Queue()
        self._queued_bytes = 0  # bytes of the reads in _queue (MAX_PENDING_READ_BYTES)
        self._worker: asyncio.Task[None] | None = None
        self._paused = False
        self._closing = False
        self._busy = False
        self._throttled = False
        self._failed = False
        # Half-closed after an error frame (close(after_error=True)): nothing more can be written to it.
        self._write_closed = False
        # Its peer does not read: since when (the clock's us), None while its writes flow.
        self._write_paused_since_us: int | None = None
        self._write_buffer_max_bytes = write_buffer_max_bytes
        self._closing_slow = False
        self._slow_reader_timeout_us = slow_reader_timeout_us
        self._work_clock_s = work_clock_s
        self._work_slice_s = work_slice_s
        self._slice_started_s = 0.0  # when the worker last came back from the loop

    @property
    def source_id(self) -> str | None:
        return self.session.source_id

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER_BYTES, low=WRITE_LOW_WATER_BYTES)
        peername = transport.get_extra_info("peername")
        if isinstance(peername, tuple) and len(peername) >= 2:
            self.peer = f"{peername[0]}:{peername[1]}"
        self.connection_id = self._owner.attach(self)
        self._worker = asyncio.create_task(self._run(), name=f"connection-{self.connection_id}")
        self._worker.add_done_callback(self._worker_done)

    def data_received(self, data: bytes) -> None:
        if self._closing:
            return
        now_us = self._clock_us()
        try:
            actions = self.session.receive_data(data, now_us)
        except Exception as exc:  # noqa: BLE001 - a bug of any kind: contained to this connection (module doc)
            self._fail("session", exc)
            return
        if actions and not self._busy and self._queue.empty():
            self._enqueue(now_us, self._apply_now(actions, now_us), len(data))
        else:
            self._enqueue(now_us, actions, len(data))

    def _apply_now(self, actions: list[SessionAction], arrival_us: int) -> Sequence[QueuedAction]:
        """Nothing of this connection waits: its leading actions that need no wait (a frame's events, bytes to send)
        are carried out here, without the worker's task switch; returned for the worker, in order, is the rest from
        the first one that waits or may wait, or once this read took its slice of the loop (WORK_SLICE_S)."""
        started_s = self._work_clock_s()
        for index, action in enumerate(actions):
            if index and self._work_clock_s() - started_s > self._work_slice_s:
                return actions[index:]
            kind = type(action)
            try:
                if kind is EventsReceived:
                    waiting = self._owner.receive_events(self, cast(EventsReceived, action), arrival_us)
                    if waiting is not None:
                        return [_Waiting(waiting), *actions[index + 1:]]
                elif kind is SendBytes:
                    self.send_bytes(cast(SendBytes, action).data)
                else:
                    return actions[index:]
            except Exception as exc:  # noqa: BLE001 - as in _run
                self._fail(_STAGES[kind], exc)
                return []
        return []

    def pause_writing(self) -> None:
        """asyncio: the write buffer passed the high-water mark. Read nothing more from a peer that does not read
        what it is sent (its own sends then block in TCP), until resume_writing."""
        if self._write_paused_since_us is None:
            self._write_paused_since_us = self._clock_us()
        if self.transport is not None and not self._closing:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        """asyncio: the write buffer drained below the low-water mark: read again, unless another reason holds."""
        self._write_paused_since_us = None
        if self.transport is not None and not self._closing and not self._paused and not self._throttled:
            self.transport.resume_reading()

    def _close_slow_reader(self, reason: str) -> None:
        self._closing = True
        self._owner.slow_reader_closed(self, reason)
        if self.transport is not None:
            # close() would first wait for the peer to read what is queued: a peer that does not read, never.
            self.transport.abort()

    def check_timeouts(self, now_us: int) -> None:
        if self._closing:
            return
        since_us = self._write_paused_since_us
        if since_us is not None and now_us - since_us > self._slow_reader_timeout_us:
            queued = self.transport.get_write_buffer_size() if self.transport is not None else 0
            self._close_slow_reader(f"did not read for {self._slow_reader_timeout_us / 1e6:.1f} s with {queued} "
                                    f"bytes queued")
            return
        try:
            actions = self.session.check_timeouts(now_us)
        except Exception as exc:  # noqa: BLE001 - as above; raised, it would kill every connection's sweep
            self._fail("session", exc)
            return
        self._enqueue(now_us, actions)

    def connection_lost(self, exc: Exception | None) -> None:
        self.session.connection_lost()
        self._closing = True
        self._owner.detach(self)
        if self._worker is not None:
            self._worker.cancel()
        while not self._queue.empty():  # dropped: a wait left unawaited is closed, not warned about at its collection
            for action in self._queue.get_nowait()[2]:
                if isinstance(action, _Waiting):
                    getattr(action.waiting, "close", lambda: None)()

    @property
    def writable(self) -> bool:
        # A half-closed connection is still open for reading (is_closing() is False): an ack sent to it would be
        # lost, and with it the last ack of a source that sends nothing more.
        return self.transport is not None and not self.transport.is_closing() and not self._write_closed

    def send_bytes(self, data: bytes) -> None:
        if self.writable and not self._closing_slow:
            assert self.transport is not None
            queued = self.transport.get_write_buffer_size() + len(data)
            if queued > self._write_buffer_max_bytes:
                self._closing_slow = True
                self._close_slow_reader(f"{queued} bytes would be queued for a peer that does not read "
                                        f"(cap {self._write_buffer_max_bytes})")
                return
            self.transport.write(data)

    def close(self, *, after_error: bool = False) -> None:
        """``after_error``: an error frame (or a redirect) was just written and the peer may still be writing.
        Closing with its bytes unread makes the kernel reset the connection, and the reset can destroy the frame
        before the peer reads it (seen with slow-loris peers on a loaded machine): so half-close instead (FIN after
        the frame), keep reading and dropping what still comes, and close when the peer does or after
        ERROR_CLOSE_LINGER_S. TLS transports cannot half-close: they close at once."""
        self._closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if after_error and transport.can_write_eof():
            try:
                transport.write_eof()
            except OSError:
                # The peer is already gone (ENOTCONN after its reset): nothing left to protect, nothing to report.
                transport.close()
                return
            self._write_closed = True
            if self._paused or self._throttled:
                self._paused = self._throttled = False
                transport.resume_reading()
            asyncio.get_running_loop().call_later(ERROR_CLOSE_LINGER_S, transport.close)
            return
        transport.close()

    def set_throttled(self, throttled: bool) -> None:
        """The gateway's buffer limit: stop (or resume) reading, whatever this connection's own backlog says."""
        if throttled == self._throttled or self.transport is None or self._closing:
            return
        self._throttled = throttled
        if throttled:
            self.transport.pause_reading()
        elif not self._paused and self._write_paused_since_us is None:
            self.transport.resume_reading()

    def pause(self) -> None:
        """Shutdown: read nothing more; what was already read is still processed."""
        self._closing = True
        if self.transport is not None and not self._paused:
            self.transport.pause_reading()
            self._paused = True

    @property
    def idle(self) -> bool:
        # A dead worker processes nothing more: shutdown's drain must not wait for its queue.
        worker_dead = self._worker is not None and self._worker.done()
        return worker_dead or (self._queue.empty() and not self._busy)

    def _enqueue(self, now_us: int, actions: Sequence[QueuedAction], read_bytes: int = 0) -> None:
        if actions:
            self._queue.put_nowait((now_us, read_bytes, actions))
            self._queued_bytes += read_bytes
            if ((self._queue.qsize() >= MAX_PENDING_ACTIONS or self._queued_bytes >= MAX_PENDING_READ_BYTES)
                    and not self._paused and self.transport is not None):
                self.transport.pause_reading()
                self._paused = True

    async def _run(self) -> None:
        while True:
            if self._queue.empty():
                arrival_us, read_bytes, actions = await self._queue.get()
                self._slice_started_s = self._work_clock_s()
            else:
                arrival_us, read_bytes, actions = self._queue.get_nowait()
            self._queued_bytes -= read_bytes
            self._busy = True
            try:
                for action in actions:
                    if self._work_clock_s() - self._slice_started_s > self._work_slice_s:
                        await self._turn()
                    try:
                        await self._apply(action, arrival_us)
                    except Exception as exc:  # noqa: BLE001 - as in data_received
                        # The actions still queued belong to a connection that is closing: its client resends
                        # whatever they carried that was not acknowledged.
                        self._fail(_STAGES[type(action)], exc)
                        return
            finally:
                self._busy = False
            if not self._queue.empty():
                # A backlog (reads queued while a wait held this connection: Kafka's back-pressure) is carried out
                # one read per loop turn: drained in one step, 20 connections' backlogs of ~50 frames each kept the
                # loop from every socket for up to 40 ms at 20 x 500 events/s.
                await self._turn()
            if (self._paused and not self._closing and not self._throttled
                    and self._queue.qsize() < MAX_PENDING_ACTIONS // 2
                    and self._queued_bytes < MAX_PENDING_READ_BYTES // 2 and self.transport is not None):
                self._paused = False
                if self._write_paused_since_us is None:
                    self.transport.resume_reading()

    async def _turn(self) -> None:
        """Let the loop turn (timers, other connections) before this connection's next work."""
        await asyncio.sleep(0)
        self._slice_started_s = self._work_clock_s()

    def _worker_done(self, worker: asyncio.Task[None]) -> None:
        # _run catches what its actions raise; this is for anything else (a BaseException, a bug in _run itself).
        if worker.cancelled():
            return
        error = worker.exception()
        if error is not None:
            self._fail("worker", error)

    def _fail(self, stage: WorkerStage, error: BaseException) -> None:
        # A connection left open after a failure would keep its client waiting for a welcome or acks forever: close
        # it, so the client reconnects and resends (nothing unacknowledged is lost). Reported once: the first
        # failure is the cause, what follows on a closing connection is noise.
        if self._failed:
            return
        self._failed = True
        self._busy = False
        self._owner.worker_failed(self, stage, error)  # may still write a last frame: the close comes after it
        self.close(after_error=True)

    async def _apply(self, action: QueuedAction, arrival_us: int) -> None:
        if isinstance(action, _Waiting):
            await action.waiting
        elif isinstance(action, SourceRegistered):
            await self._owner.register_source(self, action.hello)
        elif isinstance(action, SendBytes):
            self.send_bytes(action.data)
        elif isinstance(action, EventsReceived):
            waiting = self._owner.receive_events(self, action, arrival_us)
            if waiting is not None:
                await waiting
        elif isinstance(action, HeartbeatReceived):
            await self._owner.receive_heartbeat(action)
        elif isinstance(action, DrainRequested):
            # The source said bye: the merge gives it up now, not after its wait (issue 25 item 7), once its other
            # connections said bye too (the owner checks). Acks for this source keep flowing to them; this one can go.
            self.said_bye = True
            if self.source_id is not None:
                await self._owner.source_left(self.source_id)
            self.close()
        elif isinstance(action, CloseConnection):
            if action.error_code is not None:
                self._owner.session_failed(action.error_code)
                # One line per bad connection: a flood of them is rate-limited (counted exactly by session_failed).
                limited_log(log, logging.WARNING, f"close:{action.error_code}", "closing connection: %s",
                            action.reason)
            self.close(after_error=action.error_code is not None)


_STAGES: dict[type[QueuedAction], WorkerStage] = {
    SourceRegistered: "register", EventsReceived: "events", _Waiting: "events", HeartbeatReceived: "heartbeat",
    SendBytes: "worker", DrainRequested: "worker", CloseConnection: "worker"}
