"""Cumulative acknowledgements per (source, stream), sans-IO.

The gateway acks seq N only when Kafka has confirmed every accepted event of that source and stream up to N,
so a client may forget everything up to an ack. Sequences already accepted are reported as duplicates.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class _StreamProgress:
    acked_through: int  # highest seq such that everything from the first seq up to it is confirmed
    confirmed_above: set[int] = field(default_factory=set)
    accepted_above: set[int] = field(default_factory=set)


class DeliveryTracker:
    def __init__(self) -> None:
        self._progress: dict[tuple[str, str], _StreamProgress] = {}

    def resume(self, source_id: str, stream: str, next_seq: int) -> None:
        """After a restart: everything below next_seq is already in Kafka (duplicates if resent)."""
        progress = self._progress.get((source_id, stream))
        if progress is None:
            self._progress[(source_id, stream)] = _StreamProgress(acked_through=next_seq - 1)
        elif progress.acked_through < next_seq - 1:
            progress.acked_through = next_seq - 1
            progress.confirmed_above = {s for s in progress.confirmed_above if s >= next_seq}
            progress.accepted_above = {s for s in progress.accepted_above if s >= next_seq}

    def accept(self, source_id: str, stream: str, seq: int) -> bool:
        """Register an event about to be published; False if that seq was already accepted (a duplicate)."""
        progress = self._progress.get((source_id, stream))
        if progress is None:
            # Sources number from 0 (the reorderer starts there too) unless resume() said otherwise: starting
            # at the first seq seen would mistake early-sent, late-arriving seqs for duplicates.
            progress = _StreamProgress(acked_through=-1)
            self._progress[(source_id, stream)] = progress
        if seq <= progress.acked_through or seq in progress.accepted_above:
            return False
        progress.accepted_above.add(seq)
        return True

    def confirmed(self, source_id: str, stream: str, seq: int) -> int | None:
        """Kafka confirmed one event; returns the new cumulative ack if it advanced, else None."""
        progress = self._progress[(source_id, stream)]
        if seq == progress.acked_through + 1 and not progress.confirmed_above:
            # In order, nothing confirmed above it (the usual case): the ack moves by one.
            progress.acked_through = seq
            progress.accepted_above.discard(seq)
            return seq
        progress.confirmed_above.add(seq)
        start = progress.acked_through
        while progress.acked_through + 1 in progress.confirmed_above:
            progress.acked_through += 1
            progress.confirmed_above.discard(progress.acked_through)
            progress.accepted_above.discard(progress.acked_through)
        return progress.acked_through if progress.acked_through != start else None

    def failed(self, source_id: str, stream: str, seq: int) -> None:
        """Kafka refused the event: forget it so the client's resend is accepted again."""
        self._progress[(source_id, stream)].accepted_above.discard(seq)

    def acked_through(self, source_id: str, stream: str) -> int | None:
        progress = self._progress.get((source_id, stream))
        return None if progress is None else progress.acked_through
