"""Finite automata over a refined alphabet (symbols are ints 0..n-1): the construction recipe of Li 2010, §3.2.2-3.2.3.

* :func:`regex_dfa`: Glushkov (position) automaton of a constraint AST, then the subset construction;
* :func:`nfa_to_dfa`: the subset construction for any NFA given as a successor function (the query automaton);
* :func:`minimize`: Moore partition refinement from a given initial partition.  Keyed by ``accepting`` it is the
  ordinary minimisation; keyed by ``(accepting, constraint state)`` it is the *specialised* minimisation of
  §3.2.3, after which every product state maps to exactly one constraint state (Thm 3.3);
* :func:`trim` (keep states that are reachable and co-reachable), :func:`complete` (add a dead sink),
  :func:`product` (the cross product ``τ_∩~`` of a partial τ_C and a complete τ_Q);
* :func:`derivatives_equal`: ``D_p = D_q`` for a product state p and a constraint state q (Thm 3.2's test).

A :class:`Dfa` is partial: a missing transition means "no accepting continuation" only after :func:`trim`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from .regex import Alt, Cat, Node, Opt, Plus, Star, Sym

__all__ = [
    "Dfa",
    "complete",
    "derivatives_equal",
    "derivatives_equal_via_query",
    "minimize",
    "nfa_to_dfa",
    "product",
    "regex_dfa",
    "trim",
]


@dataclass(slots=True)
class Dfa:
    """States 0..n-1, start state 0; ``delta[s]`` maps a symbol to the next state (absent: undefined).

    ``origin[s]`` says what a state stands for (a product pair, a set of merged states...) for tests and docs."""

    n_symbols: int
    delta: list[dict[int, int]]
    accepting: list[bool]
    origin: list[Hashable] = field(default_factory=list)

    @property
    def n_states(self) -> int:
        return len(self.delta)

    def run(self, word: Iterable[int], state: int = 0) -> int:
        """The state after ``word`` from ``state``, or -1 when a transition is undefined."""
        for a in word:
            nxt = self.delta[state].get(a)
            if nxt is None:
                return -1
            state = nxt
        return state

    def accepts(self, word: Iterable[int]) -> bool:
        s = self.run(word)
        return s >= 0 and self.accepting[s]

    def is_empty(self) -> bool:
        return not self.delta or not any(self.accepting[s] for s in _reachable(self))


def _reachable(d: Dfa) -> list[int]:
    if not d.delta:
        return []
    seen = {0}
    order = [0]
    queue = deque([0])
    while queue:
        s = queue.popleft()
        for a in sorted(d.delta[s]):
            t = d.delta[s][a]
            if t not in seen:
                seen.add(t)
                order.append(t)
                queue.append(t)
    return order


def _relabel(d: Dfa, keep: Sequence[int]) -> Dfa:
    """The sub-automaton on ``keep`` (keep[0] must be the start), states renumbered in that order."""
    new = {old: i for i, old in enumerate(keep)}
    delta = [{a: new[t] for a, t in sorted(d.delta[s].items()) if t in new} for s in keep]
    origin: list[Hashable] = [d.origin[s] for s in keep] if d.origin else list(keep)
    return Dfa(d.n_symbols, delta, [d.accepting[s] for s in keep], origin)


def trim(d: Dfa) -> Dfa:
    """Keep only states that are reachable from the start and from which an accepting state is reachable.

    The result has zero states when the language is empty.  After trimming, an undefined transition means the
    word has left the set of prefixes of the language (Thm 3.1 relies on this)."""
    reach = _reachable(d)
    if not reach:
        return Dfa(d.n_symbols, [], [], [])
    reverse: dict[int, set[int]] = {}
    for s in reach:
        for t in d.delta[s].values():
            reverse.setdefault(t, set()).add(s)
    live = {s for s in reach if d.accepting[s]}
    queue = deque(live)
    while queue:
        t = queue.popleft()
        for s in reverse.get(t, ()):
            if s not in live:
                live.add(s)
                queue.append(s)
    if 0 not in live:
        return Dfa(d.n_symbols, [], [], [])
    return _relabel(d, [s for s in reach if s in live])


def complete(d: Dfa) -> Dfa:
    """Add a non-accepting sink for every undefined transition (no change when already complete)."""
    if d.delta and all(len(row) == d.n_symbols for row in d.delta):
        return d
    sink = d.n_states
    delta = [{a: row.get(a, sink) for a in range(d.n_symbols)} for row in d.delta]
    delta.append({a: sink for a in range(d.n_symbols)})
    origin = [*(d.origin or range(d.n_states)), "dead"]
    return Dfa(d.n_symbols, delta, [*d.accepting, False], origin)


def minimize(d: Dfa, key: Callable[[int], Hashable] | None = None) -> tuple[Dfa, list[int]]:
    """Moore refinement starting from the partition by ``key(state)`` (default: accepting or not).

    Returns the quotient automaton (start state 0, states in BFS order) and the block of every old state.
    An undefined transition counts as a transition to an implicit dead state, so a trimmed partial DFA stays
    trimmed.  Two states end in one block iff they have the same key and, symbol by symbol, their successors
    are in one block (or both undefined): for key = accepting this is language equivalence."""
    if not d.delta:
        return d, []
    reach = _reachable(d)
    k = key if key is not None else (lambda s: d.accepting[s])
    ids: dict[Hashable, int] = {}
    block = {s: ids.setdefault(k(s), len(ids)) for s in reach}
    n_blocks = len(ids)
    while True:
        sig_ids: dict[tuple[int, tuple[int, ...]], int] = {}
        new_block = {}
        for s in reach:
            row = d.delta[s]
            sig = (block[s], tuple(block[row[a]] if a in row else -1 for a in range(d.n_symbols)))
            new_block[s] = sig_ids.setdefault(sig, len(sig_ids))
        if len(sig_ids) == n_blocks:
            break
        block, n_blocks = new_block, len(sig_ids)
    # Renumber blocks in BFS order from the start so the quotient's start state is 0.
    order: list[int] = []
    rep: dict[int, int] = {}
    for s in reach:
        if block[s] not in rep:
            rep[block[s]] = s
            order.append(block[s])
    number = {b: i for i, b in enumerate(order)}
    delta = [{a: number[block[t]] for a, t in sorted(d.delta[rep[b]].items())} for b in order]
    members: dict[int, list[Hashable]] = {}
    for s in reach:
        members.setdefault(number[block[s]], []).append(d.origin[s] if d.origin else s)
    origin: list[Hashable] = [tuple(members[i]) for i in range(len(order))]
    mapping = [number[block[s]] if s in block else -1 for s in range(d.n_states)]
    return Dfa(d.n_symbols, delta, [d.accepting[rep[b]] for b in order], origin), mapping


_State = TypeVar("_State", bound=Hashable)


def _explore(
    start: _State, moves: Callable[[_State], Iterable[tuple[int, _State]]]
) -> tuple[list[_State], list[dict[int, int]]]:
    """The states reachable from ``start`` through ``moves`` (symbol, next state), numbered in breadth-first order
    of discovery (``start`` is 0), and each one's transitions by number."""
    index = {start: 0}
    states = [start]
    delta: list[dict[int, int]] = [{}]
    queue = deque([start])
    while queue:
        s = queue.popleft()
        row = delta[index[s]]
        for a, t in moves(s):
            if t not in index:
                index[t] = len(states)
                states.append(t)
                delta.append({})
                queue.append(t)
            row[a] = index[t]
    return states, delta


def nfa_to_dfa(
    n_symbols: int,
    start: frozenset[int],
    successors: Callable[[frozenset[int], int], frozenset[int]],
    accepting: Callable[[frozenset[int]], bool],
) -> Dfa:
    """Subset construction; the empty set is not a state (its transitions stay undefined)."""
    sets, delta = _explore(start, lambda s: ((a, t) for a in range(n_symbols) for t in (successors(s, a),) if t))
    origin: list[Hashable] = [tuple(sorted(s)) for s in sets]
    return Dfa(n_symbols, delta, [accepting(s) for s in sets], origin)


def regex_dfa(node: Node, n_symbols: int, resolve: Callable[[Sym], frozenset[int]]) -> Dfa:
    """DFA of a constraint AST via the Glushkov automaton; ``resolve`` gives the refined symbols of a Sym.

    Glushkov: one NFA state per symbol occurrence ("position") plus a start state; position p is reached on
    any symbol of its class from the start (p in first) or from q (p in follow(q)); final positions are ``last``
    (and the start when the expression accepts the empty word).  No epsilon moves, so the subset construction
    is direct."""
    classes: list[frozenset[int]] = []
    follow: list[set[int]] = []

    def walk(n: Node) -> tuple[bool, set[int], set[int]]:
        """(nullable, first, last) of a subexpression; fills follow as a side effect."""
        if isinstance(n, Sym):
            p = len(classes)
            classes.append(resolve(n))
            follow.append(set())
            return False, {p}, {p}
        if isinstance(n, Cat):
            nullable, first, last = walk(n.parts[0])
            for part in n.parts[1:]:
                n2, f2, l2 = walk(part)
                for q in last:
                    follow[q] |= f2
                first = first | f2 if nullable else first
                last = last | l2 if n2 else l2
                nullable = nullable and n2
            return nullable, first, last
        if isinstance(n, Alt):
            nullable, first, last = False, set(), set()
            for opt in n.options:
                n2, f2, l2 = walk(opt)
                nullable, first, last = nullable or n2, first | f2, last | l2
            return nullable, first, last
        nullable, first, last = walk(n.inner)
        if isinstance(n, Star | Plus):
            for q in last:
                follow[q] |= first
        return nullable or isinstance(n, Star | Opt), first, last

    nullable, first, last = walk(node)
    start_pos = -1

    def successors(state: frozenset[int], a: int) -> frozenset[int]:
        out: set[int] = set()
        for q in state:
            for p in first if q == start_pos else follow[q]:
                if a in classes[p]:
                    out.add(p)
        return frozenset(out)

    def is_accepting(state: frozenset[int]) -> bool:
        return bool(state & last) or (nullable and start_pos in state)

    return nfa_to_dfa(n_symbols, frozenset({start_pos}), successors, is_accepting)


def product(c: Dfa, q: Dfa) -> Dfa:
    """Cross product of a (partial, trimmed) τ_C and a complete τ_Q: states (s_C, s_Q) reachable from (0, 0);
    accepting iff both are.  ``origin[s]`` is the pair.  Not trimmed: call :func:`trim`."""
    if not c.delta:
        return Dfa(c.n_symbols, [], [], [])
    pairs, delta = _explore((0, 0), lambda s: ((a, (tc, q.delta[s[1]][a])) for a, tc in sorted(c.delta[s[0]].items())))
    origin: list[Hashable] = list(pairs)
    return Dfa(c.n_symbols, delta, [c.accepting[a] and q.accepting[b] for a, b in pairs], origin)


def derivatives_equal(inter: Dfa, p: int, cons: Dfa, q: int) -> bool:
    """``D_p = D_q``: every continuation that τ_C accepts from q, τ_∩ also accepts from p.

    D_p ⊆ D_q always holds (τ_∩ accepts L(C) ∩ L(Q)), so equality fails iff some pair (q', p') reachable by one
    word has q' accepting and p' undefined or not accepting.  BFS over pairs: O(|τ_C|·|τ_∩|·|Σ|)."""
    seen = {(q, p)}
    queue = deque([(q, p)])
    while queue:
        sq, sp = queue.popleft()
        if cons.accepting[sq] and (sp < 0 or not inter.accepting[sp]):
            return False
        for a, tq in cons.delta[sq].items():
            tp = inter.delta[sp].get(a, -1) if sp >= 0 else -1
            if (tq, tp) not in seen:
                seen.add((tq, tp))
                queue.append((tq, tp))
    return True


def derivatives_equal_via_query(cons: Dfa, q: int, query: Dfa, s: int) -> bool:
    """The note's form of the same test, for a product state p = (q, s): BFS over pairs (q', s') from (q, s) with
    the trimmed τ_C and the *complete* τ_Q; D_p = D_q iff no reached pair has q' accepting and s' not accepting.
    Cost O(|τ_C|·|τ_Q|·|Σ|).  Equal to :func:`derivatives_equal` on τ_∩ (tested); kept as the cross-check."""
    seen = {(q, s)}
    queue = deque([(q, s)])
    while queue:
        sq, ss = queue.popleft()
        if cons.accepting[sq] and not query.accepting[ss]:
            return False
        for a, tq in cons.delta[sq].items():
            nxt = (tq, query.delta[ss][a])
            if nxt not in seen:
                seen.add(nxt)
                queue.append(nxt)
    return True
