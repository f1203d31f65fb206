"""A restarted gateway maps a synced source's timestamps at once, from the clock state in the sources topic,
instead of treating it as unsynced (1 h error bound, holding every merge back) until its next re-sync."""

from __future__ import annotations

import asyncio

import pytest

from broker.reader import read_stream
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.server import Gateway, GatewayConfig
from timesync.client import sync_burst
from timesync.clocks import UNKNOWN_ERROR_BOUND_US, SimulatedClock
from timesync.server import ServerConfig

pytestmark = pytest.mark.integration

AHEAD_US = 5_000_000


def gateway_config(kafka, prefix: str) -> GatewayConfig:
    return GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=prefix,
                         timesync=ServerConfig(host="127.0.0.1", port=0))


async def send_events(port: int, clock: SimulatedClock, seqs: range) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_frame({"type": "hello", "version": 1, "source_id": "skewed", "streams": ["s"]}))
    events = [{"stream": "s", "seq": seq, "source_ts_us": clock(), "payload": seq} for seq in seqs]
    writer.write(encode_frame({"type": "events", "events": events}))
    decoder = FrameDecoder()
    async with asyncio.timeout(20):
        while {"type": "ack", "stream": "s", "seq": seqs[-1]} not in decoder.feed(await reader.read(65536)):
            pass
    writer.close()


async def test_restarted_gateway_recovers_clock_state_from_the_sources_topic(kafka, topic_prefix):
    clock = SimulatedClock(ahead_us=AHEAD_US)
    first = Gateway(gateway_config(kafka, topic_prefix))
    await first.start()
    try:
        assert first.timesync_port is not None
        await sync_burst("127.0.0.1", first.timesync_port, "skewed", clock, count=10)
        await send_events(first.port, clock, range(5))
        synced = first.store.get("skewed")
        assert synced is not None
    finally:
        await first.stop()

    second = Gateway(gateway_config(kafka, topic_prefix))
    await second.start()
    try:
        recovered = second.store.get("skewed")
        assert recovered is not None
        assert (recovered.estimate, recovered.last_sync_us) == (synced.estimate, synced.last_sync_us)
        await send_events(second.port, clock, range(5, 10))  # no re-sync in between
    finally:
        await second.stop()

    published, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [r["seq"] for r in published] == list(range(10))
    for record in published:
        assert record["source_ts_us"] - record["ref_ts_us"] == pytest.approx(AHEAD_US, abs=2_000)
        assert record["uncertainty_us"] < 100_000 < UNKNOWN_ERROR_BOUND_US
