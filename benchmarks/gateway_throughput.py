"""End-to-end gateway throughput into a real Kafka broker, with 1, 20 and 100 sources, per core (python, native),
against a plain producer.

Each run: a fresh `skewless gateway --core X` process (no time sync: source clocks trusted), a load generator in this
process speaking the wire protocol with pre-encoded frames (so the generator costs little CPU), events in seq
order, a bounded window of unacknowledged events per source. Measured: events/s from first send to last ack,
gateway CPU per event (/proc), gateway memory per source (RSS growth), added latency (release - arrival, from
the records in Kafka) and ack latency seen by sources. In the same run, one plain confluent-kafka producer (the
gateway's producer settings: acks=all, idempotence, lz4, linger 100 ms) replays the 20-source run's records (same
keys and values) into the same broker, without and with the gateway's record headers and timestamps: the limit
of one Python writer here, and what headers cost it. Every source count runs the gateway once per core of
--cores (and once for the --before tree), in alternating order from one source count to the next, so that neither
core always runs first on a warming or cooling machine. Writes docs/gateway-benchmark.md, its JSON and a PNG.

Run: .venv/bin/python -m benchmarks.gateway_throughput [--events 200000] [--cores python native]
     [--py-spy docs/gateway-profile-e2e.txt]
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
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson
from confluent_kafka import KafkaError, Message

from benchmarks.harness.processes import cpu_s
from benchmarks.harness.producing import RunRates, produce_waiting
from benchmarks.harness.resending_source import ResendingSource
from benchmarks.harness.stats import percentile
from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.launcher import BrokerState, KafkaBroker
from broker.reader import read_topic
from broker.transactions import TRANSACTION_DEFAULTS
from contract.records import CONTRACT_VERSION, EVENT
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    Ack,
    build_bye,
    build_event,
    build_events,
    build_heartbeat,
    build_hello,
    parse_gateway_message,
)
from gateway.launch import spawn_gateway
from reorder.eval.progress import progress_bar, progress_enabled

DOCS = Path(__file__).resolve().parents[1] / "docs"
BATCH = 500
WINDOW = 20_000
WARM_UP_SOURCE = 999  # one_run's warm-up source, not counted
WARM_UP_SOURCE_ID = f"src-{WARM_UP_SOURCE}"
LINGER_COMPARED_MS = (2, 20, 100)  # --linger: broker.client's default, a middle, the transactional producer's
PAGE = os.sysconf("SC_PAGE_SIZE")
CORE_LABELS = {"python": "python core", "native": "native core", "auto": "auto core"}
Variant = tuple[str, Path | None, str | None]  # (label, tree, core): one gateway configuration of the run
Paced = tuple[str, dict[str, float]]  # (label of the gateway's configuration, figures)
LoadAverages = dict[str, list[float]]  # "start"/"end": the 1-, 5- and 15-minute load averages


@dataclass
class RunResult(RunRates):
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
    core: str = ""  # the --core the gateway was spawned with; "" for its default (auto) or a --before tree


def proc_rss(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def start_gateway(bootstrap: str, prefix: str, producer: dict[str, int] | None = None, tree: Path | None = None,
                  transactions: bool = True, core: str | None = None, stderr: IO[bytes] | None = None,
                  path_first: Path | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[subprocess.Popen[bytes], int]:
    """``tree``: run the gateway of another checkout (its modules first on PYTHONPATH), e.g. the commit before.
    ``transactions`` False: the gateway's idempotent producer alone, acks at delivery (``transactions = false``).
    ``core``: the gateway's per-event cores (``--core``: native, python or auto); None leaves its default.
    ``stderr``: where its log goes (None: nowhere). ``path_first``: a folder put before everything on its
    PYTHONPATH (a benchmark's own ``sitecustomize``); ``env``: variables added to its environment."""
    args = ["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix]
    if core is not None:
        args += ["--core", core]
    if producer or not transactions:
        config = Path(tempfile.mkdtemp()) / "gateway.toml"
        text = "" if transactions else "[gateway]\ntransactions = false\n\n"
        if producer:
            text += "[gateway.producer]\n" + "".join(f'"{k}" = {v}\n' for k, v in producer.items())
        config.write_text(text)
        args += ["--config", str(config)]
    process_env = None
    if tree is not None or path_first is not None or env:
        code = str(tree) if tree is not None else os.environ.get("PYTHONPATH", "")
        path = os.pathsep.join(p for p in (str(path_first) if path_first is not None else "", code) if p)
        process_env = {**os.environ, **(env or {}), "PYTHONPATH": path}
    process, addresses = spawn_gateway(args, env=process_env, cwd=tree,
                                       stderr=subprocess.DEVNULL if stderr is None else stderr)
    return process, addresses.port


@contextmanager
def paced_gateway(bootstrap: str, prefix: str, core: str, loop_rt_priority: int | None, tree: Path | None = None,
                  stderr: IO[bytes] | None = None, path_first: Path | None = None,
                  env: Mapping[str, str] | None = None) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A gateway (`start_gateway`'s arguments) for a paced load: its main thread, whose event loop reads the
    sockets (its tid is the pid), at SCHED_FIFO ``loop_rt_priority`` when given (librdkafka's threads and the
    executor stay at normal priority), then half a second to settle; (process, port) inside, stopped after."""
    process, port = start_gateway(bootstrap, prefix, tree=tree, core=core, stderr=stderr, path_first=path_first,
                                  env=env)
    try:
        if loop_rt_priority is not None:
            os.sched_setscheduler(process.pid, os.SCHED_FIFO, os.sched_param(loop_rt_priority))
        time.sleep(0.5)
        yield process, port
    finally:
        process.terminate()
        process.communicate(timeout=30)


@contextmanager
def scratch_broker_state() -> Iterator[BrokerState]:
    """A broker on fresh storage for one benchmark run: its state (servers, pid) inside, stopped after."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        try:
            yield broker.start()
        finally:
            broker.stop()


@contextmanager
def scratch_broker() -> Iterator[str]:
    """``scratch_broker_state``'s bootstrap servers."""
    with scratch_broker_state() as state:
        yield state.bootstrap_servers


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
    writer.write(encode_frame(build_bye()))  # as the SDK's close: the merge stops waiting for this source at once
    await writer.drain()
    writer.close()


async def load(port: int, sources: int, per_source: int, first_source: int = 0,
               heartbeat_ahead_us: int = 1_000_000) -> tuple[float, list[float]]:
    """``first_source``: the sources are src-<first_source> on (a warm-up load names others).
    ``heartbeat_ahead_us``: how far past its last event each source's final heartbeat goes (a warm-up's must not
    reach the next load's event times: they would be late)."""
    base_us = time.time_ns() // 1000
    all_frames = [frames_for(s, per_source, base_us) for s in range(sources)]
    latencies: list[float] = []
    final_ts = base_us + per_source * 10 + heartbeat_ahead_us
    # Every source joins the merge before any sends (as after its time sync): the synthetic event times of all
    # sources start together, and a source that joined later would find them behind the watermark.
    connections = await asyncio.gather(*(say_hello(port, first_source + s) for s in range(sources)))
    started = time.perf_counter()
    await asyncio.gather(*(run_source(connections[s], all_frames[s], final_ts, latencies) for s in range(sources)))
    return time.perf_counter() - started, latencies


async def paced_source(link: ResendingSource, source: int, rate: float, seconds: float, frame_every_s: float,
                       slips_ms: list[float] | None = None, lead_s: float = 0.0) -> tuple[int, int]:
    """Real-time source: every frame_every_s, the events due since its start (rate x elapsed), stamped with the real
    clock. Frames follow a fixed schedule (start + k x interval), so the interval does not drift by the time each
    frame takes; sources start at spread-out phases, as independent devices do. A lost connection (the gateway gave
    the shard up and restarts it) is reopened and the unacked events written again, as the SDK does. Returns how
    many events it sent (seqs 0 to that less one), once the gateway acked the last, and how often it reconnected;
    ``slips_ms``, when given, gets how late each frame left against its schedule (ms). ``lead_s``: the loop's timer
    wakes the source that long before a frame is due and a blocking sleep (clock_nanosleep) waits out the rest: the
    event loop's timers wake up to a millisecond late (epoll's timeout is in whole milliseconds, rounded up), which a
    latency measurement would count as the sources' slip; the loop, blocked meanwhile, reads acks between frames."""
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time() + frame_every_s * (source % 20) / 20
    await _sleep_until(loop, start, lead_s)
    frame = 0
    while loop.time() - start < seconds:
        await link.recover()
        if slips_ms is not None:
            slips_ms.append((loop.time() - (start + frame * frame_every_s)) * 1e3)
        due = int(rate * (loop.time() - start)) + 1
        if due > seq:
            now_us = time.time_ns() // 1000
            link.send([build_event("bench", q, now_us, {"v": q & 255}) for q in range(seq, due)])
            seq = due
        frame += 1
        await _sleep_until(loop, start + frame * frame_every_s, lead_s)
    await link.finish(time.time_ns() // 1000)
    return seq, link.reconnects


async def _sleep_until(loop: asyncio.AbstractEventLoop, when: float, lead_s: float) -> None:
    """Until ``loop.time()`` reaches ``when``: the loop's timer, then (``lead_s`` > 0) a blocking sleep for the rest."""
    await asyncio.sleep(max(0.0, when - loop.time() - lead_s))
    if lead_s > 0:
        time.sleep(max(0.0, when - loop.time()))  # noqa: ASYNC251 (blocking on purpose: see paced_source)


async def read_some(reader: asyncio.StreamReader, source: int) -> bytes:
    # At the end of the stream read() returns at once, again and again: the wait for the ack would spin forever.
    data = await reader.read(65536)
    if not data:
        raise ConnectionError(f"src-{source}: the gateway closed the connection before the last ack")
    return data


async def paced_load(port: int, sources: int, rate: float, seconds: float, frame_every_s: float,
                     ) -> tuple[list[int], int]:
    """Per source, how many events it sent; and how often the sources reconnected, together. Every source says
    hello before any sends (a source joining later would hold the merge for its join grace)."""
    links = [ResendingSource("127.0.0.1", port, f"src-{s}", "bench") for s in range(sources)]
    await asyncio.gather(*(link.connect() for link in links))
    done = await asyncio.gather(*(paced_source(links[s], s, rate, seconds, frame_every_s) for s in range(sources)))
    return [sent for sent, _ in done], sum(reconnects for _, reconnects in done)


def paced_run(bootstrap: str, sources: int, rate: float, seconds: float, frame_every_s: float,
              core: str | None = None) -> dict[str, float]:
    prefix = f"paced{sources}x{time.time_ns()}"
    with tempfile.TemporaryFile() as log:
        process, port = start_gateway(bootstrap, prefix, core=core, stderr=log)
        try:
            time.sleep(0.5)
            counts, reconnects = asyncio.run(paced_load(port, sources, rate, seconds, frame_every_s))
        finally:
            process.terminate()
            stopped = process.communicate(timeout=30)[0].decode(errors="replace").strip().splitlines()[-1:]
        log.seek(0)
        gateway_log = log.read().decode(errors="replace")
    # Settled reads: the gateway stopped, and its last commit's markers may still be on their way (a commit returns
    # before they land, and a read_committed read ends before a transaction whose markers did not).
    added = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.events.bench", 120, settled=True)]
    events_only = [r for r in added if r.get("kind") == EVENT]
    # A source the merge gave up has its later events on the late topic: counted, never lost.
    late = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.late.bench", 30, settled=True)]
    missing, repeated = unaccounted(counts, [*events_only, *late])
    assert not missing and not repeated, (f"paced {sources} x {rate:,.0f}/s ({core}): {sum(counts)} events acked, "
                                          f"missing (source, seq) {missing[:10]}, more than once {repeated[:10]}; "
                                          f"gateway {prefix}: {stopped}; its log:\n{gateway_log[-20_000:]}")
    if reconnects:  # a recovery inside the measurement: say why, from the gateway's own words
        said = [line for line in gateway_log.splitlines() if " ERROR " in line or " WARNING " in line]
        print(f"paced {sources} x {rate:,.0f}/s ({core}): the sources reconnected {reconnects} times; the gateway "
              "logged:\n  " + "\n  ".join(said[:20]), file=sys.stderr, flush=True)
    delays = [r["release_ts_us"] - r["arrival_ts_us"] for r in events_only]
    gaps = frame_gaps_ms(events_only)
    return {"sources": sources, "events_per_s": sum(counts) / seconds, "frame_ms": frame_every_s * 1e3,
            "p50_ms": percentile(delays, 0.5) / 1e3, "p99_ms": percentile(delays, 0.99) / 1e3,
            "max_ms": max(delays) / 1e3, "gap_p50_ms": percentile(gaps, 0.5), "gap_p99_ms": percentile(gaps, 0.99),
            "late": len(late), "reconnects": reconnects}


def unaccounted(counts: list[int], records: list[dict[str, Any]]) -> tuple[list[tuple[str, int]],
                                                                            list[tuple[str, int]]]:
    """The (source, seq) pairs sent (``counts[k]`` events by src-k, seqs from 0) that no record carries, and those
    that more than one record carries, each sorted."""
    seen = Counter((str(r["source_id"]), int(r["seq"])) for r in records)
    sent = [(f"src-{source}", seq) for source, count in enumerate(counts) for seq in range(count)]
    return sorted(key for key in sent if key not in seen), sorted(key for key, n in seen.items() if n > 1)


def one_run(bootstrap: str, sources: int, total_events: int, producer: dict[str, int] | None = None,
            py_spy: Path | None = None, tree: Path | None = None, transactions: bool = True,
            core: str | None = None) -> RunResult:
    per_source = max(BATCH, total_events // sources)
    prefix = f"bench{sources}x{time.time_ns()}"
    process, port = start_gateway(bootstrap, prefix, producer, tree, transactions, core)
    spy: subprocess.Popen[bytes] | None = None
    try:
        time.sleep(0.5)
        if py_spy is not None:
            # Sampling from outside the process: the gateway runs unmodified (py-spy costs it nothing measurable).
            spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                    str(process.pid), "--format", "raw", "--rate", "100", "--nonblocking", "--output", str(py_spy)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(1.0)
        # As the plain producer's warm-up record before its clock starts: the stream's topics created and the
        # shard's first record on them settled (one round trip to a partition just created, ~270 ms here, paid once
        # per topic and gateway), by a source of its own that then says bye; its events are not counted below.
        asyncio.run(load(port, 1, BATCH, first_source=WARM_UP_SOURCE, heartbeat_ahead_us=0))
        cpu0, rss0 = cpu_s(process.pid), proc_rss(process.pid)
        seconds, ack_ms = asyncio.run(load(port, sources, per_source))
        cpu1, rss1 = cpu_s(process.pid), proc_rss(process.pid)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
        process.terminate()
        process.wait(timeout=30)
    added = []
    records = []
    for key, value in read_topic(bootstrap, f"{prefix}.events.bench", timeout_s=120, settled=True):
        record = orjson.loads(value)
        if record.get("kind") == EVENT and record.get("source_id") != WARM_UP_SOURCE_ID:
            added.append(record["release_ts_us"] - record["arrival_ts_us"])
            records.append((key, value))
    events = per_source * sources
    # On a starved machine the merge may give up on a source that was not served for its whole wait: those events
    # are on the late topic (counted, never lost).
    late = sum(orjson.loads(value).get("source_id") != WARM_UP_SOURCE_ID
               for _key, value in read_topic(bootstrap, f"{prefix}.late.bench", timeout_s=30, settled=True))
    assert len(added) + late == events, (len(added), late, events)
    return RunResult(sources, events, seconds, cpu1 - cpu0, rss1 - rss0, percentile(added, 0.5),
                     percentile(added, 0.99), percentile(ack_ms, 0.5), percentile(ack_ms, 0.99), records, late,
                     core=core or "")


@dataclass
class PlainResult(RunRates):
    headers: bool
    events: int
    seconds: float
    cpu_s: float


def plain_producer(bootstrap: str, records: list[tuple[bytes | None, bytes]], headers: bool) -> PlainResult:
    """One confluent-kafka producer with the gateway's settings (broker.client's defaults: acks=all, idempotence,
    lz4; the transactional producer's linger, 100 ms: at this rate its batches fill first) replays the gateway's records, same keys and values, with a Python delivery callback per
    record as any exactly-once writer needs; throughput = records acknowledged / wall time to the last.
    ``headers``: each record also carries the gateway's headers (kind, source, contract version) and its
    reference time as the Kafka timestamp."""
    topic = f"plain{'h' if headers else ''}{time.time_ns()}"
    ensure_topics(bootstrap, [topic])
    producer = KafkaClientConfig(bootstrap).producer({"linger.ms": TRANSACTION_DEFAULTS["linger.ms"]})
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
        produce_waiting(producer, i, topic, value, key, partition=0, on_delivery=on_delivery,
                        timestamp=timestamp_ms, headers=record_headers)
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    assert remaining == 0 and not failures and delivered[0] == len(records), (remaining, failures[:3])
    return PlainResult(headers, len(records), seconds, time.process_time() - cpu0)


@dataclass
class RatioRound:
    """Target 1 measured as a pair run back to back: the 20-source gateway, then the plain producer (no headers) on
    the same records, or the other way round (alternating by round)."""

    gateway_events_per_s: float
    gateway_cpu_us_per_event: float
    plain_events_per_s: float
    plain_cpu_us_per_record: float
    events: int = 200_000  # each run's (files saved before --ratio-events: the page's --events)

    @property
    def ratio(self) -> float:
        return self.gateway_events_per_s / self.plain_events_per_s


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def summarize_py_spy(raw: Path, top: int = 40) -> str:
    """py-spy's raw (collapsed) stacks as two tables: the share of samples inside each function (inclusive) and
    where they were taken (self), the interpreter's and the CLI's own frames left out."""
    inclusive: dict[str, int] = {}
    own: dict[str, int] = {}
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        samples = int(count)
        total += samples
        frames = []
        for frame in stack.split(";"):
            name, _, where = frame.partition(" (")
            frames.append(f"{name} ({where.split(':')[0]})")
        for frame in set(frames):
            inclusive[frame] = inclusive.get(frame, 0) + samples
        own[frames[-1]] = own.get(frames[-1], 0) + samples
    skip = ("typer", "click", "runpy", "skewless/", "asyncio/", "threading.py", "concurrent/")

    def table(counts: dict[str, int]) -> str:
        rows = sorted(((n, f) for f, n in counts.items() if not any(k in f for k in skip)), reverse=True)[:top]
        return "\n".join(f"{100 * n / total:6.1f} %  {f}" for n, f in rows)
    return (f"py-spy, {total} samples of the gateway process (100 Hz, non-blocking) during the 20-source saturated "
            f"run of benchmarks/gateway_throughput.py\n\n-- inclusive (samples inside the function)\n"
            f"{table(inclusive)}\n\n-- self (samples taken in the function itself)\n{table(own)}\n")


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


def gateway_labels(results: list[RunResult]) -> list[str]:
    """The configurations run at every source count (the cores, or "this tree" in files saved before --cores), in
    the order they first ran; "before" and the no-transactions run are compared to them, not among them."""
    return list(dict.fromkeys(r.label for r in results if r.label not in ("before", "no transactions")))


def cores_side_by_side(results: list[RunResult], limit: PlainResult) -> str:
    """The python and the native core at each source count: the table and what it says, from this run's figures."""
    def row(label: str, sources: int) -> RunResult | None:
        return next((r for r in results if r.label == label and r.sources == sources), None)
    pairs = [(n, p, q) for n in dict.fromkeys(r.sources for r in results)
             if (p := row("python core", n)) is not None and (q := row("native core", n)) is not None]
    if not pairs:
        return ""
    table = "\n".join(
        f"| {n} | {p.events_per_s:,.0f} | {q.events_per_s:,.0f} | {q.events_per_s / p.events_per_s:.2f}x | "
        f"{p.events_per_s / limit.events_per_s:.3f}x | {q.events_per_s / limit.events_per_s:.3f}x | "
        f"{p.cpu_us_per_event:.1f} | {q.cpu_us_per_event:.1f} | {q.cpu_us_per_event / p.cpu_us_per_event:.2f}x |"
        for n, p, q in pairs)

    def counts(ns: list[int]) -> str:
        return ", ".join(str(n) for n in ns) + (" source" if ns == [1] else " sources")
    faster = [n for n, p, q in pairs if q.events_per_s > p.events_per_s]
    slower = [n for n, p, q in pairs if q.events_per_s <= p.events_per_s]
    cheaper = [n for n, p, q in pairs if q.cpu_us_per_event < p.cpu_us_per_event]
    dearer = [n for n, p, q in pairs if q.cpu_us_per_event >= p.cpu_us_per_event]
    verdict = []
    if faster:
        verdict.append(f"the native core carried more events/s than the python core at {counts(faster)}")
    if slower:
        verdict.append(f"it was **not faster** at {counts(slower)}")
    cpu = []
    if cheaper:
        cpu.append(f"it spent less gateway CPU per event at {counts(cheaper)}")
    if dearer:
        cpu.append(f"**not less** at {counts(dearer)}")
    return f"""## The python core and the native core, side by side (same broker, same run)

`skewless gateway --core python` runs the Python cores; `--core native` runs the Rust ones of native/
(gateway/native.py) instead: the connection decoder (frame split, msgpack decode, validation) in each session, the
sequence reorderer of each (source, stream), the merger of each stream (with a frame's in-order run merged and
turned into records in the same call), the record bytes and Produce actions, the delivery tracker's digests and
in-order admissions and confirmations, the reference mapping (the identity here: time sync is off), a commit's
per-record loops, the transactional shard's produce loop over its plain records and its sorting of each core
call's actions. Python keeps the glue per frame, run and batch, the tracker's state, the rare paths, the Python
objects each event still is on its way (its seq and time ints, Produce and DeliveryRef, off the cyclic
collector's lists; IncomingEvent, SourceEvent and the payload's dict only for an event that takes a Python path) and confluent-kafka's produce call per record (docs/gateway-hotpath.md:
"What still runs in Python, and why"). At each source count the cores ran one after the
other, in alternating order.

| sources | python core events/s | native core events/s | native / python | python of plain producer | native of plain producer | python CPU us/event | native CPU us/event | native / python CPU |
|---|---|---|---|---|---|---|---|---|
{table}

In this run {"; ".join(verdict)}; {"; ".join(cpu)}. Each row is one run of each core on a shared machine; this page
has no repeat that would measure the run-to-run spread, so a difference of a few percent is not a result.
"""


def analysis(results: list[RunResult], plain: list[PlainResult], paced: list[Paced], load: LoadAverages,
             rounds: list[RatioRound] | None = None) -> str:
    """What the run shows against issue 26's targets 1 and 2 (and issue 15's headers), with its own figures."""
    limit = next(r for r in plain if not r.headers)
    with_headers = next((r for r in plain if r.headers), limit)

    def row(label: str, sources: int) -> RunResult | None:
        return next((r for r in results if r.label == label and r.sources == sources), None)
    nows = [(label, r) for label in gateway_labels(results) if (r := row(label, 20)) is not None]
    was, idem = row("before", 20), row("no transactions", 20)
    lines = ["## Against the targets, and the next levers", ""]
    if rounds:
        ratios = [r.ratio for r in rounds]
        met_in = sum(ratio >= 0.5 for ratio in ratios)
        lines.append(
            f"**Target 1 (20 sources >= 0.5x the plain producer): {'met' if median(ratios) >= 0.5 else 'missed'} "
            f"by the median of {len(rounds)} back-to-back pairs, {median(ratios):.3f}x** (met in {met_in} of "
            f"{len(rounds)}: " + ", ".join(f"{ratio:.3f}" for ratio in ratios) + "; the table \"Target 1, pair by "
            "pair\" below). Each pair runs the gateway and the plain producer one right after the other, so both "
            "see the machine alike; the single runs of the tables above are minutes apart.")
        lines.append("")
    if nows:
        met = max(r.events_per_s for _, r in nows) / limit.events_per_s >= 0.5
        lines.append(
            f"**{'In the single runs above' if rounds else 'Target 1 (20 sources >= 0.5x the plain producer)'}: "
            f"{'met' if met else 'missed'}.** This run: "
            + "; ".join(f"{label} {r.events_per_s:,.0f} events/s ({r.events_per_s / limit.events_per_s:.3f}x)"
                        for label, r in nows)
            + f", against the plain producer's {limit.events_per_s:,.0f}"
            + (f"; the commit before, same run: {was.events_per_s:,.0f} events/s "
               f"({was.events_per_s / limit.events_per_s:.3f}x)" if was is not None else "")
            + (f"; without transactions ({idem.core or 'default'} core): {idem.events_per_s:,.0f} events/s "
               f"({idem.events_per_s / limit.events_per_s:.3f}x)" if idem is not None else "") + ".")
        cheapest = min(r.cpu_us_per_event for _, r in nows)
        lines.append(
            "The gateway's CPU per event end to end: "
            + ", ".join(f"{label} {r.cpu_us_per_event:.1f} us" for label, r in nows)
            + (f" (the commit before: {was.cpu_us_per_event:.1f} us)" if was is not None else "")
            + f"; the plain producer spends {limit.cpu_us_per_event:.1f} us of CPU per record, so at equal CPU "
            f"the gateway is at {limit.cpu_us_per_event / cheapest:.2f}x of it at best. The ratio to the plain "
            "producer moves with the plain producer's own share of the shared machine as much as with the "
            "gateway's: its CPU per record in this run is the figure to hold next to the gateway's.")
    busy = ", ".join(f"{label} {r.cpu_us_per_event * r.events_per_s / 1e4:.0f} %" for label, r in nows) or "a part"
    start, end = load.get("start"), load.get("end")
    machine = ("The machine was shared with other work" + (
        f" (load average over 1/5/15 minutes: {'/'.join(f'{x:.2f}' for x in start)} at the start of the run, "
        f"{'/'.join(f'{x:.2f}' for x in end)} at its end, on 2 cores)" if start and end else ""))
    late = ("""Under such starvation a source can go unserved for longer than the merge's wait (2 s while its
silences are being learned), the merge gives up on it and its later events go to the late topic ("late" column;
exactly once still holds: counted on the late topic, none lost). The two cores decide alike on the same input (the
differential tests drive the Python and the native decoder and reorderer with the same frames and require identical
output: tests/unit/native/test_native_decode.py, tests/unit/native/test_native_sequence.py), but arrival times differ from run to
run, so late counts that differ between rows come from the schedule.""" if any(r.late for r in results)
            else "No run sent an event late.")
    header_cost_us = with_headers.cpu_us_per_event - limit.cpu_us_per_event
    headers = (f"""Headers (issue 15 item 2) cost the plain producer {header_cost_us:.2f} us of CPU per record
({with_headers.events_per_s / limit.events_per_s:.2f}x its throughput without them): librdkafka copies every header;
in the gateway they are shared tuples, and gateway-hotpath.md's produce row shows their cost there.""" if header_cost_us > 0
               else f"""Headers (issue 15 item 2): in this run the plain producer with headers spent
{with_headers.cpu_us_per_event:.2f} us of CPU per record and without them {limit.cpu_us_per_event:.2f} us
({with_headers.events_per_s / limit.events_per_s:.2f}x the throughput): this run shows no cost of the headers;
gateway-hotpath.md's produce row shows their cost in the gateway.""")
    lines.append(f"""
Reading this run. {machine}. At 20 sources the gateway kept one core busy at {busy} (CPU us/event x events/s): it
shared the 2 cores with the broker, the load generator and the other work, so its events/s depend on its share of
them as much as on its own CPU per event, and the acks' seconds show the queueing. {late} So the CPU column is the
figure to compare across cores, and the ratio to the plain producer is an upper bound of what is missing, not a
measurement of the gateway's own limit: docs/gateway-hotpath.md measures the floor per event in CPU time (decode +
ingest + produce + commit), and gateway-profile-e2e.txt shows where the gateway process spends it end to end.

{headers}
""")
    twenty = [(label, p) for label, p in paced if p["sources"] == 20]
    if twenty:
        frame_ms = twenty[0][1]["frame_ms"]
        met = min(p["p99_ms"] for _, p in twenty) <= frame_ms + 1
        lines.append(
            f"**Target 2 (20 sources x 500 events/s, a frame every {frame_ms:.0f} ms: p99 added <= "
            f"{frame_ms + 1:.0f} ms): {'met' if met else 'missed'} on this machine.** This run: "
            + "; ".join(f"{label or 'the gateway'} added p50 {p['p50_ms']:.2f} ms, p99 {p['p99_ms']:.2f} ms "
                        f"({p['p99_ms'] / (p['frame_ms'] + 1):.1f}x the target), frame gaps at the gateway p50 "
                        f"{p['gap_p50_ms']:.2f} ms, p99 {p['gap_p99_ms']:.2f} ms" for label, p in twenty)
            + ". Where the p99 frame gap is as large as the p99 added latency, the sources' own schedule slipped by "
            "that much. [gateway-latency.md](gateway-latency.md) splits each event's added latency into the floor any "
            "merge could reach and the gateway's share, with the sources at normal and at real-time priority.")
    per_core = ", ".join(f"{label} {r.cpu_us_per_event:.1f} us" for label, r in nows) or "see the table"
    lines.append(f"""
Why the frame interval is the floor. An event can leave the merge only once every other live source has shown
(an event or a heartbeat) that it will send nothing older; with sources on independent 5 ms schedules, that is the
next frame of the source that sent just before it: close to one frame interval at p50, exactly the frame interval
plus the slip of the slowest schedule at p99. `release_ts_us` of a released event is the arrival stamp of the
frame that released it, never earlier than its own (both read off the socket; a frame read earlier on another
connection can be handled later), so queueing inside the gateway is not in this figure at all:
the merge's waits are, and they follow the sources' frames. In-order events of a lone source wait 0 (the 1-source
row). Nothing in the gateway holds a released event: the punctuation interval (1 ms) only spaces punctuations.
docs/gateway-hotpath.md runs the same schedule through the ingest core on virtual time: with frames on time the
merge adds 19/20 of the interval at p99, within the target, and it stays within it up to about 1 ms of arrival
jitter. End to end the miss is frames read late (docs/gateway-latency.md): when the sources keep time their
schedule alone meets the target, and the rest is the gateway's reads, late while its event loop waits for a
core or works through other frames; given a core of its own (real-time priority) its p99 there fell to
6.6-9.4 ms across two runs.

Next levers, by expected gain:

1. Target 1: more than one core. A gateway process per core (`--workers N`, shards across processes as
   docs/cluster.md does across machines; the merge is per shard already). This run's gateway CPU per event at 20
   sources ({per_core}) against {limit.cpu_us_per_event:.1f} us for the plain producer's produce call and callback.
2. Target 1: fewer Python objects per event. With `--core native` the in-order path's per-event steps run in
   Rust (each held to the Python code it replaces by differential tests, tests/unit/native/); what is left per
   event in Python are the objects the next step takes as such (the seq and time ints, Produce and DeliveryRef,
   the value bytes, the delivery tracker's pending entries; the natively built ones off the cyclic collector's
   lists; an in-order event's IncomingEvent, SourceEvent and payload dict are made only when Python asks for them);
   its record goes from Rust to librdkafka's C API on the producer's own client, without a `Producer.produce` call
   (docs/native.md, "Records to librdkafka"), whose message and header copies are most of the produce stage
   left (docs/gateway-hotpath.md). Next: one native call per frame from its bytes to a
   native batch of records that the shard produces and commits without those objects.
3. Target 2: the gateway's cost per frame. The paced load's frames hold 2-3 events; a frame's fixed cost in the
   in-process stages (docs/gateway-hotpath.md, small frames) and the asyncio shell's work per frame (its reads and
   task hops) keep the event loop busy, so frames wait to be read. Next: fewer task hops per frame in the shell
   and the per-frame path in one native call; and sources that send more often than they batch (1 ms frames, or a
   heartbeat when a frame is due but empty) lower the floor itself.
""")
    return "\n".join(lines)


COLORS = {"python core": "tab:blue", "native core": "tab:green", "before": "tab:orange", "no transactions": "tab:purple"}
SHORT = {"python core": "python", "native core": "native", "no transactions": "no txn"}


def write_report(results: list[RunResult], plain: list[PlainResult], paced: list[Paced],
                 linger: list[tuple[int, RunResult]], load: LoadAverages,
                 rounds: list[RatioRound] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    DOCS.mkdir(exist_ok=True)
    limit = next(r for r in plain if not r.headers)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    labels = [f"{SHORT.get(r.label, r.label)}\n{r.sources} src" for r in results] + [
        f"plain\n{'headers' if r.headers else 'no headers'}" for r in plain]
    rates = [r.events_per_s / 1000 for r in results] + [r.events_per_s / 1000 for r in plain]
    ax1.bar(labels, rates, color=[COLORS.get(r.label, "tab:blue") for r in results] + ["tab:gray"] * len(plain))
    ax1.axhline(limit.events_per_s / 2000, color="red", linestyle="--", label="target: 0.5x plain producer")
    ax1.set_ylabel("throughput (k events/s, acked by Kafka)")
    ax1.set_title("saturated: gateway (blue: python core, green: native core) and plain producer (gray)", fontsize=9)
    ax1.tick_params(axis="x", labelsize=7, rotation=45)
    ax1.legend(fontsize=8)
    if paced:
        names = [f"{SHORT.get(label, label)}\n{p['sources']:.0f} src" for label, p in paced]
        width = 0.38
        xs = list(range(len(paced)))
        ax2.bar([x - width / 2 for x in xs], [p["p99_ms"] for _, p in paced], width,
                label="p99 added latency (release - arrival)")
        ax2.bar([x + width / 2 for x in xs], [p["gap_p99_ms"] for _, p in paced], width, color="tab:gray",
                label="p99 gap between a source's frames at the gateway")
        ax2.set_xticks(xs, names)
        ax2.axhline(paced[0][1]["frame_ms"] + 1, color="red", linestyle="--", label="target: frame interval + 1 ms")
        ax2.set_ylabel("latency (ms)")
        ax2.set_xlabel(f"sources at a steady rate, one frame every {paced[0][1]['frame_ms']:.0f} ms")
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
        f"| {label} | {p['sources']:.0f} | {p['events_per_s']:,.0f} | {p['frame_ms']:.0f} | {p['gap_p50_ms']:.2f} | "
        f"{p['gap_p99_ms']:.2f} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['max_ms']:.2f} | "
        f"{p['p99_ms'] / (p['frame_ms'] + 1):.2f} | {p.get('reconnects', 0):.0f} |" for label, p in paced)
    linger_rows = "\n".join(
        f"| {ms} | {r.events_per_s:,.0f} | {r.cpu_us_per_event:.1f} | {r.ack_p50_ms:.1f} | {r.ack_p99_ms:.1f} |"
        for ms, r in linger)
    rounds_section = "" if not rounds else f"""
## Target 1, pair by pair

The 20-source gateway ({next((r.core for r in results if r.core == "native"), "native")} core) and the plain
producer (no headers, the 20-source run's records over again), one right after the other, the order alternating by
pair; {rounds[0].events:,} events each (runs of seconds, which a broker hiccup moves less than the 0.4 s of the
plain producer's 200,000 records). Median ratio: **{median([r.ratio for r in rounds]):.3f}x**.

| pair | gateway events/s | gateway CPU us/event | plain producer events/s | producer CPU us/record | ratio |
|---|---|---|---|---|---|
""" + "\n".join(f"| {i + 1} | {r.gateway_events_per_s:,.0f} | {r.gateway_cpu_us_per_event:.1f} | "
                f"{r.plain_events_per_s:,.0f} | {r.plain_cpu_us_per_record:.2f} | {r.ratio:.3f}x |"
                for i, r in enumerate(rounds)) + "\n"
    linger_core = next((r.core for _, r in linger if r.core), "the default")
    linger_section = "" if not linger else f"""
## Producer batching, side by side (20 sources, {linger_core} core, same run)

| linger.ms | events/s | gateway CPU us/event | ack p50 (ms) | ack p99 (ms) |
|---|---|---|---|---|
{linger_rows}
"""
    idem = next((r for r in results if r.label == "no transactions"), None)
    idem_note = "" if idem is None else (
        f' The "no transactions" row runs the {idem.core or "default"} core with `transactions = false`.')
    if any(r.label == "before" for r in results):
        idem_note += (' "before" rows run the gateway of the checkout given as `--before` (the commit before the '
                      'change measured), with its default core.')
    (DOCS / "gateway-benchmark.md").write_text(f"""# Gateway throughput (benchmarks/gateway_throughput.py)

Measured on this project's 2-core machine, gateway, broker and load generator sharing both cores (and other work
running on them); one run, so read the ratios more than the absolute numbers. In-order events, batches of {BATCH},
at most {WINDOW} unacked events per source, time sync off, each source saying bye after its last ack (as the SDK's
close does). Throughput counts events acknowledged by the gateway, i.e. committed to Kafka (acks=all, idempotent
transactional producer, lz4, linger 100 ms), from the first send to the last ack. Before its clock starts each gateway
carries one warm-up source's {BATCH} events (not counted), as the plain producer sends one record before its own:
the stream's topics are created and the shard's first record on them settled (one round trip to a partition just
created, paid once per topic and gateway; ~270 ms of a 200,000-event run before). "python core" and
"native core" are the same gateway spawned with `--core python` and `--core native`.{idem_note}

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
warming up, the row with the most sources is the better per-source figure (the bound is the configured
`max_buffered_events`, rule 4 of gateway/ingest.py, not the source count).

{cores_side_by_side(results, limit)}
## The limit: one plain producer, same broker, same run

The 20-source run's records (same keys and values, ~250 B JSON) replayed by one confluent-kafka producer with
the gateway's settings and a Python delivery callback per record; "headers" adds the gateway's record headers
(kind, source, contract version) and the reference time as the Kafka timestamp.

| headers | records | events/s | producer CPU us/record |
|---|---|---|---|
{plain_rows}
{rounds_section}
![throughput](gateway-throughput.png)

## Added latency at a steady rate (below saturation)

Sources stamp events with the real clock and send a frame on a fixed schedule every `frame` ms, at spread-out
phases (all sources said hello first). "frame gap" is the gap between the gateway's arrival stamps of a
source's consecutive frames: the interval the gateway actually saw. The merge must wait until every live source
has moved past an event's reference time, so the others' next frames bound an event's added latency.
"reconnects": how often a source found its connection closed (the gateway gave its shard up and restarted it)
and reconnected, writing its unacked events again as the SDK does; a run with reconnects measured a recovery too.

| gateway | sources | events/s | frame (ms) | frame gap p50 (ms) | frame gap p99 (ms) | added p50 (ms) | added p99 (ms) | max (ms) | p99 / (frame + 1 ms) | reconnects |
|---|---|---|---|---|---|---|---|---|---|---|
{paced_rows}
{linger_section}
{analysis(results, plain, paced, load, rounds)}
`--workers N` against one process in one run, and the scaling model (events/s per core, broker CPU per event): \
[gateway-workers.md](gateway-workers.md).
""")


def variants_for(cores: list[str], before: Path | None) -> list[Variant]:
    variants: list[Variant] = [(CORE_LABELS[core], None, core) for core in cores]
    # The tree before may not know --core: it runs with its own default.
    return variants if before is None else [("before", before, None), *variants]


def alternated(variants: list[Variant], index: int) -> list[Variant]:
    """Every other source count runs the configurations in reverse, so none always runs first."""
    return variants if index % 2 == 0 else variants[::-1]


def load_averages() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--sources", type=int, nargs="*", default=[1, 20, 100])
    parser.add_argument("--cores", nargs="+", choices=sorted(CORE_LABELS), default=["python", "native"],
                        help="run the gateway once per core (--core X) at every source count, same broker, same run")
    parser.add_argument("--linger", action="store_true", help=f"also compare linger.ms {LINGER_COMPARED_MS} (last core)")
    parser.add_argument("--py-spy", type=Path, help="sample the 20-source gateway of the first core with py-spy "
                        "into this file")
    parser.add_argument("--ratio-events", type=int, default=600_000,
                        help="events of each target-1 pair's gateway run and records of its plain producer run")
    parser.add_argument("--ratio-rounds", type=int, default=5,
                        help="target 1 as pairs run back to back (the 20-source gateway of the native core, then the "
                        "plain producer, the order alternating): this many pairs, the median ratio reported")
    parser.add_argument("--no-report", action="store_true", help="print, do not write docs/")
    parser.add_argument("--report-from-saved", action="store_true",
                        help=f"rewrite the report from {RESULTS.name} (the last run's figures), run nothing")
    parser.add_argument("--before", type=Path, help="also run the gateway of this checkout (the commit before), "
                        "same sources, same broker, same run")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    if args.report_from_saved:
        report_from_saved()
        return
    cores: list[str] = list(dict.fromkeys(args.cores))
    variants = variants_for(cores, args.before)
    load: LoadAverages = {"start": load_averages()}
    print(f"load average at start: {load['start']}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            # one step per measured run: gateway runs, the no-transactions run, plain producers, paced runs, linger
            steps = (len(args.sources) * len(variants) + (1 if 20 in args.sources else 0) + 2 + 2 * len(cores)
                     + (3 if args.linger else 0) + (args.ratio_rounds if 20 in args.sources else 0))
            with progress_bar("gateway runs", steps, enabled=progress_enabled(not args.no_progress)) as advance:
                results = []
                for index, sources in enumerate(args.sources):
                    for label, tree, core in alternated(variants, index):
                        spied = sources == 20 and tree is None and core == cores[0]
                        result = one_run(state.bootstrap_servers, sources, args.events,
                                         py_spy=args.py_spy if spied else None, tree=tree, core=core)
                        result.label = label
                        print(f"{label:>15} {sources:>4} sources: {result.events_per_s:>10,.0f} events/s  "
                              f"cpu {result.cpu_us_per_event:.1f} us/event  "
                              f"added p50/p99 {result.added_p50_us / 1000:.2f}/{result.added_p99_us / 1000:.2f} ms  "
                              f"ack p50/p99 {result.ack_p50_ms:.1f}/{result.ack_p99_ms:.1f} ms  "
                              f"rss/source {result.rss_growth_bytes / sources / 1024:.1f} KiB  late {result.late}",
                              flush=True)
                        results.append(result)
                        advance()
                if 20 in args.sources:
                    # The idempotent producer alone (transactions = false), the last core: what the transactions cost.
                    result = one_run(state.bootstrap_servers, 20, args.events, transactions=False, core=cores[-1])
                    result.label = "no transactions"
                    print(f"no transactions ({CORE_LABELS[cores[-1]]}) 20 sources: {result.events_per_s:>10,.0f} "
                          f"events/s  cpu {result.cpu_us_per_event:.1f} us/event  late {result.late}", flush=True)
                    results.append(result)
                    advance()
                first = CORE_LABELS[cores[0]]
                source_run = next((r for r in results if r.sources == 20 and r.label == first), results[-1])
                # As many records as the gateway runs carried (events the merge sent late are not on the events topic:
                # the replay cycles through the others).
                replay = [source_run.records[i % len(source_run.records)] for i in range(source_run.events)]
                plain = []
                for headers in (False, True):
                    row = plain_producer(state.bootstrap_servers, replay, headers)
                    print(f"plain producer, headers {headers}: {row.events_per_s:>10,.0f} events/s  "
                          f"cpu {row.cpu_us_per_event:.2f} us/record", flush=True)
                    plain.append(row)
                    advance()
                for result in results:
                    print(f"{result.label:>15} {result.sources:>4} sources: "
                          f"{result.events_per_s / plain[0].events_per_s:.3f}x the plain producer", flush=True)
                rounds: list[RatioRound] = []
                target_core = "native" if "native" in cores else cores[-1]
                # The same records over again up to --ratio-events: the producer's run then lasts seconds, not the
                # 0.4 s of 200,000 records, in which one broker hiccup moved its rate by a third.
                ratio_replay = (replay * -(-args.ratio_events // len(replay)))[:args.ratio_events] if replay else []
                for pair in range(args.ratio_rounds if 20 in args.sources else 0):
                    gateway_run: RunResult | None = None
                    producer_run: PlainResult | None = None
                    for step in ("gateway", "plain") if pair % 2 == 0 else ("plain", "gateway"):
                        if step == "gateway":
                            gateway_run = one_run(state.bootstrap_servers, 20, args.ratio_events, core=target_core)
                        else:
                            producer_run = plain_producer(state.bootstrap_servers, ratio_replay, False)
                    assert gateway_run is not None and producer_run is not None
                    rounds.append(RatioRound(gateway_run.events_per_s, gateway_run.cpu_us_per_event,
                                             producer_run.events_per_s, producer_run.cpu_us_per_event,
                                             args.ratio_events))
                    print(f"target 1 pair {pair + 1}: gateway {gateway_run.events_per_s:,.0f} events/s, plain "
                          f"{producer_run.events_per_s:,.0f}: {rounds[-1].ratio:.3f}x", flush=True)
                    advance()
                if rounds:
                    print(f"target 1: median {median([r.ratio for r in rounds]):.3f}x over {len(rounds)} pairs",
                          flush=True)
                paced: list[Paced] = []
                for index, (sources, rate) in enumerate(((1, 5000.0), (20, 500.0))):
                    for core in cores if index % 2 == 0 else cores[::-1]:
                        paced_row = paced_run(state.bootstrap_servers, sources, rate, 5.0, 0.005, core)
                        print(f"{CORE_LABELS[core]}, paced {sources:>3} sources x {rate:,.0f}/s: added p50/p99/max "
                              f"{paced_row['p50_ms']:.2f}/{paced_row['p99_ms']:.2f}/{paced_row['max_ms']:.2f} ms, "
                              f"frame gap p50/p99 {paced_row['gap_p50_ms']:.2f}/{paced_row['gap_p99_ms']:.2f} ms, "
                              f"reconnects {paced_row['reconnects']:.0f}", flush=True)
                        paced.append((CORE_LABELS[core], paced_row))
                        advance()
                linger = []
                if args.linger:
                    for ms in LINGER_COMPARED_MS:
                        result = one_run(state.bootstrap_servers, 20, args.events // 2, {"linger.ms": ms},
                                         core=cores[-1])
                        print(f"linger.ms={ms:>3}: {result.events_per_s:>10,.0f} events/s  "
                              f"cpu {result.cpu_us_per_event:.1f} us/event", flush=True)
                        linger.append((ms, result))
                        advance()
                load["end"] = load_averages()
                print(f"load average at end: {load['end']}", flush=True)
                if not args.no_report:
                    save_results(results, plain, paced, linger, load, rounds)
                if args.py_spy is not None and args.py_spy.exists() and not args.no_report:
                    (DOCS / "gateway-profile-e2e.txt").write_text(summarize_py_spy(args.py_spy))
                if not args.no_report:
                    write_report(results, plain, paced, linger, load, rounds)
        finally:
            broker.stop()


RESULTS = DOCS / "gateway-benchmark.json"


def save_results(results: list[RunResult], plain: list[PlainResult], paced: list[Paced],
                 linger: list[tuple[int, RunResult]], load: LoadAverages, rounds: list[RatioRound]) -> None:
    """The run's figures (not its records), so the report's prose can be rewritten without a rerun."""
    def row(r: RunResult) -> dict[str, object]:
        return {k: v for k, v in vars(r).items() if k != "records"}
    RESULTS.write_bytes(orjson.dumps({"results": [row(r) for r in results], "plain": [vars(r) for r in plain],
                                      "paced": [{"label": label, **p} for label, p in paced],
                                      "linger": [[ms, row(r)] for ms, r in linger], "load_average": load,
                                      "ratio_rounds": [vars(r) for r in rounds]},
                                     option=orjson.OPT_INDENT_2))


def report_from_saved() -> None:
    saved = orjson.loads(RESULTS.read_bytes())
    # Files saved before --cores: paced rows without a label (the gateway's default core), no load averages.
    paced = [(str(p.pop("label", "")), p) for p in saved["paced"]]
    write_report([RunResult(**r) for r in saved["results"]], [PlainResult(**r) for r in saved["plain"]],
                 paced, [(ms, RunResult(**r)) for ms, r in saved["linger"]], saved.get("load_average", {}),
                 [RatioRound(**r) for r in saved.get("ratio_rounds", [])])


if __name__ == "__main__":
    main()
