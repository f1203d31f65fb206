"""Prometheus metrics and a health endpoint.

The hot path only increments plain integers (GatewayCounters, gateway/histograms.py); this collector turns them into
Prometheus families at scrape time, so publishing an event never touches a lock or a label lookup. Conventions:
seconds and ratios (never microseconds or ppm), Histograms for latencies, one family per concept with a label
(`code`, `stage`, `stream`, `source_id`) and a bound on how many label values a scrape carries. docs/operations.md
lists every family.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import fields
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol

import orjson
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from contract.records import CONTRACT_VERSION
from gateway.histograms import DELIVERY_LATENCY_BUCKETS_US, Histogram

# Label values beyond these limits are aggregated under OTHER: a deployment with 100,000 sources must not make
# every scrape 100,000 series long (Prometheus' memory grows with series, not samples).
MAX_STREAM_LABELS = 50
MAX_SOURCE_LABELS = 100
OTHER = "_other"

# GatewayCounters fields that count session errors by wire code (contract/wire/errors.py): one family with a `code`
# label. auth_failures counts both `unauthenticated` and `unknown_source` (GatewayCounters.count_error) and
# protocol_errors every other code; their label values say so.
ERROR_CODE_COUNTERS = {"frames_too_large": "frame_too_large", "malformed_frames": "malformed_frame",
                       "timeouts": "timeout", "auth_failures": "auth", "protocol_errors": "other"}

# HELP text of the counters (GatewayCounters, PipelineCounters as pipeline_*, the shell's extra ones).
COUNTER_HELP = {
    "connections_opened": "TCP connections from sources accepted",
    "connections_closed": "TCP connections from sources closed, for any reason",
    "events_received": "Events received in events frames, before duplicate detection",
    "events_published": "Events Kafka acknowledged (events and late topics)",
    "duplicates": "Events dropped because their sequence number was already received (client resends)",
    "delivery_failures": "Kafka delivery reports with an error (the event is not acknowledged to its source)",
    "heartbeats": "Heartbeat frames received",
    "recovered_sources": "Sources whose progress was read back from Kafka (restart or shard takeover)",
    "global_pauses": "Times the reorder buffers held too many events and the sources holding events were paused",
    "kafka_stalls": "Episodes of Kafka refusing produces (its local queue full)",
    "gateway_pauses": "Times the gateway itself did not run for over 250 ms (no merge timeout for the 2 s after)",
    "task_failures": "Gateway tasks that died with an unexpected error",
    "invalid_payloads": "Events refused because their payload is not JSON-representable",
    "encode_failures": "Records that failed to encode after validation (a gateway bug)",
    "clock_steps": "Source clock steps a time-sync sample confirmed, each caught at its first event",
    "clock_step_false_alarms": "Clock-step holds the resync showed were no step (released as they were)",
    "clock_step_unresolved": "Events sent to the late topic: their source never re-synced after a suspected step",
    "clock_delay_resyncs": "Re-syncs asked: an event arrived far later than its source's recent ones (nothing held)",
    "sources_expired": "Sources dropped from checkpoints after the source retention",
    "records_too_large": "Events refused because their record exceeds max_record_bytes",
    "idle_punctuations": "Punctuations of streams the shard holds nothing of",
    "gaps_given_up": "Gap notices sent: runs of sequence numbers the reorderers gave up without receiving them",
    "seqs_given_up": "Sequence numbers given up (in gap notices): the ack passed them, the source was told",
    "conflicts": "Duplicate seqs whose payload or source_ts_us differ from the accepted event's (seq_conflict)",
    "seq_jumps": "Events refused because their seq jumped more than max_seq_jump above their stream's (seq_jump)",
    "sources_forgotten": "Idle sources (no connection, nothing held) whose state was freed after the retention",
    "streams_refused": "Hellos refused for a stream off the allow-list or past the gateway's stream cap",
    "slow_readers_closed": "Connections closed because their peer did not read what the gateway sent",
    "log_lines_suppressed": "Per-event log lines left out by the rate limit (the counters keep the exact totals)",
    "heartbeats_refused": "Heartbeats refused (future-dated, out of range or clock-stepped): they moved no watermark",
    "timestamps_refused": "Events refused because a mapped time falls outside 0..2^63-1 (timestamp_out_of_range)",
    "watermarks_distrusted": "Checkpointed watermarks beyond max_future of the clock at recovery, not restored",
    "byes": "Clean departures (every open connection of the source said bye): the merge stopped waiting for it",
    "takeover_windows": "Streams recovered at a takeover or restart whose merge waited out the takeover window",
    "takeover_newcomers": "Sources no recovered checkpoint named that said hello within a takeover window",
    "offset_audit_failures": "Transactions aborted before commit: Kafka's delivery reports broke the offset count",
    "pipeline_heartbeats_refused": "Heartbeats the pipeline refused (future-dated or out of range)",
    "pipeline_timestamps_refused": "Events the pipeline refused: a mapped time outside the contract's range",
    "pipeline_watermarks_distrusted": "Restored watermarks beyond max_future of the restoring clock, dropped",
    "pipeline_stamp_regressions": "Events late as stamp_regression (their source's stamps went backwards)",
    "pipeline_after_give_up": "Events late as after_give_up (below what was released after their source's give-up)",
    "pipeline_refs_raised": "Events whose ref_ts_us was raised within its error bound to keep reference order",
    "pipeline_departures": "Sources that left cleanly (bye): the merge gave them up without a wait",
    "pipeline_released": "Events released in order by the reorderers",
    "pipeline_late": "Events behind the watermark, sent to the late topic",
    "pipeline_quarantined": "Future-dated events (beyond max_future), sent to the late topic",
    "pipeline_gaps": "Sequence gaps the reorderers gave up waiting for",
    "pipeline_gap_events_skipped": "Events (sequence numbers) missing in the gaps skipped",
    "pipeline_source_timeouts": "Times the merge stopped waiting for a silent source",
    "pipeline_punctuations": "Punctuations (watermark records) written to the events topics",
    "shard_handovers": "Shards this gateway gave up (rebalance, lost ownership, failure)",
    "worker_errors": "Connections that failed in a gateway stage, by stage",
}
GAUGE_HELP = {
    "connections": "Open TCP connections from sources",
    "kafka_pending": "Records produced and not yet acknowledged by Kafka, plus those waiting to be produced",
    "shards_served": "Shards this gateway serves now",
}

# Per-source clock estimate -> (family, help, divisor to base units, how OTHER aggregates the sources left out).
TIMESYNC_GAUGES = {
    "offset_us": ("skewless_timesync_offset_seconds",
                  "Source clock offset: reference time = source time + offset (positive: the source is behind)", 1e6),
    "rtt_us": ("skewless_timesync_rtt_seconds",
               "Round-trip time of the source's sync exchanges in its current estimate", 1e6),
    "skew_ppm": ("skewless_timesync_skew_ratio", "Source clock rate error against the reference (1e-6 = 1 ppm)",
                 1e6),
    "error_bound_us": ("skewless_timesync_error_bound_seconds",
                       "Bound on the source clock's mapping error now (grows with time since the last sync)", 1e6),
    "sync_samples": ("skewless_timesync_samples", "Sync exchanges in the source's current estimate", 1.0),
}
SOURCE_GAUGES = {
    "connections": ("skewless_source_connections", "Open connections of the source (a pool has several)"),
    "buffered_events": ("skewless_source_buffered_events", "Events of the source held in reorder buffers and merge "
                        "queues"),
}


class CounterSource(Protocol):
    """What the gateway (gateway/server.py) offers the collector. Optional, read when present: ``histograms()``
    (name -> Histogram, exposed as ``skewless_gateway_<name>_seconds``), ``per_stream_counters()`` and
    ``per_stream_gauges()`` (stream -> name -> value) and ``shards`` (the runtimes, for what the first two do not
    give yet)."""

    @property
    def counters(self) -> Any: ...

    def gauges(self) -> dict[str, float]: ...

    def extra_counters(self) -> dict[str, float]: ...

    def per_source_gauges(self) -> dict[str, dict[str, float]]: ...

    def health(self) -> dict[str, Any]: ...


# name -> (label name, {label value: count}): counters the shell keeps apart from GatewayCounters, such as
# worker_errors by stage.
LabeledCounters = Callable[[], dict[str, tuple[str, dict[str, float]]]]


def build_version() -> str:
    try:
        return version("skewless")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _seconds_name(name: str) -> tuple[str, float]:
    """A gauge named in microseconds -> its name in seconds and the divisor to get there."""
    return (name.removesuffix("_us") + "_seconds", 1e6) if name.endswith("_us") else (name, 1.0)


def _is_percentile(name: str) -> bool:
    # The old hand-computed kafka_delivery_p50_us/p99_us gauges: replaced by the delivery latency histogram.
    head, _, tail = name.removesuffix("_us").rpartition("_p")
    return bool(head) and tail.isdigit()


def _worst(values: Iterable[float]) -> float:
    return max(values, key=abs)


# How the sources or streams beyond a label limit aggregate into OTHER, per value name; unlisted names are summed.
_OTHER_AGGREGATE: dict[str, Callable[[Iterable[float]], float]] = {
    "offset_us": _worst, "skew_ppm": _worst, "rtt_us": max, "error_bound_us": max, "sync_samples": min,
    "watermark_us": min,
}


def limit_labels(values: Mapping[str, Mapping[str, float]], keep: Iterable[str]) -> dict[str, dict[str, float]]:
    """``values`` with every label value not in ``keep`` folded into one OTHER entry (see _OTHER_AGGREGATE)."""
    kept = set(keep)
    limited = {label: dict(v) for label, v in values.items() if label in kept}
    rest: dict[str, list[float]] = {}
    for label, v in values.items():
        if label not in kept:
            for name, value in v.items():
                rest.setdefault(name, []).append(value)
    if rest:
        limited[OTHER] = {name: _OTHER_AGGREGATE.get(name, sum)(vs) for name, vs in rest.items()}
    return limited


def worst_sources(per_source: Mapping[str, Mapping[str, float]], limit: int) -> list[str]:
    """The ``limit`` sources an operator most needs to see: largest clock error bound, then most events held."""
    ranked = sorted(per_source, key=lambda s: (-per_source[s].get("error_bound_us", 0.0),
                                               -per_source[s].get("buffered_events", 0.0), s))
    return ranked[:limit]


class GatewayCollector(Collector):
    def __init__(self, source: CounterSource, labeled_counters: LabeledCounters | None = None, *,
                 max_stream_labels: int = MAX_STREAM_LABELS, max_source_labels: int = MAX_SOURCE_LABELS) -> None:
        self._source = source
        self._labeled_counters = labeled_counters
        self._max_stream_labels = max_stream_labels
        self._max_source_labels = max_source_labels
        # Streams keep the label they got first: a counter that moved between a stream and OTHER would look reset.
        self._stream_labels: set[str] = set()
        # Until the cores keep a Histogram (IngestCore.delivery_latency), the delivery latencies are sampled from
        # their last DELIVERY_LATENCY_SAMPLES reports: id(core) -> (core, deliveries already observed).
        self._sampled_latency = Histogram(DELIVERY_LATENCY_BUCKETS_US)
        self._sampled_cores: dict[int, tuple[Any, int]] = {}
        self._version = build_version()

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("skewless_build_info", "Skewless version and wire/record contract version; always 1",
                                 labels=["version", "contract_version"])
        info.add_metric([self._version, str(CONTRACT_VERSION)], 1.0)
        yield info
        yield from self._counters()
        yield from self._gauges()
        yield from self._histograms()
        yield from self._per_source()
        yield from self._per_stream()

    # -- gateway-wide ----------------------------------------------------------------------------------------------

    def _counters(self) -> Iterator[Metric]:
        counters = self._source.counters
        errors = CounterMetricFamily("skewless_gateway_session_errors",
                                     "Connections closed for a session error, by error code", labels=["code"])
        for f in fields(counters):
            value = getattr(counters, f.name)
            if not isinstance(value, int):
                continue
            if f.name in ERROR_CODE_COUNTERS:
                errors.add_metric([ERROR_CODE_COUNTERS[f.name]], float(value))
                continue
            counter = CounterMetricFamily(f"skewless_gateway_{f.name}", COUNTER_HELP.get(f.name, f.name))
            counter.add_metric([], float(value))
            yield counter
        yield errors
        for name, value in self._source.extra_counters().items():
            counter = CounterMetricFamily(f"skewless_gateway_{name}", COUNTER_HELP.get(name, name))
            counter.add_metric([], value)
            yield counter
        if self._labeled_counters is not None:
            for name, (label, values) in self._labeled_counters().items():
                counter = CounterMetricFamily(f"skewless_gateway_{name}", COUNTER_HELP.get(name, f"{name} by {label}"),
                                              labels=[label])
                for label_value, value in values.items():
                    counter.add_metric([label_value], value)
                yield counter

    def _gauges(self) -> Iterator[Metric]:
        for name, value in self._source.gauges().items():
            if _is_percentile(name):
                continue
            family_name, scale = _seconds_name(name)
            gauge = GaugeMetricFamily(f"skewless_gateway_{family_name}", GAUGE_HELP.get(name, family_name))
            gauge.add_metric([], value / scale)
            yield gauge
        health = self._source.health()
        healthy = GaugeMetricFamily("skewless_gateway_healthy", "1 when /healthz answers 200 (status ok), else 0")
        healthy.add_metric([], 1.0 if health.get("status") == "ok" else 0.0)
        yield healthy
        if "kafka_backpressure" in health:
            pressure = GaugeMetricFamily("skewless_gateway_kafka_backpressure",
                                         "1 while Kafka refuses produces (its queue is full), else 0")
            pressure.add_metric([], 1.0 if health["kafka_backpressure"] else 0.0)
            yield pressure
        if isinstance(health.get("reference_clock_error_us"), int):
            reference = GaugeMetricFamily("skewless_gateway_reference_clock_error_seconds",
                                          "This host's clock error bound against common time, added to every "
                                          "event's uncertainty")
            reference.add_metric([], health["reference_clock_error_us"] / 1e6)
            yield reference

    def _histograms(self) -> Iterator[Metric]:
        histograms = getattr(self._source, "histograms", None)
        found: Mapping[str, Histogram] = histograms() if callable(histograms) else {}
        if "kafka_delivery_latency" not in found:
            latency = self._core_latency()
            if latency is not None:
                found = {**found, "kafka_delivery_latency": latency}
        helps = {"kafka_delivery_latency": "Time from an event's release by the reorderer to Kafka's delivery report",
                 "transaction_commit": "A shard's transaction commit, from taking the transaction to Kafka's answer: "
                                       "the flush of its records, the delivery-report audit and any retries"}
        for name, histogram in found.items():
            buckets = [("+Inf" if bound_s == float("inf") else repr(bound_s), float(n))
                       for bound_s, n in histogram.cumulative()]
            yield HistogramMetricFamily(f"skewless_gateway_{name}_seconds", helps.get(name, f"Gateway {name}"),
                                        buckets=buckets, sum_value=histogram.sum_us / 1e6)

    def _core_latency(self) -> Histogram | None:
        shards = getattr(self._source, "shards", None)
        if shards is None:
            return None
        cores = [runtime.core for runtime in dict(shards).values()]
        kept = [core.delivery_latency for core in cores if isinstance(getattr(core, "delivery_latency", None),
                                                                          Histogram)]
        if kept:
            return Histogram.merged(kept, kept[0].bounds_us)
        live: dict[int, tuple[Any, int]] = {}
        new_samples: list[int] = []
        for core in cores:
            window = getattr(core, "delivery_latencies_us", None)
            if window is None:
                continue
            samples = list(window)
            delivered = core.counters.events_published + core.counters.delivery_failures
            _, seen = self._sampled_cores.get(id(core), (core, 0))
            fresh = min(max(0, delivered - seen), len(samples))
            new_samples += samples[len(samples) - fresh:]
            live[id(core)] = (core, delivered)
        self._sampled_latency.observe_all_us(new_samples)
        self._sampled_cores = live
        return self._sampled_latency

    # -- per source and per stream -------------------------------------------------------------------------------

    def _per_source(self) -> Iterator[Metric]:
        # The gateway leaves out what is zero (a source holding no events, one known only by its clock state); a
        # series that comes and goes reads as missing data, so every known source gets both.
        per_source = {source_id: {**dict.fromkeys(SOURCE_GAUGES, 0.0), **values}
                      for source_id, values in self._source.per_source_gauges().items()}
        # Every source the gateway holds state for, connected or not (``known_sources``, when the gateway offers
        # it): the per-source gauges leave out a disconnected source that holds no events and has no clock estimate,
        # and 2,000 of those once held 1.2 GiB while this read 1.
        known = getattr(self._source, "known_sources", None)
        counted = set(per_source) | (set(known()) if callable(known) else set())
        sources = GaugeMetricFamily("skewless_gateway_sources",
                                    "Sources the gateway holds state for (connected, registered in a shard's core "
                                    "until freed, or with a clock estimate)")
        sources.add_metric([], float(len(counted)))
        yield sources
        limited = limit_labels(per_source, worst_sources(per_source, self._max_source_labels))
        families: dict[str, GaugeMetricFamily] = {}
        for source_id, values in sorted(limited.items()):
            for name, value in values.items():
                if name in TIMESYNC_GAUGES:
                    family_name, help_text, scale = TIMESYNC_GAUGES[name]
                elif name in SOURCE_GAUGES:
                    (family_name, help_text), scale = SOURCE_GAUGES[name], 1.0
                else:
                    (family_name, scale), help_text = _seconds_name(f"skewless_source_{name}"), f"Per-source {name}"
                family = families.get(family_name)
                if family is None:
                    family = families[family_name] = GaugeMetricFamily(family_name, help_text, labels=["source_id"])
                family.add_metric([source_id], value / scale)
        yield from families.values()

    def _per_stream(self) -> Iterator[Metric]:
        counters, gauges = self._stream_values()
        seen = sorted(set(counters) | set(gauges))
        for stream in seen:
            if len(self._stream_labels) >= self._max_stream_labels:
                break
            self._stream_labels.add(stream)
        for kind, values in (("counter", counters), ("gauge", gauges)):
            families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
            for stream, by_name in sorted(limit_labels(values, self._stream_labels).items()):
                for name, value in by_name.items():
                    family = families.get(name)
                    if family is None:
                        family = families[name] = _stream_family(kind, name)
                    family.add_metric([stream], value / _seconds_name(name)[1])
            yield from families.values()

    def _stream_values(self) -> tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]:
        """(counters, gauges) per stream, from the gateway when it offers them, else from its shards' cores."""
        per_stream_counters = getattr(self._source, "per_stream_counters", None)
        per_stream_gauges = getattr(self._source, "per_stream_gauges", None)
        if callable(per_stream_counters) and callable(per_stream_gauges):
            return per_stream_counters(), per_stream_gauges()
        counters: dict[str, dict[str, float]] = {}
        gauges: dict[str, dict[str, float]] = {}
        shards = getattr(self._source, "shards", None)
        for runtime in (dict(shards).values() if shards is not None else ()):
            core = runtime.core
            streams = core.streams() if hasattr(core, "streams") else list(getattr(core, "_progress", ()))
            published = getattr(core, "published_by_stream", {})
            for stream in streams:
                progress = core.stream_progress(stream)
                if progress is None:
                    continue
                c = counters.setdefault(stream, {})
                c["records"] = c.get("records", 0.0) + float(progress.next_offset)
                if stream in published:
                    c["events_published"] = c.get("events_published", 0.0) + float(published[stream])
                g = gauges.setdefault(stream, {})
                g["sources"] = g.get("sources", 0.0) + float(len(progress.next_seq))
                watermark_us = core.pipeline.watermark_us(stream)
                if watermark_us is not None:
                    # The stream's watermark on this gateway is its slowest shard's.
                    g["watermark_us"] = min(g.get("watermark_us", float(watermark_us)), float(watermark_us))
        return counters, gauges


_STREAM_HELP = {
    "records": "Records (events and punctuations) in this gateway's partitions of the stream's events topic",
    "events_published": "Events of the stream acknowledged by Kafka",
    "sources": "Sources of the stream this gateway tracks",
    "watermark_us": "The stream's promised watermark (reference time, Unix epoch); time() minus it is the lag",
}
_STREAM_NAMES = {"watermark_us": "skewless_stream_watermark_timestamp_seconds"}


def _stream_family(kind: str, name: str) -> CounterMetricFamily | GaugeMetricFamily:
    help_text = _STREAM_HELP.get(name, f"Per-stream {name}")
    if kind == "counter":
        return CounterMetricFamily(f"skewless_stream_{name}", help_text, labels=["stream"])
    family_name = _STREAM_NAMES.get(name) or _seconds_name(f"skewless_stream_{name}")[0]
    return GaugeMetricFamily(family_name, help_text, labels=["stream"])


def make_registry(source: CounterSource, labeled_counters: LabeledCounters | None = None, *,
                  max_stream_labels: int = MAX_STREAM_LABELS, max_source_labels: int = MAX_SOURCE_LABELS,
                  process_collectors: bool = True) -> CollectorRegistry:
    """The gateway's registry: its collector plus the process (CPU, memory, file descriptors), platform (Python
    version) and garbage-collector collectors prometheus_client registers globally by default."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GatewayCollector(source, labeled_counters, max_stream_labels=max_stream_labels,
                                       max_source_labels=max_source_labels))
    if process_collectors:
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


class MetricsServer:
    """Minimal HTTP/1.0 server: GET /metrics (Prometheus text) and GET /healthz (JSON, 503 when unhealthy).

    It runs its own event loop on a daemon thread: under 10,000 busy connections one iteration of the gateway's loop
    can take hundreds of milliseconds, and a health probe needing several iterations there took seconds. Here it
    only waits for the GIL (released every few milliseconds). The gateway's state is read from this thread; the
    few Python-level iterations that could see a dict change size are retried.
    """

    MAX_REQUEST_BYTES = 8192
    # With tens of thousands of (source, stream) entries changing (a hello flood, idle sources being freed), five
    # immediate retries all failed and /metrics answered nothing: retry longer, yielding the GIL in between.
    RETRIES = 50
    RETRY_PAUSE_S = 0.002

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
                time.sleep(self.RETRY_PAUSE_S)  # let the gateway thread finish its change
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
