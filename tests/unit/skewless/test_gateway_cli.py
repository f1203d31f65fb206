"""`skewless gateway`, `skewless kafka topics` and `skewless spark ...` build one Kafka client configuration from
--bootstrap / SKEWLESS_BOOTSTRAP, the [kafka] table and --kafka-property, and hand it (and the replication factor)
to the library; nothing here reaches a broker (the probe and the library calls are replaced)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.client import KafkaClientConfig
from skewless import cli_gateway as gateway_cli
from skewless import cli_kafka as broker_cli
from skewless.cli import main
from spark_jobs import cli as spark_cli


class Stop(Exception):
    pass


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    # `skewless gateway` configures the root logger onto this test's captured stderr.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run(*argv: str) -> None:
    with pytest.raises(SystemExit):
        main(list(argv))


@pytest.fixture
def kafka_file(tmp_path: Path) -> Path:
    path = tmp_path / "skewless.toml"
    path.write_text('[kafka]\n"security.protocol" = "SASL_SSL"\n"sasl.mechanism" = "PLAIN"\n"client.id" = "file"\n'
                    '"sasl.username" = "u"\n')
    return path


def test_the_gateway_builds_its_kafka_client_from_file_env_and_flags(monkeypatch, kafka_file):
    seen: list[KafkaClientConfig] = []

    def probe(client: KafkaClientConfig, *_: Any) -> int:
        seen.append(client)
        raise Stop

    monkeypatch.setattr(gateway_cli, "probe_kafka", probe)
    monkeypatch.setenv("SKEWLESS_BOOTSTRAP", "env-broker:9092")
    with pytest.raises(Stop):
        main(["--debug", "gateway", "--config", str(kafka_file), "--kafka-property", "client.id=flag",
              "--replication-factor", "3"])
    assert seen == [KafkaClientConfig("env-broker:9092", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                                          "client.id": "flag", "sasl.username": "u"})]


def test_kafka_topics_passes_partitions_replication_and_the_client(monkeypatch, kafka_file, capsys):
    calls: list[tuple[Any, ...]] = []
    monkeypatch.setattr(broker_cli, "probe_kafka", lambda client, *_: 1)
    monkeypatch.setattr(broker_cli, "ensure_partitions",
                        lambda client, topics, partitions, **kw: calls.append((client, topics, partitions, kw)))
    run("kafka", "topics", "temps", "--bootstrap", "k:1", "--partitions", "6", "--replication-factor", "2",
        "--config", str(kafka_file), "--kafka-property", "sasl.username=flag", "--prefix", "p")
    assert calls == [(KafkaClientConfig("k:1", {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN",
                                                "client.id": "file", "sasl.username": "flag"}),
                      ["p.events.temps", "p.late.temps"], 6, {"replication_factor": 2})]


def test_spark_jobs_get_the_kafka_settings_as_session_conf(monkeypatch, kafka_file):
    confs: list[dict[str, str]] = []

    def session(name: str, shuffle_partitions: int | None = None, extra_conf: dict[str, str] | None = None) -> None:
        confs.append(dict(extra_conf or {}))
        raise Stop

    monkeypatch.setattr(spark_cli, "probe_kafka", lambda client, *_: 1)
    monkeypatch.setattr(spark_cli, "create_spark_session", session)
    with pytest.raises(Stop):
        main(["--debug", "spark", "window-count", "--config", str(kafka_file), "--kafka-property", "client.id=job",
              "--spark-kafka-property", "sasl.jaas.config=X required;", "--replication-factor", "2"])
    assert confs == [{
        "spark.skewless.kafka.security.protocol": "SASL_SSL",
        "spark.skewless.kafka.sasl.mechanism": "PLAIN",
        "spark.skewless.kafka.sasl.jaas.config": "X required;",
        "spark.skewless.librdkafka.security.protocol": "SASL_SSL",
        "spark.skewless.librdkafka.sasl.mechanism": "PLAIN",
        "spark.skewless.librdkafka.client.id": "job",
        "spark.skewless.librdkafka.sasl.username": "u",
        "spark.skewless.replicationFactor": "2",
    }]
