"""Real processes for integration tests: one Kafka broker per test session (the SparkSession: tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from broker.launcher import BrokerState, KafkaBroker
from gateway.server import Gateway, GatewayConfig


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerState]:
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka"))
    state = broker.start()
    try:
        yield state
    finally:
        broker.stop()


@pytest.fixture
def topic_prefix() -> str:
    """Each test gets its own topics on the shared broker."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
async def gateway(kafka: BrokerState, topic_prefix: str) -> AsyncIterator[Gateway]:
    gw = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                               max_frame_bytes=64 * 1024))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.stop()
