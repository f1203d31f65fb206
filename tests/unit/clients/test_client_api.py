"""The SDK's public surface: delivery futures, the exception hierarchy, typed options, defaults (time sync on, at
the port the gateway announces). Against the in-process fake gateway of test_client_loopback.py."""

from __future__ import annotations

import asyncio
import inspect
import threading
import time
from concurrent.futures import Future as ConcurrentFuture
from typing import get_type_hints

import pytest

import clients
from clients import (
    ClientClosed,
    ClientOptions,
    ConnectOptions,
    EventRefused,
    FlushTimeout,
    SkewlessClient,
    SkewlessError,
    SyncSkewlessClient,
    TimeSyncError,
    connect,
)
from clients.core import DeliveryWatch
from tests.unit.clients.test_client_loopback import FakeGateway, until

pytestmark = pytest.mark.timeout(30)


# -- delivery futures ------------------------------------------------------------------------------------------------


def test_delivery_watch_settles_by_cumulative_ack_refusal_and_drain():
    watch: DeliveryWatch[str] = DeliveryWatch()
    for seq in (3, 0, 5, 1):
        watch.watch("a", seq, f"a{seq}")
    watch.watch("b", 0, "b0")
    assert len(watch) == 5
    with pytest.raises(ValueError):
        watch.watch("a", 3, "again")
    assert watch.acked("a", 2) == [(0, "a0"), (1, "a1")]
    assert watch.acked("a", 2) == []
    assert watch.acked("c", 9) == []
    assert watch.refused("a", 3) == "a3"
    assert watch.refused("a", 3) is None
    assert watch.acked("a", 4) == []  # 3 was settled by its refusal
    assert len(watch) == 2
    assert watch.drain() == ["a5", "b0"]
    assert len(watch) == 0
    assert watch.acked("a", 9) == []


async def test_delivery_futures_resolve_with_the_ack_that_covers_their_seq():
    async with FakeGateway(acking=False) as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a", "b"]) as client:
        futures = [await client.send_tracked("a", i) for i in range(5)]
        other = await client.send_tracked("b", "x")
        untracked = await client.send("a", 5)
        await until(lambda: len(gw.delivered[("s1", "a")]) == 6)
        assert not any(f.done() for f in [*futures, other])
        gw.set_acking(True)
        assert await asyncio.gather(*futures) == [0, 1, 2, 3, 4]
        assert await other == 0
        assert untracked == 5
        assert len(client._deliveries) == 0  # forgotten once settled: bounded by the unacked events
        await client.flush()


async def test_a_refused_event_fails_its_future_and_its_neighbours_still_resolve():
    async with FakeGateway() as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
        before = await client.send_tracked("a", 1)
        refused = await client.send_tracked("a", "refuse me")
        after = await client.send_tracked("a", 3)
        assert await before == 0
        with pytest.raises(EventRefused) as failure:
            await refused
        assert (failure.value.stream, failure.value.seq, failure.value.code) == ("a", 1, "invalid_payload")
        assert await after == 2
        assert client.stats.events_refused == 1


async def test_close_fails_the_futures_of_unacknowledged_events():
    async with FakeGateway(acking=False) as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"])
        await client.connect()
        future = await client.send_tracked("a", 1)
        await until(lambda: gw.delivered[("s1", "a")] == [0])
        await client.close()
        with pytest.raises(ClientClosed):
            await future


async def test_flush_times_out_with_the_sdk_error():
    async with FakeGateway(acking=False) as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
        await client.send("a", 1)
        with pytest.raises(FlushTimeout) as failure:
            await client.flush(timeout_s=0.05)
        assert isinstance(failure.value, TimeoutError)
        gw.set_acking(True)
        await client.flush()


def test_sync_wrapper_hands_out_thread_safe_delivery_futures():
    loop = asyncio.new_event_loop()
    gw = FakeGateway()
    loop.run_until_complete(gw.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with SyncSkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
            ok = client.send_tracked("a", 0)
            refused = client.send_tracked("a", "refuse me")
            assert isinstance(ok, ConcurrentFuture)
            assert ok.result(5) == 0
            assert isinstance(refused.exception(5), EventRefused)
    finally:
        asyncio.run_coroutine_threadsafe(gw.__aexit__(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


# -- exceptions ------------------------------------------------------------------------------------------------------


def test_every_exported_error_derives_from_skewless_error_and_keeps_its_builtin_base():
    from timesync.client import TimeSyncError as AnyTimeSyncError

    exported = {name: getattr(clients, name) for name in clients.__all__}
    errors = {name: obj for name, obj in exported.items() if isinstance(obj, type) and issubclass(obj, BaseException)}
    assert set(errors) == {"ClientClosed", "EventGivenUp", "EventRefused", "EventTooLarge", "FlushTimeout",
                           "GatewayFailed", "GatewayRejected", "GatewayRerouted", "GatewayUnreachable",
                           "InvalidInterval", "InvalidPayload", "SkewlessError", "SpoolError", "TimeSyncError"}
    assert issubclass(clients.InvalidInterval, ValueError)
    assert issubclass(clients.InvalidPayload, TypeError)
    assert all(issubclass(cls, SkewlessError) for cls in errors.values())
    assert issubclass(clients.GatewayRerouted, clients.GatewayFailed)
    assert issubclass(clients.GatewayFailed, ConnectionError)
    assert issubclass(clients.GatewayUnreachable, ConnectionError)
    assert issubclass(clients.EventTooLarge, ValueError)
    assert issubclass(clients.ClientClosed, RuntimeError)
    assert issubclass(clients.FlushTimeout, TimeoutError)
    assert issubclass(clients.TimeSyncError, AnyTimeSyncError)
    # The modules that raise them use the same classes.
    from clients.core import EventTooLarge
    from clients.spool import SpoolError

    assert EventTooLarge is clients.EventTooLarge and SpoolError is clients.SpoolError


async def test_a_failed_first_sync_raises_the_sdks_time_sync_error():
    async with FakeGateway() as gw:
        with pytest.raises(SkewlessError) as failure:
            await connect("127.0.0.1", gw.port, 9, "s1", 2, streams=["a"], sync_timeout_s=0.05)
        assert isinstance(failure.value, TimeSyncError)


async def test_a_spool_of_another_source_raises_a_skewless_error(tmp_path):
    async with FakeGateway() as gw:
        spool = tmp_path / "s.spool"
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], spool_path=spool) as client:
            await client.send("a", 1)
        with pytest.raises(SkewlessError, match="belongs to source"):
            SkewlessClient("127.0.0.1", gw.port, "s2", ["a"], spool_path=spool)


# -- options and defaults --------------------------------------------------------------------------------------------


def test_typed_options_name_exactly_the_clients_keyword_parameters():
    parameters = inspect.signature(SkewlessClient.__init__).parameters
    keyword_only = {name for name, p in parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert set(get_type_hints(ClientOptions)) == keyword_only
    assert set(get_type_hints(ConnectOptions)) == keyword_only - {"udp_port", "sync_attempts"}


async def test_time_sync_is_on_by_default_at_the_port_the_welcome_announces():
    from timesync.server import ServerConfig, start_server

    assert inspect.signature(SkewlessClient.__init__).parameters["time_sync"].default is True
    server = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    try:
        announced = server.address[1]
        async with FakeGateway(timesync_port=announced) as gw:
            # No udp_port anywhere: SkewlessClient(...) and connect() both sync, with the announced server.
            async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
                assert client.stats.syncs == 1
                assert client.clock_estimate is not None
                assert client.owner is not None and client.owner.timesync_port == announced
            synced = await connect("127.0.0.1", gw.port, None, "s2", 3, streams=["a"])
            assert synced.stats.syncs == 1
            await synced.close()
            # An announced port wins over a configured one (port 9 has no time server: a sync there would fail).
            async with SkewlessClient("127.0.0.1", gw.port, "s3", ["a"], udp_port=9) as configured:
                assert configured.stats.syncs == 1
            async with SkewlessClient("127.0.0.1", gw.port, "s4", ["a"], time_sync=False) as off:
                assert off.stats.syncs == 0 and off.clock_estimate is None
                with pytest.raises(TimeSyncError):
                    await off.sync_now()
    finally:
        await server.close()


async def test_a_gateway_without_time_sync_still_serves_a_default_client():
    # It announces no port and none is configured: nothing to sync with, the client runs unsynced.
    async with FakeGateway() as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
        await client.send("a", 1)
        await client.flush()
        assert client.stats.syncs == 0 and client.clock_estimate is None


async def test_one_heartbeat_per_source_rotates_over_the_pool():
    async with FakeGateway() as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], pool_size=4, heartbeat_interval_s=0.05)
        await client.connect()
        await client.send("a", 1)
        await client.flush()
        started = time.monotonic()
        await until(lambda: client.stats.heartbeats_sent >= 12)
        await client.close()
        elapsed = time.monotonic() - started
        # Every frame the client wrote has arrived once each connection's bye has.
        await until(lambda: sum(m["type"] == "bye" for _, m in gw.frames) == 4)
    beats = [n for n, m in gw.frames if m["type"] == "heartbeat"]
    assert len(beats) == client.stats.heartbeats_sent
    # One heartbeat per interval for the source, each on the connection silent longest: the four take turns.
    per_connection = [beats.count(n) for n in sorted(set(beats))]
    assert len(per_connection) == 4 and max(per_connection) - min(per_connection) <= 1, per_connection
    # A heartbeat is due only an interval after the source's last write: never more than one per interval
    # (per-connection heartbeats would be four).
    assert len(beats) <= elapsed / 0.05 + 1
