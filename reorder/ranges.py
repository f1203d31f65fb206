"""Sets of integers kept as sorted, disjoint, inclusive ranges, each range carrying a value (issue 24 item 3).

The reorderer's holes and skipped seqs, and the gateway's delivery bookkeeping, used to hold one dict or set entry
per sequence number: a source that jumped from seq 0 to seq 1,000,000 cost a million entries for one event. A
:class:`RangeMap` holds what a run of consecutive seqs shares (the time a hole opened, the time a gap was given up)
once per run, so its size is the number of runs, which only the events a source really sends can multiply: each
insert or removal of one seq adds at most one range.

Sans-IO and pure: two parallel sorted lists (``bisect`` on the range starts), no per-seq objects.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["RangeMap"]

V = TypeVar("V")


class RangeMap(Generic[V]):
    """Integers ``lo..hi`` (inclusive) mapped to values, stored per run of consecutive integers with one value.

    Adjacent runs with equal values are merged when added, so a set (every value None) stays as few ranges as its
    integers allow. ``count`` is the number of integers covered, ``len()`` the number of ranges.
    """

    __slots__ = ("_his", "_los", "_vals", "count")

    def __init__(self) -> None:
        self._los: list[int] = []
        self._his: list[int] = []
        self._vals: list[V] = []
        self.count = 0

    def __len__(self) -> int:
        return len(self._los)

    def __bool__(self) -> bool:
        return bool(self._los)

    def __iter__(self) -> Iterator[tuple[int, int, V]]:
        return iter(list(zip(self._los, self._his, self._vals, strict=True)))

    def __contains__(self, x: int) -> bool:
        i = bisect_right(self._los, x) - 1
        return i >= 0 and self._his[i] >= x

    def first(self) -> tuple[int, int, V] | None:
        """The lowest range, or None when empty."""
        if not self._los:
            return None
        return self._los[0], self._his[0], self._vals[0]

    def last_hi(self) -> int | None:
        return self._his[-1] if self._his else None

    def span(self, x: int) -> tuple[int, int] | None:
        """The range holding ``x``, as ``(lo, hi)``, or None."""
        i = bisect_right(self._los, x) - 1
        if i >= 0 and self._his[i] >= x:
            return self._los[i], self._his[i]
        return None

    def get(self, x: int) -> V | None:
        i = bisect_right(self._los, x) - 1
        if i >= 0 and self._his[i] >= x:
            return self._vals[i]
        return None

    def add(self, lo: int, hi: int, value: V) -> None:
        """Map every integer of ``lo..hi`` to ``value`` (replacing what was there); nothing when ``lo > hi``."""
        if lo > hi:
            return
        los, his, vals = self._los, self._his, self._vals
        if not los or lo > his[-1]:  # the usual case: above everything held
            if los and lo == his[-1] + 1 and vals[-1] == value:
                his[-1] = hi
            else:
                los.append(lo)
                his.append(hi)
                vals.append(value)
            self.count += hi - lo + 1
            return
        self.pop_range(lo, hi)
        i = bisect_right(los, lo)  # insert before index i
        if i > 0 and his[i - 1] == lo - 1 and vals[i - 1] == value:
            i -= 1
            his[i] = hi
        else:
            los.insert(i, lo)
            his.insert(i, hi)
            vals.insert(i, value)
        if i + 1 < len(los) and los[i + 1] == hi + 1 and vals[i + 1] == value:
            his[i] = his[i + 1]
            del los[i + 1], his[i + 1], vals[i + 1]
        self.count += hi - lo + 1

    def pop(self, x: int) -> V | None:
        """Remove ``x``; its value, or None when it was not held (splits its range in two when inside it)."""
        los, his = self._los, self._his
        i = bisect_right(los, x) - 1
        if i < 0 or his[i] < x:
            return None
        value = self._vals[i]
        lo, hi = los[i], his[i]
        if lo == hi:
            del los[i], his[i], self._vals[i]
        elif x == lo:
            los[i] = x + 1
        elif x == hi:
            his[i] = x - 1
        else:
            his[i] = x - 1
            los.insert(i + 1, x + 1)
            his.insert(i + 1, hi)
            self._vals.insert(i + 1, value)
        self.count -= 1
        return value

    def pop_range(self, lo: int, hi: int) -> list[tuple[int, int, V]]:
        """Remove every integer of ``lo..hi``; the removed pieces ``(lo, hi, value)``, lowest first."""
        los, his, vals = self._los, self._his, self._vals
        if lo > hi or not los or hi < los[0] or lo > his[-1]:
            return []
        i = bisect_right(los, lo) - 1
        if i < 0 or his[i] < lo:
            i += 1
        j = i
        n = len(los)
        removed: list[tuple[int, int, V]] = []
        keep_lo: list[int] = []
        keep_hi: list[int] = []
        keep_val: list[V] = []
        while j < n and los[j] <= hi:
            r_lo, r_hi, r_val = los[j], his[j], vals[j]
            if r_lo < lo:
                keep_lo.append(r_lo)
                keep_hi.append(lo - 1)
                keep_val.append(r_val)
            cut_lo, cut_hi = max(lo, r_lo), min(hi, r_hi)
            removed.append((cut_lo, cut_hi, r_val))
            self.count -= cut_hi - cut_lo + 1
            if r_hi > hi:
                keep_lo.append(hi + 1)
                keep_hi.append(r_hi)
                keep_val.append(r_val)
            j += 1
        los[i:j] = keep_lo
        his[i:j] = keep_hi
        vals[i:j] = keep_val
        return removed

    def gaps(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """The runs of ``lo..hi`` not held, lowest first."""
        out: list[tuple[int, int]] = []
        if lo > hi:
            return out
        los, his = self._los, self._his
        i = max(0, bisect_right(los, lo) - 1)
        cursor = lo
        n = len(los)
        while i < n and los[i] <= hi and cursor <= hi:
            if his[i] >= cursor:
                if los[i] > cursor:
                    out.append((cursor, los[i] - 1))
                cursor = his[i] + 1
            i += 1
        if cursor <= hi:
            out.append((cursor, hi))
        return out

    def trim_low(self, max_count: int) -> int:
        """Drop the lowest integers until at most ``max_count`` are held; how many were dropped."""
        excess = self.count - max_count
        if excess <= 0:
            return 0
        los, his = self._los, self._his
        dropped = 0
        whole = 0
        while dropped < excess:
            size = his[whole] - los[whole] + 1
            if dropped + size <= excess:
                dropped += size
                whole += 1
            else:
                los[whole] += excess - dropped
                dropped = excess
        if whole:
            del los[:whole], his[:whole], self._vals[:whole]
        self.count -= dropped
        return dropped

    def drop_first_ranges(self, max_ranges: int) -> int:
        """Drop the lowest ranges until at most ``max_ranges`` are held; how many integers were dropped."""
        excess = len(self._los) - max_ranges
        if excess <= 0:
            return 0
        dropped = sum(h - lo + 1 for lo, h in zip(self._los[:excess], self._his[:excess], strict=True))
        del self._los[:excess], self._his[:excess], self._vals[:excess]
        self.count -= dropped
        return dropped

    def drop_below(self, x: int) -> None:
        """Forget every integer below ``x``."""
        if self._los and self._los[0] < x:
            self.pop_range(self._los[0], x - 1)
