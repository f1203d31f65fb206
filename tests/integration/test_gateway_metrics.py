"""A real gateway process's /metrics, scraped over HTTP: Prometheus names, types and labels, time sync per source in
seconds, the delivery latency Histogram, and every metric the Grafana dashboard queries."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from contract.records import CONTRACT_VERSION
from contract.wire.frames import HEADER, FrameDecoder, encode_frame
from gateway.histograms import DELIVERY_LATENCY_BUCKETS_US
from gateway.launch import GatewayAddresses, spawn_gateway_async
from gateway.metrics import build_version
from timesync.client import sync_burst
from timesync.clocks import SimulatedClock

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"
AHEAD_US = 5_000_000
EVENTS = 20


async def http_get(host: str, port: int, path: str) -> tuple[int, str]:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


async def feed(addresses: GatewayAddresses) -> None:
    """A source 5 s ahead syncs over UDP and publishes EVENTS events; a second connection sends an oversized frame."""
    assert addresses.timesync_port is not None
    clock = SimulatedClock(ahead_us=AHEAD_US)
    await sync_burst("127.0.0.1", addresses.timesync_port, "skewed", clock, count=10)
    reader, writer = await asyncio.open_connection("127.0.0.1", addresses.port)
    writer.write(encode_frame({"type": "hello", "version": 1, "source_id": "skewed", "streams": ["s"]}))
    events = [{"stream": "s", "seq": seq, "source_ts_us": clock(), "payload": seq} for seq in range(EVENTS)]
    writer.write(encode_frame({"type": "events", "events": events}))
    decoder = FrameDecoder()
    async with asyncio.timeout(30):
        while {"type": "ack", "stream": "s", "seq": EVENTS - 1} not in decoder.feed(await reader.read(65536)):
            pass
    bad_reader, bad_writer = await asyncio.open_connection("127.0.0.1", addresses.port)
    bad_writer.write(HEADER.pack(1 << 30))
    async with asyncio.timeout(10):
        while await bad_reader.read(4096):
            pass
    bad_writer.close()
    writer.close()


async def scrape_until(addresses: GatewayAddresses, ready: Any) -> dict[str, Any]:
    """name -> family, once ``ready(families)``: counters of a process are polled, 20 s at most."""
    assert addresses.metrics_host is not None and addresses.metrics_port is not None
    families: dict[str, Any] = {}
    for _ in range(200):
        status, text = await http_get(addresses.metrics_host, addresses.metrics_port, "/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(text)}
        if ready(families):
            return families
        await asyncio.sleep(0.1)
    raise AssertionError(f"never ready; last scrape had {sorted(families)}")


def one(families: dict[str, Any], name: str, suffix: str = "", **labels: str) -> Sample:
    found = [s for s in families[name].samples if s.name == name + suffix and s.labels == labels]
    assert len(found) == 1, (name, suffix, labels, families[name].samples)
    return found[0]


async def test_scrape_a_gateway_process(kafka, topic_prefix):
    args = ["--port", "0", "--bootstrap", kafka.bootstrap_servers, "--prefix", topic_prefix,
            "--timesync-port", "0", "--metrics-port", "0"]
    process, addresses = await spawn_gateway_async(args, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        await feed(addresses)
        families = await scrape_until(addresses, lambda f: (
            "skewless_gateway_events_published" in f
            and one(f, "skewless_gateway_events_published", "_total").value == EVENTS
            and one(f, "skewless_gateway_session_errors", "_total", code="frame_too_large").value == 1))
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()

    assert [n for n in families if re.search(r"_us(_|$)|_ppm", n)] == []
    types = {name: f.type for name, f in families.items()}
    assert types["skewless_build_info"] == "gauge"
    assert one(families, "skewless_build_info", version=build_version(),
               contract_version=str(CONTRACT_VERSION)).value == 1

    # One counter family per concept, error codes as a label.
    assert types["skewless_gateway_events_received"] == "counter"
    assert one(families, "skewless_gateway_events_received", "_total").value == EVENTS
    assert types["skewless_gateway_session_errors"] == "counter"
    codes = {s.labels["code"] for s in families["skewless_gateway_session_errors"].samples}
    assert codes == {"frame_too_large", "malformed_frame", "timeout", "auth", "other"}
    assert "skewless_gateway_frames_too_large" not in families

    # The Kafka delivery latency: a Histogram in seconds over every delivery.
    assert types["skewless_gateway_kafka_delivery_latency_seconds"] == "histogram"
    latency = families["skewless_gateway_kafka_delivery_latency_seconds"]
    buckets = [s for s in latency.samples if s.name.endswith("_bucket")]
    assert [s.labels["le"] for s in buckets][-1] == "+Inf"
    assert len(buckets) == len(DELIVERY_LATENCY_BUCKETS_US) + 1
    assert one(families, "skewless_gateway_kafka_delivery_latency_seconds", "_count").value == EVENTS
    assert 0 < one(families, "skewless_gateway_kafka_delivery_latency_seconds", "_sum").value < EVENTS * 10.0
    # Every transaction's commit: the events were acked, so at least one commit; each one under the 10 s bucket.
    assert types["skewless_gateway_transaction_commit_seconds"] == "histogram"
    commits = one(families, "skewless_gateway_transaction_commit_seconds", "_count").value
    assert commits >= 1
    assert one(families, "skewless_gateway_transaction_commit_seconds", "_bucket", le="10.0").value == commits

    # Time sync of the source 5 s ahead, in seconds: reference time = source time + offset.
    for name in ("offset_seconds", "rtt_seconds", "skew_ratio", "error_bound_seconds", "samples"):
        assert types[f"skewless_timesync_{name}"] == "gauge"
        assert [s.labels for s in families[f"skewless_timesync_{name}"].samples] == [{"source_id": "skewed"}]
    assert one(families, "skewless_timesync_offset_seconds", source_id="skewed").value == pytest.approx(
        -AHEAD_US / 1e6, abs=0.002)
    assert 0 < one(families, "skewless_timesync_rtt_seconds", source_id="skewed").value < 1.0
    assert 0 < one(families, "skewless_timesync_error_bound_seconds", source_id="skewed").value < 1.0
    assert one(families, "skewless_timesync_samples", source_id="skewed").value >= 1

    # Per stream, with the stream label.
    assert types["skewless_stream_records"] == "counter"
    assert one(families, "skewless_stream_records", "_total", stream="s").value >= EVENTS
    assert types["skewless_stream_watermark_timestamp_seconds"] == "gauge"
    assert one(families, "skewless_stream_watermark_timestamp_seconds", stream="s").value > 1.6e9

    # Process, platform and garbage-collector collectors in the gateway's own registry.
    assert types["process_cpu_seconds"] == "counter"
    assert one(families, "process_resident_memory_bytes").value > 10e6
    assert "python_info" in families and "python_gc_collections" in families

    exported = {s.name for f in families.values() for s in f.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    wanted = {m for e in exprs for m in re.findall(r"\b((?:skewless|process|python)_[a-z0-9_]+)", e)}
    assert wanted - exported == set()
