"""The native connection decoder plugged into GatewaySession's loop, and an exact comparison of what it and the
Python path give: shared by the differential tests (tests/unit/native/test_native_decode.py) and the fuzz entry point
(tests/reliability/atheris_native_decode.py)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgpack

from contract.wire.frames import NonStringKeyMap
from gateway.native import NativeGatewaySession
from gateway.session import GatewaySession

DECLARED = ["s1", "s2", "s-3"]
HELLO = {"type": "hello", "version": 1, "source_id": "src", "streams": DECLARED}


def NativeSession(max_frame_bytes: int, max_events_per_batch: int) -> NativeGatewaySession:
    """The session with the native decoder the gateway runs (gateway.native), as the tests build it."""
    return NativeGatewaySession(max_frame_bytes=max_frame_bytes, max_events_per_batch=max_events_per_batch)


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
    if kind.__name__ == "EventFrame" and kind.__module__ == "skewless_native":
        # The native decoder's frame of events (native/src/frame.rs) stands for the tuple the Python one builds.
        return ("tuple", tuple(canon(v) for v in value))
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
