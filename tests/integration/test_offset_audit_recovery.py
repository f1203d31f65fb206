"""The offset audit's recovery end to end, on the real broker: librdkafka once reported a new partition's record
delivered without an offset (its answer to a batch the broker called a duplicate) while the record was not on the
topic. Here that report is planted once, at the confluent-kafka boundary, for the first audited record of a
stream's events topic: the shard must abort that transaction (nothing of it acked), count it, restart from what
Kafka holds, and the SDK must resend, so that every event ends on the topic exactly once."""

from __future__ import annotations

from typing import Any

import pytest

from broker.reader import read_stream, read_topic
from clients import Backoff, SkewlessClient
from contract.topics import TopicNames
from gateway.config import GatewayConfig
from gateway.server import Gateway
from gateway.shard import ShardRuntime

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = Backoff(initial_s=0.02, max_s=0.2)
BASE_TS_US = 1_700_000_000_000_000
EVENTS = 400


class OffsetlessReport:
    """A delivery report's message as confluent-kafka gives it for a negative offset: ``offset()`` is None."""

    def __init__(self, message: Any) -> None:
        self._message = message

    def offset(self) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


async def test_a_report_without_offset_aborts_restarts_the_shard_and_every_event_lands_once(
        kafka, topic_prefix, monkeypatch: pytest.MonkeyPatch) -> None:
    topics = TopicNames(topic_prefix)
    planted: list[str] = []
    on_report = ShardRuntime._on_report

    def offsetless_once(self: ShardRuntime, topic: str | None, stream: str | None, error: Any, message: Any) -> None:
        if topic == topics.events("s") and error is None and not planted:
            planted.append(topic)
            message = OffsetlessReport(message)
        on_report(self, topic, stream, error, message)

    monkeypatch.setattr(ShardRuntime, "_on_report", offsetless_once)
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix))
    await gateway.start()
    try:
        client = SkewlessClient("127.0.0.1", gateway.port, "src", ["s"], batch_events=20, backoff=FAST,
                                time_sync=False)
        await client.connect()
        for i in range(EVENTS):
            await client.send("s", {"i": i}, source_ts_us=BASE_TS_US + i * 1_000)
        await client.flush(timeout_s=60)
        await client.close()
        counters = gateway.counters
        assert planted == [topics.events("s")]
        assert (counters.offset_audit_failures, counters.task_failures) == (1, 0)
        assert client.stats.reconnects >= 1  # the shard's restart closed the connection; the SDK came back
    finally:
        await gateway.stop()
    events, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"), settled=True)
    assert [e["seq"] for e in events] == list(range(EVENTS))
    assert read_topic(kafka.bootstrap_servers, topics.late("s"), settled=True) == []
