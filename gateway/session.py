"""One client connection's protocol state, sans-IO (h11-style): bytes in, actions out.

States and the messages each accepts live in one table; anything not in it is a protocol error that moves the
session to ERROR, sends an error frame and asks the shell to close this connection only.
"""

from __future__ import annotations

import enum
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from contract.wire import messages
from contract.wire.errors import (
    InvalidMessage,
    ProtocolError,
    RemoteProtocolError,
    SessionTimeout,
    UnexpectedMessage,
)
from contract.wire.frames import DEFAULT_MAX_FRAME_BYTES, FrameDecoder, encode_frame
from contract.wire.messages import MAX_STREAMS_PER_SOURCE
from gateway.auth import SourceAuthenticator


class SessionState(enum.Enum):
    AWAIT_HELLO = "await_hello"
    STREAMING = "streaming"
    DRAINING = "draining"
    CLOSED = "closed"
    ERROR = "error"


_TRANSITIONS: dict[tuple[SessionState, str], SessionState] = {
    (SessionState.AWAIT_HELLO, "hello"): SessionState.STREAMING,
    (SessionState.STREAMING, "events"): SessionState.STREAMING,
    (SessionState.STREAMING, "heartbeat"): SessionState.STREAMING,
    (SessionState.STREAMING, "bye"): SessionState.DRAINING,
}


@dataclass(frozen=True, slots=True)
class SourceRegistered:
    hello: messages.Hello


@dataclass(frozen=True, slots=True)
class EventsReceived:
    source_id: str
    events: tuple[messages.IncomingEvent, ...]


@dataclass(frozen=True, slots=True)
class HeartbeatReceived:
    source_id: str
    heartbeat: messages.Heartbeat


@dataclass(frozen=True, slots=True)
class SendBytes:
    data: bytes


@dataclass(frozen=True, slots=True)
class DrainRequested:
    """The client said bye: finish its pending acks, then close."""


@dataclass(frozen=True, slots=True)
class CloseConnection:
    reason: str
    error_code: str | None = None


SessionAction = (SourceRegistered | EventsReceived | HeartbeatReceived | SendBytes | DrainRequested
                 | CloseConnection)

DEFAULT_MAX_EVENTS_PER_BATCH = 10_000


class StreamRefused(RemoteProtocolError):
    """A hello names a stream this gateway does not serve: not on its allow-list (``allowed_streams``), or a new
    stream past its cap on created streams (``max_streams``, checked by the shell, which creates topics)."""

    code = "stream_refused"


@dataclass(frozen=True, slots=True)
class SessionTimeouts:
    """Slow or silent peers must not hold a connection (and its buffer) forever: a slowloris client that trickles
    a frame byte by byte, or never says hello, is cut off after these."""

    handshake_us: int = 10_000_000
    partial_frame_us: int = 30_000_000
    # The SDK heartbeats every second when idle, so two minutes of silence means the peer is gone.
    idle_us: int = 120_000_000


class TimeoutSweepClock:
    """The time at which a periodic sweep judges the sessions' timeouts: the previous sweep's.

    A gateway that lagged (a starved process, a burst of thousands of connections) has not yet read what its peers
    sent meanwhile: the bytes wait in its socket buffers. Judged at its own time, a sweep after such a lag would cut
    off peers for the gateway's delay (seen: a quarter of a flood's HTTP peers timed out though each had written at
    once). Between two sweeps the event loop polls its sockets at least once, so everything that had arrived by the
    previous sweep has been read when the next one runs: judging at the previous sweep's time never counts the
    gateway's own lag against a peer. The price: a timeout fires up to one sweep interval (plus any pause) late.
    """

    def __init__(self) -> None:
        self._previous_sweep_us: int | None = None

    def judging_time(self, now_us: int) -> int | None:
        """Call once per sweep with its time; None for the first sweep, which judges nothing."""
        judged_us, self._previous_sweep_us = self._previous_sweep_us, now_us
        return judged_us


class GatewaySession:
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
                 max_events_per_batch: int = DEFAULT_MAX_EVENTS_PER_BATCH,
                 authenticator: SourceAuthenticator | None = None,
                 timeouts: SessionTimeouts | None = None, now_us: int = 0,
                 max_streams_per_source: int = MAX_STREAMS_PER_SOURCE,
                 allowed_streams: Collection[str] | None = None) -> None:
        self.state = SessionState.AWAIT_HELLO
        self.source_id: str | None = None
        self.streams: frozenset[str] = frozenset()
        self._decoder = FrameDecoder(max_frame_bytes)
        self._max_events_per_batch = max_events_per_batch
        self._authenticator = authenticator or SourceAuthenticator()
        self._timeouts = timeouts or SessionTimeouts()
        # Each stream a hello names costs the gateway a merge registration (docs/operations.md, "Limits").
        self._max_streams_per_source = max_streams_per_source
        self._allowed_streams = allowed_streams
        self._opened_us = now_us
        self._last_activity_us = now_us
        self._partial_since_us: int | None = None
        self._open_decoder()

    def _open_decoder(self) -> None:
        """Where a subclass sets up a decoder of its own from the limits set above (gateway.native): this class
        decodes with ``self._decoder``."""

    @property
    def buffered_bytes(self) -> int:
        return self._decoder.buffered_bytes

    def receive_data(self, data: bytes, now_us: int = 0) -> list[SessionAction]:
        if self.state in (SessionState.CLOSED, SessionState.ERROR):
            return []
        actions: list[SessionAction] = []
        self._decoder.receive_data(data)
        try:
            while self.state is SessionState.STREAMING or self.state is SessionState.AWAIT_HELLO:
                raw = self._decoder.next_message()
                if raw is None:
                    break
                self._last_activity_us = now_us
                actions.extend(self._handle(raw, now_us))
        except RemoteProtocolError as exc:
            actions.extend(self._fail(exc))
        self._note_partial_frame(now_us)
        return actions

    def _note_partial_frame(self, now_us: int) -> None:
        """Since when a frame has stayed incomplete (the partial-frame timeout), after the bytes just received."""
        if self.buffered_bytes == 0:
            self._partial_since_us = None
        elif self._partial_since_us is None:
            self._partial_since_us = now_us

    def check_timeouts(self, now_us: int) -> list[SessionAction]:
        """Call periodically; fails the session if a peer is too slow or silent."""
        if self.state is SessionState.AWAIT_HELLO and now_us - self._opened_us > self._timeouts.handshake_us:
            return self._fail(SessionTimeout("no hello within the handshake timeout"))
        if self.state is not SessionState.STREAMING and self.state is not SessionState.AWAIT_HELLO:
            return []
        if (self._partial_since_us is not None
                and now_us - self._partial_since_us > self._timeouts.partial_frame_us):
            return self._fail(SessionTimeout("a frame stayed incomplete past the partial-frame timeout"))
        if now_us - self._last_activity_us > self._timeouts.idle_us:
            return self._fail(SessionTimeout("no message or heartbeat within the idle timeout"))
        return []

    def connection_lost(self) -> None:
        if self.state is not SessionState.ERROR:
            self.state = SessionState.CLOSED

    def _handle(self, raw: dict[str, Any], now_us: int) -> list[SessionAction]:
        kind = raw["type"]
        next_state = _TRANSITIONS.get((self.state, kind))
        if next_state is None:
            raise UnexpectedMessage(f"message {kind!r} not allowed in state {self.state.value}")
        actions: list[SessionAction]
        if kind == "hello":
            hello = messages.parse_hello(raw)
            self._authenticator.check(hello.source_id, hello.token, now_us)
            if len(hello.streams) > self._max_streams_per_source:
                raise InvalidMessage(
                    f"this gateway accepts at most {self._max_streams_per_source} streams per source "
                    f"(max_streams_per_source); the hello names {len(hello.streams)}")
            if self._allowed_streams is not None:
                refused = [s for s in hello.streams if s not in self._allowed_streams]
                if refused:
                    raise StreamRefused(f"streams {refused} are not on this gateway's allow-list (allowed_streams)")
            self.source_id = hello.source_id
            self.streams = frozenset(hello.streams)
            # The gateway answers: welcome, or a redirect to the owner of the source's shard.
            actions = [SourceRegistered(hello)]
        elif kind == "events":
            batch = messages.parse_events(raw, self._max_events_per_batch, self.streams)
            assert self.source_id is not None
            actions = [EventsReceived(self.source_id, batch.events)]
        elif kind == "heartbeat":
            heartbeat = messages.parse_heartbeat(raw)
            undeclared = set(heartbeat.next_seq) - self.streams
            if undeclared:
                raise UnexpectedMessage(f"heartbeat names undeclared streams {sorted(undeclared)}")
            assert self.source_id is not None
            actions = [HeartbeatReceived(self.source_id, heartbeat)]
        else:
            actions = [DrainRequested()]
        self.state = next_state
        return actions

    def _fail(self, exc: ProtocolError) -> list[SessionAction]:
        self.state = SessionState.ERROR
        frame = encode_frame(messages.build_error(exc.code, str(exc), fatal=True))
        return [SendBytes(frame), CloseConnection(str(exc), exc.code)]
