"""The benchmarks' raw source reconnects as the SDK does: a gateway on loopback (a script, not the gateway) acks
seqs 0-4 of 10 and closes the connection, refuses the next hello, then welcomes it: the source writes exactly the
unacked seqs 5-9 again, byte for byte, then the rest, and ends when everything is acked, with a bye."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from benchmarks.harness import resending_source
from benchmarks.harness.resending_source import ResendingSource
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import build_ack, build_error, build_event, build_welcome

pytestmark = pytest.mark.timeout(20)


class ScriptedGateway:
    """Connection 1: welcome, ack seq 4 once seqs 0-9 arrived, close. Connection 2: refuse. Connection 3: welcome,
    ack every frame's last seq."""

    def __init__(self) -> None:
        self.connections = 0
        self.received: list[list[dict[str, Any]]] = [[], [], []]  # events per connection
        self.byes = [0, 0, 0]  # per connection
        self.said_bye = asyncio.Event()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = self.connections
        self.connections += 1
        decoder = FrameDecoder()
        while data := await reader.read(65536):
            for message in decoder.feed(data):
                if message["type"] == "hello":
                    if index == 1:
                        writer.write(encode_frame(build_error("shard_unavailable", "restarting", True)))
                        writer.close()
                        return
                    writer.write(encode_frame(build_welcome(1 << 20)))
                elif message["type"] == "events":
                    self.received[index] += message["events"]
                    if index == 0 and len(self.received[0]) >= 10:
                        writer.write(encode_frame(build_ack("s", 4)))
                        await writer.drain()
                        writer.close()
                        return
                    if index == 2:
                        writer.write(encode_frame(build_ack("s", message["events"][-1]["seq"])))
                elif message["type"] == "bye":
                    self.byes[index] += 1
                    self.said_bye.set()
                elif message["type"] == "heartbeat" and index == 2 and self.received[2]:
                    writer.write(encode_frame(build_ack("s", self.received[2][-1]["seq"])))


def events(first: int, last: int) -> list[dict[str, Any]]:
    return [build_event("s", seq, 1_000 + seq, {"v": seq}) for seq in range(first, last + 1)]


async def test_a_closed_connection_is_reopened_and_exactly_the_unacked_events_written_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(resending_source, "HELLO_RETRY_S", 0.01)
    gateway = ScriptedGateway()
    server = await asyncio.start_server(gateway.serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        source = ResendingSource("127.0.0.1", port, "a", "s")
        await source.connect()
        source.send(events(0, 4))
        source.send(events(5, 9))
        while gateway.connections < 3:  # the first closed, the second refused, the third welcomed
            await asyncio.sleep(0.01)
            await source.recover()
        source.send(events(10, 11))
        await source.finish(heartbeat_ts_us=2_000)
        await gateway.said_bye.wait()  # the server reads the last frame in its own time
    assert gateway.received[0] == events(0, 9)
    assert gateway.received[1] == []
    assert gateway.received[2] == events(5, 11)
    assert (source.reconnects, source.acked_seq) == (1, 11)
    assert gateway.byes == [0, 0, 1]  # said once all was acked, on the connection that is live then
