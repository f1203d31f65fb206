"""SDK delivery guarantees through the real gateway and broker: killed sockets, pools, a restarted client."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import traceback
from collections import Counter
from pathlib import Path

import pytest

from broker.reader import read_stream
from clients import Backoff, EventRefused, SkewlessClient
from contract.topics import TopicNames
from gateway.config import GatewayConfig
from gateway.server import Gateway
from reorder.eval.traces import PROFILES, TraceSpec, generate
from skewless.cli_source import SourceReplayOptions, replay_trace

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = Backoff(initial_s=0.02, max_s=0.2)
BASE_TS_US = 1_700_000_000_000_000


async def connected(*clients: SkewlessClient) -> None:
    """connect() every client; on a handshake timeout print where every task and thread is (gateway included)."""
    try:
        await asyncio.gather(*(c.connect() for c in clients))
    except TimeoutError:
        print("handshake timed out; asyncio tasks and threads follow")
        for task in asyncio.all_tasks():
            print(f"-- task {task.get_name()}")
            task.print_stack(limit=6, file=sys.stdout)
        for thread_id, frame in sys._current_frames().items():
            print(f"-- thread {thread_id}")
            traceback.print_stack(frame, limit=8, file=sys.stdout)
        raise


def delivered(bootstrap: str, prefix: str, stream: str) -> list[dict]:
    """Every event record of the stream, ordered topic first, then late topic (where a record could end up)."""
    topics = TopicNames(prefix)
    events, _punctuations = read_stream(bootstrap, topics.events(stream))
    late, _ = read_stream(bootstrap, topics.late(stream), timeout_s=5.0)
    return events + late


def seqs_of(records: list[dict], source_id: str) -> list[int]:
    return [r["seq"] for r in records if r["source_id"] == source_id]


async def test_killed_socket_mid_stream_loses_and_duplicates_nothing(gateway: Gateway, kafka, topic_prefix):
    n = 3_000
    client = SkewlessClient("127.0.0.1", gateway.port, "killed", ["s"], batch_events=50, backoff=FAST)
    await connected(client)
    for i in range(n):
        await client.send("s", {"i": i}, source_ts_us=BASE_TS_US + i * 1_000)
        if i == 1_000:
            # Client side: the socket dies under the SDK (RST), with batches and acks in flight.
            await client.send_pending()
            writer = client._slots[0].writer
            assert writer is not None
            writer.transport.abort()
        if i == 2_000:
            # Gateway side: the gateway drops the connection.
            await client.send_pending()
            (handler,) = gateway.connections_of("killed")
            assert handler.transport is not None
            handler.transport.abort()
        if i % 100 == 0:
            await asyncio.sleep(0)
    await client.flush(timeout_s=60)
    assert client.stats.reconnects == 2
    await client.close()

    records = delivered(kafka.bootstrap_servers, topic_prefix, "s")
    assert seqs_of(records, "killed") == list(range(n))  # each seq exactly once, in order
    assert [r["payload"]["i"] for r in records] == list(range(n))
    assert all(r.get("late") is False for r in records)


async def test_pool_of_two_connections_delivers_everything_once_in_seq_order(gateway: Gateway, kafka, topic_prefix):
    n, sources = 2_000, 2
    clients = [SkewlessClient("127.0.0.1", gateway.port, f"pool-{k}", ["s"], pool_size=2, batch_events=25,
                              linger_s=0, backoff=FAST) for k in range(sources)]
    await connected(*clients)
    assert all(len(gateway.connections_of(f"pool-{k}")) == 2 for k in range(sources))

    async def run(k: int) -> None:
        client = clients[k]
        for i in range(n):
            await client.send("s", {"k": k, "i": i}, source_ts_us=BASE_TS_US + i * 1_000 + k)
            if i % 25 == 24:
                await client.send_pending()
        await client.flush(timeout_s=60)

    await asyncio.gather(*(run(k) for k in range(sources)))
    frames_per_connection = [c.stats.frames_sent for c in clients]
    await asyncio.gather(*(c.close() for c in clients))

    records = delivered(kafka.bootstrap_servers, topic_prefix, "s")
    assert len(records) == n * sources
    for k in range(sources):
        assert seqs_of(records, f"pool-{k}") == list(range(n))
    assert all(f >= n / 25 for f in frames_per_connection)


SPOOLED_CHILD = textwrap.dedent("""
    import asyncio, os, sys
    from clients import SkewlessClient

    async def main() -> None:
        port, spool = int(sys.argv[1]), sys.argv[2]
        client = SkewlessClient("127.0.0.1", port, "spooled", ["s"], spool_path=spool, batch_events=20)
        await client.connect()
        for i in range(100):
            await client.send("s", {"i": i}, source_ts_us=1_700_000_000_000_000 + i)
        await client.flush()
        for i in range(100, 300):
            await client.send("s", {"i": i}, source_ts_us=1_700_000_000_000_000 + i)
        await client.send_pending()
        print(client.unacked_count, flush=True)
        os._exit(0)  # a crash: no close(), no bye, acks of the last batches never read

    asyncio.run(main())
""")


async def test_spool_survives_a_client_restart(gateway: Gateway, kafka, topic_prefix, tmp_path: Path):
    spool = tmp_path / "spooled.spool"
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-c", SPOOLED_CHILD, str(gateway.port), str(spool),
        stdout=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    out, _ = await asyncio.wait_for(child.communicate(), 60)
    assert child.returncode == 0
    unacked_at_crash = int(out.decode().strip())
    assert unacked_at_crash > 0  # the crash really left events the gateway had not acknowledged

    restarted = SkewlessClient("127.0.0.1", gateway.port, "spooled", ["s"], spool_path=spool, backoff=FAST)
    assert restarted.stats.recovered_from_spool == unacked_at_crash
    assert restarted.next_seq("s") == 300
    async with restarted:
        for i in range(300, 400):
            assert await restarted.send("s", {"i": i}, source_ts_us=BASE_TS_US + i) == i
    assert restarted.unacked_count == 0

    records = delivered(kafka.bootstrap_servers, topic_prefix, "s")
    assert Counter(seqs_of(records, "spooled")) == Counter(range(400))
    assert seqs_of(records, "spooled") == list(range(400))
    assert [r["payload"]["i"] for r in records] == list(range(400))


def replay_options(jitter_us: int) -> SourceReplayOptions:
    # Source clocks an hour behind the gateway (±5 ms, ±100 ppm around 100 ppm): ahead would be quarantined as
    # future-dated, since this gateway fixture does not run time sync.
    return SourceReplayOptions(speed=20.0, ahead_us=-3_600_000_000, ahead_spread_us=5_000, skew_ppm=100.0,
                         skew_spread_ppm=100.0, jitter_us=jitter_us)


async def test_replayed_trace_with_disorder_offsets_and_a_pool_arrives_once_in_seq_order(gateway: Gateway, kafka,
                                                                                          topic_prefix):
    trace = generate(TraceSpec(PROFILES["dataset1"], events_per_source=500, sources=3, seed=2))
    arrival_order = [e.seq for e in sorted(trace, key=lambda e: e.arrival_ts_us) if e.source_id == "s0"]
    assert arrival_order != sorted(arrival_order)  # the trace really is out of order on the wire
    summary = await replay_trace(trace, "127.0.0.1", gateway.port, replay_options(0), pool_size=2, batch_events=10)
    assert summary.acked == 1_500

    records = delivered(kafka.bootstrap_servers, topic_prefix, "sensors")
    assert len(records) == 1_500
    in_order = [r for r in records if not r["late"]]
    for source in ("s0", "s1", "s2"):
        # Exactly once across the ordered and late topics (a trace burst may outlast the gateway's reorder
        # timeout, and then that event is late, not lost), and in seq order on the ordered topic.
        assert sorted(seqs_of(records, source)) == list(range(500))
        ordered = seqs_of(in_order, source)
        assert ordered == sorted(ordered)
        assert len(ordered) >= 490
    behind_s = [(r["arrival_ts_us"] - r["source_ts_us"]) / 1e6 for r in records]
    assert all(3_599 < b < 3_601 for b in behind_s)


async def test_replay_whose_first_arrival_is_not_seq_0_loses_nothing(gateway: Gateway, kafka, topic_prefix):
    trace = generate(TraceSpec(PROFILES["dataset1"], events_per_source=200, sources=3, seed=2))
    summary = await replay_trace(trace, "127.0.0.1", gateway.port, replay_options(200), batch_events=10)
    assert summary.acked == 600
    records = delivered(kafka.bootstrap_servers, topic_prefix, "sensors")
    for source in ("s0", "s1", "s2"):
        assert sorted(seqs_of(records, source)) == list(range(200))


async def test_delivery_futures_resolve_when_kafka_has_the_event_and_fail_for_a_refused_one(
        kafka, topic_prefix):
    # A gateway with its time-sync server: a default client (no udp_port) syncs at the port the welcome announces.
    from timesync.server import ServerConfig

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix,
                                    timesync=ServerConfig(host="127.0.0.1", port=0)))
    await gateway.start()
    try:
        client = SkewlessClient("127.0.0.1", gateway.port, "tracked", ["s"], batch_events=10)
        await connected(client)
        assert client.owner is not None and client.owner.timesync_port == gateway.timesync_port
        assert client.stats.syncs == 1 and client.clock_estimate is not None
        futures = [await client.send_tracked("s", {"blob": b"\x00"} if i == 7 else {"i": i},
                                             source_ts_us=BASE_TS_US + i * 1_000) for i in range(30)]
        outcomes = await asyncio.gather(*futures, return_exceptions=True)
        refused = outcomes.pop(7)
        assert isinstance(refused, EventRefused) and (refused.seq, refused.code) == (7, "invalid_payload")
        assert outcomes == [i for i in range(30) if i != 7]
        # Resolved means acknowledged: Kafka has every one of them, once.
        assert client.acked_through("s") == 29 and client.unacked_count == 0
        await client.close()
    finally:
        await gateway.stop()
    records = delivered(kafka.bootstrap_servers, topic_prefix, "s")
    assert seqs_of(records, "tracked") == [i for i in range(30) if i != 7]
