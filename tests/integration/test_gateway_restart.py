"""A restarted gateway recovers from Kafka how far every source got: resent events are not published twice."""

from __future__ import annotations

import asyncio

import pytest

from broker.reader import read_stream, read_topic
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.server import Gateway, GatewayConfig

pytestmark = pytest.mark.integration


def hello(source_id: str) -> bytes:
    return encode_frame({"type": "hello", "version": 1, "source_id": source_id, "streams": ["s"]})


# Source clocks advance at different rates per event ("b" emits a third as often), so both reach reference time
# 1.03 s at the restart: every event after it is newer than the watermark promised before it.
TS_STEP_US = {"a": 1_000, "b": 3_000}


def source_ts(source_id: str, seq: int) -> int:
    return 1_000_000 + TS_STEP_US[source_id] * seq


def events(source_id: str, seqs: range) -> bytes:
    return encode_frame({"type": "events", "events": [
        {"stream": "s", "seq": i, "source_ts_us": source_ts(source_id, i), "payload": {"src": source_id, "i": i}}
        for i in seqs]})


async def send_until_ack(port: int, plan: dict[str, range]) -> None:
    """Every source says hello (and so joins the merge) before any sends, then sends its seqs and a heartbeat."""
    connections = {s: await asyncio.open_connection("127.0.0.1", port) for s in plan}
    decoders = {s: FrameDecoder() for s in plan}

    async def until(source_id: str, want: dict) -> None:
        reader = connections[source_id][0]
        async with asyncio.timeout(20):
            while True:
                replies = decoders[source_id].feed(await reader.read(65536))
                assert all(r["type"] != "error" for r in replies), replies
                if any(want.items() <= r.items() for r in replies):
                    break

    try:
        for source_id, (_reader, writer) in connections.items():
            writer.write(hello(source_id))
            await until(source_id, {"type": "welcome", "version": 1, "max_frame_bytes": 1024 * 1024})
        for source_id, seqs in plan.items():
            # An honest heartbeat: the source's clock has moved just past its newest event, no further.
            connections[source_id][1].write(events(source_id, seqs) + encode_frame(
                {"type": "heartbeat", "source_ts_us": source_ts(source_id, seqs.stop), "next_seq": {"s": seqs.stop}}))
        await asyncio.gather(*(until(s, {"type": "ack", "stream": "s", "seq": seqs.stop - 1})
                               for s, seqs in plan.items()))
    finally:
        for _reader, writer in connections.values():
            writer.close()


async def start_gateway(kafka, prefix: str) -> Gateway:
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=prefix,
                                    checkpoint_interval_s=0.2))
    await gateway.start()
    return gateway


async def test_restart_recovers_progress_and_drops_resent_duplicates(kafka, topic_prefix):
    first = await start_gateway(kafka, topic_prefix)
    await send_until_ack(first.port, {"a": range(30), "b": range(10)})
    await asyncio.sleep(0.5)  # at least one progress checkpoint
    await first.stop()
    # Every commit's delivery reports added up (its topics created just now: audited from offset 0).
    assert first.counters.offset_audit_failures == 0
    before, promised = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"), settled=True)
    promised_us = max(p["watermark_us"] for p in promised)

    second = await start_gateway(kafka, topic_prefix)
    try:
        # Both sources resend what they could not know was published (as after a lost ack), then continue.
        await send_until_ack(second.port, {"a": range(20, 40), "b": range(0, 15)})
        assert second.counters.recovered_sources == 2
        # The last watermark promised before the restart is still promised after it.
        watermark = second.pipeline.watermark_us("s")
        assert watermark is not None
        assert watermark >= promised_us
        assert second.counters.duplicates == 10 + 10
    finally:
        await second.stop()
    assert second.counters.offset_audit_failures == 0  # audited from its first report on the recovered stream

    topics = TopicNames(topic_prefix)
    published, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"), settled=True)
    assert all(e["ref_ts_us"] >= promised_us for e in published[len(before):])
    for source_id, count in (("a", 40), ("b", 15)):
        assert [e["seq"] for e in published if e["source_id"] == source_id] == list(range(count))
    late = read_topic(kafka.bootstrap_servers, topics.late("s"), settled=True)
    assert late == []
    checkpoints = [k for k, _v in read_topic(kafka.bootstrap_servers, topics.sources, settled=True)
                   if k == b"progress|s"]
    assert checkpoints
