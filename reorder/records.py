"""Input and output records of the reorderers and the merger.

All timestamps are integer microseconds.  ``*_us`` values named ``arrival``/``release``/``at`` are on
the gateway (reference) clock; ``source_ts_us`` is on the source's own clock and becomes a reference
timestamp only through a :class:`timesync.clocks.ReferenceMapping` (``t_ref = t_source + offset_us``).

Records are ``NamedTuple``s: immutable, cheap to build on the in-order fast path, and easy to match on.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from contract.wire.messages import EventInterval

__all__ = [
    "GapReason",
    "GapSkipped",
    "Late",
    "LateReason",
    "Merged",
    "Punctuation",
    "Released",
    "SourceEvent",
    "SourceTimedOut",
]

LateReason = Literal["late_after_skip", "before_start", "duplicate", "after_punctuation", "behind_output",
                     "stamp_regression", "after_give_up"]
"""Why an event went to the late side output.

* ``late_after_skip``: its sequence number was skipped by a timeout before it arrived.
* ``before_start``: older than the first seq a reorderer adopted (``initial_seq=None``).
* ``duplicate``: the same (source, stream, seq) was already released or is already buffered.
* ``after_punctuation``: the merger already promised downstream that nothing older would follow.
* ``behind_output``: a timestamp-ordered baseline released a newer event before this one arrived.
* ``stamp_regression``: (watermark merge) its reference time is below its own source's frontier (an earlier event or
  a caught-up heartbeat of the source) by more than its error bound: the source's stamps went backwards along its
  seqs, and released it would follow a newer event of its own (or one the frontier let out) on the main output.
* ``after_give_up``: (watermark merge) the merge gave its source up and released later events of others meanwhile;
  this one is below the highest reference time already released (by more than its error bound), above the
  watermark.
"""

GapReason = Literal["timeout", "buffer_full"]


class SourceEvent(NamedTuple):
    """One event as the gateway decodes it from a source."""

    source_id: str
    stream: str
    seq: int
    source_ts_us: int
    payload: object = None
    interval: EventInterval | None = None
    """None for a point event; an interval event is ordered by its end, ``source_ts_us``."""


class Released(NamedTuple):
    """An event leaving a per-source reorderer (or a timestamp baseline)."""

    event: SourceEvent
    arrival_us: int
    release_us: int
    late: bool = False
    """True for a late event passed through by configuration; it is also reported as :class:`Late`."""


class Late(NamedTuple):
    """Side output: an event that arrived after its slot was released, or a duplicate."""

    event: SourceEvent
    arrival_us: int
    reason: LateReason
    lateness_us: int
    """How long after its slot was given up the event arrived (0 for duplicates)."""
    passed: bool
    """True if the event was also released on the main output (Query 4.3's 7th parameter)."""


class GapSkipped(NamedTuple):
    """Side output: the reorderer stopped waiting for ``first_seq..last_seq`` (inclusive)."""

    source_id: str
    stream: str
    first_seq: int
    last_seq: int
    waited_us: int
    at_us: int
    reason: GapReason


class Merged(NamedTuple):
    """An event leaving the multi-source merger, in reference-time order."""

    event: SourceEvent
    arrival_us: int
    release_us: int
    ref_ts_us: int
    raised_us: int = 0
    """How far the merge raised ``ref_ts_us`` above the event's mapping to keep reference order: a regression within
    the event's error bound is released at the highest reference time already released or queued before it."""


class Punctuation(NamedTuple):
    """No event with ``ref_ts_us < watermark_us`` will follow on this stream's main output."""

    stream: str
    watermark_us: int
    at_us: int


class SourceTimedOut(NamedTuple):
    """The merger stopped waiting for a silent source (thesis section 3.2.2 'flag as timed out')."""

    stream: str
    source_id: str
    at_us: int
