"""Prometheus metrics and a health endpoint.

The hot path only increments plain integers (GatewayCounters); this collector turns them into Prometheus families
at scrape time, so publishing an event never touches a lock or a label lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class CounterSource(Protocol):
    counters: Any

    def gauges(self) -> dict[str, float]: ...

    def extra_counters(self) -> dict[str, float]: ...

    def per_source_gauges(self) -> dict[str, dict[str, float]]: ...

    def health(self) -> dict[str, Any]: ...


class GatewayCollector(Collector):
    def __init__(self, source: CounterSource) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        counters = self._source.counters
        for f in fields(counters):
            counter = CounterMetricFamily(f"skewless_gateway_{f.name}", f"Gateway counter {f.name}")
            counter.add_metric([], float(getattr(counters, f.name)))
            yield counter
        for name, value in self._source.extra_counters().items():
            counter = CounterMetricFamily(f"skewless_gateway_{name}", f"Gateway counter {name}")
            counter.add_metric([], value)
            yield counter
        for name, value in self._source.gauges().items():
            gauge = GaugeMetricFamily(f"skewless_gateway_{name}", f"Gateway gauge {name}")
            gauge.add_metric([], value)
            yield gauge
        per_source: dict[str, GaugeMetricFamily] = {}
        for source_id, values in self._source.per_source_gauges().items():
            for name, value in values.items():
                family = per_source.get(name)
                if family is None:
                    family = GaugeMetricFamily(f"skewless_source_{name}", f"Per-source {name}", labels=["source_id"])
                    per_source[name] = family
                family.add_metric([source_id], value)
        yield from per_source.values()


def make_registry(source: CounterSource) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(source))
    return registry


class MetricsServer:
    """Minimal HTTP/1.0 server: GET /metrics (Prometheus text) and GET /healthz (JSON, 503 when unhealthy)."""

    MAX_REQUEST_BYTES = 8192

    def __init__(self, registry: CollectorRegistry, health: Callable[[], dict[str, Any]]) -> None:
        self._registry = registry
        self._health = health
        self._server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        self._server = await asyncio.start_server(self._handle, host, port)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(5):
                request = await reader.readuntil(b"\r\n\r\n")
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            writer.close()
            return
        parts = request.split(b"\r\n", 1)[0].split()
        path = parts[1].decode(errors="replace") if len(parts) >= 2 else ""
        if path == "/metrics":
            status, ctype, body = "200 OK", "text/plain; version=0.0.4", generate_latest(self._registry)
        elif path == "/healthz":
            health = self._health()
            status = "200 OK" if health.get("status") == "ok" else "503 Service Unavailable"
            ctype, body = "application/json", orjson.dumps(health)
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
