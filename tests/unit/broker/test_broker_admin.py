"""Replication of the topics the project creates: the default from the broker count, min.insync.replicas from the
replication factor, and a clear error for a factor the cluster cannot hold (a fake admin client: no broker)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from broker import admin, cluster
from broker.admin import (
    TopicConfigError,
    default_replication_factor,
    ensure_topics,
    min_insync_replicas,
    new_topic_config,
    replication_factor_for,
)
from broker.client import KafkaClientConfig


@pytest.mark.parametrize(("brokers", "replicas", "in_sync"), [(1, 1, 1), (2, 2, 2), (3, 3, 2), (5, 3, 2)])
def test_defaults_follow_the_broker_count(brokers: int, replicas: int, in_sync: int) -> None:
    assert default_replication_factor(brokers) == replication_factor_for(None, brokers) == replicas
    assert min_insync_replicas(replicas) == in_sync


def test_an_explicit_factor_is_kept_or_refused_with_what_to_do() -> None:
    assert replication_factor_for(2, 5) == 2
    with pytest.raises(TopicConfigError, match="replication factor 3 needs 3 brokers, the cluster has 2"):
        replication_factor_for(3, 2)
    with pytest.raises(TopicConfigError, match="at least 1"):
        replication_factor_for(0, 3)


def test_a_configured_min_insync_replicas_wins() -> None:
    assert new_topic_config(3) == {"min.insync.replicas": "2"}
    assert new_topic_config(3, {"cleanup.policy": "compact", "min.insync.replicas": "3"}) == {
        "cleanup.policy": "compact", "min.insync.replicas": "3"}


class FakeAdmin:
    """list_topics with ``brokers`` brokers and the given topics (partition count each); create_topics records."""

    def __init__(self, brokers: int, topics: dict[str, int]) -> None:
        self.brokers = brokers
        self.topics = topics
        self.created: list[Any] = []

    def list_topics(self, topic: str | None = None, timeout: float = 0) -> Any:
        described = {t: SimpleNamespace(partitions=dict.fromkeys(range(n)), error=None)
                     for t, n in self.topics.items()}
        return SimpleNamespace(brokers=dict.fromkeys(range(self.brokers)), topics=described)

    def create_topics(self, new_topics: list[Any], **_: Any) -> dict[str, Any]:
        self.created += new_topics
        for topic in new_topics:
            self.topics[topic.topic] = topic.num_partitions
        return {t.topic: SimpleNamespace(result=lambda timeout: None) for t in new_topics}


@pytest.fixture
def fake_admin(monkeypatch: pytest.MonkeyPatch) -> FakeAdmin:
    fake = FakeAdmin(brokers=4, topics={"old": 2})
    monkeypatch.setattr(KafkaClientConfig, "admin", lambda self: fake)
    return fake


def created(fake: FakeAdmin) -> list[tuple[str, int, int, dict[str, str]]]:
    return [(t.topic, t.num_partitions, t.replication_factor, t.config) for t in fake.created]


def test_new_topics_get_the_default_for_the_cluster_and_existing_ones_are_left_alone(fake_admin: FakeAdmin) -> None:
    assert ensure_topics("k:1", ["old", "new"], partitions=2) == ["new"]
    assert created(fake_admin) == [("new", 2, 3, {"min.insync.replicas": "2"})]


def test_every_topic_creator_passes_the_replication_factor_on(fake_admin: FakeAdmin) -> None:
    assert cluster.ensure_partitions("k:1", ["events"], 2, replication_factor=2) == ["events"]
    assert cluster.ensure_control_topic("k:1", "p.cluster", 2, replication_factor=4) is True
    assert admin.ensure_topics("k:1", ["results"], replication_factor=1) == ["results"]
    assert created(fake_admin) == [
        ("events", 2, 2, {"min.insync.replicas": "2"}),
        ("p.cluster", 2, 4, {"min.insync.replicas": "2", "cleanup.policy": "compact"}),
        ("results", 1, 1, {"min.insync.replicas": "1"}),
    ]


def test_too_many_replicas_create_nothing(fake_admin: FakeAdmin) -> None:
    with pytest.raises(TopicConfigError, match="the cluster has 4"):
        cluster.ensure_partitions("k:1", ["events"], 2, replication_factor=5)
    assert fake_admin.created == []
