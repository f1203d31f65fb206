"""spark_jobs.contract without Spark: Kafka options from the conf, source options, the stream watermark; and the
pure part of docs/consume.md's job (spark_jobs/examples/consume_ordered.py)."""

from __future__ import annotations

import shlex
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spark_jobs.contract import (
    StreamWatermark,
    kafka_conf,
    kafka_options_from_conf,
    kafka_source_options,
    librdkafka_settings_from_conf,
    read_kafka,
    replication_factor_from_conf,
)
from spark_jobs.examples.consume_ordered import ConsumeOptions, WindowCounts, options_from
from spark_jobs.session import installed_kafka_connector_coordinate

ROOT = Path(__file__).resolve().parents[3]

CONF = {
    "spark.skewless.kafka.security.protocol": "SASL_SSL",
    "spark.skewless.kafka.sasl.mechanism": "PLAIN",
    "spark.skewless.kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required;",
    "spark.skewless.librdkafka.sasl.username": "u",
    "spark.skewless.librdkafka.sasl.mechanism": "SCRAM-SHA-512",
    "spark.skewless.failOnDataLoss": "false",
    "spark.master": "local[2]",
}


def test_java_properties_become_kafka_options_of_sources_and_sinks() -> None:
    assert kafka_options_from_conf(CONF) == {
        "kafka.security.protocol": "SASL_SSL", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": "org.apache.kafka.common.security.plain.PlainLoginModule required;"}


def test_librdkafka_settings_take_the_shared_properties_and_their_own() -> None:
    assert librdkafka_settings_from_conf(CONF) == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "u"}


def test_kafka_conf_is_the_inverse() -> None:
    conf = kafka_conf({"security.protocol": "SSL"},
                      {"ssl.ca.location": "/ca.pem", "enable.ssl.certificate.verification": True})
    assert conf == {"spark.skewless.kafka.security.protocol": "SSL",
                    "spark.skewless.librdkafka.ssl.ca.location": "/ca.pem",
                    "spark.skewless.librdkafka.enable.ssl.certificate.verification": "true"}
    assert kafka_options_from_conf(conf) == {"kafka.security.protocol": "SSL"}
    assert librdkafka_settings_from_conf(conf) == {"security.protocol": "SSL", "ssl.ca.location": "/ca.pem",
                                                   "enable.ssl.certificate.verification": "true"}


def test_source_options_read_committed_and_fail_on_data_loss_unless_asked_otherwise() -> None:
    options = kafka_source_options("k:9092", ["a", "b"], "earliest", None, kafka={"kafka.security.protocol": "SSL"})
    assert options == {"kafka.bootstrap.servers": "k:9092", "startingOffsets": "earliest", "failOnDataLoss": "true",
                       "kafka.isolation.level": "read_committed", "subscribe": "a,b",
                       "kafka.security.protocol": "SSL"}
    relaxed = kafka_source_options("k:9092", "p\\.events\\..*", "latest", 10, fail_on_data_loss=False,
                                   options={"kafka.isolation.level": "read_uncommitted", "minPartitions": "4"})
    assert relaxed["failOnDataLoss"] == "false" and relaxed["subscribePattern"] == "p\\.events\\..*"
    assert relaxed["maxOffsetsPerTrigger"] == "10" and relaxed["minPartitions"] == "4"
    assert relaxed["kafka.isolation.level"] == "read_uncommitted", "the caller's options win"


def test_the_watermark_is_the_minimum_over_partitions_once_all_have_punctuated() -> None:
    watermark = StreamWatermark(3)
    watermark.observe_rows([{"partition": 0, "watermark_us": 50}, {"partition": 2, "watermark_us": 20}])
    assert watermark.watermark_us is None, "partition 1 has promised nothing yet"
    watermark.observe(1, 30)
    assert watermark.watermark_us == 20
    watermark.observe(2, 10)  # a batch read again: never backwards
    assert watermark.watermark_us == 20
    watermark.observe(2, 90)
    assert watermark.watermark_us == 30
    with pytest.raises(ValueError, match="partition 3 of a topic with 3 partitions"):
        watermark.observe(3, 0)


def test_windows_close_at_the_watermark_and_survive_a_restart() -> None:
    counts = WindowCounts(1000, StreamWatermark(2))
    counts.add(0, 2)
    counts.add(1000, 1)
    counts.add(0, 1)
    counts.watermark.observe(0, 2500)
    assert counts.close() == []
    counts.watermark.observe(1, 1000)
    assert counts.close() == [(0, 3)]
    counts.batch_id = 7
    restored = WindowCounts.from_json(counts.to_json())
    assert restored == counts
    restored.watermark.observe(1, 2000)
    assert restored.close() == [(1000, 1)]
    assert restored.counts == {}


def test_the_replication_factor_of_a_jobs_topics_comes_from_the_conf() -> None:
    assert replication_factor_from_conf(CONF) is None
    assert replication_factor_from_conf({"spark.skewless.replicationFactor": "3"}) == 3
    with pytest.raises(ValueError, match="must be a whole number, got 'three'"):
        replication_factor_from_conf({"spark.skewless.replicationFactor": "three"})


def test_the_spark_submit_line_of_docs_consume_md_runs_the_example_with_its_options() -> None:
    text = (ROOT / "docs" / "consume.md").read_text()
    block = text[text.index("    spark-submit \\"):].split("\n\n")[0]
    argv = shlex.split(block.replace("\\\n", " "))
    script = next(i for i, arg in enumerate(argv) if arg.endswith(".py"))
    assert (ROOT / argv[script]).exists()
    submit = dict(zip(argv[1:script:2], argv[2:script:2], strict=True))
    assert submit["--packages"] == installed_kafka_connector_coordinate()
    confs = [value for flag, value in zip(argv[1:script:2], argv[2:script:2], strict=True) if flag == "--conf"]
    assert confs and all(c.startswith(("spark.skewless.kafka.", "spark.skewless.librdkafka.")) for c in confs)
    assert options_from(argv[script + 1:]) == ConsumeOptions("kafka:9093", "skewless", "orders", 1_000_000,
                                                             "/shared/checkpoints/consume_ordered")


class FakeReader:
    """spark.readStream as far as read_kafka uses it: records the format and the options it was given."""

    def __init__(self) -> None:
        self.given: dict[str, str] = {}

    def format(self, name: str) -> FakeReader:
        self.given["format"] = name
        return self

    def options(self, **options: str) -> FakeReader:
        self.given.update(options)
        return self

    def load(self) -> dict[str, str]:
        return self.given


class FakeSpark:
    def __init__(self, conf: dict[str, str]) -> None:
        self.conf = SimpleNamespace(getAll=conf)

    @property
    def readStream(self) -> FakeReader:
        return FakeReader()


def test_read_kafka_takes_the_sessions_kafka_options_and_data_loss_policy() -> None:
    spark: Any = FakeSpark(CONF)
    got = read_kafka(spark, "k:9092", ["p.events.s"])
    assert got["format"] == "kafka" and got["subscribe"] == "p.events.s"
    assert got["kafka.security.protocol"] == "SASL_SSL" and "kafka.sasl.username" not in got
    assert got["failOnDataLoss"] == "false", "the conf's spark.skewless.failOnDataLoss"
    assert read_kafka(spark, "k:9092", ["t"], fail_on_data_loss=True)["failOnDataLoss"] == "true"
    unset: Any = FakeSpark({})
    assert read_kafka(unset, "k:9092", ["t"])["failOnDataLoss"] == "true"
    wrong: Any = FakeSpark({"spark.skewless.failOnDataLoss": "maybe"})
    with pytest.raises(ValueError, match=r"spark\.skewless\.failOnDataLoss must be true or false, got 'maybe'"):
        read_kafka(wrong, "k:9092", ["t"])


def test_sparks_record_columns_are_the_record_contracts_fields_with_their_types() -> None:
    """spark_jobs/contract.py keeps the schema by hand: every field a contract record of the events and late topics
    can carry is a column of the JSON type it is written with, and every column is such a field."""
    import orjson

    from contract.records import EventRecord, PunctuationRecord
    from spark_jobs.contract import RECORD_COLUMNS

    point = EventRecord("s", "a", 1, 10, 11, 2, 12, 13, payload={"x": 1}, rtt_us=400)
    interval = EventRecord("s", "a", 2, 20, 21, 2, 22, 23, payload=[1], start_ts_us=15, start_uncertainty_us=3,
                           source_start_ts_us=14)
    endpoint = EventRecord("s", "a", 3, 30, 31, 2, 32, 33, payload="p", interval_id="i", endpoint="start")
    # A late record carries its lateness (a field of the record contract).
    late = EventRecord("s", "a", 4, 40, 41, 2, 42, 43, late=True, late_reason="after_punctuation", lateness_us=7)
    punctuation = PunctuationRecord("s", 50, 51)
    spark_type = {bool: "boolean", int: "long", str: "string"}
    written: dict[str, str] = {}
    for record in (point, interval, endpoint, late, punctuation):
        for name, value in orjson.loads(record.to_json()).items():
            kind = "string" if name == "payload" else spark_type[type(value)]  # payloads stay JSON text
            assert written.setdefault(name, kind) == kind, name
    assert dict(RECORD_COLUMNS) == written
