import json
import re
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from contract.records import CONTRACT_VERSION
from gateway.histograms import DELIVERY_LATENCY_BUCKETS_US, Histogram
from gateway.ingest import GatewayCounters, StreamProgress
from gateway.metrics import OTHER, GatewayCollector, build_version, limit_labels, make_registry, worst_sources
from reorder.pipeline import PipelineCounters

DASHBOARD = Path(__file__).resolve().parents[3] / "deploy" / "grafana-dashboard.json"
PROVISIONING = DASHBOARD.parent / "grafana" / "provisioning"


class FakeGateway:
    """What gateway/server.py offers the collector today: no histograms() nor per-stream methods."""

    def __init__(self) -> None:
        self.counters = GatewayCounters(events_published=7, duplicates=2, frames_too_large=1, timeouts=4,
                                        auth_failures=3)
        self.pipeline_counters = PipelineCounters(late=3)
        self.sources: dict[str, dict[str, float]] = {
            "s1": {"offset_us": -5.0, "rtt_us": 80.0, "skew_ppm": 1.5, "error_bound_us": 60.0,
                   "buffered_events": 4.0, "connections": 1.0, "sync_samples": 8.0}}
        self.status = "ok"

    def extra_counters(self) -> dict[str, float]:
        names = PipelineCounters.__dataclass_fields__
        return {f"pipeline_{k}": float(getattr(self.pipeline_counters, k)) for k in names}

    def gauges(self) -> dict[str, float]:
        return {"connections": 2.0, "kafka_pending": 0.0, "shards_served": 1.0, "kafka_delivery_p50_us": 900.0,
                "kafka_delivery_p99_us": 4000.0}

    def per_source_gauges(self) -> dict[str, dict[str, float]]:
        return self.sources

    def health(self) -> dict[str, Any]:
        return {"status": self.status, "kafka_backpressure": False, "reference_clock_error_us": 250}

    def labeled_counters(self) -> dict[str, tuple[str, dict[str, float]]]:
        return {"worker_errors": ("stage", {"session": 0.0, "events": 1.0})}


class FullGateway(FakeGateway):
    """A gateway with every optional method the collector reads."""

    def __init__(self) -> None:
        super().__init__()
        self.latency = Histogram(DELIVERY_LATENCY_BUCKETS_US)
        self.latency.observe_all_us([100, 101, 900, 2_000_000, 30_000_000])
        self.commits = Histogram(DELIVERY_LATENCY_BUCKETS_US)
        self.commits.observe_all_us([3_000, 37_500])

    def histograms(self) -> dict[str, Histogram]:
        return {"kafka_delivery_latency": self.latency, "transaction_commit": self.commits}

    def extra_counters(self) -> dict[str, float]:
        # The counters gateway.server.Gateway adds to the pipeline's (cluster and logging).
        cluster = ("shard_handovers", "log_lines_suppressed", "shards_fenced", "owner_unavailable_answers")
        return {**super().extra_counters(), **{name: 0.0 for name in cluster}}

    def per_stream_counters(self) -> dict[str, dict[str, float]]:
        return {"orders": {"records": 12.0, "events_published": 10.0}}

    def per_stream_gauges(self) -> dict[str, dict[str, float]]:
        return {"orders": {"watermark_us": 1_800_000_000_500_000.0, "sources": 2.0}}


def exposition(gateway: Any = None, **limits: int) -> list[str]:
    gateway = gateway or FakeGateway()
    registry = make_registry(gateway, gateway.labeled_counters, process_collectors=False, **limits)
    return generate_latest(registry).decode().splitlines()


def samples(lines: list[str], prefix: str) -> list[str]:
    return [line for line in lines if line.startswith(prefix) and not line.startswith("#")]


# -- the histogram of plain ints ----------------------------------------------------------------------------------


def test_histogram_buckets_are_inclusive_upper_bounds():
    histogram = Histogram((10, 100))
    histogram.observe_all_us([0, 10, 11, 100, 101, 5_000])
    assert histogram.counts == [2, 2, 2]
    assert (histogram.count, histogram.sum_us) == (6, 5_222)
    assert histogram.cumulative() == [(1e-05, 2), (0.0001, 4), (float("inf"), 6)]


def test_histograms_merge_and_refuse_other_bounds():
    a, b = Histogram((10, 100)), Histogram((10, 100))
    a.observe_us(5)
    b.observe_all_us([50, 500])
    merged = Histogram.merged([a, b], (10, 100))
    assert (merged.counts, merged.count, merged.sum_us) == ([1, 1, 1], 3, 555)
    with pytest.raises(ValueError, match="cannot merge"):
        Histogram.merged([Histogram((10,))], (10, 100))
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram((100, 10))


# -- the exposition -----------------------------------------------------------------------------------------------


def test_exposition_values():
    lines = exposition()
    assert "skewless_gateway_events_published_total 7.0" in lines
    assert "skewless_gateway_duplicates_total 2.0" in lines
    assert "skewless_gateway_pipeline_late_total 3.0" in lines
    assert "skewless_gateway_connections 2.0" in lines
    assert 'skewless_gateway_worker_errors_total{stage="events"} 1.0' in lines
    assert f'skewless_build_info{{contract_version="{CONTRACT_VERSION}",version="{build_version()}"}} 1.0' in lines
    assert "skewless_gateway_healthy 1.0" in lines
    assert "skewless_gateway_kafka_backpressure 0.0" in lines
    assert "skewless_gateway_reference_clock_error_seconds 0.00025" in lines
    assert "skewless_gateway_sources 1.0" in lines


def test_error_codes_are_one_family_with_a_code_label():
    lines = exposition()
    assert sorted(samples(lines, "skewless_gateway_session_errors_total")) == [
        'skewless_gateway_session_errors_total{code="auth"} 3.0',
        'skewless_gateway_session_errors_total{code="frame_too_large"} 1.0',
        'skewless_gateway_session_errors_total{code="malformed_frame"} 0.0',
        'skewless_gateway_session_errors_total{code="other"} 0.0',
        'skewless_gateway_session_errors_total{code="timeout"} 4.0']
    for old in ("frames_too_large", "malformed_frames", "timeouts", "auth_failures", "protocol_errors"):
        assert not samples(lines, f"skewless_gateway_{old}")


def test_time_sync_per_source_in_seconds_and_ratio():
    lines = exposition()
    assert samples(lines, "skewless_timesync_") == [
        'skewless_timesync_offset_seconds{source_id="s1"} -5e-06',
        'skewless_timesync_rtt_seconds{source_id="s1"} 8e-05',
        'skewless_timesync_skew_ratio{source_id="s1"} 1.5e-06',
        'skewless_timesync_error_bound_seconds{source_id="s1"} 6e-05',
        'skewless_timesync_samples{source_id="s1"} 8.0']
    assert 'skewless_source_buffered_events{source_id="s1"} 4.0' in lines
    assert 'skewless_source_connections{source_id="s1"} 1.0' in lines


def test_no_family_in_microseconds_and_no_percentile_gauges():
    for gateway in (FakeGateway(), FullGateway()):
        registry = make_registry(gateway, gateway.labeled_counters)
        names = [family.name for family in registry.collect()]
        assert names
        assert [n for n in names if "_us" in n or "_ppm" in n or re.search(r"_p\d+", n)] == []


def test_transaction_commit_histogram_in_seconds_with_its_help():
    lines = exposition(FullGateway())
    assert ("# HELP skewless_gateway_transaction_commit_seconds A shard's transaction commit, from taking the "
            "transaction to Kafka's answer: the flush of its records, the delivery-report audit and any retries"
            in lines)
    buckets = samples(lines, "skewless_gateway_transaction_commit_seconds_bucket")
    assert 'skewless_gateway_transaction_commit_seconds_bucket{le="0.0025"} 0.0' in buckets
    assert 'skewless_gateway_transaction_commit_seconds_bucket{le="0.005"} 1.0' in buckets
    assert 'skewless_gateway_transaction_commit_seconds_bucket{le="0.05"} 2.0' in buckets
    assert samples(lines, "skewless_gateway_transaction_commit_seconds_sum") == [
        "skewless_gateway_transaction_commit_seconds_sum 0.0405"]


def test_delivery_latency_histogram_in_seconds():
    lines = exposition(FullGateway())
    assert "# TYPE skewless_gateway_kafka_delivery_latency_seconds histogram" in lines
    buckets = samples(lines, "skewless_gateway_kafka_delivery_latency_seconds_bucket")
    assert buckets[0] == 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="0.0001"} 1.0'
    assert buckets[1] == 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="0.00025"} 2.0'
    assert 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="0.001"} 3.0' in buckets
    assert 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="2.5"} 4.0' in buckets
    assert buckets[-1] == 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="+Inf"} 5.0'
    assert len(buckets) == len(DELIVERY_LATENCY_BUCKETS_US) + 1
    assert "skewless_gateway_kafka_delivery_latency_seconds_count 5.0" in lines
    assert "skewless_gateway_kafka_delivery_latency_seconds_sum 32.001101" in lines


@dataclass
class FakeCore:
    counters: GatewayCounters = field(default_factory=GatewayCounters)
    delivery_latencies_us: deque[int] = field(default_factory=lambda: deque(maxlen=4))
    _progress: dict[str, StreamProgress] = field(default_factory=dict)

    def deliver(self, *latencies_us: int) -> None:
        self.delivery_latencies_us.extend(latencies_us)
        self.counters.events_published += len(latencies_us)

    def stream_progress(self, stream: str) -> StreamProgress | None:
        return self._progress.get(stream)

    @property
    def pipeline(self) -> "FakeCore":
        return self

    def watermark_us(self, stream: str) -> int | None:
        return {"a": 2_000_000, "b": None}.get(stream, 1_000_000)


@dataclass
class FakeRuntime:
    core: FakeCore


class ShardedGateway(FakeGateway):
    """Today's gateway: latencies as a window of samples per shard core, streams only in the cores."""

    def __init__(self, *cores: FakeCore) -> None:
        super().__init__()
        self.shards = {i: FakeRuntime(core) for i, core in enumerate(cores)}


def test_delivery_latency_sampled_from_the_cores_until_they_keep_a_histogram():
    core = FakeCore()
    gateway = ShardedGateway(core)
    collector = GatewayCollector(gateway)

    def counts() -> tuple[list[int], int]:
        family = next(f for f in collector.collect() if f.name == "skewless_gateway_kafka_delivery_latency_seconds")
        bucket = {s.labels["le"]: s.value for s in family.samples if s.name.endswith("_bucket")}
        count = next(s.value for s in family.samples if s.name.endswith("_count"))
        return [int(bucket["0.0001"]), int(bucket["0.001"]), int(bucket["+Inf"])], int(count)

    core.deliver(50, 700)
    assert counts() == ([1, 2, 2], 2)
    assert counts() == ([1, 2, 2], 2)  # nothing delivered since: nothing observed twice
    core.deliver(80, 80, 80, 900, 20_000_000)  # 5 deliveries, the window keeps the last 4
    assert counts() == ([3, 5, 6], 6)


def test_delivery_latency_from_the_cores_histograms_when_they_keep_one():
    cores = [FakeCore(), FakeCore()]
    for core, latencies_us in zip(cores, ([50, 700], [3_000_000]), strict=True):
        core.delivery_latency = Histogram(DELIVERY_LATENCY_BUCKETS_US)
        core.delivery_latency.observe_all_us(latencies_us)
        core.deliver(1)  # a sample in the old window too: not counted twice
    lines = exposition(ShardedGateway(*cores))
    assert 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="0.0001"} 1.0' in lines
    assert 'skewless_gateway_kafka_delivery_latency_seconds_bucket{le="2.5"} 2.0' in lines
    assert "skewless_gateway_kafka_delivery_latency_seconds_count 3.0" in lines
    assert "skewless_gateway_kafka_delivery_latency_seconds_sum 3.00075" in lines


def test_streams_from_the_cores_with_a_sticky_label_limit():
    core = FakeCore()
    for stream, offset, sources in (("b", 5, 1), ("a", 10, 2)):
        progress = StreamProgress(stream)
        progress.next_offset = offset
        progress.next_seq.update({f"s{i}": 1 for i in range(sources)})
        core._progress[stream] = progress
    collector = GatewayCollector(ShardedGateway(core), max_stream_labels=1)

    def stream_samples() -> dict[str, dict[str, float]]:
        found: dict[str, dict[str, float]] = {}
        for family in collector.collect():
            for s in family.samples:
                if "stream" in s.labels:
                    found.setdefault(s.name, {})[s.labels["stream"]] = s.value
        return found

    assert stream_samples() == {
        "skewless_stream_records_total": {"a": 10.0, OTHER: 5.0},
        "skewless_stream_sources": {"a": 2.0, OTHER: 1.0},
        "skewless_stream_watermark_timestamp_seconds": {"a": 2.0}}
    progress = StreamProgress("0")  # sorts first, seen later: "a" keeps its label
    progress.next_offset = 1
    core._progress["0"] = progress
    assert stream_samples()["skewless_stream_records_total"] == {"a": 10.0, OTHER: 6.0}
    assert stream_samples()["skewless_stream_watermark_timestamp_seconds"] == {"a": 2.0, OTHER: 1.0}


def test_per_stream_families_from_the_gateway():
    lines = exposition(FullGateway())
    assert 'skewless_stream_records_total{stream="orders"} 12.0' in lines
    assert 'skewless_stream_events_published_total{stream="orders"} 10.0' in lines
    assert 'skewless_stream_watermark_timestamp_seconds{stream="orders"} 1.8000000005e+09' in lines
    assert 'skewless_stream_sources{stream="orders"} 2.0' in lines


def test_sources_beyond_the_limit_fold_into_other():
    gateway = FakeGateway()
    gateway.sources = {
        "quiet": {"offset_us": 3.0, "error_bound_us": 10.0, "rtt_us": 5.0, "connections": 1.0},
        "bad": {"offset_us": -900.0, "error_bound_us": 5_000.0, "rtt_us": 70.0, "connections": 1.0},
        "worse": {"offset_us": 40.0, "error_bound_us": 9_000.0, "rtt_us": 20.0, "connections": 2.0},
        "meh": {"offset_us": -50.0, "error_bound_us": 100.0, "rtt_us": 90.0, "connections": 1.0}}
    assert worst_sources(gateway.sources, 2) == ["worse", "bad"]
    lines = exposition(gateway, max_source_labels=2)
    assert samples(lines, "skewless_timesync_offset_seconds") == [
        f'skewless_timesync_offset_seconds{{source_id="{OTHER}"}} -5e-05',
        'skewless_timesync_offset_seconds{source_id="bad"} -0.0009',
        'skewless_timesync_offset_seconds{source_id="worse"} 4e-05']
    assert f'skewless_timesync_rtt_seconds{{source_id="{OTHER}"}} 9e-05' in lines
    assert f'skewless_timesync_error_bound_seconds{{source_id="{OTHER}"}} 0.0001' in lines
    assert f'skewless_source_connections{{source_id="{OTHER}"}} 2.0' in lines
    assert "skewless_gateway_sources 4.0" in lines


def test_limit_labels_keeps_everything_under_the_limit():
    values = {"x": {"events": 1.0}, "y": {"events": 2.0}}
    assert limit_labels(values, ["x", "y"]) == values
    assert limit_labels(values, []) == {OTHER: {"events": 3.0}}


def test_process_platform_and_gc_collectors_in_the_gateway_registry():
    gateway = FakeGateway()
    names = {family.name for family in make_registry(gateway).collect()}
    assert {"process_cpu_seconds", "process_resident_memory_bytes", "python_info", "python_gc_collections"} <= names


def test_every_family_has_the_type_its_name_promises():
    families = list(text_string_to_metric_families("\n".join(exposition(FullGateway())) + "\n"))
    types = {f.name: f.type for f in families}
    assert types["skewless_gateway_events_published"] == "counter"
    assert types["skewless_gateway_session_errors"] == "counter"
    assert types["skewless_gateway_kafka_delivery_latency_seconds"] == "histogram"
    assert types["skewless_timesync_offset_seconds"] == "gauge"
    assert types["skewless_stream_records"] == "counter"
    assert all(t == "counter" for n, t in types.items() if n.endswith("_total"))


# -- the dashboard -------------------------------------------------------------------------------------------------


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_every_dashboard_metric_is_exported():
    gateway = FullGateway()
    text = generate_latest(make_registry(gateway, gateway.labeled_counters)).decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = dashboard_exprs(dashboard) + [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    wanted = {m for e in exprs for m in re.findall(r"\b((?:skewless|process|python)_[a-z0-9_]+)", e)}
    assert len(wanted) > 20
    assert wanted - exported == set()


def test_every_dashboard_panel_has_a_unit_and_the_datasource_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert dashboard["panels"]
    for panel in dashboard["panels"]:
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"]), panel["title"]
    titles = [p["title"] for p in dashboard["panels"]]
    assert len(titles) == len(set(titles))


def test_grafana_provisioning_points_at_the_dashboard():
    import yaml

    datasource = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    assert [d["type"] for d in datasource["datasources"]] == ["prometheus"]
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "skewless.yaml").read_text())["providers"]
    assert [p["options"]["path"] for p in providers] == ["/etc/grafana/dashboards"]


def test_json_log_lines():
    import logging

    import orjson

    from gateway.logs import JsonFormatter

    record = logging.LogRecord("gateway.server", logging.WARNING, __file__, 1, "closing %s", ("conn-7",), None)
    record.created = 1_800_000_000.25
    assert orjson.loads(JsonFormatter().format(record)) == {
        "ts_us": 1_800_000_000_250_000, "level": "warning", "logger": "gateway.server", "message": "closing conn-7"}


def test_operations_doc_lists_every_family():
    doc = (DASHBOARD.parents[1] / "docs" / "operations.md").read_text()
    gateway = FullGateway()
    registry = make_registry(gateway, gateway.labeled_counters)
    for family in registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        assert f"`{name}" in doc, name


def test_stream_published_counts_from_the_cores_when_they_keep_them():
    class CountingCore(FakeCore):
        def streams(self) -> tuple[str, ...]:
            return ("a",)

    cores = [CountingCore(), CountingCore()]
    for core, published in zip(cores, (3, 4), strict=True):
        core._progress["a"] = StreamProgress("a")
        core._progress["hidden"] = StreamProgress("hidden")  # not in streams(): not read
        core.published_by_stream = {"a": published}
    lines = exposition(ShardedGateway(*cores))
    assert samples(lines, "skewless_stream_events_published_total") == [
        'skewless_stream_events_published_total{stream="a"} 7.0']
    assert samples(lines, "skewless_stream_records_total") == ['skewless_stream_records_total{stream="a"} 0.0']


def test_suggested_alerts_parse_and_name_exported_metrics():
    import yaml

    doc = (DASHBOARD.parents[1] / "docs" / "operations.md").read_text()
    block = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    rules = [rule for group in yaml.safe_load(block)["groups"] for rule in group["rules"]]
    assert len(rules) >= 8
    gateway = FullGateway()
    text = generate_latest(make_registry(gateway, gateway.labeled_counters)).decode()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    for rule in rules:
        assert rule["alert"].startswith("Skewless") and rule["annotations"]["summary"], rule
        named = set(re.findall(r"\b((?:skewless|process|python)_[a-z0-9_]+)", rule["expr"]))
        assert named, rule["alert"]
        assert named - exported == set(), rule["alert"]


def test_the_sources_gauge_counts_every_source_the_gateway_holds_state_for():
    """Issue 24 item 5: 2,000 hello-only sources that had disconnected held 1.2 GiB while the gauge read 1 (it
    counted connected or synced sources only)."""
    gateway = FakeGateway()
    gateway.known_sources = lambda: {"s1", "gone-1", "gone-2"}  # type: ignore[attr-defined]
    assert "skewless_gateway_sources 3.0" in exposition(gateway)
    assert "skewless_gateway_sources_forgotten_total 0.0" in exposition(gateway)


def test_every_counter_of_the_cores_has_help_text():
    from gateway.ingest import GatewayCounters
    from gateway.metrics import COUNTER_HELP, ERROR_CODE_COUNTERS
    from reorder.pipeline import PipelineCounters

    missing = [name for name in GatewayCounters.__dataclass_fields__
               if name not in COUNTER_HELP and name not in ERROR_CODE_COUNTERS]
    missing += [f"pipeline_{name}" for name in PipelineCounters.__dataclass_fields__
                if f"pipeline_{name}" not in COUNTER_HELP and name not in COUNTER_HELP]
    assert missing == []
