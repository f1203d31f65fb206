"""NTP-compatible time sync: per-source offset, skew, RTT and error bound (docs/timesync.md).

Sign convention, everywhere in this package: ``t_ref = t_source + offset_us``.

The pure API is re-exported here; the asyncio shells live in :mod:`timesync.server` (gateway side)
and :mod:`timesync.client` (SDK side) and are imported from there, so that importing the estimator
never pulls in asyncio.
"""

from timesync.estimator import ClockEstimate, ClockEstimator, SyncSample
from timesync.store import SourceInfo, SourceInfoStore, UnknownSourceError

__all__ = [
    "ClockEstimate",
    "ClockEstimator",
    "SourceInfo",
    "SourceInfoStore",
    "SyncSample",
    "UnknownSourceError",
]
