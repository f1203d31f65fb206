"""Operations on a running gateway: metrics and health over HTTP, refused credentials, slow clients cut off."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from clients.client import GatewayRejected, SkewlessClient
from contract.wire.frames import FrameDecoder, encode_frame
from gateway.auth import SourceAuthenticator
from gateway.server import Gateway, GatewayConfig
from gateway.session import SessionTimeouts

pytestmark = pytest.mark.integration


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.0\r\nHost: x\r\n\r\n".encode())
    data = await reader.read()
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.fixture
async def ops_gateway(kafka, topic_prefix):
    gw = Gateway(GatewayConfig(
        port=0, bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, metrics_port=0,
        authenticator=SourceAuthenticator(tokens={"s1": "right"}),
        timeouts=SessionTimeouts(handshake_us=1_000_000, partial_frame_us=1_000_000, idle_us=3_000_000)))
    await gw.start()
    yield gw
    await gw.stop()


async def test_metrics_and_health(ops_gateway: Gateway):
    async with SkewlessClient("127.0.0.1", ops_gateway.port, "s1", ["a"], token="right") as client:
        for i in range(5):
            await client.send("a", i, source_ts_us=100 + i)
        await client.flush()
        assert ops_gateway.metrics_port is not None
        status, body = await http_get(ops_gateway.metrics_port, "/metrics")
        assert status == 200
        lines = body.decode().splitlines()
        assert "skewless_gateway_events_published_total 5.0" in lines
        assert "skewless_gateway_connections 1.0" in lines
        assert 'skewless_source_connections{source_id="s1"} 1.0' in lines
        count = [float(line.split()[1]) for line in lines
                 if line.startswith("skewless_gateway_kafka_delivery_latency_seconds_count ")]
        assert count == [5.0]
    status, body = await http_get(ops_gateway.metrics_port, "/healthz")
    assert status == 200
    health = orjson.loads(body)
    assert health["status"] == "ok"
    assert health["last_kafka_error"] is None
    assert health["takeover_windows_open_ms"] == {}  # its stream's topics were created just now: nothing to hold
    assert (await http_get(ops_gateway.metrics_port, "/nope"))[0] == 404


async def test_wrong_and_missing_credentials_refused(ops_gateway: Gateway):
    with pytest.raises(GatewayRejected, match="unauthenticated: source 's1': wrong token"):
        await SkewlessClient("127.0.0.1", ops_gateway.port, "s1", ["a"], token="wrong").connect()
    with pytest.raises(GatewayRejected, match="unknown_source"):
        await SkewlessClient("127.0.0.1", ops_gateway.port, "intruder", ["a"], token="right").connect()
    await asyncio.sleep(0.1)
    assert ops_gateway.counters.auth_failures == 2


async def test_slowloris_and_silent_clients_are_cut_off(ops_gateway: Gateway):
    # A client that never says hello, and one that trickles a frame: both closed with a timeout error.
    async def closed_reply(first_bytes: bytes) -> list[dict]:
        reader, writer = await asyncio.open_connection("127.0.0.1", ops_gateway.port)
        writer.write(first_bytes)
        decoder = FrameDecoder()
        replies: list[dict] = []
        async with asyncio.timeout(10):
            while data := await reader.read(4096):
                replies += decoder.feed(data)
        writer.close()
        return replies

    hello = encode_frame({"type": "hello", "version": 1, "source_id": "s1", "streams": ["a"], "token": "right"})
    silent, trickle = await asyncio.gather(closed_reply(b""), closed_reply(hello + b"\x00\x00"))
    assert silent[-1]["code"] == "timeout"
    assert "handshake" in silent[-1]["message"]
    assert trickle[0]["type"] == "welcome"
    assert trickle[-1]["code"] == "timeout"
    assert "partial-frame" in trickle[-1]["message"]
    assert ops_gateway.counters.timeouts == 2
