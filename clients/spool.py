"""Optional file spool: unacknowledged events survive a client restart.

An append-only log of records, each ``length (4 bytes, big-endian) | crc32 (4 bytes) | msgpack body``:

* ``["H", 1, source_id]`` — header, first record of every file;
* ``["S", {stream: next_seq}, {stream: acked_through}]`` — state after a compaction;
* ``["E", stream, seq, source_ts_us, payload]`` — an event handed to ``send()``; an interval event (``send_interval``,
  ``send_interval_start``/``_end``) has a sixth element, its interval keys as on the wire
  (``{"source_start_ts_us": s}`` or ``{"interval_id": i, "endpoint": "start"|"end"}``), so a restarted client resends
  it as the interval it was, never as a point event;
* ``["A", stream, seq]`` — the gateway acknowledged everything of ``stream`` up to ``seq``.

Opening a spool replays it: the next seq per stream, the acked-through per stream and every event not covered by
an ack. A torn last record (the process died mid-write) or a checksum mismatch ends the replay there and the file
is truncated to its valid prefix. When acked records outweigh live ones the file is rewritten (``S`` + the live
events) to a temporary file, fsynced and atomically renamed over the old one.

Bounded: ``live_bytes`` (the bytes of unacked events) may not exceed ``max_bytes``; the client blocks ``send()``
until acks make room, exactly as for ``max_unacked``.

Durability: records are buffered in the process and written to the OS before each batch leaves for the gateway
(``flush()``), so an event is on disk before the gateway can have seen it; ``fsync=True`` also survives a power
loss, at the cost of one fsync per batch.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import msgpack

from clients.errors import SpoolError
from contract.wire.messages import (
    ENDPOINT,
    ENDPOINTS,
    INTERVAL_ID,
    SOURCE_START_TS_US,
    AtomicInterval,
    EventInterval,
    IntervalEndpoint,
)

__all__ = ["DEFAULT_SPOOL_MAX_BYTES", "FileSpool", "SpoolError", "SpoolState"]

_RECORD = struct.Struct(">II")
_VERSION = 1
# 256 MiB: an hour of a 1 kHz source with 50-byte payloads, far below a small disk.
DEFAULT_SPOOL_MAX_BYTES = 256 * 1024 * 1024
# Compaction is not worth a rewrite for less dead data than this.
_COMPACT_MIN_DEAD_BYTES = 1024 * 1024
# A record longer than this is corruption, not an event (the gateway's frame limit is 1 MiB by default).
_MAX_RECORD_BYTES = 64 * 1024 * 1024


@dataclass
class SpoolState:
    """What a spool held when it was opened."""

    next_seq: dict[str, int] = field(default_factory=dict)
    acked_through: dict[str, int] = field(default_factory=dict)
    events: list[tuple[str, int, int, Any]] = field(default_factory=list)
    """(stream, seq, source_ts_us, payload) of every unacked event, in the order they were spooled."""
    intervals: dict[tuple[str, int], EventInterval] = field(default_factory=dict)
    """(stream, seq) -> the interval keys of each unacked interval event among ``events`` (point events: absent)."""
    truncated_bytes: int = 0
    """Bytes of a torn or corrupt tail dropped while opening."""


def _record(body: Any) -> bytes:
    data: bytes = msgpack.packb(body, use_bin_type=True)
    return _RECORD.pack(len(data), zlib.crc32(data)) + data


class FileSpool:
    """One source's spool file. Not thread-safe; the async client calls it from its event loop only."""

    def __init__(self, path: str | os.PathLike[str], source_id: str, *, max_bytes: int = DEFAULT_SPOOL_MAX_BYTES,
                 fsync: bool = False) -> None:
        if max_bytes <= 0:
            raise ValueError("max_bytes must be positive")
        self.path = Path(path)
        self.source_id = source_id
        self.max_bytes = max_bytes
        self.fsync = fsync
        self.compactions = 0
        # (stream, seq) -> record size, for the events not yet acked; bytes of everything else are dead.
        self._live: dict[str, dict[int, int]] = {}
        self._live_bytes = 0
        self._file_bytes = 0
        self._next_seq: dict[str, int] = {}
        self._acked: dict[str, int] = {}
        self.state = self._open()
        self._fh: BinaryIO | None = self.path.open("ab")

    # -- opening ---------------------------------------------------------------------------------------------------

    def _open(self) -> SpoolState:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists() or self.path.stat().st_size == 0:
            header = _record(["H", _VERSION, self.source_id])
            with self.path.open("wb") as fh:
                fh.write(header)
                fh.flush()
                os.fsync(fh.fileno())
            self._file_bytes = len(header)
            return SpoolState()
        data = self.path.read_bytes()
        state, valid = self._replay(data)
        if valid < len(data):
            state.truncated_bytes = len(data) - valid
            with self.path.open("r+b") as fh:
                fh.truncate(valid)
        self._file_bytes = valid
        return state

    def _replay(self, data: bytes) -> tuple[SpoolState, int]:
        pos, first = 0, True
        events: dict[str, dict[int, tuple[int, Any, int]]] = {}  # stream -> seq -> (ts, payload, order)
        intervals: dict[tuple[str, int], EventInterval] = {}
        order = 0
        while pos + _RECORD.size <= len(data):
            length, crc = _RECORD.unpack_from(data, pos)
            end = pos + _RECORD.size + length
            if length > _MAX_RECORD_BYTES or end > len(data):
                break
            body = data[pos + _RECORD.size:end]
            if zlib.crc32(body) != crc:
                break
            try:
                record = msgpack.unpackb(body, raw=False, strict_map_key=False)
            except Exception:  # noqa: BLE001 - any decoding failure is a corrupt tail
                break
            if first:
                if not (isinstance(record, list) and record[:2] == ["H", _VERSION]):
                    raise SpoolError(f"{self.path} is not a version {_VERSION} Skewless spool")
                if record[2] != self.source_id:
                    raise SpoolError(f"{self.path} belongs to source {record[2]!r}, not {self.source_id!r}")
                first = False
            else:
                kind = record[0]
                if kind == "E":
                    stream, seq, ts_us, payload = record[1:5]
                    interval = _interval_from(record)
                    if interval is None:
                        intervals.pop((stream, seq), None)
                    else:
                        intervals[(stream, seq)] = interval
                    order += 1
                    events.setdefault(stream, {})[seq] = (ts_us, payload, order)
                    self._next_seq[stream] = max(self._next_seq.get(stream, 0), seq + 1)
                    self._live.setdefault(stream, {})[seq] = end - pos
                elif kind == "A":
                    _, stream, seq = record
                    self._forget_through(stream, seq)
                    pending = events.get(stream, {})
                    for old in [s for s in pending if s <= seq]:
                        del pending[old]
                elif kind == "S":
                    _, next_seq, acked = record
                    for stream, seq in next_seq.items():
                        self._next_seq[stream] = max(self._next_seq.get(stream, 0), seq)
                    for stream, seq in acked.items():
                        self._acked[stream] = max(self._acked.get(stream, -1), seq)
            pos = end
        if first:
            raise SpoolError(f"{self.path} has no valid spool header")
        self._live_bytes = sum(sum(sizes.values()) for sizes in self._live.values())
        flat = sorted(((stream, seq, ts, payload, o) for stream, pending in events.items()
                       for seq, (ts, payload, o) in pending.items()), key=lambda item: item[4])
        live_events = [(stream, seq, ts, payload) for stream, seq, ts, payload, _o in flat]
        live_intervals = {(e[0], e[1]): intervals[(e[0], e[1])] for e in live_events if (e[0], e[1]) in intervals}
        return SpoolState(dict(self._next_seq), dict(self._acked), live_events, live_intervals), pos

    def _forget_through(self, stream: str, seq: int) -> None:
        self._acked[stream] = max(self._acked.get(stream, -1), seq)
        live = self._live.get(stream)
        if live:
            for old in [s for s in live if s <= seq]:
                self._live_bytes -= live.pop(old)

    # -- appending -------------------------------------------------------------------------------------------------

    @property
    def live_bytes(self) -> int:
        """Bytes of the events not yet acknowledged (what the bound applies to)."""
        return self._live_bytes

    @property
    def file_bytes(self) -> int:
        return self._file_bytes

    @property
    def has_room(self) -> bool:
        return self._live_bytes < self.max_bytes

    def append_event(self, stream: str, seq: int, source_ts_us: int, payload: Any,
                     interval: EventInterval | None = None) -> None:
        data = _record(_event_body(stream, seq, source_ts_us, payload, interval))
        self._write(data)
        self._live.setdefault(stream, {})[seq] = len(data)
        self._live_bytes += len(data)
        self._next_seq[stream] = max(self._next_seq.get(stream, 0), seq + 1)

    def append_ack(self, stream: str, seq: int) -> None:
        if seq <= self._acked.get(stream, -1):
            return
        self._write(_record(["A", stream, seq]))
        self._forget_through(stream, seq)
        dead = self._file_bytes - self._live_bytes
        if dead >= _COMPACT_MIN_DEAD_BYTES and dead > self._live_bytes:
            self.compact()

    def _write(self, data: bytes) -> None:
        if self._fh is None:
            raise ValueError("spool is closed")
        self._fh.write(data)
        self._file_bytes += len(data)

    def flush(self) -> None:
        """Hand buffered records to the OS (and fsync when configured): call before events go on the wire."""
        if self._fh is not None:
            self._fh.flush()
            if self.fsync:
                os.fsync(self._fh.fileno())

    def compact(self, live_events: Iterable[tuple[str, int, int, Any]] | None = None,
                intervals: dict[tuple[str, int], EventInterval] | None = None) -> None:
        """Rewrite the file as header + state + live events. Without ``live_events`` the live records are copied
        from the current file (with their interval keys); with them, ``intervals`` gives the interval keys of those
        that are interval events."""
        self.flush()
        if live_events is None:
            live = {(s, q) for s, seqs in self._live.items() for q in seqs}
            # Re-reading is simpler than keeping payloads twice in memory; compaction is rare.
            events = [e for e in _read_events(self.path) if (e[0], e[1]) in live]
            intervals = _read_intervals(self.path)
        else:
            events = list(live_events)
        known = intervals or {}
        tmp = self.path.with_name(self.path.name + ".tmp")
        sizes: dict[str, dict[int, int]] = {}
        total = 0
        with tmp.open("wb") as fh:
            for body in (["H", _VERSION, self.source_id], ["S", self._next_seq, self._acked]):
                data = _record(body)
                fh.write(data)
                total += len(data)
            for stream, seq, ts_us, payload in events:
                data = _record(_event_body(stream, seq, ts_us, payload, known.get((stream, seq))))
                fh.write(data)
                total += len(data)
                sizes.setdefault(stream, {})[seq] = len(data)
            fh.flush()
            os.fsync(fh.fileno())
        if self._fh is not None:
            self._fh.close()
        os.replace(tmp, self.path)
        self._fh = self.path.open("ab")
        self._live = sizes
        self._live_bytes = sum(sum(s.values()) for s in sizes.values())
        self._file_bytes = total
        self.compactions += 1

    def close(self) -> None:
        if self._fh is not None:
            self.flush()
            self._fh.close()
            self._fh = None


def _event_body(stream: str, seq: int, source_ts_us: int, payload: Any,
                interval: EventInterval | None) -> list[Any]:
    body: list[Any] = ["E", stream, seq, source_ts_us, payload]
    if type(interval) is AtomicInterval:
        body.append({SOURCE_START_TS_US: interval.source_start_ts_us})
    elif type(interval) is IntervalEndpoint:
        body.append({INTERVAL_ID: interval.interval_id, ENDPOINT: interval.endpoint})
    return body


def _interval_from(record: list[Any]) -> EventInterval | None:
    """The interval keys of an ``E`` record, None for a point event. A spool this client wrote holds only valid
    keys; anything else is corruption and fails loudly rather than resending a point event."""
    if len(record) < 6:
        return None
    keys = record[5]
    if isinstance(keys, dict) and type(keys.get(SOURCE_START_TS_US)) is int:
        return AtomicInterval(keys[SOURCE_START_TS_US])
    if (isinstance(keys, dict) and type(keys.get(INTERVAL_ID)) is str and keys.get(ENDPOINT) in ENDPOINTS):
        return IntervalEndpoint(keys[INTERVAL_ID], keys[ENDPOINT])
    raise SpoolError(f"spool event {record[1]!r}/{record[2]!r} has malformed interval keys {keys!r}")


def _records(path: Path) -> list[list[Any]]:
    data = path.read_bytes()
    pos = 0
    out: list[list[Any]] = []
    while pos + _RECORD.size <= len(data):
        length, _crc = _RECORD.unpack_from(data, pos)
        end = pos + _RECORD.size + length
        if end > len(data):
            break
        out.append(msgpack.unpackb(data[pos + _RECORD.size:end], raw=False, strict_map_key=False))
        pos = end
    return out


def _read_events(path: Path) -> list[tuple[str, int, int, Any]]:
    return [(r[1], r[2], r[3], r[4]) for r in _records(path) if r[0] == "E"]


def _read_intervals(path: Path) -> dict[tuple[str, int], EventInterval]:
    out: dict[tuple[str, int], EventInterval] = {}
    for record in _records(path):
        if record[0] == "E":
            interval = _interval_from(record)
            if interval is not None:
                out[(record[1], record[2])] = interval
    return out
