"""The async shell against an in-process fake gateway on a loopback socket (port 0): reconnects, pools, heartbeats,
backpressure, credentials, TLS, time sync, the sync wrapper. Fast and deterministic; the real gateway + Kafka are
exercised in tests/integration/test_client_delivery.py."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from clients import (
    Backoff,
    EventTooLarge,
    GatewayRejected,
    SimulatedClock,
    SkewlessClient,
    SyncSkewlessClient,
    connect,
    hmac_token,
)
from clients.auth import parse_hmac_token
from contract.wire.frames import FrameDecoder, encode_frame

pytestmark = pytest.mark.timeout(30)

FAST = Backoff(initial_s=0.01, max_s=0.05)


class FakeGateway:
    """Speaks the wire protocol: welcome, cumulative acks to every connection of a source, dedup, error frames."""

    def __init__(self, *, acking: bool = True, max_frame_bytes: int = 1 << 20, token: str | None = None,
                 hmac_secret: bytes | None = None, ssl_context: ssl.SSLContext | None = None,
                 timesync_port: int | None = None) -> None:
        self.acking = acking
        self.timesync_port = timesync_port
        self.max_frame_bytes = max_frame_bytes
        self.token = token
        self.hmac_secret = hmac_secret
        self.ssl_context = ssl_context
        self.hellos: list[dict[str, Any]] = []
        self.frames: list[tuple[int, dict[str, Any]]] = []  # (connection number, message)
        self.received: dict[tuple[str, str], list[int]] = defaultdict(list)  # every seq received, duplicates too
        self.delivered: dict[tuple[str, str], list[int]] = defaultdict(list)  # first copy of each seq
        self._seen: dict[tuple[str, str], set[int]] = defaultdict(set)
        self.acked: dict[tuple[str, str], int] = {}
        self.writers: dict[str, list[asyncio.StreamWriter]] = defaultdict(list)
        self.connections = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> FakeGateway:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.ssl_context)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        self.kill_all()
        await self._server.wait_closed()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def kill_all(self, source_id: str | None = None) -> int:
        """Abort the sockets (no FIN handshake, no bye): what a crashed network path looks like."""
        killed = 0
        for source, writers in self.writers.items():
            if source_id is None or source == source_id:
                for writer in writers:
                    writer.transport.abort()
                    killed += 1
                writers.clear()
        return killed

    def set_acking(self, on: bool) -> None:
        self.acking = on
        if on:
            for key in list(self.delivered):
                self._advance(*key)

    def events_of(self, source_id: str, stream: str) -> list[int]:
        return sorted(self.delivered[(source_id, stream)])

    def _advance(self, source_id: str, stream: str) -> None:
        if not self.acking:
            return
        delivered = self.delivered[(source_id, stream)]
        seqs = self._seen[(source_id, stream)]
        # Like the real gateway, a source's contiguous range starts at the first seq this gateway saw.
        acked = self.acked.get((source_id, stream), delivered[0] - 1 if delivered else -1)
        start = acked
        while acked + 1 in seqs:
            acked += 1
        if acked != start:
            self.acked[(source_id, stream)] = acked
            for writer in self.writers[source_id]:
                writer.write(encode_frame({"type": "ack", "stream": stream, "seq": acked}))

    def _check_token(self, hello: dict[str, Any]) -> str | None:
        token = hello.get("token")
        if self.token is not None and token != self.token:
            return "wrong token"
        if self.hmac_secret is not None:
            if not isinstance(token, str):
                return "credentials required"
            ts_us, _digest = parse_hmac_token(token)
            if hmac_token(self.hmac_secret, hello["source_id"], ts_us) != token:
                return "wrong HMAC"
            if abs(ts_us - time.time_ns() // 1000) > 5_000_000:
                return "too far from the gateway clock"
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        decoder = FrameDecoder(self.max_frame_bytes)
        source_id: str | None = None
        try:
            while data := await reader.read(65536):
                for message in decoder.feed(data):
                    self.frames.append((number, message))
                    kind = message["type"]
                    if kind == "hello":
                        self.hellos.append(message)
                        problem = self._check_token(message)
                        if problem is not None:
                            writer.write(encode_frame({"type": "error", "code": "unauthenticated",
                                                       "message": problem, "fatal": True}))
                            writer.close()
                            return
                        source_id = message["source_id"]
                        self.writers[source_id].append(writer)
                        welcome = {"type": "welcome", "version": 1, "max_frame_bytes": self.max_frame_bytes}
                        if self.timesync_port is not None:
                            welcome["timesync_port"] = self.timesync_port
                        writer.write(encode_frame(welcome))
                    elif kind == "events":
                        assert source_id is not None
                        for event in message["events"]:
                            key = (source_id, event["stream"])
                            self.received[key].append(event["seq"])
                            if event["seq"] not in self._seen[key]:
                                self._seen[key].add(event["seq"])
                                self.delivered[key].append(event["seq"])
                            elif self.acking and self.acked.get(key, -1) >= event["seq"]:
                                # Like the real gateway: a duplicate below the ack is re-acked to its sender.
                                writer.write(encode_frame({"type": "ack", "stream": event["stream"],
                                                           "seq": self.acked[key]}))
                            if event.get("payload") == "refuse me":
                                # Like the real gateway's invalid_payload: refused alone, acked with the others.
                                writer.write(encode_frame({"type": "error", "code": "invalid_payload",
                                                           "message": "not JSON", "fatal": False,
                                                           "stream": event["stream"], "seq": event["seq"]}))
                            if event.get("payload") == "poison":
                                writer.write(encode_frame({"type": "error", "code": "invalid_message",
                                                           "message": "poison", "fatal": True}))
                        for stream in {e["stream"] for e in message["events"]}:
                            self._advance(source_id, stream)
                    elif kind == "bye":
                        writer.close()
                        return
        except (ConnectionError, OSError):
            pass
        finally:
            if source_id is not None and writer in self.writers[source_id]:
                self.writers[source_id].remove(writer)


async def until(condition: Any, timeout_s: float = 2.0) -> None:
    """Poll ``condition`` (state of another task) every 5 ms; fail after ``timeout_s``."""
    for _ in range(int(timeout_s / 0.005)):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached in time")


def event_frames(gw: FakeGateway) -> list[tuple[int, dict[str, Any]]]:
    return [(n, m) for n, m in gw.frames if m["type"] == "events"]


async def test_send_flush_close_with_exact_seqs_and_frames_under_the_gateway_limit():
    async with FakeGateway(max_frame_bytes=2_000) as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a", "b"], batch_events=50) as client:
            for i in range(300):
                seq = await client.send("a" if i % 3 else "b", {"i": i, "pad": "x" * 40})
                assert seq == (i - i // 3 - 1 if i % 3 else i // 3)
            await client.flush()
            assert client.unacked_count == 0
            assert client.acked_through("a") == 199
            assert client.next_seq("b") == 100
        assert gw.events_of("s1", "a") == list(range(200))
        assert gw.events_of("s1", "b") == list(range(100))
        assert len(gw.received[("s1", "a")]) == 200  # nothing sent twice
        frames = event_frames(gw)
        assert all(len(m["events"]) <= 50 for _, m in frames)
        assert all(len(encode_frame(m)) - 4 <= 2_000 for _, m in frames)
        assert gw.hellos == [{"type": "hello", "version": 1, "source_id": "s1", "streams": ["a", "b"]}]
        await until(lambda: gw.frames[-1][1] == {"type": "bye"})
        with pytest.raises(EventTooLarge):
            await SkewlessClient("127.0.0.1", gw.port, "s2", ["a"]).send("a", "x" * (2 << 20))


async def test_killed_connection_is_reopened_and_unacked_events_resent():
    async with FakeGateway() as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], batch_events=20, backoff=FAST)
        await client.connect()
        for i in range(1_000):
            await client.send("a", i)
            if i in (300, 600):
                await client.send_pending()
                assert gw.kill_all("s1") == 1  # whatever was in flight, acks included, is lost
                await until(lambda: client.connected_count == 1)
        await client.flush(timeout_s=10)
        assert gw.events_of("s1", "a") == list(range(1_000))
        assert client.stats.reconnects == 2
        assert client.stats.connection_losses == 2
        # Every extra copy the gateway saw is an accounted resend (copies in flight at a kill may never arrive),
        # and only events not yet acknowledged were resent.
        assert 1_000 <= len(gw.received[("s1", "a")]) <= 1_000 + client.stats.events_resent
        assert client.stats.events_resent <= 2 * 601
        await client.close()


async def test_events_sent_while_the_gateway_is_away_go_out_after_reconnect():
    gw = FakeGateway()
    await gw.__aenter__()
    port = gw.port
    client = SkewlessClient("127.0.0.1", port, "s1", ["a"], backoff=Backoff(initial_s=0.02, max_s=0.05))
    await client.connect()
    await client.send("a", 0)
    await client.flush()
    await gw.__aexit__()
    for i in range(1, 50):
        await client.send("a", i)  # queued while nobody listens
    await asyncio.sleep(0.1)
    assert client.connected_count == 0
    # Waiting for a gateway that is away does not spin: flush() sleeps until a connection is back.
    cpu = time.process_time()
    with pytest.raises(TimeoutError):
        await client.flush(timeout_s=0.3)
    assert time.process_time() - cpu < 0.1
    gw2 = FakeGateway()
    gw2._server = await asyncio.start_server(gw2._handle, "127.0.0.1", port)
    try:
        await client.flush(timeout_s=10)
        assert gw2.events_of("s1", "a") == list(range(1, 50))
    finally:
        await client.close()
        await gw2.__aexit__()


async def test_pool_spreads_batches_round_robin_and_takes_acks_from_any_connection():
    async with FakeGateway() as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], pool_size=3, batch_events=10,
                                  linger_s=0) as client:
            await client.send("a", "first")
            await client.flush()  # the first ack un-pins the stream
            for i in range(599):
                await client.send("a", i)
                if i % 10 == 9:
                    await client.send_pending()
            await client.flush()
            assert client.connected_count == 3
        assert gw.events_of("s1", "a") == list(range(600))
        per_connection = defaultdict(int)
        for number, message in event_frames(gw):
            per_connection[number] += len(message["events"])
        assert len(gw.hellos) == 3
        assert sorted(per_connection) == [1, 2, 3]
        assert min(per_connection.values()) >= 150  # round-robin per batch


async def test_pool_connection_killed_resends_only_its_events_on_the_others():
    async with FakeGateway(acking=False) as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], pool_size=2, batch_events=10, linger_s=0,
                                backoff=Backoff(initial_s=1.0, max_s=1.0))
        await client.connect()
        client._acked_streams.add("a")  # skip the warm-up pinning: this test wants both connections busy
        for i in range(100):
            await client.send("a", i)
            if i % 10 == 9:
                await client.send_pending()
        first_writer = gw.writers["s1"][0]
        first_writer.transport.abort()
        gw.writers["s1"].remove(first_writer)
        await asyncio.sleep(0.05)
        await client.send_pending()
        gw.set_acking(True)
        await client.flush(timeout_s=5)
        assert gw.events_of("s1", "a") == list(range(100))
        assert client.stats.events_resent == 50
        await client.close()


async def test_idle_connections_send_heartbeats_with_next_seq_and_source_clock():
    clock = SimulatedClock(ahead_us=3_600_000_000, skew_ppm=100.0)
    async with FakeGateway() as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a", "b"],
                                                   heartbeat_interval_s=0.05, clock_us=clock) as client:
        await client.send("a", 1)
        await client.send("a", 2)
        await client.flush()
        await asyncio.sleep(0.2)
        beats = [m for _, m in gw.frames if m["type"] == "heartbeat"]
        assert len(beats) >= 2
        assert beats[-1]["next_seq"] == {"a": 2, "b": 0}
        assert abs(beats[-1]["source_ts_us"] - (time.time_ns() // 1000 + 3_600_000_000)) < 1_000_000
        # Explicit timestamps (the application's own clock): heartbeats carry the highest one carried forward by
        # the time elapsed since, never a wall-clock reading the events never reached.
        async with SkewlessClient("127.0.0.1", gw.port, "s2", ["b"], heartbeat_interval_s=0.05) as explicit:
            await explicit.send("b", 3, source_ts_us=5_000_000_000)
            await explicit.flush()
            await asyncio.sleep(0.15)
        (s2_conn,) = [n for n, m in gw.frames if m["type"] == "hello" and m["source_id"] == "s2"]
        last = [m for n, m in gw.frames if m["type"] == "heartbeat" and n == s2_conn][-1]["source_ts_us"]
        assert 5_000_050_000 <= last <= 5_001_000_000
        assert explicit.stats.heartbeats_sent >= 2


async def test_no_heartbeat_before_the_first_event():
    async with FakeGateway() as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], heartbeat_interval_s=0.02):
        await asyncio.sleep(0.1)
    assert not [m for _, m in gw.frames if m["type"] == "heartbeat"]


async def test_heartbeats_can_be_disabled():
    async with FakeGateway() as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], heartbeat_interval_s=None):
            await asyncio.sleep(0.1)
        assert not [m for _, m in gw.frames if m["type"] == "heartbeat"]


async def test_send_blocks_at_max_unacked_until_acks_make_room():
    async with FakeGateway(acking=False) as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["a"],
                                                               max_unacked=10) as client:
        for i in range(10):
            await client.send("a", i)
        blocked = asyncio.create_task(client.send("a", 10))
        await asyncio.sleep(0.05)
        assert not blocked.done()
        gw.set_acking(True)
        assert await asyncio.wait_for(blocked, 2) == 10


async def test_static_and_hmac_credentials():
    async with FakeGateway(token="sesame") as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], token="sesame") as client:
            await client.send("a", 1)
        with pytest.raises(GatewayRejected, match="unauthenticated: wrong token") as info:
            await SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], token="nope").connect()
        assert info.value.code == "unauthenticated"
    secret = b"k" * 32
    async with FakeGateway(hmac_secret=secret) as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], hmac_secret=secret) as client:
            await client.send("a", 1)
        token = gw.hellos[0]["token"]
        ts_us, _ = parse_hmac_token(token)
        assert token == hmac_token(secret, "s1", ts_us)
        # A source clock an hour ahead, not synced: its token is refused as too far from the gateway clock.
        with pytest.raises(GatewayRejected, match="too far"):
            await SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], hmac_secret=secret,
                                 clock_us=SimulatedClock(3_600_000_000)).connect()
    with pytest.raises(ValueError, match="either token or hmac_secret"):
        SkewlessClient("127.0.0.1", 1, "s1", ["a"], token="t", hmac_secret=secret)


async def test_fatal_error_frame_fails_the_client():
    async with FakeGateway() as gw:
        client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], backoff=FAST)
        await client.connect()
        await client.send("a", "poison")
        with pytest.raises(GatewayRejected, match="invalid_message: poison"):
            await client.flush(timeout_s=5)
        with pytest.raises(GatewayRejected):
            await client.send("a", 1)
        assert isinstance(client.error, GatewayRejected)
        await client.close()


async def test_gives_up_after_max_reconnect_attempts():
    gw = FakeGateway()
    await gw.__aenter__()
    client = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], backoff=Backoff(0.01, 0.02, max_attempts=3))
    await client.connect()
    await gw.__aexit__()
    await client.send("a", 1)
    with pytest.raises(ConnectionError, match="after 3 reconnect attempts"):
        await client.flush(timeout_s=5)
    with pytest.raises(ConnectionError):
        await client.send("a", 2)
    await client.close()


async def test_unreachable_gateway_fails_connect():
    with pytest.raises(OSError):
        await SkewlessClient("127.0.0.1", 1, "s1", ["a"]).connect()
    client = SkewlessClient("127.0.0.1", 1, "s1", ["a"])
    await client.send("a", 0)
    with pytest.raises(RuntimeError, match="before connect"):
        await client.flush()


async def test_spool_carries_unacked_events_across_a_restart(tmp_path):
    spool = tmp_path / "s1.spool"
    async with FakeGateway(acking=False) as gw:
        first = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], spool_path=spool)
        await first.connect()
        for i in range(20):
            await first.send("a", i)
        await first.send_pending()
        await until(lambda: len(gw.received[("s1", "a")]) == 20)
        gw.set_acking(True)
        await until(lambda: first.acked_through("a") == 19)
        gw.acking = False
        for i in range(20, 30):
            await first.send("a", i)
        await first.send_pending()
        await first.close()  # 10 events unacked, only in the spool now

    async with FakeGateway() as gw:
        second = SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], spool_path=spool)
        assert second.unacked_count == 10
        assert second.stats.recovered_from_spool == 10
        assert second.next_seq("a") == 30
        async with second:
            for i in range(30, 40):
                assert await second.send("a", i) == i
        assert sorted(gw.received[("s1", "a")]) == list(range(20, 40))
    third = SkewlessClient("127.0.0.1", 1, "s1", ["a"], spool_path=spool)
    assert third.unacked_count == 0
    assert third.next_seq("a") == 40
    await third.close()
    with pytest.raises(ValueError, match="not declared"):
        SkewlessClient("127.0.0.1", 1, "s1", ["other"], spool_path=spool)


async def test_explicit_seqs_for_trace_replay():
    async with FakeGateway() as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
            for seq in (2, 0, 1, 4, 3):
                assert await client.send("a", seq, source_ts_us=seq, seq=seq) == seq
            assert await client.send("a", "auto") == 5
            with pytest.raises(ValueError, match="already sent"):
                await client.send("a", "again", seq=3)
        assert gw.received[("s1", "a")] == [2, 0, 1, 4, 3, 5]


def make_tls(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=str(cert))
    return server, client


async def test_tls(tmp_path):
    server_ctx, client_ctx = make_tls(tmp_path)
    async with FakeGateway(ssl_context=server_ctx) as gw:
        async with SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], ssl=client_ctx) as client:
            await client.send("a", 1)
        assert gw.events_of("s1", "a") == [0]
        with pytest.raises(ssl.SSLError):
            await SkewlessClient("127.0.0.1", gw.port, "s1", ["a"], ssl=ssl.create_default_context()).connect()


async def test_connect_syncs_the_clock_first_and_resyncs_in_the_background():
    from timesync.server import ServerConfig, start_server

    server = await start_server(ServerConfig(host="127.0.0.1", port=0, kernel_timestamps=False))
    try:
        udp_port = server.address[1]
        clock = SimulatedClock(ahead_us=-3_600_000_000, skew_ppm=150.0)
        async with FakeGateway() as gw:
            client = await connect("127.0.0.1", gw.port, udp_port, "s1", 10, streams=["a"], clock_us=clock,
                                   resync_interval_s=0.05)
            try:
                estimate = client.clock_estimate
                assert estimate is not None
                # t_ref = t_source + offset_us: a source an hour behind gets offset_us ≈ +1 h.
                assert abs(estimate.offset_us - 3_600_000_000) < 20_000
                assert abs(client.reference_now_us() - time.time_ns() // 1000) < 20_000
                await asyncio.sleep(0.3)
                assert client.stats.syncs >= 3
                await client.send("a", 1)
                await client.flush()
            finally:
                await client.close()
    finally:
        await server.close()


async def test_sync_fails_loudly_without_a_time_server():
    from timesync.client import TimeSyncError

    async with FakeGateway() as gw:
        with pytest.raises(TimeSyncError):
            await connect("127.0.0.1", gw.port, 9, "s1", 2, streams=["a"], sync_timeout_s=0.05)


def test_sync_wrapper_runs_the_client_on_its_own_thread():
    loop = asyncio.new_event_loop()
    gw = FakeGateway()
    loop.run_until_complete(gw.__aenter__())
    import threading

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        with SyncSkewlessClient("127.0.0.1", gw.port, "s1", ["a"]) as client:
            assert client.send("a", 0) == 0
            assert client.send_many("a", [1, 2, 3]) == [1, 2, 3]
            client.flush()
            assert client.unacked_count == 0
            assert client.stats.events_acked == 4
        with pytest.raises(RuntimeError, match="closed"):
            client.send("a", 5)
    finally:
        asyncio.run_coroutine_threadsafe(gw.__aexit__(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert gw.events_of("s1", "a") == [0, 1, 2, 3]


async def test_flush_writes_a_given_up_seqs_one_send_before_it_returns():
    """A seq the gateway gave up before the application sent it is not unacknowledged, but its one send is queued:
    flush() returns only once it is written, so close() right after cannot drop it (a replay's late arrival)."""
    from contract.wire.messages import build_ack, build_gap

    async with FakeGateway() as gw, SkewlessClient("127.0.0.1", gw.port, "s1", ["s"], linger_s=5.0,
                                               batch_events=100) as client:
        await client.send("s", "zero", seq=0)
        await client.send("s", "two", seq=2)
        await client.send_pending()
        await until(lambda: 2 in gw.received[("s1", "s")])
        client._on_message(build_gap("s", 1, 1, "timeout"))
        client._on_message(build_ack("s", 2))
        assert client.unacked_count == 0
        await client.send("s", "one, late", seq=1)  # lingers up to 5 s unless flushed
        await client.flush(timeout_s=2.0)
        # Written by flush (the linger would hold it 5 s): the fake gateway reads it at once.
        await until(lambda: 1 in gw.received[("s1", "s")])
