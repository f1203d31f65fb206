"""gateway.connection.ConnectionHandler against a fake owner and transport: what it asks of the gateway, and its
worker's failure path."""

from __future__ import annotations

import asyncio

from contract.wire.frames import encode_frame
from contract.wire.messages import Hello, build_event, build_events, build_hello
from gateway.connection import ConnectionHandler
from gateway.ingest import ConnectionId
from gateway.session import EventsReceived, GatewaySession, HeartbeatReceived

T0 = 1_700_000_000_000_000


class FakeTransport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class FakeOwner:
    def __init__(self, fail_registration: bool = False) -> None:
        self.fail_registration = fail_registration
        self.calls: list[tuple[str, object]] = []
        self.failures: list[str] = []

    def attach(self, connection: ConnectionHandler) -> ConnectionId:
        return ConnectionId(3)

    def detach(self, connection: ConnectionHandler) -> None:
        self.calls.append(("detach", connection.connection_id))

    async def register_source(self, connection: ConnectionHandler, hello: Hello) -> None:
        if self.fail_registration:
            raise OSError("topic creation failed")
        self.calls.append(("register", hello.source_id))

    async def receive_events(self, connection: ConnectionHandler, received: EventsReceived, arrival_us: int) -> None:
        self.calls.append(("events", (connection.connection_id, [e.seq for e in received.events], arrival_us)))

    async def receive_heartbeat(self, received: HeartbeatReceived) -> None:
        self.calls.append(("heartbeat", received.source_id))

    def session_failed(self, error_code: str) -> None:
        self.calls.append(("session_failed", error_code))

    def worker_failed(self, connection: ConnectionHandler, error: BaseException) -> None:
        self.failures.append(repr(error))


def connect(owner: FakeOwner) -> tuple[ConnectionHandler, FakeTransport]:
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0 + 5)
    transport = FakeTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    return handler, transport


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_session_actions_reach_the_owner_in_order_with_the_arrival_stamp():
    owner = FakeOwner()
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"]))
                          + encode_frame(build_events([build_event("s", 0, T0, 0), build_event("s", 1, T0, 1)])))
    await settle()
    assert owner.calls == [("register", "a"), ("events", (ConnectionId(3), [0, 1], T0 + 5))]
    assert len(transport.written) == 1  # the welcome
    assert handler.source_id == "a"
    handler.data_received(b"\x00\x00\x00\x02\xc1\xc1")  # not msgpack: the session fails, the owner counts it
    await settle()
    assert owner.calls[-1] == ("session_failed", "malformed_frame")
    assert transport.closed


async def test_a_worker_that_fails_is_reported_and_closes_its_connection():
    owner = FakeOwner(fail_registration=True)
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"])))
    await settle()
    assert owner.failures == ["OSError('topic creation failed')"]
    assert transport.closed  # the client reconnects instead of waiting for a welcome forever
    assert transport.written == []
    handler.connection_lost(None)
    assert owner.calls == [("detach", ConnectionId(3))]
