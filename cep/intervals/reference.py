"""Brute-force ISEQ evaluator: the definition (equation 5.1 plus negation and WHERE), nothing else.

It sees the complete stream at once (arrival order is irrelevant), enumerates every combination of intervals for
the positive elements and checks the given TList atoms, the strict window over the positives and the predicates,
then looks for a negating interval anywhere in the stream.  Exponential; for tests and benchmarks only.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from .events import Interval, result_key
from .query import IntervalQuery
from .relations import EndpointRef

__all__ = ["reference_keys", "reference_matches"]


def _values(binding: Mapping[str, Interval]) -> dict[EndpointRef, float]:
    out: dict[EndpointRef, float] = {}
    for alias, iv in binding.items():
        out[EndpointRef(alias, "ts")] = iv.start_ts_us
        out[EndpointRef(alias, "te")] = iv.end_ts_us
    return out


def reference_matches(query: IntervalQuery, intervals: Iterable[Interval]) -> list[tuple[Interval, ...]]:
    """Every result of ``query`` over the complete stream, members in the order of the positive elements."""
    stream = list(intervals)
    w = query.window_us
    candidates: list[list[Interval]] = []
    for alias in query.positives:
        etype = query.by_alias[alias].event_type
        preds = query.constant_predicates[alias]
        candidates.append([
            iv for iv in stream
            if iv.event_type == etype and iv.length_us < w and all(p.holds({alias: iv.attrs}) for p in preds)])
    out: list[tuple[Interval, ...]] = []
    for combo in itertools.product(*candidates):
        if len({id(c) for c in combo}) < len(combo):
            continue  # one interval plays one role (repeated types A1, A2 bind distinct intervals)
        binding = dict(zip(query.positives, combo, strict=True))
        if max(iv.end_ts_us for iv in combo) - min(iv.start_ts_us for iv in combo) >= w:
            continue
        values = _values(binding)
        if not all(c.holds(values) for c in query.positive_constraints):
            continue
        attrs: dict[str, Mapping[str, Any]] = {a: iv.attrs for a, iv in binding.items()}
        if not all(p.holds(attrs) for p in (*query.cross_predicates, *query.self_predicates)):
            continue
        if any(_negated(query, spec_index, binding, stream) for spec_index in range(len(query.negations))):
            continue
        out.append(combo)
    return out


def _negated(query: IntervalQuery, spec_index: int, binding: Mapping[str, Interval],
             stream: list[Interval]) -> bool:
    spec = query.negations[spec_index]
    for d in stream:
        if d.event_type != spec.event_type:
            continue
        full = {**binding, spec.alias: d}
        values = _values(full)
        attrs: dict[str, Mapping[str, Any]] = {a: iv.attrs for a, iv in full.items()}
        if all(c.holds(values) for c in spec.constraints) and all(
                p.holds(attrs) for p in (*spec.constant_predicates, *spec.cross_predicates)):
            return True
    return False


def reference_keys(query: IntervalQuery,
                   intervals: Iterable[Interval]) -> list[tuple[tuple[str, int, int, str | None], ...]]:
    """The results as sorted identity keys (see :attr:`IntervalOutput.key`)."""
    return sorted(result_key(m) for m in reference_matches(query, intervals))
