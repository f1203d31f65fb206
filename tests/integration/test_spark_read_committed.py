"""Spark's Kafka source on a transactional topic (the gateway publishes with transactions): with the jobs' read
options it returns the committed records only, across the offset gaps that commit/abort markers and aborted records
leave, including a batch that ends on a marker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from broker.admin import ensure_topics
from contract.topics import TopicNames
from spark_jobs.contract import read_kafka
from spark_jobs.stateful import read_contract_records
from tests.integration.spark_job_support import BASE_US, event_record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

# (records, committed?) in transaction order; each transaction ends with one marker offset.
TRANSACTIONS = [(["a0", "a1"], True), (["x0", "x1"], False), (["b0"], True)]
# a0 a1 | marker | x0 x1 (aborted) | marker | b0 | marker: the committed data records sit at offsets 0, 1 and 6.
COMMITTED_OFFSETS = [0, 1, 6]


def produce_transactions(bootstrap: str, topic: str, value_of: Any) -> None:
    ensure_topics(bootstrap, [topic])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    producer.init_transactions(30)
    for names, commit in TRANSACTIONS:
        producer.begin_transaction()
        for name in names:
            producer.produce(topic, key=b"k", value=value_of(name), partition=0)
        # Written before the end of the transaction: an abort would otherwise purge them unsent, leaving no aborted
        # records (and no abort marker) in the log.
        assert producer.flush(30) == 0
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def run_to_memory(spark: Any, frame: Any, name: str, checkpoint: Path) -> list[Any]:
    query = (frame.writeStream.format("memory").queryName(name).trigger(availableNow=True)
             .option("checkpointLocation", str(checkpoint)).start())
    query.awaitTermination()
    assert query.exception() is None
    return list(spark.sql(f"SELECT * FROM {name} ORDER BY offset").collect())


def test_the_jobs_kafka_options_read_committed_records_only_across_marker_gaps(kafka, spark, topic_prefix, tmp_path):
    topic = f"{topic_prefix}.tx"
    produce_transactions(kafka.bootstrap_servers, topic, str.encode)
    raw = read_kafka(spark, kafka.bootstrap_servers, [topic], "earliest", 1_000)
    rows = run_to_memory(spark, raw.selectExpr("CAST(value AS STRING) AS value", "offset"),
                         f"{topic_prefix}_raw", tmp_path / "ckpt")
    assert [(row["value"], row["offset"]) for row in rows] == list(zip(["a0", "a1", "b0"], COMMITTED_OFFSETS,
                                                                          strict=True))


def test_the_jobs_reader_hands_the_cores_committed_events_only(kafka, spark, topic_prefix, tmp_path):
    topics = TopicNames(topic_prefix)
    topic = topics.events("s")

    def event(name: str) -> bytes:
        return orjson.dumps(event_record("s", name, 0, BASE_US, 0, {"name": name}))

    produce_transactions(kafka.bootstrap_servers, topic, event)
    rows = run_to_memory(spark, read_contract_records(spark, kafka.bootstrap_servers, [topic]).select(
        "source_id", "offset"), f"{topic_prefix}_records", tmp_path / "ckpt")
    assert [(row["source_id"], row["offset"]) for row in rows] == list(zip(["a0", "a1", "b0"], COMMITTED_OFFSETS,
                                                                              strict=True))
