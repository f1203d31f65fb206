"""`skewless demo`: the whole pipeline on real processes, with badly set source clocks, checked end to end.

Kafka broker (KRaft, Maven Central jars) <- `skewless gateway` (its own process: TCP ingest + NTP-format time sync)
<- three simulated sources (the SDK; clocks 0, +250 ms / +80 ppm, -1.5 s / -150 ppm off) ; then the Spark
Structured Streaming window_count job reads Kafka and publishes window counts, which are checked against the
records in Kafka and compared with the ground truth and with what the raw source clocks would have given. Then the
CEP jobs run on the same topic: three_window (LOW/MIDDLE/HIGH, averaged), pattern (Confirmed/Uncertain swings
from hot to cold) and sequence (a SASE query with negation); each is checked against the pure core run locally.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer

from broker.launcher import KafkaBroker
from broker.reader import read_stream, read_topic
from clients import SimulatedClock, connect
from contract.topics import TopicNames
from gateway.launch import spawn_gateway
from skewless.cli_common import finite_float
from skewless.demo_cep import run_cep_jobs
from timesync.clocks import system_time_us

WINDOW_US = 1_000_000
STREAM = "sensors"
# (ahead_us, skew_ppm) of each simulated source clock against true time (positive ahead_us: the clock reads ahead).
CLOCKS = [(0, 0.0), (250_000, 80.0), (-1_500_000, -150.0)]
# How long the sources stay, once everything is acknowledged, for their heartbeats to promise the last window.
WATERMARK_WAIT_S = 30.0


@dataclass(frozen=True)
class SentEvent:
    source_id: str
    seq: int
    true_us: int


def _log(message: str, started: float) -> None:
    typer.echo(f"[demo {time.monotonic() - started:6.1f}s] {message}")


def demo(
    events: Annotated[int, typer.Option(help="Events per source.")] = 400,
    rate: Annotated[float, typer.Option(callback=finite_float(above=0),
                                        help="Events per second per source.")] = 100.0,
) -> None:
    """Start Kafka, the gateway and three skewed sources, run the Spark window job, verify and print the results."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="skewless-demo-") as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        _log("starting Kafka (KRaft, single node)...", started)
        state = broker.start()
        gateway: subprocess.Popen[bytes] | None = None
        try:
            _log(f"Kafka ready at {state.bootstrap_servers}; starting the gateway...", started)
            gateway, port, sync_port = start_gateway_process(state.bootstrap_servers)
            _log(f"gateway on tcp {port}, time sync on udp {sync_port}; {len(CLOCKS)} sources sync, then send "
                 f"{events} events each...", started)
            sent = asyncio.run(run_sources(port, sync_port, events, rate, state.bootstrap_servers))
            _log(f"{len(sent)} events acknowledged (= in Kafka); running the Spark window_count job...", started)
            spark_counts = run_window_job(state.bootstrap_servers)
            ok = report(state.bootstrap_servers, sent, spark_counts)
            if not ok:
                raise typer.Exit(1)
            _log("Spark's window counts equal the counts of the records in Kafka; running the CEP jobs...", started)
            if not run_cep_jobs(state.bootstrap_servers, {(e.source_id, e.seq): e.true_us for e in sent}):
                raise typer.Exit(1)
            _log("the CEP jobs' results equal the pure cores' results on the same records", started)
        finally:
            if gateway is not None:
                gateway.terminate()
                gateway.wait(timeout=30)
            broker.stop()
            _log("stopped gateway and Kafka", started)


def start_gateway_process(bootstrap: str) -> tuple[subprocess.Popen[bytes], int, int]:
    process, addresses = spawn_gateway(["--port", "0", "--timesync-port", "0", "--bootstrap", bootstrap])
    assert addresses.timesync_port is not None
    return process, addresses.port, addresses.timesync_port


async def run_sources(port: int, sync_port: int, events: int, rate: float, bootstrap: str) -> list[SentEvent]:
    clocks = [SimulatedClock(ahead_us, skew_ppm) for ahead_us, skew_ppm in CLOCKS]
    clients = [await connect("127.0.0.1", port, sync_port, f"sensor-{i}", 10, streams=[STREAM],
                             clock_us=clock, batch_events=20)
               for i, clock in enumerate(clocks)]
    sent: list[SentEvent] = []

    async def one(index: int) -> None:
        client = clients[index]
        rng = random.Random(index)
        for i in range(events):
            true_us = system_time_us()
            # The source stamps the event with what its skewed clock read at that true instant.
            celsius = round(rng.gauss(20.0, 2.0), 3)
            kind = "HOT" if celsius > 22.5 else "COLD" if celsius < 17.5 else "OK"
            seq = await client.send(STREAM, {"i": i, "celsius": celsius, "type": kind},
                                    source_ts_us=clocks[index].at(true_us))
            sent.append(SentEvent(client.source_id, seq, true_us))
            await asyncio.sleep(1.0 / rate)
        await client.flush()

    await asyncio.gather(*(one(i) for i in range(len(clients))))
    # Spark's windows are final once a punctuation promises them. The sources' idle heartbeats carry the watermark
    # past the last window within a few heartbeat intervals; a source that has left promises nothing more (a bye
    # does not punctuate at the gateway's clock: docs/wire-protocol.md, "Leaving"), so they stay until then.
    await asyncio.get_running_loop().run_in_executor(None, wait_for_final_watermark, bootstrap)
    await asyncio.gather(*(client.close() for client in clients))
    return sent


def wait_for_final_watermark(bootstrap: str, timeout_s: float = WATERMARK_WAIT_S) -> None:
    """Until a punctuation of the stream passes the end of the window of its last record (or ``timeout_s``: the
    report then shows the windows left open)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records, punctuations = read_stream(bootstrap, TopicNames().events(STREAM))
        if records:
            last_window_end_us = _window(max(r["ref_ts_us"] for r in records)) + WINDOW_US
            if max((p["watermark_us"] for p in punctuations), default=0) >= last_window_end_us:
                return
        if time.monotonic() >= deadline:
            return
        time.sleep(0.2)


def run_window_job(bootstrap: str) -> dict[int, int]:
    from spark_jobs import window_count
    from spark_jobs.session import create_spark_session, stop_spark

    spark = create_spark_session("skewless-demo")
    try:
        query = window_count.start(spark, window_count.WindowCountOptions(
            bootstrap_servers=bootstrap, width_us=WINDOW_US, available_now=True))
        query.awaitTermination()
    finally:
        stop_spark(spark)
    return {start: count for (stream, start), count in final_window_counts(bootstrap).items() if stream == STREAM}


def final_window_counts(bootstrap: str, prefix: str = "skewless") -> dict[tuple[str, int], int]:
    """Last upsert per (stream, window_start_us) in the results topic."""
    final: dict[tuple[str, int], int] = {}
    for _key, value in read_topic(bootstrap, TopicNames(prefix).results("window_count")):
        row = orjson.loads(value)
        final[(row["stream"], row["window_start_us"])] = row["count"]
    return final


def _window(ts_us: int) -> int:
    return ts_us - ts_us % WINDOW_US


def outside_uncertainty(records: list[dict[str, Any]], true_us: dict[tuple[str, int], int]) -> int:
    """How many records' true time (``true_us`` by source and seq) is farther from their reference time than their
    reported uncertainty: each one a broken promise (the bound is inclusive)."""
    return sum(abs(r["ref_ts_us"] - true_us[(r["source_id"], r["seq"])]) > r["uncertainty_us"] for r in records)


def report(bootstrap: str, sent: list[SentEvent], spark_counts: dict[int, int]) -> bool:
    records, _punctuations = read_stream(bootstrap, TopicNames().events(STREAM))
    true_us = {(e.source_id, e.seq): e.true_us for e in sent}
    typer.echo("\nper source: injected clock error vs what the gateway measured")
    for index, (ahead_us, skew_ppm) in enumerate(CLOCKS):
        mine = [r for r in records if r["source_id"] == f"sensor-{index}"]
        measured = sorted(r["source_ts_us"] - r["ref_ts_us"] for r in mine)[len(mine) // 2]
        inside = sum(abs(r["ref_ts_us"] - true_us[(r["source_id"], r["seq"])]) <= r["uncertainty_us"]
                     for r in mine)
        typer.echo(f"  sensor-{index}: clock {ahead_us / 1000:+9.1f} ms {skew_ppm:+6.1f} ppm | measured "
                   f"{measured / 1000:+9.3f} ms | true time within the reported uncertainty: "
                   f"{inside}/{len(mine)}")
    by_ref = Counter(_window(r["ref_ts_us"]) for r in records)
    by_raw = Counter(_window(r["source_ts_us"]) for r in records)
    by_true = Counter(_window(e.true_us) for e in sent)
    typer.echo(f"\n{'window (UTC s)':>16} {'true':>6} {'spark (ref time)':>17} {'raw source clocks':>18}")
    for start in sorted(set(by_ref) | set(by_raw) | set(by_true)):
        typer.echo(f"{start // 1_000_000:>16} {by_true.get(start, 0):>6} {spark_counts.get(start, 0):>17} "
                   f"{by_raw.get(start, 0):>18}")
    moved = [r for r in records if _window(r["ref_ts_us"]) != _window(true_us[(r["source_id"], r["seq"])])]
    # An event whose true time lies within its reported uncertainty of a window boundary may land on either side:
    # that is the promise kept. One moved by more than its uncertainty would be a broken promise.
    beyond = outside_uncertainty(moved, true_us)
    moved_raw = sum(_window(r["source_ts_us"]) != _window(true_us[(r["source_id"], r["seq"])]) for r in records)
    typer.echo(f"\nevents in the wrong window: {len(moved)} with Skewless' reference time ({beyond} moved by more "
               f"than their reported uncertainty), {moved_raw} with raw source clocks (of {len(records)})")
    ok = len(records) == len(sent) and dict(by_ref) == spark_counts
    if not ok:
        typer.echo(f"MISMATCH: {len(records)} records for {len(sent)} sent; Spark {spark_counts} vs {dict(by_ref)}")
    outside = outside_uncertainty(records, true_us)
    if outside:
        # The uncertainty is the gateway's promise about each event's time: a demo that broke it must not pass.
        typer.echo(f"BROKEN PROMISE: the true time of {outside} events lies outside their reported uncertainty")
    return ok and not outside
