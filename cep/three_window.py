"""Three-window time batch aggregation driven by watermarks (thesis 003, Sec. 3.2.3.1, Query 4.4, 4.5, 5.7).

One :class:`ThreeWindowAggregator` per stream.  Every event is counted in its LOW, MIDDLE and HIGH slot
(:mod:`cep.windows`); a slot is released once the watermark reaches its end, and once all three slots of a nominal
start ``t`` are out, a :class:`FinalResult` averages them as Query 4.5/5.7 do.

Shift ``s`` per event:

* ``shift_mode="thesis"``: ``s = ceil(T_a / 2)`` with ``T_a`` the maximum RTT over the stream's sources (Eq. 3.16),
  set with :meth:`ThreeWindowAggregator.set_ta_us` from the sources topic (``t_a_us``).  Rounded up so the windows
  never cover less than the ambiguous range.
* ``shift_mode="per_event"``: ``s`` = the event's own ``uncertainty_us`` (the gateway's bound on its reference
  time).  Future events' shifts are unknown, so HIGH slots wait for the configured bound ``max_shift_us``.

Release rule (watermark ``W``: no later event has a reference time below ``W``): slot ``(type, t)`` is complete when

* MIDDLE: ``W >= t + w``;
* LOW: thesis ``W >= t - s + w``; per-event ``W >= t + w`` (an event with ``s = 0`` can still land in it until then);
* HIGH: thesis ``W >= t + s + w``; per-event ``W >= t + max_shift + w``.

With ``emit_early=False`` (Query 4.4 as the thesis runs it) all three wait for the HIGH rule and come out together.
An event whose slot was already released is never dropped silently: it is counted and returned as a
:class:`LateEvent` with a reason, and its other (still open) slots take it as usual.

Pure and clock-free: only :meth:`add` and :meth:`advance` change state, so the object can live in Spark's group state
through :meth:`snapshot` / :meth:`restore`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import msgpack

from cep.windows import WINDOW_TYPES, WindowType, sliding_starts, type_offset_us

__all__ = [
    "FinalResult",
    "LateEvent",
    "ShiftMode",
    "ThreeWindowAggregator",
    "WindowResult",
    "combine_final",
]

ShiftMode = Literal["per_event", "thesis"]
_SNAPSHOT_VERSION = 1
_BEHIND_WATERMARK = "behind_watermark"
_SHIFT_BEYOND_BOUND = "shift_beyond_bound"


@dataclass(frozen=True, slots=True)
class WindowResult:
    """Aggregate of one released slot.  ``avg``/``min``/``max`` are ``None`` when no event carried a value."""

    window_type: WindowType
    nominal_start_us: int
    start_us: int
    end_us: int
    count: int
    sum: float
    min: float | None
    max: float | None
    avg: float | None
    value_count: int
    shift_us: int
    """The shift the window was placed with: thesis mode ``s``; per-event mode the largest shift of its events."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window_type"] = str(self.window_type)
        return out


@dataclass(frozen=True, slots=True)
class FinalResult:
    """The three windows of nominal start ``t`` averaged (Query 4.5/5.7).

    ``count`` and ``sum`` are the mean over all three types, an empty window counting as 0 (it is a real observation
    that no event fell in it, and Query 4.5 sums to 0 for it).  ``avg``, ``min`` and ``max`` are the mean over the
    types that have at least one value; ``None`` if none has.
    """

    nominal_start_us: int
    end_us: int
    count: float
    sum: float
    avg: float | None
    min: float | None
    max: float | None
    window_counts: tuple[int, int, int]
    """Counts of the LOW, MIDDLE and HIGH window, for transparency."""
    types_with_values: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window_counts"] = list(self.window_counts)
        return out


@dataclass(frozen=True, slots=True)
class LateEvent:
    """An event that arrived for an already released slot; that slot's result did not include it."""

    ts_us: int
    value: float | None
    uncertainty_us: int
    shift_us: int
    window_type: WindowType
    nominal_start_us: int
    reason: str
    """``behind_watermark``: the event is older than a watermark already seen (the upstream promise was broken);
    ``shift_beyond_bound``: the event itself is not late, but its shift exceeds the bound the slot was released
    with (per-event ``uncertainty_us > max_shift_us``, or thesis ``T_a`` grew after the release)."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window_type"] = str(self.window_type)
        return out


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def combine_final(nominal_start_us: int, width_us: int, results: dict[WindowType, WindowResult]) -> FinalResult:
    """Average the LOW/MIDDLE/HIGH results of one nominal start (missing types count as empty windows)."""
    present = [results[k] for k in WINDOW_TYPES if k in results]
    valued = [r for r in present if r.value_count > 0]
    counts = tuple(results[k].count if k in results else 0 for k in WINDOW_TYPES)
    return FinalResult(
        nominal_start_us=nominal_start_us,
        end_us=nominal_start_us + width_us,
        count=sum(counts) / 3,
        sum=math.fsum(r.sum for r in present) / 3,
        avg=_mean([r.avg for r in valued if r.avg is not None]),
        min=_mean([r.min for r in valued if r.min is not None]),
        max=_mean([r.max for r in valued if r.max is not None]),
        window_counts=(counts[0], counts[1], counts[2]),
        types_with_values=len(valued),
    )


class _Acc:
    """Running aggregate of one open slot (a small mutable record; slots keep it cheap)."""

    __slots__ = ("count", "max", "min", "shift", "sum", "value_count")

    def __init__(self) -> None:
        self.count = 0
        self.value_count = 0
        self.sum = 0.0
        self.min: float | None = None
        self.max: float | None = None
        self.shift = 0

    def add(self, value: float | None, shift: int) -> None:
        self.count += 1
        if shift > self.shift:  # noqa: PLR1730 - a builtin call costs more on this hot path
            self.shift = shift
        if value is None:
            return
        self.value_count += 1
        self.sum += value
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    def snapshot(self) -> list[Any]:
        return [self.count, self.value_count, self.sum, self.min, self.max, self.shift]

    @classmethod
    def restore(cls, row: Sequence[Any]) -> _Acc:
        acc = cls()
        acc.count, acc.value_count, acc.sum, acc.min, acc.max, acc.shift = row
        return acc


_TYPE_INDEX = {t: i for i, t in enumerate(WINDOW_TYPES)}


class ThreeWindowAggregator:
    """LOW/MIDDLE/HIGH time batch windows of one stream, released by watermarks.  See the module docstring."""

    def __init__(
        self,
        width_us: int,
        *,
        slide_us: int | None = None,
        emit_early: bool = False,
        shift_mode: ShiftMode = "per_event",
        max_shift_us: int | None = None,
        origin_us: int = 0,
        ta_us: int = 0,
    ) -> None:
        if width_us <= 0:
            raise ValueError(f"width_us must be positive, got {width_us}")
        if slide_us is not None and slide_us <= 0:
            raise ValueError(f"slide_us must be positive, got {slide_us}")
        if shift_mode not in ("per_event", "thesis"):
            raise ValueError(f"shift_mode must be 'per_event' or 'thesis', got {shift_mode!r}")
        if shift_mode == "per_event" and (max_shift_us is None or max_shift_us < 0):
            raise ValueError("per_event mode needs max_shift_us >= 0: the bound HIGH windows wait for")
        self.width_us = width_us
        # slide == width is the tumbling case; keep None for it so the fast path is used.
        self.slide_us = None if slide_us == width_us else slide_us
        self.emit_early = emit_early
        self.shift_mode: ShiftMode = shift_mode
        self.max_shift_us = max_shift_us if max_shift_us is not None else 0
        self.origin_us = origin_us
        self.ta_us = 0
        self.set_ta_us(ta_us)
        self.watermark_us: int | None = None
        self._open: dict[tuple[WindowType, int], _Acc] = {}
        # Highest nominal start released per type; a slot at or below it is closed for good.
        self._frontier: dict[WindowType, int | None] = dict.fromkeys(WINDOW_TYPES)
        # Released slot results of nominal starts whose HIGH slot is still open (FinalResult needs all three).
        self._pending: dict[int, dict[WindowType, WindowResult]] = {}
        # Results created outside advance() (an empty slot discovered after its release), emitted at the next one.
        self._outbox: list[WindowResult] = []
        self.events = 0
        self.late_events = 0
        self.late_slots = 0

    # ---------------------------------------------------------------- configuration

    def set_ta_us(self, ta_us: int) -> None:
        """Thesis mode: ``T_a`` = max RTT over the stream's sources (the sources topic's ``t_a_us``)."""
        if ta_us < 0:
            raise ValueError(f"T_a must be >= 0, got {ta_us}")
        self.ta_us = ta_us

    @property
    def thesis_shift_us(self) -> int:
        """``ceil(T_a / 2)``."""
        return (self.ta_us + 1) // 2

    def shift_for(self, uncertainty_us: int) -> int:
        return self.thesis_shift_us if self.shift_mode == "thesis" else max(0, uncertainty_us)

    def close_offset_us(self, window_type: WindowType) -> int:
        """Slot ``(type, t)`` is complete once the watermark reaches ``t + w + close_offset``."""
        if not self.emit_early:
            window_type = WindowType.HIGH
        if self.shift_mode == "thesis":
            return type_offset_us(window_type, self.thesis_shift_us)
        return self.max_shift_us if window_type is WindowType.HIGH else 0

    # ---------------------------------------------------------------- input

    def add(self, ts_us: int, value: float | None, uncertainty_us: int) -> list[LateEvent]:
        """Count one event (``value=None``: counted, not aggregated).  Returns its late slots, usually none."""
        shift = self.shift_for(uncertainty_us)
        self.events += 1
        late: list[LateEvent] = []
        width, origin, slide = self.width_us, self.origin_us, self.slide_us
        open_slots, frontiers = self._open, self._frontier
        for window_type, probe in (
            (WindowType.LOW, ts_us + shift),
            (WindowType.MIDDLE, ts_us),
            (WindowType.HIGH, ts_us - shift),
        ):
            frontier = frontiers[window_type]
            # Tumbling inline (the hot path): one start, the MIDDLE-grid window holding the probe.
            starts = (
                (origin + ((probe - origin) // width) * width,)
                if slide is None
                else sliding_starts(probe, width, slide, origin)
            )
            for t in starts:
                if frontier is not None and t <= frontier:
                    late.append(self._late(ts_us, value, uncertainty_us, shift, window_type, t))
                    continue
                key = (window_type, t)
                acc = open_slots.get(key)
                if acc is None:
                    acc = open_slots[key] = _Acc()
                    self._touch(t)
                acc.add(value, shift)
        if late:
            self.late_events += 1
            self.late_slots += len(late)
        return late

    def add_many(
        self, ts_us: Sequence[int], values: Sequence[float | None], uncertainty_us: Sequence[int]
    ) -> list[LateEvent]:
        """:meth:`add` for columns of equal length (a micro-batch)."""
        if not len(ts_us) == len(values) == len(uncertainty_us):
            raise ValueError("ts_us, values and uncertainty_us must have the same length")
        late: list[LateEvent] = []
        add = self.add
        for ts, value, unc in zip(ts_us, values, uncertainty_us, strict=True):
            got = add(ts, value, unc)
            if got:
                late.extend(got)
        return late

    def _late(
        self, ts_us: int, value: float | None, unc: int, shift: int, window_type: WindowType, t: int
    ) -> LateEvent:
        behind = self.watermark_us is not None and ts_us < self.watermark_us
        reason = _BEHIND_WATERMARK if behind else _SHIFT_BEYOND_BOUND
        return LateEvent(ts_us, value, unc, shift, window_type, t, reason)

    def _touch(self, t: int) -> None:
        """A new open slot of ``t``: types of ``t`` already released (empty, nobody had touched ``t``) get an
        empty result now, so the FinalResult of ``t`` still sees all three windows."""
        for k in WINDOW_TYPES:
            f = self._frontier[k]
            if f is not None and t <= f:
                got = self._pending.setdefault(t, {})
                if k not in got:
                    got[k] = result = self._empty_result(k, t)
                    self._outbox.append(result)

    # ---------------------------------------------------------------- output

    def _empty_result(self, window_type: WindowType, t: int) -> WindowResult:
        shift = self.thesis_shift_us if self.shift_mode == "thesis" else self.max_shift_us
        return self._result(window_type, t, None, shift)

    def _result(self, window_type: WindowType, t: int, acc: _Acc | None, shift: int) -> WindowResult:
        if acc is not None:
            shift = acc.shift
        start = t + type_offset_us(window_type, shift)
        end = start + self.width_us
        if acc is None:
            return WindowResult(window_type, t, start, end, 0, 0.0, None, None, None, 0, shift)
        avg = acc.sum / acc.value_count if acc.value_count else None
        return WindowResult(
            window_type, t, start, end, acc.count, acc.sum, acc.min, acc.max, avg, acc.value_count, shift
        )

    def advance(self, watermark_us: int) -> list[WindowResult | FinalResult]:
        """Release every slot the watermark completes, in nominal-start order, each ``t``'s FinalResult last."""
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us
        wm = self.watermark_us
        out: list[WindowResult | FinalResult] = list(self._outbox)
        self._outbox.clear()
        shift_default = self.thesis_shift_us if self.shift_mode == "thesis" else self.max_shift_us
        cutoff = {k: wm - self.width_us - self.close_offset_us(k) for k in WINDOW_TYPES}
        # Nominal starts with an open slot due for release; empty types of them are released empty.
        # Pending starts are included: one whose remaining types are all empty has no open slot left.
        due = sorted({t for (k, t) in self._open if t <= cutoff[k]} | self._pending.keys())
        released: list[tuple[int, WindowType, WindowResult]] = []
        for t in due:
            for k in WINDOW_TYPES:
                if t > cutoff[k]:
                    continue
                pending = self._pending.setdefault(t, {})
                if k in pending:
                    continue
                acc = self._open.pop((k, t), None)
                result = self._result(k, t, acc, shift_default)
                pending[k] = result
                released.append((t, k, result))
        for k in WINDOW_TYPES:
            f = self._frontier[k]
            # Grid-aligned frontier is not needed: the comparison ``t <= frontier`` works for any integer.
            if f is None or cutoff[k] > f:
                self._frontier[k] = cutoff[k]
        for _t, _k, result in released:
            out.append(result)
        # A nominal start is final once its HIGH slot is out (HIGH closes last in both modes).
        finals = sorted(t for t, got in self._pending.items() if WindowType.HIGH in got)
        for t in finals:
            got = self._pending.pop(t)
            for k in WINDOW_TYPES:  # types released empty before any event touched t
                if k not in got:
                    got[k] = self._empty_result(k, t)
                    out.append(got[k])
            out.append(combine_final(t, self.width_us, got))
        out.sort(key=_order_key)
        return out

    def flush(self) -> list[WindowResult | FinalResult]:
        """End of stream: release everything still open."""
        if not self._open and not self._pending and not self._outbox:
            return []
        horizon = max([t for _k, t in self._open] + list(self._pending), default=0)
        return self.advance(horizon + 2 * self.width_us + self.max_shift_us + self.thesis_shift_us + 1)

    @property
    def open_slots(self) -> int:
        return len(self._open)

    def next_release_us(self) -> int | None:
        """The lowest watermark at which :meth:`advance` releases something (an event-time timer for the shell)."""
        due = [t + self.width_us + self.close_offset_us(k) for k, t in self._open]
        high = self.width_us + self.close_offset_us(WindowType.HIGH)
        due.extend(t + high for t in self._pending)
        return min(due, default=None)

    # ---------------------------------------------------------------- state

    def snapshot(self) -> bytes:
        """Exact state as msgpack bytes (floats are float64, so sums round-trip bit for bit)."""
        state = {
            "v": _SNAPSHOT_VERSION,
            "width_us": self.width_us,
            "slide_us": self.slide_us,
            "emit_early": self.emit_early,
            "shift_mode": self.shift_mode,
            "max_shift_us": self.max_shift_us,
            "origin_us": self.origin_us,
            "ta_us": self.ta_us,
            "watermark_us": self.watermark_us,
            "open": [[str(k), t, *acc.snapshot()] for (k, t), acc in self._open.items()],
            "frontier": [self._frontier[k] for k in WINDOW_TYPES],
            "pending": [[t, [_snapshot_result(r) for r in got.values()]] for t, got in self._pending.items()],
            "outbox": [_snapshot_result(r) for r in self._outbox],
            "counters": [self.events, self.late_events, self.late_slots],
        }
        packed: bytes = msgpack.packb(state, use_bin_type=True)
        return packed

    @classmethod
    def restore(cls, blob: bytes) -> ThreeWindowAggregator:
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if state.get("v") != _SNAPSHOT_VERSION:
            raise ValueError(f"unsupported snapshot version {state.get('v')!r}")
        agg = cls(
            state["width_us"],
            slide_us=state["slide_us"],
            emit_early=state["emit_early"],
            shift_mode=state["shift_mode"],
            max_shift_us=state["max_shift_us"],
            origin_us=state["origin_us"],
            ta_us=state["ta_us"],
        )
        agg.watermark_us = state["watermark_us"]
        agg._open = {(WindowType(row[0]), row[1]): _Acc.restore(row[2:]) for row in state["open"]}
        agg._frontier = dict(zip(WINDOW_TYPES, state["frontier"], strict=True))
        agg._pending = {t: {r.window_type: r for r in map(_restore_result, rows)} for t, rows in state["pending"]}
        agg._outbox = [_restore_result(x) for x in state["outbox"]]
        agg.events, agg.late_events, agg.late_slots = state["counters"]
        return agg


def _order_key(item: WindowResult | FinalResult) -> tuple[int, int]:
    if isinstance(item, FinalResult):
        return (item.nominal_start_us, 3)
    return (item.nominal_start_us, _TYPE_INDEX[item.window_type])


def _snapshot_result(r: WindowResult) -> list[Any]:
    return [
        str(r.window_type),
        r.nominal_start_us,
        r.start_us,
        r.end_us,
        r.count,
        r.sum,
        r.min,
        r.max,
        r.avg,
        r.value_count,
        r.shift_us,
    ]


def _restore_result(row: Sequence[Any]) -> WindowResult:
    return WindowResult(WindowType(row[0]), *row[1:])
