"""Load: many concurrent sources and connections against a real `skewless gateway` process, for a bounded time.

`run_load()` starts the gateway as its own process, then a load generator process (this module's `generate`) holding
`sources` SDK clients with `pool` connections each, every source sending `rate` events/s for `duration_s`. Meanwhile
this process samples the gateway's RSS and file descriptors from /proc and probes /healthz every 100 ms. Afterwards
it reads the events topic back: every seq of every source exactly once and in order, and the latency from the
source's stamp to the gateway's ordered release into Kafka.

Both processes raise RLIMIT_NOFILE to the hard limit (10,000 connections need 10,000 descriptors on each side).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson

from benchmarks.harness.stats import percentile


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


# -- the generator process -------------------------------------------------------------------------------------------


async def _generate(args: argparse.Namespace) -> None:
    from clients import Backoff, SkewlessClient

    raise_fd_limit()
    loop = asyncio.get_running_loop()
    clients = [SkewlessClient(args.host, args.port, f"L{k:05d}", ["s"], pool_size=args.pool, batch_events=100,
                              linger_s=0.005, connect_timeout_s=120, backoff=Backoff(initial_s=0.1, max_s=2.0))
               for k in range(args.sources)]
    started = loop.time()
    semaphore = asyncio.Semaphore(200)  # connect in waves: the gateway answers each hello after a topic check

    async def connect(client: SkewlessClient) -> None:
        async with semaphore:
            await client.connect()

    await asyncio.gather(*(connect(c) for c in clients))
    print(orjson.dumps({"phase": "connected", "connect_s": round(loop.time() - started, 2),
                        "connections": sum(c.connected_count for c in clients)}).decode(), flush=True)
    stop_at = loop.time() + args.duration_s
    interval = 1.0 / args.rate

    async def run(client: SkewlessClient) -> int:
        sent = 0
        next_t = loop.time() + random.random() * interval
        while True:
            delay = next_t - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if loop.time() >= stop_at:
                return sent
            await client.send("s", {"i": sent})
            sent += 1
            next_t += interval

    print(orjson.dumps({"phase": "load"}).decode(), flush=True)
    load_started = loop.time()
    sent = await asyncio.gather(*(run(c) for c in clients))
    send_s = loop.time() - load_started
    print(orjson.dumps({"phase": "draining"}).decode(), flush=True)
    await asyncio.gather(*(c.flush(timeout_s=180) for c in clients))
    acked_s = loop.time() - load_started
    stats = [c.stats for c in clients]
    summary = {"phase": "done", "sent": {c.source_id: n for c, n in zip(clients, sent, strict=True)},
               "send_s": round(send_s, 2), "all_acked_s": round(acked_s, 2),
               "connection_losses": sum(s.connection_losses for s in stats),
               "heartbeats": sum(s.heartbeats_sent for s in stats),
               "errors": sum(c.error is not None for c in clients)}
    await asyncio.gather(*(c.close() for c in clients))
    print(orjson.dumps(summary).decode(), flush=True)


def generate_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--sources", type=int, required=True)
    parser.add_argument("--pool", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--duration-s", type=float, required=True)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner: asyncio.Runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(_generate(args))


# -- the orchestrating side ------------------------------------------------------------------------------------------


async def run_load(bootstrap: str, prefix: str, workdir: Path, sources: int, pool: int, rate: float,
                   duration_s: float) -> dict[str, Any]:
    from benchmarks.harness.processes import REPO, GatewayProcess, child_env, http_get_json, open_fds, rss_kib
    from broker.reader import read_stream
    from contract.topics import TopicNames

    raise_fd_limit()
    os.makedirs(workdir, exist_ok=True)
    # Sized like a deployment that expects overload: on 2 cores, 10,000 connections can stall the event loop for
    # seconds (hello storms), and a merge that gives up on a source after the default waits would send its next
    # events to the late topic. Late events are still counted below, never ignored. No source goes away here, so the
    # waits are a ceiling, never a pace: they only have to exceed the worst backlog of a loaded machine (with 10-15 s
    # waits one run sent 3 sources' events to the late topic while the gateway, Kafka and 1,000 clients shared the
    # 2 cores). The drain allows 180 s in all.
    config = workdir / "gateway.toml"
    config.write_text("[gateway]\ngap_timeout_min_s = 60\ngap_timeout_max_s = 90\nmerge_timeout_s = 90\n"
                      "join_grace_s = 90\n")
    gateway = GatewayProcess(bootstrap, prefix, workdir, extra_args=("--config", str(config)))
    await gateway.start()
    samples: list[dict[str, Any]] = []
    health_ms: list[float] = []
    health_failures = 0
    phase = "idle"
    t0 = time.monotonic()
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal health_failures
        while not stop.is_set():
            started = time.monotonic()
            try:
                status, _ = await gateway.health()
                if status != 200:
                    health_failures += 1
                health_ms.append((time.monotonic() - started) * 1e3)
            except (OSError, TimeoutError):
                health_failures += 1
            samples.append({"t": round(time.monotonic() - t0, 2), "phase": phase, "rss_kib": rss_kib(gateway.pid),
                            "fds": open_fds(gateway.pid), "healthz_ms": round(health_ms[-1], 2) if health_ms else None})
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    try:
        await asyncio.sleep(0.5)
        rss_idle = rss_kib(gateway.pid)
        fds_idle = open_fds(gateway.pid)
        child = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "benchmarks.harness.load", "generate", "--port", str(gateway.port), "--sources",
            str(sources), "--pool", str(pool), "--rate", str(rate), "--duration-s", str(duration_s),
            stdout=asyncio.subprocess.PIPE, env=child_env(), cwd=str(REPO))
        assert child.stdout is not None
        phase = "connecting"
        events: dict[str, Any] = {}
        async with asyncio.timeout(duration_s + 400):
            while line := await child.stdout.readline():
                message = orjson.loads(line)
                events[message["phase"]] = message
                if message["phase"] == "connected":
                    phase = "connected"
                    rss_connected = rss_kib(gateway.pid)
                    fds_connected = open_fds(gateway.pid)
                    health_connected = await http_get_json(gateway.host, gateway.metrics_port, "/healthz", 30)
                elif message["phase"] in ("load", "draining"):
                    phase = message["phase"]
                elif message["phase"] == "done":
                    phase = "drained"
            await child.wait()
        assert child.returncode == 0, "load generator failed"
        metrics = await gateway.metrics()
    finally:
        stop.set()
        await sampler
        await gateway.stop()

    done = events["done"]
    sent: dict[str, int] = done["sent"]
    records, _punctuations = read_stream(bootstrap, TopicNames(prefix).events("s"), timeout_s=120)
    late, _ = read_stream(bootstrap, TopicNames(prefix).late("s"), timeout_s=30)
    per_source: dict[str, list[int]] = {}
    latencies_ms: list[float] = []
    for r in records:
        per_source.setdefault(r["source_id"], []).append(r["seq"])
        latencies_ms.append((r["release_ts_us"] - r["source_ts_us"]) / 1e3)
    total = sum(sent.values())
    in_order = sum(per_source.get(s, []) == list(range(n)) for s, n in sent.items())
    # Lost and duplicated count both topics: an event the merge gave up waiting for is late, not lost.
    counts = Counter(r["source_id"] for r in records) + Counter(r["source_id"] for r in late)
    load_samples = [s for s in samples if s["phase"] == "load"]
    return {
        "sources": sources, "connections": events["connected"]["connections"], "pool": pool,
        "rate_per_source": rate, "duration_s": duration_s, "connect_s": events["connected"]["connect_s"],
        "events_sent": total, "events_in_kafka": len(records), "late_records": len(late),
        "throughput_events_per_s": round(total / done["send_s"], 1),
        "all_acked_after_s": done["all_acked_s"],
        "sources_exact": in_order, "duplicates": sum(max(0, counts[s] - n) for s, n in sent.items()),
        "lost": sum(max(0, n - counts[s]) for s, n in sent.items()),
        "latency_ms": {"p50": round(percentile(latencies_ms, 0.5), 1), "p99": round(percentile(latencies_ms, 0.99), 1),
                       "max": round(max(latencies_ms), 1)},
        "gateway_rss_mib": {"idle": round(rss_idle / 1024, 1), "connected": round(rss_connected / 1024, 1),
                            "peak": round(max(s["rss_kib"] for s in samples) / 1024, 1)},
        "memory_per_source_kib": round((rss_connected - rss_idle) / sources, 1),
        "memory_per_connection_kib": round((rss_connected - rss_idle) / max(1, events["connected"]["connections"]), 1),
        "gateway_fds": {"idle": fds_idle, "connected": fds_connected, "peak": max(s["fds"] for s in samples)},
        "healthz_ms": {"p50": round(percentile(health_ms, 0.5), 1), "p99": round(percentile(health_ms, 0.99), 1),
                       "max": round(max(health_ms), 1), "probes": len(health_ms), "failures": health_failures,
                       "under_load_max": round(max((s["healthz_ms"] or 0) for s in load_samples), 1)
                       if load_samples else None},
        "healthz_connections_reported": health_connected[1]["connections"],
        "client_connection_losses": done["connection_losses"], "client_errors": done["errors"],
        "gateway_heartbeats": metrics.get("skewless_gateway_heartbeats"),
        "merge_source_timeouts": metrics.get("skewless_gateway_pipeline_source_timeouts"),
        "samples": samples,
    }


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "generate":
        generate_main(sys.argv[2:])
    else:
        raise SystemExit("usage: python -m benchmarks.harness.load generate ...")
