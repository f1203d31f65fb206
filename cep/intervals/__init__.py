"""Interval events over out-of-order streams: Allen relations, ISEQ with endpoint constraints (Li 2010 ch. 5-6),
interval begin punctuation, K-ISlack, IO3's real-time compensations.  See docs/intervals.md.

    from cep.intervals import parse_iseq, IntervalEngine, IntervalEngineConfig, Interval

    query = parse_iseq("EVENT ISEQ[A^- < B^+ < C^+ < D^+](A, B, C, D; 30)")
    engine = IntervalEngine(query, IntervalEngineConfig(k_slack_us=0, indexing="ais"))
    outputs = engine.on_interval(Interval("B", 3, 6, event_id="b1"))
"""

from .engine import IndexingProfile, IntervalEngine, IntervalEngineConfig, IntervalEngineCounters, Mode
from .events import (
    Interval,
    IntervalBegin,
    IntervalError,
    IntervalOutput,
    IntervalSyntaxError,
    OutputKind,
    item_time_us,
    result_key,
)
from .metrics import Accuracy, Compensation, LatencyStats, accuracy, compensation, latency, net_results
from .pairing import EndpointPairer
from .parser import parse_iseq
from .points import PointToIntervalOperator, ThresholdLevels
from .query import AttrRef, Constraint, Element, IntervalQuery, Predicate, allen_constraints
from .reference import reference_keys, reference_matches
from .relations import ALLEN_RELATIONS, EndpointClosure, EndpointRef, allen_relations, holds

__all__ = [
    "ALLEN_RELATIONS",
    "Accuracy",
    "AttrRef",
    "Compensation",
    "Constraint",
    "Element",
    "EndpointClosure",
    "EndpointPairer",
    "EndpointRef",
    "IndexingProfile",
    "Interval",
    "IntervalBegin",
    "IntervalEngine",
    "IntervalEngineConfig",
    "IntervalEngineCounters",
    "IntervalError",
    "IntervalOutput",
    "IntervalQuery",
    "IntervalSyntaxError",
    "LatencyStats",
    "Mode",
    "OutputKind",
    "PointToIntervalOperator",
    "Predicate",
    "ThresholdLevels",
    "accuracy",
    "allen_constraints",
    "allen_relations",
    "compensation",
    "holds",
    "item_time_us",
    "latency",
    "net_results",
    "parse_iseq",
    "reference_keys",
    "reference_matches",
    "result_key",
]
