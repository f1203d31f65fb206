"""A real broker outage: the Kafka process exits (clean SIGTERM shutdown) mid-stream and a new one starts later on
the same port and storage. Clients are back-pressured, not dropped; afterwards every seq is in Kafka exactly once,
in per-source order."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from broker.launcher import KafkaBroker
from clients import Backoff, SkewlessClient
from tests.reliability.harness import GatewayProcess, read_delivery, record_outcome, wait_until

pytestmark = [pytest.mark.integration]

FAST = Backoff(initial_s=0.02, max_s=0.2)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("down_s", [pytest.param(5.0, id="fast"),
                                    pytest.param(30.0, id="long", marks=pytest.mark.reliability_long)])
async def test_broker_process_stopped_and_restarted_mid_stream_loses_nothing(tmp_path: Path, down_s: float):
    n, max_unacked = 3_000, 1_000
    sources = [f"r{j}" for j in range(3)]
    broker = KafkaBroker(tmp_path / "kafka")
    state = broker.start()
    gateway = GatewayProcess(state.bootstrap_servers, "outage", tmp_path)
    clients: list[SkewlessClient] = []
    senders: list[asyncio.Task[None]] = []
    try:
        await gateway.start()
        clients = [SkewlessClient("127.0.0.1", gateway.port, s, ["s"], batch_events=50, max_unacked=max_unacked,
                                  backoff=FAST) for s in sources]
        await asyncio.gather(*(c.connect() for c in clients))
        warm = asyncio.Event()

        async def run(client: SkewlessClient) -> None:
            for i in range(n):
                assert await client.send("s", {"src": client.source_id, "i": i}) == i
                if i == 99:
                    await client.flush()
                    await warm.wait()

        senders = [asyncio.create_task(run(c)) for c in clients]
        await wait_until(lambda: all(c.acked_through("s") == 99 for c in clients), 30, "warm-up acks")
        acked_before = {c.source_id: c.acked_through("s") for c in clients}
        await asyncio.to_thread(broker.stop)
        warm.set()
        stopped = time.monotonic()
        while time.monotonic() - stopped < down_s:
            status, _health = await gateway.health()
            assert status == 200  # the gateway stays up and answers while Kafka is gone
            await asyncio.sleep(0.2)
        # Back-pressured: blocked at the bound, nothing acknowledged while Kafka was away, nobody cut off.
        assert all(c.unacked_count == max_unacked for c in clients)
        assert {c.source_id: c.acked_through("s") for c in clients} == acked_before
        assert all(c.stats.connection_losses == 0 for c in clients)
        restarted = await asyncio.to_thread(broker.restart)
        assert restarted.port == state.port
        resumed = time.monotonic()
        async with asyncio.timeout(180):
            await asyncio.gather(*senders)
            await asyncio.gather(*(c.flush(timeout_s=180) for c in clients))
        drain_s = time.monotonic() - resumed
        metrics = await gateway.metrics()
        assert all(c.error is None for c in clients)
        delivery = read_delivery(state.bootstrap_servers, "outage", "s")
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients))
        await gateway.stop()
        broker.stop()

    expected = dict.fromkeys(sources, n)
    delivery.assert_exactly_once_in_order(expected)
    assert delivery.late == []
    assert metrics["skewless_gateway_delivery_failures"] == 0
    record_outcome(
        f"Kafka broker process down {down_s:.0f} s", group="process",
        injected=f"Kafka broker stopped (process exits) for {down_s:.0f} s mid-stream, then a new broker process "
                 "on the same port and storage (3 sources, max_unacked=1000)",
        checked="send() blocks at max_unacked, no ack, no disconnect, /healthz answers; afterwards every seq once "
                "in order",
        outcome={**delivery.summary(expected), "drain_after_restart_s": round(drain_s, 2),
                 "resends": sum(c.stats.events_resent for c in clients)})
