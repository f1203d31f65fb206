"""The global buffer limit: when the merge holds too many events, the gateway stops reading the sources that hold
them, keeps reading the source it waits for, and resumes once the merge drains. Nothing is lost."""

from __future__ import annotations

import asyncio

import pytest

from broker.reader import read_stream
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.server import Gateway, GatewayConfig
from reorder.pipeline import PipelineConfig
from reorder.sequence import SequenceConfig

pytestmark = pytest.mark.integration

BASE_US = 1_700_000_000_000_000


def events(seqs: range) -> bytes:
    return encode_frame({"type": "events", "events": [
        {"stream": "s", "seq": q, "source_ts_us": BASE_US + q, "payload": q} for q in seqs]})


async def hello(port: int, source_id: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_frame({"type": "hello", "version": 1, "source_id": source_id, "streams": ["s"]}))
    while not FrameDecoder().feed(await reader.read(65536)):
        pass
    return reader, writer


async def wait_for(condition, what: str, timeout_s: float = 10.0) -> None:
    """Polls gateway state (there is no event to wait on from outside the gateway)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def test_sources_holding_events_are_throttled_until_the_merge_drains(kafka, topic_prefix):
    # The silent source would be waited for 30 s: long enough that only the heartbeat can release the merge.
    gateway = Gateway(GatewayConfig(
        port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, max_buffered_events=100,
        pipeline=PipelineConfig(sequence=SequenceConfig(drop_late=True, latency_threshold_us=30_000_000))))
    await gateway.start()
    try:
        (_ra, fast), (_rb, silent) = await hello(gateway.port, "fast"), await hello(gateway.port, "silent")
        fast.write(events(range(300)))
        await wait_for(lambda: gateway.throttled_sources == {"fast"}, "throttling of the source holding events")
        assert gateway.counters.global_pauses == 1
        assert gateway.counters.events_received == 300
        fast.write(events(range(300, 400)))
        await asyncio.sleep(0.5)
        assert gateway.counters.events_received == 300  # not read while throttled
        assert gateway.health()["throttled_sources"] == ["fast"]

        # The source the merge waits for is still read: its heartbeat releases everything.
        silent.write(encode_frame({"type": "heartbeat", "source_ts_us": BASE_US + 10_000, "next_seq": {"s": 0}}))
        await wait_for(lambda: gateway.counters.events_published == 400, "all events published after the heartbeat")
        assert gateway.throttled_sources == frozenset()
        assert gateway.pipeline.counters.source_timeouts == 0
        fast.close()
        silent.close()
    finally:
        await gateway.stop()
    published, _punctuations = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [e["seq"] for e in published] == list(range(400))
