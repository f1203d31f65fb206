"""What idle sources cost: heartbeats per second and gateway CPU, per-connection heartbeats vs one per source.

One run, one real gateway (gateway.launch, time sync off) on a real Kafka broker (broker.launcher); the SDK
clients run in this process. For each rule, in turn:

  per-connection  the SDK before issue 14: every pool connection that wrote nothing for ``heartbeat_interval_s``
                  sends a heartbeat (reproduced here by ``PerConnectionIdleTimer``, the old ``clients.core.IdleTimer``)
  per-source      the SDK now (``clients.core.IdleTimer``): one heartbeat per source per interval, on the pool
                  connection silent longest, plus a keepalive on any connection silent for ``keepalive_interval_s``

``--sources`` clients of ``--pool`` connections each connect, send one event each (a source sends no heartbeat
before its first event) and wait for its ack; then, after ``--settle-s``, the script samples for ``--window-s``
seconds: heartbeats written by the SDK (``ClientStats.heartbeats_sent``), the gateway process's CPU time
(/proc/PID/stat utime + stime) and this process's. Writes docs/sdk-idle.md and docs/sdk-idle.png.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.processes import cpu_s, stop_process
from broker.launcher import KafkaBroker
from clients import FlushTimeout, SkewlessClient
from clients.core import IdleTimer
from gateway.launch import spawn_gateway
from reorder.eval.progress import progress_bar, progress_enabled

DOCS = Path(__file__).resolve().parents[1] / "docs"
HEARTBEAT_INTERVAL_S = 1.0
CONNECT_CONCURRENCY = 50


class PerConnectionIdleTimer(IdleTimer):
    """The rule the SDK had before: each connection idle for ``interval_s`` is due a heartbeat of its own."""

    def __init__(self, size: int, interval_s: float | None) -> None:
        super().__init__(size, interval_s)
        self._writes = [0.0] * size

    def wrote(self, slot: int, now_s: float) -> None:
        self._writes[slot] = now_s

    def due(self, live: Iterable[int], now_s: float) -> list[int]:
        if self.interval_s is None:
            return []
        return [s for s in live if now_s - self._writes[s] >= self.interval_s]

    def next_due_in(self, live: Iterable[int], now_s: float) -> float | None:
        if self.interval_s is None:
            return None
        waits = [self._writes[s] + self.interval_s - now_s for s in live]
        return max(0.0, min(waits)) if waits else None


@dataclass
class Row:
    rule: str
    sources: int
    connections: int
    heartbeats_per_s: float
    gateway_cpu_pct: float
    sdk_cpu_pct: float
    connected: int
    unacked: int


async def one_rule(rule: str, port: int, gateway_pid: int, sources: int, pool: int, settle_s: float,
                   window_s: float) -> Row:
    # One stream per rule, so that the second rule's sources do not join a stream the first rule's sources just
    # left (in a first version of this script, sharing one stream, none of the second rule's first events was
    # acknowledged within 60 s: a gateway question, reported, not what this benchmark measures).
    stream = f"idle-{rule}"
    clients = [SkewlessClient("127.0.0.1", port, f"{rule}-{k:05d}", [stream], pool_size=pool, time_sync=False,
                              heartbeat_interval_s=HEARTBEAT_INTERVAL_S, connect_timeout_s=120.0)
               for k in range(sources)]
    if rule == "per-connection":
        for client in clients:
            client._idle = PerConnectionIdleTimer(pool, HEARTBEAT_INTERVAL_S)
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def start(client: SkewlessClient) -> None:
        async with gate:
            await client.connect()
            await client.send(stream, {"hello": True})

    async def acked(client: SkewlessClient) -> bool:
        try:
            await client.flush(timeout_s=60.0)
        except FlushTimeout:
            return False
        return True

    try:
        await asyncio.gather(*(start(c) for c in clients))
        # An unacknowledged first event does not stop the heartbeats (it has been written): counted, not fatal.
        unacked = sum(not ok for ok in await asyncio.gather(*(acked(c) for c in clients)))
        await asyncio.sleep(settle_s)
        beats0 = sum(c.stats.heartbeats_sent for c in clients)
        gateway0, own0, wall0 = cpu_s(gateway_pid), cpu_s(os.getpid()), time.monotonic()
        await asyncio.sleep(window_s)
        wall = time.monotonic() - wall0
        beats = sum(c.stats.heartbeats_sent for c in clients) - beats0
        gateway_cpu = cpu_s(gateway_pid) - gateway0
        own_cpu = cpu_s(os.getpid()) - own0
        connected = sum(c.connected_count for c in clients)
    finally:
        for i in range(0, len(clients), CONNECT_CONCURRENCY):
            await asyncio.gather(*(c.close() for c in clients[i:i + CONNECT_CONCURRENCY]))
    return Row(rule, sources, sources * pool, beats / wall, 100 * gateway_cpu / wall, 100 * own_cpu / wall,
               connected, unacked)


def write_report(rows: list[Row], args: argparse.Namespace, path: Path, plot: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    idle, before, after = rows
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9.5, 3.8))
    names = [r.rule for r in rows]
    colors = ["#999", "#b55", "#5a5"]
    ax1.bar(names, [r.heartbeats_per_s for r in rows], color=colors)
    ax1.set_ylabel("heartbeats per second (1/s)")
    ax1.set_title(f"{before.sources:,} idle sources x {args.pool} connections")
    for i, r in enumerate(rows):
        ax1.annotate(f"{r.heartbeats_per_s:,.0f}/s", (i, r.heartbeats_per_s), ha="center", va="bottom")
    ax2.bar(names, [r.gateway_cpu_pct for r in rows], color=colors)
    ax2.set_ylabel("gateway CPU (% of one core)")
    ax2.set_title("gateway process CPU while idle")
    for i, r in enumerate(rows):
        ax2.annotate(f"{r.gateway_cpu_pct:.1f} %", (i, r.gateway_cpu_pct), ha="center", va="bottom")
    for ax in (ax1, ax2):
        ax.set_ylim(0, max(ax.get_ylim()[1], 1) * 1.15)
    fig.tight_layout()
    fig.savefig(plot, dpi=160)
    plt.close(fig)

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.3f}x" if b else "n/a"

    table = "\n".join(
        f"| {r.rule} | {r.sources:,} | {r.connections:,} ({r.connected:,} up) | {r.unacked} | "
        f"{r.heartbeats_per_s:,.0f} | {r.heartbeats_per_s / r.sources if r.sources else 0:.2f} | "
        f"{r.gateway_cpu_pct:.1f} | "
        f"{r.sdk_cpu_pct:.1f} |" for r in rows)
    path.write_text(f"""# Idle cost of the SDK (issue 14, target 5)

Generated by `benchmarks/sdk_idle.py --sources {args.sources} --pool {args.pool} --window-s {args.window_s:g}`
(one run, both rules side by side on the same gateway and broker).

{args.sources:,} sources, each a `SkewlessClient` with `pool_size={args.pool}`, `heartbeat_interval_s=1`, time sync off,
connect, send one event each, wait for its ack, then stay idle; after {args.settle_s:g} s of settling the script
counts the heartbeats the SDK writes and the CPU time of the gateway process (`/proc/PID/stat`) over
{args.window_s:g} s. The SDK clients all run in the benchmark process ("SDK CPU"). A real gateway
(`gateway.launch`, `--no-timesync`) publishes to a real single-node Kafka broker.{args.note}

| heartbeat rule | sources | connections | first events unacked after 60 s | heartbeats/s | per source per s | gateway CPU (% of a core) | SDK CPU (% of a core) |
|---|---|---|---|---|---|---|---|
{table}

Ratios (per-source / per-connection): heartbeats {ratio(after.heartbeats_per_s, before.heartbeats_per_s)}, gateway
CPU {ratio(after.gateway_cpu_pct, before.gateway_cpu_pct)}, SDK CPU {ratio(after.sdk_cpu_pct, before.sdk_cpu_pct)}.
Above the gateway's CPU with no source connected ({idle.gateway_cpu_pct:.1f} %, the first row: timers and the Kafka
client's threads), the idle sources cost the gateway {before.gateway_cpu_pct - idle.gateway_cpu_pct:.1f} % of a core
with per-connection heartbeats and {after.gateway_cpu_pct - idle.gateway_cpu_pct:.1f} % with one per source
({ratio(after.gateway_cpu_pct - idle.gateway_cpu_pct, before.gateway_cpu_pct - idle.gateway_cpu_pct)}; open sockets
and the sources' state cost something whatever the heartbeats). At the issue's scale, 1,000 sources x 10
connections, the same rules give 10 and 1 heartbeats per source per second: ~10,000/s before (the issue counted
~7,700/s) and ~1,000/s now (arithmetic from the per-source column, not measured here).

![heartbeats per second and gateway CPU, per rule](sdk-idle.png)

* **per-connection** is the rule the SDK had before: every pool connection idle for `heartbeat_interval_s` sent
  its own heartbeat, so an idle source cost `pool_size` heartbeats per second (fewer when the event loop runs late).
* **per-source** is the rule now (`clients.core.IdleTimer`): when no connection of the pool wrote anything for
  `heartbeat_interval_s`, one heartbeat goes out, on the connection silent longest, so the duty rotates over the
  pool and each connection writes every `pool_size x heartbeat_interval_s`. Any connection silent for
  `keepalive_interval_s` (30 s, a quarter of the gateway's 120 s idle timeout in `gateway/session.py`) writes one
  too; with 10 connections at 1 s the rotation already writes every 10 s, so no keepalive is needed here.

The heartbeat itself is unchanged (docs/wire-protocol.md: `source_ts_us`, `next_seq`): the merge still gets one
per source per second from an idle source, which is what lets it advance past that source; the gateway applies a
heartbeat to the source whatever connection it came on. The heartbeats/s column is measured at the sender; the
gateway receives the same frames.

Reproduce: `.venv/bin/python benchmarks/sdk_idle.py` (defaults: {DEFAULT_SOURCES} sources x {DEFAULT_POOL}
connections; about a minute plus the broker's start).
""")


DEFAULT_SOURCES = 1000
DEFAULT_POOL = 10


async def baseline(gateway_pid: int, window_s: float) -> Row:
    """The gateway with no source connected: the CPU it spends anyway (timers, Kafka client threads)."""
    gateway0, own0, wall0 = cpu_s(gateway_pid), cpu_s(os.getpid()), time.monotonic()
    await asyncio.sleep(window_s)
    wall = time.monotonic() - wall0
    return Row("no source", 0, 0, 0.0, 100 * (cpu_s(gateway_pid) - gateway0) / wall,
               100 * (cpu_s(os.getpid()) - own0) / wall, 0, 0)


async def run(args: argparse.Namespace, port: int, gateway_pid: int) -> list[Row]:
    rules = ("per-connection", "per-source")
    # one step per row: the baseline, then each rule
    with progress_bar("baseline", 1 + len(rules), enabled=progress_enabled(not args.no_progress)) as advance:
        rows = [await baseline(gateway_pid, args.window_s)]
        print(f"gateway with no source: CPU {rows[0].gateway_cpu_pct:.1f} %", flush=True)
        for rule in rules:
            advance(description=rule)
            row = await one_rule(rule, port, gateway_pid, args.sources, args.pool, args.settle_s, args.window_s)
            print(f"{row.rule:>15}: {row.sources} sources x {args.pool}: {row.heartbeats_per_s:,.0f} heartbeats/s, "
                  f"gateway CPU {row.gateway_cpu_pct:.1f} %, SDK CPU {row.sdk_cpu_pct:.1f} %, {row.connected} up, "
                  f"{row.unacked} first events unacked after 60 s",
                  flush=True)
            rows.append(row)
        advance()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sources", type=int, default=DEFAULT_SOURCES)
    parser.add_argument("--pool", type=int, default=DEFAULT_POOL)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--window-s", type=float, default=20.0)
    parser.add_argument("--note", default="", help="a sentence appended to the report's setup paragraph")
    parser.add_argument("--out", type=Path, default=DOCS / "sdk-idle.md")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar (stderr, terminals only)")
    args = parser.parse_args()
    if args.note:
        args.note = " " + args.note
    # Slow hellos on a loaded machine are expected here: one warning per connection would bury the results.
    logging.getLogger("clients").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        gateway: subprocess.Popen[bytes] | None = None
        try:
            gateway, addresses = spawn_gateway(["--port", "0", "--no-timesync", "--bootstrap",
                                                state.bootstrap_servers, "--prefix", "idle"])
            rows = asyncio.run(run(args, addresses.port, gateway.pid))
        finally:
            if gateway is not None:
                stop_process(gateway, 30)
            broker.stop()
    write_report(rows, args, args.out, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
