"""Pure complex-event-processing cores: three-window assignment, uncertainty-aware patterns, the SASE engine.

``cep.windows`` / ``cep.three_window``: LOW/MIDDLE/HIGH time batch windows (thesis 003, Sec. 3.2.3.1);
``cep.patterns`` / ``cep.predicates``: sequence patterns with Confirmed/Uncertain confidence (Pseudocode 3.1);
``cep.sase``: the SASE engine.  Semantics and decisions: docs/cep.md.
"""

from cep.patterns import Confidence, Element, PatternMatch, PatternSpec, UncertainPatternMatcher, classify
from cep.three_window import FinalResult, LateEvent, ThreeWindowAggregator, WindowResult
from cep.windows import WindowSlot, WindowType, assign_sliding, assign_tumbling, final_release_time_us, release_time_us

__all__ = [
    "Confidence",
    "Element",
    "FinalResult",
    "LateEvent",
    "PatternMatch",
    "PatternSpec",
    "ThreeWindowAggregator",
    "UncertainPatternMatcher",
    "WindowResult",
    "WindowSlot",
    "WindowType",
    "assign_sliding",
    "assign_tumbling",
    "classify",
    "final_release_time_us",
    "release_time_us",
]
