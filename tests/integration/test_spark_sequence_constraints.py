"""The SASE sequence job with a constraint on real Kafka + Spark (docs/constraints.md): Li's Ex. 3.9 as two traces
of one stream. Trace 1 (a k b b k c) is certain at its first K: an early alert, then its match. Trace 2 (a b b k c)
can no longer match at its first B: terminated, and its later events produce nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.reader import read_topic
from contract.topics import TopicNames
from spark_jobs import sequence as sequence_job
from tests.integration.spark_job_support import (
    BASE_US,
    event_record,
    produce,
    punctuation_record,
    wait_for_results,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MS = 1_000
QUERY = "EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 10 s"
CONSTRAINT = "A+ K* B+ K C+"
# (id, type, ms): every trace spans less than the 10 s window, the promise --early-alerts needs.
FIRST = [(1, "A", 1000), (2, "A", 1050), (1, "K", 2000), (2, "B", 4050)]
SECOND = [(1, "B", 6000), (1, "B", 7000), (2, "B", 7050), (1, "K", 8000), (2, "K", 8050), (1, "C", 9000),
          (2, "C", 9050)]


def records(rows: list[tuple[int, str, int]], first_seq: int) -> list[dict[str, Any]]:
    return [event_record("store", "rfid-1", first_seq + i, BASE_US + ms * MS, 0, {"id": item, "type": kind})
            for i, (item, kind, ms) in enumerate(rows)]


def summary(results: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["record"], r["partition"], r.get("position"), r.get("reason"),
             [(e["event_type"], (e["ts"] - BASE_US) // MS, e["event_id"]) for e in r["events"]]) for r in results]


def test_early_alert_termination_and_match_records(kafka: Any, spark: Any, topic_prefix: str, tmp_path: Path) -> None:
    topics = TopicNames(topic_prefix)
    output = topics.results("sequence")
    produce(kafka.bootstrap_servers, topics.events("store"),
            [*records(FIRST, 0), punctuation_record("store", BASE_US + 5_000 * MS)])
    query = sequence_job.start(spark, sequence_job.SequenceOptions(
        bootstrap_servers=kafka.bootstrap_servers, query=QUERY, topic_prefix=topic_prefix, streams=("store",),
        constraint=CONSTRAINT, constraint_checker="lightweight", early_alerts=True,
        checkpoint_dir=str(tmp_path / "ckpt"), console=False, processing_time="500 milliseconds"))
    try:
        wait_for_results(kafka.bootstrap_servers, output, lambda rs: len(rs) >= 2, query)
        produce(kafka.bootstrap_servers, topics.events("store"),
                [*records(SECOND, len(FIRST)), punctuation_record("store", BASE_US + 30_000 * MS)])
        wait_for_results(kafka.bootstrap_servers, output, lambda rs: len(rs) >= 3, query)
        query.processAllAvailable()
    finally:
        query.stop()
    raw = list(read_topic(kafka.bootstrap_servers, output))
    results = [orjson.loads(v) for _k, v in raw]
    assert summary(results) == [
        ("early_alert", "1", 2, "satisfiable", [("K", 2000, "rfid-1:2")]),
        ("monitor_terminated", "2", 2, "unsatisfiable", [("B", 4050, "rfid-1:3")]),
        ("match", "1", None, None, [("A", 1000, "rfid-1:0"), ("K", 2000, "rfid-1:2"), ("K", 8000, "rfid-1:7"),
                                    ("C", 9000, "rfid-1:9")]),
    ]
    keys = [k.decode() if isinstance(k, bytes) else k for k, _v in raw]
    assert keys[:2] == ["store|1|early_alert|rfid-1:2", "store|2|monitor_terminated|rfid-1:3"]
    assert results[1] == {
        "job": "sequence", "record": "monitor_terminated", "stream": "store", "partition": "2",
        "kind": "monitor_terminated", "reason": "unsatisfiable", "trace": 2, "position": 2,
        "events": [{"event_type": "B", "ts": BASE_US + 4_050 * MS, "attrs": {"id": 2, "type": "B"},
                    "event_id": "rfid-1:3"}],
        "emitted_at": BASE_US + 4_050 * MS}
