"""A raw benchmark source (pre-encoded wire frames, no SDK) that survives a lost connection as the SDK does.

The gateway closes a source's connection when it gives the source's shard up (a failed commit, the offset audit,
fencing) and restarts it from what Kafka holds: the events it had not acknowledged are not on Kafka, or are there
uncommitted and aborted. A source that stops there fails the benchmark run for a recovery the gateway is built to
make. This one reconnects (the shard may take a moment to come back: a refused hello is tried again), writes every
event after the highest acknowledged seq again, byte for byte as first sent (the gateway drops what Kafka already
holds as duplicates), and counts its reconnects, so a run says whether it measured one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    Ack,
    Welcome,
    build_bye,
    build_events,
    build_heartbeat,
    build_hello,
    parse_gateway_message,
)

__all__ = ["HELLO_RETRY_S", "RECONNECT_DEADLINE_S", "RESEND_BATCH", "ResendingSource", "SourceGaveUp"]

HELLO_RETRY_S = 0.1
RECONNECT_DEADLINE_S = 30.0
RESEND_BATCH = 500


class SourceGaveUp(ConnectionError):
    """No gateway welcomed the source again within RECONNECT_DEADLINE_S."""


class ResendingSource:
    """One source of one stream on one connection; ``events``: every event map it wrote, by seq from 0."""

    def __init__(self, host: str, port: int, source_id: str, stream: str) -> None:
        self.host, self.port, self.source_id, self.stream = host, port, source_id, stream
        self.events: list[dict[str, Any]] = []
        self.acked_seq = -1
        self.reconnects = 0
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._acked = asyncio.Event()
        self._lost = asyncio.Event()

    async def connect(self) -> None:
        """Say hello until a gateway welcomes the source (RECONNECT_DEADLINE_S at most), then read its acks."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + RECONNECT_DEADLINE_S
        while True:
            welcomed = await self._hello()
            if welcomed is not None:
                break
            if loop.time() > deadline:
                raise SourceGaveUp(f"{self.source_id}: no gateway welcomed it within {RECONNECT_DEADLINE_S:.0f} s")
            await asyncio.sleep(HELLO_RETRY_S)
        reader, writer, decoder = welcomed
        self._writer = writer
        self._lost.clear()
        self._reader_task = asyncio.create_task(self._read_acks(reader, decoder))

    async def _hello(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder] | None:
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError:
            return None
        writer.write(encode_frame(build_hello(self.source_id, [self.stream])))
        decoder = FrameDecoder()
        messages: list[dict[str, Any]] = []
        while not messages:
            data = await reader.read(65536)
            if not data:
                writer.close()
                return None
            messages = decoder.feed(data)
        if isinstance(parse_gateway_message(messages[0]), Welcome):
            for raw in messages[1:]:
                self._heard(parse_gateway_message(raw))
            return reader, writer, decoder
        writer.close()  # refused (e.g. shard_unavailable while the shard restarts): asked again
        return None

    async def _read_acks(self, reader: asyncio.StreamReader, decoder: FrameDecoder) -> None:
        try:
            while data := await reader.read(65536):
                for raw in decoder.feed(data):
                    self._heard(parse_gateway_message(raw))
        except OSError:
            pass
        self._lost.set()

    def _heard(self, message: object) -> None:
        if isinstance(message, Ack) and message.stream == self.stream and message.seq > self.acked_seq:
            self.acked_seq = message.seq
            self._acked.set()

    def send(self, batch: Sequence[dict[str, Any]]) -> None:
        """Write one frame of the next events (their seqs follow ``events``); kept for a resend."""
        self.events.extend(batch)
        if self._writer is not None and not self._lost.is_set():
            self._writer.write(encode_frame(build_events(batch)))

    async def recover(self) -> None:
        """If the connection was lost: reconnect and write again every event after the highest acked seq."""
        if not self._lost.is_set():
            return
        self.reconnects += 1
        if self._writer is not None:
            self._writer.close()
        await self.connect()
        assert self._writer is not None
        unacked = self.events[self.acked_seq + 1:]
        for start in range(0, len(unacked), RESEND_BATCH):
            self._writer.write(encode_frame(build_events(unacked[start:start + RESEND_BATCH])))

    async def finish(self, heartbeat_ts_us: int, timeout_s: float = 60.0) -> None:
        """A heartbeat (nothing older will come), then wait until every event is acked, reconnecting as needed, then
        ``bye``, as the SDK's ``stop`` says it. Without it the gateway takes the closed connection for a source that
        may come back, and the merge holds every later event of the other sources for its wait (up to 2 s): the
        last frames of a paced run's last source were held that long."""
        final_seq = len(self.events) - 1
        told: asyncio.StreamWriter | None = None
        async with asyncio.timeout(timeout_s):
            while self.acked_seq < final_seq:
                await self.recover()
                if told is not self._writer:  # once per connection
                    told = self._writer
                    assert told is not None
                    told.write(encode_frame(build_heartbeat(heartbeat_ts_us, {self.stream: final_seq + 1})))
                self._acked.clear()
                lost = asyncio.create_task(self._lost.wait())
                acked = asyncio.create_task(self._acked.wait())
                await asyncio.wait((lost, acked), return_when=asyncio.FIRST_COMPLETED)
                lost.cancel()
                acked.cancel()
        if self._writer is not None:
            self._writer.write(encode_frame(build_bye()))
            with contextlib.suppress(ConnectionError):
                await self._writer.drain()
        await self.close()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()
