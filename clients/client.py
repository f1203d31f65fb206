"""Async client SDK for event sources: handshake, per-stream sequence numbers, acks, resend on reconnect."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

from gateway.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from gateway.messages import PROTOCOL_VERSION
from skewless.clock import ClockUs, system_time_us

DEFAULT_BATCH_EVENTS = 500
DEFAULT_MAX_UNACKED = 100_000


class GatewayRejected(Exception):
    """The gateway sent a fatal error frame."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


@dataclass(frozen=True, slots=True)
class PendingEvent:
    stream: str
    seq: int
    source_ts_us: int
    payload: Any

    def to_wire(self) -> dict[str, Any]:
        return {"stream": self.stream, "seq": self.seq, "source_ts_us": self.source_ts_us, "payload": self.payload}


class SkewlessClient:
    """One source. `send()` stamps the event with the source clock and the next seq of its stream.

    Events stay in memory until the gateway acknowledges them (cumulatively, after Kafka confirmed them), so a
    reconnect resends exactly what may be missing; the gateway drops the duplicates.
    """

    def __init__(self, host: str, port: int, source_id: str, streams: list[str], *,
                 clock_us: ClockUs = system_time_us, token: str | None = None,
                 batch_events: int = DEFAULT_BATCH_EVENTS, max_unacked: int = DEFAULT_MAX_UNACKED) -> None:
        self.host = host
        self.port = port
        self.source_id = source_id
        self.streams = list(dict.fromkeys(streams))
        self.clock_us = clock_us
        self.token = token
        self.batch_events = batch_events
        self.max_unacked = max_unacked
        self._next_seq = dict.fromkeys(self.streams, 0)
        self._unacked: dict[str, OrderedDict[int, PendingEvent]] = {s: OrderedDict() for s in self.streams}
        self._acked_through = dict.fromkeys(self.streams, -1)
        self._outbox: list[PendingEvent] = []
        self._ack_changed = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._error: GatewayRejected | None = None

    async def __aenter__(self) -> Self:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if exc is None:
            await self.flush()
        await self.close()

    @property
    def unacked_count(self) -> int:
        return sum(len(events) for events in self._unacked.values())

    async def connect(self) -> None:
        self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        hello: dict[str, Any] = {"type": "hello", "version": PROTOCOL_VERSION, "source_id": self.source_id,
                                 "streams": self.streams}
        if self.token is not None:
            hello["token"] = self.token
        self._writer.write(encode_frame(hello))
        decoder = FrameDecoder(DEFAULT_MAX_FRAME_BYTES)
        reply = await self._read_one(decoder)
        if reply.get("type") == "error":
            raise GatewayRejected(str(reply.get("code")), str(reply.get("message")))
        if reply.get("type") != "welcome":
            raise GatewayRejected("unexpected_reply", f"expected welcome, got {reply.get('type')!r}")
        self._reader_task = asyncio.create_task(self._read_loop(decoder))
        # Anything sent before a disconnect and not acknowledged goes again; the gateway deduplicates.
        resend = [e for events in self._unacked.values() for e in events.values()]
        if resend:
            self._write_batches(resend)
            await self._writer.drain()

    async def _read_one(self, decoder: FrameDecoder) -> dict[str, Any]:
        assert self._reader is not None
        while True:
            data = await self._reader.read(65536)
            if not data:
                raise ConnectionError("gateway closed the connection during the handshake")
            messages = decoder.feed(data)
            if messages:
                return messages[0]

    async def _read_loop(self, decoder: FrameDecoder) -> None:
        assert self._reader is not None
        while True:
            data = await self._reader.read(65536)
            if not data:
                break
            for message in decoder.feed(data):
                self._on_message(message)
        self._ack_changed.set()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "ack":
            stream, seq = message["stream"], int(message["seq"])
            if stream in self._unacked and seq > self._acked_through[stream]:
                self._acked_through[stream] = seq
                pending = self._unacked[stream]
                while pending and next(iter(pending)) <= seq:
                    pending.popitem(last=False)
                if self.unacked_count < self.max_unacked:
                    self._room.set()
                self._ack_changed.set()
        elif kind == "error" and message.get("fatal"):
            self._error = GatewayRejected(str(message.get("code")), str(message.get("message")))
            self._ack_changed.set()

    async def send(self, stream: str, payload: Any, source_ts_us: int | None = None) -> int:
        """Queue one event; returns its seq. Blocks (bounded memory) while too many events are unacknowledged."""
        if self._error is not None:
            raise self._error
        if stream not in self._next_seq:
            raise ValueError(f"stream {stream!r} was not declared; declared: {self.streams}")
        while self.unacked_count >= self.max_unacked:
            self._room.clear()
            await self._room.wait()
        seq = self._next_seq[stream]
        self._next_seq[stream] = seq + 1
        event = PendingEvent(stream, seq, self.clock_us() if source_ts_us is None else source_ts_us, payload)
        self._unacked[stream][seq] = event
        self._outbox.append(event)
        if len(self._outbox) >= self.batch_events:
            await self.send_pending()
        return seq

    async def send_pending(self) -> None:
        if not self._outbox or self._writer is None:
            return
        batch, self._outbox = self._outbox, []
        self._write_batches(batch)
        await self._writer.drain()

    def _write_batches(self, events: list[PendingEvent]) -> None:
        assert self._writer is not None
        for start in range(0, len(events), self.batch_events):
            chunk = events[start:start + self.batch_events]
            self._writer.write(encode_frame({"type": "events", "events": [e.to_wire() for e in chunk]}))

    async def flush(self, timeout_s: float = 30.0) -> None:
        """Send what is queued and wait until the gateway acknowledged every event sent so far."""
        await self.send_pending()
        async with asyncio.timeout(timeout_s):
            while self.unacked_count:
                if self._error is not None:
                    raise self._error
                if self._reader_task is not None and self._reader_task.done():
                    raise ConnectionError(f"gateway connection lost with {self.unacked_count} events unacknowledged")
                self._ack_changed.clear()
                await self._ack_changed.wait()

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(ConnectionError):
                self._writer.write(encode_frame({"type": "bye"}))
                await self._writer.drain()
            self._writer.close()
            with contextlib.suppress(ConnectionError):
                await self._writer.wait_closed()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await self._reader_task
        self._writer = None
        self._reader = None
