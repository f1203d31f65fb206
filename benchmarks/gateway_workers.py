"""`skewless gateway --workers N` on this host: one gateway process against `--workers 2`, a plain producer as the
limit, the CPU per event of every process, and the scaling model those figures give (issue 26, target 4).

One broker (broker.launcher.KafkaBroker), in one run: (a) one gateway process (no --workers flag) and (b) `skewless
gateway --workers 2` (a parent that starts 2 worker processes of one cluster), both `--core native --shards S`
(default 4, so each worker of (b) serves S/2 shards; (a) serves all S in one process), transactions on and acks at
commits (the defaults), time sync off. After one discarded warm-up run of each (the broker's JIT), the
configurations alternate (a, b, a, b, ... --rounds times); after each
round one plain confluent-kafka producer replays that round's (a) records (same keys, values and partitions) into
the same broker: the limit of one Python writer here.

Load: 20 in-order raw-frame sources (benchmarks/gateway_cluster.py's saturated load: pre-encoded msgpack frames of
500 events, at most 2,000 unacked events per source, a heartbeat when blocked). Each source dials the worker that
owns its shard, read from every worker's /healthz once the shards are split evenly; a hello the gateway still
redirects is followed and counted. A run ends when every source holds the ack of its last event; then the events
and late topics are read back and every event must be there exactly once (none lost, none duplicated).

CPU: user + system seconds from /proc, before and after the load, of the gateway's whole process tree (the parent
and every descendant: the workers), of the first thread of each of them, of the broker's JVM and of this process
(the load generator); from /proc/stat, the machine's busy time, so what other tenants took shows too.

Writes docs/gateway-workers.md, docs/gateway-workers.png and docs/gateway-workers.json (the figures; the page can
be rewritten from it with --report-from-saved).

Run: .venv/bin/python -m benchmarks.gateway_workers [--events 200000] [--rounds 3] [--shards 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import tempfile
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from benchmarks.gateway_cluster import (
    STREAM,
    WINDOW_EVENTS,
    Connection,
    balanced_source_ids,
    open_source,
    plain_producer,
    saturated_load,
)
from benchmarks.gateway_throughput import load_averages
from benchmarks.harness.processes import (
    CLK_TCK,
    cpu_s,
    http_get_json,
    machine_cpu_s,
    parents_now,
    process_tree,
    read_delivery,
    stat_cpu_ticks,
)
from benchmarks.harness.stats import percentile
from benchmarks.plotstyle import axis_labels, pyplot, save
from broker.launcher import KafkaBroker
from contract.sharding import shard_of
from contract.topics import TopicNames
from gateway.launch import GatewayAddresses, ReadyLineParser, gateway_command
from reorder.eval.progress import progress_bar, progress_enabled

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGE = DOCS / "gateway-workers.md"
FIGURE = DOCS / "gateway-workers.png"
RESULTS = DOCS / "gateway-workers.json"
READY_TIMEOUT_S = 90.0
BALANCE_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
WORKER_PREFIX = "worker "
# A run during which other processes kept fewer cores than this busy counts as having the machine to itself.
# The machine idle at least this many cores during the worker runs: their rate was not bound by the CPU.
IDLE_CORES = 0.5
QUIET_CORES = 0.3


# ------------------------------------------------------------------------------------- pure helpers (tested)


def shard_owners(serving: Sequence[Collection[int]], shards: int) -> dict[int, int]:
    """shard -> index of the worker serving it, from each worker's /healthz ``serving_shards`` (in worker order).
    ValueError unless every shard is served by exactly one worker."""
    owners: dict[int, int] = {}
    for worker, served in enumerate(serving):
        for shard in served:
            if shard in owners:
                raise ValueError(f"shard {shard} served by workers {owners[shard]} and {worker}")
            if not 0 <= shard < shards:
                raise ValueError(f"worker {worker} serves shard {shard}, outside 0..{shards - 1}")
            owners[shard] = worker
    missing = sorted(set(range(shards)) - set(owners))
    if missing:
        raise ValueError(f"shards {missing} served by no worker")
    return owners


def evenly_split(owners: Mapping[int, int], workers: int) -> bool:
    """Every worker serves shards / workers of them (what the group settles to; before that one may hold more)."""
    counts = [list(owners.values()).count(w) for w in range(workers)]
    return max(counts) - min(counts) <= 1


def route_sources(source_ids: Sequence[str], shards: int, owners: Mapping[int, int]) -> dict[str, int]:
    """source id -> index of the worker that owns its shard (contract.sharding.shard_of): the worker it must dial."""
    return {source_id: owners[shard_of(source_id, shards)] for source_id in source_ids}


def host_throughput_bound(cores: float, us_per_event: Sequence[float]) -> float:
    """Events/s ``cores`` CPUs can carry when each event costs the sum of ``us_per_event`` of CPU (gateway, broker,
    load generator sharing the host), assuming that work spreads over every core: cores x 1e6 / sum."""
    return cores * 1e6 / sum(us_per_event)


# ----------------------------------------------------------------------------------------------- /proc readings


def main_thread_cpu_s(pid: int) -> float:
    """The CPU of the process's first thread alone: in a gateway, the asyncio loop that runs the per-event work
    (librdkafka's threads are the others)."""
    return stat_cpu_ticks(Path(f"/proc/{pid}/task/{pid}/stat").read_text()) / CLK_TCK


def command_name(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


# --------------------------------------------------------------------------------------------- the gateways


@dataclass
class Gateway:
    """`skewless gateway [--workers N]` as one process tree: the process started here and its workers' addresses
    (for one process without --workers: its own, as worker 0)."""

    process: asyncio.subprocess.Process
    workers: list[GatewayAddresses]
    drainer: asyncio.Task[None] | None = None

    async def health(self, worker: int) -> dict[str, Any]:
        address = self.workers[worker]
        assert address.metrics_host is not None and address.metrics_port is not None
        status, body = await http_get_json(address.metrics_host, address.metrics_port, "/healthz")
        assert status in (200, 503), (status, body)
        return body

    async def stop(self) -> None:
        """SIGTERM to the process started here (the --workers parent forwards it to its workers)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await self.process.wait()
            except TimeoutError:
                self.process.kill()
                await self.process.wait()
        if self.drainer is not None:
            self.drainer.cancel()


async def start_gateway(bootstrap: str, prefix: str, workers: int, shards: int, core: str, log: Path) -> Gateway:
    """Start the gateway and read its ready lines: with --workers N, every worker's lines come prefixed with
    `worker i ` before the parent's own ready line (skewless/cli_gateway.py, run_workers)."""
    args = ["--port", "0", "--metrics-port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix,
            "--shards", str(shards), "--core", core]
    if workers > 1:
        args += ["--workers", str(workers)]
    with log.open("ab") as stderr:
        process = await asyncio.create_subprocess_exec(
            *gateway_command(args), stdout=asyncio.subprocess.PIPE, stderr=stderr, stdin=asyncio.subprocess.DEVNULL)
    assert process.stdout is not None
    parsers: dict[int, ReadyLineParser] = {}
    found: dict[int, GatewayAddresses] = {}
    own = ReadyLineParser()
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            while line := (await process.stdout.readline()).decode(errors="replace"):
                if line.startswith(WORKER_PREFIX):
                    index_text, _, rest = line.removeprefix(WORKER_PREFIX).partition(" ")
                    parsed = parsers.setdefault(int(index_text), ReadyLineParser()).feed(rest)
                    if parsed is not None:
                        found[int(index_text)] = parsed
                elif (parsed := own.feed(line)) is not None:
                    if workers == 1:
                        found[0] = parsed
                    break
    except TimeoutError:
        process.kill()
        await process.wait()
        raise RuntimeError(f"no ready line within {READY_TIMEOUT_S} s; see {log}") from None
    if sorted(found) != list(range(workers)):
        process.kill()
        await process.wait()
        raise RuntimeError(f"ready lines of workers {sorted(found)}, expected {workers}; see {log}")
    gateway = Gateway(process, [found[i] for i in range(workers)])
    gateway.drainer = asyncio.get_running_loop().create_task(drain(process))
    return gateway


async def drain(process: asyncio.subprocess.Process) -> None:
    """Keep reading the gateway's stdout so it never blocks on a full pipe."""
    assert process.stdout is not None
    while await process.stdout.readline():
        pass


async def settled_owners(gateway: Gateway, shards: int) -> tuple[dict[int, int], list[int]]:
    """Once every shard is served by one worker and the workers split them evenly: shard -> worker, and each
    worker's pid (from its /healthz)."""
    async with asyncio.timeout(BALANCE_TIMEOUT_S):
        while True:
            states = [await gateway.health(i) for i in range(len(gateway.workers))]
            try:
                owners = shard_owners([s["serving_shards"] for s in states], shards)
            except ValueError:
                owners = {}
            if owners and evenly_split(owners, len(gateway.workers)):
                return owners, [int(s["pid"]) for s in states]
            await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------------------------------- runs


@dataclass
class WorkersRun:
    label: str
    workers: int
    round: int
    events: int
    seconds: float
    gateway_cpu_s: float  # the whole tree: the process started here and every descendant
    process_cpu_s: dict[str, float]  # per process of the tree: "parent" (with --workers), "worker i"
    main_thread_cpu_s: float  # the first thread of every process of the tree, summed
    machine_cpu_s: float  # every core of the machine busy, all processes (ours and other tenants')
    broker_cpu_s: float
    loadgen_cpu_s: float
    ack_p50_ms: float
    ack_p99_ms: float
    late: int
    redirects: int
    events_per_worker: list[int]
    load_start: list[float]
    load_end: list[float]
    topic: str = ""

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds

    def us_per_event(self, seconds: float) -> float:
        return seconds * 1e6 / self.events

    def cores(self, seconds: float) -> float:
        return seconds / self.seconds

    @property
    def others_cpu_s(self) -> float:
        """What the machine's cores were busy with besides the gateway, the broker and the load generator."""
        return self.machine_cpu_s - self.gateway_cpu_s - self.broker_cpu_s - self.loadgen_cpu_s


@dataclass
class PlainRun:
    round: int
    events: int
    seconds: float
    producer_cpu_s: float
    broker_cpu_s: float
    delivery_p50_ms: float
    delivery_p99_ms: float
    load_start: list[float] = field(default_factory=list)

    @property
    def events_per_s(self) -> float:
        return self.events / self.seconds


def label_of(workers: int) -> str:
    return "1 process" if workers == 1 else f"--workers {workers}"


async def gateway_run(bootstrap: str, broker_pid: int, workers: int, shards: int, core: str, source_ids: list[str],
                      per_source: int, round_: int, log_dir: Path) -> WorkersRun:
    prefix = f"workers{workers}r{round_}x{time.time_ns()}"
    load_start = load_averages()
    gateway = await start_gateway(bootstrap, prefix, workers, shards, core, log_dir / f"{prefix}.log")
    ack_ms: list[float] = []
    try:
        owners, worker_pids = await settled_owners(gateway, shards)
        routes = route_sources(source_ids, shards, owners)
        addresses = [(a.host, a.port) for a in gateway.workers]
        opened = await asyncio.gather(*(open_source([addresses[routes[s]]], s) for s in source_ids))
        connections: list[Connection] = [c for c, _ in opened]
        redirects = sum(target != addresses[routes[s]] for s, (_, target) in zip(source_ids, opened, strict=True))
        tree = process_tree(gateway.process.pid, parents_now())
        if sorted(set(tree) - {gateway.process.pid}) != sorted(set(worker_pids) - {gateway.process.pid}):
            raise RuntimeError(f"process tree {tree} is not the parent and the workers {worker_pids}")
        cpu0 = {pid: cpu_s(pid) for pid in tree}
        main0 = sum(main_thread_cpu_s(pid) for pid in tree)
        broker0, loadgen0, machine0 = cpu_s(broker_pid), time.process_time(), machine_cpu_s()[0]
        started = time.perf_counter()
        events = await saturated_load(per_source, WINDOW_EVENTS)(connections, ack_ms)
        seconds = time.perf_counter() - started
        machine_cpu = machine_cpu_s()[0] - machine0
        cpu1 = {pid: cpu_s(pid) for pid in tree}
        main_cpu = sum(main_thread_cpu_s(pid) for pid in tree) - main0
        broker_cpu, loadgen_cpu = cpu_s(broker_pid) - broker0, time.process_time() - loadgen0
        # A worker that died mid-run would have been restarted by the parent: its CPU would be missing here.
        if process_tree(gateway.process.pid, parents_now()) != tree:
            raise RuntimeError("the gateway's process tree changed during the run (a worker restarted?)")
    finally:
        await gateway.stop()
    names = {pid: "parent" if pid not in worker_pids else "one process" if workers == 1
             else f"worker {worker_pids.index(pid)}" for pid in tree}
    per_process = {names[pid]: cpu1[pid] - cpu0[pid] for pid in tree}
    loop = asyncio.get_running_loop()
    delivery = await loop.run_in_executor(None, read_delivery, bootstrap, prefix, STREAM)
    summary = delivery.summary({s: per_source for s in source_ids})
    if summary["lost"] or summary["duplicated"] or len(delivery.events) + len(delivery.late) != events:
        raise RuntimeError(f"{label_of(workers)}: not every acked event is in Kafka exactly once: {summary}")
    return WorkersRun(label_of(workers), workers, round_, events, seconds, sum(per_process.values()), per_process,
                      main_cpu, machine_cpu, broker_cpu, loadgen_cpu, percentile(ack_ms, 0.5), percentile(ack_ms, 0.99), len(delivery.late),
                      redirects, [list(routes.values()).count(w) * per_source for w in range(workers)], load_start,
                      load_averages(), TopicNames(prefix).events(STREAM))


def plain_run(bootstrap: str, broker_pid: int, topic: str, shards: int, round_: int) -> PlainRun:
    load_start = load_averages()
    result = plain_producer(bootstrap, broker_pid, topic, shards)
    return PlainRun(round_, result.events, result.seconds, result.producer_cpu_s, result.broker_cpu_s,
                    percentile(result.delivery_ms, 0.5), percentile(result.delivery_ms, 0.99), load_start)


def describe(run: WorkersRun) -> str:
    per_process = ", ".join(f"{name} {run.cores(s):.2f}" for name, s in run.process_cpu_s.items())
    return (f"round {run.round} {run.label:>11}: {run.events_per_s:>8,.0f} events/s, gateway "
            f"{run.us_per_event(run.gateway_cpu_s):.1f} us/event ({run.cores(run.gateway_cpu_s):.2f} cores: "
            f"{per_process}; main threads {run.us_per_event(run.main_thread_cpu_s):.1f} us/event), broker {run.us_per_event(run.broker_cpu_s):.1f} us/event "
            f"({run.cores(run.broker_cpu_s):.2f} cores), load generator {run.us_per_event(run.loadgen_cpu_s):.1f} "
            f"us/event, other processes {run.cores(run.others_cpu_s):.2f} cores, ack p50/p99 {run.ack_p50_ms:.0f}/{run.ack_p99_ms:.0f} ms, late {run.late}, redirects "
            f"{run.redirects}, load {run.load_start} -> {run.load_end}")


# -------------------------------------------------------------------------------------------------- report


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


@dataclass
class Summary:
    """One configuration, its rounds averaged (every figure a ratio of sums would weigh the rounds by length; the
    rounds are of equal events, so the plain mean is that)."""

    label: str
    runs: int
    events_per_s: float
    gateway_us: float
    main_thread_us: float
    broker_us: float
    loadgen_us: float
    gateway_cores: float
    broker_cores: float
    others_cores: float

    @property
    def per_gateway_core(self) -> float:
        return 1e6 / self.gateway_us


def summarize(runs: Sequence[WorkersRun]) -> list[Summary]:
    out = []
    for label in dict.fromkeys(r.label for r in runs):
        rows = [r for r in runs if r.label == label]
        out.append(Summary(label, len(rows), mean([r.events_per_s for r in rows]),
                           mean([r.us_per_event(r.gateway_cpu_s) for r in rows]),
                           mean([r.us_per_event(r.main_thread_cpu_s) for r in rows]),
                           mean([r.us_per_event(r.broker_cpu_s) for r in rows]),
                           mean([r.us_per_event(r.loadgen_cpu_s) for r in rows]),
                           mean([r.cores(r.gateway_cpu_s) for r in rows]),
                           mean([r.cores(r.broker_cpu_s) for r in rows]),
                           mean([r.cores(r.others_cpu_s) for r in rows])))
    return out


def plot(runs: Sequence[WorkersRun], plain: Sequence[PlainRun]) -> None:
    plt = pyplot()
    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(17, 5), gridspec_kw={"width_ratios": [3, 2.2, 1.6]})
    short = {1: "1 proc"}
    ordered: list[tuple[str, float, str]] = []  # (label, k events/s, color) in the order the runs ran
    for round_ in dict.fromkeys(r.round for r in runs):
        ordered += [(f"{short.get(r.workers, f'w{r.workers}')}\nr{r.round}", r.events_per_s / 1000,
                     "tab:blue" if r.workers == 1 else "tab:green") for r in runs if r.round == round_]
        ordered += [(f"plain\nr{p.round}", p.events_per_s / 1000, "tab:gray") for p in plain if p.round == round_]
    xs = range(len(ordered))
    ax1.bar(xs, [rate for _, rate, _ in ordered], color=[color for *_, color in ordered])
    for x, (_, rate, _) in enumerate(ordered):
        ax1.text(x, rate, f"{rate:.0f}k", ha="center", va="bottom", fontsize=8)
    ax1.set_xticks(list(xs), [name for name, _, _ in ordered])
    axis_labels(ax1, ("run in the order it ran (blue: 1 process, green: --workers 2, gray: plain producer)", None),
                ("events acknowledged", "k events/s"))
    ax1.set_title("20 sources, saturated, transactions on")
    names = [f"{short.get(r.workers, f'w{r.workers}')}\nr{r.round}" for r in runs]
    parts = [("gateway (all processes)", "tab:blue", [r.cores(r.gateway_cpu_s) for r in runs]),
             ("broker JVM", "tab:orange", [r.cores(r.broker_cpu_s) for r in runs]),
             ("load generator", "tab:purple", [r.cores(r.loadgen_cpu_s) for r in runs]),
             ("other processes", "lightgray", [max(0.0, r.cores(r.others_cpu_s)) for r in runs])]
    bottom = [0.0] * len(runs)
    for label, color, values in parts:
        ax2.bar(names, values, bottom=bottom, color=color, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax2.axhline(2.0, color="red", linestyle="--", lw=1, label="the machine's 2 cores")
    axis_labels(ax2, ("gateway run", None), ("CPU busy during the load", "cores"))
    ax2.set_title("where the 2 cores went")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, fontsize=7.5)
    summaries = summarize(runs)
    labels = [short.get(1) if s.label == label_of(1) else s.label for s in summaries] + ["plain"]
    gateway = [s.gateway_us for s in summaries] + [mean([p.producer_cpu_s * 1e6 / p.events for p in plain])]
    broker = [s.broker_us for s in summaries] + [mean([p.broker_cpu_s * 1e6 / p.events for p in plain])]
    loadgen = [s.loadgen_us for s in summaries] + [0.0]
    ax3.bar(labels, gateway, color="tab:blue", label="gateway / producer")
    ax3.bar(labels, broker, bottom=gateway, color="tab:orange", label="broker JVM")
    ax3.bar(labels, loadgen, bottom=[g + b for g, b in zip(gateway, broker, strict=True)], color="tab:purple",
            label="load generator")
    axis_labels(ax3, ("configuration (mean of its rounds)", None), ("CPU per event", "us"))
    ax3.set_title("CPU per acknowledged event")
    ax3.legend(fontsize=7.5)
    save(fig, FIGURE)


def why_second_worker(runs: Sequence[WorkersRun], one: Summary, many: Summary, idle_cores: float,
                      cores: int) -> str:
    """The page's reason for what the second worker bought: the CPU it found, or, when the machine had CPU to spare
    during the worker runs, that the rate was not CPU-bound."""
    if idle_cores < IDLE_CORES:
        return (f" Why: a worker turns into throughput only CPU that nobody else takes. During the {many.label} runs "
                f"other processes held {many.others_cores:.2f} of the {cores} cores and the machine was idle "
                f"{idle_cores:.2f} cores; the broker took {many.broker_cores:.2f}. The gateway got "
                f"{one.gateway_cores:.2f} cores as one process and {many.gateway_cores:.2f} as two workers "
                f"({many.gateway_cores - one.gateway_cores:+.2f}): that difference, not a second core, is what the "
                "second worker bought on this machine.")
    main_cores = many.main_thread_us * many.events_per_s / 1e6
    ack_p50_ms = mean([r.ack_p50_ms for r in runs if r.label == many.label])
    return (f" Why so little: not the CPU. During the {many.label} runs the machine was idle {idle_cores:.2f} of its "
            f"{cores} cores and the workers' main threads were on a CPU {main_cores:.2f} of the wall together; the "
            f"gateway got {one.gateway_cores:.2f} cores as one process and {many.gateway_cores:.2f} as two workers. "
            f"What held the rate is the load (not measured apart here): each source keeps at most "
            f"{WINDOW_EVENTS:,} events unacknowledged, and an event's ack waits for the merge (which releases it "
            "once every source of its shard has sent something newer) and for its commit (every 100 ms); the "
            f"sources' ack p50 was {ack_p50_ms:,.0f} ms. So this run gives the CPU per event of the model below, "
            "not what a second worker buys where the gateway is CPU-bound.")


def write_report(runs: Sequence[WorkersRun], plain: Sequence[PlainRun], meta: Mapping[str, Any]) -> None:
    summaries = summarize(runs)
    cores = int(meta["cores"])
    idle = {s.label: mean([cores - r.cores(r.machine_cpu_s) for r in runs if r.label == s.label]) for s in summaries}
    one = next(s for s in summaries if s.label == label_of(1))
    many = next((s for s in summaries if s is not one), one)
    plain_rate = mean([p.events_per_s for p in plain])
    plain_us = mean([p.producer_cpu_s * 1e6 / p.events for p in plain])
    plain_broker_us = mean([p.broker_cpu_s * 1e6 / p.events for p in plain])

    def loads(values: Sequence[float]) -> str:
        return "/".join(f"{x:.2f}" for x in values)

    run_rows = "\n".join(
        f"| {r.round} | {r.label} | {r.events:,} | {r.events_per_s:,.0f} | {r.events_per_s / plain_rate:.2f}x | "
        f"{r.us_per_event(r.gateway_cpu_s):.1f} | {r.us_per_event(r.main_thread_cpu_s):.1f} | "
        f"{r.cores(r.gateway_cpu_s):.2f} (" + ", ".join(f"{name} {r.cores(s):.2f}" for name, s in r.process_cpu_s.items())
        + f") | {r.us_per_event(r.broker_cpu_s):.1f} | {r.cores(r.broker_cpu_s):.2f} | "
        f"{r.us_per_event(r.loadgen_cpu_s):.1f} | {r.cores(r.loadgen_cpu_s):.2f} | {r.cores(r.others_cpu_s):.2f} | "
        f"{r.ack_p50_ms:,.0f} / {r.ack_p99_ms:,.0f} | {' / '.join(f'{n:,}' for n in r.events_per_worker)} | "
        f"{r.redirects} | {r.late} | {loads(r.load_start)} |" for r in runs)
    plain_rows = "\n".join(
        f"| {p.round} | {p.events:,} | {p.events_per_s:,.0f} | {p.producer_cpu_s * 1e6 / p.events:.2f} | "
        f"{p.producer_cpu_s / p.seconds:.2f} | {p.broker_cpu_s * 1e6 / p.events:.2f} | "
        f"{p.broker_cpu_s / p.seconds:.2f} | {p.delivery_p50_ms:.0f} / {p.delivery_p99_ms:.0f} | "
        f"{loads(p.load_start)} |" for p in plain)
    summary_rows = "\n".join(
        f"| {s.label} | {s.runs} | {s.events_per_s:,.0f} | {s.events_per_s / one.events_per_s:.2f}x | "
        f"{s.events_per_s / plain_rate:.2f}x | {s.gateway_us:.1f} | {s.per_gateway_core:,.0f} | "
        f"{s.main_thread_us:.1f} | {s.broker_us:.1f} | {s.loadgen_us:.1f} | {s.gateway_cores:.2f} | "
        f"{s.broker_cores:.2f} | {s.others_cores:.2f} | {idle[s.label]:.2f} | "
        f"{host_throughput_bound(cores, [s.gateway_us, s.broker_us, s.loadgen_us]):,.0f} |" for s in summaries)
    this = run_summary(meta, runs)
    listed = sorted([*meta.get("other_runs", []), this], key=lambda o: str(o["when"]))

    def pooled(key: str) -> float:
        """The model's constants: the mean over every run listed (this one alone without --other-runs)."""
        return mean([float(o[key]) for o in listed])
    g_us, m_us, b_us, l_us = (pooled("many_gateway_us"), pooled("many_main_us"), pooled("many_broker_us"),
                              pooled("many_loadgen_us"))
    g1_us, m1_us, b1_us = pooled("one_gateway_us"), pooled("one_main_us"), pooled("one_broker_us")
    constants_from = ("the means of its rounds" if len(listed) == 1 else
                      f"the mean over the {len(listed)} runs above, each the mean of its rounds")
    total_us = g_us + b_us + l_us
    model_rows = "\n".join(
        f"| {c} | {host_throughput_bound(c, [g_us, b_us, l_us]):,.0f} | {host_throughput_bound(c, [g_us]):,.0f} | "
        f"{host_throughput_bound(c, [m_us]):,.0f} | {host_throughput_bound(c, [b_us]):,.0f} |" for c in (2, 4, 8, 16, 32))
    by_label: dict[str, list[WorkersRun]] = {}
    for r in runs:
        by_label.setdefault(r.label, []).append(r)
    spread_text = "; ".join(f"{label} {min(r.events_per_s for r in rows):,.0f} to {max(r.events_per_s for r in rows):,.0f}"
                            for label, rows in by_label.items())
    pairs = [(a, b) for a in by_label[one.label] for b in by_label.get(many.label, []) if a.round == b.round]
    pair_text = ", ".join(f"round {a.round} {b.events_per_s / a.events_per_s:.2f}x" for a, b in pairs)
    starved = [r for r in runs if r.cores(r.others_cpu_s) >= QUIET_CORES]
    starved_text = ("" if not starved else f" Runs during which other processes kept {QUIET_CORES} cores or more busy: "
                    + ", ".join(f"round {r.round} {r.label} ({r.cores(r.others_cpu_s):.2f} cores)" for r in starved)
                    + ".")
    bound_all = host_throughput_bound(cores, [g_us, b_us, l_us])
    also = "" if len(listed) == 1 else f" ({len(listed) - 1} more runs are summed up further down)"
    other_rows = "\n".join(
        f"| {o['when']}{' (this page)' if o is this else ''} | {o['commit']} | {o['rounds']} | "
        f"{o['one_events_per_s']:,.0f} | {o['many_events_per_s']:,.0f} | "
        f"{o['many_events_per_s'] / o['one_events_per_s']:.2f}x | "
        + ", ".join(f"{x:.2f}x" for x in o["ratios"])
        + f" | {o['one_gateway_us']:.1f} / {o['many_gateway_us']:.1f} | {o['one_broker_us']:.1f} / "
        f"{o['many_broker_us']:.1f} | {o['one_others_cores']:.2f} / {o['many_others_cores']:.2f} |" for o in listed)
    other_section = "" if not meta.get("other_runs") else f"""## This page's run among the other runs of the day

The same script with the same settings, run {len(listed)} times on this machine on the same day (code at the
commits listed: the measurement was the same in all of them; only the page's prose changed). This page shows
one of them in full, the one marked (the latest when the page was first written, not chosen by its figures);
all of them side by side (each "1 process / {many.label}"):

| run (UTC) | commit | rounds | 1 process events/s | {many.label} events/s | ratio of means | ratio round by round | gateway CPU us/event | broker CPU us/event | other processes, cores |
|---|---|---|---|---|---|---|---|---|---|
{other_rows}

Over all {len(listed)} runs, {many.label} was faster in {sum(x > 1 for o in listed for x in o["ratios"])} of
{sum(len(o["ratios"]) for o in listed)} rounds; the mean of the runs' mean events/s was
{mean([o["one_events_per_s"] for o in listed]):,.0f} for 1 process and
{mean([o["many_events_per_s"] for o in listed]):,.0f} for {many.label}
({mean([o["many_events_per_s"] for o in listed]) / mean([o["one_events_per_s"] for o in listed]):.2f}x). Other
processes held {min(min(o["one_others_cores"], o["many_others_cores"]) for o in listed):.2f} to
{max(max(o["one_others_cores"], o["many_others_cores"]) for o in listed):.2f} cores on average over a
configuration's rounds in these runs.

"""
    gain = many.events_per_s / one.events_per_s
    ratios = [b.events_per_s / a.events_per_s for a, b in pairs]
    spread = f"{min(ratios):.2f}x to {max(ratios):.2f}x" if ratios else ""
    quiet = [(a, b) for a, b in pairs if max(a.cores(a.others_cpu_s), b.cores(b.others_cpu_s)) < QUIET_CORES]
    quiet_text = (
        f" In the rounds where other processes held less than {QUIET_CORES} cores in both runs: " + "; ".join(
            f"round {a.round}, {b.events_per_s / a.events_per_s:.2f}x ({a.events_per_s:,.0f} -> "
            f"{b.events_per_s:,.0f} events/s, gateway cores {a.cores(a.gateway_cpu_s):.2f} -> "
            f"{b.cores(b.gateway_cpu_s):.2f})" for a, b in quiet) + "." if quiet else
        f" No round had the machine to itself (other processes held at least {QUIET_CORES} cores during one of its "
        "runs or both), so this page does not show what a second worker buys on 2 otherwise idle cores.")
    alone = [r for r in runs if r.cores(r.others_cpu_s) < QUIET_CORES]
    if alone and not quiet:
        quiet_text += (f" Single runs during which other processes held less than {QUIET_CORES} cores: " + "; ".join(
            f"round {r.round} {r.label}, {r.events_per_s:,.0f} events/s with the gateway on "
            f"{r.cores(r.gateway_cpu_s):.2f} cores" for r in alone) + ".")
    why_text = why_second_worker(runs, one, many, idle[many.label], cores)
    verdict = ("" if not ratios else f" It was faster in every round ({spread} round by round)." if min(ratios) > 1
               else f" It was slower in every round ({spread})." if max(ratios) < 1
               else f" Round by round the ratio ranged from {spread} (faster in {sum(x > 1 for x in ratios)} of "
               f"{len(ratios)} rounds): the rounds disagree, so the mean is no steady figure.")
    PAGE.write_text(f"""# `skewless gateway --workers N` on this machine, and the scaling model

Generated by `benchmarks/gateway_workers.py` (issue 26, target 4). The run shown in full{also}: {meta['when']}, {meta['machine']},
code at commit {meta['commit']}. Load average (1/5/15 min) {loads(meta['load_start'])} when the run started and
{loads(meta['load_end'])} when it ended (2.00 = both cores busy): the machine is shared with other engineers'
work, and the "other processes" column below says how many cores it took during each run.

**This host has 2 cores, and the broker, the load generator and the gateway's workers all share them.** A second
worker can only bring a core that the broker, the load generator and other tenants already use in part; what it
buys here is not what it buys on a host with a core per worker.

What ran, in this order per round (a, b, plain; {meta['rounds']} rounds), against the same broker (one KRaft
node, `broker.launcher.KafkaBroker`), after a discarded warm-up round (one run of each gateway, {meta['warmup_events']:,}
events each) that lets the broker's JIT settle:

- **1 process**: `skewless gateway --core {meta['core']} --shards {meta['shards']}` (no `--workers` flag; one
  process serves all {meta['shards']} shards);
- **--workers 2**: `skewless gateway --workers 2 --core {meta['core']} --shards {meta['shards']}`, a parent
  process that starts 2 worker processes of one cluster (they split the shards through Kafka's group protocol; the
  run starts once each worker's /healthz shows an even split);
- **plain producer**: one confluent-kafka producer with broker.client's settings (acks=all, idempotence, lz4,
  linger 2 ms; no transactions) replays the round's 1-process records (same keys, values, partitions) from one
  Python thread: the limit of one writer process here.

Both gateways: transactions on (commit every 100 ms, acks at commits), time sync off. Load: {meta['sources']}
in-order raw-frame sources ({meta['events']:,} events per run, batches of 500, at most {WINDOW_EVENTS:,} unacked
per source, a heartbeat when blocked: the saturated load of `benchmarks/gateway_cluster.py`), source ids chosen
so every shard has the same number of sources. Each source dials the worker that owns its shard, read from every
worker's /healthz ("redirects": hellos the gateway still redirected, followed). A run ends when every source
holds the ack of its last event; the events and late topics are then read back (read_committed) and every event
must be there exactly once, none lost or duplicated: this held for every run below.

CPU is user + system time from /proc over the load (first send to last ack). "gateway" sums every process of the
gateway's tree (the `--workers` parent and each worker, found by parent pid; a run whose tree changed is
rejected); "main threads" is the first thread of each of those processes (the asyncio loop that runs the
per-event work; the other threads are librdkafka's); "broker" is the broker's JVM ({meta['broker_comm']}, pid
from the launcher); "load gen" is this benchmark's own process; "other processes" is the machine's busy time
(/proc/stat) less those three. "us/event" = CPU seconds x 1e6 / events; "cores" = CPU seconds / wall seconds.

## Every run

| round | gateway | events | events/s | of plain producer | gateway CPU us/event | main threads us/event | gateway cores (per process) | broker CPU us/event | broker cores | load gen CPU us/event | load gen cores | other processes, cores | ack p50 / p99 (ms) | events per worker | redirects | late | load avg at start |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{run_rows}

| round | plain producer records | events/s | producer CPU us/record | producer cores | broker CPU us/record | broker cores | delivery p50 / p99 (ms) | load avg at start |
|---|---|---|---|---|---|---|---|---|
{plain_rows}

![events/s of every run and CPU per event by process](gateway-workers.png)

## Per configuration (mean of its rounds)

| gateway | rounds | events/s | vs 1 process | of plain producer | gateway CPU us/event | events/s per gateway core (1e6 / us) | main threads us/event | broker CPU us/event | load gen CPU us/event | gateway cores | broker cores | other processes, cores | idle, cores | bound of {cores} cores: {cores}e6 / (gateway + broker + load gen us) |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{summary_rows}

Spread over the rounds (events/s, min to max): {spread_text}. --workers 2 over 1 process, round by round:
{pair_text}.{starved_text} The plain producer: {plain_rate:,.0f} records/s on average, {plain_us:.2f} us of
producer CPU and {plain_broker_us:.2f} us of broker CPU per record (no transactions).

**What a second worker bought in this run.** {many.label} carried {gain:.2f}x the events/s of one process on average
({many.events_per_s:,.0f} against {one.events_per_s:,.0f}), at {many.gateway_us / one.gateway_us:.2f}x the
gateway CPU per event ({many.gateway_us:.1f} against {one.gateway_us:.1f} us, all processes summed).{verdict}{why_text}{quiet_text}

{other_section}## Scaling model (from the measured figures only)

Per acknowledged event, with {many.label} ({constants_from}): gateway **{g_us:.1f} us** of CPU (all its
processes; of which {m_us:.1f} us in the workers' main threads), broker **{b_us:.1f} us** (one node, transactions
on: commit markers and the transaction coordinator included), load generator **{l_us:.1f} us** (pre-encoded
frames; real sources cost their own hosts more). Hence:

- events/s per gateway core = 1e6 / gateway us = 1e6 / {g_us:.1f} = **{1e6 / g_us:,.0f}** (one process:
  1e6 / {g1_us:.1f} = {1e6 / g1_us:,.0f});
- events/s per broker core = 1e6 / broker us = 1e6 / {b_us:.1f} = **{1e6 / b_us:,.0f}**;
- one worker cannot carry more than 1e6 / main-thread us per event, however many cores the host has (its
  asyncio loop is one thread): 1e6 / {m1_us:.1f} = {1e6 / m1_us:,.0f} events/s for the
  1-process runs, so W workers carry at most W times that.

On one host of C cores that runs everything (this machine: C = 2):

    throughput <= C x 1e6 / (gateway_us + broker_us + loadgen_us) = C x 1e6 / {total_us:.1f} us

With the gateway on its own host of C cores (broker and sources elsewhere, C workers):

    throughput <= min(C x 1e6 / gateway_us, C x 1e6 / main_thread_us, broker cores x 1e6 / broker_us)

| C (cores) | all on one host: C x 1e6 / {total_us:.1f} | gateway host alone: C x 1e6 / {g_us:.1f} | C workers' main threads: C x 1e6 / {m_us:.1f} | broker alone: C x 1e6 / {b_us:.1f} |
|---|---|---|---|---|
{model_rows}

At C = {cores} the first column is the bound of this machine: {bound_all:,.0f} events/s for {many.label}, of
which the runs reached {pooled("many_events_per_s") / bound_all:.0%} on average, with other processes holding
{pooled("many_others_cores"):.2f} cores. (Checking the formula against the same runs' events/s at C = {cores}
would be circular: us per event are CPU seconds over the events of those very runs.) What the runs do test is
the model's main assumption, that CPU per event stays put as workers are added: from 1 process to {many.label}
the gateway's CPU per event went {g1_us:.1f} -> {g_us:.1f} us ({g_us / g1_us:.2f}x) and the broker's
{b1_us:.1f} -> {b_us:.1f} us. The rows for larger
C are **predictions, not measurements**: they assume the CPU per event stays what it was here as workers are
added (no contention that grows with them, in the gateway or the broker), that the work spreads evenly (one worker
per core, at least as many shards as workers, sources spread evenly over the shards) and that network and disks
keep up. Nothing here tested more than 2 workers or more than 2 cores.

## What is missing

- A host with more than 2 cores: the model's rows for C > 2 extrapolate the CPU per event measured here.
- A broker on cores of its own: its CPU per event is measured, its limit is not (it shares the 2 cores).
- The noise: {meta['rounds']} rounds per configuration per run, {len(listed)} run(s), on a shared machine; the spreads
  above are all there is.
  The model's constants vary too: per run, the gateway's CPU per event ranged from
  {min(r.us_per_event(r.gateway_cpu_s) for r in runs):.1f} to {max(r.us_per_event(r.gateway_cpu_s) for r in runs):.1f} us
  and the broker's from {min(r.us_per_event(r.broker_cpu_s) for r in runs):.1f} to
  {max(r.us_per_event(r.broker_cpu_s) for r in runs):.1f} us; contention for the cores (caches, context switches) may
  inflate them, and a quiet machine was not available to measure them without it.
- More than 2 workers, other shard counts ({meta['shards']} shards here: 2 workers serve
  {meta['shards'] // 2} each) and the python core.
""")


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=DOCS.parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def save_results(runs: Sequence[WorkersRun], plain: Sequence[PlainRun], meta: Mapping[str, Any]) -> None:
    RESULTS.write_bytes(orjson.dumps({"meta": meta, "runs": [asdict(r) for r in runs],
                                      "plain": [asdict(p) for p in plain]}, option=orjson.OPT_INDENT_2))


def run_summary(meta: Mapping[str, Any], runs: Sequence[WorkersRun]) -> dict[str, Any]:
    """One line of "other runs": a whole run's per-configuration means."""
    one, *more = summarize(runs)
    many = more[0] if more else one
    return {"when": meta["when"], "commit": meta["commit"], "rounds": meta["rounds"],
            "one_events_per_s": one.events_per_s, "many_events_per_s": many.events_per_s,
            "ratios": [b.events_per_s / a.events_per_s for a in runs for b in runs
                       if a.round == b.round and a.label == one.label and b.label == many.label],
            "one_gateway_us": one.gateway_us, "many_gateway_us": many.gateway_us, "one_broker_us": one.broker_us,
            "many_broker_us": many.broker_us, "one_others_cores": one.others_cores,
            "many_others_cores": many.others_cores, "one_main_us": one.main_thread_us,
            "many_main_us": many.main_thread_us, "one_loadgen_us": one.loadgen_us, "many_loadgen_us": many.loadgen_us}


def report_from_saved(other_runs: Sequence[Path] = ()) -> None:
    """Rewrite the page from RESULTS; ``other_runs``: JSON files of other runs to list (kept in RESULTS after)."""
    saved = orjson.loads(RESULTS.read_bytes())
    for path in other_runs:
        other = orjson.loads(path.read_bytes())
        saved["meta"].setdefault("other_runs", []).append(
            run_summary(other["meta"], [WorkersRun(**r) for r in other["runs"]]))
    if other_runs:
        RESULTS.write_bytes(orjson.dumps(saved, option=orjson.OPT_INDENT_2))
    runs = [WorkersRun(**r) for r in saved["runs"]]
    plain = [PlainRun(**p) for p in saved["plain"]]
    plot(runs, plain)
    write_report(runs, plain, saved["meta"])


# ----------------------------------------------------------------------------------------------------- main


async def run_all(bootstrap: str, broker_pid: int, args: argparse.Namespace, log_dir: Path,
                  ) -> tuple[list[WorkersRun], list[PlainRun]]:
    source_ids = balanced_source_ids(args.sources, args.shards)
    per_source = args.events // args.sources
    runs: list[WorkersRun] = []
    plain: list[PlainRun] = []
    loop = asyncio.get_running_loop()
    with progress_bar("gateway runs", args.rounds * 3 + 1, enabled=progress_enabled(not args.no_progress)) as advance:
        if args.warmup_events:
            # The broker's first runs cost it two to three times the CPU per event of later ones (its JIT warming
            # up; a 100,000-event warm-up of one configuration was not enough): measured rounds begin after one
            # discarded run of each configuration.
            for workers in (1, args.workers):
                warmup = await gateway_run(bootstrap, broker_pid, workers, args.shards, args.core, source_ids,
                                           args.warmup_events // args.sources, 0, log_dir)
                print(f"warm-up, not reported: {describe(warmup)}", flush=True)
        advance()
        for round_ in range(1, args.rounds + 1):
            for workers in (1, args.workers):
                run = await gateway_run(bootstrap, broker_pid, workers, args.shards, args.core, source_ids,
                                        per_source, round_, log_dir)
                print(describe(run), flush=True)
                runs.append(run)
                advance()
            source = next(r for r in runs if r.round == round_ and r.workers == 1)
            row = await loop.run_in_executor(None, plain_run, bootstrap, broker_pid, source.topic, args.shards,
                                             round_)
            print(f"round {round_} plain producer: {row.events_per_s:,.0f} events/s, "
                  f"{row.producer_cpu_s * 1e6 / row.events:.2f} us/record producer CPU, "
                  f"{row.broker_cpu_s * 1e6 / row.events:.2f} us/record broker CPU", flush=True)
            plain.append(row)
            advance()
    return runs, plain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000, help="events per gateway run, all sources")
    parser.add_argument("--sources", type=int, default=20)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2, help="the worker count compared with one process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup-events", type=int, default=200_000,
                        help="events of each gateway's discarded run before the rounds (0: none)")
    parser.add_argument("--core", default="native", choices=["native", "python"])
    parser.add_argument("--log-dir", type=Path, help="keep the gateways' logs here [a temporary directory]")
    parser.add_argument("--no-report", action="store_true", help="print, do not write docs/")
    parser.add_argument("--other-runs", type=Path, nargs="*", default=[],
                        help="with --report-from-saved: also list these runs' saved JSON (their means per config)")
    parser.add_argument("--report-from-saved", action="store_true",
                        help=f"rewrite the page and the PNG from {RESULTS.name}, run nothing")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    if args.report_from_saved:
        report_from_saved(args.other_runs)
        return
    load_start = load_averages()
    print(f"load average at start: {load_start}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            log_dir = args.log_dir or Path(tmp)
            log_dir.mkdir(parents=True, exist_ok=True)
            broker_comm = command_name(state.pid)
            runs, plain = asyncio.run(run_all(state.bootstrap_servers, state.pid, args, log_dir))
        finally:
            broker.stop()
    load_end = load_averages()
    print(f"load average at end: {load_end}", flush=True)
    meta = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "machine": f"{os.cpu_count()} cores ({platform.machine()}), Python {platform.python_version()}",
            "commit": commit(), "load_start": load_start, "load_end": load_end, "shards": args.shards,
            "sources": args.sources, "events": args.events // args.sources * args.sources, "rounds": args.rounds,
            "core": args.core, "broker_comm": broker_comm, "cores": os.cpu_count() or 1,
            "warmup_events": args.warmup_events}
    if args.no_report:
        return
    save_results(runs, plain, meta)
    plot(runs, plain)
    write_report(runs, plain, meta)
    print(f"wrote {PAGE.relative_to(DOCS.parent)}, {FIGURE.name}, {RESULTS.name}")


if __name__ == "__main__":
    main()
