"""The send/ack window: what this source holds until the gateway acknowledges it.

The bookkeeping is pure (``clients.core``: ``SeqAssigner``, ``UnackedStore``, ``DeliveryWatch``,
``HeartbeatPromise``; ``clients.spool.FileSpool``); this module glues it together for one client: stamping and
encoding an event once, the spool, delivery futures, acks, refusals and gap notices, and the three signals that
``send()`` (room), ``flush()`` (progress) and the sender task (wake) wait on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgpack

from clients.core import DeliveryWatch, HeartbeatPromise, PendingEvent, SeqAssigner, UnackedStore, payload_fits
from clients.errors import (
    ClientClosed,
    EventGivenUp,
    EventRefused,
    EventTooLarge,
    InvalidPayload,
    SkewlessError,
)
from clients.options import ClientSettings
from clients.spool import FileSpool
from clients.stats import ClientStats
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES
from contract.wire.messages import (
    MAX_INTERVAL_ID_CHARS,
    MAX_SEQ,
    SEQ_CONFLICT,
    SEQ_JUMP,
    Ack,
    EventInterval,
    GapNotice,
    IntervalEndpoint,
    payload_problem,
)

__all__ = ["REFUSED_KEPT", "InvalidInterval", "RefusedEvent", "SendWindow", "interval_endpoint", "is_int"]

# Every room of the SDK logs under the name applications (and the reliability tests) filter on.
log = logging.getLogger("clients.client")

# The integers msgpack can encode (int64 and uint64).
_MIN_MSGPACK_INT = -(2**63)
_MAX_MSGPACK_INT = 2**64 - 1
# What InvalidPayload says a payload may hold (docs/wire-protocol.md, "Payloads").
_PAYLOAD_ACCEPTED = ("a payload holds None, bool, int (64 bits), finite float, str, lists and maps with string keys "
                     "(send a time as integer microseconds or an ISO 8601 string)")
# SkewlessClient.refused keeps the most recent refusals only: a source that sends nothing but bad payloads must not
# grow the client's memory without bound (stats.events_refused counts them all).
REFUSED_KEPT = 1000


class InvalidInterval(SkewlessError, ValueError):
    """An interval event the SDK will not send: a start after its end, a time outside ``[0, 2**63)``, or an interval
    id that is not a string of 1..128 characters (the gateway would refuse the frame)."""


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def interval_endpoint(interval_id: object, endpoint: str) -> IntervalEndpoint:
    if not isinstance(interval_id, str) or not 1 <= len(interval_id) <= MAX_INTERVAL_ID_CHARS:
        raise InvalidInterval(f"interval_id must be a string of 1..{MAX_INTERVAL_ID_CHARS} characters, got "
                              f"{interval_id!r:.60}")
    return IntervalEndpoint(interval_id, endpoint)


@dataclass(frozen=True, slots=True)
class RefusedEvent:
    """An event the gateway refused on its own (``invalid_payload``: its payload cannot travel in a JSON record).
    It is acknowledged with the events around it and never resent; it is not in Kafka."""

    stream: str
    seq: int
    code: str
    message: str


class SendWindow:
    """The events of one source between ``send()`` and their ack, and the client's fatal error and closed state
    (which every waiter of the window must see)."""

    def __init__(self, settings: ClientSettings, source_id: str, streams: list[str], stats: ClientStats) -> None:
        self._clock_us = settings.clock_us
        self._source_id = source_id
        self._stats = stats
        self.streams = streams
        self.declared = frozenset(streams)
        self.refused: deque[RefusedEvent] = deque(maxlen=REFUSED_KEPT)
        # The gateway's gap notices, newest last (docs/sdk.md, "Gaps"): which seqs it gave up and acked past.
        self.gaps: deque[GapNotice] = deque(maxlen=REFUSED_KEPT)
        # Refused seqs not acked yet, so that the refusal of a resend (the connection dropped before the ack) is
        # not counted twice; pruned by the acks.
        self._refused_unacked: set[tuple[str, int]] = set()
        # Delivery futures of the events sent with send_tracked(); empty (and free) when it is never used.
        self.deliveries: DeliveryWatch[asyncio.Future[int]] = DeliveryWatch()
        # Streams the gateway acked since the last connection loss (until then their first seqs are pinned).
        self.acked_streams: set[str] = set()
        # What heartbeats may claim, from the stamps sent so far and their send lags.
        self.promise = HeartbeatPromise()
        # The smallest frame any pool connection's gateway accepts: no event larger is queued.
        self.max_frame_bytes = DEFAULT_MAX_FRAME_BYTES
        self.error: BaseException | None = None
        self.closed = False
        self.flush_now = False
        self._wake: asyncio.Event | None = None
        self._progress: asyncio.Event | None = None
        self._room: asyncio.Event | None = None
        self.spool: FileSpool | None = None
        self.seqs, self.store = self._recover(settings)

    def _recover(self, settings: ClientSettings) -> tuple[SeqAssigner, UnackedStore]:
        """The seqs and the unacked events, from the spool when there is one (else empty)."""
        start_seq: dict[str, int] = {}
        acked: dict[str, int] = {}
        recovered: list[tuple[str, int, int, Any]] = []
        recovered_intervals: dict[tuple[str, int], EventInterval] = {}
        if settings.spool_path is not None:
            self.spool = FileSpool(settings.spool_path, self._source_id, max_bytes=settings.spool_max_bytes,
                                   fsync=settings.spool_fsync)
            state = self.spool.state
            undeclared = (set(state.next_seq) | {e[0] for e in state.events}) - set(self.streams)
            if undeclared:
                self.spool.close()
                raise ValueError(f"spool {settings.spool_path} holds streams {sorted(undeclared)} that are not "
                                 "declared")
            start_seq, acked, recovered = state.next_seq, state.acked_through, state.events
            recovered_intervals = state.intervals
        seqs = SeqAssigner(self.streams, start_seq)
        # Recovered events may exceed max_unacked: they were accepted before the restart.
        store = UnackedStore(self.streams, settings.max_unacked, acked)
        for stream, seq, ts_us, payload in recovered:
            store.add_recovered(stream, seq, ts_us, payload, recovered_intervals.get((stream, seq)))
        self._stats.recovered_from_spool = len(recovered)
        return seqs, store

    # -- signals ---------------------------------------------------------------------------------------------------

    def signals(self) -> tuple[asyncio.Event, asyncio.Event, asyncio.Event]:
        """(wake, progress, room), made on first use inside the event loop."""
        if self._wake is None or self._progress is None or self._room is None:
            self._wake, self._progress, self._room = asyncio.Event(), asyncio.Event(), asyncio.Event()
            self._room.set()
        return self._wake, self._progress, self._room

    def wake_sender(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def progressed(self) -> None:
        if self._progress is not None:
            self._progress.set()

    def made_room(self) -> None:
        """Events left the window: ``send()`` may have room, ``flush()`` may be done."""
        if self._room is not None:
            self._room.set()
        self.progressed()

    def fail(self, exc: BaseException) -> None:
        """The client's fatal error: kept (the first one), every delivery future fails, every waiter wakes."""
        if self.error is None:
            self.error = exc
        self.settle_deliveries(exc)
        for event in (self._wake, self._progress, self._room):
            if event is not None:
                event.set()

    def closing(self) -> None:
        self.settle_deliveries(ClientClosed("the client closed with this event unacknowledged"))
        if self._room is not None:
            self._room.set()

    def settle_deliveries(self, exc: BaseException) -> None:
        """Fail every delivery future still waiting: no ack will come for them from this client."""
        for future in self.deliveries.drain():
            if not future.done():
                future.set_exception(exc)
                # Retrieved here so that a future the application dropped does not log "exception never retrieved".
                future.exception()

    # -- sending ---------------------------------------------------------------------------------------------------

    async def wait_for_room(self) -> None:
        _wake, _progress, room = self.signals()
        while True:
            if self.error is not None:
                raise self.error
            if self.closed:
                raise ClientClosed("client is closed")
            if self.store.has_room and (self.spool is None or self.spool.has_room):
                return
            room.clear()
            await room.wait()

    @contextlib.contextmanager
    def writing_now(self) -> Iterator[None]:
        """The sender writes what is queued without lingering while the block runs; the client's fatal error is
        raised after it, since the sender may have stopped on one while the block waited."""
        self.flush_now = True
        try:
            yield
        finally:
            self.flush_now = False
        if self.error is not None:
            raise self.error

    async def next_progress(self, *, closed_fails: bool = False) -> None:
        """Wake the sender and wait until an event is written or acked (or the client fails).

        Raises the client's fatal error first; with ``closed_fails``, ``ClientClosed`` once the client is closed
        (``flush()``: the events it waits for can no longer be acknowledged).
        """
        if self.error is not None:
            raise self.error
        if closed_fails and self.closed:
            raise ClientClosed("client closed with events unacknowledged")
        _wake, progress, _room = self.signals()
        progress.clear()
        self.wake_sender()
        await progress.wait()

    def enqueue(self, stream: str, payload: Any, source_ts_us: int | None, seq: int | None,
                interval: EventInterval | None) -> int:
        """Stamp, number and hold one event; its payload is encoded here, once (frames and resends reuse it)."""
        if stream not in self.declared:
            raise ValueError(f"stream {stream!r} was not declared; declared: {self.streams}")
        payload_msgpack = self._encode(stream, payload)
        if seq is None:
            seq = self.seqs.next(stream)
        else:
            self.seqs.claim(stream, seq)
        if source_ts_us is None:
            ts_us = self._clock_us()
            self.promise.sent(ts_us, ts_us)
        else:
            ts_us = source_ts_us
            if not 0 <= ts_us <= MAX_SEQ:
                raise ValueError(f"source_ts_us {ts_us} is outside [0, 2**63)")
            self.promise.sent(ts_us, self._clock_us())
        event = self.store.add(stream, seq, ts_us, payload, interval, payload_msgpack)
        if event.gap_reason is not None:
            self._stats.events_given_up += 1
            log.info("%s: %s seq %d was given up by the gateway before it was sent; sent once for the late topic",
                     self._source_id, stream, seq)
        elif self.spool is not None:  # a given-up seq is written once, never resent: nothing to recover
            self.spool.append_event(stream, seq, ts_us, payload, interval)
        self.wake_sender()
        return seq

    def _encode(self, stream: str, payload: Any) -> bytes:
        if is_int(payload) and not _MIN_MSGPACK_INT <= payload <= _MAX_MSGPACK_INT:
            # packb raises OverflowError for a nested one too; this message names the value.
            raise OverflowError(f"integer payload {payload} is beyond msgpack's 64 bits")
        try:
            payload_msgpack: bytes = msgpack.packb(payload, use_bin_type=True)
        except TypeError:
            raise InvalidPayload(f"stream {stream!r}: cannot send {payload_problem(payload)}; "
                                 f"{_PAYLOAD_ACCEPTED}") from None
        if not payload_fits(len(payload_msgpack), self.max_frame_bytes):
            raise EventTooLarge(f"payload of {len(payload_msgpack)} bytes does not fit a "
                                f"{self.max_frame_bytes}-byte frame")
        return payload_msgpack

    def track(self, stream: str, sent_seq: int) -> asyncio.Future[int]:
        """A future of the delivery of an event just queued."""
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if sent_seq <= self.store.acked_through(stream):
            # Sent into a gap the gateway gave up before (UnackedStore.add): no ack will ever cover it.
            future.set_exception(EventGivenUp(stream, sent_seq, self.gap_reason(stream, sent_seq), True))
            return future
        # The send returned without yielding after queueing the event, so its ack cannot have been handled yet.
        self.deliveries.watch(stream, sent_seq, future)
        return future

    # -- the gateway's answers -------------------------------------------------------------------------------------

    def on_ack(self, ack: Ack) -> None:
        stream, seq = ack.stream, ack.seq
        released, passed_unsent = self.store.ack_passing(stream, seq)
        if passed_unsent:
            self._passed_unsent(passed_unsent)
        self.acked_streams.add(stream)
        if len(self.deliveries):
            for acked_seq, future in self.deliveries.acked(stream, seq):
                if not future.done():
                    future.set_result(acked_seq)
        if self._refused_unacked:
            self._refused_unacked = {r for r in self._refused_unacked if r[0] != stream or r[1] > seq}
        if released:
            self._stats.events_acked += released
            if self.spool is not None:
                self.spool.append_ack(stream, seq)
            self.made_room()

    def _passed_unsent(self, events: list[PendingEvent]) -> None:
        """Events an ack passed before they were written: the gateway gave them up (``UnackedStore.ack_passing``);
        their futures fail as a ``gap`` notice's would, and each is written once."""
        for event in events:
            reason = self.gap_reason(event.stream, event.seq)
            future = self.deliveries.refused(event.stream, event.seq)
            if future is not None and not future.done():
                future.set_exception(EventGivenUp(event.stream, event.seq, reason, True))
                future.exception()  # retrieved: logged below
        self._stats.events_given_up += len(events)
        log.warning("%s: the gateway's ack passed %d events before they were written (given up); each is sent once "
                    "for the late topic", self._source_id, len(events))
        self.wake_sender()
        self.made_room()

    def gap_reason(self, stream: str, seq: int) -> str:
        return next((g.reason for g in reversed(self.gaps) if g.stream == stream and g.first_seq <= seq <= g.last_seq),
                    "timeout")

    def on_gap(self, gap: GapNotice) -> None:
        """The gateway gave ``first_seq..last_seq`` up: its acks move past them. The events of them still held here
        fail their futures with ``EventGivenUp`` and are written once more (the gateway publishes each, once, on the
        late topic); ``flush()`` stops waiting for them (docs/sdk.md, "Gaps")."""
        if gap.stream not in self.declared:
            return
        self.gaps.append(gap)
        self._stats.seqs_given_up += gap.last_seq - gap.first_seq + 1
        given_up = self.store.give_up(gap.stream, gap.first_seq, gap.last_seq, gap.reason)
        for event in given_up:
            future = self.deliveries.refused(event.stream, event.seq)
            if future is not None and not future.done():
                future.set_exception(EventGivenUp(event.stream, event.seq, gap.reason, True))
                future.exception()  # retrieved: logged below
        self._stats.events_given_up += len(given_up)
        log.warning("%s: the gateway gave up %s seqs %d..%d (%s); %d of them resent once for the late topic",
                    self._source_id, gap.stream, gap.first_seq, gap.last_seq, gap.reason, len(given_up))
        if given_up:
            self.wake_sender()
            self.made_room()

    def on_refused(self, refused: RefusedEvent) -> None:
        key = (refused.stream, refused.seq)
        if (refused.stream not in self.declared or refused.seq <= self.store.acked_through(refused.stream)
                or key in self._refused_unacked):
            return  # a resend's refusal: counted the first time
        if refused.code == SEQ_JUMP:
            # Never acknowledged (the ack cannot pass a seq the gateway refused to accept): forgotten here, or flush()
            # would wait for it forever.
            if self.store.forget(refused.stream, refused.seq):
                self.made_room()
        else:
            self._refused_unacked.add(key)
        if refused.code == SEQ_CONFLICT:
            self._stats.conflicts += 1
        future = self.deliveries.refused(refused.stream, refused.seq)
        if future is not None and not future.done():
            future.set_exception(EventRefused(refused.stream, refused.seq, refused.code, refused.message))
            future.exception()  # retrieved: the refusal is logged below, a dropped future need not log it again
        self._stats.events_refused += 1
        self.refused.append(refused)
        log.warning("%s: the gateway refused %s seq %d (%s): %s", self._source_id, refused.stream, refused.seq,
                    refused.code, refused.message)
