"""Incremental snapshots of the SASE engine (``SequenceEngine.incremental_snapshot``, issue 27 item 2): the blob
re-encodes only the partition keys that changed since the previous one, and restores to exactly the state of a
full snapshot; an engine restored from it at any cut produces exactly the records of one never snapshotted.

The differential tests take an incremental snapshot after every single step (an event or a punctuation), so a
step that changes a partition without marking it (an append, a release, an expiry, a purge of a key that had no
new event, a constraint verdict) leaves a stale partition in the blob and fails them.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cep.sase import EngineConfig, SaseError, SaseEvent, SaseOutput, SequenceEngine, parse_query
from cep.sase import engine as engine_module

QUERIES = [
    "EVENT SEQ(A a, !(C c), B b) WHERE a.id = c.id AND c.id = b.id WITHIN 8",
    "EVENT SEQ(A a, B b, !(C c)) WHERE [id] WITHIN 8",
    "EVENT SEQ(!(C c), A a, B b) WHERE [id] WITHIN 8",
    "EVENT SEQ(A a, B b, C c) WHERE [id] WITHIN 10",
    "EVENT SEQ(A a, B b) WHERE a.id = b.id AND a.v < b.v WITHIN 8",
    "EVENT SEQ(A a, A b, B c) WHERE [id] WITHIN 6",
    "EVENT SEQ(A a, B b, !(D d)) WITHIN 8",
]
# (constraint, query): traces that terminate, violate (resume) and are released (docs/constraints.md).
CONSTRAINED = [
    ("A+ K* B+ K C+", "EVENT SEQ(A a, K k1, C c) WHERE [id] WITHIN 10"),
    ("A X B | X C", "EVENT SEQ(X x, B b) WHERE [id] WITHIN 10"),
    ("A+ K* B+ K C+", "EVENT SEQ(A a, !(B b), K k) WHERE [id] WITHIN 10"),
    ("A B", "EVENT SEQ(A a, C c) WHERE [id] WITHIN 10"),
]
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# The constrained runs cost ~10x an unconstrained one: the regular suite runs 40 of each, the long suite 150.
QUICK_SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Step = tuple[str, Any]


@st.composite
def steps(draw: st.DrawFn, types: str = "AABBCDX") -> list[Step]:
    """Events of many keys in an arrival order with delays (some far behind: late and too late), and
    punctuations between them (each at most the largest timestamp seen, possibly behind an earlier one)."""
    n = draw(st.integers(0, 40))
    keys = draw(st.integers(1, 8))
    max_delay = draw(st.sampled_from([0, 3, 12, 30]))
    items = []
    for i in range(n):
        ts = draw(st.integers(0, 60))
        attrs = {"id": draw(st.integers(0, keys - 1)), "v": draw(st.integers(0, 4))}
        delay = draw(st.integers(0, max_delay))
        items.append((ts + delay, i, SaseEvent(draw(st.sampled_from(types)), ts, attrs, f"e{i}")))
    items.sort(key=lambda x: (x[0], x[1]))
    out: list[Step] = []
    seen = None
    for _, _, event in items:
        out.append(("event", event))
        seen = event.ts if seen is None else max(seen, event.ts)
        if draw(st.booleans()):
            out.append(("punctuation", seen - draw(st.integers(0, 10))))
    return out


@st.composite
def configs(draw: st.DrawFn, constraint: str | None = None) -> EngineConfig:
    return EngineConfig(
        k_slack_us=draw(st.sampled_from([None, None, 0, 4])),
        mode=draw(st.sampled_from(["conservative", "aggressive"])),
        allowed_lateness_us=draw(st.sampled_from([0, 5, 20])),
        purge_lag=draw(st.sampled_from([None, 0, 3])),
        constraint=constraint)


def apply(engine: SequenceEngine, step: Step) -> list[SaseOutput]:
    what, value = step
    return engine.on_event(value) if what == "event" else engine.on_punctuation(value)


def records(outputs: list[SaseOutput]) -> list[dict[str, Any]]:
    return [o.to_dict() for o in outputs]


def canonical(full_blob: bytes) -> dict[str, Any]:
    """A full (version 2) snapshot with its partitions in key order: the order a dict happens to keep its keys
    in is not state (nothing the engine outputs depends on it)."""
    doc = msgpack.unpackb(full_blob, raw=False, strict_map_key=False)
    doc["partitions"] = sorted(doc["partitions"], key=lambda p: repr(p[0]))
    if doc.get("constraint") and doc["constraint"][3] is not None:
        # The monitor's tie-break counter for its heaps: every restore (full snapshots too) numbers them afresh.
        del doc["constraint"][3]["seq"]
    return dict(doc)


def assert_same_state(query: Any, config: EngineConfig, incremental: bytes, engine: SequenceEngine) -> None:
    """The incremental blob restores to the state the engine's full snapshot restores to."""
    restored = SequenceEngine.restore(query, config, incremental)
    from_full = SequenceEngine.restore(query, config, engine.snapshot())
    assert canonical(restored.snapshot()) == canonical(from_full.snapshot())
    assert restored.stats() == from_full.stats() == engine.stats()


def differential(text: str, config: EngineConfig, run: list[Step], restore_at: list[bool]) -> None:
    """After every step: the incremental blob restores to the full snapshot's state; where ``restore_at`` says
    so the engine is replaced by that restore (as a Spark task that lost its kept core does), and every record
    equals the uninterrupted engine's."""
    query = parse_query(text)
    uninterrupted = SequenceEngine(query, config)
    engine = SequenceEngine(query, config)
    expected: list[SaseOutput] = []
    got: list[SaseOutput] = []
    for i, step in enumerate(run):
        expected += apply(uninterrupted, step)
        got += apply(engine, step)
        blob = engine.incremental_snapshot()
        assert_same_state(query, config, blob, engine)
        if restore_at[i % len(restore_at)]:
            engine = SequenceEngine.restore(query, config, blob)
    expected += uninterrupted.end_of_stream()
    got += engine.end_of_stream()
    assert records(got) == records(expected)
    assert canonical(engine.snapshot()) == canonical(uninterrupted.snapshot())


@pytest.mark.parametrize("text", QUERIES)
@SETTINGS
@given(data=st.data())
def test_incremental_snapshots_restore_exactly_at_every_step(text: str, data: st.DataObject) -> None:
    differential(text, data.draw(configs()), data.draw(steps()),
                 data.draw(st.lists(st.booleans(), min_size=1, max_size=8)))


def constrained(constraint: str, text: str, data: st.DataObject) -> None:
    differential(text, data.draw(configs(constraint)), data.draw(steps("AABKKCX")),
                 data.draw(st.lists(st.booleans(), min_size=1, max_size=8)))


@pytest.mark.parametrize(("constraint", "text"), CONSTRAINED)
@QUICK_SETTINGS
@given(data=st.data())
def test_incremental_snapshots_restore_exactly_under_a_constraint(constraint: str, text: str,
                                                                   data: st.DataObject) -> None:
    constrained(constraint, text, data)


@pytest.mark.reliability_long  # 150 examples of each: ~45 s in all
@pytest.mark.parametrize(("constraint", "text"), CONSTRAINED)
@SETTINGS
@given(data=st.data())
def test_incremental_snapshots_restore_exactly_under_a_constraint_at_length(constraint: str, text: str,
                                                                             data: st.DataObject) -> None:
    constrained(constraint, text, data)


@pytest.mark.parametrize("text", QUERIES[:3])
@SETTINGS
@given(data=st.data())
def test_snapshots_only_at_batch_ends_give_the_uninterrupted_records(text: str, data: st.DataObject) -> None:
    """Micro-batches of several steps: one incremental snapshot per batch, a restore at random batch ends
    (the changes of a whole batch accumulate between two snapshots)."""
    query = parse_query(text)
    config = data.draw(configs())
    run = data.draw(steps())
    uninterrupted = SequenceEngine(query, config)
    engine = SequenceEngine(query, config)
    expected: list[SaseOutput] = []
    got: list[SaseOutput] = []
    for i, step in enumerate(run):
        expected += apply(uninterrupted, step)
        got += apply(engine, step)
        if data.draw(st.integers(0, 3)) == 0 or i == len(run) - 1:
            blob = engine.incremental_snapshot()
            assert_same_state(query, config, blob, engine)
            if data.draw(st.booleans()):
                engine = SequenceEngine.restore(query, config, blob)
    assert records(got + engine.end_of_stream()) == records(expected + uninterrupted.end_of_stream())


def ev(etype: str, ts: int, key: int) -> SaseEvent:
    return SaseEvent(etype, ts, {"id": key}, f"{etype.lower()}{ts}")


def test_a_purge_of_a_key_without_new_events_reaches_the_next_blob() -> None:
    """Key 1's A expires while only key 2 gets events: the blob after the purge has no key 1 any more, and the
    A a later B of key 1 would have matched is gone from the restored engine too."""
    query = parse_query("EVENT SEQ(A a, B b) WHERE [id] WITHIN 10")
    config = EngineConfig(allowed_lateness_us=0, purge_lag=0)
    engine = SequenceEngine(query, config)
    engine.on_event(ev("A", 1, 1))
    engine.on_event(ev("A", 2, 2))
    before = SequenceEngine.restore(query, config, engine.incremental_snapshot())
    assert before.partition(1) is not None
    engine.on_event(ev("A", 20, 2))
    assert engine.on_punctuation(13) == []  # L - A - W = 3 > 1, 2: key 1's a1 expires (and key 2's a2)
    restored = SequenceEngine.restore(query, config, engine.incremental_snapshot())
    assert restored.partition(1) is None and engine.partition(1) is None
    assert [len(s.items) for s in restored.partition(2).stacks] == [1, 0]  # type: ignore[union-attr]
    assert restored.on_event(ev("B", 13, 1)) == [] == engine.on_event(ev("B", 13, 1))


def test_a_release_of_a_held_match_reaches_the_next_blob() -> None:
    """A match held for its trailing negation range is released by a punctuation alone: the restored engine
    must not release it a second time."""
    query = parse_query("EVENT SEQ(A a, B b, !(C c)) WHERE [id] WITHIN 8")
    config = EngineConfig(allowed_lateness_us=0)
    engine = SequenceEngine(query, config)
    engine.on_event(ev("A", 1, 1))
    assert engine.on_event(ev("B", 4, 1)) == []  # held until no C can fall into (4, 9)
    engine.incremental_snapshot()
    assert [o.kind for o in engine.on_punctuation(9)] == ["match"]
    restored = SequenceEngine.restore(query, config, engine.incremental_snapshot())
    assert restored.held_matches() == [] and restored.end_of_stream() == []


@pytest.mark.parametrize(("k_slack_us", "run", "expected"), [
    # K = 3: k7 brings L to 4, the checker reaches b4 (after A B only one K can follow: SEQ(A, K, K, C) can no
    # longer match) and cuts the trace at 4, keeping k6 k7 (beyond the checker). a2 is below what the checker saw:
    # the terminated trace is no longer followed and its state goes at once (early release); a2 itself is not
    # processed, so the release is the only change to the partition in that step.
    (3, [ev("A", 1, 1), ev("B", 4, 1), ev("K", 6, 1), ev("K", 7, 1), ev("A", 2, 1)],
     [("monitor_terminated", ["b4"])]),
    # Punctuations only: 11 lets the checker reach b10, which terminates the trace: its state up to 10 goes (cut).
    (None, [ev("A", 1, 1), ev("B", 10, 1), 11], [("monitor_terminated", ["b10"])]),
    # Punctuations only: 11 terminates the trace at b10; a12 k13 k14 c15 come beyond the checker and their match
    # is suspended; 16 lets the checker reach a12 (an A after a B breaks the workflow): the trace resumes at 12 and
    # the suspended match goes out, on a punctuation step.
    (None, [ev("A", 1, 1), ev("B", 10, 1), 11, ev("A", 12, 1), ev("K", 13, 1), ev("K", 14, 1), ev("C", 15, 1), 16],
     [("monitor_terminated", ["b10"]), ("match", ["a12", "k13", "k14", "c15"])]),
])
def test_a_constraint_verdict_on_a_step_of_no_event_of_the_trace_reaches_the_next_blob(
        k_slack_us: int | None, run: list[SaseEvent | int], expected: list[tuple[str, list[str]]]) -> None:
    query = parse_query("EVENT SEQ(A a, K k1, K k2, C c) WHERE [id] WITHIN 1000")
    config = EngineConfig(k_slack_us=k_slack_us, allowed_lateness_us=0, constraint="A+ K* B+ K C+")
    engine = SequenceEngine(query, config)
    outputs: list[SaseOutput] = []
    for step in run:
        outputs += engine.on_punctuation(step) if isinstance(step, int) else engine.on_event(step)
        assert_same_state(query, config, engine.incremental_snapshot(), engine)
    assert [(o.kind, [e.event_id for e in o.events]) for o in outputs] == expected


def test_a_released_match_forgotten_past_the_allowed_lateness_reaches_the_next_blob() -> None:
    """<a1 b4> is released at 9 and kept while a late C within A = 6 could still fall into (4, 9); the
    punctuation at 16 forgets it (9 <= 16 - 6) with no event of its key: the blob must not keep it."""
    query = parse_query("EVENT SEQ(A a, B b, !(C c)) WHERE [id] WITHIN 8")
    config = EngineConfig(allowed_lateness_us=6)
    engine = SequenceEngine(query, config)
    engine.on_event(ev("A", 1, 1))
    engine.on_event(ev("B", 4, 1))
    assert [o.kind for o in engine.on_punctuation(9)] == ["match"]
    assert engine.counters.released_retained == 1
    assert_same_state(query, config, engine.incremental_snapshot(), engine)
    assert engine.on_punctuation(16) == [] and engine.counters.released_retained == 0
    restored = SequenceEngine.restore(query, config, engine.incremental_snapshot())
    assert restored.counters.released_retained == 0
    assert_same_state(query, config, engine.incremental_snapshot(), engine)


def test_only_the_changed_keys_are_encoded_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost of a snapshot: one partition encoded per key that changed, none for the others."""
    encoded: list[int] = []
    encode = engine_module._encoded_partition

    def counting(part: Any) -> bytes:
        encoded.append(part.ais.stacks[0].items[0].event.attrs["id"])  # every key here has an A
        return encode(part)

    monkeypatch.setattr(engine_module, "_encoded_partition", counting)
    query = parse_query("EVENT SEQ(A a, B b) WHERE [id] WITHIN 1000")
    config = EngineConfig(allowed_lateness_us=0)
    engine = SequenceEngine(query, config)
    for key in range(100):
        engine.on_event(ev("A", key, key))
    engine.incremental_snapshot()
    assert sorted(encoded) == list(range(100))  # the first one encodes every key
    encoded.clear()
    engine.on_event(ev("A", 200, 7))
    engine.on_event(ev("A", 201, 42))
    blob = engine.incremental_snapshot()
    assert sorted(encoded) == [7, 42]
    encoded.clear()
    assert engine.incremental_snapshot() == blob and encoded == []
    assert_same_state(query, config, blob, engine)


# The state of EVENT SEQ(A a, B b, !(C c)) WHERE [id] WITHIN 8 (allowed lateness 6) after a1 a2 b4 b5 c6 a9 (id
# 1, 2, 1, 2, 2, 1) and a punctuation at 7, as the build before incremental snapshots wrote it (version 2): key 1
# holds <a1 b4> until 9, key 2's <a2 b5> was negated by c6.
VERSION_2_BLOB = bytes.fromhex(
    "8aa17602a57175657279da01572828456c656d656e74286576656e745f747970653d2741272c20616c6961733d2761272c206e6567617465"
    "643d46616c7365292c20456c656d656e74286576656e745f747970653d2742272c20616c6961733d2762272c206e6567617465643d46616c"
    "7365292c20456c656d656e74286576656e745f747970653d2743272c20616c6961733d2763272c206e6567617465643d5472756529292c20"
    "28507265646963617465286c6566743d4174747252656628616c6961733d2761272c20617474723d27696427292c206f703d273d272c2072"
    "696768743d4174747252656628616c6961733d2762272c20617474723d2769642729292c20507265646963617465286c6566743d41747472"
    "52656628616c6961733d2762272c20617474723d27696427292c206f703d273d272c2072696768743d4174747252656628616c6961733d27"
    "63272c20617474723d276964272929292c203829a5636c6f636b09ab70756e6374756174696f6e07a373657106a86d617463685f696402a8"
    "636f756e74657273de0017a66576656e747306a769676e6f72656400a872656a656374656400ab6c6174655f6576656e747300a8746f6f5f"
    "6c61746500b0626568696e645f77617465726d61726b00ac6c6174655f6d61746368657300b9696e76616c6964617465645f61667465725f"
    "72656c6561736500b172656c65617365645f72657461696e656400a9696e7374616e63657305af6e65676174696f6e5f6576656e747301a4"
    "68656c6401b07075726765645f696e7374616e63657300b67075726765645f6e65676174696f6e5f6576656e747300b36d6174636865735f"
    "636f6e737472756374656402b76e6567617465645f61745f636f6e737472756374696f6e00b6696e76616c6964617465645f7768696c655f"
    "68656c6401a7656d697474656400a972657472616374656400aa7269705f72657365747300aa63616e6469646174657302aa706172746974"
    "696f6e7302aa72656a656374696f6e7380a970757267655f6c6f6790a66576656e7473969500a1410181a2696401a261319501a1410281a2"
    "696402a261329502a1420481a2696401a262349503a1420581a2696402a262359504a1430681a2696402a263369505a1410981a2696401a2"
    "6139aa706172746974696f6e73929a010900010192929200c09205c0919202009190919300920002a56d6174636890909a02050001029291"
    "9201c091920301919104909090"
)


def test_a_version_2_blob_of_the_previous_build_restores_and_goes_on_exactly() -> None:
    """Hand-computed: the punctuation at 9 releases <a1 b4>; the late c7 (9 - 6 <= 7 < 9) falls into its
    negation range (4, 9) and invalidates it; <a9 b12> comes out at the end. The restored engine's incremental
    snapshots from then on restore to the same state."""
    query = parse_query("EVENT SEQ(A a, B b, !(C c)) WHERE [id] WITHIN 8")
    config = EngineConfig(allowed_lateness_us=6)
    engine = SequenceEngine.restore(query, config, VERSION_2_BLOB)
    outputs: list[SaseOutput] = []
    for step in [("punctuation", 9), ("event", ev("C", 7, 1)), ("event", ev("B", 12, 1)), ("punctuation", 30)]:
        outputs += apply(engine, step)
        assert_same_state(query, config, engine.incremental_snapshot(), engine)
    outputs += engine.end_of_stream()
    assert [(o.kind, [e.event_id for e in o.events], o.emitted_at, o.cause and o.cause.event_id)
            for o in outputs] == [("match", ["a1", "b4"], 9, None), ("invalidated", ["a1", "b4"], 9, "c7"),
                                  ("match", ["a9", "b12"], 12, None)]


def test_a_blob_of_an_unknown_version_is_refused_by_name() -> None:
    blob = msgpack.packb({"v": 99, "query": ""}, use_bin_type=True)
    with pytest.raises(SaseError, match="version 99"):
        SequenceEngine.restore(parse_query("EVENT SEQ(A a, B b) WITHIN 8"), None, blob)


def per_key_differential(text: str, config: EngineConfig, run: list[Step], restore_at: list[bool]) -> None:
    """A store of one entry per partition key (``snapshot_changes`` applied after every step, as a per-key state
    store would): it restores (``restore_parts``) to the full snapshot's state, and an engine replaced by that
    restore where ``restore_at`` says so gives every record of the uninterrupted engine."""
    query = parse_query(text)
    uninterrupted = SequenceEngine(query, config)
    engine = SequenceEngine(query, config)
    store: dict[bytes, bytes] = {}
    expected: list[SaseOutput] = []
    got: list[SaseOutput] = []
    for i, step in enumerate(run):
        expected += apply(uninterrupted, step)
        got += apply(engine, step)
        doc, changes = engine.snapshot_changes()
        for key, encoded in changes.items():
            if encoded is None:
                store.pop(key, None)
            else:
                store[key] = encoded
        restored = SequenceEngine.restore_parts(query, config, doc, store.items())
        assert canonical(restored.snapshot()) == canonical(engine.snapshot())
        assert restored.stats() == engine.stats()
        if restore_at[i % len(restore_at)]:
            engine = restored
    expected += uninterrupted.end_of_stream()
    got += engine.end_of_stream()
    assert records(got) == records(expected)


@pytest.mark.parametrize("text", QUERIES[:4])
@QUICK_SETTINGS
@given(data=st.data())
def test_per_key_changes_restore_exactly_at_every_step(text: str, data: st.DataObject) -> None:
    per_key_differential(text, data.draw(configs()), data.draw(steps()),
                         data.draw(st.lists(st.booleans(), min_size=1, max_size=8)))


def test_per_key_changes_name_only_the_changed_partitions() -> None:
    """Hand-computed: the first call gives every partition; after an event of key 1 only key 1; after a purge
    that drops both keys' partitions, both as gone (None)."""
    query = parse_query("EVENT SEQ(A a, B b) WHERE a.id = b.id WITHIN 5")
    engine = SequenceEngine(query, EngineConfig(allowed_lateness_us=0))
    engine.on_event(SaseEvent("A", 1, {"id": 1}, "e1"))
    engine.on_event(SaseEvent("A", 2, {"id": 2}, "e2"))
    _, first = engine.snapshot_changes()
    assert sorted(first) == [msgpack.packb(1), msgpack.packb(2)]
    engine.on_event(SaseEvent("A", 3, {"id": 1}, "e3"))
    _, second = engine.snapshot_changes()
    assert list(second) == [msgpack.packb(1)] and second[msgpack.packb(1)] is not None
    engine.on_punctuation(100)
    _, third = engine.snapshot_changes()
    assert third == {msgpack.packb(1): None, msgpack.packb(2): None}


def test_per_key_changes_name_equal_keys_of_other_types_by_the_first_one() -> None:
    """Hand-computed: ids 1 and 1.0 are one partition (the engine compares keys as Python values), so the store
    keeps one entry for it, under the first key's packed form, also after a restore and when it is gone."""
    query = parse_query("EVENT SEQ(A a, B b) WHERE a.id = b.id WITHIN 5")
    config = EngineConfig(allowed_lateness_us=0)
    engine = SequenceEngine(query, config)
    engine.on_event(SaseEvent("A", 1, {"id": 1}, "e1"))
    doc, first = engine.snapshot_changes()
    assert list(first) == [msgpack.packb(1)]
    engine = SequenceEngine.restore_parts(query, config, doc, [(msgpack.packb(1), first[msgpack.packb(1)] or b"")])
    engine.on_event(SaseEvent("A", 2, {"id": 1.0}, "e2"))
    _, second = engine.snapshot_changes()
    assert list(second) == [msgpack.packb(1)]
    engine.on_punctuation(100)
    _, third = engine.snapshot_changes()
    assert third == {msgpack.packb(1): None}
