"""SequenceEngine.on_event's fast path of the input checks (exact types: only the attribute checks run) rejects
exactly the events the full check (``_check``) rejects, for the same reason, and accepts the rest."""

from __future__ import annotations

from collections import Counter
from types import MappingProxyType
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from cep.sase import EngineConfig, SaseEvent, SequenceEngine, parse_query

QUERY = parse_query("EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id AND b.v > 2 WITHIN 10")


class Event(SaseEvent):
    """Not exactly a SaseEvent: the full check's path."""


class Attrs(dict[str, Any]):
    """Not exactly a dict."""


values = st.one_of(st.integers(-3, 3), st.text(max_size=2), st.lists(st.integers(), max_size=2),
                   st.dictionaries(st.text(max_size=1), st.integers(), max_size=1), st.none())
attrs = st.dictionaries(st.sampled_from(["id", "v", "w"]), values, max_size=3)
events = st.builds(
    lambda cls, event_type, ts, attrs, wrap: cls(event_type, ts, wrap(attrs)),
    st.sampled_from([SaseEvent, Event]), st.sampled_from(["A", "B", "C", "X"]),
    st.one_of(st.integers(0, 30), st.sampled_from([True, 1.5])),
    attrs, st.sampled_from([dict, Attrs, MappingProxyType]))


@settings(max_examples=300, deadline=None)
@given(st.lists(events, max_size=20))
def test_on_event_rejects_what_the_full_check_rejects(batch: list[SaseEvent]) -> None:
    engine = SequenceEngine(QUERY, EngineConfig(k_slack_us=5))
    checker = SequenceEngine(QUERY, EngineConfig(k_slack_us=5))
    expected = Counter(problem[0] for event in batch if (problem := checker._check(event)) is not None)
    for event in batch:
        engine.on_event(event)
    assert engine.counters.rejections == dict(expected)
    assert engine.counters.rejected == sum(expected.values())
    assert engine.counters.events == len(batch) - sum(expected.values())


def test_an_exactly_typed_event_with_a_bad_attribute_gets_the_full_checks_words() -> None:
    engine = SequenceEngine(QUERY, EngineConfig(strict=False))
    engine.on_event(SaseEvent("B", 1, {"id": 1}))
    engine.on_event(SaseEvent("A", 1, {"id": [1]}))
    engine.on_event(SaseEvent("C", 1, {"w": 1}))
    assert engine.counters.rejections == {"missing_attribute": 2, "unhashable_key": 1}
    assert engine.counters.events == 0
