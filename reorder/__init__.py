"""Order restoration for event streams: per-source sequence reordering, multi-source merging by
reference time with exact watermarks, the K-slack family of baselines, an oracle, traces and replay.

Pure and I/O-free (apart from trace files in :mod:`reorder.traces`); every component takes the
current time as an argument.  See docs/reorder.md.
"""

from reorder.clock import EstimateClock, FixedOffsetClock, IdentityClock, ReferenceClock
from reorder.kslack import AQKSlack, AQKSlackConfig, KSlack, MPKSlack
from reorder.merger import MergerConfig, MultiSourceMerger
from reorder.oracle import oracle_schedule
from reorder.records import GapSkipped, Late, Merged, Punctuation, Released, SourceEvent, SourceTimedOut
from reorder.sequence import SequenceConfig, SequenceReorderer

__all__ = [
    "AQKSlack",
    "AQKSlackConfig",
    "EstimateClock",
    "FixedOffsetClock",
    "GapSkipped",
    "IdentityClock",
    "KSlack",
    "Late",
    "MPKSlack",
    "Merged",
    "MergerConfig",
    "MultiSourceMerger",
    "Punctuation",
    "ReferenceClock",
    "Released",
    "SequenceConfig",
    "SequenceReorderer",
    "SourceEvent",
    "SourceTimedOut",
    "oracle_schedule",
]
