"""The native connection decoder plugged into GatewaySession's loop, and an exact comparison of what it and the
Python path give: shared by the differential tests (tests/unit/test_native_decode.py) and the fuzz entry point
(tests/reliability/atheris_native_decode.py)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack
import skewless_native

from contract.wire.errors import RemoteProtocolError
from contract.wire.frames import NonStringKeyMap
from contract.wire.messages import Bye, EventBatch, Heartbeat
from gateway.session import (
    DrainRequested,
    EventsReceived,
    GatewaySession,
    HeartbeatReceived,
    SessionAction,
    SessionState,
)

DECLARED = ["s1", "s2", "s-3"]
HELLO = {"type": "hello", "version": 1, "source_id": "src", "streams": DECLARED}


class NativeSession(GatewaySession):
    """GatewaySession with the native decoder in its receive_data loop: hellos still go through the session's own
    _handle (parse_hello, auth, limits), everything else is the native decoder's."""

    def __init__(self, max_frame_bytes: int, max_events_per_batch: int) -> None:
        super().__init__(max_frame_bytes=max_frame_bytes, max_events_per_batch=max_events_per_batch)
        self.native = skewless_native.ConnectionDecoder(max_frame_bytes, max_events_per_batch)

    @property
    def buffered_bytes(self) -> int:
        return self.native.buffered_bytes

    def receive_data(self, data: bytes, now_us: int = 0) -> list[SessionAction]:
        if self.state in (SessionState.CLOSED, SessionState.ERROR):
            return []
        actions: list[SessionAction] = []
        items = self.native.receive_data(data)
        try:
            while items:
                item, items = items[0], items[1:]
                if not isinstance(item, RemoteProtocolError) or item.code not in ("frame_too_large",
                                                                                   "malformed_frame"):
                    self._last_activity_us = now_us  # as the Python loop: once a frame decoded
                if isinstance(item, RemoteProtocolError):
                    raise item
                if type(item) is dict:
                    try:
                        actions.extend(self._handle(item, now_us))
                    except RemoteProtocolError:
                        self.native.fail()
                        raise
                    self.native.accept_hello(sorted(self.streams))
                    items = self.native.decode()
                elif type(item) is EventBatch:
                    assert self.source_id is not None
                    actions.append(EventsReceived(self.source_id, item.events))
                elif type(item) is Heartbeat:
                    assert self.source_id is not None
                    actions.append(HeartbeatReceived(self.source_id, item))
                else:
                    assert type(item) is Bye
                    actions.append(DrainRequested())
                    self.state = SessionState.DRAINING
        except RemoteProtocolError as exc:
            actions.extend(self._fail(exc))
        if self.native.buffered_bytes == 0:
            self._partial_since_us = None
        elif self._partial_since_us is None:
            self._partial_since_us = now_us
        return actions


def canon(value: Any) -> Any:
    """A comparable form that keeps exact types, dict order and float bits."""
    kind = type(value)
    if kind is float:
        return ("float", "nan" if math.isnan(value) else value.hex())
    if kind is dict:
        return ("dict", tuple((canon(k), canon(v)) for k, v in value.items()))
    if kind is NonStringKeyMap:
        return ("NonStringKeyMap", canon(value.pairs))
    if kind is msgpack.Timestamp:
        return ("Timestamp", value.seconds, value.nanoseconds)
    if isinstance(value, BaseException):
        return (kind.__name__, str(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (kind.__name__, tuple(canon(getattr(value, f.name)) for f in dataclasses.fields(value)))
    if isinstance(value, list | tuple):  # ExtType is a namedtuple
        return (kind.__name__, tuple(canon(v) for v in value))
    if isinstance(value, frozenset):
        return ("frozenset", tuple(sorted(value)))
    return (kind.__name__, value)


def snapshot(session: GatewaySession) -> Any:
    return (session.state, session.buffered_bytes, session._partial_since_us, session._last_activity_us,
            session.source_id, session.streams)


def run_both(chunks: list[bytes], max_frame_bytes: int = 1024 * 1024, max_events: int = 8) -> list[Any]:
    """Feeds both paths the same chunks; raises AssertionError at the first difference."""
    python = GatewaySession(max_frame_bytes=max_frame_bytes, max_events_per_batch=max_events)
    native = NativeSession(max_frame_bytes, max_events)
    outputs = []
    for now_us, chunk in enumerate(chunks, start=1):
        expected = canon(python.receive_data(chunk, now_us))
        got = canon(native.receive_data(chunk, now_us))
        assert got == expected
        assert snapshot(native) == snapshot(python)
        outputs.append(got)
    return outputs
