"""Hostile peers against a real gateway and broker: slowloris, connection floods, oversized frames, replayed and
spoofed hellos, wrong HMACs, TLS with a wrong certificate, and a UDP flood of the time-sync server.

Each attack must be refused (and counted), while a well-behaved source streaming at the same time delivers every
event exactly once and the health endpoint keeps answering.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from clients import Backoff, SkewlessClient
from clients.client import GatewayRejected
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.auth import SourceAuthenticator, hmac_token
from gateway.server import Gateway, GatewayConfig
from gateway.session import SessionTimeouts
from tests.reliability.harness import http_get_json, read_delivery, record_outcome, wait_until
from timesync.clocks import system_time_us
from timesync.codec import HEADER_LEN, NtpPacket, encode_packet
from timesync.responder import ResponderConfig
from timesync.server import ServerConfig, start_server

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

SECRET = b"s" * 32
FAST = Backoff(initial_s=0.02, max_s=0.2)


@dataclass
class Probe:
    """Polls /healthz while an attack runs: every answer and its latency."""

    port: int
    latencies_ms: list[float]
    failures: int = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                status, _health = await http_get_json("127.0.0.1", self.port, "/healthz", timeout_s=5)
                assert status == 200
                self.latencies_ms.append((time.monotonic() - started) * 1e3)
            except (OSError, TimeoutError, AssertionError):
                self.failures += 1
            await asyncio.sleep(0.05)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.latencies_ms)
        return {"healthz_probes": len(ordered), "healthz_failures": self.failures,
                "healthz_p99_ms": round(ordered[min(len(ordered) - 1, len(ordered) * 99 // 100)], 1),
                "healthz_max_ms": round(ordered[-1], 1)}


async def start_gateway(kafka, prefix: str, **overrides) -> Gateway:
    config = GatewayConfig(port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=prefix, metrics_port=0,
                           max_frame_bytes=64 * 1024,
                           timeouts=SessionTimeouts(handshake_us=1_000_000, partial_frame_us=1_500_000,
                                                    idle_us=3_000_000))
    for name, value in overrides.items():
        setattr(config, name, value)
    gateway = Gateway(config)
    await gateway.start()
    return gateway


async def stream_good_source(client: SkewlessClient, n: int, pace_every: int = 50) -> None:
    for i in range(n):
        assert await client.send("s", {"i": i}) == i
        if i % pace_every == pace_every - 1:
            await asyncio.sleep(0.01)
    await client.flush(timeout_s=60)


async def closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> tuple[list[dict], float]:
    """Read until the gateway closes; returns the frames it sent and how long it took."""
    started = time.monotonic()
    decoder = FrameDecoder()
    frames: list[dict] = []
    async with asyncio.timeout(timeout_s):
        while data := await reader.read(65536):
            frames += decoder.feed(data)
    return frames, time.monotonic() - started


@pytest.fixture
async def open_gateway(kafka, topic_prefix) -> AsyncIterator[Gateway]:
    gateway = await start_gateway(kafka, topic_prefix)
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_slowloris_peers_are_cut_off_while_a_good_source_streams(open_gateway: Gateway, kafka, topic_prefix):
    gateway = open_gateway
    assert gateway.metrics_port is not None
    silent, trickling, idle = 60, 60, 30
    good = SkewlessClient("127.0.0.1", gateway.port, "good", ["s"], backoff=FAST, heartbeat_interval_s=0.5)
    await good.connect()
    stop = asyncio.Event()
    probe = Probe(gateway.metrics_port, [])
    probe_task = asyncio.create_task(probe.run(stop))

    async def silent_peer() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        try:
            frames, took = await closed_by_peer(reader, 10)
        finally:
            writer.close()
        assert [f["code"] for f in frames] == ["timeout"]
        return took

    async def trickling_peer(k: int) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame({"type": "hello", "version": 1, "source_id": f"slow-{k}", "streams": ["s"]}))
        frame = encode_frame({"type": "events", "events": [{"stream": "s", "seq": 0, "source_ts_us": 1,
                                                           "payload": "x" * 200}]})

        async def trickle() -> None:
            for byte in frame[:-1]:  # never the last byte: the frame never completes
                writer.write(bytes([byte]))
                await asyncio.sleep(0.1)

        trickler = asyncio.create_task(trickle())
        try:
            frames, took = await closed_by_peer(reader, 10)
        finally:
            trickler.cancel()
            writer.close()
        assert [f["type"] for f in frames] == ["welcome", "error"] and frames[1]["code"] == "timeout"
        return took

    async def idle_peer(k: int) -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame({"type": "hello", "version": 1, "source_id": f"idle-{k}", "streams": ["s"]}))
        try:
            frames, took = await closed_by_peer(reader, 10)
        finally:
            writer.close()
        assert [f["type"] for f in frames] == ["welcome", "error"] and frames[1]["code"] == "timeout"
        return took

    try:
        attack = asyncio.gather(*(silent_peer() for _ in range(silent)), *(trickling_peer(k) for k in range(trickling)),
                                *(idle_peer(k) for k in range(idle)))
        await stream_good_source(good, 3_000)
        took = await attack
    finally:
        stop.set()
        await probe_task
        await good.close()
    assert gateway.counters.timeouts == silent + trickling + idle
    # Cut off by the right timeout (1 s handshake, 1.5 s partial frame, 3 s idle; swept every 0.5 s).
    assert max(took[:silent]) < 2.5
    assert max(took[silent:silent + trickling]) < 3.5
    assert max(took[silent + trickling:]) < 5.0
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"good": 3_000})
    assert probe.failures == 0
    record_outcome(
        "Slowloris", group="hostile",
        injected=f"{silent} silent connections, {trickling} trickling a frame 1 byte/100 ms after hello, {idle} idle "
                 "after hello, while one source streams 3,000 events",
        checked="each cut off by its timeout with a `timeout` error; good source exactly once; /healthz answers",
        outcome={"cut_off": gateway.counters.timeouts, "max_s_to_cut": {
            "silent": round(max(took[:silent]), 2), "trickling": round(max(took[silent:silent + trickling]), 2),
            "idle": round(max(took[silent + trickling:]), 2)}, **delivery.summary({"good": 3_000}),
            **probe.summary()})


@pytest.fixture
async def flood_gateway(kafka, topic_prefix) -> AsyncIterator[Gateway]:
    # 2 s to say hello: the silent flood connections cost the scenario that long, and a loaded host's own scheduling
    # of the peers' process stays well inside it.
    gateway = await start_gateway(kafka, topic_prefix,
                                  timeouts=SessionTimeouts(handshake_us=2_000_000, partial_frame_us=3_000_000,
                                                           idle_us=10_000_000))
    try:
        yield gateway
    finally:
        await gateway.stop()


async def test_connection_flood_and_oversized_frames_leave_the_good_source_unaffected(flood_gateway: Gateway, kafka,
                                                                                       topic_prefix):
    """The attackers run in a process of their own (tests/reliability/flood_peers.py): in the test's event loop
    their first bytes could leave after the handshake timeout, which made the counts depend on the host's load."""
    gateway = flood_gateway
    assert gateway.metrics_port is not None
    flood, oversized = 3_000, 200
    fds_before = len(os.listdir("/proc/self/fd"))
    good = SkewlessClient("127.0.0.1", gateway.port, "good", ["s"], backoff=FAST)
    await good.connect()
    stop = asyncio.Event()
    probe = Probe(gateway.metrics_port, [])
    probe_task = asyncio.create_task(probe.run(stop))
    peak = [0]

    async def sample_connections() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], gateway.connection_count)
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample_connections())
    peers = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.reliability.flood_peers", str(gateway.port), str(flood), str(oversized),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=str(Path(__file__).parents[2]))
    assert peers.stdin is not None and peers.stdout is not None
    try:
        sender = asyncio.create_task(stream_good_source(good, 3_000))
        async with asyncio.timeout(120):
            codes = json.loads(await peers.stdout.readline())["codes"]
        await sender
        # Every flood connection is closed by the gateway: garbage at once, silence at the handshake timeout.
        await wait_until(lambda: gateway.connection_count == 1, 30, "flood connections closed")
    finally:
        with contextlib.suppress(Exception):
            peers.stdin.write(b"done\n")
            await peers.stdin.drain()
        async with asyncio.timeout(30):
            await peers.wait()
        stop.set()
        await probe_task
        await sampler
        await good.close()
    await wait_until(lambda: len(os.listdir("/proc/self/fd")) <= fds_before + 10, 10, "fds released")
    assert peers.returncode == 0
    assert codes == ["frame_too_large"] * oversized
    peak_connections = peak[0]
    # The good source may reconnect once the flood stalls the gateway's loop past its ack wait (seen once in CI,
    # on a loaded machine): every connection opened is one of these, counted.
    assert counters_opened(gateway) == flood + oversized + 1 + good.stats.reconnects
    counters = gateway.counters
    assert counters.frames_too_large == oversized + (flood + 2) // 3
    assert counters.timeouts == flood - (flood + 2) // 3
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"good": 3_000})
    assert probe.failures == 0
    record_outcome(
        "Connection flood + oversized frames", group="hostile",
        injected=f"{flood:,} connections opened at once (1/3 send an HTTP request), {oversized} hellos followed by a "
                 "4 GiB frame header, while one source streams 3,000 events",
        checked="garbage refused as frame_too_large at the header, silent ones at the handshake timeout, all "
                "closed, fds back to baseline; good source exactly once; /healthz answers",
        outcome={"peak_connections": peak_connections, "frames_too_large": counters.frames_too_large,
                 "handshake_timeouts": counters.timeouts, **delivery.summary({"good": 3_000}), **probe.summary()})


def counters_opened(gateway: Gateway) -> int:
    return gateway.counters.connections_opened


async def raw_hello(port: int, hello: dict, ssl_context: ssl.SSLContext | None = None) -> tuple[
        list[dict], asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=ssl_context)
    writer.write(encode_frame(hello))
    decoder = FrameDecoder()
    async with asyncio.timeout(10):
        data = await reader.read(65536)
    return decoder.feed(data), reader, writer


async def test_replayed_spoofed_and_wrongly_signed_hellos_are_refused(kafka, topic_prefix):
    gateway = await start_gateway(kafka, topic_prefix, authenticator=SourceAuthenticator(hmac_secret=SECRET))
    victim = SkewlessClient("127.0.0.1", gateway.port, "victim", ["s"], hmac_secret=SECRET, backoff=FAST)
    refusals: dict[str, str] = {}
    try:
        await victim.connect()
        sender = asyncio.create_task(stream_good_source(victim, 2_000))

        def hello(source_id: str, token: str | None) -> dict:
            return {"type": "hello", "version": 1, "source_id": source_id, "streams": ["s"],
                    **({"token": token} if token is not None else {})}

        captured = hello("victim", hmac_token(SECRET, "victim", system_time_us()))
        frames, _reader, first = await raw_hello(gateway.port, captured)
        assert frames[0]["type"] == "welcome"  # the original hello
        # A second hello on the same connection is a protocol error.
        first.write(encode_frame(captured))
        frames, _took = await closed_by_peer(_reader, 10)
        refusals["hello twice on one connection"] = frames[-1]["code"]
        first.close()
        attacks = {
            "replayed hello (captured token)": captured,
            "spoofed id (attacker's token, victim's id)": hello("victim", hmac_token(SECRET, "attacker",
                                                                                     system_time_us())),
            "wrong HMAC secret": hello("victim", hmac_token(b"x" * 32, "victim", system_time_us())),
            "stale token (10 min old)": hello("victim", hmac_token(SECRET, "victim", system_time_us() - 600_000_000)),
            "no token": hello("victim", None),
            "garbage token": hello("victim", "not-a-token"),
        }
        for name, attack in attacks.items():
            frames, reader, writer = await raw_hello(gateway.port, attack)
            more, _took = await closed_by_peer(reader, 10)
            writer.close()
            (error,) = frames + more
            assert error["type"] == "error" and error["fatal"] is True, (name, error)
            refusals[name] = f"{error['code']}: {error['message'].split(': ', 1)[-1]}"
        # The SDK itself gets GatewayRejected for a wrong secret (and does not retry forever).
        with pytest.raises(GatewayRejected, match="unauthenticated"):
            await SkewlessClient("127.0.0.1", gateway.port, "victim", ["s"], hmac_secret=b"y" * 32).connect()
        await sender
        assert victim.stats.connection_losses == 0
    finally:
        await victim.close()
        await gateway.stop()
    assert refusals["hello twice on one connection"] == "unexpected_message"
    assert refusals["replayed hello (captured token)"] == "unauthenticated: HMAC token already used (replayed hello)"
    assert refusals["spoofed id (attacker's token, victim's id)"] == "unauthenticated: wrong HMAC"
    assert refusals["wrong HMAC secret"] == "unauthenticated: wrong HMAC"
    assert refusals["stale token (10 min old)"] == "unauthenticated: HMAC token timestamp too far from gateway time"
    assert refusals["no token"] == "unauthenticated: credentials required"
    assert refusals["garbage token"] == "unauthenticated: malformed HMAC token"
    assert gateway.counters.auth_failures == len(attacks) + 1  # every refused hello, plus the SDK's wrong secret
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"victim": 2_000})
    record_outcome(
        "Replayed, spoofed and wrongly signed hellos", group="hostile",
        injected="captured HMAC hello replayed on a new connection; hello twice; another source's token under the "
                 "victim's id; wrong secret; 10-min-old token; no token; garbage token; SDK with a wrong secret",
        checked="each refused with a fatal error naming the reason; victim streams 2,000 events exactly once",
        outcome={"refusals": refusals, "auth_failures": gateway.counters.auth_failures,
                 **delivery.summary({"victim": 2_000})})


def make_cert(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


async def test_tls_with_a_wrong_certificate_is_refused(kafka, topic_prefix, tmp_path: Path):
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = make_cert(tmp_path, "gateway")
    other, _ = make_cert(tmp_path, "impostor")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    gateway = await start_gateway(kafka, topic_prefix, ssl_context=server)
    trusted = ssl.create_default_context(cafile=str(cert))
    outcomes: dict[str, str] = {}
    good = SkewlessClient("127.0.0.1", gateway.port, "tls-good", ["s"], ssl=trusted, server_hostname="localhost",
                          backoff=FAST)
    try:
        await good.connect()
        sender = asyncio.create_task(stream_good_source(good, 2_000))
        for name, context, hostname in (("client trusts another certificate", ssl.create_default_context(
                cafile=str(other)), "localhost"), ("client checks another host name", trusted, "gateway.example"),
                ("client trusts the system CAs only", ssl.create_default_context(), "localhost")):
            with pytest.raises(ssl.SSLCertVerificationError) as failure:
                await SkewlessClient("127.0.0.1", gateway.port, "tls-bad", ["s"], ssl=context,
                                     server_hostname=hostname).connect()
            outcomes[name] = f"refused: {failure.value.verify_message}"
        # Plain TCP to the TLS port: the hello is not a TLS ClientHello; the gateway drops the connection.
        reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
        writer.write(encode_frame({"type": "hello", "version": 1, "source_id": "plain", "streams": ["s"]}))
        async with asyncio.timeout(10):
            data = await reader.read()
        writer.close()
        assert b"welcome" not in data
        outcomes["plain TCP to the TLS port"] = "closed without a welcome"
        await sender
        assert good.stats.connection_losses == 0
    finally:
        await good.close()
        await gateway.stop()
    assert gateway.connections_of("tls-bad") == () and gateway.counters.events_received == 2_000
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, "s")
    delivery.assert_exactly_once_in_order({"tls-good": 2_000})
    record_outcome(
        "TLS with a wrong certificate", group="hostile",
        injected="clients trusting another self-signed cert, checking another host name, trusting only system CAs; "
                 "a plain-TCP hello to the TLS port",
        checked="handshake refused (no hello reaches the gateway); a TLS source streams 2,000 events exactly once",
        outcome={"refusals": outcomes, **delivery.summary({"tls-good": 2_000})})


async def test_timesync_flood_is_rate_limited_per_address_and_never_amplified():
    server = await start_server(ServerConfig(host="127.0.0.1", port=0, responder=ResponderConfig(
        rate_limit_per_s=64, rate_limit_burst=128)))
    port = server.address[1]
    flood_sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    flood_sock.bind(("127.0.0.1", 0))
    flood_sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
    flood_sock.setblocking(False)
    legit = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    legit.bind(("127.0.0.3", 0))  # another address (not 127.0.0.2: the NTP interop test owns it)
    legit.setblocking(False)
    loop = asyncio.get_running_loop()
    sizes = [HEADER_LEN, 200, 600, 1024]
    flood_n, legit_answered, legit_sent = 6_000, 0, 0
    reply_sizes: set[int] = set()
    try:
        started = time.monotonic()
        for i in range(flood_n):
            size = sizes[i % len(sizes)]
            request = encode_packet(NtpPacket(version=4, mode=3, transmit_ts=(1 << 40) + i))
            flood_sock.sendto(request + b"\x00" * (size - HEADER_LEN), ("127.0.0.1", port))
            if i % 50 == 49:
                await asyncio.sleep(0.001)  # let the server read (a full socket buffer would drop, not limit)
            if i % 200 == 0:
                legit.sendto(encode_packet(NtpPacket(version=4, mode=3, transmit_ts=(2 << 40) + i)),
                             ("127.0.0.1", port))
                legit_sent += 1
        await wait_until(lambda: server.responder.stats.received >= flood_n + legit_sent, 20, "server read all")
        elapsed_s = time.monotonic() - started
        await asyncio.sleep(0.2)  # the last replies on their way back
        flood_replies = 0
        while True:
            try:
                data = flood_sock.recv(2048)
            except BlockingIOError:
                break
            flood_replies += 1
            reply_sizes.add(len(data))
        while True:
            try:
                data = legit.recv(2048)
            except BlockingIOError:
                break
            legit_answered += 1
            reply_sizes.add(len(data))
    finally:
        flood_sock.close()
        legit.close()
        await server.close()
    _ = loop
    stats = server.responder.stats
    allowed = 128 + 64 * elapsed_s
    assert flood_replies <= allowed + 1
    assert stats.dropped_rate_limited >= flood_n - allowed - 1
    assert legit_answered == legit_sent  # the other address is not limited by the flood
    assert reply_sizes == {HEADER_LEN}  # every reply 48 bytes: never larger than the smallest request
    record_outcome(
        "UDP time-sync flood", group="hostile",
        injected=f"{flood_n:,} requests (48-1024 B) from one address as fast as possible, plus a legitimate client "
                 "on another address",
        checked="replies to the flooder <= burst + rate x time; every reply 48 B (<= request); the other address "
                "fully served",
        outcome={"flood_replies": flood_replies, "allowed_by_bucket": round(allowed, 1),
                 "rate_limited": stats.dropped_rate_limited, "flood_seconds": round(elapsed_s, 2),
                 "legit_sent": legit_sent, "legit_answered": legit_answered, "reply_sizes": sorted(reply_sizes)})
