"""Tumbling event-time window counts released by watermarks, corrected by late events (one counter per stream).

Windows ``[start, start + width)`` on the grid anchored at ``origin_us``.  :meth:`TumblingWindowCounter.advance`
with watermark ``W`` (no later event has a reference time below ``W``) releases, in start order, every window whose
end is at or below ``W``, as a :class:`WindowCount` with ``revision`` 0.  A window with no event is not emitted.

Late events correct released windows.  A released window stays correctable while the watermark is below its end
plus ``allowed_lateness_us`` (Flink's rule: too late once ``end + allowed_lateness <= W``, so ``0`` means no
corrections).  A late event for a correctable window is counted there and the next :meth:`advance` re-emits the
window with ``revision`` one higher; every late event for it between two calls is folded into that one correction.
A late event landing in a window that had no event when the watermark passed it (so was never emitted) makes it
come out at the next :meth:`advance` with revision 0, its first release.  A late event for a window past allowed
lateness is not counted anywhere: :meth:`add` returns it as :class:`TooLate`, never dropped silently.

State is bounded: a released window is forgotten once it is past allowed lateness.  Pure and clock-free: only
:meth:`add` and :meth:`advance` change state, so the object can live in Spark's group state through
:meth:`snapshot` / :meth:`restore`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import msgpack

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from contract.records import RESULT_TOO_LATE

__all__ = ["DEFAULT_ALLOWED_LATENESS_US", "TOO_LATE", "TooLate", "TumblingWindowCounter", "WindowCount"]

# A late event past the allowed lateness: the record contract's reason (its window's state is gone).
TOO_LATE = RESULT_TOO_LATE
_SNAPSHOT_VERSION = 1


@dataclass(frozen=True, slots=True)
class WindowCount:
    """The count of one window; the highest revision of a window is its final truth."""

    window_start_us: int
    window_end_us: int
    count: int
    revision: int = 0
    """0 for the first release of the window, n for its n-th correction."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class TooLate:
    """An event for a window past allowed lateness: that window's counts never include it."""

    ts_us: int
    window_start_us: int
    reason: str = TOO_LATE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Released:
    """A released window kept for corrections."""

    __slots__ = ("count", "revision")

    def __init__(self, count: int) -> None:
        self.count = count
        self.revision = 0
        """The revision its next emission carries (= how often it has been emitted)."""


class TumblingWindowCounter:
    """Counts per tumbling window of one stream, released by watermarks.  See the module docstring."""

    def __init__(
        self, width_us: int, *, origin_us: int = 0, allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US
    ) -> None:
        if width_us <= 0:
            raise ValueError(f"width_us must be positive, got {width_us}")
        if allowed_lateness_us < 0:
            raise ValueError(f"allowed_lateness_us must be >= 0, got {allowed_lateness_us}")
        self.width_us = width_us
        self.origin_us = origin_us
        self.allowed_lateness_us = allowed_lateness_us
        self.watermark_us: int | None = None
        self._open: dict[int, int] = {}  # window start -> count, not released yet
        self._released: dict[int, _Released] = {}  # released windows still correctable, by start
        self._released_order: list[int] = []  # a heap of their starts, the next to forget on top
        self._dirty: set[int] = set()  # released windows to (re-)emit at the next advance()
        self.events = 0
        self.late_events = 0
        """Events counted into a released window (within allowed lateness)."""
        self.corrections = 0
        """WindowCounts emitted with revision >= 1."""
        self.too_late = 0
        """Events not counted: their window was past allowed lateness."""

    def window_start_us(self, ts_us: int) -> int:
        # Floor division rounds towards -inf, so timestamps before the origin land in the right window too.
        return self.origin_us + ((ts_us - self.origin_us) // self.width_us) * self.width_us

    # ---------------------------------------------------------------- input

    def add(self, ts_us: int) -> TooLate | None:
        """Count one event; returns it as :class:`TooLate` if its window is past allowed lateness, else None."""
        self.events += 1
        start = self.origin_us + ((ts_us - self.origin_us) // self.width_us) * self.width_us
        wm = self.watermark_us
        if wm is None or start + self.width_us > wm:
            self._open[start] = self._open.get(start, 0) + 1
            return None
        return self._late(ts_us, start, wm)

    def add_many(self, ts_us: Iterable[int]) -> list[TooLate]:
        """:meth:`add` for a micro-batch; returns the too-late events in input order."""
        late: list[TooLate] = []
        width, origin, open_windows = self.width_us, self.origin_us, self._open
        wm = self.watermark_us
        # The watermark only moves in advance(): windows starting above this bound are open for the whole batch.
        released_upto = None if wm is None else wm - width
        n = 0
        for ts in ts_us:
            n += 1
            start = origin + ((ts - origin) // width) * width
            if released_upto is None or start > released_upto:
                open_windows[start] = open_windows.get(start, 0) + 1
                continue
            got = self._late(ts, start, released_upto + width)
            if got is not None:
                late.append(got)
        self.events += n
        return late

    def _late(self, ts_us: int, start: int, wm: int) -> TooLate | None:
        """An event for the released window at ``start``: a correction, or too late."""
        if start + self.width_us + self.allowed_lateness_us <= wm:
            self.too_late += 1
            return TooLate(ts_us, start)
        window = self._released.get(start)
        if window is None:
            # Released without events, so never emitted: it comes out for the first time with this one.
            window = self._released[start] = _Released(0)
            heapq.heappush(self._released_order, start)
        window.count += 1
        self._dirty.add(start)
        self.late_events += 1
        return None

    # ---------------------------------------------------------------- output

    def advance(self, watermark_us: int) -> list[WindowCount]:
        """Release the windows whose end the watermark reached and every correction since the last call, in start
        order; then forget the windows past allowed lateness."""
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us
        wm, width = self.watermark_us, self.width_us
        for start in [s for s in self._open if s + width <= wm]:
            self._released[start] = _Released(self._open.pop(start))
            heapq.heappush(self._released_order, start)
            self._dirty.add(start)
        out: list[WindowCount] = []
        for start in sorted(self._dirty):
            window = self._released[start]
            out.append(WindowCount(start, start + width, window.count, window.revision))
            if window.revision:
                self.corrections += 1
            window.revision += 1
        self._dirty.clear()
        order, forget_upto = self._released_order, wm - width - self.allowed_lateness_us
        while order and order[0] <= forget_upto:
            del self._released[heapq.heappop(order)]
        return out

    def flush(self) -> list[WindowCount]:
        """End of stream: release every open window and every pending correction."""
        horizon = max(self._open, default=None)
        if horizon is None:
            return self.advance(self.watermark_us) if self._dirty and self.watermark_us is not None else []
        return self.advance(horizon + self.width_us)

    def next_release_us(self) -> int | None:
        """The lowest watermark at which :meth:`advance` emits something (an event-time timer for the shell).

        With corrections waiting, that is the current watermark: any advance() emits them."""
        if self._dirty and self.watermark_us is not None:
            return self.watermark_us
        if not self._open:
            return None
        return min(self._open) + self.width_us

    def is_empty(self) -> bool:
        """No window held, open or correctable.  Dropping an empty counter also forgets its watermark, so only a
        shell that filters events below ``watermark - width - allowed_lateness`` itself may drop it."""
        return not self._open and not self._released

    @property
    def open_windows(self) -> int:
        return len(self._open)

    @property
    def retained_windows(self) -> int:
        """Released windows still correctable (at most allowed_lateness / width + 1)."""
        return len(self._released)

    # ---------------------------------------------------------------- state

    def snapshot(self) -> bytes:
        """Exact state as msgpack bytes."""
        state = {
            "v": _SNAPSHOT_VERSION,
            "width_us": self.width_us,
            "origin_us": self.origin_us,
            "allowed_lateness_us": self.allowed_lateness_us,
            "watermark_us": self.watermark_us,
            "open": [[start, count] for start, count in self._open.items()],
            "released": [[start, w.count, w.revision] for start, w in self._released.items()],
            "released_order": list(self._released_order),
            "dirty": sorted(self._dirty),
            "counters": [self.events, self.late_events, self.corrections, self.too_late],
        }
        packed: bytes = msgpack.packb(state, use_bin_type=True)
        return packed

    @classmethod
    def restore(cls, blob: bytes) -> TumblingWindowCounter:
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if state.get("v") != _SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {state.get('v')!r}")
        counter = cls(state["width_us"], origin_us=state["origin_us"], allowed_lateness_us=state["allowed_lateness_us"])
        counter.watermark_us = state["watermark_us"]
        counter._open = {start: count for start, count in state["open"]}
        for start, count, revision in state["released"]:
            window = counter._released[start] = _Released(count)
            window.revision = revision
        counter._released_order = list(state["released_order"])
        counter._dirty = set(state["dirty"])
        counter.events, counter.late_events, counter.corrections, counter.too_late = state["counters"]
        return counter
