"""Load: 1,000 concurrent sources on 10,000 connections (long suite; 100 on 1,000 in the fast one) for a bounded time
against a real gateway process. Details and figures: benchmarks/harness/load.py, docs/reliability.md."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import orjson
import pytest

from benchmarks.harness.load import run_load
from tests.reliability.harness import OUT_ENV, record_outcome


def _dump(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


@pytest.mark.parametrize(("sources", "pool", "rate", "duration_s"), [
    pytest.param(100, 10, 20.0, 5.0, id="fast"),
    pytest.param(1_000, 10, 10.0, 20.0, id="long", marks=pytest.mark.reliability_long)])
async def test_many_sources_and_connections(kafka, topic_prefix, tmp_path: Path, sources: int, pool: int, rate: float,
                                            duration_s: float):
    result = await run_load(kafka.bootstrap_servers, topic_prefix, tmp_path, sources, pool, rate, duration_s)
    out = os.environ.get(OUT_ENV)
    if out:
        await asyncio.to_thread(_dump, Path(out) / f"load-samples-{sources}.json", orjson.dumps(result))
    summary = {k: v for k, v in result.items() if k != "samples"}
    assert result["connections"] == sources * pool
    assert result["healthz_connections_reported"] == sources * pool
    assert result["gateway_fds"]["connected"] >= sources * pool
    assert result["lost"] == 0 and result["duplicates"] == 0
    assert result["sources_exact"] == sources  # every source: seqs 0..n-1, once each, in order
    assert result["late_records"] == 0
    assert result["events_in_kafka"] == result["events_sent"]
    assert result["client_connection_losses"] == 0 and result["client_errors"] == 0
    # The health endpoint answered every probe throughout (connect storm, load, drain).
    assert result["healthz_ms"]["failures"] == 0
    assert result["healthz_ms"]["max"] < 5_000
    record_outcome(
        f"Load: {sources:,} sources on {sources * pool:,} connections", group="load",
        injected=f"{sources:,} SDK sources x {pool} pooled connections, {rate:g} events/s each for {duration_s:g} s, "
                 "/healthz probed every 100 ms; gateway ordering waits 60-90 s (an overload-sized deployment)",
        checked="every seq once and in order; no disconnect; /healthz answers every probe",
        outcome={k: summary[k] for k in ("connections", "connect_s", "events_sent", "late_records",
                                         "throughput_events_per_s",
                                         "latency_ms", "memory_per_source_kib", "memory_per_connection_kib",
                                         "gateway_rss_mib", "gateway_fds", "healthz_ms", "lost", "duplicates",
                                         "sources_exact")})
