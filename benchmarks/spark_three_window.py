"""Job 1 (three_window) in Spark local[2]: throughput, and client-to-result latency through the whole pipeline.

Throughput: N contract records pre-loaded into a real Kafka topic (2 streams, so both local[2] cores have a group),
then processed with the availableNow trigger by (a) the three_window job (pandas group state running the pure
ThreeWindowAggregator) and (b) Spark's native window count (`window_count`, JVM only) on the same data, side by
side in one run: the ratio is what the Python state costs. Events/s = input rows / summed batch durations.

Latency: SDK sources (real clients) -> `skewless gateway` process -> Kafka -> three_window job (emit-early, 1 s
windows, 250 ms trigger) -> results topic. Per event: the Kafka timestamp of its MIDDLE window's result minus the
wall time the client sent it (a 1 s window alone makes an event wait 0.5 s on average before its window closes).

Writes docs/spark-benchmark.md and docs/spark-three-window.png. Run: .venv/bin/python benchmarks/spark_three_window.py
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import Consumer, Producer, TopicPartition

from broker.admin import ensure_topics
from broker.launcher import KafkaBroker
from contract.records import PUNCTUATION_KEY, RESULT_WINDOW, EventRecord, PunctuationRecord
from contract.topics import TopicNames
from gateway.launch import spawn_gateway

DOCS = Path(__file__).resolve().parents[1] / "docs"
BASE_US = 1_700_000_000_000_000


def preload(bootstrap: str, prefix: str, events: int, streams: tuple[str, ...]) -> None:
    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.events(s) for s in streams])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})
    per_stream = events // len(streams)
    for s, stream in enumerate(streams):
        topic = topics.events(stream)
        for i in range(per_stream):
            ts = BASE_US + i * 100  # 10k events per second of event time
            record = EventRecord(stream=stream, source_id=f"src-{s}-{i % 10}", seq=i // 10, source_ts_us=ts,
                                 ref_ts_us=ts, uncertainty_us=500, arrival_ts_us=ts, release_ts_us=ts,
                                 payload={"value": float(i % 97), "type": "ABC"[i % 3], "id": i % 50})
            while True:
                try:
                    producer.produce(topic, key=record.key, value=record.to_json())
                    break
                except BufferError:
                    producer.poll(0.05)
        end = BASE_US + per_stream * 100 + 10_000_000
        punctuation = PunctuationRecord(stream=stream, watermark_us=end, release_ts_us=end)
        producer.produce(topic, key=PUNCTUATION_KEY, value=punctuation.to_json())
    producer.flush(120)


def rate_of(query: Any) -> tuple[int, float]:
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    seconds = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress) / 1000
    return rows, seconds


SEQUENCE_QUERY = "EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 20 ms"
PATTERN = "SEQ(a: type == 'A', b: type == 'B') PARTITION BY id WITHIN 10 ms MODE per_event MAX_UNCERTAINTY 1 ms"
JOBS = ("three_window", "window_count", "native_window", "pattern", "sequence")


def start_native_window(spark: Any, bootstrap: str, prefix: str, checkpoint: str) -> Any:
    """The peer: Spark's own window count on the same records (JVM only, Spark's watermark with delay 0, so it may
    drop legal rows; on this ordered single-partition data it drops none)."""
    from pyspark.sql import functions as F

    from spark_jobs.stateful import read_contract_records

    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.results("native_window")])
    records = read_contract_records(spark, bootstrap, topics.events_pattern)
    counted = (records.where(F.col("kind") == "event")
               .withColumn("event_time", F.timestamp_micros(F.col("ref_ts_us")))
               .withWatermark("event_time", "0 seconds")
               .groupBy(F.window("event_time", "1 second").alias("w"), F.col("stream")).count())
    out = counted.select(
        F.concat_ws("|", F.col("stream"), F.unix_micros(F.col("w.start")).cast("string")).alias("key"),
        F.to_json(F.struct("stream", "count")).alias("value"))
    return (out.writeStream.outputMode("update").format("kafka").option("kafka.bootstrap.servers", bootstrap)
            .option("topic", topics.results("native_window")).option("checkpointLocation", checkpoint)
            .trigger(availableNow=True).start())


def start_job(spark: Any, name: str, bootstrap: str, prefix: str, checkpoint: str) -> Any:
    from spark_jobs import pattern, sequence, three_window, window_count

    if name == "three_window":
        return three_window.start(spark, three_window.ThreeWindowOptions(
            bootstrap_servers=bootstrap, topic_prefix=prefix, width_us=1_000_000, max_shift_us=1_000,
            checkpoint_dir=checkpoint, available_now=True, console=False))
    if name == "pattern":
        return pattern.start(spark, pattern.PatternOptions(
            bootstrap_servers=bootstrap, pattern=PATTERN, topic_prefix=prefix, checkpoint_dir=checkpoint,
            available_now=True, console=False))
    if name == "native_window":
        return start_native_window(spark, bootstrap, prefix, checkpoint)
    if name == "sequence":
        return sequence.start(spark, sequence.SequenceOptions(
            bootstrap_servers=bootstrap, query=SEQUENCE_QUERY, topic_prefix=prefix, checkpoint_dir=checkpoint,
            available_now=True, console=False))
    return window_count.start(spark, window_count.WindowCountOptions(
        bootstrap_servers=bootstrap, topic_prefix=prefix, width_us=1_000_000,
        checkpoint_dir=checkpoint, available_now=True, console=False))


def throughput(spark: Any, bootstrap: str, events: int) -> dict[str, float]:

    prefix = f"bench{uuid.uuid4().hex[:6]}"
    preload(bootstrap, prefix, events, ("a", "b"))
    out: dict[str, float] = {}
    for name in JOBS:
        checkpoint = tempfile.mkdtemp(prefix=f"bench-{name}-")
        query = start_job(spark, name, bootstrap, prefix, checkpoint)
        started = time.monotonic()
        query.awaitTermination()
        wall = time.monotonic() - started
        rows, seconds = rate_of(query)
        out[f"{name}_rows"] = rows
        out[f"{name}_batch_s"] = seconds
        out[f"{name}_wall_s"] = wall
        out[f"{name}_events_per_s"] = rows / seconds if seconds else 0.0
        print(f"{name}: {rows} rows in {seconds:.1f} s of batches ({wall:.1f} s wall): "
              f"{out[f'{name}_events_per_s']:,.0f} events/s", flush=True)
        shutil.rmtree(checkpoint, ignore_errors=True)
    return out


def start_gateway(bootstrap: str, prefix: str) -> tuple[subprocess.Popen[bytes], int]:
    process, addresses = spawn_gateway(["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix])
    return process, addresses.port


async def paced_sources(port: int, sources: int, rate: float, seconds: float) -> dict[tuple[str, int], int]:
    from clients.client import SkewlessClient

    sent_us: dict[tuple[str, int], int] = {}  # (source_id, seq) -> wall time sent
    clients = [SkewlessClient("127.0.0.1", port, f"sensor-{s}", ["lat"], batch_events=10, linger_s=0.002,
                              heartbeat_interval_s=0.1) for s in range(sources)]
    await asyncio.gather(*(c.connect() for c in clients))

    async def one(client: SkewlessClient) -> None:
        start = time.monotonic()
        i = 0
        while time.monotonic() - start < seconds:
            now_us = time.time_ns() // 1000
            seq = await client.send("lat", {"value": float(i % 10)}, source_ts_us=now_us)
            sent_us[(client.source_id, seq)] = now_us
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.monotonic()))
        await client.flush()

    await asyncio.gather(*(one(c) for c in clients))
    # Keep heartbeating so the gateway's watermark (and Spark's) moves past the last windows.
    await asyncio.sleep(4.0)
    await asyncio.gather(*(c.close() for c in clients))
    return sent_us


def read_with_timestamps(bootstrap: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        end = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        consumer.assign([TopicPartition(topic, 0, 0)])
        out: list[tuple[int, dict[str, Any]]] = []
        while len(out) < end:
            msg = consumer.poll(5.0)
            if msg is None:
                break
            if msg.error() is None:
                out.append((msg.timestamp()[1] * 1000, orjson.loads(msg.value())))
        return out
    finally:
        consumer.close()


def latency(spark: Any, bootstrap: str, sources: int, rate: float, seconds: float) -> dict[str, float]:
    from spark_jobs import three_window

    prefix = f"lat{uuid.uuid4().hex[:6]}"
    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.events("lat"), topics.late("lat")])
    gateway, port = start_gateway(bootstrap, prefix)
    query = three_window.start(spark, three_window.ThreeWindowOptions(
        bootstrap_servers=bootstrap, topic_prefix=prefix, streams=("lat",), width_us=1_000_000, emit_early=True,
        max_shift_us=5_000, checkpoint_dir=tempfile.mkdtemp(prefix="bench-lat-"), console=False,
        processing_time="250 milliseconds"))
    try:
        time.sleep(15)  # first batches compile and start the Python workers
        # The sources run in their own process: in this one they would compete with the Spark driver's Python
        # callbacks (foreachBatch) for the GIL and slow every micro-batch down.
        sent_file = Path(tempfile.mkdtemp()) / "sent.json"
        subprocess.run([sys.executable, __file__, "--sources-only", str(port), str(sources), str(rate), str(seconds),
                        str(sent_file)], check=True)
        sent = {tuple(k.split("|", 1)): v for k, v in orjson.loads(sent_file.read_bytes()).items()}
        time.sleep(5)
    finally:
        query.stop()
        gateway.terminate()
        gateway.wait(30)
    results = read_with_timestamps(bootstrap, topics.results("three_window"))
    released_us = {r["nominal_start_us"]: ts for ts, r in results
                   if r.get("record") == RESULT_WINDOW and r.get("window_type") == "MIDDLE"}
    lat_ms = sorted((released_us[(s // 1_000_000) * 1_000_000] - s) / 1000 for s in sent.values()
                    if (s // 1_000_000) * 1_000_000 in released_us)
    close_lag_ms = sorted((ts - r["nominal_start_us"] - 1_000_000) / 1000 for ts, r in results
                          if r.get("record") == RESULT_WINDOW and r.get("window_type") == "MIDDLE")
    out = {"events": float(len(sent)), "with_result": float(len(lat_ms)),
           "p50_ms": statistics.median(lat_ms), "p99_ms": lat_ms[int(0.99 * (len(lat_ms) - 1))],
           "close_lag_p50_ms": statistics.median(close_lag_ms), "close_lag_max_ms": max(close_lag_ms)}
    print(f"latency: {len(lat_ms)}/{len(sent)} events, client-to-result p50 {out['p50_ms']:.0f} ms, "
          f"p99 {out['p99_ms']:.0f} ms; MIDDLE result after window close p50 {out['close_lag_p50_ms']:.0f} ms",
          flush=True)
    return out


def write_report(tp: dict[str, float], lat: dict[str, float], events: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2))
    names = ["three_window", "window_count", "Spark native\nwindow", "pattern", "sequence"]
    values = [tp[f"{j}_events_per_s"] for j in JOBS]
    ax.bar(names, values, color=["#4477aa", "#6699cc", "#bbbbbb", "#44aa77", "#aa7744"])
    ax.axhline(100_000, color="red", linestyle="--", label="target 100k/s")
    ax.set_ylabel("events/s (local[2])")
    ax.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "spark-three-window.png", dpi=120)
    ratio = tp["native_window_events_per_s"] / tp["three_window_events_per_s"]
    count_ratio = tp["native_window_events_per_s"] / tp["window_count_events_per_s"]
    text = f"""# Spark jobs benchmark (Job 1: three_window)

Produced by `benchmarks/spark_three_window.py` on this machine (2 cores, shared; Spark local[2], Kafka 4.0.0 on
loopback). Numbers from one run; rerun to refresh.

## Throughput ({events:,} events, 2 streams, availableNow, one query at a time on the same topics)

| job | rows | summed batch time | events/s |
|---|---:|---:|---:|
| three_window (pure aggregator in applyInPandasWithState) | {tp['three_window_rows']:,.0f} | \
{tp['three_window_batch_s']:.1f} s | {tp['three_window_events_per_s']:,.0f} |
| window_count (exact: TumblingWindowCounter per stream, released at the gateway's promise, corrections) | \
{tp['window_count_rows']:,.0f} | {tp['window_count_batch_s']:.1f} s | {tp['window_count_events_per_s']:,.0f} |
| the peer: Spark's native window + count (JVM only, Spark's watermark) | {tp['native_window_rows']:,.0f} | \
{tp['native_window_batch_s']:.1f} s | {tp['native_window_events_per_s']:,.0f} |
| pattern (`{PATTERN}`) | {tp['pattern_rows']:,.0f} | {tp['pattern_batch_s']:.1f} s | \
{tp['pattern_events_per_s']:,.0f} |
| sequence (`{SEQUENCE_QUERY}`) | {tp['sequence_rows']:,.0f} | {tp['sequence_batch_s']:.1f} s | \
{tp['sequence_events_per_s']:,.0f} |

Target >= 100k events/s: **{'met' if tp['three_window_events_per_s'] >= 100_000 else 'missed'}**. Spark's native
window count is {ratio:.1f}x faster than three_window and {count_ratio:.1f}x faster than the exact window_count on
the same data; it bounds every job that reads this contract here (Kafka reading and `from_json` of every record in
the JVM are most of its cost), but it is not exact: its watermark is the maximum event time seen minus a delay,
and rows behind it are dropped (docs/spark-jobs.md). Every Skewless job adds the shuffle that groups by stream,
the Arrow transfer of the needed columns to Python, one Python dict per row (the shell sorts a stream's batch by
reference time across partitions and topics) and the core's per-event work; one core per stream, so the two
streams use both cores. The pattern and sequence jobs also decode every payload.

![throughput](spark-three-window.png)

## Client-to-result latency (whole pipeline)

{lat['events']:.0f} events from paced SDK sources through a `skewless gateway` process, Kafka and the three_window
job (1 s tumbling windows, emit-early, 250 ms trigger). Latency per event = Kafka timestamp of its MIDDLE window's
result minus the client's send time; {lat['with_result']:.0f} events had a released window.

| measure | value |
|---|---:|
| client-to-result p50 | {lat['p50_ms']:.0f} ms |
| client-to-result p99 | {lat['p99_ms']:.0f} ms |
| MIDDLE result after its window closed, p50 | {lat['close_lag_p50_ms']:.0f} ms |
| same, max | {lat['close_lag_max_ms']:.0f} ms |

Target p50 <= 2 s: **{'met' if lat['p50_ms'] <= 2000 else 'missed'}**. An event waits for its window to close
(0.5 s on average with 1 s windows); then the gateway's next punctuation (its promise that the window is complete)
has to reach Kafka, and the micro-batch that carries it releases the window: three_window groups punctuations with
their stream's events, so no extra batch is needed for Spark's watermark. What remains is micro-batch overhead,
a few hundred ms to ~1 s per batch on this machine (state store commit, Python worker round trip, Kafka sink).
"""
    (DOCS / "spark-benchmark.md").write_text(text)


def sources_only(argv: list[str]) -> None:
    port, sources, rate, seconds, out = int(argv[0]), int(argv[1]), float(argv[2]), float(argv[3]), Path(argv[4])
    sent = asyncio.run(paced_sources(port, sources, rate, seconds))
    out.write_bytes(orjson.dumps({f"{source}|{seq}": us for (source, seq), us in sent.items()}))


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--sources-only":
        sources_only(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--latency-seconds", type=float, default=20.0)
    parser.add_argument("--latency-only", action="store_true", help="skip throughput; print, do not write docs")
    args = parser.parse_args()
    from spark_jobs.session import create_spark_session, stop_spark

    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    broker = KafkaBroker(work / "kafka")
    state = broker.start()
    spark = create_spark_session("bench-three-window")
    try:
        tp = {} if args.latency_only else throughput(spark, state.bootstrap_servers, args.events)
        lat = latency(spark, state.bootstrap_servers, sources=4, rate=200.0, seconds=args.latency_seconds)
    finally:
        stop_spark(spark)
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    if args.latency_only:
        return
    write_report(tp, lat, args.events)
    print(f"wrote {DOCS / 'spark-benchmark.md'}")


if __name__ == "__main__":
    main()
