"""Constraint-aware early feedback (Li 2010, chapter 3, "E-Tec"): decide a SEQ query early on a trace that follows
a known workflow (a constraint: a regular expression over event types).

    from cep.constraints import ConstraintChecker, Verdict

    checker = ConstraintChecker("A+ K* B+ K C+", "SEQ(A, K, K, C)", algorithm="lightweight")
    trace = checker.new_trace()
    checker.step(trace, "A", {})   # Verdict.UNDECIDED
    checker.step(trace, "K", {})   # Verdict.SATISFIABLE: every legal continuation matches

Pure and synchronous: the automata are built once per (constraint, query); a trace's state is a few ints.
See ../shared/notes/intervals-and-constraints.md part 2 and docs/constraints.md.
"""

from .alphabet import Alphabet
from .automata import Dfa
from .checker import CheckerCounters, ConstraintChecker, TraceState, Verdict, query_dfa
from .pattern import PatternPosition, SequencePattern, parse_pattern
from .regex import Cond, ConstraintError, ConstraintSyntaxError, Sym, parse_constraint

__all__ = [
    "Alphabet",
    "CheckerCounters",
    "Cond",
    "ConstraintChecker",
    "ConstraintError",
    "ConstraintSyntaxError",
    "Dfa",
    "PatternPosition",
    "SequencePattern",
    "Sym",
    "TraceState",
    "Verdict",
    "parse_constraint",
    "parse_pattern",
    "query_dfa",
]
