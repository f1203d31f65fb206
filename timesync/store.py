"""Source Information Store: the latest clock estimate of every source, read by the gateway.

The time-sync responder writes; the gateway (reorderer, window processor, pattern logic) reads.
All times are reference-clock microseconds.  Sign convention: ``t_ref = t_source + offset_us``
(see :mod:`timesync.estimator`).

The store is safe to use from several threads (a replay job may read it off the event loop);
every method holds one short lock, no callback runs under it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
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
        self._lock = threading.Lock()
        self._infos: dict[str, SourceInfo] = {}
        self._listeners: list[Listener] = []

    # -- writer side -----------------------------------------------------------------------------

    def update(self, source_id: str, estimate: ClockEstimate, last_sync_us: int) -> SourceInfo:
        """Record a new estimate; listeners are called after the lock is released."""
        info = SourceInfo(source_id=source_id, estimate=estimate, last_sync_us=last_sync_us)
        with self._lock:
            self._infos[source_id] = info
            listeners = list(self._listeners)
        for listener in listeners:
            listener(info)
        return info

    def remove(self, source_id: str) -> None:
        with self._lock:
            self._infos.pop(source_id, None)

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Call ``listener(info)`` after every update; returns a function that unsubscribes it."""
        with self._lock:
            self._listeners.append(listener)

        def unsubscribe() -> None:
            with self._lock:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return unsubscribe

    # -- reader side -----------------------------------------------------------------------------

    def get(self, source_id: str) -> SourceInfo | None:
        with self._lock:
            return self._infos.get(source_id)

    def __getitem__(self, source_id: str) -> SourceInfo:
        info = self.get(source_id)
        if info is None:
            raise UnknownSourceError(source_id)
        return info

    def __contains__(self, source_id: object) -> bool:
        with self._lock:
            return source_id in self._infos

    def __len__(self) -> int:
        with self._lock:
            return len(self._infos)

    def estimate(self, source_id: str) -> ClockEstimate | None:
        info = self.get(source_id)
        return None if info is None else info.estimate

    def last_sync_us(self, source_id: str) -> int | None:
        info = self.get(source_id)
        return None if info is None else info.last_sync_us

    def source_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._infos)

    def snapshot(self) -> dict[str, SourceInfo]:
        """A consistent copy of all entries."""
        with self._lock:
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
        with self._lock:
            if source_ids is None:
                infos = list(self._infos.values())
            else:
                infos = [i for i in (self._infos.get(s) for s in source_ids) if i is not None]
        return max((i.estimate.rtt_us for i in infos), default=default_us)

    def max_error_bound_us(
        self, at_ref_us: int, source_ids: Iterable[str] | None = None, default_us: int = 0
    ) -> int:
        """The largest :meth:`ClockEstimate.error_bound_us` over the sources, at ``at_ref_us``."""
        with self._lock:
            if source_ids is None:
                infos = list(self._infos.values())
            else:
                infos = [i for i in (self._infos.get(s) for s in source_ids) if i is not None]
        return max((i.estimate.error_bound_us(at_ref_us) for i in infos), default=default_us)
