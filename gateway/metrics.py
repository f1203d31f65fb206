"""Prometheus metrics and a health endpoint.

The hot path only increments plain integers (GatewayCounters); this collector turns them into Prometheus families
at scrape time, so publishing an event never touches a lock or a label lookup.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterator
from dataclasses import fields
from typing import Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class CounterSource(Protocol):
    @property
    def counters(self) -> Any: ...

    def gauges(self) -> dict[str, float]: ...

    def extra_counters(self) -> dict[str, float]: ...

    def per_source_gauges(self) -> dict[str, dict[str, float]]: ...

    def health(self) -> dict[str, Any]: ...


# name -> (label name, {label value: count}): counters the shell keeps apart from GatewayCounters, such as
# worker_errors by stage.
LabeledCounters = Callable[[], dict[str, tuple[str, dict[str, float]]]]


class GatewayCollector(Collector):
    def __init__(self, source: CounterSource, labeled_counters: LabeledCounters | None = None) -> None:
        self._source = source
        self._labeled_counters = labeled_counters

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
        if self._labeled_counters is not None:
            for name, (label, values) in self._labeled_counters().items():
                counter = CounterMetricFamily(f"skewless_gateway_{name}", f"Gateway counter {name} by {label}",
                                              labels=[label])
                for label_value, value in values.items():
                    counter.add_metric([label_value], value)
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


def make_registry(source: CounterSource, labeled_counters: LabeledCounters | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(source, labeled_counters))
    return registry


class MetricsServer:
    """Minimal HTTP/1.0 server: GET /metrics (Prometheus text) and GET /healthz (JSON, 503 when unhealthy).

    It runs its own event loop on a daemon thread: under 10,000 busy connections one iteration of the gateway's loop
    can take hundreds of milliseconds, and a health probe needing several iterations there took seconds. Here it
    only waits for the GIL (released every few milliseconds). The gateway's state is read from this thread; the
    few Python-level iterations that could see a dict change size are retried.
    """

    MAX_REQUEST_BYTES = 8192
    RETRIES = 5

    def __init__(self, registry: CollectorRegistry, health: Callable[[], dict[str, Any]]) -> None:
        self._registry = registry
        self._health = health
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="skewless-metrics", daemon=True)
        self._thread.start()
        started = asyncio.run_coroutine_threadsafe(asyncio.start_server(self._handle, host, port), loop)
        self._server = await asyncio.wrap_future(started)

    async def stop(self) -> None:
        loop, server = self._loop, self._server
        if loop is None or server is None:
            return

        async def close() -> None:
            server.close()
            await server.wait_closed()

        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(close(), loop))
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 5)
        loop.close()
        self._loop = None

    def _read_state(self, read: Callable[[], Any]) -> Any:
        for _ in range(self.RETRIES - 1):
            try:
                return read()
            except RuntimeError:  # "dictionary changed size during iteration": the gateway's thread moved on
                continue
        return read()

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
            body = self._read_state(lambda: generate_latest(self._registry))
            status, ctype = "200 OK", "text/plain; version=0.0.4"
        elif path == "/healthz":
            health = self._read_state(self._health)
            status = "200 OK" if health.get("status") == "ok" else "503 Service Unavailable"
            ctype, body = "application/json", orjson.dumps(health)
        else:
            status, ctype, body = "404 Not Found", "text/plain", b"not found\n"
        head = f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n"
        writer.write(head.encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
