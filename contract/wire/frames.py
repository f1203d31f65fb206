"""Length-prefixed msgpack frames, sans-IO.

Wire format: a 4-byte unsigned big-endian length N, then N bytes holding one msgpack map with a "type" key.
The decoder checks N against its limit before buffering the body, so a hostile length costs nothing.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgpack

from contract.wire.errors import FrameTooLarge, MalformedFrame

HEADER = struct.Struct(">I")
# 1 MiB: room for a batch of ~10k small events while keeping one connection's worst-case buffer small.
DEFAULT_MAX_FRAME_BYTES = 1024 * 1024


def encode_frame(message: Mapping[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Feed bytes as they arrive; get complete messages back. Raises a RemoteProtocolError on bad input."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes <= 0:
            raise ValueError("max_frame_bytes must be positive")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def receive_data(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        """One complete message, or None until more bytes arrive. Frames before a bad one are never lost."""
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length == 0:
            raise MalformedFrame("empty frame")
        if length > self.max_frame_bytes:
            raise FrameTooLarge(f"frame of {length} bytes exceeds the limit of {self.max_frame_bytes} bytes")
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[HEADER.size:end])
        del self._buffer[:end]
        return _decode_body(body)

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        """receive_data + every complete message (raises at the first bad frame)."""
        self.receive_data(data)
        messages: list[dict[str, Any]] = []
        while (message := self.next_message()) is not None:
            messages.append(message)
        return messages


class NonStringKeyMap:
    """A msgpack map with a key that is neither str nor bin, kept as its (key, value) pairs: its keys are never
    hashed (Python's int and float hashes are easy to collide, lists are unhashable) nor used. Only payloads may
    hold one; the parsers refuse it everywhere else, and contract.wire.messages.payload_problem refuses the event
    that carries it (one bad key must not cost the whole frame)."""

    __slots__ = ("pairs",)

    def __init__(self, pairs: list[tuple[Any, Any]]) -> None:
        self.pairs = pairs

    def __repr__(self) -> str:
        return f"NonStringKeyMap({len(self.pairs)} pairs)"


def _map_from_pairs(pairs: list[tuple[Any, Any]]) -> dict[Any, Any] | NonStringKeyMap:
    for key, _value in pairs:
        if type(key) is not str and type(key) is not bytes:
            return NonStringKeyMap(pairs)
    return dict(pairs)


def _decode_body(body: bytes) -> dict[str, Any]:
    try:
        message = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except ValueError as exc:
        if "is not allowed for map key" not in str(exc):
            raise MalformedFrame(f"frame body is not valid msgpack: {type(exc).__name__}") from exc
        # A map key other than str or bin somewhere. Decoded again, slower, only for such frames: the per-map hook
        # would cost every valid frame a Python call per event.
        try:
            message = msgpack.unpackb(body, raw=False, strict_map_key=False, object_pairs_hook=_map_from_pairs)
        except Exception as exc2:  # as below
            raise MalformedFrame(f"frame body is not valid msgpack: {type(exc2).__name__}") from exc2
    except Exception as exc:  # msgpack raises several unrelated types for corrupt input
        raise MalformedFrame(f"frame body is not valid msgpack: {type(exc).__name__}") from exc
    if type(message) is NonStringKeyMap:
        raise MalformedFrame("frame map has a non-string key")
    if not isinstance(message, dict):
        raise MalformedFrame(f"frame body must be a map, got {type(message).__name__}")
    if not isinstance(message.get("type"), str):
        raise MalformedFrame("frame map has no string 'type'")
    return message
