"""Bad frames close only the offending connection; every other client keeps being served."""

from __future__ import annotations

import asyncio

import msgpack
import pytest

from broker.reader import read_stream
from clients.client import SkewlessClient
from contract.topics import TopicNames
from contract.wire.frames import HEADER, FrameDecoder, encode_frame
from gateway.server import Gateway

pytestmark = pytest.mark.integration

HELLO = {"type": "hello", "version": 1, "source_id": "bad", "streams": ["s"]}


async def raw_exchange(port: int, *frames: bytes, until: dict | None = None) -> tuple[list[dict], bool]:
    """Send raw bytes; collect the gateway's frames until it closes the connection (or sends `until`).

    Returns the frames and whether the gateway closed the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for frame in frames:
        writer.write(frame)
    await writer.drain()
    decoder = FrameDecoder()
    replies: list[dict] = []
    try:
        async with asyncio.timeout(15):
            while until is None or until not in replies:
                data = await reader.read(65536)
                if not data:
                    return replies, True
                replies += decoder.feed(data)
    finally:
        writer.close()
    return replies, False


async def test_oversized_and_garbage_frames_close_only_that_connection(gateway: Gateway, kafka, topic_prefix):
    good = SkewlessClient("127.0.0.1", gateway.port, "good", ["s"], batch_events=10)
    await good.connect()
    for i in range(50):
        await good.send("s", {"i": i}, source_ts_us=1_000 + i)
    await good.flush()

    oversized, closed = await raw_exchange(gateway.port, encode_frame(HELLO), HEADER.pack(10 * 1024 * 1024))
    assert closed
    assert [r["type"] for r in oversized] == ["welcome", "error"]
    assert oversized[1]["code"] == "frame_too_large"
    assert "exceeds the limit of 65536 bytes" in oversized[1]["message"]

    garbage_body = b"\xc1\xc1\xc1"
    garbage, closed = await raw_exchange(gateway.port, HEADER.pack(len(garbage_body)) + garbage_body)
    assert closed
    assert garbage == [{"type": "error", "code": "malformed_frame",
                        "message": "frame body is not valid msgpack: FormatError", "fatal": True}]

    not_a_map = msgpack.packb([1, 2, 3])
    _, closed = await raw_exchange(gateway.port, HEADER.pack(len(not_a_map)) + not_a_map)
    assert closed

    assert gateway.counters.frames_too_large == 1
    assert gateway.counters.malformed_frames == 2

    # The well-behaved client's connection survived all of that.
    for i in range(50, 100):
        await good.send("s", {"i": i}, source_ts_us=1_000 + i)
    await good.flush()
    await good.close()
    # In a thread: the gateway serves on this loop, and a settled read waits for its next commit.
    values, _punctuations = await asyncio.to_thread(read_stream, kafka.bootstrap_servers,
                                                    TopicNames(topic_prefix).events("s"), settled=True)
    assert [v["payload"]["i"] for v in values] == list(range(100))


async def test_duplicate_resend_reaches_kafka_once(gateway: Gateway, kafka, topic_prefix):
    client = SkewlessClient("127.0.0.1", gateway.port, "dup", ["s"], batch_events=5)
    await client.connect()
    for i in range(20):
        await client.send("s", i, source_ts_us=10 + i)
    await client.flush()
    await client.close()
    # A second connection of the same source replays seqs 10..19 (as after a lost ack) and adds 20..24.
    events = [{"stream": "s", "seq": i, "source_ts_us": 10 + i, "payload": i} for i in range(10, 25)]
    replies, _closed = await raw_exchange(gateway.port, encode_frame({**HELLO, "source_id": "dup"}),
                                          encode_frame({"type": "events", "events": events}),
                                          until={"type": "ack", "stream": "s", "seq": 24})
    assert replies[-1] == {"type": "ack", "stream": "s", "seq": 24}
    assert gateway.counters.duplicates == 10
    # In a thread: the gateway serves on this loop, and a settled read waits for its next commit.
    values, _punctuations = await asyncio.to_thread(read_stream, kafka.bootstrap_servers,
                                                    TopicNames(topic_prefix).events("s"), settled=True)
    assert [v["seq"] for v in values] == list(range(25))


async def test_sigterm_stops_a_gateway_process_within_10_s_with_hostile_payloads_and_stuck_peers(
        kafka, topic_prefix, tmp_path):
    import signal

    from tests.reliability.harness import GatewayProcess

    process = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path)
    await process.start()
    writers: list[asyncio.StreamWriter] = []
    try:
        # The stall: a bin payload (and an int map key) on a connection that never reads its replies ...
        _reader, writer = await asyncio.open_connection("127.0.0.1", process.port)
        writers.append(writer)
        writer.write(encode_frame(HELLO) + encode_frame({"type": "events", "events": [
            {"stream": "s", "seq": 0, "source_ts_us": 1_000, "payload": b"\x00\x01"},
            {"stream": "s", "seq": 1, "source_ts_us": 1_001, "payload": {1: "int key"}},
            {"stream": "s", "seq": 2, "source_ts_us": 1_002, "payload": {"ok": True}}]}))
        # ... then half a frame, left hanging.
        writer.write(HEADER.pack(100) + b"\x81")
        await writer.drain()
        # A second peer that said hello and went silent.
        _reader2, writer2 = await asyncio.open_connection("127.0.0.1", process.port)
        writers.append(writer2)
        writer2.write(encode_frame({**HELLO, "source_id": "silent"}))
        await writer2.drain()

        for _ in range(150):  # a scrape is the only way to see a process's counters: polled, 15 s at most
            if (await process.metrics()).get("skewless_gateway_invalid_payloads", 0) >= 2:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the two invalid payloads were never counted")
        status, health = await process.health()
        assert (status, health["status"]) == (200, "ok")
        # The valid event lands before the stop: released once the merge stops waiting for the silent source (at
        # once if its hello came second, after the merge's wait for it if first: the two connections race), then
        # committed. A stop commits what was released; an event still held stays unacked for its source to resend.
        topic = TopicNames(topic_prefix).events("s")
        for _ in range(60):
            values, _ = await asyncio.to_thread(read_stream, kafka.bootstrap_servers, topic, 5.0, settled=True)
            if values:
                break
        else:
            raise AssertionError("the valid event never reached Kafka")

        loop = asyncio.get_running_loop()
        started_s = loop.time()
        assert process.process is not None
        process.process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(10):
            returncode = await process.process.wait()
        assert loop.time() - started_s < 10.0
        assert returncode == 0, process.log()[-3000:]
    finally:
        for w in writers:
            w.close()
        await process.stop()
    values, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"), settled=True)
    assert [(v["seq"], v["payload"]) for v in values] == [(2, {"ok": True})]
