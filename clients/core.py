"""The SDK's sans-IO core: sequence numbers, the unacknowledged store, batching, pool scheduling, backoff, idleness.

Nothing here does I/O or reads a clock: the asyncio shell in ``clients.client`` passes times in (``now_s``, loop
time) and moves bytes. Every class is unit-tested on its own (tests/unit/clients/test_client_core.py).
"""

from __future__ import annotations

import heapq
import random
from collections import deque
from collections.abc import Iterable, KeysView, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

import msgpack

from clients.errors import EventTooLarge
from contract.wire.frames import HEADER
from contract.wire.messages import (
    MAX_SEQ,
    EventInterval,
    build_event,
    encode_event,
    events_body_bytes,
    events_frame_body,
)

__all__ = [
    "DEFAULT_KEEPALIVE_S",
    "Backoff",
    "DeliveryWatch",
    "EventTooLarge",
    "GatewayAddress",
    "GatewayRouter",
    "HeartbeatPromise",
    "IdleTimer",
    "PendingEvent",
    "PoolScheduler",
    "ResyncGate",
    "RouteRound",
    "SeqAssigner",
    "StoreFull",
    "UnackedStore",
    "encode_batches",
]

T = TypeVar("T")

# Gap ranges the store remembers for seqs the application has not sent yet, per stream (like ``client.gaps``).
UNSENT_GAPS_KEPT = 1000


class StoreFull(Exception):
    """``max_unacked`` events are outstanding; the shell waits for acks (``send()`` blocks)."""


@dataclass(slots=True)
class PendingEvent:
    """An event between ``send()`` and its ack. ``slot`` is the pool connection it was last written to."""

    stream: str
    seq: int
    source_ts_us: int
    payload: Any
    order: int = 0
    """Creation order across streams: resends go out in the order the application sent."""
    slot: int | None = None
    resend: bool = False
    """Queued again after a connection loss, or recovered from a spool: it may have reached the gateway."""
    interval: EventInterval | None = None
    """An interval event's keys (docs/wire-protocol.md, "Interval events"): every resend carries them again."""
    given_up: bool = False
    """The gateway gave its seq up (a ``gap`` notice): no longer unacknowledged, written once more anyway, so that
    it reaches the late topic instead of nowhere (``UnackedStore.give_up``)."""
    gap_reason: str | None = None
    """The ``gap`` notice's reason when the seq was given up before the application sent it."""

    payload_msgpack: bytes | None = None
    """The payload's msgpack, encoded once by ``send()`` (its size check); None: encoded when first framed."""
    encoded: bytes | None = None
    """This event's msgpack map on the wire, built when first framed and reused by every resend."""
    written: bool = False
    """Taken by the sender to be written (it writes what it takes at once), on any connection, at least once."""

    def to_wire(self) -> dict[str, Any]:
        return build_event(self.stream, self.seq, self.source_ts_us, self.payload, self.interval)

    def wire_bytes(self) -> bytes:
        if self.encoded is None:
            payload = self.payload_msgpack
            if payload is None:
                payload = msgpack.packb(self.payload, use_bin_type=True)
            self.encoded = encode_event(self.stream, self.seq, self.source_ts_us, payload, self.interval)
        return self.encoded


class SeqAssigner:
    """Per-stream sequence numbers from 0 (or from where a spool left off), no gaps."""

    def __init__(self, streams: Iterable[str], start: Mapping[str, int] | None = None) -> None:
        self._next = dict.fromkeys(streams, 0)
        for stream, seq in (start or {}).items():
            if stream not in self._next:
                raise ValueError(f"stream {stream!r} was not declared; declared: {list(self._next)}")
            self._next[stream] = max(self._next[stream], seq)

    @property
    def streams(self) -> list[str]:
        return list(self._next)

    def peek(self, stream: str) -> int:
        return self._next[stream]

    def snapshot(self) -> dict[str, int]:
        return dict(self._next)

    def next(self, stream: str) -> int:
        """The seq of the stream's next event (and advance). KeyError names the declared streams."""
        try:
            seq = self._next[stream]
        except KeyError:
            raise ValueError(f"stream {stream!r} was not declared; declared: {list(self._next)}") from None
        self._next[stream] = seq + 1
        return seq

    def claim(self, stream: str, seq: int) -> None:
        """An explicit seq (trace replay): later automatic seqs continue above the highest one claimed."""
        if stream not in self._next:
            raise ValueError(f"stream {stream!r} was not declared; declared: {list(self._next)}")
        if not 0 <= seq <= MAX_SEQ:
            raise ValueError(f"seq {seq} outside [0, {MAX_SEQ}]")
        self._next[stream] = max(self._next[stream], seq + 1)


class UnackedStore:
    """Every event from ``add()`` until an ack covers it, plus the queue of those not (or no longer) on the wire.

    * bounded: ``add()`` raises :class:`StoreFull` at ``max_unacked`` events (the shell blocks ``send()``);
    * acks are cumulative per stream (``ack(stream, seq)`` forgets every seq ≤ ``seq``), whatever the order in
      which seqs were added (explicit seqs of a replayed trace arrive out of order);
    * ``connection_lost(slot)`` puts every unacked event last written to that pool connection back in the send
      queue, in creation order, so the shell resends exactly what may be missing.
    """

    def __init__(self, streams: Iterable[str], max_unacked: int,
                 acked_through: Mapping[str, int] | None = None) -> None:
        if max_unacked < 1:
            raise ValueError("max_unacked must be >= 1")
        self.max_unacked = max_unacked
        self._events: dict[str, dict[int, PendingEvent]] = {s: {} for s in streams}
        self._heaps: dict[str, list[int]] = {s: [] for s in self._events}
        self._acked_through = dict.fromkeys(self._events, -1)
        for stream, seq in (acked_through or {}).items():
            if stream in self._acked_through:
                self._acked_through[stream] = seq
        self._outbox: deque[PendingEvent] = deque()
        self._count = 0
        self._order = 0
        # Per stream, the seqs of gap notices this store never held (the application did not send them yet, e.g. a
        # replayed trace's late arrival): ``add()`` still takes each of them once. Ranges, newest kept.
        self._unsent_gaps: dict[str, deque[tuple[int, int, str]]] = {s: deque(maxlen=UNSENT_GAPS_KEPT)
                                                                     for s in self._events}
        # Per stream, the highest seq any of those ranges ever held: a new seq above it (every in-order send) skips
        # the scan of the ranges.
        self._unsent_gap_top = dict.fromkeys(self._events, -1)

    def __len__(self) -> int:
        return self._count

    @property
    def has_room(self) -> bool:
        return self._count < self.max_unacked

    @property
    def pending_count(self) -> int:
        """Events waiting to be written (never sent, or requeued after a connection loss)."""
        return len(self._outbox)

    @property
    def streams(self) -> KeysView[str]:
        return self._events.keys()

    def acked_through(self, stream: str) -> int:
        return self._acked_through[stream]

    def add_recovered(self, stream: str, seq: int, source_ts_us: int, payload: Any,
                      interval: EventInterval | None = None) -> PendingEvent:
        """An event recovered from a spool: queued like a new one (beyond the bound if need be), marked resend."""
        saved, self.max_unacked = self.max_unacked, max(self.max_unacked, self._count + 1)
        try:
            event = self.add(stream, seq, source_ts_us, payload, interval)
        finally:
            self.max_unacked = saved
        event.resend = True
        return event

    def requeue_front(self, events: Sequence[PendingEvent]) -> None:
        """Put a batch taken with ``take_batch`` back (nothing could carry it)."""
        for event in events:
            event.written = False  # never went out (a resend keeps ``resend``: it may have reached the gateway)
        self._outbox.extendleft(reversed(events))

    def add(self, stream: str, seq: int, source_ts_us: int, payload: Any,
            interval: EventInterval | None = None, payload_msgpack: bytes | None = None) -> PendingEvent:
        if self._count >= self.max_unacked:
            raise StoreFull(f"{self._count} events unacknowledged (max_unacked={self.max_unacked})")
        events = self._events[stream]
        if seq in events:
            raise ValueError(f"stream {stream!r} seq {seq} was already sent")
        if seq <= self._acked_through[stream] or self._in_unsent_gap(stream, seq):
            # The gateway gave this seq up before the application sent it (its ``gap`` notice came first; its ack
            # may still be on the way): sent once, for the late topic, never waited for.
            given_up = self._add_given_up(stream, seq, source_ts_us, payload, interval)
            given_up.payload_msgpack = payload_msgpack
            return given_up
        self._order += 1
        event = PendingEvent(stream, seq, source_ts_us, payload, self._order, None, False, interval, False, None,
                             payload_msgpack)
        events[seq] = event
        heapq.heappush(self._heaps[stream], seq)
        self._outbox.append(event)
        self._count += 1
        return event

    def _in_unsent_gap(self, stream: str, seq: int) -> bool:
        if seq > self._unsent_gap_top[stream]:
            return False
        return any(first <= seq <= last for first, last, _reason in self._unsent_gaps[stream])

    def _add_given_up(self, stream: str, seq: int, source_ts_us: int, payload: Any,
                      interval: EventInterval | None) -> PendingEvent:
        """A seq below the ack is new only if a gap notice gave it up before it was ever added: it is written once,
        never counted as unacknowledged (the ack passed it), and the gateway publishes it on the late topic."""
        gaps = self._unsent_gaps[stream]
        found = next((gap for gap in gaps if gap[0] <= seq <= gap[1]), None)
        if found is None:
            raise ValueError(f"stream {stream!r} seq {seq} was already sent")
        first, last, reason = found
        gaps.remove(found)
        gaps.extend((lo, hi, reason) for lo, hi in ((first, seq - 1), (seq + 1, last)) if lo <= hi)
        self._order += 1
        event = PendingEvent(stream, seq, source_ts_us, payload, self._order, None, False, interval)
        event.given_up = True
        event.gap_reason = reason
        self._outbox.append(event)
        return event

    def take_batch(self, max_events: int) -> list[PendingEvent]:
        """Up to ``max_events`` queued events, oldest first; events acked meanwhile are skipped."""
        batch: list[PendingEvent] = []
        outbox = self._outbox
        while outbox and len(batch) < max_events:
            event = outbox.popleft()
            if event.seq > self._acked_through[event.stream] or event.given_up:
                event.written = True
                batch.append(event)
        return batch

    @staticmethod
    def mark_sent(events: Iterable[PendingEvent], slot: int) -> None:
        for event in events:
            event.slot = slot

    def ack(self, stream: str, seq: int) -> int:
        """Cumulative ack; returns how many events it released (0 for a stale or unknown ack)."""
        return self.ack_passing(stream, seq)[0]

    def ack_passing(self, stream: str, seq: int) -> tuple[int, list[PendingEvent]]:
        """Cumulative ack: how many events it released, and the events it passed that were never written.

        The gateway can pass a seq it never received only by giving it up, and its ``gap`` notice may come after
        this ack (on another pool connection, or not yet read). Such an event is not acknowledged: it becomes
        ``given_up``, no longer unacknowledged, and stays queued to be written once, for the late topic. Taken for
        acked, it would be skipped unsent and lost. (Written before, or queued again after a connection loss or
        from a spool, it may have reached the gateway: released as acked.)"""
        if stream not in self._events or seq <= self._acked_through[stream]:
            return 0, []
        self._acked_through[stream] = seq
        events, heap = self._events[stream], self._heaps[stream]
        released = 0
        passed_unsent: list[PendingEvent] = []
        while heap and heap[0] <= seq:
            # A seq given up or forgotten meanwhile left only its heap entry behind.
            event = events.pop(heapq.heappop(heap), None)
            if event is None:
                continue
            if not (event.written or event.resend):
                event.given_up = True
                passed_unsent.append(event)
            else:
                released += 1
        self._count -= released + len(passed_unsent)
        return released, passed_unsent

    def give_up(self, stream: str, first_seq: int, last_seq: int, reason: str = "timeout") -> list[PendingEvent]:
        """The gateway gave ``first_seq..last_seq`` up (a ``gap`` notice): the events of it held here are no longer
        unacknowledged (``flush`` does not wait for them) and are queued once more, ahead of the others, marked
        ``given_up``: the gateway publishes such a seq once, on the late topic, if it arrives. Returns them."""
        events = self._events.get(stream)
        if not events:
            return []
        if last_seq - first_seq + 1 < len(events):
            taken = [seq for seq in range(first_seq, last_seq + 1) if seq in events]
        else:
            taken = sorted(seq for seq in events if first_seq <= seq <= last_seq)
        self._remember_unsent(stream, first_seq, last_seq, taken, reason)
        given_up = [events.pop(seq) for seq in taken]  # their heap entries are skipped when an ack pops them
        for event in given_up:
            event.given_up = True
            event.resend = True
        self._count -= len(given_up)
        if given_up:
            queued = {id(e) for e in given_up}
            self._outbox = deque([*given_up, *(e for e in self._outbox if id(e) not in queued)])
        return given_up

    def _remember_unsent(self, stream: str, first_seq: int, last_seq: int, held: list[int], reason: str) -> None:
        gaps = self._unsent_gaps.get(stream)
        if gaps is None:
            return
        self._unsent_gap_top[stream] = max(self._unsent_gap_top[stream], last_seq)
        lo = first_seq
        for seq in (*held, last_seq + 1):
            if lo <= seq - 1:
                gaps.append((lo, seq - 1, reason))
            lo = seq + 1

    def forget(self, stream: str, seq: int) -> bool:
        """The gateway refused this event for good without acknowledging it (``seq_jump``): no longer
        unacknowledged, never resent. False if it was not held."""
        event = self._events.get(stream, {}).pop(seq, None)
        if event is None:
            return False
        self._count -= 1
        self._outbox = deque(e for e in self._outbox if e is not event)
        return True

    def connection_lost(self, slot: int) -> int:
        """Requeue the unacked events last written on ``slot``; returns how many."""
        lost = [e for events in self._events.values() for e in events.values() if e.slot == slot]
        for event in lost:
            event.slot = None
            event.resend = True
        if lost:
            self._outbox = deque(sorted([*lost, *self._outbox], key=lambda e: e.order))
        return len(lost)

    def unsent_floor(self) -> dict[str, int]:
        """Per stream, the lowest seq not yet written anywhere (for heartbeats), or None-equivalent ``MAX_SEQ``."""
        floor: dict[str, int] = {}
        for event in self._outbox:
            if event.seq < floor.get(event.stream, MAX_SEQ):
                floor[event.stream] = event.seq
        return floor

    def unacked(self) -> list[PendingEvent]:
        """Every unacked event, in creation order (spool compaction, inspection)."""
        return sorted((e for events in self._events.values() for e in events.values()), key=lambda e: e.order)


def heartbeat_next_seq(seqs: SeqAssigner, store: UnackedStore) -> dict[str, int]:
    """``next_seq`` of a heartbeat: per stream, the next seq to assign, or the lowest seq still waiting to be
    written, so the gateway is never told an event is behind it while it sits in this client's queue."""
    floor = store.unsent_floor()
    return {s: min(seqs.peek(s), floor.get(s, MAX_SEQ)) for s in seqs.streams}


# Send lags remembered for heartbeats: enough to cover a burst's jitter, few enough to scan at each heartbeat.
HEARTBEAT_LAG_WINDOW = 64


class HeartbeatPromise:
    """The source time a heartbeat may claim: no later event of this source will be stamped before it.

    The gateway's merge takes that as a promise (its frontier), so it may only say what the stamps so far imply.
    Each sent event has a *send lag*, ``clock_us()`` at ``send()`` minus its stamp: zero for events stamped by the
    SDK, the application's own delay (sensor reading to ``send()``) for stamps it passes. An event sent now is stamped
    no earlier than now minus its lag, so the promise is ``now - the largest lag of the last HEARTBEAT_LAG_WINDOW
    events``, and never below the newest stamp (stamps follow seq). Taking the largest recent lag rather than the
    newest one's keeps a jittery reading-to-send delay from making a heartbeat promise more than the next event
    keeps. Stamps that drift slower than ``clock_us()`` still break it: such an application passes the clock its
    stamps follow as ``clock_us``.
    """

    def __init__(self, window: int = HEARTBEAT_LAG_WINDOW) -> None:
        self._newest_ts_us: int | None = None
        self._lags_us: deque[int] = deque(maxlen=window)

    def sent(self, ts_us: int, clock_now_us: int) -> None:
        if self._newest_ts_us is None or ts_us > self._newest_ts_us:
            self._newest_ts_us = ts_us
        self._lags_us.append(clock_now_us - ts_us)

    def promise_us(self, clock_now_us: int) -> int | None:
        """None before the first event: then no heartbeat is sent."""
        if self._newest_ts_us is None:
            return None
        return max(self._newest_ts_us, clock_now_us - max(self._lags_us))


# Frame overhead on top of the events themselves: the map header, "type": "events", the array header.
_FRAME_OVERHEAD_BYTES = 64


def encode_batches(events: Sequence[PendingEvent], max_events: int,
                   max_frame_bytes: int) -> list[tuple[Sequence[PendingEvent], bytes]]:
    """``events`` as frames of at most ``max_events`` events and ``max_frame_bytes`` body bytes each, in order,
    filled greedily from each event's wire bytes (encoded once, reused by resends).

    A single event that cannot fit raises :class:`EventTooLarge` (the gateway would refuse it with
    ``frame_too_large`` and close the connection).
    """
    out: list[tuple[Sequence[PendingEvent], bytes]] = []
    chunk: list[PendingEvent] = []
    encoded: list[bytes] = []
    size = 0
    for event in events:
        wire = event.wire_bytes()
        if chunk and (len(chunk) == max_events or events_body_bytes(len(chunk) + 1, size + len(wire))
                      > max_frame_bytes):
            _close_frame(chunk, encoded, out)
            chunk, encoded, size = [], [], 0
        if events_body_bytes(1, len(wire)) > max_frame_bytes:
            raise EventTooLarge(f"stream {event.stream!r} seq {event.seq} encodes to {events_body_bytes(1, len(wire))}"
                                f" bytes; the gateway accepts frames of at most {max_frame_bytes} bytes")
        chunk.append(event)
        encoded.append(wire)
        size += len(wire)
    if chunk:
        _close_frame(chunk, encoded, out)
    return out


def _close_frame(chunk: list[PendingEvent], encoded: list[bytes],
                 out: list[tuple[Sequence[PendingEvent], bytes]]) -> None:
    body = events_frame_body(encoded)
    out.append((chunk, HEADER.pack(len(body)) + body))


def payload_fits(encoded_payload_bytes: int, max_frame_bytes: int) -> bool:
    """Whether an event whose payload encodes to this many bytes can travel alone in one frame."""
    return encoded_payload_bytes + _FRAME_OVERHEAD_BYTES + 64 <= max_frame_bytes


@dataclass
class Backoff:
    """Reconnect delays: exponential from ``initial_s`` by ``multiplier``, capped at ``max_s``, with jitter.

    The jitter takes up to ``jitter`` (a fraction) off each delay at random, so a pool or a fleet of sources that
    lost the gateway together does not reconnect in lockstep. ``max_attempts`` (None: forever) bounds the attempts
    between two successful connections; ``next_delay()`` returns None when they are used up.
    """

    initial_s: float = 0.05
    max_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    max_attempts: int | None = None
    rng: random.Random = field(default_factory=random.Random, repr=False)
    attempts: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not 0 < self.initial_s <= self.max_s:
            raise ValueError("need 0 < initial_s <= max_s")
        if self.multiplier < 1:
            raise ValueError("multiplier must be >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")

    def next_delay(self) -> float | None:
        if self.max_attempts is not None and self.attempts >= self.max_attempts:
            return None
        ceiling = min(self.max_s, self.initial_s * self.multiplier ** min(self.attempts, 64))
        self.attempts += 1
        return ceiling * (1.0 - self.jitter * self.rng.random())

    def reset(self) -> None:
        self.attempts = 0

    def copy(self) -> Backoff:
        """A fresh schedule with the same policy and an independent random stream (one per pool connection)."""
        return Backoff(self.initial_s, self.max_s, self.multiplier, self.jitter, self.max_attempts,
                       random.Random(self.rng.random()))


class PoolScheduler:
    """Which pool connection carries the next batch: round-robin over the connections that are up.

    ``pinned=True`` asks for the lowest live connection instead: the shell uses it until the gateway has
    acknowledged a stream once, because the gateway starts a source's contiguous range at the first seq it sees,
    so the very first seqs must not race each other over two sockets.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError("pool size must be >= 1")
        self.size = size
        self._up = [False] * size
        self._cursor = 0

    def up(self, slot: int) -> None:
        self._up[slot] = True

    def down(self, slot: int) -> None:
        self._up[slot] = False

    def is_up(self, slot: int) -> bool:
        return self._up[slot]

    @property
    def live(self) -> list[int]:
        return [i for i, up in enumerate(self._up) if up]

    def next_slot(self, pinned: bool = False) -> int | None:
        if pinned:
            return next((i for i, up in enumerate(self._up) if up), None)
        for step in range(self.size):
            slot = (self._cursor + step) % self.size
            if self._up[slot]:
                self._cursor = (slot + 1) % self.size
                return slot
        return None


# A pool connection that carried nothing else writes a heartbeat at least this often, so the gateway's idle timeout
# (gateway/session.py: 120 s of silence) never closes it; a quarter of it leaves room for a busy event loop.
DEFAULT_KEEPALIVE_S = 30.0


class IdleTimer:
    """Heartbeats of one source's pool (times are loop seconds).

    The merge needs one liveness signal per *source* every ``interval_s``, not one per connection: when no
    connection of the pool wrote anything (events or a heartbeat) for ``interval_s``, one heartbeat is due, on the
    live connection that has been silent longest, so the duty rotates over the pool. A connection that wrote nothing
    for ``keepalive_s`` is due one too, whatever the rest of the pool did: with the rotation that happens only when
    ``pool size x interval_s`` exceeds ``keepalive_s`` (or while events keep the source-level timer fresh but skip
    that connection), and it keeps the gateway's idle timeout from closing the connection.
    """

    def __init__(self, size: int, interval_s: float | None, keepalive_s: float = DEFAULT_KEEPALIVE_S) -> None:
        if interval_s is not None and interval_s <= 0:
            raise ValueError("heartbeat interval must be > 0 (or None to disable)")
        if keepalive_s <= 0:
            raise ValueError("keepalive interval must be > 0")
        self.interval_s = interval_s
        self.keepalive_s = keepalive_s
        self._last_write = [0.0] * size
        self._last_signal = 0.0

    def wrote(self, slot: int, now_s: float) -> None:
        self._last_write[slot] = now_s
        self._last_signal = max(self._last_signal, now_s)

    def due(self, live: Iterable[int], now_s: float) -> list[int]:
        """The live connections that should write a heartbeat now, in slot order."""
        if self.interval_s is None:
            return []
        live = list(live)
        if not live:
            return []
        last = self._last_write
        due = {s for s in live if now_s - last[s] >= self.keepalive_s}
        if now_s - self._last_signal >= self.interval_s:
            due.add(min(live, key=lambda s: (last[s], s)))
        return sorted(due)

    def next_due_in(self, live: Iterable[int], now_s: float) -> float | None:
        """Seconds until a heartbeat is due (0 if one is due now), None if none can be."""
        if self.interval_s is None:
            return None
        live = list(live)
        if not live:
            return None
        oldest = min(self._last_write[s] for s in live)
        wait = min(self._last_signal + self.interval_s, oldest + self.keepalive_s) - now_s
        return max(0.0, wait)


# How long a connection may owe the source an answer (an ack for events it carried, the answer to a heartbeat) with
# nothing at all received before its gateway is taken for dead: a few heartbeat intervals (1 s) more than a live
# gateway ever needs (acks follow each 100 ms commit; a heartbeat is answered at once), and below the cluster's
# session timeout (6 s), so the sources of a paused gateway are dialing the cluster again when its shards move.
DEFAULT_LIVENESS_TIMEOUT_S = 5.0


class GatewayLiveness:
    """Whether the gateway at the other end of each pool connection still answers (times are loop seconds).

    TCP cannot tell: a gateway process that is paused (SIGSTOP, a frozen VM) or cut off without a reset keeps the
    connection open, and its kernel even accepts what the source writes. So a connection *owes* an answer from the
    first write the gateway answers (events: an ack once Kafka has them; a heartbeat: the source's cumulative acks,
    sent back at once, whenever the source has any) after the last frame received on it; a frame received while
    written events are still unacknowledged, once its own acks are applied, starts the wait again. A connection
    that owed an answer for ``timeout_s`` with nothing received is dead (:meth:`dead`): the shell drops it, requeues
    what it carried and dials the cluster again.

    A live gateway whose Kafka is slow acks late but answers a heartbeat at once: after ``probe_after_s`` of waiting
    the connection is due one heartbeat (:meth:`probe_due`), so Kafka's delays are not taken for a dead gateway.
    ``timeout_s`` None disables the check.
    """

    def __init__(self, size: int, timeout_s: float | None, probe_after_s: float | None = None) -> None:
        if timeout_s is not None and timeout_s <= 0:
            raise ValueError("liveness timeout must be > 0 (or None to disable)")
        self.timeout_s = timeout_s
        self.probe_after_s = (probe_after_s if probe_after_s is not None and timeout_s is not None
                              and probe_after_s < timeout_s else None)
        self._owed_since: list[float | None] = [None] * size
        self._probed = [False] * size

    def opened(self, slot: int) -> None:
        """A new connection on ``slot`` (the welcome was its answer): owes nothing yet."""
        self._owed_since[slot] = None
        self._probed[slot] = False

    def wrote(self, slot: int, now_s: float, expects_answer: bool, heartbeat: bool = False) -> None:
        """``heartbeat``: the write was one, which asks for an answer itself: no probe is due for this wait."""
        if expects_answer and self._owed_since[slot] is None:
            self._owed_since[slot] = now_s
        if heartbeat and expects_answer:
            self._probed[slot] = True

    def received(self, slot: int, now_s: float, outstanding: bool) -> None:
        """A frame arrived on ``slot``; ``outstanding``: written events are still unacknowledged after its acks."""
        self._owed_since[slot] = now_s if outstanding and self._owed_since[slot] is not None else None
        self._probed[slot] = False

    def dead(self, live: Iterable[int], now_s: float) -> list[int]:
        if self.timeout_s is None:
            return []
        timeout_s = self.timeout_s
        owed = self._owed_since
        return [s for s in live if (since := owed[s]) is not None and now_s - since >= timeout_s]

    def probe_due(self, live: Iterable[int], now_s: float) -> list[int]:
        """Connections due a heartbeat that asks the gateway to answer; each is due one per wait."""
        if self.probe_after_s is None:
            return []
        due = [s for s in live if not self._probed[s] and (since := self._owed_since[s]) is not None
               and now_s - since >= self.probe_after_s]
        for slot in due:
            self._probed[slot] = True
        return due

    def next_due_in(self, live: Iterable[int], now_s: float) -> float | None:
        """Seconds until a probe or a death is due (0: now), None if no connection owes an answer."""
        if self.timeout_s is None:
            return None
        waits = []
        for slot in live:
            since = self._owed_since[slot]
            if since is None:
                continue
            if self.probe_after_s is not None and not self._probed[slot]:
                waits.append(since + self.probe_after_s - now_s)
            waits.append(since + self.timeout_s - now_s)
        return max(0.0, min(waits)) if waits else None


class DeliveryWatch(Generic[T]):
    """Per-event delivery handles (the shell's futures), settled by what settles the event in ``UnackedStore``.

    Only events the application asked to track are here, and each one is also unacknowledged in the store, so this
    is bounded by ``max_unacked``; when nothing is tracked, an ack costs one emptiness check. ``acked`` hands back
    the handles a cumulative ack covers, ``refused`` the handle of one refused event, ``drain`` every handle left
    (the client closes or fails).
    """

    def __init__(self) -> None:
        self._handles: dict[str, dict[int, T]] = {}
        # Per stream, a min-heap of watched seqs; seqs already settled by a refusal are skipped when popped.
        self._heaps: dict[str, list[int]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def watch(self, stream: str, seq: int, handle: T) -> None:
        handles = self._handles.setdefault(stream, {})
        if seq in handles:
            raise ValueError(f"stream {stream!r} seq {seq} is already watched")
        handles[seq] = handle
        heapq.heappush(self._heaps.setdefault(stream, []), seq)
        self._count += 1

    def acked(self, stream: str, seq: int) -> list[tuple[int, T]]:
        """(seq, handle) of every watched seq <= ``seq`` of the stream, lowest first; they are forgotten."""
        heap = self._heaps.get(stream)
        if not heap or heap[0] > seq:
            return []
        handles = self._handles[stream]
        out: list[tuple[int, T]] = []
        while heap and heap[0] <= seq:
            watched = heapq.heappop(heap)
            handle = handles.pop(watched, None)
            if handle is not None:
                out.append((watched, handle))
        self._count -= len(out)
        return out

    def refused(self, stream: str, seq: int) -> T | None:
        handle = self._handles.get(stream, {}).pop(seq, None)
        if handle is not None:
            self._count -= 1
        return handle

    def drain(self) -> list[T]:
        out = [h for handles in self._handles.values() for _seq, h in sorted(handles.items())]
        self._handles.clear()
        self._heaps.clear()
        self._count = 0
        return out


class ResyncGate:
    """When the gateway's ``resync`` requests (a clock step it saw: docs/wire-protocol.md, "Resync") start a time-sync
    burst. At once, unless a burst is already scheduled (it starts after the request, so it answers it) or running
    (it may have measured before the step: one more follows it). Bursts the gateway asked for start at least
    ``min_interval_s`` apart: requests from several pool connections, or a gateway repeating itself, cost one burst,
    not a storm of UDP requests; the gateway holds the source's events meanwhile, so a request is never dropped."""

    def __init__(self, min_interval_s: float = 1.0) -> None:
        self.min_interval_s = min_interval_s
        self.requests = 0
        self._scheduled = False
        self._running = False
        self._again = False
        self._last_start_s: float | None = None

    def request(self, now_s: float) -> float | None:
        """A resync request arrived: the delay before a new burst starts, or None when a scheduled or running one
        covers it."""
        self.requests += 1
        if self._scheduled:
            return None
        if self._running:
            self._again = True
            return None
        self._scheduled = True
        return self._delay(now_s)

    def started(self, now_s: float) -> None:
        self._scheduled = False
        self._running = True
        self._last_start_s = now_s

    def finished(self, now_s: float) -> float | None:
        """The burst ended (well or not): the delay before the next one when a request came during it, else None."""
        self._running = False
        if not self._again:
            return None
        self._again = False
        self._scheduled = True
        return self._delay(now_s)

    def _delay(self, now_s: float) -> float:
        if self._last_start_s is None:
            return 0.0
        return max(0.0, self._last_start_s + self.min_interval_s - now_s)


class OwnerSync(Enum):
    """What a pool connection does about time sync once a gateway welcomed it (``plan_owner_sync``)."""

    FIRST_BURST = "first_burst"  # no sync yet: the first burst runs before anything is sent (connect() raises on it)
    STAY = "stay"  # the same time-sync server as now: nothing to do
    MOVE_BEFORE_SENDING = "move_before_sending"  # a new server, whose gateway has no estimate of this clock yet
    MOVE_BESIDE_SENDING = "move_beside_sending"  # a new server, whose gateway already maps this clock: send now


def plan_owner_sync(current: tuple[str, int] | None, target: tuple[str, int], *,
                    owner_knows_clock: bool) -> OwnerSync:
    """The time sync a welcome calls for: ``current`` is the (host, UDP port) this source syncs with (None: never
    synced), ``target`` the owner's, ``owner_knows_clock`` the welcome's ``clock_known``.

    A new owner without an estimate of this clock would map the events it gets before the burst with an unknown
    error bound, so they wait for the burst. A new owner that holds one (after a failover, restored from the shard's
    clock state) maps them at once: the resend goes now and the burst runs beside it, which takes the burst (0.2-1.5
    s on a loaded host) off the failover's kill -> first ack."""
    if current is None:
        return OwnerSync.FIRST_BURST
    if current == target:
        return OwnerSync.STAY
    return OwnerSync.MOVE_BESIDE_SENDING if owner_knows_clock else OwnerSync.MOVE_BEFORE_SENDING


@dataclass(frozen=True, slots=True)
class GatewayAddress:
    """A gateway's TCP address, and the UDP port of its time-sync server when the gateway announced one (in its
    welcome or in a redirect naming it); None: the client's configured ``udp_port`` applies."""

    host: str
    port: int
    timesync_port: int | None = None

    def same_gateway(self, other: GatewayAddress | None) -> bool:
        """Same TCP endpoint: what the client dials (the time-sync port is what it learned about it)."""
        return other is not None and (self.host, self.port) == (other.host, other.port)


DEFAULT_MAX_REDIRECTS = 3


class GatewayRouter:
    """Which gateway a pool connection dials, in a cluster where one gateway owns the source's shard at a time
    (docs/wire-protocol.md, "Shards and routing"). Shared by the pool.

    ``owner`` is the gateway that last welcomed this source or that a redirect named: every connection dials it
    first, so a pool follows one redirect together. Without an owner (none yet, or forgotten after a shard error or
    an unreachable owner) a connection goes through ``addresses`` in order. A dialing *round* (:meth:`round`) ends
    when a gateway welcomes the connection, after the whole list failed, or after ``max_redirects`` redirects in a
    row (a cluster still moving the shard: the shell backs off and starts a new round from the list).
    """

    def __init__(self, addresses: Sequence[tuple[str, int]], max_redirects: int = DEFAULT_MAX_REDIRECTS) -> None:
        if not addresses:
            raise ValueError("at least one gateway address")
        if max_redirects < 0:
            raise ValueError("max_redirects must be >= 0")
        # Order kept, duplicates dropped: the first address is the one the application named first.
        self.addresses = tuple(GatewayAddress(h, p) for h, p in dict.fromkeys((h, p) for h, p in addresses))
        self.max_redirects = max_redirects
        self.owner: GatewayAddress | None = None
        # Gateways found unresponsive (the liveness timeout) or refusing connections, until when (loop seconds).
        self._suspect_until: dict[tuple[str, int], float] = {}

    def round(self, now_s: float | None = None) -> RouteRound:
        """A dialing round; ``now_s`` (loop seconds) lets it dial suspect gateways last (None: no suspects)."""
        return RouteRound(self, now_s)

    def suspect(self, gateway: GatewayAddress, until_s: float) -> None:
        """``gateway`` did not answer (or refused the connection): until ``until_s`` it is dialed only after every
        other address, and a redirect to it is no answer (the cluster has not moved its shard yet: wait and ask
        again). It stops being the owner."""
        key = (gateway.host, gateway.port)
        self._suspect_until[key] = max(until_s, self._suspect_until.get(key, until_s))
        self.forget(gateway)

    def is_suspect(self, gateway: GatewayAddress, now_s: float) -> bool:
        until_s = self._suspect_until.get((gateway.host, gateway.port))
        if until_s is None:
            return False
        if until_s <= now_s:
            del self._suspect_until[(gateway.host, gateway.port)]
            return False
        return True

    def cleared(self, gateway: GatewayAddress) -> None:
        """``gateway`` welcomed the source: whatever it was suspected of is over."""
        self._suspect_until.pop((gateway.host, gateway.port), None)

    def welcomed(self, at: GatewayAddress, timesync_port: int | None) -> GatewayAddress:
        """``at`` welcomed the source: it is the owner. Its time-sync port is the welcome's, else the one the
        redirect to it named."""
        owner = GatewayAddress(at.host, at.port, timesync_port if timesync_port is not None else at.timesync_port)
        self.owner = owner
        return owner

    def forget(self, gateway: GatewayAddress | None = None) -> None:
        """Forget the owner; with ``gateway``, only if the owner is that gateway (a stale connection's failure must
        not erase an owner another connection learned since)."""
        if gateway is None or gateway.same_gateway(self.owner):
            self.owner = None


class RouteRound:
    """One dialing round of one pool connection: the pending redirect, else the owner, else the next address of the
    list not dialed yet this round."""

    def __init__(self, router: GatewayRouter, now_s: float | None = None) -> None:
        self._router = router
        self._now_s = now_s
        self._next_index = 0
        self._dialed: set[tuple[str, int]] = set()
        self._redirect: GatewayAddress | None = None
        # Suspect addresses passed over in the list, dialed after every other one.
        self._deferred: list[GatewayAddress] = []
        self.redirects = 0

    def next_target(self) -> GatewayAddress | None:
        """Where to dial now; None when the round is over (every address failed): back off, then a new round."""
        target = self._pick()
        if target is not None:
            self._dialed.add((target.host, target.port))
        return target

    def _pick(self) -> GatewayAddress | None:
        if self._redirect is not None:
            # Followed even to a gateway dialed already: ownership may have moved meanwhile; the hop bound stops loops.
            target, self._redirect = self._redirect, None
            return target
        owner = self._router.owner
        if owner is not None and (owner.host, owner.port) not in self._dialed and not self._suspect(owner):
            return owner
        addresses = self._router.addresses
        while self._next_index < len(addresses):
            address = addresses[self._next_index]
            self._next_index += 1
            if (address.host, address.port) in self._dialed:
                continue
            if self._suspect(address):
                self._deferred.append(address)
                continue
            return address
        while self._deferred:
            address = self._deferred.pop(0)
            if (address.host, address.port) not in self._dialed:
                return address
        return None

    def _suspect(self, gateway: GatewayAddress) -> bool:
        return self._now_s is not None and self._router.is_suspect(gateway, self._now_s)

    def redirect_to_suspect(self, to: GatewayAddress) -> bool:
        """Whether a redirect names a gateway this source found dead: the cluster has not moved the shard yet."""
        return self._suspect(to)

    def redirected(self, to: GatewayAddress) -> bool:
        """The dialed gateway answered with a redirect to ``to``: remember it as the owner (for the whole pool) and
        dial it next. False when that is more than ``max_redirects`` in a row: the round ends and the owner is
        forgotten, so the next round starts from the list."""
        self.redirects += 1
        if self.redirects > self._router.max_redirects:
            self._router.forget()
            return False
        self._router.owner = to
        self._redirect = to
        return True

    def unreachable(self, target: GatewayAddress) -> None:
        """Dialing ``target`` failed (refused, timed out, closed during the handshake): if it was the owner, forget
        it; the round goes on with the list."""
        self._router.forget(target)
