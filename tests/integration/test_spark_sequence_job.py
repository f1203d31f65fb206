"""The SASE sequence job on real Kafka + Spark: negation, a late negation event, compensations."""

from __future__ import annotations

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
QUERY = "EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 10 s"
# id 1: shelf -> exit, nothing between: a match.   id 2: shelf -> checkout -> exit: no match.
# id 3: shelf -> exit first; its checkout (between them) arrives later: aggressive emits, then retracts.
FIRST = [(1, "SHELF", 1000), (2, "SHELF", 1500), (2, "CHECKOUT", 1800), (1, "EXIT", 2000), (2, "EXIT", 2500),
         (3, "SHELF", 3000), (3, "EXIT", 4000)]
LATE_CHECKOUT = (3, "CHECKOUT", 3500)


def records(rows: list[tuple[int, str, int]], first_seq: int) -> list[dict[str, Any]]:
    return [event_record("store", "rfid-1", first_seq + i, BASE_US + ms * MS, 0, {"id": item, "type": kind})
            for i, (item, kind, ms) in enumerate(rows)]


def summary(results: list[dict[str, Any]]) -> list[tuple[str, str, list[tuple[str, int]]]]:
    return [(r["record"], r["partition"], [(e["event_type"], (e["ts"] - BASE_US) // MS) for e in r["events"]])
            for r in results]


def run(spark, kafka, prefix: str, mode: str, tmp_path) -> Any:
    return sequence_job.start(spark, sequence_job.SequenceOptions(
        bootstrap_servers=kafka.bootstrap_servers, query=QUERY, topic_prefix=prefix, streams=("store",),
        mode=mode, checkpoint_dir=str(tmp_path / f"ckpt-{mode}"), console=False,
        processing_time="500 milliseconds"))


def test_aggressive_mode_emits_then_compensates_and_conservative_never_emits_the_invalid_match(
        kafka, spark, topic_prefix, tmp_path):
    topics = TopicNames(topic_prefix)
    output = topics.results("sequence")
    produce(kafka.bootstrap_servers, topics.events("store"), records(FIRST, 0))
    query = run(spark, kafka, topic_prefix, "aggressive", tmp_path)
    try:
        wait_for_results(kafka.bootstrap_servers, output, lambda rs: len(rs) >= 2, query)
        # The checkout of id 3 arrives after its match went out, within the 5 s watermark delay.
        produce(kafka.bootstrap_servers, topics.events("store"),
                [*records([LATE_CHECKOUT], len(FIRST)), punctuation_record("store", BASE_US + 30_000 * MS)])
        results = wait_for_results(kafka.bootstrap_servers, output, lambda rs: len(rs) >= 3, query)
        query.processAllAvailable()
    finally:
        query.stop()
    results = [orjson.loads(v) for _k, v in read_topic(kafka.bootstrap_servers, output)]
    assert summary(results) == [
        ("match", "1", [("SHELF", 1000), ("EXIT", 2000)]),
        ("match", "3", [("SHELF", 3000), ("EXIT", 4000)]),
        ("retract", "3", [("SHELF", 3000), ("EXIT", 4000)]),
    ]

    # Conservative mode on the same (now complete) topic: only the permanently valid match, released once the
    # punctuation closes its negation range.
    conservative_prefix = topic_prefix
    query = run(spark, kafka, conservative_prefix, "conservative", tmp_path)
    try:
        results = wait_for_results(kafka.bootstrap_servers, output, lambda rs: len(rs) >= 4, query)
        query.processAllAvailable()
    finally:
        query.stop()
    results = [orjson.loads(v) for _k, v in read_topic(kafka.bootstrap_servers, output)]
    assert summary(results[3:]) == [("match", "1", [("SHELF", 1000), ("EXIT", 2000)])]
