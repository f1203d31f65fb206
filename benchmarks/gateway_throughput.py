"""End-to-end gateway throughput into a real Kafka broker, with 1, 20 and 100 sources.

Each run: a fresh `skewless gateway` process (no time sync: source clocks trusted), a load generator in this
process speaking the wire protocol with pre-encoded frames (so the generator costs little CPU), events in seq
order, a bounded window of unacknowledged events per source. Measured: events/s from first send to last ack,
gateway CPU per event (/proc), gateway memory per source (RSS growth), added latency (release - arrival, from
the records in Kafka) and ack latency seen by sources. Writes docs/gateway-benchmark.md and a PNG.

Run: .venv/bin/python benchmarks/gateway_throughput.py [--events 200000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from broker.launcher import KafkaBroker
from broker.reader import read_topic
from contract.records import EVENT
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


def start_gateway(bootstrap: str, prefix: str, producer: dict[str, int] | None = None,
                  ) -> tuple[subprocess.Popen[bytes], int]:
    args = ["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix]
    if producer:
        config = Path(tempfile.mkdtemp()) / "gateway.toml"
        config.write_text("[gateway.producer]\n" + "".join(f'"{k}" = {v}\n' for k, v in producer.items()))
        args += ["--config", str(config)]
    process, addresses = spawn_gateway(args)
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
    """Real-time source: every frame_every_s, the events due since the last frame, stamped with the real clock."""
    reader, writer, decoder = connection
    per_frame = max(1, round(rate * frame_every_s))
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    while loop.time() - start < seconds:
        now_us = time.time_ns() // 1000
        batch = [build_event("bench", seq + i, now_us, {"v": i}) for i in range(per_frame)]
        seq += per_frame
        writer.write(encode_frame(build_events(batch)))
        await asyncio.sleep(frame_every_s)
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
    delays = [r["release_ts_us"] - r["arrival_ts_us"] for r in added if r.get("kind") == EVENT]
    assert len(delays) == events, (len(delays), events)
    return {"sources": sources, "events_per_s": sources * rate, "frame_ms": frame_every_s * 1e3,
            "p50_ms": percentile(delays, 0.5) / 1e3, "p99_ms": percentile(delays, 0.99) / 1e3,
            "max_ms": max(delays) / 1e3}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def one_run(bootstrap: str, sources: int, total_events: int, producer: dict[str, int] | None = None) -> RunResult:
    per_source = max(BATCH, total_events // sources)
    prefix = f"bench{sources}x{time.time_ns()}"
    process, port = start_gateway(bootstrap, prefix, producer)
    try:
        time.sleep(0.5)
        cpu0, rss0 = proc_cpu_s(process.pid), proc_rss(process.pid)
        seconds, ack_ms = asyncio.run(load(port, sources, per_source))
        cpu1, rss1 = proc_cpu_s(process.pid), proc_rss(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=30)
    added = []
    for _key, value in read_topic(bootstrap, f"{prefix}.events.bench", timeout_s=120):
        record = orjson.loads(value)
        if record.get("kind") == EVENT:
            added.append(record["release_ts_us"] - record["arrival_ts_us"])
    events = per_source * sources
    assert len(added) == events, (len(added), events)
    return RunResult(sources, events, seconds, cpu1 - cpu0, rss1 - rss0, percentile(added, 0.5),
                     percentile(added, 0.99), percentile(ack_ms, 0.5), percentile(ack_ms, 0.99))


def write_report(results: list[RunResult], paced: list[dict[str, float]],
                 linger: list[tuple[int, RunResult]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    DOCS.mkdir(exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    labels = [str(r.sources) for r in results]
    ax1.bar(labels, [r.events_per_s / 1000 for r in results])
    ax1.axhline(250, color="red", linestyle="--", label="target 250k/s")
    ax1.set_xlabel("sources")
    ax1.set_ylabel("k events/s into Kafka (acked)")
    ax1.legend()
    ax2.bar(labels, [r.added_p99_us / 1000 for r in results], label="p99 added (release - arrival)")
    ax2.axhline(5, color="red", linestyle="--", label="target 5 ms")
    ax2.set_xlabel("sources")
    ax2.set_ylabel("ms")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(DOCS / "gateway-throughput.png", dpi=100)
    paced_rows = "\n".join(
        f"| {p['sources']:.0f} | {p['events_per_s']:,.0f} | {p['frame_ms']:.0f} | {p['p50_ms']:.2f} | "
        f"{p['p99_ms']:.2f} | {p['max_ms']:.2f} |" for p in paced)
    linger_rows = "\n".join(
        f"| {ms} | {r.events_per_s:,.0f} | {r.cpu_us_per_event:.1f} | {r.ack_p50_ms:.1f} | {r.ack_p99_ms:.1f} |"
        for ms, r in linger)
    rows = "\n".join(
        f"| {r.sources} | {r.events} | {r.events_per_s:,.0f} | {r.cpu_us_per_event:.1f} | "
        f"{r.rss_growth_bytes / r.sources / 1024:,.1f} | {r.added_p50_us / 1000:.2f} | {r.added_p99_us / 1000:.2f} | "
        f"{r.ack_p50_ms:.1f} | {r.ack_p99_ms:.1f} |" for r in results)
    (DOCS / "gateway-benchmark.md").write_text(f"""# Gateway throughput (benchmarks/gateway_throughput.py)

Measured on this project's 2-core machine, gateway, broker and load generator sharing both cores; one run, so
read the ratios more than the absolute numbers. In-order events, batches of {BATCH}, at most {WINDOW} unacked
events per source, time sync off. Throughput counts events acknowledged by the gateway, i.e. confirmed by Kafka
(acks=all, idempotent producer).

| sources | events | events/s | gateway CPU us/event | RSS growth per source (KiB) | added p50 (ms) | added p99 (ms) | ack p50 (ms) | ack p99 (ms) |
|---|---|---|---|---|---|---|---|---|
{rows}

"added" = `release_ts_us - arrival_ts_us` of each record (time spent in reorderer + merger); "ack" = batch sent
-> cumulative ack received by the source (includes Kafka's round trip and the in-flight window's queueing).
At saturation every source pushes as fast as its connection is served, so sources drift apart in event time and
the merge holds the leaders' events until the laggards catch up: "added" there measures that drift, not the
gateway's cost (the paced table below does). RSS growth divided by sources is dominated by librdkafka's buffers
and Python's allocator with 1 source; the 100-source row (~1.8 MiB per source at 2k events each) is the better
per-source figure.

![throughput](gateway-throughput.png)

## Added latency at a steady rate (below saturation)

Sources stamp events with the real clock and send a frame every `frame` ms (all sources said hello first).
The merge must wait until every live source has moved past an event's reference time, so a source's frame
interval bounds the added latency of the others; saturation runs above measure queueing instead.

| sources | events/s | frame (ms) | added p50 (ms) | added p99 (ms) | max (ms) |
|---|---|---|---|---|---|
{paced_rows}

## Producer batching, side by side (20 sources, same run)

| linger.ms | events/s | gateway CPU us/event | ack p50 (ms) | ack p99 (ms) |
|---|---|---|---|---|
{linger_rows}

The gateway's default is linger.ms = 2 with lz4 compression, acks=all and idempotence.

## Against the target, and the next levers

Target: >= 250k events/s with 20 sources and p99 in-order added latency <= 5 ms. **Missed**: 20 sources reach
about 27-30k events/s end to end here (1 source: ~45k), 8-9x short; p99 added latency at a steady 10k events/s
from 20 sources is 7-11 ms across runs with 5 ms frames, 1.5-2.3x over (an event can only leave the merge once
every other live source has sent something newer, so the sources' frame interval, not CPU, sets this floor;
1 ms frames or heartbeats would bring it down).

Where the time goes (docs/gateway-hotpath.md and the pyinstrument tree in docs/gateway-profile.txt; no sockets or
broker): ~11 us of Python per event, about 59 % in the ordering pipeline (reorderer + reference clock + merger heap
+ record building), ~16 % decoding and validating msgpack, ~15 % JSON encoding, ~9 % librdkafka's produce call; end to end the gateway process also pays the
delivery callbacks and acks (~30-45 us/event in total, measured from /proc above), while the broker and the load
generator share the same two cores. Next levers, by expected gain:

1. A second process per core: shard streams (or sources of a stream with a second merge stage) across gateway
   worker processes (SO_REUSEPORT); ~2x on this machine, more on bigger ones.
2. Batch-level fast path: when a batch is in seq order and the merge has a single live source or all sources are
   ahead, skip per-event reorderer/merger objects and publish the batch (most traffic is in order).
3. Compiled codec for the frame decode + record encode (msgspec structs or a small Rust/Cython extension): the
   decode/encode stages are a third of the CPU.
4. Fewer delivery callbacks: track Kafka progress per partition offset instead of a Python callback per event.
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sources", type=int, nargs="*", default=[1, 20, 100])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            results = []
            for sources in args.sources:
                result = one_run(state.bootstrap_servers, sources, args.events)
                print(f"{sources:>4} sources: {result.events_per_s:>10,.0f} events/s  "
                      f"cpu {result.cpu_us_per_event:.1f} us/event  "
                      f"added p50/p99 {result.added_p50_us / 1000:.2f}/{result.added_p99_us / 1000:.2f} ms  "
                      f"ack p50/p99 {result.ack_p50_ms:.1f}/{result.ack_p99_ms:.1f} ms  "
                      f"rss/source {result.rss_growth_bytes / sources / 1024:.1f} KiB", flush=True)
                results.append(result)
            paced = []
            for sources, rate in ((1, 5000.0), (20, 500.0)):
                row = paced_run(state.bootstrap_servers, sources, rate, 5.0, 0.005)
                print(f"paced {sources:>3} sources x {rate:,.0f}/s: added p50/p99/max "
                      f"{row['p50_ms']:.2f}/{row['p99_ms']:.2f}/{row['max_ms']:.2f} ms", flush=True)
                paced.append(row)
            linger = []
            for ms in (0, 2, 20):
                result = one_run(state.bootstrap_servers, 20, args.events // 2, {"linger.ms": ms})
                print(f"linger.ms={ms:>3}: {result.events_per_s:>10,.0f} events/s  cpu {result.cpu_us_per_event:.1f} "
                      f"us/event", flush=True)
                linger.append((ms, result))
            write_report(results, paced, linger)
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
