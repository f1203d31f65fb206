"""Known traces for the Spark CEP jobs: contract records written to a real Kafka topic as the gateway would, and
the job's results read back from its real output topic."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from confluent_kafka import Producer

from broker.admin import ensure_topics
from broker.reader import read_topic

BASE_US = 1_700_000_000_000_000  # a whole second: windows line up with the hand-computed ones


def event_record(stream: str, source_id: str, seq: int, ref_ts_us: int, uncertainty_us: int,
                 payload: dict[str, Any]) -> dict[str, Any]:
    return {"v": 1, "kind": "event", "stream": stream, "source_id": source_id, "seq": seq,
            "source_ts_us": ref_ts_us, "ref_ts_us": ref_ts_us, "uncertainty_us": uncertainty_us,
            "arrival_ts_us": ref_ts_us, "release_ts_us": ref_ts_us, "late": False, "payload": payload}


def punctuation_record(stream: str, watermark_us: int) -> dict[str, Any]:
    return {"v": 1, "kind": "punctuation", "stream": stream, "watermark_us": watermark_us,
            "release_ts_us": watermark_us}


def produce(bootstrap_servers: str, topic: str, records: Iterable[dict[str, Any]]) -> None:
    ensure_topics(bootstrap_servers, [topic])
    producer = Producer({"bootstrap.servers": bootstrap_servers, "enable.idempotence": True})
    for record in records:
        key = b"__punctuation__" if record["kind"] == "punctuation" else str(record["source_id"]).encode()
        producer.produce(topic, key=key, value=orjson.dumps(record))
    assert producer.flush(30) == 0


def wait_for_results(bootstrap_servers: str, topic: str, done: Callable[[list[dict[str, Any]]], bool],
                     query: Any, timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Poll the job's output topic until `done(records)`; fail with what arrived (and the query's error) if not."""
    deadline = time.monotonic() + timeout_s
    records: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        if query.exception() is not None:
            raise AssertionError(f"streaming query failed: {query.exception()}")
        records = [orjson.loads(v) for _k, v in read_topic(bootstrap_servers, topic)]
        if done(records):
            return records
        time.sleep(1.0)
    raise AssertionError(f"results incomplete after {timeout_s} s: {records}")
