"""SIGKILL of a gateway that runs time sync: the restarted gateway recovers every source's clock estimate from the
sources topic, so sources that do not re-sync keep being mapped onto the reference clock (no 1 h "unsynced" bound
holding the merge back, no wrong reference times) and nothing is lost, duplicated or late."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from clients import Backoff, SimulatedClock, SkewlessClient
from tests.reliability.harness import GatewayProcess, read_delivery, record_outcome, wait_until

pytestmark = [pytest.mark.integration]

AHEAD_US = 2_000_000
FAST = Backoff(initial_s=0.02, max_s=0.2)


@pytest.mark.timeout(240)
async def test_gateway_with_time_sync_sigkilled_keeps_mapping_sources_that_do_not_resync(kafka, topic_prefix,
                                                                                        tmp_path: Path):
    n = 1_500
    sources = [f"t{j}" for j in range(3)]
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path, timesync_port=0)
    await gateway.start()
    # resync_interval_s=None: each source syncs once, at connect(), and never again.
    clients = [SkewlessClient("127.0.0.1", gateway.port, s, ["s"], udp_port=gateway.timesync_port,
                              resync_interval_s=None, clock_us=SimulatedClock(AHEAD_US, 0.0), batch_events=50,
                              max_unacked=400, backoff=FAST) for s in sources]
    senders: list[asyncio.Task[None]] = []
    try:
        await asyncio.gather(*(c.connect() for c in clients))

        async def run(client: SkewlessClient) -> None:
            for i in range(n):
                assert await client.send("s", {"src": client.source_id, "i": i}) == i
                if i % 25 == 24:
                    await asyncio.sleep(0.01)

        senders = [asyncio.create_task(run(c)) for c in clients]
        await wait_until(lambda: all(c.acked_through("s") >= n // 3 for c in clients), 60, "a third acknowledged")
        await gateway.kill()
        await gateway.start()
        async with asyncio.timeout(120):
            await asyncio.gather(*senders)
            await asyncio.gather(*(c.flush(timeout_s=120) for c in clients))
        assert all(c.stats.syncs == 1 for c in clients)  # nobody synced against the restarted gateway
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients))
        await gateway.stop()

    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    expected = dict.fromkeys(sources, n)
    delivery.assert_exactly_once_in_order(expected)
    assert delivery.late == []
    errors_us = [abs(r["source_ts_us"] - r["ref_ts_us"] - AHEAD_US) for r in delivery.events]
    assert max(errors_us) < 50_000  # every event, before and after the restart, mapped with the +2 s offset
    assert max(r["uncertainty_us"] for r in delivery.events) < 1_000_000
    record_outcome(
        "Gateway SIGKILL with time sync (sources never re-sync)", group="process",
        injected="`skewless gateway` with time sync SIGKILLed mid-stream under 3 SDK sources whose clocks are 2 s "
                 "ahead and which sync only once, restarted on the same ports",
        checked="every seq once, in order, nothing late; every event mapped with the source's offset, uncertainty "
                "below 1 s (clock estimates recovered from the sources topic)",
        outcome={**delivery.summary(expected), "max_mapping_error_us": max(errors_us),
                 "max_uncertainty_us": max(r["uncertainty_us"] for r in delivery.events)})
