"""The join's DFS order and the checks it evaluates (benchmarks/iseq_engine.py): an element an equality predicate
ties to a bound one is bound before one only a restriction links, and a restriction another one implies is not
evaluated again.  Neither may change a result: hand-computed join probes, and equality-keyed queries against the
brute-force reference for any arrival order within K, every indexing profile, both modes."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from dataclasses import asdict, replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.intervals import (
    Interval,
    IntervalBegin,
    IntervalEngine,
    IntervalEngineConfig,
    IntervalOutput,
    item_time_us,
    parse_iseq,
    reference_keys,
    reference_matches,
)
from cep.intervals.engine import IndexingProfile, Mode, _Entry
from cep.intervals.events import Item
from cep.intervals.metrics import net_results

PROFILES: list[IndexingProfile] = ["naive", "ais", "ibp"]
INDEXED: list[IndexingProfile] = ["ais", "ibp"]
MODES: list[Mode] = ["conservative", "aggressive"]
CHAIN = "EVENT ISEQ[a.te < b.ts AND b.te < c.ts](A a, B b, C c; {w}) WHERE a.id = b.id AND b.id = c.id"


@pytest.mark.parametrize(("indexing", "joins", "probes"), [("ais", 1, 7), ("ibp", 1, 7), ("naive", 8, 19)])
def test_the_join_binds_the_element_an_equality_ties_to_the_trigger_first(indexing: IndexingProfile, joins: int,
                                                                        probes: int) -> None:
    """Three As (ids 0-2), four Bs (ids 0-3), then c (id 0).  With an index only c triggers (a and b end strictly
    before a later element's start).  Bound next, b costs 4 probes (all Bs end before c starts), one passes
    b.id = c.id, then a costs 3 (all As end before b0 starts): 7.  Before, ais and ibp bound a next (the smaller
    buffer, tied to c only by the inferred a.te < c.ts): 3 As, each passing, times 4 Bs: 15.  The naive evaluator
    (unchanged: its fixed order follows the given atoms) joins at every arrival: nothing for the As (B is empty),
    3 As for each B (one passes a.id = b.id, then C is empty), and the same 7 for c: 19.  The key index is off
    here: with it, c probes only b0 and a0 whatever the order (test_the_key_index_probes_only_the_partners_key)."""
    engine = IntervalEngine(parse_iseq(CHAIN.format(w=100)), IntervalEngineConfig(indexing=indexing,
                                                                                    key_index=False))
    stream = [Interval("A", t, t, {"id": t - 1}, f"a{t - 1}") for t in (1, 2, 3)]
    stream += [Interval("B", t, t, {"id": t - 10}, f"b{t - 10}") for t in (10, 11, 12, 13)]
    stream.append(Interval("C", 20, 20, {"id": 0}, "c0"))
    out = engine.feed(stream)
    assert [(o.kind, [m.event_id for m in o.members]) for o in out] == [("match", ["a0", "b0", "c0"])]
    assert (engine.counters.joins, engine.counters.join_probes) == (joins, probes)


QUERIES = [
    (CHAIN.format(w=25), frozenset("ABC")),
    # the equality skips the middle element: from c, a is tied to c, b only restricted
    ("EVENT ISEQ[a.te < b.ts AND b.te < c.ts AND c.te < d.ts](A a, B b, C c, D d; 30) WHERE a.id = c.id "
     "AND b.id = d.id", frozenset("BD")),
    # overlapping elements (several essential checks per pair) and a negation keyed by the same attribute
    ("EVENT ISEQ[a overlaps b AND b.te <= c.te AND b.te < d.ts AND d.te < c.ts](A a, B b, !D d, C c; 30) "
     "WHERE a.id = c.id AND d.id = a.id", frozenset("ABD")),
]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Interval], int, int]:
    """A dense seeded stream with a few ids (hypothesis' own small-biased draws rarely build results)."""
    rng = random.Random(draw(st.integers(0, 2**32)))
    span = rng.choice([15, 30, 45])
    intervals = []
    for i in range(rng.randint(8, 30)):
        ts = rng.randint(0, span)
        intervals.append(Interval(rng.choice("ABCD"), ts, ts + rng.choice([0, 0, 1, 2, 4, 7]),
                                  {"id": rng.randint(0, 1)}, f"i{i}"))
    return intervals, rng.choice([0, 3, 10]), rng.randint(0, 2**31)


def arrival(intervals: list[Interval], punctuated: frozenset[str], k: int, seed: int) -> list[Item]:
    """IBPs of punctuated types at their start, intervals at their end, each delayed by at most K."""
    items: list[Item] = list(intervals)
    items += [IntervalBegin(i.event_type, i.start_ts_us, i.event_id or "", i.attrs)
              for i in intervals if i.event_type in punctuated]
    rng = random.Random(seed)
    keyed = [(item_time_us(it) + rng.randint(0, k), item_time_us(it), isinstance(it, Interval), rng.random(), it)
             for it in items]
    keyed.sort(key=lambda x: x[:4])
    return [x[4] for x in keyed]


@pytest.mark.parametrize("query_index", range(len(QUERIES)))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=streams())
def test_equality_keyed_joins_equal_the_reference(query_index: int, data: tuple[list[Interval], int, int]) -> None:
    intervals, k, seed = data
    text, punctuated = QUERIES[query_index]
    query = parse_iseq(text)
    expected = reference_keys(query, intervals)
    for indexing in PROFILES:
        for mode in ("conservative", "aggressive"):
            engine = IntervalEngine(query, IntervalEngineConfig(
                k_slack_us=k, mode=mode, indexing=indexing, punctuated_types=punctuated))
            out = engine.feed(arrival(intervals, punctuated, k, seed)) + engine.finish()
            assert not [o for o in out if o.kind == "too_late"]
            if mode == "conservative":
                assert sorted(o.key for o in out) == expected, indexing
            else:
                assert net_results(out) == Counter(expected), indexing


# -- the key index ------------------------------------------------------------------------------------------------
# Each element's buffer is indexed by the value of every attribute an "=" predicate ties to another positive
# element; a join probes only the entries with the bound partner's value.  The judge: the engine without the index
# (key_index=False, the join before it) gives the same records in the same order and the same counters except
# join_probes, and the brute-force reference the same results.


@pytest.mark.parametrize(("distinct_keys", "probes_indexed", "probes_scanned"),
                         [(1, 156, 156), (2, 42, 84), (3, 20, 60), (4, 12, 48), (6, 6, 36), (12, 2, 24)])
def test_the_key_index_probes_only_the_partners_key(distinct_keys: int, probes_indexed: int,
                                                   probes_scanned: int) -> None:
    """12 As (ends 1-12), 12 Bs (ends 20-31), ids ``i % k``, then c (id 0) at 50: only c triggers.  With n = 12/k
    entries per key: c probes B's run of id 0 (n entries, each passes), then for each b A's run of id 0 (n, all
    end before b starts): n + n^2.  Without the index, B's whole range (12), n pass b.id = c.id, each then A's whole
    range (12): 12 + 12n.  Per event (25 items) the indexed probes fall from 6.24 (one key) to 0.08 (12 keys)."""
    query = parse_iseq(CHAIN.format(w=100))
    stream = [Interval("A", t, t, {"id": t % distinct_keys}, f"a{t}") for t in range(1, 13)]
    stream += [Interval("B", t, t, {"id": t % distinct_keys}, f"b{t}") for t in range(20, 32)]
    stream.append(Interval("C", 50, 50, {"id": 0}, "c"))
    n = 12 // distinct_keys
    probes = {}
    for key_index in (True, False):
        engine = IntervalEngine(query, IntervalEngineConfig(indexing="ais", key_index=key_index))
        out = engine.feed(stream)
        assert len(out) == n * n == engine.counters.matches
        assert engine.counters.joins == 1
        probes[key_index] = engine.counters.join_probes
    assert (probes[True], probes[False]) == (probes_indexed, probes_scanned)


@pytest.mark.parametrize("ids", [
    # from c, B's buffer holds an unhashable set; from b, the probe value is that set and A's buffer is hashable
    ([frozenset({1}), 2], [{1}, 2], [frozenset({1}), 2]),
    # lists on every side
    ([[0], 2], [[0], 2], [[0], 2]),
])
def test_values_the_key_index_cannot_hash_are_still_joined(ids: tuple[list[Any], list[Any], list[Any]]) -> None:
    """A list or a set cannot be a dict key, and a set equals a frozenset: a probe with an unhashable value, or
    into a buffer holding one, scans the range instead of the index."""
    query = parse_iseq(CHAIN.format(w=100))
    stream = [Interval(t, base + i, base + i, {"id": v}, f"{t.lower()}{i}")
              for t, base, values in zip("ABC", (1, 10, 20), ids, strict=True) for i, v in enumerate(values)]
    expected = [["a0", "b0", "c0"], ["a1", "b1", "c1"]]
    assert [[m.event_id for m in r] for r in reference_matches(query, stream)] == expected
    for indexing in INDEXED:
        engine = IntervalEngine(query, IntervalEngineConfig(indexing=indexing))
        assert [[m.event_id for m in o.members] for o in engine.feed(stream)] == expected


def _index_snapshot(engine: IntervalEngine) -> dict[str, dict[str, tuple[list[list[str]], int]]]:
    """Alias -> attr -> (the uids of each run, in order; unhashable count), read from the engine's index (not by
    value: a run keeps the value object it was made with, and NaN after JSON is another object)."""
    return {a: {attr: (sorted([e.uid for e in run.entries] for run in runs.values()), buf.unhashable[attr])
                for attr, runs in buf.keys.items()} for a, buf in engine._buffers.items()}


def _assert_index_consistent(engine: IntervalEngine) -> None:
    """Every run holds exactly the buffer's filled entries with its value, in the buffer's order, with their
    sort keys; no run is empty; unhashable values are counted, not indexed.  A te-sorted buffer's start order
    holds the same entries, sorted on ts."""
    for buf in engine._buffers.values():
        if buf.endpoint == "te":
            assert sorted(map(id, buf.by_ts)) == sorted(map(id, buf.entries))
            assert buf.by_ts_vals == [e.ts for e in buf.by_ts] == sorted(buf.by_ts_vals)
            assert buf.min_ts == min((e.ts for e in buf.entries), default=math.inf)
        for attr, runs in buf.keys.items():
            expected: dict[Any, list[_Entry]] = {}
            unhashable = 0
            for e in buf.entries:
                if e.te is None or attr not in e.attrs:
                    continue
                try:
                    expected.setdefault(e.attrs[attr], []).append(e)
                except TypeError:
                    unhashable += 1
            assert {v: [id(e) for e in run.entries] for v, run in runs.items()} == {
                v: [id(e) for e in es] for v, es in expected.items()}
            for run in runs.values():
                assert run.vals == [e.ts if buf.endpoint == "ts" else e.te for e in run.entries]
            assert buf.unhashable[attr] == unhashable


ODD_IDS: list[Any] = [0, 1, 0.0, True, None, "1", [0], float("nan")]
"""Equal across types (0 == 0.0, 1 == True), unhashable ([0]), never equal to itself (nan), or missing (None:
the attribute is left out)."""


def _odd_stream(rng: random.Random) -> list[Interval]:
    span = rng.choice([15, 30, 45])
    intervals = []
    for i in range(rng.randint(8, 30)):
        ts = rng.randint(0, span)
        key = rng.choice(ODD_IDS) if rng.random() < 0.3 else rng.randint(0, 2)
        intervals.append(Interval(rng.choice("ABCD"), ts, ts + rng.choice([0, 0, 1, 2, 4, 7]),
                                  {} if key is None else {"id": key}, f"i{i}"))
    return intervals


def _records(out: list[IntervalOutput]) -> list[tuple[Any, ...]]:
    return [(o.kind, o.key, o.emitted_at_us, o.emitted_at_seq, o.last_member_seq, o.cause) for o in out]


def test_the_key_index_keeps_records_order_and_counters_and_stays_consistent() -> None:
    """Seeded streams through every equality-keyed query, both modes, ais and ibp, K in {0, 3, 10}, with ids that
    compare across types, cannot be hashed or are missing: after every item the index equals the one rebuilt from
    the buffers (window purge, cascading purge, immediate purge, IBP entries filled by their interval); the records
    (order included) and the counters but join_probes equal the engine without the index, and the results the
    reference.  At one cut per stream the state goes through a JSON snapshot into a fresh engine: its index is
    rebuilt equal, and it carries on with the same records."""
    totals: Counter[str] = Counter()
    for seed in range(40):
        rng = random.Random(seed)
        intervals = _odd_stream(rng)
        k = rng.choice([0, 3, 10])
        for text, punctuated in QUERIES:
            query = parse_iseq(text)
            expected = reference_keys(query, intervals)
            items = arrival(intervals, punctuated, k, seed)
            cut = rng.randrange(len(items) + 1)
            for indexing in INDEXED:
                for mode in MODES:
                    config = IntervalEngineConfig(k_slack_us=k, mode=mode, indexing=indexing,
                                                  punctuated_types=punctuated)
                    indexed = IntervalEngine(query, config)
                    scanned = IntervalEngine(query, replace(config, key_index=False))
                    out: list[IntervalOutput] = []
                    for i, item in enumerate(items):
                        if i == cut:
                            restored = IntervalEngine(query, config)
                            restored.import_state(json.loads(json.dumps(indexed.export_state())))
                            assert _index_snapshot(restored) == _index_snapshot(indexed)
                            indexed = restored
                        if isinstance(item, Interval) and any(
                                a in indexed._buffers for a in indexed._open.get(item.event_id or "", {})):
                            totals["ibp_entries_filled"] += 1
                        got = indexed.on_item(item)
                        assert _records(got) == _records(scanned.on_item(item))
                        _assert_index_consistent(indexed)
                        out += got
                    got = indexed.finish()
                    assert _records(got) == _records(scanned.finish())
                    out += got
                    assert asdict(indexed.counters) | {"join_probes": 0} == asdict(scanned.counters) | {
                        "join_probes": 0}
                    assert indexed.counters.join_probes <= scanned.counters.join_probes
                    if mode == "conservative":
                        assert sorted(o.key for o in out) == expected
                    else:
                        assert net_results(out) == Counter(expected)
                    totals.update({"window_purged": indexed.counters.window_purged,
                                   "cascade_purged": indexed.counters.cascade_purged,
                                   "immediate_purged": indexed.counters.immediate_purged,
                                   "results": len(expected), "saved_probes": scanned.counters.join_probes
                                   - indexed.counters.join_probes})
    # the seeds exercise what the test is about
    assert all(totals[name] > 0 for name in ("window_purged", "cascade_purged", "immediate_purged", "results",
                                              "saved_probes", "ibp_entries_filled")), totals
