"""End-to-end gateway throughput into a real Kafka broker, with 1, 20 and 100 sources, against a plain producer.

Each run: a fresh `skewless gateway` process (no time sync: source clocks trusted), a load generator in this
process speaking the wire protocol with pre-encoded frames (so the generator costs little CPU), events in seq
order, a bounded window of unacknowledged events per source. Measured: events/s from first send to last ack,
gateway CPU per event (/proc), gateway memory per source (RSS growth), added latency (release - arrival, from
the records in Kafka) and ack latency seen by sources. In the same run, one plain confluent-kafka producer (the
gateway's producer settings: acks=all, idempotence, lz4, linger 2 ms) replays the 20-source run's records (same
keys and values) into the same broker, without and with the gateway's record headers and timestamps: the limit
of one Python writer here, and what headers cost it. Writes docs/gateway-benchmark.md and a PNG.

Run: .venv/bin/python benchmarks/gateway_throughput.py [--events 200000] [--py-spy docs/gateway-profile-e2e.txt]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import orjson
from confluent_kafka import KafkaError, Message

from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.launcher import KafkaBroker
from broker.reader import read_topic
from contract.records import CONTRACT_VERSION, EVENT
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import Ack, build_event, build_events, build_heartbeat, build_hello, parse_gateway_message
from gateway.launch import spawn_gateway

DOCS = Path(__file__).resolve().parents[1] / "docs"
BATCH = 500
WINDOW = 20_000
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class RunResult:
    sources: int
    events: int
    seconds: float
    cpu_s: float
    rss_growth_bytes: int
    added_p50_us: float
    added_p99_us: float
    ack_p50_ms: float
    ack_p99_ms: float
    records: list[tuple[bytes | None, bytes]] = field(default_factory=list, repr=False)
    late: int = 0
    label: str = ""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s * 1e6 / self.events


def proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def start_gateway(bootstrap: str, prefix: str, producer: dict[str, int] | None = None, tree: Path | None = None,
                  ) -> tuple[subprocess.Popen[bytes], int]:
    """``tree``: run the gateway of another checkout (its modules first on PYTHONPATH), e.g. the commit before."""
    args = ["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix]
    if producer:
        config = Path(tempfile.mkdtemp()) / "gateway.toml"
        config.write_text("[gateway.producer]\n" + "".join(f'"{k}" = {v}\n' for k, v in producer.items()))
        args += ["--config", str(config)]
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    process, addresses = spawn_gateway(args, env=env, cwd=tree)
    return process, addresses.port


def frames_for(source: int, events: int, base_us: int) -> list[tuple[int, bytes]]:
    """(last seq, frame) per batch; every source's event time advances 10 us per event."""
    out = []
    for start in range(0, events, BATCH):
        seqs = range(start, min(start + BATCH, events))
        batch = [build_event("bench", seq, base_us + seq * 10, {"v": seq & 255}) for seq in seqs]
        out.append((seqs[-1], encode_frame(build_events(batch))))
    return out


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder]


async def say_hello(port: int, source: int) -> Connection:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(encode_frame(build_hello(f"src-{source}", ["bench"])))
    decoder = FrameDecoder()
    while not decoder.feed(await reader.read(65536)):
        pass
    return reader, writer, decoder


async def run_source(connection: Connection, frames: list[tuple[int, bytes]], final_ts_us: int,
                     ack_latencies: list[float]) -> None:
    reader, writer, decoder = connection
    acked = -1
    sent_at: dict[int, float] = {}
    ack_event = asyncio.Event()

    async def read_acks() -> None:
        nonlocal acked
        while data := await reader.read(65536):
            for raw in decoder.feed(data):
                message = parse_gateway_message(raw)
                if isinstance(message, Ack):
                    now = time.perf_counter()
                    acked = message.seq
                    for last in [s for s in sent_at if s <= acked]:
                        ack_latencies.append((now - sent_at.pop(last)) * 1e3)
                    ack_event.set()

    reader_task = asyncio.create_task(read_acks())
    for last_seq, frame in frames:
        while last_seq - acked > WINDOW:
            ack_event.clear()
            await ack_event.wait()
        sent_at[last_seq] = time.perf_counter()
        writer.write(frame)
        await writer.drain()
    final_seq = frames[-1][0]
    # Heartbeat: this source is done, nothing older will come, so the merge need not wait for it.
    writer.write(encode_frame(build_heartbeat(final_ts_us, {"bench": final_seq + 1})))
    while acked < final_seq:
        ack_event.clear()
        await ack_event.wait()
    reader_task.cancel()
    writer.close()


async def load(port: int, sources: int, per_source: int) -> tuple[float, list[float]]:
    base_us = time.time_ns() // 1000
    all_frames = [frames_for(s, per_source, base_us) for s in range(sources)]
    latencies: list[float] = []
    final_ts = base_us + per_source * 10 + 1_000_000
    # Every source joins the merge before any sends (as after its time sync): the synthetic event times of all
    # sources start together, and a source that joined later would find them behind the watermark.
    connections = await asyncio.gather(*(say_hello(port, s) for s in range(sources)))
    started = time.perf_counter()
    await asyncio.gather(*(run_source(connections[s], all_frames[s], final_ts, latencies) for s in range(sources)))
    return time.perf_counter() - started, latencies


async def paced_source(connection: Connection, source: int, rate: float, seconds: float, frame_every_s: float,
                       ) -> int:
    """Real-time source: every frame_every_s, the events due since its start (rate x elapsed), stamped with the real
    clock. Frames follow a fixed schedule (start + k x interval), so the interval does not drift by the time each
    frame takes; sources start at spread-out phases, as independent devices do."""
    reader, writer, decoder = connection
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + frame_every_s * (source % 20) / 20
    await asyncio.sleep(max(0.0, start - loop.time()))
    frame = 0
    while loop.time() - start < seconds:
        due = int(rate * (loop.time() - start)) + 1
        if due > seq:
            now_us = time.time_ns() // 1000
            batch = [build_event("bench", q, now_us, {"v": q & 255}) for q in range(seq, due)]
            seq = due
            writer.write(encode_frame(build_events(batch)))
        frame += 1
        await asyncio.sleep(max(0.0, start + frame * frame_every_s - loop.time()))
    writer.write(encode_frame(build_heartbeat(time.time_ns() // 1000, {"bench": seq})))
    want = Ack("bench", seq - 1)
    async with asyncio.timeout(60):
        while want not in [parse_gateway_message(raw) for raw in decoder.feed(await reader.read(65536))]:
            pass
    writer.close()
    return seq


async def paced_load(port: int, sources: int, rate: float, seconds: float, frame_every_s: float) -> int:
    connections = await asyncio.gather(*(say_hello(port, s) for s in range(sources)))
    counts = await asyncio.gather(*(paced_source(connections[s], s, rate, seconds, frame_every_s)
                                    for s in range(sources)))
    return sum(counts)


def paced_run(bootstrap: str, sources: int, rate: float, seconds: float, frame_every_s: float) -> dict[str, float]:
    prefix = f"paced{sources}x{int(time.time())}"
    process, port = start_gateway(bootstrap, prefix)
    try:
        time.sleep(0.5)
        events = asyncio.run(paced_load(port, sources, rate, seconds, frame_every_s))
    finally:
        process.terminate()
        process.wait(timeout=30)
    added = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.events.bench", timeout_s=120)]
    events_only = [r for r in added if r.get("kind") == EVENT]
    delays = [r["release_ts_us"] - r["arrival_ts_us"] for r in events_only]
    assert len(delays) == events, (len(delays), events)
    gaps = frame_gaps_ms(events_only)
    return {"sources": sources, "events_per_s": events / seconds, "frame_ms": frame_every_s * 1e3,
            "p50_ms": percentile(delays, 0.5) / 1e3, "p99_ms": percentile(delays, 0.99) / 1e3,
            "max_ms": max(delays) / 1e3, "gap_p50_ms": percentile(gaps, 0.5), "gap_p99_ms": percentile(gaps, 0.99)}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one_run(bootstrap: str, sources: int, total_events: int, producer: dict[str, int] | None = None,
            py_spy: Path | None = None, tree: Path | None = None) -> RunResult:
    per_source = max(BATCH, total_events // sources)
    prefix = f"bench{sources}x{time.time_ns()}"
    process, port = start_gateway(bootstrap, prefix, producer, tree)
    spy: subprocess.Popen[bytes] | None = None
    try:
        time.sleep(0.5)
        if py_spy is not None:
            # Sampling from outside the process: the gateway runs unmodified (py-spy costs it nothing measurable).
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                    str(process.pid), "--format", "raw", "--rate", "100", "--nonblocking", "--output", str(py_spy)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        cpu0, rss0 = proc_cpu_s(process.pid), proc_rss(process.pid)
        seconds, ack_ms = asyncio.run(load(port, sources, per_source))
        cpu1, rss1 = proc_cpu_s(process.pid), proc_rss(process.pid)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
        process.terminate()
        process.wait(timeout=30)
    added = []
    records = []
    for key, value in read_topic(bootstrap, f"{prefix}.events.bench", timeout_s=120):
        record = orjson.loads(value)
        if record.get("kind") == EVENT:
            added.append(record["release_ts_us"] - record["arrival_ts_us"])
            records.append((key, value))
    events = per_source * sources
    # On a starved machine the merge may give up on a source that was not served for its whole wait: those events
    # are on the late topic (counted, never lost).
    late = len(read_topic(bootstrap, f"{prefix}.late.bench", timeout_s=30))
    assert len(added) + late == events, (len(added), late, events)
    return RunResult(sources, events, seconds, cpu1 - cpu0, rss1 - rss0, percentile(added, 0.5),
                     percentile(added, 0.99), percentile(ack_ms, 0.5), percentile(ack_ms, 0.99), records, late)


@dataclass
class PlainResult:
    headers: bool
    events: int
    seconds: float
    cpu_s: float

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    @property
    def cpu_us_per_event(self) -> float:
        return self.cpu_s * 1e6 / self.events


def plain_producer(bootstrap: str, records: list[tuple[bytes | None, bytes]], headers: bool) -> PlainResult:
    """One confluent-kafka producer with the gateway's settings (broker.client's defaults: acks=all, idempotence,
    lz4, linger 2 ms) replays the gateway's records, same keys and values, with a Python delivery callback per
    record as any exactly-once writer needs; throughput = records acknowledged / wall time to the last.
    ``headers``: each record also carries the gateway's headers (kind, source, contract version) and its
    reference time as the Kafka timestamp."""
    topic = f"plain{'h' if headers else ''}{time.time_ns()}"
    ensure_topics(bootstrap, [topic])
    producer = KafkaClientConfig(bootstrap).producer()
    delivered = [0]
    failures: list[KafkaError] = []
    version = str(CONTRACT_VERSION).encode()

    def on_delivery(error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)
        else:
            delivered[0] += 1

    prepared: list[tuple[bytes | None, bytes, int, list[tuple[str, str | bytes | None]] | None]] = []
    for key, value in records:
        if headers:
            record = orjson.loads(value)
            prepared.append((key, value, record["ref_ts_us"] // 1000,
                             [("kind", b"event"), ("source", key), ("v", version)]))
        else:
            prepared.append((key, value, 0, None))
    producer.produce(topic, prepared[0][1], prepared[0][0], partition=0)  # warm the connection and the leader up
    producer.flush(30)
    cpu0 = time.process_time()
    started = time.perf_counter()
    for i, (key, value, timestamp_ms, record_headers) in enumerate(prepared):
        while True:
            try:
                producer.produce(topic, value, key, partition=0, on_delivery=on_delivery,
                                 timestamp=timestamp_ms, headers=record_headers)
                break
            except BufferError:
                producer.poll(0.001)
        if i % 1000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    assert remaining == 0 and not failures and delivered[0] == len(records), (remaining, failures[:3])
    return PlainResult(headers, len(records), seconds, time.process_time() - cpu0)


def frame_gaps_ms(records: list[dict[str, object]]) -> list[float]:
    """Per source, the gaps between the arrivals of its consecutive frames (events of one frame share one arrival)."""
    arrivals: dict[object, set[int]] = {}
    for record in records:
        arrivals.setdefault(record["source_id"], set()).add(int(str(record["arrival_ts_us"])))
    gaps = []
    for times in arrivals.values():
        ordered = sorted(times)
        gaps += [(b - a) / 1e3 for a, b in itertools.pairwise(ordered)]
    return gaps


# What the run shows against issue 14, written after reading the run's tables (kept with the code that makes them).
ANALYSIS = """## Against the targets, and the next levers

See the closing section of docs/gateway-hotpath.md for the profile.
"""


def write_report(results: list[RunResult], plain: list[PlainResult], paced: list[dict[str, float]],
                 linger: list[tuple[int, RunResult]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    DOCS.mkdir(exist_ok=True)
    limit = next(r for r in plain if not r.headers)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = [f"{r.label}\n{r.sources} src" for r in results] + [
        f"plain producer\n{'headers' if r.headers else 'no headers'}" for r in plain]
    rates = [r.events_per_s / 1000 for r in results] + [r.events_per_s / 1000 for r in plain]
    ax1.bar(labels, rates, color=["tab:blue"] * len(results) + ["tab:gray"] * len(plain))
    ax1.axhline(limit.events_per_s / 2000, color="red", linestyle="--", label="target: 0.5x plain producer")
    ax1.set_ylabel("throughput (k events/s, acked by Kafka)")
    ax1.tick_params(axis="x", labelsize=8)
    ax1.legend(fontsize=8)
    if paced:
        ax2.bar([f"{p['sources']:.0f} src" for p in paced], [p["p99_ms"] for p in paced],
                label="p99 added latency (release - arrival)")
        ax2.axhline(paced[0]["frame_ms"] + 1, color="red", linestyle="--", label="target: frame interval + 1 ms")
        ax2.set_ylabel("added latency (ms)")
        ax2.set_xlabel(f"sources at a steady rate, one frame every {paced[0]['frame_ms']:.0f} ms")
        ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(DOCS / "gateway-throughput.png", dpi=150)
    rows = "\n".join(
        f"| {r.label} | {r.sources} | {r.events} | {r.events_per_s:,.0f} | {r.events_per_s / limit.events_per_s:.3f}x | "
        f"{r.cpu_us_per_event:.1f} | {r.rss_growth_bytes / r.sources / 1024:,.1f} | {r.added_p50_us / 1000:.2f} | "
        f"{r.added_p99_us / 1000:.2f} | {r.ack_p50_ms:.1f} | {r.ack_p99_ms:.1f} | {r.late} |" for r in results)
    plain_rows = "\n".join(
        f"| {'yes' if r.headers else 'no'} | {r.events} | {r.events_per_s:,.0f} | {r.cpu_us_per_event:.2f} |"
        for r in plain)
    paced_rows = "\n".join(
        f"| {p['sources']:.0f} | {p['events_per_s']:,.0f} | {p['frame_ms']:.0f} | {p['gap_p50_ms']:.2f} | "
        f"{p['gap_p99_ms']:.2f} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['max_ms']:.2f} | "
        f"{p['p99_ms'] / (p['frame_ms'] + 1):.2f} |" for p in paced)
    linger_rows = "\n".join(
        f"| {ms} | {r.events_per_s:,.0f} | {r.cpu_us_per_event:.1f} | {r.ack_p50_ms:.1f} | {r.ack_p99_ms:.1f} |"
        for ms, r in linger)
    linger_section = "" if not linger else f"""
## Producer batching, side by side (20 sources, same run)

| linger.ms | events/s | gateway CPU us/event | ack p50 (ms) | ack p99 (ms) |
|---|---|---|---|---|
{linger_rows}
"""
    (DOCS / "gateway-benchmark.md").write_text(f"""# Gateway throughput (benchmarks/gateway_throughput.py)

Measured on this project's 2-core machine, gateway, broker and load generator sharing both cores (and other work
running on them); one run, so read the ratios more than the absolute numbers. In-order events, batches of {BATCH},
at most {WINDOW} unacked events per source, time sync off. Throughput counts events acknowledged by the gateway,
i.e. committed to Kafka (acks=all, idempotent transactional producer, lz4, linger 2 ms).

| gateway | sources | events | events/s | of plain producer | gateway CPU us/event | RSS growth per source (KiB) | added p50 (ms) | added p99 (ms) | ack p50 (ms) | ack p99 (ms) | late |
|---|---|---|---|---|---|---|---|---|---|---|---|
{rows}

"of plain producer": events/s over the plain producer's (no headers) of the same run, below.
"added" = `release_ts_us - arrival_ts_us` of each record (time spent in reorderer + merger); "ack" = batch sent
-> cumulative ack received by the source (Kafka's round trip, the transaction's commit interval and the in-flight
window's queueing). At saturation every source pushes as fast as its connection is served, so sources drift apart
in event time and the merge holds the leaders' events until the laggards catch up: "added" there measures that
drift, not the gateway's cost (the paced table below does). RSS growth per source: the gateway's resident memory
after the run less before, over the sources; with 1 source it is librdkafka's buffers and Python's allocator
warming up, the 100-source row is the better per-source figure (the bound is the configured
`max_buffered_events`, rule 4 of gateway/ingest.py, not the source count).

## The limit: one plain producer, same broker, same run

The 20-source run's records (same keys and values, ~250 B JSON) replayed by one confluent-kafka producer with
the gateway's settings and a Python delivery callback per record; "headers" adds the gateway's record headers
(kind, source, contract version) and the reference time as the Kafka timestamp.

| headers | records | events/s | producer CPU us/record |
|---|---|---|---|
{plain_rows}

![throughput](gateway-throughput.png)

## Added latency at a steady rate (below saturation)

Sources stamp events with the real clock and send a frame on a fixed schedule every `frame` ms, at spread-out
phases (all sources said hello first). "frame gap" is the gap between the gateway's arrival stamps of a
source's consecutive frames: the interval the gateway actually saw. The merge must wait until every live source
has moved past an event's reference time, so the others' next frames bound an event's added latency.

| sources | events/s | frame (ms) | frame gap p50 (ms) | frame gap p99 (ms) | added p50 (ms) | added p99 (ms) | max (ms) | p99 / (frame + 1 ms) |
|---|---|---|---|---|---|---|---|---|
{paced_rows}
{linger_section}
{ANALYSIS}""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sources", type=int, nargs="*", default=[1, 20, 100])
    parser.add_argument("--linger", action="store_true", help="also compare linger.ms 0, 2 and 20")
    parser.add_argument("--py-spy", type=Path, help="sample the 20-source gateway with py-spy into this file")
    parser.add_argument("--no-report", action="store_true", help="print, do not write docs/")
    parser.add_argument("--before", type=Path, help="also run the gateway of this checkout (the commit before), "
                        "same sources, same broker, same run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            results = []
            trees: list[Path | None] = [None] if args.before is None else [args.before, None]
            for sources, tree in ((n, t) for n in args.sources for t in trees):
                result = one_run(state.bootstrap_servers, sources, args.events,
                                 py_spy=args.py_spy if sources == 20 and tree is None else None, tree=tree)
                result.label = "before" if tree is not None else "this tree"
                print(f"{result.label:>9} {sources:>4} sources: {result.events_per_s:>10,.0f} events/s  "
                      f"cpu {result.cpu_us_per_event:.1f} us/event  "
                      f"added p50/p99 {result.added_p50_us / 1000:.2f}/{result.added_p99_us / 1000:.2f} ms  "
                      f"ack p50/p99 {result.ack_p50_ms:.1f}/{result.ack_p99_ms:.1f} ms  "
                      f"rss/source {result.rss_growth_bytes / sources / 1024:.1f} KiB  late {result.late}", flush=True)
                results.append(result)
            replay = next((r for r in results if r.sources == 20 and r.label == "this tree"), results[-1]).records
            plain = []
            for headers in (False, True):
                row = plain_producer(state.bootstrap_servers, replay, headers)
                print(f"plain producer, headers {headers}: {row.events_per_s:>10,.0f} events/s  "
                      f"cpu {row.cpu_us_per_event:.2f} us/record", flush=True)
                plain.append(row)
            for result in results:
                print(f"{result.label:>9} {result.sources:>4} sources: "
                      f"{result.events_per_s / plain[0].events_per_s:.3f}x the plain producer", flush=True)
            paced = []
            for sources, rate in ((1, 5000.0), (20, 500.0)):
                paced_row = paced_run(state.bootstrap_servers, sources, rate, 5.0, 0.005)
                print(f"paced {sources:>3} sources x {rate:,.0f}/s: added p50/p99/max "
                      f"{paced_row['p50_ms']:.2f}/{paced_row['p99_ms']:.2f}/{paced_row['max_ms']:.2f} ms, frame gap p50/p99 "
                      f"{paced_row['gap_p50_ms']:.2f}/{paced_row['gap_p99_ms']:.2f} ms", flush=True)
                paced.append(paced_row)
            linger = []
            if args.linger:
                for ms in (0, 2, 20):
                    result = one_run(state.bootstrap_servers, 20, args.events // 2, {"linger.ms": ms})
                    print(f"linger.ms={ms:>3}: {result.events_per_s:>10,.0f} events/s  "
                          f"cpu {result.cpu_us_per_event:.1f} us/event", flush=True)
                    linger.append((ms, result))
            if not args.no_report:
                write_report(results, plain, paced, linger)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
