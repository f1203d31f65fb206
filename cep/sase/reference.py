"""Brute-force reference evaluator: the query's meaning, written independently of the engine.

It sees the whole stream at once (arrival order does not matter), tries every combination of positive events
and checks sequence order, window, predicates and negation directly from :class:`Query`'s elements and
predicates.  Exponential; for tests and small benchmark cross-checks only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from cep.lexer import COMPARISONS

from .events import SaseEvent
from .query import AttrRef, Predicate, Query

__all__ = ["reference_matches"]

def _value(side: AttrRef | Any, binding: dict[str, SaseEvent]) -> tuple[bool, Any]:
    if isinstance(side, AttrRef):
        ev = binding.get(side.alias)
        if ev is None or side.attr not in ev.attrs:
            return False, None
        return True, ev.attrs[side.attr]
    return True, side


def _holds(p: Predicate, binding: dict[str, SaseEvent]) -> bool | None:
    """True/False, or None when an element of the predicate is not bound."""
    for side in (p.left, p.right):
        if isinstance(side, AttrRef) and side.alias not in binding:
            return None
    ok_l, lv = _value(p.left, binding)
    ok_r, rv = _value(p.right, binding)
    if not (ok_l and ok_r):
        return False
    try:
        return bool(COMPARISONS[p.op](lv, rv))
    except TypeError:
        return False


def _with_transitive_equalities(query: Query) -> list[Predicate]:
    """Equalities are transitive: ``a.id = c.id AND c.id = b.id`` also means ``a.id = b.id``, which matters
    when ``c`` is negated and therefore usually unbound."""
    preds = list(query.predicates)
    eq = {(p.left, p.right) for p in preds if p.op == "=" and isinstance(p.right, AttrRef)}
    eq |= {(b, a) for a, b in eq}
    changed = True
    while changed:
        changed = False
        for a, b in list(eq):
            for c, d in list(eq):
                if b == c and a != d and (a, d) not in eq:
                    eq.add((a, d))
                    changed = True
    preds.extend(Predicate(a, "=", b) for a, b in sorted(eq, key=str))
    return preds


def reference_matches(query: Query, events: Iterable[SaseEvent]) -> list[tuple[SaseEvent, ...]]:
    """All result sequences of ``query`` over ``events``, sorted by their timestamps."""
    stream = sorted(events, key=lambda e: e.ts)
    predicates = _with_transitive_equalities(query)
    positives = [e for e in query.elements if not e.negated]
    w = query.window
    out: list[tuple[SaseEvent, ...]] = []

    def consistent(binding: dict[str, SaseEvent]) -> bool:
        return all(_holds(p, binding) is not False for p in predicates)

    def negated(binding: dict[str, SaseEvent], chosen: list[SaseEvent]) -> bool:
        pos_index = 0
        for el in query.elements:
            if not el.negated:
                pos_index += 1
                continue
            lo = chosen[pos_index - 1].ts if pos_index > 0 else chosen[-1].ts - w
            hi = chosen[pos_index].ts if pos_index < len(chosen) else chosen[0].ts + w
            for c in stream:
                if c.event_type != el.event_type or not lo < c.ts < hi:
                    continue
                trial = dict(binding)
                trial[el.alias] = c
                if all(_holds(p, trial) is not False for p in predicates):
                    return True
        return False

    def extend(i: int, binding: dict[str, SaseEvent], chosen: list[SaseEvent]) -> None:
        if i == len(positives):
            if not negated(binding, chosen):
                out.append(tuple(chosen))
            return
        el = positives[i]
        for e in stream:
            if e.event_type != el.event_type:
                continue
            if chosen and (e.ts <= chosen[-1].ts or e.ts - chosen[0].ts >= w):
                continue
            binding[el.alias] = e
            if consistent(binding):
                chosen.append(e)
                extend(i + 1, binding, chosen)
                chosen.pop()
            del binding[el.alias]

    extend(0, {}, [])
    return out
