import json
import re
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from gateway.ingest import GatewayCounters
from gateway.metrics import make_registry
from reorder.pipeline import PipelineCounters

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana-dashboard.json"


class FakeGateway:
    def __init__(self) -> None:
        self.counters = GatewayCounters(events_published=7, duplicates=2)
        self.pipeline_counters = PipelineCounters(late=3)

    def extra_counters(self) -> dict[str, float]:
        names = PipelineCounters.__dataclass_fields__
        return {f"pipeline_{k}": float(getattr(self.pipeline_counters, k)) for k in names}

    def gauges(self) -> dict[str, float]:
        return {"connections": 2.0, "kafka_pending": 0.0, "kafka_delivery_p50_us": 900.0,
                "kafka_delivery_p99_us": 4000.0}

    def per_source_gauges(self) -> dict[str, dict[str, float]]:
        return {"s1": {"offset_us": -5.0, "rtt_us": 80.0, "skew_ppm": 1.5, "error_bound_us": 60.0,
                       "buffered_events": 4.0, "connections": 1.0}}

    def health(self) -> dict[str, Any]:
        return {"status": "ok"}


def exposition() -> str:
    return generate_latest(make_registry(FakeGateway())).decode()


def test_exposition_values():
    lines = exposition().splitlines()
    assert "skewless_gateway_events_published_total 7.0" in lines
    assert "skewless_gateway_duplicates_total 2.0" in lines
    assert "skewless_gateway_pipeline_late_total 3.0" in lines
    assert 'skewless_source_offset_us{source_id="s1"} -5.0' in lines
    assert "skewless_gateway_connections 2.0" in lines


def test_every_dashboard_metric_is_exported():
    text = exposition()
    exported = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    wanted = set(re.findall(r"skewless_[a-z0-9_]+", json.dumps(json.loads(DASHBOARD.read_text()))))
    assert wanted
    assert wanted - exported == set()


def test_json_log_lines():
    import logging

    import orjson

    from gateway.logs import JsonFormatter

    record = logging.LogRecord("gateway.server", logging.WARNING, __file__, 1, "closing %s", ("conn-7",), None)
    record.created = 1_800_000_000.25
    assert orjson.loads(JsonFormatter().format(record)) == {
        "ts_us": 1_800_000_000_250_000, "level": "warning", "logger": "gateway.server", "message": "closing conn-7"}
