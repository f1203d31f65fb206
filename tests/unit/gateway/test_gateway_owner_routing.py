"""Routing a hello whose shard is owned elsewhere (docs/cluster.md, "Routing"; issue 24, item 10): a survivor
redirects a source only to a recorded owner that accepts a TCP connection. A killed owner keeps its owner record
until the group's session timeout moves its shard; until then its sources are told ``shard_unavailable`` with
``retry_after_ms`` instead of a redirect they would bounce back from (127-148 redirects per failover, measured)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from contract.records import OwnerRecord
from contract.wire.frames import FrameDecoder
from gateway.server import OWNER_PROBE_CACHE_S, Gateway, GatewayConfig

pytestmark = pytest.mark.timeout(30)


class FakeConnection:
    def __init__(self) -> None:
        self.sent = b""
        self.closed = False

    def send_bytes(self, data: bytes) -> None:
        self.sent += data

    def close(self, *, after_error: bool = False) -> None:
        self.closed = after_error

    def answer(self) -> dict[str, Any]:
        (frame,) = FrameDecoder().feed(self.sent)
        return frame


async def routed(gateway: Gateway, shard: int) -> dict[str, Any]:
    connection = FakeConnection()
    await gateway._route_elsewhere(connection, shard)  # type: ignore[arg-type]
    assert connection.closed
    return connection.answer()


async def test_a_recorded_owner_that_refuses_connections_gets_no_redirects_a_live_one_does() -> None:
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: what a killed gateway's port answers
    accepted = 0

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        writer.close()

    live = await asyncio.start_server(accept, "127.0.0.1", 0)
    live_port = live.sockets[0].getsockname()[1]
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers="127.0.0.1:9", topic_prefix="routing", shards=3,
                                    gateway_id="here"))
    gateway._owners = {0: OwnerRecord(0, "killed", "127.0.0.1", dead.getsockname()[1], None, 1),
                       1: OwnerRecord(1, "alive", "127.0.0.1", live_port, 7000, 1)}
    try:
        answer = await routed(gateway, 0)
        assert (answer["type"], answer["code"], answer["retry_after_ms"]) == ("error", "shard_unavailable", 500)
        assert await routed(gateway, 1) == {"type": "redirect", "shard": 1, "gateway_id": "alive",
                                            "host": "127.0.0.1", "port": live_port, "timesync_port": 7000}
        # No owner record at all: shard_unavailable, as before.
        assert (await routed(gateway, 2))["code"] == "shard_unavailable"
        assert gateway.owner_unavailable_answers == 2
        # One check per owner per OWNER_PROBE_CACHE_S, however many hellos: a burst of sources costs one probe.
        await asyncio.gather(*(routed(gateway, 1) for _ in range(20)))
        await asyncio.sleep(0.05)
        assert accepted == 1
        await asyncio.sleep(OWNER_PROBE_CACHE_S)
        await routed(gateway, 1)
        await asyncio.sleep(0.05)
        assert accepted == 2
        # The killed owner's port is taken by a new gateway process: redirects resume after the cache expires.
        dead.listen()
        await asyncio.sleep(OWNER_PROBE_CACHE_S)
        assert (await routed(gateway, 0))["type"] == "redirect"
    finally:
        live.close()
        await live.wait_closed()
        dead.close()


async def test_a_hello_for_a_dead_owners_shard_waits_for_its_successor_and_is_redirected_at_once() -> None:
    """No retry_after round trip: the survivor holds the hello until the successor's owner record arrives."""
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    live = await asyncio.start_server(lambda _r, w: w.close(), "127.0.0.1", 0)
    live_port = live.sockets[0].getsockname()[1]
    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers="127.0.0.1:9", topic_prefix="routing", shards=1,
                                    gateway_id="here"))
    gateway._owners = {0: OwnerRecord(0, "killed", "127.0.0.1", dead.getsockname()[1], None, 1)}
    loop = asyncio.get_running_loop()
    try:
        held = asyncio.create_task(gateway._runtime_for_hello(0))
        await asyncio.sleep(0.5)
        assert not held.done()  # the recorded owner refuses connections: no redirect to it
        gateway._owners = {0: OwnerRecord(0, "successor", "127.0.0.1", live_port, None, 2)}
        recorded_at = loop.time()
        assert await held is None  # route elsewhere: to the successor
        assert loop.time() - recorded_at < 0.3
        assert (await routed(gateway, 0))["gateway_id"] == "successor"
    finally:
        live.close()
        await live.wait_closed()
        dead.close()
