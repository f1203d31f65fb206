"""One Kafka client configuration for every client: shared settings reach producer, admin and consumers alike."""

from __future__ import annotations

from pathlib import Path

from broker.client import PRODUCER_DEFAULTS, KafkaClientConfig
from gateway.config import build_config, load_settings

SECURED = {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "u", "sasl.password": "p"}


def test_properties_layer_role_defaults_shared_settings_and_overrides_in_that_order() -> None:
    config = KafkaClientConfig("k1:9092,k2:9092", {**SECURED, "linger.ms": 5})
    producer = config.properties(PRODUCER_DEFAULTS, {"compression.type": "zstd"})
    assert producer["bootstrap.servers"] == "k1:9092,k2:9092"
    assert {k: producer[k] for k in SECURED} == SECURED
    assert producer["linger.ms"] == 5  # a shared setting beats a role default
    assert producer["compression.type"] == "zstd"  # an override beats both
    assert producer["acks"] == "all" and producer["enable.idempotence"] is True
    assert config.properties() == {"bootstrap.servers": "k1:9092,k2:9092", **SECURED, "linger.ms": 5}


def test_a_plain_server_string_is_a_config_without_settings() -> None:
    assert KafkaClientConfig.of("h:1") == KafkaClientConfig("h:1")
    shared = KafkaClientConfig("h:1", SECURED)
    assert KafkaClientConfig.of(shared) is shared


def test_clients_are_built_from_the_config_without_a_broker() -> None:
    # librdkafka validates properties at construction: a typo in a shared setting fails for every role.
    config = KafkaClientConfig("127.0.0.1:1", {"client.id": "skewless-test"})
    config.producer().purge()
    config.consumer("skewless-test").close()
    assert config.admin() is not None


def test_the_gateway_kafka_table_reaches_every_client(tmp_path: Path) -> None:
    path = tmp_path / "gateway.toml"
    path.write_text('[gateway]\nbootstrap_servers = "k:9093"\n[gateway.kafka]\n"security.protocol" = "SSL"\n'
                    '[gateway.producer]\n"linger.ms" = 7\n')
    config = build_config(load_settings(path, env={}))
    assert config.kafka_client == KafkaClientConfig("k:9093", {"security.protocol": "SSL"})
    assert config.producer_config == {"linger.ms": 7}
