"""Resilience through real processes: a gateway restarted under live SDK clients, and a Kafka broker that stalls.

Both run against the session's real broker; nothing is mocked. A gateway restart must lose and duplicate nothing
(the new gateway recovers each source's progress from Kafka and drops the resends it already published), and a
stalled broker must turn into backpressure all the way to the application's ``send()``, never into loss.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from broker.netutil import free_tcp_port
from broker.reader import read_stream, read_topic
from clients import Backoff, SkewlessClient
from contract.topics import TopicNames
from gateway.server import Gateway, GatewayConfig
from gateway.shard import MAX_UNPRODUCED_RECORDS
from tests.conditions import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = Backoff(initial_s=0.02, max_s=0.1)


def seqs_of(records: list[dict], source_id: str) -> list[int]:
    return [r["seq"] for r in records if r["source_id"] == source_id]


def in_flight(gateway: Gateway) -> int:
    """Events the gateway handed to librdkafka that Kafka has not confirmed yet (so not acknowledged either)."""
    pipeline, counters = gateway.pipeline.counters, gateway.counters
    return (pipeline.released + pipeline.late + pipeline.quarantined - counters.events_published
            - counters.delivery_failures)


def runs(seqs: list[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5, 6] -> [(0, 2), (5, 6)]: a readable picture of what a topic holds."""
    out: list[tuple[int, int]] = []
    for seq in seqs:
        if out and seq == out[-1][1] + 1:
            out[-1] = (out[-1][0], seq)
        else:
            out.append((seq, seq))
    return out


async def test_gateway_restarted_mid_stream_under_live_clients_loses_and_duplicates_nothing(kafka, topic_prefix):
    n, sources = 2_000, [f"src-{k}" for k in range(3)]
    port = free_tcp_port()

    def make_gateway() -> Gateway:
        return Gateway(GatewayConfig(port=port, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                     checkpoint_interval_s=0.2))

    first = make_gateway()
    await first.start()
    first_running = True
    second: Gateway | None = None
    # max_unacked < n: no sender can finish before the gateway acknowledges most of its events.
    clients = [SkewlessClient("127.0.0.1", port, source_id, ["s"], batch_events=50, max_unacked=400, backoff=FAST)
               for source_id in sources]
    senders: list[asyncio.Task[None]] = []
    try:
        # Every client is connected (so every source is in the first gateway's merge) before anyone sends.
        await asyncio.gather(*(c.connect() for c in clients))

        async def run(client: SkewlessClient) -> None:
            for i in range(n):
                assert await client.send("s", {"src": client.source_id, "i": i}) == i
                if i % 20 == 19:
                    await asyncio.sleep(0.02)  # ~2 s of sending per client: the restart lands mid-stream

        senders = [asyncio.create_task(run(c), name=f"send-{c.source_id}") for c in clients]
        # Mid-stream: every source has something in Kafka (so there is progress to recover), more to send, and
        # some events are on their way to Kafka. Nothing awaits between this check and stop() closing every
        # connection (a non-graceful stop, as a crash), so those events reach Kafka in stop()'s flush but their
        # acks never reach the clients.
        await wait_until(lambda: all(c.acked_through("s") >= 200 for c in clients) and in_flight(first) > 0, 20,
                         "first acks while events are in flight")
        unacked_in_kafka = in_flight(first)
        assert not any(t.done() for t in senders)
        assert all(c.next_seq("s") < n for c in clients)
        await first.stop(graceful=False)
        first_running = False
        assert first.counters.delivery_failures == 0, first.health()["last_kafka_error"]

        second = make_gateway()
        await second.start()
        async with asyncio.timeout(60):
            await asyncio.gather(*senders)
            await asyncio.gather(*(c.flush(timeout_s=60) for c in clients))
        for client in clients:
            assert client.error is None
            assert client.unacked_count == 0
            assert client.acked_through("s") == n - 1
            assert client.stats.connection_losses == 1  # the restart, and nothing else
            assert client.stats.reconnects == 1
    finally:
        for task in senders:
            task.cancel()
        await asyncio.gather(*senders, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients))
        if second is not None:
            await second.stop()
        if first_running:
            await first.stop()

    topics = TopicNames(topic_prefix)
    events, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"))
    late, _ = read_stream(kafka.bootstrap_servers, topics.late("s"))
    picture = {"gateways": [first.counters, first.pipeline.counters, second.counters, second.pipeline.counters],
               "clients": [c.stats for c in clients],
               "events": {s: runs(seqs_of(events, s)) for s in sources},
               "late": {s: (runs(seqs_of(late, s)), sorted({r["late_reason"] for r in late if r["source_id"] == s}))
                        for s in sources}}
    for source_id in sources:
        # Every seq exactly once, in seq order, with its own payload.
        assert seqs_of(events, source_id) == list(range(n)), picture
        assert [r["payload"] for r in events if r["source_id"] == source_id] == [
            {"src": source_id, "i": i} for i in range(n)]
    assert len(events) == n * len(sources)
    assert all(r["late"] is False for r in events)
    # No source timed out in either merge, so the merged stream is in reference-time order across the restart.
    assert first.pipeline.counters.source_timeouts == 0, picture
    assert second.pipeline.counters.source_timeouts == 0, picture
    refs = [r["ref_ts_us"] for r in events]
    assert refs == sorted(refs)
    # Every source was back in the new gateway's merge before its resends raced another source's: nothing late.
    assert late == []

    assert second.counters.recovered_sources == len(sources)
    assert second.counters.delivery_failures == 0, second.health()["last_kafka_error"]
    # The clients resent what the first gateway published but could not acknowledge before it stopped: the new
    # gateway recognised those seqs from Kafka and re-acked them instead of publishing them again.
    assert second.counters.duplicates >= unacked_in_kafka > 0
    assert second.counters.duplicates <= sum(c.stats.events_resent for c in clients)
    # Each event was published by exactly one of the two gateways, and the second published every event it
    # received except the duplicates.
    assert first.counters.events_published + second.counters.events_published == n * len(sources)
    assert second.counters.events_received - second.counters.duplicates == second.counters.events_published


async def test_stalled_kafka_blocks_the_sender_and_loses_nothing(kafka, topic_prefix):
    n, max_unacked, queue_limit, warmup = 6_000, 2_000, 1_000, 100
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    producer_config={"queue.buffering.max.messages": queue_limit}))
    await gateway.start()
    client = SkewlessClient("127.0.0.1", gateway.port, "stalled", ["s"], max_unacked=max_unacked, backoff=FAST)
    warm, paused = asyncio.Event(), asyncio.Event()

    async def run() -> None:
        for i in range(n):
            assert await client.send("s", {"i": i}) == i
            if i == warmup - 1:
                # The producer has the events topic's leader and a live connection before the broker stalls.
                await client.flush()
                warm.set()
                await paused.wait()

    sender: asyncio.Task[None] | None = None
    try:
        await client.connect()
        sender = asyncio.create_task(run(), name="send-stalled")
        async with asyncio.timeout(20):
            await warm.wait()
        assert client.acked_through("s") == warmup - 1
        pending: list[int] = []
        os.kill(kafka.pid, signal.SIGSTOP)
        try:
            paused.set()
            stall_started = time.monotonic()
            while time.monotonic() - stall_started < 4.0:
                # undelivered: in librdkafka's queue, or released by the core and queued for the producer
                pending.append(gateway.health()["kafka_pending"])
                await asyncio.sleep(0.01)
            # Blocked, not dropping: send() waits at max_unacked, nothing was acknowledged while Kafka was away.
            assert not sender.done()
            assert client.unacked_count == max_unacked
            assert client.acked_through("s") == warmup - 1
            assert client.next_seq("s") == warmup + max_unacked
            # The gateway holds at most librdkafka's bounded queue plus its own bounded producer queue, and holds
            # everything the client got out before send() blocked (nothing dropped while Kafka is away).
            assert max(pending) <= queue_limit + MAX_UNPRODUCED_RECORDS
            assert pending[-1] >= max_unacked
            assert gateway.counters.events_published == warmup
            assert gateway.counters.delivery_failures == 0
        finally:
            os.kill(kafka.pid, signal.SIGCONT)
        stall_s = time.monotonic() - stall_started
        assert stall_s < 8.0  # far below librdkafka's message.timeout.ms: nothing may time out

        async with asyncio.timeout(60):
            await sender
            await client.flush(timeout_s=60)
        assert client.error is None
        assert client.unacked_count == 0
        assert client.stats.reconnects == 0
        assert client.stats.events_resent == 0
    finally:
        if sender is not None:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
        await client.close()
        await gateway.stop()

    # A delivery Kafka refused would show here (and the events below would then miss it, or hold it on the late topic).
    assert gateway.counters.delivery_failures == 0, gateway.health()["last_kafka_error"]
    assert gateway.counters.duplicates == 0
    assert gateway.counters.events_published == n
    topics = TopicNames(topic_prefix)
    events, _punctuations = read_stream(kafka.bootstrap_servers, topics.events("s"))
    assert seqs_of(events, "stalled") == list(range(n))  # every seq exactly once, in order
    assert [r["payload"]["i"] for r in events] == list(range(n))
    assert read_topic(kafka.bootstrap_servers, topics.late("s")) == []
