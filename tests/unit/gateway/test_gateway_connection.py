"""gateway.connection.ConnectionHandler against a fake owner and transport: what it asks of the gateway, and its
worker's failure path."""

from __future__ import annotations

import asyncio

import pytest

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
        self.aborted = False
        self.reading = True
        self.unread = 0  # bytes written that the peer has not read (asyncio's write buffer)
        self.limits: tuple[int | None, int | None] = (None, None)

    def write(self, data: bytes) -> None:
        self.written.append(data)
        self.unread += len(data)

    def get_write_buffer_size(self) -> int:
        return self.unread

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.limits = (high, low)

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return False

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_extra_info(self, name: str) -> object:
        return ("10.0.0.7", 51000) if name == "peername" else None


class FakeOwner:
    def __init__(self, fail_registration: bool = False, fail_events: bool = False) -> None:
        self.fail_registration = fail_registration
        self.fail_events = fail_events
        self.calls: list[tuple[str, object]] = []
        self.failures: list[tuple[str, str]] = []

    def attach(self, connection: ConnectionHandler) -> ConnectionId:
        return ConnectionId(3)

    def detach(self, connection: ConnectionHandler) -> None:
        self.calls.append(("detach", connection.connection_id))

    async def register_source(self, connection: ConnectionHandler, hello: Hello) -> None:
        if self.fail_registration:
            raise OSError("topic creation failed")
        self.calls.append(("register", hello.source_id))

    async def receive_events(self, connection: ConnectionHandler, received: EventsReceived, arrival_us: int) -> None:
        if self.fail_events:
            raise KeyError("core bug")
        self.calls.append(("events", (connection.connection_id, [e.seq for e in received.events], arrival_us)))

    async def receive_heartbeat(self, received: HeartbeatReceived) -> None:
        self.calls.append(("heartbeat", received.source_id))

    async def source_left(self, source_id: str) -> None:
        self.calls.append(("left", source_id))

    def session_failed(self, error_code: str) -> None:
        self.calls.append(("session_failed", error_code))

    def worker_failed(self, connection: ConnectionHandler, stage: str, error: BaseException) -> None:
        self.failures.append((stage, repr(error)))
        connection.send_bytes(b"last words")

    def slow_reader_closed(self, connection: ConnectionHandler, reason: str) -> None:
        self.calls.append(("slow_reader_closed", reason))


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
    assert transport.written == []  # the welcome is the owner's to send (or a redirect)
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
    assert owner.failures == [("register", "OSError('topic creation failed')")]
    assert transport.closed  # the client reconnects instead of waiting for a welcome forever
    assert transport.written == [b"last words"]  # the owner's error frame goes out before the close
    assert handler.idle  # shutdown's drain does not wait for it
    handler.connection_lost(None)
    assert owner.calls == [("detach", ConnectionId(3))]


async def test_a_failing_action_names_its_stage_and_the_rest_of_the_queue_is_dropped():
    owner = FakeOwner(fail_events=True)
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"]))
                          + encode_frame(build_events([build_event("s", 0, T0, 0)]))
                          + encode_frame(build_events([build_event("s", 1, T0, 1)])))
    await settle()
    assert owner.failures == [("events", "KeyError('core bug')")]  # once, not again for the second batch
    assert owner.calls == [("register", "a")]
    assert transport.closed and handler.idle
    assert handler.peer == "10.0.0.7:51000"


@pytest.mark.parametrize("call", ["data_received", "check_timeouts"])
async def test_a_session_that_raises_is_answered_counted_and_closed_never_raised_to_the_caller(call: str,
                                                                                              monkeypatch):
    owner = FakeOwner()
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"])))
    await settle()

    def broken(*_args: object) -> list[object]:
        raise IndexError("session bug")

    # Raised into asyncio's data_received, it would close the transport with no error frame, no count and no line
    # naming the source; raised into the timeout sweep, it would kill the sweep of every connection.
    monkeypatch.setattr(handler.session, "receive_data", broken)
    monkeypatch.setattr(handler.session, "check_timeouts", broken)
    if call == "data_received":
        handler.data_received(encode_frame(build_events([build_event("s", 0, T0, 0)])))
    else:
        handler.check_timeouts(T0 + 1)
    await settle()
    assert owner.failures == [("session", "IndexError('session bug')")]
    assert transport.written[-1] == b"last words" and transport.closed
    handler.data_received(b"more")  # a closing connection reads nothing more
    handler.check_timeouts(T0 + 2)
    assert len(owner.failures) == 1


class HalfClosingTransport(FakeTransport):
    def __init__(self) -> None:
        super().__init__()
        self.eof_written = False

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof_written = True


async def test_after_an_error_frame_the_connection_half_closes_reads_on_and_closes_after_the_linger(monkeypatch):
    """A peer still writing when its connection closes would get a reset that can destroy the error frame: the frame
    goes out, then a FIN; what the peer still sends is read and dropped; the socket closes after the linger."""
    monkeypatch.setattr("gateway.connection.ERROR_CLOSE_LINGER_S", 0.05)
    owner = FakeOwner()
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0 + 5)
    transport = HalfClosingTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    handler.set_throttled(True)
    assert not transport.reading
    handler.data_received(b"\x00\x00\x00\x02\xc1\xc1")  # not msgpack: malformed_frame
    await settle()
    assert owner.calls[-1] == ("session_failed", "malformed_frame")
    assert len(transport.written) == 1 and b"malformed_frame" in transport.written[0]
    assert transport.eof_written and transport.reading and not transport.closed
    # write side shut: the gateway must not pick it for an ack (that ack would be lost)
    assert not handler.writable
    handler.send_bytes(b"ack")
    assert len(transport.written) == 1
    handler.data_received(encode_frame(build_hello("a", ["s"])))  # the peer goes on writing: dropped
    await settle()
    assert owner.calls == [("session_failed", "malformed_frame")]
    await asyncio.sleep(0.1)
    assert transport.closed


async def test_a_plain_close_is_immediate_even_where_half_close_is_possible():
    owner = FakeOwner()
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0 + 5)
    transport = HalfClosingTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    handler.close()
    assert transport.closed and not transport.eof_written


class ResetTransport(HalfClosingTransport):
    def write_eof(self) -> None:
        raise OSError(107, "Transport endpoint is not connected")


async def test_a_peer_already_reset_when_the_error_frame_goes_out_is_closed_without_a_failure():
    """Seen under a connection flood: the peer reset its connection before the half-close; shutdown() then raises
    ENOTCONN. That is the peer leaving, not a gateway failure: close, report nothing more than the session error."""
    owner = FakeOwner()
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0 + 5)
    transport = ResetTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    handler.data_received(b"\x00\x00\x00\x02\xc1\xc1")
    await settle()
    assert owner.calls == [("session_failed", "malformed_frame")]
    assert transport.closed


# -- issue 24 item 4: a peer that does not read ---------------------------------------------------------------------


def connect_limited(owner: FakeOwner, max_bytes: int = 10_000, timeout_us: int = 1_000_000):
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0 + 5,
                                write_buffer_max_bytes=max_bytes, slow_reader_timeout_us=timeout_us)
    transport = FakeTransport()
    handler.connection_made(transport)  # type: ignore[arg-type]
    return handler, transport


async def test_a_peer_that_does_not_read_is_not_read_until_it_drains():
    owner = FakeOwner()
    handler, transport = connect_limited(owner)
    assert transport.limits[0] is not None  # the write high-water mark is set at once
    handler.pause_writing()  # asyncio: the write buffer passed the high-water mark
    assert transport.reading is False
    handler.set_throttled(True)
    handler.set_throttled(False)  # the gateway's buffer limit lifted: still not reading, the peer has not drained
    assert transport.reading is False
    handler.resume_writing()
    assert transport.reading is True
    handler.check_timeouts(T0 + 10_000_000)
    assert not transport.closed


async def test_a_peer_that_stays_undrained_past_the_timeout_is_closed_with_a_reason():
    owner = FakeOwner()
    handler, transport = connect_limited(owner, timeout_us=1_000_000)
    handler.data_received(encode_frame(build_hello("a", ["s"])))
    await settle()
    handler._clock_us = lambda: T0 + 100
    handler.pause_writing()
    handler.check_timeouts(T0 + 100 + 1_000_000)
    assert not transport.closed
    handler.check_timeouts(T0 + 101 + 1_000_000)
    assert transport.aborted  # a close would wait for the peer to read what is queued: forever
    assert owner.calls[-1] == ("slow_reader_closed", "did not read for 1.0 s with 0 bytes queued")


async def test_bytes_queued_past_the_cap_close_the_connection_at_once():
    owner = FakeOwner()
    handler, transport = connect_limited(owner, max_bytes=1_000)
    handler.send_bytes(b"x" * 900)
    assert not transport.closed
    handler.send_bytes(b"y" * 200)  # would take the unread bytes to 1,100
    assert transport.aborted
    assert transport.written == [b"x" * 900]
    assert owner.calls[-1] == ("slow_reader_closed", "1100 bytes would be queued for a peer that does not read "
                                                     "(cap 1000)")
    handler.send_bytes(b"z")  # nothing more goes to a connection being closed
    assert transport.written == [b"x" * 900]


async def test_a_bye_tells_the_owner_the_source_left_then_closes():
    """Issue 25 item 7: the merge learns of a clean bye at once (not after its wait for a silent source)."""
    from contract.wire.messages import build_bye

    owner = FakeOwner()
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"])) + encode_frame(build_bye()))
    await settle()
    assert owner.calls == [("register", "a"), ("left", "a")]
    assert transport.closed


class _LeftRecorder:
    """The shard runtime's bye entry point, recorded."""

    def __init__(self) -> None:
        self.left: list[str] = []

    async def source_left(self, source_id: str) -> None:
        self.left.append(source_id)


async def test_a_pool_source_leaves_only_once_every_connection_it_has_open_said_bye():
    """Review B7: a pool's connections are separate TCP streams with no order between them. The bye of connection 2
    was read while connection 1 still had the pool's seqs 5-7 unread: the merge gave the source up at once and
    they went late. The source leaves (rule 14) only when every connection it has open said bye."""
    from contract.wire.messages import build_bye
    from gateway.server import Gateway, GatewayConfig

    gateway = Gateway(GatewayConfig(port=0, bootstrap_servers="127.0.0.1:9", topic_prefix="bye", shards=1,
                                    gateway_id="here"))
    runtime = _LeftRecorder()
    gateway._serving = lambda source_id: runtime  # type: ignore[method-assign, assignment, return-value]
    owner = FakeOwner()
    pool = [connect(owner)[0] for _ in range(3)]
    for handler in pool:
        handler.data_received(encode_frame(build_hello("pool", ["s"])))
    await settle()
    gateway._connections_by_source["pool"] = set(pool)
    owner.source_left = gateway.source_left  # type: ignore[method-assign]
    pool[1].data_received(encode_frame(build_bye()))
    await settle()
    assert runtime.left == []  # connections 0 and 2 may still carry events read after this bye
    gateway._connections_by_source["pool"].discard(pool[1])  # it closed
    pool[0].data_received(encode_frame(build_events([build_event("s", 5, T0, 0)])) + encode_frame(build_bye()))
    await settle()
    assert runtime.left == []
    pool[2].data_received(encode_frame(build_bye()))
    await settle()
    assert runtime.left == ["pool"]  # the last open connection said bye: nothing more comes from it


class InlineOwner(FakeOwner):
    """An owner whose events need no wait unless ``hold`` is set: then each frame's wait is a future of ``waits``."""

    def __init__(self) -> None:
        super().__init__()
        self.hold = False
        self.waits: list[asyncio.Future[None]] = []

    def receive_events(self, connection: ConnectionHandler, received: EventsReceived,  # type: ignore[override]
                       arrival_us: int) -> asyncio.Future[None] | None:
        if self.fail_events:
            raise KeyError("core bug")
        self.calls.append(("events", [e.seq for e in received.events]))
        if not self.hold:
            return None
        wait: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waits.append(wait)
        return wait


def events_frame(*seqs: int) -> bytes:
    return encode_frame(build_events([build_event("s", q, T0, q) for q in seqs]))


async def registered(owner: FakeOwner) -> tuple[ConnectionHandler, FakeTransport]:
    handler, transport = connect(owner)
    handler.data_received(encode_frame(build_hello("a", ["s"])))
    await settle()
    return handler, transport


async def test_a_frame_that_needs_no_wait_is_carried_out_within_the_read():
    owner = InlineOwner()
    handler, _ = await registered(owner)
    handler.data_received(events_frame(0, 1) + events_frame(2))
    # No await in between: no task switch per frame.
    assert owner.calls == [("register", "a"), ("events", [0, 1]), ("events", [2])]
    assert handler.idle


async def test_a_wait_holds_the_reads_after_it_until_it_ends_and_keeps_their_order():
    owner = InlineOwner()
    handler, transport = await registered(owner)
    owner.hold = True
    handler.data_received(events_frame(0) + events_frame(1))
    assert owner.calls[1:] == [("events", [0])]  # the second frame waits behind the first's wait
    handler.data_received(events_frame(2))
    await settle()
    assert owner.calls[1:] == [("events", [0])] and not handler.idle
    owner.hold = False
    owner.waits[0].set_result(None)
    await settle()
    assert owner.calls[1:] == [("events", [0]), ("events", [1]), ("events", [2])]
    assert handler.idle and transport.reading
    handler.data_received(events_frame(3))  # the worker is idle again: carried out within the read
    assert owner.calls[-1] == ("events", [3])


async def test_a_frame_that_fails_within_the_read_is_reported_as_the_events_stage_and_closes():
    owner = InlineOwner()
    handler, transport = await registered(owner)
    owner.fail_events = True
    handler.data_received(events_frame(0) + events_frame(1))
    assert owner.failures == [("events", "KeyError('core bug')")]
    assert transport.closed and transport.written == [b"last words"]
    assert owner.calls == [("register", "a")]  # the second frame is dropped: its client resends it
    handler.data_received(events_frame(2))  # a closing connection reads nothing more
    await settle()
    assert owner.calls == [("register", "a")] and handler.idle


async def test_a_wait_left_when_the_connection_is_lost_is_closed_not_left_unawaited():
    owner = FakeOwner()  # its receive_events is a coroutine function: each frame's call is a wait
    handler, _ = await registered(owner)
    handler.data_received(events_frame(0))
    handler.connection_lost(None)
    await settle()
    assert owner.calls == [("register", "a"), ("detach", ConnectionId(3))]  # never run, and closed


async def test_backlogs_of_two_connections_are_carried_out_a_read_at_a_time_each_in_its_order():
    owner = InlineOwner()
    a, _ = await registered(owner)
    b, _ = connect(owner)
    b.data_received(encode_frame(build_hello("b", ["s"])))
    await settle()
    owner.hold = True
    for handler, first in ((a, 0), (b, 10)):
        for seq in range(first, first + 4):  # one read per frame, as a paced source's frames arrive
            handler.data_received(events_frame(seq))
    assert [c for c in owner.calls if c[0] == "events"] == [("events", [0]), ("events", [10])]  # the rest queued
    owner.hold = False
    for wait in owner.waits:
        wait.set_result(None)
    await settle()
    seqs = [c[1][0] for c in owner.calls if c[0] == "events"]
    assert seqs == [0, 10, 1, 11, 2, 12, 3, 13]  # neither backlog holds the loop for all of its reads
    assert a.idle and b.idle


class SlowFramesOwner(FakeOwner):
    """Each frame's events take 3 ms of the (fake) work clock, carried out at once as the gateway's are."""

    def __init__(self, log: list[str]) -> None:
        super().__init__()
        self.log = log
        self.work_clock_s = 0.0

    def receive_events(self, connection: ConnectionHandler, received: EventsReceived,  # type: ignore[override]
                       arrival_us: int) -> None:
        self.work_clock_s += 0.003
        self.log.append(f"frame {received.events[0].seq}")


async def test_a_read_of_many_slow_frames_lets_the_loop_turn_once_it_took_its_slice():
    # At saturation a lagging source's read of ~10 frames, each completing a merge round, held the loop for 400 ms:
    # the commit timer fired that late. The connection now lets the loop turn once a read took its slice (5 ms here).
    log: list[str] = []
    owner = SlowFramesOwner(log)
    handler = ConnectionHandler(owner, GatewaySession(now_us=T0), clock_us=lambda: T0,  # type: ignore[arg-type]
                                work_clock_s=lambda: owner.work_clock_s, work_slice_s=0.005)
    handler.connection_made(FakeTransport())  # type: ignore[arg-type]
    handler.data_received(encode_frame(build_hello("a", ["s"])))
    await settle()

    async def other_work() -> None:  # what else the loop runs: a timer, another connection
        while True:
            log.append("loop turned")
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    log.clear()
    frames = b"".join(encode_frame(build_events([build_event("s", seq, T0 + seq, seq)])) for seq in range(6))
    handler.data_received(frames)
    for _ in range(10):
        await asyncio.sleep(0)
    other.cancel()
    frames_only = [entry for entry in log if entry.startswith("frame")]
    assert frames_only == [f"frame {seq}" for seq in range(6)]  # all of them, in order
    # 3 ms each against a 5 ms slice: two frames per turn of the loop, none of it between two frames of one slice.
    between = [log[log.index(f"frame {seq}") + 1:log.index(f"frame {seq + 1}")] for seq in range(5)]
    assert [bool(b) for b in between] == [False, True, False, True, False]
    assert all(set(b) == {"loop turned"} for b in between if b)
    assert not owner.failures
