"""transactions = false: the idempotent producer alone (one gateway, no fencing), acks at delivery."""

from __future__ import annotations

from broker.reader import read_stream
from clients import SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway, GatewayConfig


async def test_without_transactions_events_are_acked_at_delivery_and_published_once(kafka, topic_prefix):
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    transactions=False))
    await gateway.start()
    try:
        client = SkewlessClient("127.0.0.1", gateway.port, "plain", ["s"], heartbeat_interval_s=None)
        await client.connect()
        for seq in range(50):
            await client.send("s", {"i": seq}, 1_000 + seq)
        await client.flush(20)
        assert client.acked_through("s") == 49
        await client.close()
        assert gateway.counters.events_published == 50
    finally:
        await gateway.stop()
    events, punctuations = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("s"))
    assert [e["seq"] for e in events] == list(range(50)) and punctuations
