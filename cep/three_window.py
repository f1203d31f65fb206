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
That watermark is the slot's *close time*.

Late events correct released slots.  A released slot stays correctable while the watermark is below its close time
plus ``allowed_lateness_us`` (Flink's rule: too late once ``close + allowed_lateness <= W``, so ``0`` means no
corrections at all).  An event landing in a correctable slot is counted there and the next :meth:`advance` re-emits
the slot's :class:`WindowResult` with ``revision`` one higher (``0`` is the first release), followed by the
:class:`FinalResult` of ``t`` recomputed from the three slots, also with its own revision one higher.  Every late
event for a slot between two :meth:`advance` calls is folded into one correction.  A slot released empty before any
event touched it (so never emitted) is correctable too: the late event makes it, and the empty slots of its ``t``,
come out at the next :meth:`advance` for the first time, with revision 0.

Change from snapshot version 1: :meth:`ThreeWindowAggregator.add` used to return every slot it found released (reasons
``behind_watermark`` / ``shift_beyond_bound``) and never counted such an event there.  It now returns a
:class:`LateEvent` only for slots past allowed lateness (reason ``too_late``), whose state is gone; an event is never
dropped silently either way, and its other slots take it as usual.

State is bounded: a nominal start is forgotten once its HIGH slot (the last to close) is past allowed lateness, and
every slot of it is too late by then.  Pure and clock-free: only :meth:`add` and :meth:`advance` change state, so the
object can live in Spark's group state through :meth:`snapshot` / :meth:`restore`.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import msgpack

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.windows import WINDOW_TYPES, WindowType, sliding_starts, type_offset_us
from contract.records import RESULT_TOO_LATE

__all__ = [
    "DEFAULT_ALLOWED_LATENESS_US",
    "TOO_LATE",
    "FinalResult",
    "LateEvent",
    "ShiftMode",
    "ThreeWindowAggregator",
    "WindowResult",
    "combine_final",
]

ShiftMode = Literal["per_event", "thesis"]
# A late event past the allowed lateness: the record contract's reason (its window's state is gone).
TOO_LATE = RESULT_TOO_LATE
_SNAPSHOT_VERSION = 2
_LEGACY_SNAPSHOT_VERSION = 1


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
    revision: int = 0
    """0 for the first release of the slot, n for its n-th correction: the highest revision is the final truth."""

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
    revision: int = 0
    """0 for the first final of ``t``, n for the n-th recomputation after a correction of one of its slots."""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window_counts"] = list(self.window_counts)
        return out


@dataclass(frozen=True, slots=True)
class LateEvent:
    """An event that arrived for a slot past allowed lateness; that slot's results never include it."""

    ts_us: int
    value: float | None
    uncertainty_us: int
    shift_us: int
    window_type: WindowType
    nominal_start_us: int
    reason: str
    """``too_late``: the slot was released and its close time plus the allowed lateness is at or below the
    watermark, so its state is gone.  (Before corrections, with snapshot version 1, ``behind_watermark`` and
    ``shift_beyond_bound`` were reported for released slots that are now corrected instead.)"""

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["window_type"] = str(self.window_type)
        return out


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def combine_final(
    nominal_start_us: int, width_us: int, results: dict[WindowType, WindowResult], revision: int = 0
) -> FinalResult:
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
        revision=revision,
    )


class _Acc:
    """Running aggregate of one slot (a small mutable record; slots keep it cheap)."""

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


class _Released:
    """A released slot, kept so late events can still correct it."""

    __slots__ = ("acc", "dirty", "empty_shift", "revision")

    def __init__(self, acc: _Acc, empty_shift: int) -> None:
        self.acc = acc
        # An empty slot has no member shift: it is placed with the bound the release waited for, as of its release.
        self.empty_shift = empty_shift
        self.revision = 0
        """The revision its next emission carries (= how often it has been emitted)."""
        self.dirty = True
        """Changed since its last emission (or never emitted): the next advance() emits it."""

    def snapshot(self) -> list[Any]:
        return [self.revision, self.dirty, self.empty_shift, *self.acc.snapshot()]

    @classmethod
    def restore(cls, row: Sequence[Any]) -> _Released:
        slot = cls(_Acc.restore(row[3:]), row[2])
        slot.revision, slot.dirty = row[0], row[1]
        return slot


class _Start:
    """The released slots of one nominal start and the revision of its next FinalResult."""

    __slots__ = ("final_revision", "slots")

    def __init__(self) -> None:
        self.slots: dict[WindowType, _Released] = {}
        self.final_revision = 0

    def snapshot(self, t: int) -> list[Any]:
        return [t, self.final_revision, [[str(k), *slot.snapshot()] for k, slot in self.slots.items()]]

    @classmethod
    def restore(cls, row: Sequence[Any]) -> tuple[int, _Start]:
        start = cls()
        start.final_revision = row[1]
        start.slots = {WindowType(r[0]): _Released.restore(r[1:]) for r in row[2]}
        return row[0], start


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
        allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US,
    ) -> None:
        if width_us <= 0:
            raise ValueError(f"width_us must be positive, got {width_us}")
        if slide_us is not None and slide_us <= 0:
            raise ValueError(f"slide_us must be positive, got {slide_us}")
        if shift_mode not in ("per_event", "thesis"):
            raise ValueError(f"shift_mode must be 'per_event' or 'thesis', got {shift_mode!r}")
        if shift_mode == "per_event" and (max_shift_us is None or max_shift_us < 0):
            raise ValueError("per_event mode needs max_shift_us >= 0: the bound HIGH windows wait for")
        if allowed_lateness_us < 0:
            raise ValueError(f"allowed_lateness_us must be >= 0, got {allowed_lateness_us}")
        self.width_us = width_us
        # slide == width is the tumbling case; keep None for it so the fast path is used.
        self.slide_us = None if slide_us == width_us else slide_us
        self.emit_early = emit_early
        self.shift_mode: ShiftMode = shift_mode
        self.max_shift_us = max_shift_us if max_shift_us is not None else 0
        self.origin_us = origin_us
        self.allowed_lateness_us = allowed_lateness_us
        self.ta_us = 0
        self.set_ta_us(ta_us)
        self.watermark_us: int | None = None
        self._open: dict[tuple[WindowType, int], _Acc] = {}
        # Highest nominal start released per type; a slot at or below it is closed for good.  Never moves back,
        # even if a growing T_a would close later: what has been released stays released.
        self._frontier: dict[WindowType, int | None] = dict.fromkeys(WINDOW_TYPES)
        # Highest nominal start past allowed lateness per type (derived from the frontier, see _update_too_late).
        self._too_late_upto: dict[WindowType, int] = {}
        # Restored from a version 1 snapshot: the starts finalized before it are not in the state, so they cannot
        # be corrected; slots at or below this nominal start are too late.
        self._legacy_floor: int | None = None
        # Starts with a released slot whose FinalResult is not out yet (their HIGH slot is still open).
        self._pending: dict[int, _Start] = {}
        # Starts whose FinalResult is out and whose HIGH slot is not past allowed lateness: still correctable.
        self._retained: dict[int, _Start] = {}
        self._retained_order: list[int] = []  # a heap of the retained starts, the next to forget on top
        # Starts with a slot to (re-)emit at the next advance().
        self._dirty: set[int] = set()
        self.events = 0
        self.late_events = 0
        """Events with at least one slot past allowed lateness."""
        self.late_slots = 0
        """Slots those events could not be counted in (one LateEvent each)."""
        self.corrected_slots = 0
        """Late slot contributions counted into a released slot."""
        self.corrections = 0
        """WindowResults emitted with revision >= 1."""

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

    def _empty_shift(self) -> int:
        return self.thesis_shift_us if self.shift_mode == "thesis" else self.max_shift_us

    # ---------------------------------------------------------------- input

    def add(self, ts_us: int, value: float | None, uncertainty_us: int) -> list[LateEvent]:
        """Count one event (``value=None``: counted, not aggregated).  Returns its slots past allowed lateness,
        usually none; a released slot still within allowed lateness takes the event as a correction."""
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
                    # Released: the rare branch, so the lateness lookups live here and not on the common path.
                    if t <= self._too_late_upto[window_type]:
                        late.append(LateEvent(ts_us, value, uncertainty_us, shift, window_type, t, TOO_LATE))
                    else:
                        self._correct(window_type, t, value, shift)
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

    def _start_of(self, t: int) -> _Start:
        start = self._pending.get(t)
        if start is None:
            start = self._retained.get(t)
        if start is None:
            # Finalized starts are all in _retained until forgotten, so a new one has no final yet.
            start = self._pending[t] = _Start()
        return start

    def _correct(self, window_type: WindowType, t: int, value: float | None, shift: int) -> None:
        """A late event for released slot ``(window_type, t)`` within allowed lateness."""
        start = self._start_of(t)
        slot = start.slots.get(window_type)
        if slot is None:
            # Released empty before anything touched t: it is first emitted now, with this event.
            slot = start.slots[window_type] = _Released(_Acc(), self._empty_shift())
            self._materialize_released(t, start)
        slot.acc.add(value, shift)
        slot.dirty = True
        self._dirty.add(t)
        self.corrected_slots += 1

    def _touch(self, t: int) -> None:
        """A new open slot of ``t``: types of ``t`` already released (empty, nobody had touched ``t``) get an
        empty result at the next advance, so the FinalResult of ``t`` still sees all three windows."""
        for k in WINDOW_TYPES:
            f = self._frontier[k]
            if f is not None and t <= f:
                self._materialize_released(t, self._start_of(t))
                return

    def _materialize_released(self, t: int, start: _Start) -> None:
        for k in WINDOW_TYPES:
            f = self._frontier[k]
            if f is not None and t <= f and k not in start.slots:
                start.slots[k] = _Released(_Acc(), self._empty_shift())
                self._dirty.add(t)

    # ---------------------------------------------------------------- output

    def _result(self, window_type: WindowType, t: int, slot: _Released) -> WindowResult:
        acc = slot.acc
        shift = acc.shift if acc.count else slot.empty_shift
        start = t + type_offset_us(window_type, shift)
        end = start + self.width_us
        if not acc.count:
            return WindowResult(window_type, t, start, end, 0, 0.0, None, None, None, 0, shift, slot.revision)
        avg = acc.sum / acc.value_count if acc.value_count else None
        return WindowResult(
            window_type,
            t,
            start,
            end,
            acc.count,
            acc.sum,
            acc.min,
            acc.max,
            avg,
            acc.value_count,
            shift,
            slot.revision,
        )

    def advance(self, watermark_us: int) -> list[WindowResult | FinalResult]:
        """Release every slot the watermark completes and every correction since the last call, in nominal-start
        order, each ``t``'s FinalResult last; then forget the starts past allowed lateness."""
        if self.watermark_us is None or watermark_us > self.watermark_us:
            self.watermark_us = watermark_us
        wm = self.watermark_us
        released_upto: dict[WindowType, int] = {}
        for k in WINDOW_TYPES:
            cutoff = wm - self.width_us - self.close_offset_us(k)
            f = self._frontier[k]
            released_upto[k] = self._frontier[k] = cutoff if f is None or cutoff > f else f
        self._update_too_late()
        # Nominal starts with an open slot due for release; empty types of them are released empty.
        # Pending starts are included: one whose remaining types are all empty has no open slot left.
        due = {t for (k, t) in self._open if t <= released_upto[k]}
        due.update(self._pending)
        for t in due:
            start: _Start | None = None
            for k in WINDOW_TYPES:
                if t > released_upto[k]:
                    continue
                if start is None:
                    start = self._start_of(t)
                if k not in start.slots:
                    acc = self._open.pop((k, t), None)
                    start.slots[k] = _Released(acc if acc is not None else _Acc(), self._empty_shift())
                    self._dirty.add(t)
        out = self._emit_dirty()
        limit = self._too_late_upto.get(WindowType.HIGH)
        order = self._retained_order
        while order and limit is not None and order[0] <= limit:
            del self._retained[heapq.heappop(order)]
        return out

    def _update_too_late(self) -> None:
        lateness, floor = self.allowed_lateness_us, self._legacy_floor
        for k in WINDOW_TYPES:
            f = self._frontier[k]
            if f is not None:
                # Too late once close + lateness <= W, i.e. t <= (W - w - close_offset) - lateness.
                upto = f - lateness
                self._too_late_upto[k] = upto if floor is None else max(upto, floor)

    def _emit_dirty(self) -> list[WindowResult | FinalResult]:
        out: list[WindowResult | FinalResult] = []
        for t in sorted(self._dirty):
            start = self._start_of(t)
            results: dict[WindowType, WindowResult] = {}
            for k in WINDOW_TYPES:
                slot = start.slots.get(k)
                if slot is None:
                    continue
                result = results[k] = self._result(k, t, slot)
                if slot.dirty:
                    out.append(result)
                    if slot.revision:
                        self.corrections += 1
                    slot.revision += 1
                    slot.dirty = False
            # HIGH closes last in both modes: once it is released, all three are.
            if WindowType.HIGH in results:
                out.append(combine_final(t, self.width_us, results, start.final_revision))
                start.final_revision += 1
                if self._pending.pop(t, None) is not None:
                    self._retained[t] = start
                    heapq.heappush(self._retained_order, t)
        self._dirty.clear()
        return out

    def flush(self) -> list[WindowResult | FinalResult]:
        """End of stream: release everything still open, and every pending correction."""
        if not self._open and not self._pending and not self._dirty:
            return []
        horizon = max([t for _k, t in self._open] + list(self._pending) + list(self._dirty), default=0)
        return self.advance(horizon + 2 * self.width_us + self.max_shift_us + self.thesis_shift_us + 1)

    @property
    def open_slots(self) -> int:
        return len(self._open)

    @property
    def retained_starts(self) -> int:
        """Finalized nominal starts still correctable (bounded by allowed lateness / slide)."""
        return len(self._retained)

    def next_release_us(self) -> int | None:
        """The lowest watermark at which :meth:`advance` releases something (an event-time timer for the shell).

        With corrections waiting, that is the current watermark: any advance() emits them."""
        if self._dirty and self.watermark_us is not None:
            return self.watermark_us
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
            "allowed_lateness_us": self.allowed_lateness_us,
            "watermark_us": self.watermark_us,
            "open": [[str(k), t, *acc.snapshot()] for (k, t), acc in self._open.items()],
            "frontier": [self._frontier[k] for k in WINDOW_TYPES],
            "legacy_floor": self._legacy_floor,
            "pending": [start.snapshot(t) for t, start in self._pending.items()],
            "retained": [start.snapshot(t) for t, start in self._retained.items()],
            "retained_order": list(self._retained_order),
            "dirty": sorted(self._dirty),
            "counters": [self.events, self.late_events, self.late_slots, self.corrected_slots, self.corrections],
        }
        packed: bytes = msgpack.packb(state, use_bin_type=True)
        return packed

    @classmethod
    def restore(cls, blob: bytes) -> ThreeWindowAggregator:
        """Version 2 round-trips exactly.  Version 1 (no retained slots) restores with the starts it had already
        finalized marked too late, since their slots are not in it; its pending slots stay correctable."""
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        version = state.get("v")
        if version not in (_SNAPSHOT_VERSION, _LEGACY_SNAPSHOT_VERSION):
            raise ValueError(f"unsupported snapshot version {version!r}")
        agg = cls(
            state["width_us"],
            slide_us=state["slide_us"],
            emit_early=state["emit_early"],
            shift_mode=state["shift_mode"],
            max_shift_us=state["max_shift_us"],
            origin_us=state["origin_us"],
            ta_us=state["ta_us"],
            allowed_lateness_us=state.get("allowed_lateness_us", DEFAULT_ALLOWED_LATENESS_US),
        )
        agg.watermark_us = state["watermark_us"]
        agg._open = {(WindowType(row[0]), row[1]): _Acc.restore(row[2:]) for row in state["open"]}
        agg._frontier = dict(zip(WINDOW_TYPES, state["frontier"], strict=True))
        if version == _LEGACY_SNAPSHOT_VERSION:
            agg._restore_v1(state)
        else:
            agg._legacy_floor = state["legacy_floor"]
            agg._pending = dict(map(_Start.restore, state["pending"]))
            agg._retained = dict(map(_Start.restore, state["retained"]))
            agg._retained_order = list(state["retained_order"])
            agg._dirty = set(state["dirty"])
            (agg.events, agg.late_events, agg.late_slots, agg.corrected_slots, agg.corrections) = state["counters"]
        agg._update_too_late()
        return agg

    def _restore_v1(self, state: dict[str, Any]) -> None:
        # Finalized starts are those at or below the HIGH frontier (HIGH closes last); pending ones lie above it.
        self._legacy_floor = self._frontier[WindowType.HIGH]
        unsent = {(row[0], row[1]) for row in state["outbox"]}
        for t, rows in state["pending"]:
            start = self._pending[t] = _Start()
            for row in rows:
                count, value_count, total, low, high, shift = row[4], row[9], row[5], row[6], row[7], row[10]
                acc = _Acc.restore([count, value_count, total, low, high, shift if count else 0])
                slot = start.slots[WindowType(row[0])] = _Released(acc, shift)
                if (row[0], t) in unsent:
                    self._dirty.add(t)
                else:
                    slot.revision, slot.dirty = 1, False
        self.events, self.late_events, self.late_slots = state["counters"]
