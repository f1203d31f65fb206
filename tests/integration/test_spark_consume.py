"""docs/consume.md's job (spark_jobs/examples/consume_ordered.py) on a real broker and Spark: records written with
the contract's encoders into two partitions, windows published exactly when the minimum over the partitions of
their latest punctuation passes them, across micro-batches and a restart from the checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.reader import read_topic
from contract.records import PUNCTUATION_KEY, EventRecord, PunctuationRecord
from contract.topics import TopicNames
from spark_jobs.contract import kafka_sink_options, skewless_conf
from spark_jobs.examples.consume_ordered import JOB, ConsumeOptions, start

pytestmark = [pytest.mark.integration, pytest.mark.spark]

STREAM = "orders"
BASE_US = 1_700_000_000_000_000  # a whole second
SECOND_US = 1_000_000


def event(source: str, seq: int, at_s: float) -> EventRecord:
    ref_us = BASE_US + round(at_s * SECOND_US)
    return EventRecord(STREAM, source, seq, ref_us, ref_us, 0, ref_us, ref_us)


def punctuation(at_s: float) -> PunctuationRecord:
    watermark_us = BASE_US + round(at_s * SECOND_US)
    return PunctuationRecord(STREAM, watermark_us, watermark_us)


def produce(bootstrap: str, topic: str, partition: int, records: list[EventRecord | PunctuationRecord]) -> None:
    producer = KafkaClientConfig(bootstrap).producer()
    for record in records:
        key = record.key if isinstance(record, EventRecord) else PUNCTUATION_KEY
        producer.produce(topic, key=key, value=record.to_json(), partition=partition)
    assert producer.flush(30) == 0


def run_once(spark: Any, bootstrap: str, prefix: str, checkpoint: Path) -> None:
    query = start(spark, ConsumeOptions(bootstrap, prefix, STREAM, SECOND_US, str(checkpoint),
                                        max_offsets_per_trigger=2, available_now=True))
    query.awaitTermination()
    assert query.exception() is None


def windows(bootstrap: str, prefix: str) -> list[tuple[str, dict[str, Any]]]:
    return [(key.decode() if key else "", orjson.loads(value))
            for key, value in read_topic(bootstrap, TopicNames(prefix).results(JOB))]


def window(start_s: int, count: int) -> tuple[str, dict[str, Any]]:
    start_us = BASE_US + start_s * SECOND_US
    return f"{STREAM}|{start_us}", {"job": JOB, "record": "window", "stream": STREAM, "window_start_us": start_us,
                                    "window_end_us": start_us + SECOND_US, "count": count}


def test_windows_are_published_once_the_slowest_partition_has_punctuated_past_them(kafka, spark, topic_prefix,
                                                                                    tmp_path):
    bootstrap = kafka.bootstrap_servers
    topic = TopicNames(topic_prefix).events(STREAM)
    ensure_topics(bootstrap, [topic], partitions=2)
    # Partition 0 promises 3.0 s; partition 1 only 1.5 s: W = 1.5 s closes [0, 1) alone, although partition 0
    # alone would close [1, 2) and [2, 3) too (and partition 1 still has 1.7 s and 2.5 s events of them).
    produce(bootstrap, topic, 0, [event("a", 0, 0.1), event("a", 1, 0.5), event("a", 2, 1.2), punctuation(2.0),
                                  event("a", 3, 2.1), punctuation(3.0)])
    produce(bootstrap, topic, 1, [event("b", 0, 0.3), event("b", 1, 1.7), punctuation(1.5), event("b", 2, 2.5)])
    spark.conf.set("spark.skewless.kafka.client.id", "skewless-consume-test")
    try:
        # The conf reaches the sink's options (and the source's: the run below reads with it).
        assert kafka_sink_options(spark, bootstrap) == {"kafka.bootstrap.servers": bootstrap,
                                                        "kafka.client.id": "skewless-consume-test"}
        assert skewless_conf(spark)["spark.skewless.kafka.client.id"] == "skewless-consume-test"
        run_once(spark, bootstrap, topic_prefix, tmp_path)
        assert windows(bootstrap, topic_prefix) == [window(0, 3)]

        # Partition 1 catches up; the restarted job carries the open windows over from its checkpoint.
        produce(bootstrap, topic, 1, [punctuation(3.5), event("b", 3, 3.6)])
        run_once(spark, bootstrap, topic_prefix, tmp_path)
    finally:
        spark.conf.unset("spark.skewless.kafka.client.id")
    assert windows(bootstrap, topic_prefix) == [window(0, 3), window(1, 2), window(2, 2)]
