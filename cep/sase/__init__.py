"""SASE sequence queries over out-of-order event streams (Li et al. 2007; Li 2010, chapter 4).

    from cep.sase import parse_query, SequenceEngine, EngineConfig, SaseEvent

    query = parse_query("EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 1 hour")
    engine = SequenceEngine(query, EngineConfig(k_slack_us=2_000_000, mode="conservative"))
    outputs = engine.on_event(SaseEvent("SHELF", ts=12, attrs={"id": 1}, event_id="src|7"))

See docs/sase.md for the syntax and the semantics decisions, docs/constraints.md for constraint-aware execution
(``EngineConfig(constraint=...)``).
"""

from .ais import ActiveInstanceStacks, Instance
from .baseline import InOrderSequenceEngine
from .engine import TOO_LATE_REASON, EngineConfig, EngineCounters, SequenceEngine
from .events import OutputKind, SaseError, SaseEvent, SaseInputError, SaseOutput, SaseSyntaxError, VerdictOutput
from .parser import parse_query
from .query import AttrRef, Element, Predicate, Query, SeqBuilder, ref
from .reference import reference_matches

__all__ = [
    "TOO_LATE_REASON",
    "ActiveInstanceStacks",
    "AttrRef",
    "Element",
    "EngineConfig",
    "EngineCounters",
    "InOrderSequenceEngine",
    "Instance",
    "OutputKind",
    "Predicate",
    "Query",
    "SaseError",
    "SaseEvent",
    "SaseInputError",
    "SaseOutput",
    "SaseSyntaxError",
    "SeqBuilder",
    "SequenceEngine",
    "VerdictOutput",
    "parse_query",
    "ref",
    "reference_matches",
]
