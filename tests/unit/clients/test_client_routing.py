"""Routing in a gateway cluster (docs/wire-protocol.md, "Shards and routing"): the sans-IO router, then the SDK against
fake gateways on loopback that speak the real wire protocol (contract.wire): redirects, shard errors, several
addresses, time sync at the owner's announced port, and exactly the unacked seqs resent after a shard moves."""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvloop

from clients import Backoff, ClientStats, GatewayAddress, GatewayRerouted, SkewlessClient
from clients.core import GatewayLiveness, GatewayRouter
from contract.wire.errors import SHARD_MOVED, SHARD_UNAVAILABLE
from contract.wire.frames import FrameDecoder, encode_frame
from contract.wire.messages import (
    EventBatch,
    Hello,
    build_ack,
    build_error,
    build_redirect,
    build_resync,
    build_welcome,
    parse_events,
    parse_hello,
)

pytestmark = pytest.mark.timeout(30)

FAST = Backoff(initial_s=0.01, max_s=0.05)

# -- the sans-IO router -------------------------------------------------------------------------------------------


def test_a_round_dials_the_addresses_in_order_without_duplicates() -> None:
    router = GatewayRouter([("a", 1), ("b", 2), ("a", 1), ("c", 3)])
    assert router.addresses == (GatewayAddress("a", 1), GatewayAddress("b", 2), GatewayAddress("c", 3))
    route = router.round()
    dialed = []
    while (target := route.next_target()) is not None:
        dialed.append((target.host, target.port))
        route.unreachable(target)
    assert dialed == [("a", 1), ("b", 2), ("c", 3)]
    assert router.owner is None


def test_the_owner_is_dialed_first_and_not_twice_in_a_round() -> None:
    router = GatewayRouter([("a", 1), ("b", 2)])
    owner = router.welcomed(GatewayAddress("b", 2), timesync_port=7452)
    assert owner == GatewayAddress("b", 2, 7452)
    route = router.round()
    assert route.next_target() == GatewayAddress("b", 2, 7452)
    route.unreachable(GatewayAddress("b", 2))  # the owner died: forgotten, the list is next
    assert router.owner is None
    assert route.next_target() == GatewayAddress("a", 1)
    assert route.next_target() is None  # b was dialed already this round


def test_a_redirect_names_the_owner_for_the_whole_pool_and_is_dialed_next() -> None:
    router = GatewayRouter([("a", 1)], max_redirects=2)
    route = router.round()
    assert route.next_target() == GatewayAddress("a", 1)
    assert route.redirected(GatewayAddress("b", 2, 9000))
    assert router.owner == GatewayAddress("b", 2, 9000)
    assert route.next_target() == GatewayAddress("b", 2, 9000)
    # Another connection's round dials the owner first.
    assert router.round().next_target() == GatewayAddress("b", 2, 9000)
    # The welcome's own time-sync port wins; without one, the redirect's is kept.
    assert router.welcomed(GatewayAddress("b", 2, 9000), None) == GatewayAddress("b", 2, 9000)
    assert router.welcomed(GatewayAddress("b", 2, 9000), 9001) == GatewayAddress("b", 2, 9001)


def test_redirects_beyond_the_bound_end_the_round_and_forget_the_owner() -> None:
    router = GatewayRouter([("a", 1)], max_redirects=2)
    route = router.round()
    route.next_target()
    assert route.redirected(GatewayAddress("b", 2))
    assert route.redirected(GatewayAddress("a", 1))
    assert not route.redirected(GatewayAddress("b", 2))
    assert router.owner is None
    assert route.redirects == 3


def test_forgetting_a_stale_gateway_keeps_a_newer_owner() -> None:
    router = GatewayRouter([("a", 1)])
    router.owner = GatewayAddress("c", 3)
    router.forget(GatewayAddress("b", 2))
    assert router.owner == GatewayAddress("c", 3)
    router.forget(GatewayAddress("c", 3, 7452))  # same TCP endpoint, whatever time-sync port it carried
    assert router.owner is None


def test_a_suspect_gateway_is_dialed_last_and_a_redirect_to_it_is_no_answer_until_the_suspicion_ends() -> None:
    router = GatewayRouter([("a", 1), ("b", 2), ("c", 3)])
    a = GatewayAddress("a", 1)
    router.owner = a
    router.suspect(a, until_s=10.0)
    assert router.owner is None  # a suspect is no owner
    route = router.round(now_s=5.0)
    assert [route.next_target(), route.next_target(), route.next_target(), route.next_target()] == [
        GatewayAddress("b", 2), GatewayAddress("c", 3), a, None]
    assert route.redirect_to_suspect(a) and not route.redirect_to_suspect(GatewayAddress("b", 2))
    # Without a clock (None) nothing is suspect; after the deadline neither.
    assert router.round().next_target() == a
    later = router.round(now_s=10.0)
    assert later.next_target() == a and not later.redirect_to_suspect(a)
    # A welcome clears a suspicion at once.
    router.suspect(a, until_s=20.0)
    router.cleared(a)
    assert router.round(now_s=11.0).next_target() == a


def test_liveness_a_connection_owing_an_answer_for_the_timeout_is_dead_and_not_a_moment_before() -> None:
    liveness = GatewayLiveness(2, timeout_s=5.0, probe_after_s=1.0)
    liveness.opened(0)
    liveness.opened(1)
    liveness.wrote(1, 0.0, expects_answer=False)  # a heartbeat nothing can answer (no ack yet): owes nothing
    liveness.wrote(0, 1.0, expects_answer=True)   # events: owes an ack from 1.0
    liveness.wrote(0, 3.0, expects_answer=True)   # more events: still owed since 1.0
    assert liveness.next_due_in([0, 1], 1.5) == 0.5  # the probe at 2.0
    assert liveness.probe_due([0, 1], 1.9) == []
    assert liveness.probe_due([0, 1], 2.0) == [0]
    assert liveness.probe_due([0, 1], 2.5) == []  # one probe per wait
    assert liveness.next_due_in([0, 1], 2.5) == 3.5
    assert liveness.dead([0, 1], 5.999) == []
    assert liveness.dead([0, 1], 6.0) == [0]
    assert liveness.dead([1], 60.0) == []  # only live connections are judged
    # A heartbeat that asks for an answer is a probe itself: none more is due while it waits.
    liveness.wrote(1, 70.0, expects_answer=True, heartbeat=True)
    assert liveness.probe_due([1], 72.0) == [] and liveness.dead([1], 75.0) == [1]


def test_liveness_a_frame_received_restarts_the_wait_while_written_events_are_unacked() -> None:
    liveness = GatewayLiveness(1, timeout_s=5.0, probe_after_s=1.0)
    liveness.wrote(0, 0.0, expects_answer=True)
    liveness.received(0, 4.0, outstanding=True)  # an ack for part of them: owed again from 4.0
    assert liveness.dead([0], 8.9) == [] and liveness.dead([0], 9.0) == [0]
    assert liveness.probe_due([0], 5.0) == [0]  # and a new probe is due for the new wait
    liveness.received(0, 9.5, outstanding=False)  # everything acked: owes nothing
    assert liveness.dead([0], 100.0) == [] and liveness.next_due_in([0], 100.0) is None
    # A reconnection owes nothing until it writes.
    liveness.wrote(0, 101.0, expects_answer=True)
    liveness.opened(0)
    assert liveness.dead([0], 200.0) == []


def test_liveness_disabled_and_its_arguments_checked() -> None:
    liveness = GatewayLiveness(1, timeout_s=None, probe_after_s=1.0)
    liveness.wrote(0, 0.0, expects_answer=True)
    assert liveness.dead([0], 1e9) == [] and liveness.probe_due([0], 1e9) == []
    assert liveness.next_due_in([0], 0.0) is None
    with pytest.raises(ValueError, match="liveness"):
        GatewayLiveness(1, timeout_s=0.0)
    # A probe later than the timeout could never help: none.
    late_probe = GatewayLiveness(1, timeout_s=1.0, probe_after_s=2.0)
    late_probe.wrote(0, 0.0, expects_answer=True)
    assert late_probe.probe_due([0], 1.5) == []


def test_router_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one gateway"):
        GatewayRouter([])
    with pytest.raises(ValueError, match="max_redirects"):
        GatewayRouter([("a", 1)], max_redirects=-1)


# -- the SDK against a fake cluster ---------------------------------------------------------------------------------


class Cluster:
    """What the gateways share: the Kafka log of stream ``a`` of source ``s1`` (the seqs in it)."""

    def __init__(self) -> None:
        self.log: set[int] = set()

    def acked_through(self) -> int:
        seq = -1
        while seq + 1 in self.log:
            seq += 1
        return seq


class FakeClusterGateway:
    """One gateway of a fake cluster, speaking the wire protocol through contract.wire's builders and parsers.

    ``redirect_to`` set: it does not own the shard and answers every hello with a redirect there. Otherwise it
    welcomes (with its ``timesync_port`` when set), writes events to the shared log, and acks cumulatively."""

    def __init__(self, cluster: Cluster, gateway_id: str, *, timesync_port: int | None = None) -> None:
        self.cluster = cluster
        self.gateway_id = gateway_id
        self.timesync_port = timesync_port
        self.clock_known = False  # its welcome says it already holds an estimate of the source's clock
        self.redirect_to: FakeClusterGateway | None = None
        self.refuse_next: list[dict[str, Any]] = []  # error frames answering the next hellos, first one first
        self.acking = True
        self.answer_heartbeats = False  # answer a heartbeat with the cumulative ack, as a real gateway does
        self.heartbeats = 0
        self.last_ack = -1
        self.hellos = 0
        self.welcomed = 0
        self.received: list[int] = []  # every seq that reached this gateway, in order, duplicates too
        self.writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def start(self) -> FakeClusterGateway:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self.writers:
            writer.transport.abort()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def address(self) -> GatewayAddress:
        return GatewayAddress("127.0.0.1", self.port)

    def move_shard_away(self, retry_after_ms: int) -> None:
        """The shard was revoked from this gateway: ``shard_moved`` on every connection, then close them."""
        frame = encode_frame(build_error(SHARD_MOVED, "shard 0 revoked", True, retry_after_ms=retry_after_ms))
        for writer in self.writers:
            writer.write(frame)
            writer.close()
        self.writers.clear()

    def ack(self) -> None:
        if self.acking:
            self.last_ack = self.cluster.acked_through()
            frame = encode_frame(build_ack("a", self.last_ack))
            for writer in self.writers:
                writer.write(frame)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        decoder = FrameDecoder()
        try:
            while data := await reader.read(65536):
                for raw in decoder.feed(data):
                    if raw["type"] == "hello":
                        if not self._answer_hello(parse_hello(raw), writer):
                            return
                    elif raw["type"] == "events":
                        self._on_events(parse_events(raw, 10_000, frozenset({"a"})))
                    elif raw["type"] == "heartbeat":
                        self.heartbeats += 1
                        if self.answer_heartbeats and self.last_ack >= 0:
                            writer.write(encode_frame(build_ack("a", self.last_ack)))
        except (ConnectionError, OSError):
            pass
        finally:
            if writer in self.writers:
                self.writers.remove(writer)

    def _answer_hello(self, hello: Hello, writer: asyncio.StreamWriter) -> bool:
        assert hello.source_id == "s1"
        self.hellos += 1
        if self.refuse_next:
            writer.write(encode_frame(self.refuse_next.pop(0)))
            writer.close()
            return False
        if self.redirect_to is not None:
            owner = self.redirect_to
            writer.write(encode_frame(build_redirect(0, owner.gateway_id, "127.0.0.1", owner.port,
                                                     owner.timesync_port)))
            writer.close()
            return False
        self.welcomed += 1
        writer.write(encode_frame(build_welcome(1 << 20, gateway_id=self.gateway_id, shard=0,
                                                timesync_port=self.timesync_port, clock_known=self.clock_known)))
        self.writers.append(writer)
        return True

    def _on_events(self, batch: EventBatch) -> None:
        for event in batch.events:
            self.received.append(event.seq)
            self.cluster.log.add(event.seq)  # a duplicate is dropped by the log: a set
        self.ack()


async def until(condition: Any, timeout_s: float = 5.0) -> None:
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached in time")


def silent_udp_port() -> socket.socket:
    """A bound UDP socket that never answers: a time sync sent there fails (so a passing sync went elsewhere)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    return sock


async def test_redirect_then_shard_moved_ends_on_the_new_owner_with_exactly_the_unacked_seqs_resent() -> None:
    from timesync.server import ServerConfig, start_server

    time_a = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    time_b = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    silent = silent_udp_port()
    cluster = Cluster()
    gw_a = await FakeClusterGateway(cluster, "gw-a", timesync_port=time_a.address[1]).start()
    gw_b = await FakeClusterGateway(cluster, "gw-b", timesync_port=time_b.address[1]).start()
    gw_a.redirect_to = gw_b  # B owns the shard; A knows it
    client = SkewlessClient("127.0.0.1", gw_a.port, "s1", ["a"], pool_size=2, backoff=FAST, linger_s=0,
                            heartbeat_interval_s=None, udp_port=silent.getsockname()[1], sync_timeout_s=0.05,
                            resync_interval_s=None)
    try:
        await client.connect()
        # The first connection was redirected; the second dialed the owner it learned directly.
        assert (gw_a.hellos, gw_a.welcomed, gw_b.hellos, gw_b.welcomed) == (1, 0, 2, 2)
        assert client.owner == GatewayAddress("127.0.0.1", gw_b.port, time_b.address[1])
        assert client.connected_count == 2
        # Time sync went to the port the redirect and the welcome named, not to the configured (silent) one.
        assert time_b.store.get("s1") is not None
        assert time_a.store.get("s1") is None
        assert client.stats.syncs == 1

        for i in range(5):
            await client.send("a", i)
        await client.flush(timeout_s=5)
        assert client.acked_through("a") == 4
        gw_b.acking = False  # Kafka slow at B: 5..9 reach B, no ack
        for i in range(5, 10):
            await client.send("a", i)
        await client.send_pending()
        await until(lambda: sorted(gw_b.received) == list(range(10)))

        # Failover: B loses the shard to A. B says shard_moved and closes; A now owns and welcomes.
        gw_a.redirect_to = None
        gw_b.redirect_to = gw_a
        gw_b.move_shard_away(retry_after_ms=50)
        await client.flush(timeout_s=5)

        assert gw_a.received == [5, 6, 7, 8, 9]  # exactly the unacked seqs, each once
        assert client.acked_through("a") == 9
        assert cluster.log == set(range(10))
        assert client.owner == GatewayAddress("127.0.0.1", gw_a.port, time_a.address[1])
        assert client.connected_count == 2
        # Both connections went back through the list (A is its only address) and landed on A: no redirect needed.
        assert gw_a.welcomed == 2
        assert (client.stats.redirects, client.stats.shard_moves, client.stats.shard_unavailable) == (1, 2, 0)
        assert client.stats.events_resent == 5
        # The time sync followed the owner to A's announced port.
        assert time_a.store.get("s1") is not None
        assert client.stats.time_sync_moves == 1
        assert client.stats.syncs == 2
        # A resync request from the new owner runs a burst against the new owner's time-sync server.
        before_a = time_a.stats.loop_timestamps
        before_b = time_b.stats.loop_timestamps
        for writer in gw_a.writers[:1]:
            writer.write(encode_frame(build_resync("clock_step", "a", 9)))
        await until(lambda: client.stats.syncs == 3)
        assert time_a.stats.loop_timestamps > before_a
        assert time_b.stats.loop_timestamps == before_b
    finally:
        await client.close()
        await gw_a.stop()
        await gw_b.stop()
        await time_a.close()
        await time_b.close()
        silent.close()


async def test_a_dead_first_address_is_skipped_and_the_next_one_serves() -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    gw = await FakeClusterGateway(Cluster(), "gw-1").start()
    try:
        client = SkewlessClient("127.0.0.1", dead.getsockname()[1], "s1", ["a"], gateways=[("127.0.0.1", gw.port)],
                                backoff=FAST, linger_s=0)
        async with client:
            assert client.owner == gw.address
            assert await client.send("a", "x") == 0
        assert gw.received == [0]
        # Every address refused: connect() fails at once, with the last address' error, as with one gateway.
        with pytest.raises(OSError):
            await SkewlessClient("127.0.0.1", dead.getsockname()[1], "s1", ["a"],
                                 gateways=[("127.0.0.1", dead.getsockname()[1])]).connect()
    finally:
        await gw.stop()
        dead.close()


async def test_shard_unavailable_at_hello_waits_retry_after_ms_then_connects() -> None:
    gw = await FakeClusterGateway(Cluster(), "gw-1").start()
    gw.refuse_next = [build_error(SHARD_UNAVAILABLE, "shard 0 is recovering", True, retry_after_ms=200)]
    loop = asyncio.get_running_loop()
    try:
        started = loop.time()
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], backoff=FAST, linger_s=0)
        async with client:
            # FAST's own delay is at most 50 ms: the 200 ms came from the gateway.
            assert loop.time() - started >= 0.2
            assert client.stats.shard_unavailable == 1
            await client.send("a", "x")
        assert (gw.hellos, gw.welcomed, gw.received) == (2, 1, [0])
    finally:
        await gw.stop()


async def test_redirects_that_do_not_settle_fail_connect_after_the_timeout() -> None:
    cluster = Cluster()
    gw_a = await FakeClusterGateway(cluster, "gw-a").start()
    gw_b = await FakeClusterGateway(cluster, "gw-b").start()
    gw_a.redirect_to, gw_b.redirect_to = gw_b, gw_a  # each thinks the other owns the shard
    try:
        client = SkewlessClient("127.0.0.1", gw_a.port, "s1", ["a"], backoff=FAST, max_redirects=3,
                                connect_timeout_s=0.3)
        with pytest.raises(GatewayRerouted) as caught:
            await client.connect()
        assert caught.value.code == "too_many_redirects"
        # Each round from the list: A, B, A, B dialed (4 hellos), 4 redirects (the fourth is one too many).
        assert client.stats.redirects % 4 == 0 and client.stats.redirects >= 8
        assert gw_a.hellos + gw_b.hellos == client.stats.redirects
        assert gw_a.hellos == gw_b.hellos
        assert client.owner is None
    finally:
        await gw_a.stop()
        await gw_b.stop()


# -- a gateway that stops answering (issue 24, item 10) -------------------------------------------------------------


async def test_a_gateway_that_stops_answering_is_left_after_the_liveness_timeout_and_the_unacked_resent() -> None:
    """A paused owner keeps the TCP connection open and accepts what the source writes: only its silence tells."""
    cluster = Cluster()
    paused = await FakeClusterGateway(cluster, "gw-paused").start()
    other = await FakeClusterGateway(cluster, "gw-other").start()
    loop = asyncio.get_running_loop()
    try:
        client = SkewlessClient("127.0.0.1", paused.port, "s1", ["a"], gateways=[("127.0.0.1", other.port)],
                                backoff=FAST, linger_s=0, heartbeat_interval_s=0.1, liveness_timeout_s=0.5,
                                time_sync=False)
        async with client:
            await client.send("a", "x")
            await until(lambda: client.acked_through("a") == 0)
            paused.acking = False  # SIGSTOP: the kernel still takes the bytes; nothing comes back
            paused_at = loop.time()
            for i in range(3):
                await client.send("a", i)
            await until(lambda: client.acked_through("a") == 3, timeout_s=10)
            left_after_s = loop.time() - paused_at
            assert client.owner == other.address
        assert 0.5 <= left_after_s < 2.0, left_after_s
        assert client.stats.liveness_timeouts == 1
        assert paused.received == [0, 1, 2, 3] and other.received == [1, 2, 3]  # exactly the unacked, resent
        assert paused.hellos == 1  # the suspect was not dialed again
    finally:
        await paused.stop()
        await other.stop()


async def _x_acked_then_y(middle: Callable[[FakeClusterGateway, SkewlessClient], Awaitable[None]],
                          heartbeat_interval_s: float = 30.0, liveness_timeout_s: float = 0.5,
                          ) -> tuple[ClientStats, FakeClusterGateway]:
    """One fake gateway (answering heartbeats) and a client: x sent and acked, then ``middle``, which sends y, then y
    acked. By default the client has no probe (its heartbeat interval is past its liveness timeout): only acks
    answer it. The client's stats once closed, and the gateway."""
    cluster = Cluster()
    gw = await FakeClusterGateway(cluster, "gw-1").start()
    gw.answer_heartbeats = True
    try:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], backoff=FAST, linger_s=0,
                                heartbeat_interval_s=heartbeat_interval_s, liveness_timeout_s=liveness_timeout_s,
                                time_sync=False)
        async with client:
            await client.send("a", "x")
            await until(lambda: client.acked_through("a") == 0)
            await middle(gw, client)
            await until(lambda: client.acked_through("a") == 1)
            await asyncio.sleep(0.1)
        return client.stats, gw
    finally:
        await gw.stop()


async def test_a_live_gateway_whose_acks_are_slow_answers_the_probe_heartbeat_and_is_kept() -> None:
    """Kafka slower than the liveness timeout is not a dead gateway: the heartbeat probe is answered at once."""

    async def kafka_stalls(gw: FakeClusterGateway, client: SkewlessClient) -> None:
        gw.acking = False  # events are taken, their acks wait
        await client.send("a", "y")
        await asyncio.sleep(2.5)  # well past the timeout
        assert client.acked_through("a") == 0
        gw.acking = True
        gw.ack()

    # The timeout is 10 probe intervals: with 0.4 s, one stall of this test process's loop (the fake gateway shares
    # it) under CI's parallel load left the probe's answer unread past it once.
    stats, gw = await _x_acked_then_y(kafka_stalls, heartbeat_interval_s=0.1, liveness_timeout_s=1.0)
    assert (stats.liveness_timeouts, stats.connects, gw.received) == (0, 1, [0, 1])
    assert gw.heartbeats >= 2


async def test_an_idle_client_whose_events_are_all_acked_owes_nothing_and_keeps_its_gateway() -> None:
    """The read that brings the last ack ends the wait for an answer: idle past the liveness timeout, the connection
    is kept. It was dropped once a timeout after that ack."""

    async def idle(_gw: FakeClusterGateway, client: SkewlessClient) -> None:
        await asyncio.sleep(1.5)  # three timeouts
        assert client.stats.liveness_timeouts == 0
        await client.send("a", "y")

    stats, gw = await _x_acked_then_y(idle)
    assert (stats.liveness_timeouts, stats.connects, gw.received) == (0, 1, [0, 1])


async def _stall_with_the_answer_unread(gw: FakeClusterGateway, client: SkewlessClient) -> None:
    """The gateway's ack of y is in the client's socket when the client's own process stalls past its timeout."""
    gw.acking = False
    await client.send("a", "y")
    await until(lambda: gw.received == [0, 1])
    gw.acking = True
    gw.ack()  # written to the socket now; the client reads it only once its loop runs again
    time.sleep(1.0)  # noqa: ASYNC251 - the stall under test: the client's process (the fake gateway has answered)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_client_that_stalled_reads_the_answer_waiting_in_its_socket_before_it_judges_the_gateway(
        loop_kind: str) -> None:
    """The liveness timeout measures the gateway's silence, not the client's own pause: after the stall, the ack
    waiting in the socket is read before the overdue liveness check runs, under either event loop."""
    factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        stats, gw = runner.run(_x_acked_then_y(_stall_with_the_answer_unread))
    assert (stats.liveness_timeouts, stats.connects, gw.received) == (0, 1, [0, 1])


async def test_redirects_to_a_gateway_found_dead_are_waited_out_until_the_cluster_moves_the_shard() -> None:
    """The survivors still name the paused owner until the group moves its shard: no redirect loop to it."""
    cluster = Cluster()
    paused = await FakeClusterGateway(cluster, "gw-paused").start()
    survivor = await FakeClusterGateway(cluster, "gw-survivor").start()
    survivor.redirect_to = paused  # its view of the owner record
    loop = asyncio.get_running_loop()
    try:
        client = SkewlessClient("127.0.0.1", paused.port, "s1", ["a"], gateways=[("127.0.0.1", survivor.port)],
                                backoff=FAST, linger_s=0, heartbeat_interval_s=0.1, liveness_timeout_s=1.0,
                                time_sync=False)
        async with client:
            await client.send("a", "x")
            await until(lambda: client.acked_through("a") == 0)
            paused.acking = False
            await client.send("a", "y")
            await until(lambda: client.stats.redirects_to_suspects >= 2, timeout_s=5)
            survivor.redirect_to = None  # the group gave the shard to the survivor
            moved_at = loop.time()
            await until(lambda: client.acked_through("a") == 1, timeout_s=5)
            # Paced by the waits of about 0.5 s between asks, not by a backoff that grew meanwhile.
            assert loop.time() - moved_at < 1.0
        assert paused.hellos == 1 and survivor.welcomed == 1
        assert client.stats.redirects_to_suspects >= 2
        assert survivor.received == [1]
    finally:
        await paused.stop()
        await survivor.stop()


async def test_shard_unavailable_after_a_lost_owner_is_paced_by_retry_after_not_a_growing_backoff() -> None:
    """A killed owner: the survivor answers shard_unavailable until the group moved the shard; the source is back
    within one retry_after_ms of the shard being served, however long the failover took."""
    cluster = Cluster()
    owner = await FakeClusterGateway(cluster, "gw-owner").start()
    survivor = await FakeClusterGateway(cluster, "gw-survivor").start()
    unavailable = build_error(SHARD_UNAVAILABLE, "failover in progress", True, retry_after_ms=100)
    survivor.refuse_next = [unavailable] * 12
    loop = asyncio.get_running_loop()
    slow = Backoff(initial_s=0.05, max_s=5.0, jitter=0.0)
    try:
        client = SkewlessClient("127.0.0.1", owner.port, "s1", ["a"], gateways=[("127.0.0.1", survivor.port)],
                                backoff=slow, linger_s=0, time_sync=False)
        async with client:
            await client.send("a", "x")
            await until(lambda: client.acked_through("a") == 0)
            killed_at = loop.time()
            await owner.stop()
            await client.send("a", "y")
            await until(lambda: client.acked_through("a") == 1, timeout_s=20)
            back_after_s = loop.time() - killed_at
        # 12 answers 100 ms apart (a backoff doubling from 50 ms would have taken over 100 s).
        assert client.stats.shard_unavailable == 12
        assert back_after_s < 2.5, back_after_s
    finally:
        await survivor.stop()


# -- issue 24 item 10(c): the time sync with a new owner that already knows this source's clock -------------------

def test_owner_sync_plan_blocks_only_when_the_owner_cannot_map_this_clock_yet() -> None:
    from clients.core import OwnerSync, plan_owner_sync
    old, new = ("gw-a", 7452), ("gw-b", 7453)
    # No sync yet: the first burst runs before anything is sent (connect() raises when it fails).
    assert plan_owner_sync(None, new, owner_knows_clock=True) is OwnerSync.FIRST_BURST
    assert plan_owner_sync(None, new, owner_knows_clock=False) is OwnerSync.FIRST_BURST
    # The same time-sync server: nothing to do.
    assert plan_owner_sync(new, new, owner_knows_clock=False) is OwnerSync.STAY
    assert plan_owner_sync(new, new, owner_knows_clock=True) is OwnerSync.STAY
    # A new owner with no estimate of this clock would map its events with an unknown error: sync first.
    assert plan_owner_sync(old, new, owner_knows_clock=False) is OwnerSync.MOVE_BEFORE_SENDING
    # A new owner that restored this source's estimate (failover: the sources topic's clock state) maps the resent
    # events at once: they go now, the burst runs beside them.
    assert plan_owner_sync(old, new, owner_knows_clock=True) is OwnerSync.MOVE_BESIDE_SENDING


@pytest.mark.parametrize("clock_known", [True, False])
async def test_a_new_owner_that_knows_the_clock_gets_the_resend_before_the_sync_burst_ends(clock_known: bool) -> None:
    from timesync.server import ServerConfig, start_server

    sync_timeout_s = 0.5
    time_a = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    silent = silent_udp_port()  # B's time-sync server never answers: a burst with it takes >= sync_timeout_s
    cluster = Cluster()
    gw_a = await FakeClusterGateway(cluster, "gw-a", timesync_port=time_a.address[1]).start()
    gw_b = await FakeClusterGateway(cluster, "gw-b", timesync_port=silent.getsockname()[1]).start()
    gw_b.clock_known = clock_known
    client = SkewlessClient("127.0.0.1", gw_a.port, "s1", ["a"], pool_size=1, backoff=FAST, linger_s=0,
                            heartbeat_interval_s=None, sync_timeout_s=sync_timeout_s, resync_interval_s=None)
    loop = asyncio.get_running_loop()
    try:
        await client.connect()
        for i in range(5):
            await client.send("a", i)
        await client.flush(timeout_s=5)
        gw_a.acking = False
        for i in range(5, 10):
            await client.send("a", i)
        await client.send_pending()
        await until(lambda: sorted(gw_a.received) == list(range(10)))

        gw_a.redirect_to = gw_b  # the shard moved to B
        moved_at = loop.time()
        gw_a.move_shard_away(retry_after_ms=0)
        await until(lambda: sorted(gw_b.received) == [5, 6, 7, 8, 9])
        resent_after_s = loop.time() - moved_at
        await client.flush(timeout_s=10)
        assert cluster.log == set(range(10))
        assert client.acked_through("a") == 9
        assert client.stats.time_sync_moves == 1
        if clock_known:
            # Sent at once; the burst with B (which can only time out) was still running.
            assert resent_after_s < sync_timeout_s, resent_after_s
            assert client._move_sync_task is not None and not client._move_sync_task.done()
        else:
            # B could not map the clock: nothing was sent before the burst gave up.
            assert resent_after_s >= sync_timeout_s, resent_after_s
            assert client._move_sync_task is None
    finally:
        await client.close()
        await gw_a.stop()
        await gw_b.stop()
        await time_a.close()
        silent.close()
