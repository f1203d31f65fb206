"""`skewless gateway --workers N`: N processes on one host that form one cluster through Kafka (no second mechanism)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import orjson

from clients import Backoff, SkewlessClient
from contract.sharding import shard_of
from gateway.launch import METRICS_PREFIX, METRICS_SUFFIX, READY_PREFIX

SHARDS = 4


async def _healthz(port: int) -> dict:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /healthz HTTP/1.0\r\n\r\n")
    body = (await reader.read()).split(b"\r\n\r\n", 1)[1]
    writer.close()
    return dict(orjson.loads(body))


async def test_two_workers_split_the_shards_and_serve_sources_of_every_shard(kafka, topic_prefix):
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "skewless", "gateway", "--workers", "2", "--port", "0", "--metrics-port", "0",
        "--no-timesync", "--bootstrap", kafka.bootstrap_servers, "--prefix", topic_prefix, "--shards", str(SHARDS),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert process.stdout is not None
    metrics_ports: dict[int, int] = {}
    tcp_ports: dict[int, int] = {}
    try:
        async with asyncio.timeout(90):
            while len(tcp_ports) < 2:
                line = (await process.stdout.readline()).decode().strip()
                assert line, "the workers' parent exited before both workers were ready"
                if not line.startswith("worker "):
                    continue
                _word, index, rest = line.split(" ", 2)
                if rest.startswith(METRICS_PREFIX):
                    metrics_ports[int(index)] = int(rest.removeprefix(METRICS_PREFIX).removesuffix(METRICS_SUFFIX)
                                                    .rpartition(":")[2])
                elif rest.startswith(READY_PREFIX):
                    tcp_ports[int(index)] = int(rest.rpartition(":")[2])
        assert set(metrics_ports) == {0, 1}
        async with asyncio.timeout(60):
            while True:
                states = [await _healthz(metrics_ports[i]) for i in (0, 1)]
                served = [set(s["serving_shards"]) for s in states]
                if served[0] | served[1] == set(range(SHARDS)) and served[0] and served[1]:
                    break
                await asyncio.sleep(0.2)
        # Two processes, two identities, one cluster: the shards are split between them, none served twice.
        assert states[0]["pid"] != states[1]["pid"] and states[0]["gateway_id"] != states[1]["gateway_id"]
        assert served[0] & served[1] == set()

        # A source of every shard, each given worker 0's address only: those of worker 1's shards are redirected.
        sources = {shard_of(f"w-{i}", SHARDS): f"w-{i}" for i in range(64)}
        assert set(sources) == set(range(SHARDS))
        clients = [SkewlessClient("127.0.0.1", tcp_ports[0], source_id, ["s"], backoff=Backoff(initial_s=0.05))
                   for source_id in sources.values()]
        for client in clients:
            await client.connect()
            await client.send("s", {"x": 1}, 1_000)
            await client.flush(30)
        redirected = {c.source_id for c in clients if c.stats.redirects}
        assert redirected == {s for k, s in sources.items() if k in served[1]}
        for client in clients:
            await client.close()
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()
    assert process.returncode == 0
