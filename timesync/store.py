"""Source Information Store: the latest clock estimate of every source, read by the gateway.

The time-sync responder writes; the gateway (reorderer, window processor, pattern logic) reads.
All times are reference-clock microseconds.  Sign convention: ``t_ref = t_source + offset_us``
(see :mod:`timesync.estimator`).

One thread writes (the event loop: the time-sync responder). Another thread may read (the metrics thread's
/healthz): each read copies or looks up in one C-level step under the GIL, so it sees the store before or after a
write, never half of one; no lock, so that this core stays free of threads (tests/unit/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from timesync.estimator import ClockEstimate

__all__ = ["SourceInfo", "SourceInfoStore", "UnknownSourceError"]


class UnknownSourceError(KeyError):
    """The source never completed a time sync."""


@dataclass(frozen=True, slots=True)
class SourceInfo:
    """Everything the store knows about one source."""

    source_id: str
    estimate: ClockEstimate
    last_sync_us: int
    """Reference time at which the latest sample of this source was registered."""

    @property
    def offset_us(self) -> int:
        return self.estimate.offset_us

    @property
    def skew_ppm(self) -> float:
        return self.estimate.skew_ppm

    @property
    def rtt_us(self) -> int:
        return self.estimate.rtt_us

    @property
    def sample_count(self) -> int:
        return self.estimate.sample_count

    def error_bound_us(self, at_ref_us: int) -> int:
        return self.estimate.error_bound_us(at_ref_us)

    def to_reference_us(self, source_ts_us: int) -> int:
        return self.estimate.to_reference_us(source_ts_us)


Listener = Callable[[SourceInfo], None]


class SourceInfoStore:
    """Latest :class:`ClockEstimate` per source id."""

    def __init__(self) -> None:
        self._infos: dict[str, SourceInfo] = {}
        self._listeners: list[Listener] = []

    # -- writer side -----------------------------------------------------------------------------

    def update(self, source_id: str, estimate: ClockEstimate, last_sync_us: int) -> SourceInfo:
        """Record a new estimate, then call the listeners (on a copy of their list: one may unsubscribe)."""
        info = SourceInfo(source_id=source_id, estimate=estimate, last_sync_us=last_sync_us)
        self._infos[source_id] = info
        listeners = list(self._listeners)
        for listener in listeners:
            listener(info)
        return info

    def remove(self, source_id: str) -> None:
        self._infos.pop(source_id, None)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(info)`` after every update; returns a function that unsubscribes it."""
        self._listeners.append(listener)

        def unsubscribe() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return unsubscribe

    # -- reader side -----------------------------------------------------------------------------

    def get(self, source_id: str) -> SourceInfo | None:
        return self._infos.get(source_id)

    def __getitem__(self, source_id: str) -> SourceInfo:
        info = self.get(source_id)
        if info is None:
            raise UnknownSourceError(source_id)
        return info

    def __contains__(self, source_id: object) -> bool:
        return source_id in self._infos

    def __len__(self) -> int:
        return len(self._infos)

    def estimate(self, source_id: str) -> ClockEstimate | None:
        info = self.get(source_id)
        return None if info is None else info.estimate

    def last_sync_us(self, source_id: str) -> int | None:
        info = self.get(source_id)
        return None if info is None else info.last_sync_us

    def source_ids(self) -> list[str]:
        return sorted(self._infos)

    def live_entries(self) -> Mapping[str, SourceInfo]:
        """The entries themselves, not a copy: every update and removal shows in it at once. For a reader that
        looks sources up per event without a Python call (gateway.native.native_reference_mapping)."""
        return self._infos

    def snapshot(self) -> dict[str, SourceInfo]:
        """A consistent copy of all entries."""
        return dict(self._infos)

    def to_reference_us(self, source_id: str, source_ts_us: int) -> int:
        """Eq. 3.15 with skew; raises :class:`UnknownSourceError` for a source that never synced."""
        return self[source_id].to_reference_us(source_ts_us)

    def error_bound_us(self, source_id: str, at_ref_us: int) -> int:
        return self[source_id].error_bound_us(at_ref_us)

    def max_rtt_us(self, source_ids: Iterable[str] | None = None, default_us: int = 0) -> int:
        """``T_a`` (thesis Eq. 3.16): the largest selected round trip over ``source_ids``.

        ``None`` means every known source.  Sources without an estimate are skipped; if none of
        them has one, ``default_us`` is returned.
        """
        if source_ids is None:
            infos = list(self._infos.values())
        else:
            infos = [i for i in (self._infos.get(s) for s in source_ids) if i is not None]
        return max((i.estimate.rtt_us for i in infos), default=default_us)

    def max_error_bound_us(
        self, at_ref_us: int, source_ids: Iterable[str] | None = None, default_us: int = 0
    ) -> int:
        """The largest :meth:`ClockEstimate.error_bound_us` over the sources, at ``at_ref_us``."""
        if source_ids is None:
            infos = list(self._infos.values())
        else:
            infos = [i for i in (self._infos.get(s) for s in source_ids) if i is not None]
        return max((i.estimate.error_bound_us(at_ref_us) for i in infos), default=default_us)
