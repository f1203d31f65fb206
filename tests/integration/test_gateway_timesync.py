"""The gateway with its time-sync server: a source whose clock is 5 s ahead is mapped back onto the reference
clock, with an honest uncertainty, and its clock state lands in the compacted sources topic."""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from broker.reader import read_stream, read_topic
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.server import Gateway, GatewayConfig
from timesync.client import sync_burst
from timesync.clocks import SimulatedClock
from timesync.server import ServerConfig

pytestmark = pytest.mark.integration

AHEAD_US = 5_000_000


async def test_offset_source_mapped_to_reference_time(kafka, topic_prefix):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    timesync=ServerConfig(host="127.0.0.1", port=0)))
    await gateway.start()
    try:
        assert gateway.timesync_port is not None
        clock = SimulatedClock(ahead_us=AHEAD_US)
        estimate = await sync_burst("127.0.0.1", gateway.timesync_port, "skewed", clock, count=10)
        assert abs(estimate.offset_us + AHEAD_US) < 2_000  # loopback: within 2 ms even on a loaded machine

        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame({"type": "hello", "version": 1, "source_id": "skewed", "streams": ["s"]}))
        true_times = []
        events = []
        for seq in range(20):
            true_times.append(time.time_ns() // 1000)
            events.append({"stream": "s", "seq": seq, "source_ts_us": clock(), "payload": seq})
        writer.write(encode_frame({"type": "events", "events": events}))
        decoder = FrameDecoder()
        async with asyncio.timeout(15):
            while {"type": "ack", "stream": "s", "seq": 19} not in decoder.feed(await reader.read(65536)):
                pass
        writer.close()
    finally:
        await gateway.stop()

    topics = TopicNames(topic_prefix)
    published, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"), settled=True)
    assert [e["seq"] for e in published] == list(range(20))
    for record, true_us in zip(published, true_times, strict=True):
        assert record["source_ts_us"] - record["ref_ts_us"] == pytest.approx(AHEAD_US, abs=2_000)
        assert 0 < record["uncertainty_us"] < 50_000
        # The true time lies inside the reported bound (the test reads true time within ~1 ms of the stamp).
        assert abs(record["ref_ts_us"] - true_us) <= record["uncertainty_us"] + 1_000
    clock_states = [orjson.loads(v) for k, v in read_topic(kafka.bootstrap_servers, topics.sources, settled=True)
                    if k == b"skewed"]
    assert clock_states
    assert clock_states[-1]["kind"] == "clock"
    assert clock_states[-1]["offset_us"] == pytest.approx(-AHEAD_US, abs=2_000)
    assert clock_states[-1]["sample_count"] >= 8
