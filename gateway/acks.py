"""Cumulative acknowledgements per (source, stream), sans-IO.

The gateway acks seq N only when every seq of that source and stream up to N is settled: Kafka confirmed it, or the
gateway gave it up (its reorderer stopped waiting for it: ``give_up``, issue 24 item 2), so a client may forget
everything up to an ack. A given-up seq that turns up later is accepted once more (it goes to the late topic,
``late_after_skip``) although the ack passed it; any other seq already accepted is a duplicate, or a *conflict* when
its payload or ``source_ts_us`` differ from the accepted one's (issue 24 item 8).

State per (source, stream), and why it is bounded (docs/operations.md, "Limits"):

* the accepted seqs the ack has not passed yet, each with the accepted event's digest (``event_digest``: a
  duplicate is compared by digest here and once acked alike): the unacknowledged window, bounded by the
  gateway's buffer limits and Kafka's latency;
* confirmed and given-up seqs as ranges (reorder/ranges.py), not one entry per seq: a gap of a million seqs is one
  range. Given-up ranges the ack passed are kept (for the one late acceptance) up to ``max_given_up_seqs`` seqs and
  ``MAX_GIVEN_UP_RANGES`` ranges, the lowest forgotten first;
* a ring of the digests of the last ``RECENT_ACKED_DIGESTS`` acked seqs (2 KiB), allocated at the first ack: a
  duplicate older than that is not compared (re-acked as a plain duplicate).

When the gateway frees an idle source (rule 11 of gateway/ingest.py) its entries with nothing above the ack are
*compacted* (``compact``) to the acked seq alone, the dedup floor: a resend at or below it is a duplicate (not
compared; its given-up seqs are forgotten, as after a restart). Once the source left the progress checkpoint (rule 6,
``source_retention``) its entries are deleted (``forget``): it is as unknown as to a restarted gateway.

A seq more than ``max_seq_jump`` above everything accepted (or given up, or acked) is refused (``SEQ_JUMP``): a
jump that large is a broken source, and the gap it opens would be waited for and reported for nothing. The first
seq of a (source, stream) the tracker knows nothing of is accepted whatever it is (a long-lived source the gateway
lost track of): the gap below it is one range.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any, Literal, Protocol

import orjson

from reorder.ranges import RangeMap

__all__ = [
    "ACCEPTED",
    "CONFLICT",
    "DEFAULT_MAX_SEQ_JUMP",
    "DUPLICATE",
    "MAX_GIVEN_UP_RANGES",
    "RECENT_ACKED_DIGESTS",
    "SEQ_JUMP",
    "Admission",
    "DeliveryTracker",
    "EventDigestsCore",
    "digest_body",
    "event_digest",
]

Admission = Literal["accepted", "duplicate", "conflict", "seq_jump"]
ACCEPTED: Admission = "accepted"
DUPLICATE: Admission = "duplicate"
CONFLICT: Admission = "conflict"
SEQ_JUMP: Admission = "seq_jump"

#: A seq this far above the highest seq accepted, given up or acked of its (source, stream) is refused. A million is
#: far beyond any window a source keeps unacknowledged (the SDK's max_unacked is 100,000 by default) and beyond any
#: legitimate hole (a source's events lost in one piece), yet far below the sequence space.
DEFAULT_MAX_SEQ_JUMP = 1_000_000
#: Given-up seqs remembered once the ack passed them, to accept each once more when it turns up: as many as the
#: reorderer remembers (reorder.sequence.DEFAULT_MAX_SKIPPED_TRACKED), in at most this many ranges.
DEFAULT_MAX_GIVEN_UP_SEQS = 100_000
MAX_GIVEN_UP_RANGES = 1024
#: Digests of the most recently acked seqs, per (source, stream), to tell a conflicting duplicate from a resend.
RECENT_ACKED_DIGESTS = 128

_NO_SEQ = -1
#: The highest seq EventDigests.confirm_run takes (its seqs are 64-bit): the wire's own limit (contract.wire's MAX_SEQ).
_MAX_NATIVE_SEQ = 2**63 - 1


class FrameEvent(Protocol):
    """What ``admit_frame`` reads of an event (contract.wire.messages.IncomingEvent)."""

    @property
    def stream(self) -> str: ...
    @property
    def seq(self) -> int: ...
    @property
    def source_ts_us(self) -> int: ...
    @property
    def payload(self) -> Any: ...


class EventDigestsCore(Protocol):
    """Another definition of the digests (gateway.native: the Rust one, ``skewless_native.EventDigests``) with the
    same verdicts, ``admit_frame``'s inline path for a run of one stream's events in one call, and
    ``confirmed_run``'s in-order loop (the pending digests popped, the ring of acked digests written) in one call."""

    def event_digest(self, source_ts_us: int, payload: Any) -> int: ...

    def admit_run(self, events: Sequence[FrameEvent], start: int, stream: str, pending: dict[int, int | None],
                  highest: int, acked_through: int, max_seq_jump: int) -> tuple[int, int]: ...

    def confirm_run(self, pending: dict[int, int | None], ring_seqs: array[int] | None,
                    ring_digests: array[int] | None, first_seq: int, last_seq: int) -> tuple[int, int] | None: ...


def digest_body(payload: Any) -> bytes | str:
    """What ``event_digest`` hashes with the timestamp: the payload's JSON with sorted keys, or its repr."""
    try:
        return orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # a RejectedPayload, or anything orjson cannot encode: its repr names it well enough
        return repr(payload)


def event_digest(source_ts_us: int, payload: Any) -> int:
    """A 64-bit digest of what a duplicate must repeat: the payload and the source timestamp.

    The payload's JSON with sorted keys: an object resent with its keys in another order is the same event, while
    ``1``, ``1.0`` and ``true`` differ (as they do in Kafka), unlike Python's ``1 == 1.0 == True``."""
    try:
        body: bytes | str = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # a RejectedPayload, or anything orjson cannot encode: its repr names it well enough
        body = repr(payload)
    return hash((source_ts_us, body))


class _StreamProgress:
    __slots__ = ("acked_through", "confirmed", "given_up", "highest", "late_given_up", "pending", "recent_digests",
                 "recent_seqs")

    def __init__(self, acked_through: int) -> None:
        self.acked_through = acked_through  # highest seq such that everything from the first seq up to it is settled
        self.highest = acked_through  # highest seq accepted or given up (for the jump limit)
        # accepted, not passed by the ack yet: seq -> event_digest of the accepted event, or None when not compared
        self.pending: dict[int, int | None] = {}
        self.confirmed: RangeMap[bool] = RangeMap()  # confirmed above the ack
        self.given_up: RangeMap[bool] = RangeMap()  # given up, never accepted
        self.recent_seqs: array[int] | None = None
        self.recent_digests: array[int] | None = None
        # given-up seqs accepted late whose late record the gateway has not labelled yet (take_given_up)
        self.late_given_up: set[int] | None = None


class DeliveryTracker:
    def __init__(self, max_seq_jump: int = DEFAULT_MAX_SEQ_JUMP,
                 max_given_up_seqs: int = DEFAULT_MAX_GIVEN_UP_SEQS, digests: EventDigestsCore | None = None) -> None:
        self.max_seq_jump = max_seq_jump
        # digests: every digest of this tracker by that definition (the verdicts are the same, the values not).
        self._digests = digests
        self._event_digest = event_digest if digests is None else digests.event_digest
        self.max_given_up_seqs = max_given_up_seqs
        self._progress: dict[tuple[str, str], _StreamProgress] = {}
        # Compacted entries of freed sources: (source, stream) -> acked_through, nothing else (see compact).
        self._floors: dict[tuple[str, str], int] = {}

    def _get(self, source_id: str, stream: str) -> _StreamProgress:
        progress = self._progress.get((source_id, stream))
        if progress is None:
            # Sources number from 0 (the reorderer starts there too) unless resume() said otherwise: starting
            # at the first seq seen would mistake early-sent, late-arriving seqs for duplicates. A compacted entry
            # comes back from its acked seq.
            floor = self._floors.pop((source_id, stream), _NO_SEQ) if self._floors else _NO_SEQ
            progress = self._progress[(source_id, stream)] = _StreamProgress(floor)
        return progress

    def compact(self, source_id: str, streams: tuple[str, ...] | list[str]) -> None:
        """The source was freed (rule 11): of each stream's entry with nothing above its ack (nothing unacked,
        confirmed ahead or given up ahead), keep the acked seq alone: a few dozen bytes instead of a 2 KiB ring
        and ranges. Entries with seqs above the ack stay whole (a delivery in flight still moves the ack)."""
        for stream in streams:
            key = (source_id, stream)
            progress = self._progress.get(key)
            if progress is None or progress.pending or progress.confirmed:
                continue
            given_up_hi = progress.given_up.last_hi()
            if given_up_hi is not None and given_up_hi > progress.acked_through:
                continue
            self._floors[key] = progress.acked_through
            del self._progress[key]

    def forget(self, source_id: str, streams: tuple[str, ...] | list[str]) -> None:
        """The source left the progress checkpoint of these streams (rule 6): drop its entries, compacted or whole,
        except one with unacked seqs (their delivery reports still need it)."""
        for stream in streams:
            key = (source_id, stream)
            self._floors.pop(key, None)
            progress = self._progress.get(key)
            if progress is not None and not progress.pending:
                del self._progress[key]

    def take_given_up(self, source_id: str, stream: str, seq: int) -> bool:
        """Whether ``seq`` was accepted as a given-up seq arriving late (once: the answer is forgotten). The
        reorderer remembers fewer given-up seqs than the tracker while the ack is held back (it keeps the newest
        ``max_skipped_tracked``, the tracker every one above the ack): the gateway labels such an event's late
        record ``late_after_skip`` by this, not by the reorderer's ``duplicate`` or ``before_start``."""
        progress = self._progress.get((source_id, stream))
        if progress is None or not progress.late_given_up or seq not in progress.late_given_up:
            return False
        progress.late_given_up.discard(seq)
        return True

    def footprint(self) -> tuple[int, int]:
        """(whole entries, compacted entries): what the tracker holds, for tests and metrics."""
        return len(self._progress), len(self._floors)

    def resume(self, source_id: str, stream: str, next_seq: int) -> None:
        """After a restart: everything below next_seq is already in Kafka (duplicates if resent)."""
        progress = self._progress.get((source_id, stream))
        if progress is None and (source_id, stream) not in self._floors:
            self._progress[(source_id, stream)] = _StreamProgress(next_seq - 1)
            return
        progress = self._get(source_id, stream)
        if progress.acked_through < next_seq - 1:
            progress.acked_through = next_seq - 1
            progress.highest = max(progress.highest, next_seq - 1)
            progress.pending = {s: e for s, e in progress.pending.items() if s >= next_seq}
            progress.confirmed.drop_below(next_seq)
            progress.given_up.drop_below(next_seq)

    def accept(self, source_id: str, stream: str, seq: int) -> bool:
        """``admit`` without a payload to compare: True if accepted, False for a duplicate (or a refused jump)."""
        return self.admit(source_id, stream, seq, None) is ACCEPTED

    def admit(self, source_id: str, stream: str, seq: int, event: tuple[int, Any] | None) -> Admission:
        """Register an event about to be published. ``event`` is its ``(source_ts_us, payload)``, compared with a
        later duplicate's (None: not compared). ACCEPTED, or DUPLICATE (the same event again), CONFLICT (the seq
        was accepted with another payload or timestamp), SEQ_JUMP (too far above this stream's seqs)."""
        progress = self._progress.get((source_id, stream))
        if progress is None:
            floor = self._floors.get((source_id, stream)) if self._floors else None
            if floor is not None and seq <= floor:
                return DUPLICATE  # a freed source's resend: its digests went with the compaction
            progress = self._get(source_id, stream)
        if seq > progress.acked_through:
            pending = progress.pending
            if seq in pending:
                known = pending[seq]
                if known is None or event is None or known == self._event_digest(*event):
                    return DUPLICATE
                return CONFLICT
            if seq > progress.highest:
                # The first seq of a stream the gateway has no progress for is accepted however high: a long-lived
                # source that left the checkpoint (source_retention, a new deployment) resumes at its own seq, and
                # the seqs below it cost one given-up range. The limit is for the jumps after it.
                if (progress.highest != _NO_SEQ
                        and seq - max(progress.highest, progress.acked_through) > self.max_seq_jump):
                    return SEQ_JUMP
                progress.highest = seq
            elif progress.given_up and progress.given_up.pop(seq) is not None:
                self._note_late_given_up(progress, seq)  # a given-up seq above the ack, arriving after all
            pending[seq] = None if event is None else self._event_digest(*event)
            return ACCEPTED
        if progress.given_up and progress.given_up.pop(seq) is not None:
            # Given up, the ack passed it, and here it is: published once, on the late topic.
            self._note_late_given_up(progress, seq)
            if event is not None:
                self._remember(progress, seq, self._event_digest(*event))
            return ACCEPTED
        digests = progress.recent_digests
        if event is not None and digests is not None:
            assert progress.recent_seqs is not None
            slot = seq % RECENT_ACKED_DIGESTS
            if progress.recent_seqs[slot] == seq and digests[slot] != self._event_digest(*event):
                return CONFLICT
        return DUPLICATE

    def admit_frame(self, source_id: str, events: Sequence[FrameEvent]) -> list[Admission] | None:
        """``admit`` for each event of a frame, in order, each compared by its ``(source_ts_us, payload)``: the same
        admissions and the same state as those calls. None when every event was accepted (the usual frame).

        A seq above everything its stream accepted, given up or acked, within the jump limit, is accepted here
        without the call (the usual event: the next seq); any other goes through ``admit`` itself."""
        if self._digests is not None:
            return self._admit_frame_runs(source_id, events, self._digests)
        admissions: list[Admission] | None = None
        stream: str | None = None
        progress: _StreamProgress | None = None
        max_seq_jump = self.max_seq_jump
        for index, event in enumerate(events):
            if event.stream != stream:
                stream = event.stream
                progress = self._progress.get((source_id, stream))
            seq = event.seq
            in_order = False
            if progress is not None:
                highest, acked = progress.highest, progress.acked_through
                top = highest if highest > acked else acked
                in_order = (seq > top and seq not in progress.pending
                            and (highest == _NO_SEQ or seq - top <= max_seq_jump))
            if in_order:
                assert progress is not None
                progress.highest = seq
                try:  # event_digest, inline (its fallback when orjson refuses the payload)
                    digest = hash((event.source_ts_us, orjson.dumps(event.payload, option=orjson.OPT_SORT_KEYS)))
                except TypeError:
                    digest = event_digest(event.source_ts_us, event.payload)
                progress.pending[seq] = digest
                admission: Admission = ACCEPTED
            else:
                admission = self.admit(source_id, event.stream, seq, (event.source_ts_us, event.payload))
                progress = self._progress.get((source_id, event.stream))  # admit may have made it
            if admissions is None and admission is not ACCEPTED:
                admissions = [ACCEPTED] * index
            if admissions is not None:
                admissions.append(admission)
        return admissions

    def _admit_frame_runs(self, source_id: str, events: Sequence[FrameEvent],
                          digests: EventDigestsCore) -> list[Admission] | None:
        """``admit_frame`` with the other digests: each run of the inline path in one ``admit_run`` call."""
        admissions: list[Admission] | None = None
        index, count = 0, len(events)
        max_seq_jump = self.max_seq_jump
        while index < count:
            event = events[index]
            progress = self._progress.get((source_id, event.stream))
            if progress is not None:
                taken, progress.highest = digests.admit_run(events, index, event.stream, progress.pending,
                                                            progress.highest, progress.acked_through, max_seq_jump)
                if taken > index:
                    if admissions is not None:
                        admissions += [ACCEPTED] * (taken - index)
                    index = taken
                    continue
            admission = self.admit(source_id, event.stream, event.seq, (event.source_ts_us, event.payload))
            if admissions is None and admission is not ACCEPTED:
                admissions = [ACCEPTED] * index
            if admissions is not None:
                admissions.append(admission)
            index += 1
        return admissions

    def confirmed(self, source_id: str, stream: str, seq: int) -> int | None:
        """Kafka confirmed one event; returns the new cumulative ack if it advanced, else None."""
        progress = self._progress.get((source_id, stream))
        if progress is None:
            return None  # compacted (nothing was unacked): a given-up seq's late record, the ack passed it
        acked = progress.acked_through
        if seq <= acked:
            return None  # a given-up seq published late: the ack passed it already
        given_up_hi = progress.given_up.last_hi()
        if seq == acked + 1 and not progress.confirmed and (given_up_hi is None or given_up_hi <= seq):
            # In order, nothing settled above it (the usual case): the ack moves by one.
            progress.acked_through = seq
            digest = progress.pending.pop(seq, None)
            if digest is not None:
                self._remember(progress, seq, digest)
            return seq
        progress.confirmed.add(seq, seq, True)
        return self._advance(progress)

    def confirmed_run(self, source_id: str, stream: str, first_seq: int,
                      last_seq: int) -> tuple[int, int] | None:
        """``confirmed`` for each seq of ``first_seq..last_seq``, in order, with the same state: None when none of
        those calls moved the ack, else (the first seq whose call moved it, the last ack they returned). A run right
        above the ack with nothing settled above it (a transaction's events of one source, the usual case) moves
        the ack in one step, as those calls would one seq at a time."""
        if last_seq < first_seq:
            return None
        progress = self._progress.get((source_id, stream))
        if progress is not None and first_seq == progress.acked_through + 1 and not progress.confirmed:
            given_up_hi = progress.given_up.last_hi()
            if given_up_hi is None or given_up_hi <= first_seq:
                # confirmed's in-order branch for every seq of the run: nothing it reads changes along the run.
                if self._digests is not None and last_seq <= _MAX_NATIVE_SEQ:
                    self._confirm_in_order_natively(progress, first_seq, last_seq, self._digests)
                    return first_seq, last_seq
                pending = progress.pending
                ring_seqs, ring_digests = progress.recent_seqs, progress.recent_digests
                for seq in range(first_seq, last_seq + 1):
                    digest = pending.pop(seq, None)
                    if digest is not None:
                        if ring_seqs is None or ring_digests is None:
                            self._remember(progress, seq, digest)
                            ring_seqs, ring_digests = progress.recent_seqs, progress.recent_digests
                            continue
                        slot = seq % RECENT_ACKED_DIGESTS
                        ring_seqs[slot] = seq
                        ring_digests[slot] = digest
                progress.acked_through = last_seq
                return first_seq, last_seq
        result: tuple[int, int] | None = None
        for seq in range(first_seq, last_seq + 1):
            acked = self.confirmed(source_id, stream, seq)
            if acked is not None:
                result = (seq if result is None else result[0], acked)
        return result

    def _confirm_in_order_natively(self, progress: _StreamProgress, first_seq: int, last_seq: int,
                                   digests: EventDigestsCore) -> None:
        """``confirmed_run``'s in-order loop in ``EventDigests.confirm_run`` calls: it does the seqs whose digests it
        can write to the ring, and hands back the first it cannot (no ring yet), which ``_remember`` takes."""
        seq = first_seq
        while seq <= last_seq:
            stopped = digests.confirm_run(progress.pending, progress.recent_seqs, progress.recent_digests, seq,
                                          last_seq)
            if stopped is None:
                break
            seq, digest = stopped
            self._remember(progress, seq, digest)
            seq += 1
        progress.acked_through = last_seq

    def give_up(self, source_id: str, stream: str, first_seq: int,
                last_seq: int) -> tuple[list[tuple[int, int]], int | None]:
        """The gateway stopped waiting for ``first_seq..last_seq`` (its reorderer skipped them): the ack may pass
        them. Seqs of the range already accepted (events held by rule 9 of gateway/ingest.py) are not given up.
        Returns the runs of seqs given up, lowest first, and the new cumulative ack if it advanced, else None."""
        progress = self._get(source_id, stream)
        lo = max(first_seq, progress.acked_through + 1)
        if lo > last_seq:
            return [], None
        pending = progress.pending
        if len(pending) < last_seq - lo + 1:
            taken = sorted(s for s in pending if lo <= s <= last_seq)
        else:
            taken = [s for s in range(lo, last_seq + 1) if s in pending]
        runs: list[tuple[int, int]] = []
        for seq in [*taken, last_seq + 1]:
            if lo <= seq - 1:
                runs.append((lo, seq - 1))
            lo = seq + 1
        for run_lo, run_hi in runs:
            progress.given_up.add(run_lo, run_hi, True)
        progress.highest = max(progress.highest, last_seq)
        return runs, self._advance(progress)

    def failed(self, source_id: str, stream: str, seq: int) -> None:
        """Kafka refused the event: forget it so the client's resend is accepted again."""
        progress = self._progress.get((source_id, stream))
        if progress is None:
            return  # compacted: a given-up seq's late record, its given-up seqs forgotten with the compaction
        progress.pending.pop(seq, None)
        if seq <= progress.acked_through:
            progress.given_up.add(seq, seq, True)  # a given-up seq's late record: its resend is accepted again

    def acked_through(self, source_id: str, stream: str) -> int | None:
        progress = self._progress.get((source_id, stream))
        if progress is None:
            return self._floors.get((source_id, stream)) if self._floors else None
        return progress.acked_through

    def unacked(self, source_id: str, stream: str) -> int:
        """Accepted seqs the ack has not passed yet."""
        progress = self._progress.get((source_id, stream))
        return 0 if progress is None else len(progress.pending)

    def ranges(self, source_id: str, stream: str) -> int:
        """Ranges held (confirmed above the ack, given up): the per-stream state beyond the unacked window."""
        progress = self._progress.get((source_id, stream))
        return 0 if progress is None else len(progress.confirmed) + len(progress.given_up)

    # -- internals ----------------------------------------------------------------------------------------------

    def _advance(self, progress: _StreamProgress) -> int | None:
        start = acked = progress.acked_through
        confirmed, given_up, pending = progress.confirmed, progress.given_up, progress.pending
        while True:
            head = confirmed.first()
            if head is not None and head[0] == acked + 1:
                hi = head[1]
                confirmed.pop_range(head[0], hi)
                # Only the newest RECENT_ACKED_DIGESTS seqs stay in the ring: older digests are dropped.
                ring_from = hi - RECENT_ACKED_DIGESTS + 1
                for seq in range(acked + 1, hi + 1):
                    digest = pending.pop(seq, None)
                    if digest is not None and seq >= ring_from:
                        self._remember(progress, seq, digest)
                acked = hi
                continue
            if given_up:
                span = given_up.span(acked + 1)
                if span is not None:
                    acked = span[1]
                    continue
            break
        progress.acked_through = acked
        # Given-up seqs the ack passed are kept for their one late acceptance, within bounds: the newest
        # max_given_up_seqs (as the reorderer keeps its skipped seqs), in at most MAX_GIVEN_UP_RANGES ranges.
        while len(given_up) > MAX_GIVEN_UP_RANGES or given_up.count > self.max_given_up_seqs:
            first = given_up.first()
            assert first is not None
            lo, hi = first[0], min(first[1], acked)
            if lo > acked:
                break
            if len(given_up) <= MAX_GIVEN_UP_RANGES:
                hi = min(hi, lo + given_up.count - self.max_given_up_seqs - 1)
            given_up.pop_range(lo, hi)
        return acked if acked != start else None

    @staticmethod
    def _note_late_given_up(progress: _StreamProgress, seq: int) -> None:
        noted = progress.late_given_up
        if noted is None:
            noted = progress.late_given_up = set()
        elif len(noted) >= MAX_GIVEN_UP_RANGES:
            noted.pop()  # bounded: a record never labelled (refused, say) must not pile up; one unlabelled at worst
        noted.add(seq)

    @staticmethod
    def _remember(progress: _StreamProgress, seq: int, digest: int) -> None:
        seqs, digests = progress.recent_seqs, progress.recent_digests
        if seqs is None or digests is None:
            seqs = progress.recent_seqs = array("q", [_NO_SEQ]) * RECENT_ACKED_DIGESTS
            digests = progress.recent_digests = array("q", [0]) * RECENT_ACKED_DIGESTS
        slot = seq % RECENT_ACKED_DIGESTS
        seqs[slot] = seq
        digests[slot] = digest
