"""SDK -> gateway -> real Kafka -> Spark Structured Streaming window counts, checked against what was sent."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import orjson
import pytest

from broker.reader import read_stream, read_topic
from clients.client import SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway
from skewless.demo import final_window_counts

pytestmark = pytest.mark.integration

SOURCES = 3
EVENTS_PER_SOURCE = 500
BASE_TS_US = 1_700_000_000_000_000
CONTRACT_FIELDS = {"stream", "source_id", "seq", "source_ts_us", "ref_ts_us", "uncertainty_us", "arrival_ts_us",
                   "release_ts_us", "late", "payload"}


def planned_events(source: int) -> list[tuple[str, int, dict[str, int]]]:
    """Deterministic (stream, source_ts_us, payload) per source: two streams, ~7 s of event time."""
    rng = random.Random(source)
    ts_us = BASE_TS_US + source * 1_000
    out = []
    for i in range(EVENTS_PER_SOURCE):
        ts_us += rng.randrange(5_000, 25_000)
        out.append(("doors" if i % 3 else "temps", ts_us, {"i": i, "source": source}))
    return out


async def send_all(port: int, bootstrap: str, topics: TopicNames) -> dict[int, list[tuple[str, int, dict[str, int]]]]:
    plans = {s: planned_events(s) for s in range(SOURCES)}
    last_window_end_us = max(ts for plan in plans.values() for _s, ts, _p in plan) // 1_000_000 * 1_000_000 + 1_000_000

    clients = [SkewlessClient("127.0.0.1", port, f"src-{s}", ["doors", "temps"], batch_events=37)
               for s in range(SOURCES)]
    # Every source registers before any sends, as they would after their time sync: the merger can only wait
    # for sources it knows.
    await asyncio.gather(*(c.connect() for c in clients))

    async def one(source: int) -> None:
        client = clients[source]
        for stream, ts_us, payload in plans[source]:
            await client.send(stream, payload, source_ts_us=ts_us)
        await client.flush()

    await asyncio.gather(*(one(s) for s in range(SOURCES)))
    # Spark's windows are final once a punctuation promises them: the sources' idle heartbeats carry their clocks
    # past the last window within a few intervals; a source that leaves first promises nothing more.
    for _ in range(100):
        marks = [max((p["watermark_us"] for p in read_stream(bootstrap, topics.events(stream))[1]), default=0)
                 for stream in ("doors", "temps")]
        if min(marks) >= last_window_end_us:
            break
        await asyncio.sleep(0.2)
    assert min(marks) >= last_window_end_us, marks
    await asyncio.gather(*(client.close() for client in clients))
    return plans


async def test_events_reach_kafka_and_spark_counts_match(gateway: Gateway, kafka, spark, topic_prefix):
    plans = await send_all(gateway.port, kafka.bootstrap_servers, TopicNames(topic_prefix))
    topics = TopicNames(topic_prefix)

    records = []
    for stream in ("doors", "temps"):
        events, punctuations = read_stream(kafka.bootstrap_servers, topics.events(stream))
        # No source timed out (each closes only after its last ack), so the merged stream is in t_ref order,
        # and each punctuation promises that nothing older follows it.
        assert [e["ref_ts_us"] for e in events] == sorted(e["ref_ts_us"] for e in events)
        assert punctuations
        position = 0
        for value in read_topic(kafka.bootstrap_servers, topics.events(stream)):
            record = orjson.loads(value[1])
            if record.get("kind") == "punctuation":
                assert all(e["ref_ts_us"] >= record["watermark_us"] for e in events[position:])
            else:
                position += 1
        records += events
    assert len(records) == SOURCES * EVENTS_PER_SOURCE
    assert all(set(r) >= CONTRACT_FIELDS for r in records)

    sent = {(f"src-{s}", stream, ts, orjson.dumps(p)) for s, plan in plans.items() for stream, ts, p in plan}
    got = {(r["source_id"], r["stream"], r["source_ts_us"], orjson.dumps(r["payload"])) for r in records}
    assert got == sent
    for r in records:
        assert r["ref_ts_us"] == r["source_ts_us"]
        assert r["uncertainty_us"] == 0
        assert r["late"] is False
        assert r["arrival_ts_us"] <= r["release_ts_us"]
    for source in range(SOURCES):
        for stream in ("doors", "temps"):
            seqs = [r["seq"] for r in records if r["source_id"] == f"src-{source}" and r["stream"] == stream]
            assert seqs == list(range(len(seqs)))

    from spark_jobs import window_count

    query = window_count.start(spark, window_count.WindowCountOptions(
        bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, width_us=1_000_000,
        available_now=True, console=False))
    await asyncio.get_running_loop().run_in_executor(None, query.awaitTermination)

    expected = Counter((stream, ts - ts % 1_000_000) for plan in plans.values() for stream, ts, _p in plan)
    assert final_window_counts(kafka.bootstrap_servers, topic_prefix) == dict(expected)
