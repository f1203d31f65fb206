"""One Kafka client configuration for every client: shared settings reach producer, admin and consumers alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from broker import client as client_module
from broker import membership
from broker.admin import ensure_topics, partition_count
from broker.client import PRODUCER_DEFAULTS, KafkaClientConfig
from broker.cluster import OwnerDirectory, claim_cluster, ensure_control_topic, ensure_partitions
from broker.membership import GroupMembership
from broker.producer import KafkaPublisher
from broker.reader import read_topic
from broker.transactions import TRANSACTION_DEFAULTS, TransactionalPublisher
from gateway.config import build_config, load_settings
from gateway.recovery import recover_clocks, recover_stream

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


class Built(Exception):
    """Raised by the spy instead of building a client: carries the properties it was built with."""

    def __init__(self, role: str, properties: dict[str, object]) -> None:
        super().__init__(role)
        self.role = role
        self.properties = properties


def spy(role: str) -> object:
    def build(properties: dict[str, object], *_args: object, **_kwargs: object) -> None:
        raise Built(role, properties)
    return build


@pytest.fixture
def built_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "Producer", spy("producer"))
    monkeypatch.setattr(client_module, "Consumer", spy("consumer"))
    monkeypatch.setattr(client_module, "AdminClient", spy("admin"))
    monkeypatch.setattr(membership, "Consumer", spy("consumer"))


SHARED = KafkaClientConfig("k:9093", SECURED)
ENTRY_POINTS: list[tuple[str, Callable[[], object]]] = [
    ("producer", lambda: KafkaPublisher(SHARED)),
    ("producer", lambda: TransactionalPublisher(SHARED, "p.shard-0")),
    ("consumer", lambda: GroupMembership(SHARED, "p.gateways", "p.cluster", instance_id=None)),
    ("consumer", lambda: OwnerDirectory(SHARED, "p.cluster", 2)),
    ("consumer", lambda: claim_cluster(SHARED, "p.cluster", "c", 2, 0)),
    ("admin", lambda: ensure_control_topic(SHARED, "p.cluster", 2)),
    ("admin", lambda: ensure_partitions(SHARED, ["p.events.s"], 2)),
    ("admin", lambda: ensure_topics(SHARED, ["p.results.j"])),
    ("admin", lambda: partition_count(SHARED, "p.events.s")),
    ("consumer", lambda: read_topic(SHARED, "p.events.s")),
    ("consumer", lambda: recover_stream(SHARED, "p.sources", "p.events.s", "s")),
    ("consumer", lambda: recover_clocks(SHARED, "p.sources")),
]


@pytest.mark.usefixtures("built_with")
@pytest.mark.parametrize(("role", "entry"), ENTRY_POINTS)
def test_every_client_the_project_makes_gets_the_shared_settings(role: str, entry: Callable[[], object]) -> None:
    with pytest.raises(Built) as built:
        entry()
    assert built.value.role == role
    assert built.value.properties["bootstrap.servers"] == "k:9093"
    assert {k: built.value.properties[k] for k in SECURED} == SECURED


@pytest.mark.usefixtures("built_with")
def test_a_transactional_producer_lingers_unless_the_shared_settings_or_its_overrides_say_otherwise() -> None:
    with pytest.raises(Built) as built:
        TransactionalPublisher(SHARED, "p.shard-0")
    assert built.value.properties["linger.ms"] == TRANSACTION_DEFAULTS["linger.ms"] == 100
    assert built.value.properties["transactional.id"] == "p.shard-0"
    with pytest.raises(Built) as built:
        TransactionalPublisher(KafkaClientConfig("k:9093", {"linger.ms": 5}), "p.shard-0")
    assert built.value.properties["linger.ms"] == 5  # a [gateway.kafka] setting beats the role's default
    with pytest.raises(Built) as built:
        TransactionalPublisher(KafkaClientConfig("k:9093", {"linger.ms": 5}), "p.shard-0", {"linger.ms": 7})
    assert built.value.properties["linger.ms"] == 7  # and [gateway.producer] beats both
    with pytest.raises(Built) as built:
        KafkaPublisher(SHARED)
    assert built.value.properties["linger.ms"] == PRODUCER_DEFAULTS["linger.ms"] == 2  # acks wait for delivery
