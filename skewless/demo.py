"""`skewless demo`: the whole pipeline on real processes, then a check of Spark's window counts.

Kafka broker (KRaft, from Maven Central jars) -> `skewless gateway` (a separate process) <- simulated sources
(the SDK) ; Spark Structured Streaming window_count job reads Kafka, prints and publishes window counts.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Annotated

import orjson
import typer

from clients.client import SkewlessClient
from skewless.kafka_broker import KafkaBroker
from skewless.kafka_read import read_topic
from skewless.topics import TopicNames

WINDOW_US = 1_000_000


def _log(message: str, started: float) -> None:
    typer.echo(f"[demo {time.monotonic() - started:6.1f}s] {message}")


def demo(
    sources: Annotated[int, typer.Option(help="Simulated sources.")] = 3,
    events: Annotated[int, typer.Option(help="Events per source.")] = 400,
    rate: Annotated[float, typer.Option(help="Events per second per source.")] = 100.0,
) -> None:
    """Start Kafka, the gateway and simulated sources, run the Spark window job, verify and print the results."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skewless-demo-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        _log("starting Kafka (KRaft, single node)...", started)
        state = broker.start()
        gateway: subprocess.Popen[str] | None = None
        try:
            _log(f"Kafka ready at {state.bootstrap_servers}; starting the gateway...", started)
            gateway, port = start_gateway_process(state.bootstrap_servers)
            _log(f"gateway listening on 127.0.0.1:{port}; {sources} sources send {events} events each...", started)
            sent = asyncio.run(run_sources(port, sources, events, rate))
            expected = expected_window_counts(sent)
            _log(f"{len(sent)} events acknowledged (= in Kafka); running the Spark window_count job...", started)
            got = run_window_job(state.bootstrap_servers)
            _print_table(expected, got)
            if got != expected:
                typer.echo("MISMATCH between Spark's window counts and the events sent")
                raise typer.Exit(1)
            _log(f"all {len(expected)} windows match the events sent", started)
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(timeout=30)
            broker.stop()
            _log("stopped gateway and Kafka", started)


def start_gateway_process(bootstrap: str) -> tuple[subprocess.Popen[str], int]:
    process = subprocess.Popen(
        [sys.executable, "-m", "skewless", "gateway", "--port", "0", "--bootstrap", bootstrap],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    assert process.stdout is not None
    line = process.stdout.readline()
    if not line.startswith("listening "):
        process.kill()
        raise RuntimeError(f"gateway did not start: {line!r}")
    return process, int(line.rsplit(":", 1)[1])


async def run_sources(port: int, sources: int, events: int, rate: float) -> list[tuple[str, int]]:
    """Each source sends `events` events on stream `sensors` at `rate`/s; returns (stream, source_ts_us) sent."""
    sent: list[tuple[str, int]] = []

    async def one(index: int) -> None:
        rng = random.Random(index)
        async with SkewlessClient("127.0.0.1", port, f"sensor-{index}", ["sensors"], batch_events=20) as client:
            for i in range(events):
                ts_us = client.clock_us()
                await client.send("sensors", {"i": i, "value": round(rng.gauss(20.0, 2.0), 3)}, ts_us)
                sent.append(("sensors", ts_us))
                await asyncio.sleep(1.0 / rate)

    await asyncio.gather(*(one(i) for i in range(sources)))
    return sent


def expected_window_counts(sent: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    return dict(Counter((stream, ts_us - ts_us % WINDOW_US) for stream, ts_us in sent))


def run_window_job(bootstrap: str) -> dict[tuple[str, int], int]:
    from spark_jobs import window_count
    from spark_jobs.session import create_spark_session, stop_spark

    spark = create_spark_session("skewless-demo")
    try:
        query = window_count.start(spark, window_count.WindowCountOptions(
            bootstrap_servers=bootstrap, window="1 second", watermark="2 seconds", available_now=True))
        query.awaitTermination()
    finally:
        stop_spark(spark)
    return final_window_counts(bootstrap)


def final_window_counts(bootstrap: str, prefix: str = "skewless") -> dict[tuple[str, int], int]:
    """Last upsert per (stream, window_start_us) in the results topic."""
    final: dict[tuple[str, int], int] = {}
    for _key, value in read_topic(bootstrap, TopicNames(prefix).results("window_count")):
        row = orjson.loads(value)
        final[(row["stream"], row["window_start_us"])] = row["count"]
    return final


def _print_table(expected: dict[tuple[str, int], int], got: dict[tuple[str, int], int]) -> None:
    typer.echo(f"{'stream':<10} {'window_start_us':>18} {'spark_count':>12} {'sent':>6}")
    for key in sorted(set(expected) | set(got)):
        typer.echo(f"{key[0]:<10} {key[1]:>18} {got.get(key, 0):>12} {expected.get(key, 0):>6}")
