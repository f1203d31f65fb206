"""A gateway cluster on one 2-core machine: 1 against 2 gateway processes, a plain producer as the limit, failover.

One broker (broker.launcher.KafkaBroker), gateway processes started through gateway.launch.spawn_gateway_async
with the same --shards (default 4, so 2 gateways serve 2 shards each), transactions on (the default: every shard
commits every 100 ms and acks sources at commits), time sync off. All in one run, side by side:

1. Saturated: 20 in-order raw-frame sources (the load generator of benchmarks/gateway_throughput.py, which
   follows the hello's redirect to the shard's owner) push a fixed number of events as fast as they are acked,
   at most --window unacked per source (a heartbeat when blocked, as the SDK sends when idle).
   Measured: events/s from first send to last ack, ack latency per batch, added latency (`release_ts_us -
   arrival_ts_us` of every event record read back from Kafka, read_committed), and the CPU of every process
   (gateways, broker, load generator) from /proc, to show what the cores were spent on.
2. Paced: the same 20 sources at a steady rate well below saturation (5 ms frames): p50/p99 added and ack latency.
3. Plain producer: the records the 1-gateway run wrote (same keys, values, partitions) produced again by one
   confluent-kafka producer with the gateway's settings (broker.client.PRODUCER_DEFAULTS, idempotent, no
   transactions) from one Python thread: the physical limit of one writer process on this broker and machine.
4. Failover: 2 gateways, 20 SDK sources (clients.SkewlessClient with both addresses) at a steady rate; SIGKILL
   one gateway; per moved source, the time from the kill to its first ack (only the new owner can ack after the
   kill), and when the survivor got (starting_shards) and served (serving_shards) the moved shards, from its
   /healthz. Once per session timeout (default: 6 s, the gateway's default, and 10 s).

Prints the measured tables of docs/cluster-benchmark.md (the prose around them is written by hand from the run)
and writes docs/cluster-benchmark.png.

Run: .venv/bin/python -m benchmarks.gateway_cluster [--events 200000] [--shards 4] [--session-timeouts 6 10]
     .venv/bin/python -m benchmarks.gateway_cluster --plot-from-doc   # only re-draw the PNG from the doc
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import platform
import signal
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import IO, Any

import orjson
from confluent_kafka import KafkaError, Message

from benchmarks.harness.args import parse_or_redraw
from benchmarks.harness.processes import cpu_s
from benchmarks.harness.producing import produce_waiting
from benchmarks.harness.stats import percentile
from benchmarks.plotstyle import axis_labels, pyplot, save
from broker.client import KafkaClientConfig
from broker.cluster import ensure_partitions
from broker.launcher import KafkaBroker
from broker.reader import read_topic
from clients import Backoff, SkewlessClient
from contract.records import EVENT
from contract.sharding import shard_of
from contract.topics import TopicNames
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    Ack,
    Redirect,
    Welcome,
    build_event,
    build_events,
    build_heartbeat,
    build_hello,
    parse_gateway_message,
)
from gateway.launch import GatewayAddresses, spawn_gateway_async
from reorder.eval.progress import progress_bar, progress_enabled

DOCS = Path(__file__).resolve().parents[1] / "docs"
STREAM = "bench"
# Same frame shape as benchmarks/gateway_throughput.py. Its in-flight bound (20,000 unacked events per source,
# more than a source sends there) makes every source dump its events at once; behind 4 shard runtimes in one
# process the last-read source of each shard then stays unread past the merge's 2 s wait, and its events go to the
# late topic (measured: 16 % of them). 2,000 with a heartbeat when blocked is flow control as the SDK does it.
BATCH_EVENTS = 500
WINDOW_EVENTS = 2_000
# A saturated run that has not finished by then is stuck (the gateway would close idle sources after 120 s).
RUN_TIMEOUT_S = 90.0
EVENT_STEP_US = 10
# A hello answered with shard_unavailable (a rebalance still settling) is retried after this pause.
HELLO_RETRY_S = 0.2
HELLO_ATTEMPTS = 100
BALANCE_TIMEOUT_S = 90.0
HEALTH_POLL_S = 0.02
ACK_POLL_S = 0.005
FAILOVER_TIMEOUT_S = 90.0
# Sources send this long before the kill, so every connection is live and acked at a steady pace.
FAILOVER_WARMUP_S = 2.0
FAILOVER_AFTER_S = 1.0
FAILOVER_RATE_PER_SOURCE = 100.0
# The reliability tests' reconnect policy: capped at 0.5 s so the client's backoff adds little to the failover
# (the SDK default caps at 5 s, which can add up to that much after a long outage).
FAILOVER_BACKOFF = Backoff(initial_s=0.05, max_s=0.5)


# ------------------------------------------------------------------------------------------------ processes


@dataclass
class GatewayProcess:
    process: asyncio.subprocess.Process
    addresses: GatewayAddresses

    @property
    def address(self) -> tuple[str, int]:
        return self.addresses.host, self.addresses.port


@dataclass
class Cluster:
    prefix: str
    shards: int
    gateways: list[GatewayProcess]
    logs: list[IO[bytes]] = field(default_factory=list)

    async def stop(self) -> None:
        for gateway in self.gateways:
            if gateway.process.returncode is None:
                gateway.process.send_signal(signal.SIGTERM)
        for gateway in self.gateways:
            try:
                async with asyncio.timeout(30):
                    await gateway.process.wait()
            except TimeoutError:
                gateway.process.kill()
                await gateway.process.wait()
        for log_file in self.logs:
            log_file.close()


async def health(gateway: GatewayProcess) -> dict[str, Any]:
    host, port = gateway.addresses.metrics_host, gateway.addresses.metrics_port
    assert host is not None and port is not None
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    response = await reader.read()
    writer.close()
    return dict(orjson.loads(response.split(b"\r\n\r\n", 1)[1]))


async def start_cluster(bootstrap: str, prefix: str, gateways: int, shards: int, log_dir: Path,
                        session_timeout_s: float | None = None) -> Cluster:
    """Gateways started one after the other (each joins the group; the last join splits the shards evenly), then
    wait until every shard is served exactly once and every gateway serves its even share."""
    args = ["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix, "--shards", str(shards),
            "--metrics-port", "0"]
    env = dict(os.environ)
    if session_timeout_s is not None:
        env["SKEWLESS_GATEWAY_SESSION_TIMEOUT_S"] = str(session_timeout_s)
    cluster = Cluster(prefix, shards, [])
    for i in range(gateways):
        log_file = (log_dir / f"{prefix}.gateway{i}.log").open("ab")
        cluster.logs.append(log_file)
        process, addresses = await spawn_gateway_async(args, stderr=log_file, env=env)
        cluster.gateways.append(GatewayProcess(process, addresses))
    try:
        await shard_owners(cluster, balanced=True)
    except BaseException:
        await cluster.stop()
        raise
    return cluster


async def shard_owners(cluster: Cluster, balanced: bool = False) -> dict[int, int]:
    """shard -> index of the live gateway serving it, once every shard has exactly one (and, if ``balanced``,
    every live gateway serves shards / gateways of them)."""
    async with asyncio.timeout(BALANCE_TIMEOUT_S):
        while True:
            owners: dict[int, int] = {}
            duplicate = False
            live = [i for i, g in enumerate(cluster.gateways) if g.process.returncode is None]
            for i in live:
                for shard in (await health(cluster.gateways[i]))["serving_shards"]:
                    duplicate |= shard in owners
                    owners[shard] = i
            even = all(list(owners.values()).count(i) == cluster.shards // len(live) for i in live)
            if len(owners) == cluster.shards and not duplicate and (even or not balanced):
                return owners
            await asyncio.sleep(0.1)


def balanced_source_ids(sources: int, shards: int) -> list[str]:
    """``sources`` ids spread evenly over the shards (contract.sharding.shard_of), so 2 gateways carry equal load:
    with 20 arbitrary ids murmur2 may put 8 on one shard and 2 on another, which would measure the hash's luck."""
    per_shard = -(-sources // shards)
    taken: dict[int, list[str]] = {k: [] for k in range(shards)}
    candidate = 0
    while sum(len(v) for v in taken.values()) < sources:
        source_id = f"src-{candidate:04d}"
        candidate += 1
        bucket = taken[shard_of(source_id, shards)]
        if len(bucket) < per_shard:
            bucket.append(source_id)
    return sorted(s for ids in taken.values() for s in ids)[:sources]


# ---------------------------------------------------------------------------------------- raw-frame sources


Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder]


async def open_source(addresses: list[tuple[str, int]], source_id: str) -> tuple[Connection, tuple[str, int]]:
    """Hello at the first gateway; follow a redirect to the shard's owner; retry a refusal (shard_unavailable)."""
    target = addresses[0]
    for _ in range(HELLO_ATTEMPTS):
        reader, writer = await asyncio.open_connection(*target)
        writer.write(encode_frame(build_hello(source_id, [STREAM])))
        decoder = FrameDecoder()
        frames: list[dict[str, Any]] = []
        while not frames:
            data = await reader.read(65536)
            if not data:
                break
            frames = decoder.feed(data)
        message = parse_gateway_message(frames[0]) if frames else None
        if isinstance(message, Welcome):
            return (reader, writer, decoder), target
        writer.close()
        if isinstance(message, Redirect):
            target = (message.host, message.port)
        else:
            await asyncio.sleep(HELLO_RETRY_S)
    raise RuntimeError(f"{source_id}: no gateway welcomed it after {HELLO_ATTEMPTS} attempts")


def frames_for(events: int, base_us: int) -> list[tuple[int, bytes]]:
    """(last seq, frame) per batch; every source's event time advances EVENT_STEP_US per event (as in
    gateway_throughput.py, so all sources' event times start together and advance at one pace)."""
    out = []
    for start in range(0, events, BATCH_EVENTS):
        seqs = range(start, min(start + BATCH_EVENTS, events))
        batch = [build_event(STREAM, seq, base_us + seq * EVENT_STEP_US, {"v": seq & 255}) for seq in seqs]
        out.append((seqs[-1], encode_frame(build_events(batch))))
    return out


class AckTracker:
    """Reads a connection's acks; records, per sent frame, the time from its write to the ack covering it."""

    def __init__(self, connection: Connection, ack_latencies_ms: list[float]) -> None:
        self.reader, self.writer, self.decoder = connection
        self.acked = -1
        self.sent_at: dict[int, float] = {}
        self.changed = asyncio.Event()
        self.closed = False
        self.last_other: object = None
        self._latencies_ms = ack_latencies_ms
        self._task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while data := await self.reader.read(65536):
            for raw in self.decoder.feed(data):
                message = parse_gateway_message(raw)
                if isinstance(message, Ack):
                    now = time.perf_counter()
                    self.acked = message.seq
                    for last in [s for s in self.sent_at if s <= self.acked]:
                        self._latencies_ms.append((now - self.sent_at.pop(last)) * 1e3)
                    self.changed.set()
                else:
                    self.last_other = message
        # This generator does not resend (the SDK does): a gateway that closed the connection (e.g. shard_moved
        # after its shard's producer failed) ends the run with the reason instead of a hang.
        self.closed = True
        self.changed.set()

    async def wait_acked(self, seq: int) -> None:
        while self.acked < seq:
            if self.closed:
                raise ConnectionError(f"gateway closed the connection at ack {self.acked} (waiting for {seq}); "
                                      f"last message: {self.last_other}")
            self.changed.clear()
            await self.changed.wait()

    def send(self, last_seq: int, frame: bytes) -> None:
        self.sent_at[last_seq] = time.perf_counter()
        self.writer.write(frame)


    def close(self) -> None:
        self._task.cancel()
        self.writer.close()


async def saturated_source(connection: Connection, frames: list[tuple[int, bytes]], base_us: int, final_ts_us: int,
                           window_events: int, ack_latencies_ms: list[float]) -> None:
    tracker = AckTracker(connection, ack_latencies_ms)
    sent_through = -1
    for last_seq, frame in frames:
        if tracker.acked < last_seq - window_events:
            # Blocked on the window: say so with a heartbeat (nothing older than the next event will come), as the
            # SDK does when idle. Without it every source of a shard stops at the same event time, the merge cannot
            # release those last events (it needs something newer from every source), their acks never come, and
            # the run stalls until the merge gives up on the sources (their events then go to the late topic).
            tracker.writer.write(encode_frame(build_heartbeat(base_us + (sent_through + 1) * EVENT_STEP_US,
                                                              {STREAM: sent_through + 1})))
            await tracker.wait_acked(last_seq - window_events)
        tracker.send(last_seq, frame)
        sent_through = last_seq
        await tracker.writer.drain()
    final_seq = frames[-1][0]
    # Heartbeat: this source is done, nothing older will come, so its shard's merge need not wait for it.
    tracker.writer.write(encode_frame(build_heartbeat(final_ts_us, {STREAM: final_seq + 1})))
    await tracker.wait_acked(final_seq)
    tracker.close()


async def paced_source(connection: Connection, rate_per_s: float, seconds: float, frame_every_s: float,
                       ack_latencies_ms: list[float]) -> int:
    """Real-time source: every frame_every_s, the events due since the start at rate_per_s, stamped with the real
    clock. Counting what is due (not a fixed count per frame) keeps the rate exact when sleeps overrun on a busy
    machine."""
    tracker = AckTracker(connection, ack_latencies_ms)
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    while (elapsed_s := loop.time() - start) < seconds:
        due = int(elapsed_s * rate_per_s) + 1 - seq
        if due > 0:
            now_us = time.time_ns() // 1000
            batch = [build_event(STREAM, seq + i, now_us, {"v": (seq + i) & 255}) for i in range(due)]
            seq += due
            tracker.send(seq - 1, encode_frame(build_events(batch)))
        await asyncio.sleep(frame_every_s)
    tracker.writer.write(encode_frame(build_heartbeat(time.time_ns() // 1000, {STREAM: seq})))
    async with asyncio.timeout(60):
        await tracker.wait_acked(seq - 1)
    tracker.close()
    return seq


# ------------------------------------------------------------------------------------------- gateway runs


@dataclass
class LoadResult:
    label: str
    gateways: int
    events: int
    seconds: float
    gateway_cpu_s: float
    broker_cpu_s: float
    loadgen_cpu_s: float
    added_us: list[int]
    ack_ms: list[float]
    events_per_gateway: list[int]
    late_events: int
    # Paced runs: the seconds the sources sent for (the rate they offered is events / this); None: saturated.
    paced_s: float | None = None

    @property
    def events_per_s(self) -> float:
        """Saturated: acknowledged end to end per second of wall time; paced: the offered rate."""
        return self.events / (self.paced_s or self.seconds)

    def cores_busy(self, cpu_s: float) -> float:
        return cpu_s / self.seconds

    def us_per_event(self, cpu_s: float) -> float:
        return cpu_s * 1e6 / self.events


# A load: runs the sources on their open connections, appends ack latencies (ms), returns the events sent.
LoadRun = Callable[[list[Connection], list[float]], Awaitable[int]]


async def gateway_load(bootstrap: str, broker_pid: int, gateways: int, shards: int, source_ids: list[str],
                       log_dir: Path, run: LoadRun, label: str,
                       ) -> tuple[LoadResult, str]:
    """Start a cluster, connect every source to its shard's owner, run the load, read the records back.
    Returns the result and the events topic (the plain producer replays it)."""
    prefix = f"{label}{gateways}g{time.time_ns()}"
    cluster = await start_cluster(bootstrap, prefix, gateways, shards, log_dir)
    ack_ms: list[float] = []
    try:
        addresses = [g.address for g in cluster.gateways]
        # Half the sources dial the other gateway first, as a fleet configured with every address would.
        opened = await asyncio.gather(*(open_source(addresses[i % len(addresses):] + addresses[:i % len(addresses)],
                                                    s) for i, s in enumerate(source_ids)))
        connections = [c for c, _ in opened]
        served_by = [addresses.index(t) for _, t in opened]
        pids = [g.process.pid for g in cluster.gateways]
        gateway_cpu0 = sum(cpu_s(p) for p in pids)
        broker_cpu0, loadgen_cpu0 = cpu_s(broker_pid), time.process_time()
        started = time.perf_counter()
        events = await run(connections, ack_ms)
        seconds = time.perf_counter() - started
        gateway_cpu_s = sum(cpu_s(p) for p in pids) - gateway_cpu0
        broker_cpu_s = cpu_s(broker_pid) - broker_cpu0
        loadgen_cpu_s = time.process_time() - loadgen_cpu0
    finally:
        await cluster.stop()
    topics = TopicNames(prefix)
    loop = asyncio.get_running_loop()
    records = await loop.run_in_executor(None, read_topic, bootstrap, topics.events(STREAM), 120.0)
    added = []
    for _key, value in records:
        record = orjson.loads(value)
        if record.get("kind") == EVENT:
            added.append(record["release_ts_us"] - record["arrival_ts_us"])
    # Acked events the merge could not place in order (it gave up waiting for a silent source) are in the late
    # topic: acknowledged and in Kafka too, counted apart.
    late = len(await loop.run_in_executor(None, read_topic, bootstrap, topics.late(STREAM), 120.0))
    assert len(added) + late == events, (label, len(added), late, events)
    per_source = events // len(source_ids)
    events_per_gateway = [served_by.count(i) * per_source for i in range(gateways)]
    return LoadResult(label, gateways, events, seconds, gateway_cpu_s, broker_cpu_s, loadgen_cpu_s, added, ack_ms,
                      events_per_gateway, late), topics.events(STREAM)


def saturated_load(per_source: int, window_events: int) -> LoadRun:
    async def run(connections: list[Connection], ack_ms: list[float]) -> int:
        # Event times start now, after the cluster settled: frames stamped before it (seconds in the past) would
        # find the shard's watermark already past them and go to the late topic. Built once for every source
        # (its id is in its hello, not in its events), ~40 ms inside the measured time.
        base_us = time.time_ns() // 1000
        frames = frames_for(per_source, base_us)
        final_ts_us = base_us + per_source * EVENT_STEP_US + 1_000_000
        async with asyncio.timeout(RUN_TIMEOUT_S):
            await asyncio.gather(*(saturated_source(c, frames, base_us, final_ts_us, window_events, ack_ms)
                                   for c in connections))
        return per_source * len(connections)
    return run


def paced_load(rate_per_source: float, seconds: float, frame_every_s: float) -> LoadRun:
    async def run(connections: list[Connection], ack_ms: list[float]) -> int:
        counts = await asyncio.gather(*(paced_source(c, rate_per_source, seconds, frame_every_s, ack_ms)
                                        for c in connections))
        return sum(counts)
    return run


# ----------------------------------------------------------------------------------------- plain producer


@dataclass
class ProducerResult:
    events: int
    seconds: float
    producer_cpu_s: float
    broker_cpu_s: float
    delivery_ms: list[float]

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def plain_producer(bootstrap: str, broker_pid: int, source_topic: str, shards: int) -> ProducerResult:
    """Replay the gateway's records (same keys, values and partitions) with one producer, as fast as one Python
    thread can hand them to librdkafka; throughput = records acknowledged by the broker / wall time to the last."""
    records = []
    for key, value in read_topic(bootstrap, source_topic, timeout_s=120):
        record = orjson.loads(value)
        if record.get("kind") == EVENT:
            records.append((key, value, shard_of(record["source_id"], shards)))
    topic = f"{source_topic}.plain"
    ensure_partitions(bootstrap, [topic], shards)
    producer = KafkaClientConfig(bootstrap).producer()
    delivery_ms: list[float] = []
    failures: list[KafkaError] = []

    def on_delivery(produced_at: float, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            failures.append(error)
        else:
            delivery_ms.append((time.perf_counter() - produced_at) * 1e3)

    # Warm the connection and the partition leaders up, as the gateways' producers are before their runs.
    producer.produce(topic, records[0][1], records[0][0], partition=records[0][2])
    producer.flush(30)
    broker_cpu0, cpu0 = cpu_s(broker_pid), time.process_time()
    started = time.perf_counter()
    for i, (key, value, partition) in enumerate(records):
        produced_at = time.perf_counter()
        produce_waiting(producer, i, topic, value, key, partition=partition,
                        on_delivery=partial(on_delivery, produced_at))
    remaining = producer.flush(120)
    seconds = time.perf_counter() - started
    assert remaining == 0 and not failures and len(delivery_ms) == len(records), (remaining, failures[:3])
    return ProducerResult(len(records), seconds, time.process_time() - cpu0, cpu_s(broker_pid) - broker_cpu0,
                          delivery_ms)


# --------------------------------------------------------------------------------------------------- failover


@dataclass
class FailoverResult:
    session_timeout_s: float
    moved_shards: list[int]
    moved_sources: int
    # kill -> the survivor's /healthz lists the moved shards as starting (the group rebalance gave them to it)
    assigned_s: float
    # kill -> it lists them as serving (recovery done: hellos are welcomed)
    served_s: float
    first_ack_s: list[float]  # kill -> first ack from the new owner, one per moved source
    events: int
    lost: int
    duplicated: int
    out_of_order: int


async def failover_run(bootstrap: str, shards: int, source_ids: list[str], session_timeout_s: float,
                       log_dir: Path) -> FailoverResult:
    prefix = f"failover{time.time_ns()}"
    cluster = await start_cluster(bootstrap, prefix, 2, shards, log_dir, session_timeout_s)
    owners = await shard_owners(cluster)
    victim_index = 0
    victim, survivor = cluster.gateways[victim_index], cluster.gateways[1 - victim_index]
    moved_shards = sorted(k for k, i in owners.items() if i == victim_index)
    addresses = [g.address for g in cluster.gateways]
    clients = {}
    for i, source_id in enumerate(source_ids):
        first, *rest = addresses[i % 2:] + addresses[:i % 2]
        clients[source_id] = SkewlessClient(
            first[0], first[1], source_id, [STREAM], gateways=rest, pool_size=1, heartbeat_interval_s=0.2,
            backoff=FAILOVER_BACKOFF.copy(), connect_timeout_s=30.0, resync_interval_s=None)
    moved = [c for s, c in clients.items() if shard_of(s, shards) in moved_shards]
    stop_sending = asyncio.Event()

    async def feed(client: SkewlessClient) -> None:
        await client.connect()
        while not stop_sending.is_set():
            await client.send(STREAM, {"v": client.next_seq(STREAM) & 255})
            await asyncio.sleep(1 / FAILOVER_RATE_PER_SOURCE)
        await client.flush(90.0)

    feeders = [asyncio.create_task(feed(c)) for c in clients.values()]
    try:
        await asyncio.sleep(FAILOVER_WARMUP_S)
        acked_before = {c.source_id: c.acked_through(STREAM) for c in moved}
        killed_at = time.monotonic()
        victim.process.send_signal(signal.SIGKILL)
        first_ack_s: dict[str, float] = {}
        survivor_times_s: dict[str, float] = {}

        async def watch_survivor() -> None:
            # Polled every HEALTH_POLL_S: a recovery shorter than that shows as assigned == served.
            while True:
                state = await health(survivor)
                now_s = time.monotonic() - killed_at
                if set(moved_shards) <= set(state["starting_shards"]) | set(state["serving_shards"]):
                    survivor_times_s.setdefault("assigned", now_s)
                if set(moved_shards) <= set(state["serving_shards"]):
                    survivor_times_s["served"] = now_s
                    return
                await asyncio.sleep(HEALTH_POLL_S)

        async def watch_acks() -> None:
            # After a SIGKILL the old owner acks nothing more: an ack past the one seen before is the new owner's.
            while len(first_ack_s) < len(moved):
                for client in moved:
                    if client.source_id not in first_ack_s and \
                            client.acked_through(STREAM) > acked_before[client.source_id]:
                        first_ack_s[client.source_id] = time.monotonic() - killed_at
                await asyncio.sleep(ACK_POLL_S)

        async with asyncio.timeout(FAILOVER_TIMEOUT_S):
            await asyncio.gather(watch_survivor(), watch_acks(), victim.process.wait())
        await asyncio.sleep(FAILOVER_AFTER_S)
        stop_sending.set()
        await asyncio.gather(*feeders)
        sent = {s: c.next_seq(STREAM) for s, c in clients.items()}
    finally:
        stop_sending.set()
        for task in feeders:
            task.cancel()
        for client in clients.values():
            await client.close()
        await cluster.stop()
    # What committed readers see: every (source, seq) exactly once, each source in seq order.
    loop = asyncio.get_running_loop()
    records = await loop.run_in_executor(None, read_topic, bootstrap, TopicNames(prefix).events(STREAM), 120.0)
    seen: dict[str, list[int]] = {s: [] for s in source_ids}
    for _key, value in records:
        record = orjson.loads(value)
        if record.get("kind") == EVENT:
            seen[record["source_id"]].append(record["seq"])
    lost = sum(sent[s] - len(set(seqs)) for s, seqs in seen.items())
    duplicated = sum(len(seqs) - len(set(seqs)) for seqs in seen.values())
    out_of_order = sum(1 for seqs in seen.values() for a, b in itertools.pairwise(seqs) if b <= a)
    return FailoverResult(session_timeout_s, moved_shards, len(moved), survivor_times_s["assigned"],
                          survivor_times_s["served"],
                          sorted(first_ack_s.values()), sum(len(v) for v in seen.values()), lost, duplicated,
                          out_of_order)


# ----------------------------------------------------------------------------------------------------- report


def run_conditions() -> str:
    load1, load5, _ = os.getloadavg()
    return (f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), Python "
            f"{platform.python_version()}, load average before the run {load1:.2f} (1 min) / {load5:.2f} (5 min), "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def tables(saturated: list[LoadResult], paced: list[LoadResult], plain: ProducerResult,
           failovers: list[FailoverResult]) -> str:
    one = saturated[0]
    rows = []
    for r in saturated:
        split = " / ".join(f"{n:,}" for n in r.events_per_gateway)
        rows.append(
            f"| {r.gateways} gateway{'s' if r.gateways > 1 else ''} | {r.events_per_s:,.0f} | "
            f"{r.events_per_s / one.events_per_s:.2f}x | {r.events_per_s / plain.events_per_s:.2f} | "
            f"{percentile(r.added_us, 0.99) / 1e3:.1f} | {percentile(r.ack_ms, 0.5):.0f} | "
            f"{percentile(r.ack_ms, 0.99):.0f} | {r.cores_busy(r.gateway_cpu_s):.2f} | "
            f"{r.cores_busy(r.broker_cpu_s):.2f} | {r.cores_busy(r.loadgen_cpu_s):.2f} | "
            f"{r.us_per_event(r.gateway_cpu_s):.1f} | {r.us_per_event(r.broker_cpu_s):.1f} | {split} | "
            f"{r.late_events:,} |")
    rows.append(
        f"| plain producer | {plain.events_per_s:,.0f} | {plain.events_per_s / one.events_per_s:.2f}x | 1.00 | - | "
        f"{percentile(plain.delivery_ms, 0.5):.0f} | {percentile(plain.delivery_ms, 0.99):.0f} | "
        f"{plain.producer_cpu_s / plain.seconds:.2f} | {plain.broker_cpu_s / plain.seconds:.2f} | - | "
        f"{plain.producer_cpu_s * 1e6 / plain.events:.1f} | {plain.broker_cpu_s * 1e6 / plain.events:.1f} | - | - |")
    paced_rows = [
        f"| {r.gateways} | {r.events_per_s:,.0f} | {percentile(r.added_us, 0.5) / 1e3:.2f} | "
        f"{percentile(r.added_us, 0.99) / 1e3:.2f} | {max(r.added_us) / 1e3:.2f} | {percentile(r.ack_ms, 0.5):.0f} | "
        f"{percentile(r.ack_ms, 0.99):.0f} | {r.cores_busy(r.gateway_cpu_s):.2f} | "
        f"{r.cores_busy(r.broker_cpu_s):.2f} | {r.late_events} |" for r in paced]
    failover_rows = [
        f"| {f.session_timeout_s:.0f} | {f.moved_shards} | {f.moved_sources} | {f.assigned_s:.2f} | "
        f"{f.served_s:.2f} | {statistics.median(f.first_ack_s):.2f} | {max(f.first_ack_s):.2f} | {f.events:,} | "
        f"{f.lost} | {f.duplicated} | {f.out_of_order} |" for f in failovers]
    return "\n".join([
        "| writer | events/s | vs 1 gateway | of plain producer | added p99 (ms) | ack p50 (ms) | ack p99 (ms) | "
        "gateway cores | broker cores | load-gen cores | gateway CPU us/event | broker CPU us/event | "
        "events per gateway | late (diverted) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, "",
        "| gateways | events/s | added p50 (ms) | added p99 (ms) | added max (ms) | ack p50 (ms) | ack p99 (ms) | "
        "gateway cores | broker cores | late |",
        "|---|---|---|---|---|---|---|---|---|---|", *paced_rows, "",
        "| session timeout (s) | moved shards | moved sources | kill -> shards assigned (s) | "
        "kill -> shards served (s) | kill -> first ack p50 (s) | max (s) | events | lost | duplicated | "
        "out of order |",
        "|---|---|---|---|---|---|---|---|---|---|---|", *failover_rows])


def plot(saturated: list[LoadResult], paced: list[LoadResult], plain: ProducerResult,
         failovers: list[FailoverResult]) -> None:
    def label(r: LoadResult) -> str:
        return f"{r.gateways} gateway{'s' if r.gateways > 1 else ''}"

    draw([(label(r), r.events_per_s) for r in saturated] + [("plain producer", plain.events_per_s)],
         [(label(r), percentile(r.added_us, 0.99) / 1e3, percentile(r.ack_ms, 0.99)) for r in paced],
         paced[0].events_per_s,
         [(f.session_timeout_s, f.assigned_s, f.served_s, max(f.first_ack_s)) for f in failovers])


def plot_from_doc() -> None:
    """Re-draw the PNG from docs/cluster-benchmark.md's three tables (no broker, no re-run)."""
    text = (DOCS / "cluster-benchmark.md").read_text()
    tables: list[list[list[str]]] = []
    for block in text.split("\n\n"):
        lines = [line for line in block.splitlines() if line.startswith("| ")]  # header and rows, not |---|
        if len(lines) > 1:
            tables.append([[c.strip() for c in line.strip("|").split("|")] for line in lines[1:]])
    if len(tables) != 3:
        raise SystemExit(f"docs/cluster-benchmark.md: {len(tables)} tables, expected 3")
    saturated, paced, failovers = tables

    def number(cell: str) -> float:
        return float(cell.replace(",", ""))

    draw([(row[0], number(row[1])) for row in saturated],
         [(f"{row[0]} gateway{'s' if row[0] != '1' else ''}", number(row[3]), number(row[6])) for row in paced],
         number(paced[0][1]),
         [(number(row[0]), number(row[3]), number(row[4]), number(row[6])) for row in failovers])


def draw(throughput: list[tuple[str, float]], paced: list[tuple[str, float, float]], paced_rate: float,
         failovers: list[tuple[float, float, float, float]]) -> None:
    """throughput: (writer, events/s), the plain producer last; paced: (gateways, added p99 ms, ack p99 ms);
    failovers: (session timeout, kill -> assigned, kill -> served, kill -> last source's first ack), seconds."""
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(16, 5))
    labels = [writer for writer, _ in throughput]
    rates = [events_per_s / 1000 for _, events_per_s in throughput]
    ax1.bar(labels, rates, color=["tab:blue"] * (len(throughput) - 1) + ["tab:gray"])
    for x, rate in enumerate(rates):
        ax1.text(x, rate, f"{rate:.1f}k", ha="center", va="bottom")
    axis_labels(ax1, ("configuration", None), ("events acknowledged", "k events/s"))
    ax1.set_title("saturated, 20 sources (2 cores, broker included)")
    width = 0.35
    xs = range(len(paced))
    ax2.bar([x - width / 2 for x in xs], [added for _, added, _ in paced], width,
            label="added p99 (release - arrival)")
    ax2.bar([x + width / 2 for x in xs], [ack for _, _, ack in paced], width, label="ack p99 (sent -> ack)")
    ax2.set_xticks(list(xs), [gateways for gateways, _, _ in paced])
    axis_labels(ax2, ("configuration", None), ("99th percentile", "ms"))
    ax2.set_title(f"steady {paced_rate / 1000:.0f}k events/s, 20 sources")
    ax2.legend()
    for i, (timeout_s, assigned_s, served_s, first_ack_s) in enumerate(failovers):
        ax3.barh(i, assigned_s, color="tab:red", label="kill -> shards assigned" if i == 0 else None)
        ax3.barh(i, served_s - assigned_s, left=assigned_s, color="tab:orange",
                 label="recovery" if i == 0 else None)
        ax3.barh(i, first_ack_s - served_s, left=served_s, color="tab:green",
                 label="served -> last source's first ack" if i == 0 else None)
        ax3.axvline(timeout_s, color="gray", linestyle=":", ymin=i / len(failovers), ymax=(i + 1) / len(failovers))
    ax3.set_yticks(range(len(failovers)), [f"session {timeout_s:.0f} s" for timeout_s, *_ in failovers])
    axis_labels(ax3, ("time after SIGKILL", "s"), ("Kafka session timeout", None))
    ax3.set_title("failover (dotted: session timeout)")
    ax3.legend(loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    save(fig, DOCS / "cluster-benchmark.png")


# -------------------------------------------------------------------------------------------------------- main


async def run_all(bootstrap: str, broker_pid: int, args: argparse.Namespace, log_dir: Path,
                  advance: Callable[..., None] = lambda *_a, **_k: None) -> str:
    source_ids = balanced_source_ids(args.sources, args.shards)
    per_source = args.events // args.sources
    saturated, paced = [], []
    plain: ProducerResult | None = None
    loop = asyncio.get_running_loop()
    for gateways in (1, 2):
        result, topic = await gateway_load(bootstrap, broker_pid, gateways, args.shards, source_ids, log_dir,
                                           saturated_load(per_source, args.window), "sat")
        print(f"saturated {gateways} gateway(s): {result.events_per_s:,.0f} events/s, added p99 "
              f"{percentile(result.added_us, 0.99) / 1e3:.1f} ms, ack p50/p99 {percentile(result.ack_ms, 0.5):.0f}/"
              f"{percentile(result.ack_ms, 0.99):.0f} ms, cores gateway/broker/loadgen "
              f"{result.cores_busy(result.gateway_cpu_s):.2f}/{result.cores_busy(result.broker_cpu_s):.2f}/"
              f"{result.cores_busy(result.loadgen_cpu_s):.2f}, events per gateway {result.events_per_gateway}, "
              f"late {result.late_events}",
              flush=True)
        saturated.append(result)
        advance(description=f"saturated, {gateways} gateway(s)")
        if gateways == 1:
            plain = await loop.run_in_executor(None, plain_producer, bootstrap, broker_pid, topic, args.shards)
            print(f"plain producer: {plain.events_per_s:,.0f} events/s, delivery p50/p99 "
                  f"{percentile(plain.delivery_ms, 0.5):.0f}/{percentile(plain.delivery_ms, 0.99):.0f} ms, "
                  f"cores producer/broker {plain.producer_cpu_s / plain.seconds:.2f}/"
                  f"{plain.broker_cpu_s / plain.seconds:.2f}", flush=True)
            advance(description="plain producer")
    for gateways in (1, 2):
        result, _ = await gateway_load(bootstrap, broker_pid, gateways, args.shards, source_ids, log_dir,
                                       paced_load(args.paced_rate / args.sources, args.paced_s, 0.005), "paced")
        result.paced_s = args.paced_s
        print(f"paced {gateways} gateway(s) at {result.events_per_s:,.0f} events/s: added p50/p99/max "
              f"{percentile(result.added_us, 0.5) / 1e3:.2f}/{percentile(result.added_us, 0.99) / 1e3:.2f}/"
              f"{max(result.added_us) / 1e3:.2f} ms, ack p50/p99 {percentile(result.ack_ms, 0.5):.0f}/"
              f"{percentile(result.ack_ms, 0.99):.0f} ms", flush=True)
        paced.append(result)
        advance(description=f"paced, {gateways} gateway(s)")
    failovers = []
    for session_timeout_s in args.session_timeouts:
        failover = await failover_run(bootstrap, args.shards, source_ids, session_timeout_s, log_dir)
        print(f"failover, session timeout {session_timeout_s:.0f} s: shards {failover.moved_shards} assigned "
              f"{failover.assigned_s:.2f} s, served {failover.served_s:.2f} s, first ack p50/max "
              f"{statistics.median(failover.first_ack_s):.2f}/{max(failover.first_ack_s):.2f} s after the kill; "
              f"{failover.events} events, lost {failover.lost}, duplicated {failover.duplicated}, "
              f"out of order {failover.out_of_order}", flush=True)
        failovers.append(failover)
        advance(description=f"failover, session timeout {session_timeout_s:g} s")
    assert plain is not None
    plot(saturated, paced, plain, failovers)
    return tables(saturated, paced, plain, failovers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events per saturated run, all sources")
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--window", type=int, default=WINDOW_EVENTS, help="unacked events per source, saturated")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--paced-rate", type=float, default=10_000.0, help="events/s of the paced runs, all sources")
    parser.add_argument("--paced-s", type=float, default=5.0)
    parser.add_argument("--session-timeouts", type=float, nargs="+", default=[6.0, 10.0])
    parser.add_argument("--log-dir", type=Path, help="keep the gateways' logs here [a temporary directory]")
    args = parse_or_redraw(parser, lambda _args: plot_from_doc(),
                           "docs/cluster-benchmark.png from docs/cluster-benchmark.md")
    if args is None:
        return
    conditions = run_conditions()
    started = time.monotonic()
    # saturated x2, the plain producer, paced x2, one failover per session timeout
    steps = 5 + len(args.session_timeouts)
    bar = progress_bar("Kafka, then the runs", steps, enabled=progress_enabled(not args.no_progress))
    with tempfile.TemporaryDirectory() as tmp, bar as advance:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            log_dir = args.log_dir or Path(tmp)
            log_dir.mkdir(parents=True, exist_ok=True)
            report = asyncio.run(run_all(state.bootstrap_servers, state.pid, args, log_dir, advance))
        finally:
            broker.stop()
    load1_end, _, _ = os.getloadavg()
    # Load average counts runnable tasks (ours included): above 2 on 2 cores, other work competed with the run.
    print(f"\nrun conditions: {conditions}, {load1_end:.2f} (1 min) at the end; whole run "
          f"{time.monotonic() - started:.0f} s\n")
    print(report)


if __name__ == "__main__":
    main()
