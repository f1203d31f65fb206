"""Key groups: the key a query implies, the stable key -> group routing, and the shell's groups of a stream."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from collections import Counter
from typing import Any

import orjson
import pytest

from cep.key_groups import EqualityKey, key_group, pattern_partition_key, sequence_partition_key
from cep.patterns import PatternSpec
from cep.sase import parse_query
from spark_jobs.sequence import SequenceOptions, SequenceStreamCore, engine_config, key_groups_plan, sequence_key_groups
from spark_jobs.stateful import StreamReadProgress, make_stream_function, run_stream_batch
from tests.unit.spark_jobs.routing_support import routed_group


def test_the_equality_class_covering_every_element_is_the_sequence_key() -> None:
    query = parse_query("EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 10 s")
    assert sequence_partition_key(query) == EqualityKey({"A": "id", "B": "id", "C": "id"})


def test_the_key_may_have_another_name_per_event_type_and_covers_negated_elements() -> None:
    query = parse_query("EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.tag = c.item AND c.item = e.tag "
                        "AND s.price > 3 WITHIN 1 s")
    key = sequence_partition_key(query)
    assert key == EqualityKey({"SHELF": "tag", "CHECKOUT": "item", "EXIT": "tag"})
    assert (key.attribute("CHECKOUT"), key.attribute("OTHER"), key.trace_attribute) == ("item", None, None)


def test_an_event_type_outside_the_query_is_keyed_like_the_engine_keys_its_trace() -> None:
    key = sequence_partition_key(parse_query("EVENT SEQ(A a, B b) WHERE a.id = b.id WITHIN 10 s"))
    assert key is not None and key.attribute("K") == "id"


@pytest.mark.parametrize("text", [
    "EVENT SEQ(A a, B b) WITHIN 10 s",
    "EVENT SEQ(A a, B b) WHERE a.id < b.id WITHIN 10 s",
    "EVENT SEQ(A a, B b, C c) WHERE a.id = b.id WITHIN 10 s",  # c is not in the class
    "EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.x = c.x WITHIN 10 s",  # two classes, neither covers all
    "EVENT SEQ(A a, !(B b), C c) WHERE a.id = c.id WITHIN 10 s",  # the negated element is not in it
])
def test_a_sequence_query_without_such_a_class_has_no_key(text: str) -> None:
    assert sequence_partition_key(parse_query(text)) is None


def test_a_pattern_is_keyed_by_its_partition_by_path() -> None:
    keyed = PatternSpec.parse("SEQ(x: k == 'kick', y: k == 'goal') PARTITION BY match.team WITHIN 2 s")
    assert pattern_partition_key(keyed) == ("match", "team")
    assert pattern_partition_key(PatternSpec.parse("SEQ(x: k == 'kick', y: k == 'goal') WITHIN 2 s")) is None


def test_key_group_is_crc32_modulo_g() -> None:
    # CRC-32 of "123456789" is 0xCBF43926 (the standard check value) = 3421780262.
    assert [key_group("123456789", g) for g in (1, 4, 7, 1000)] == [0, 2, 3421780262 % 7, 262]
    assert {key_group(str(k), 4) for k in range(200)} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="at least 1"):
        key_group("a", 0)


def test_key_group_does_not_depend_on_the_process_hash_seed() -> None:
    script = "from cep.key_groups import key_group; print([key_group(str(k), 5) for k in range(20)])"
    seen = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert seen == {f"{[key_group(str(k), 5) for k in range(20)]}\n"}


QUERY = "EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 300 ms"


@pytest.mark.parametrize(("options", "groups"), [
    (SequenceOptions("", QUERY), 1),  # not asked for: emitted_at would become the group's CLOCK
    (SequenceOptions("", QUERY, key_groups=4), 4),
    (SequenceOptions("", "EVENT SEQ(A a, B b) WITHIN 10 s", key_groups=4), 1),
    (SequenceOptions("", QUERY, key_groups=4, mode="aggressive"), 1),
    (SequenceOptions("", QUERY, key_groups=4, k_slack_us=1000), 1),
    (SequenceOptions("", QUERY, key_groups=4, constraint="SHELF+ EXIT"), 1),
])
def test_the_plan_spreads_a_keyed_conservative_query_and_says_why_otherwise(options: SequenceOptions,
                                                                            groups: int) -> None:
    planned, why = key_groups_plan(parse_query(options.query), options)
    assert planned == groups
    assert why.startswith("one key group" if groups == 1 else f"{groups} key group(s) per stream, keyed by")


def _stream(seed: int) -> list[list[dict[str, Any]]]:
    """Batches of one stream with two partitions: shuffled ids and types, events up to 150 ms behind the newest
    (late across batches), each batch closed by both partitions' punctuations."""
    rnd = random.Random(seed)
    batches, offset, seq, now_us = [], 0, 0, 0
    for _ in range(8):
        rows: list[dict[str, Any]] = []
        for _ in range(25):
            now_us += rnd.randrange(0, 20_000)
            ts = max(0, now_us - rnd.choice([0, 0, 0, 40_000, 150_000]))
            payload = {"type": rnd.choice(["SHELF", "SHELF", "CHECKOUT", "EXIT", "OTHER"]),
                       "id": rnd.choice([1, 2, 3, 4, 5, 6, "7", 8.5])}
            rows.append({"kind": "event", "seq": seq, "ref_ts_us": ts, "partition": seq % 2, "offset": offset,
                         "topic": "p.events.s", "source_id": "rfid", "payload": orjson.dumps(payload).decode()})
            seq, offset = seq + 1, offset + 1
        for partition in (0, 1):
            rows.append({"kind": "punctuation", "watermark_us": now_us - 100_000, "partition": partition,
                         "offset": offset, "topic": "p.events.s", "ref_ts_us": None, "seq": None})
            offset += 1
        batches.append(rows)
    return batches


def _without_clock(outputs: list[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, bytes]]:
    """Records as a multiset; ``emitted_at`` (the engine's CLOCK: the largest timestamp its group has seen) set
    aside, the one field a group does not share with the whole stream."""
    return Counter((key, orjson.dumps({k: v for k, v in value.items() if k != "emitted_at"},
                                      option=orjson.OPT_SORT_KEYS)) for key, value in outputs)


@pytest.mark.parametrize("seed", range(5))
def test_a_stream_split_by_key_with_its_punctuations_in_every_group_gives_the_whole_streams_records(
        seed: int) -> None:
    query = parse_query(QUERY)
    config = engine_config(SequenceOptions("", QUERY, allowed_lateness_us=30_000))
    key = sequence_partition_key(query)
    assert key is not None
    groups = 4

    routing = sequence_key_groups(query, "type", groups)
    assert routing is not None

    def group_of(row: dict[str, Any]) -> int:
        return routed_group(row, routing)

    whole = (StreamReadProgress(2), SequenceStreamCore("s", query, config, "type", None))
    parts = [(StreamReadProgress(2), SequenceStreamCore("s", query, config, "type", None)) for _ in range(groups)]
    expected: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, dict[str, Any]]] = []
    for rows in _stream(seed):
        expected += run_stream_batch(*whole, rows, job="sequence", stream="s")
        for g, (progress, core) in enumerate(parts):
            mine = [r for r in rows if r["kind"] == "punctuation" or group_of(r) == g]
            got += run_stream_batch(progress, core, mine, job="sequence", stream="s")
    assert Counter(v["record"] for _, v in expected)["match"] > 0
    assert _without_clock(got) == _without_clock(expected)


class _FakeState:
    def __init__(self, blob: bytes | None = None) -> None:
        self.exists, self.get = blob is not None, (blob,) if blob is not None else None

    def update(self, value: tuple[bytes]) -> None:
        self.exists, self.get = True, value


def test_a_checkpoint_made_with_other_key_groups_is_refused() -> None:
    import pandas as pd

    query = parse_query(QUERY)
    config = engine_config(SequenceOptions("", QUERY))

    def factory(stream: str, blob: bytes | None) -> SequenceStreamCore:
        return SequenceStreamCore(stream, query, config, "type", blob)

    rows = pd.DataFrame([{"kind": "punctuation", "watermark_us": 5, "partition": 0, "offset": 0,
                          "topic": "p.events.s", "ref_ts_us": None, "seq": None}])
    state = _FakeState()
    four = make_stream_function("sequence", factory, lambda _s: ("p.events.s", 1), key_groups=4)
    list(four(("s", 3), iter([rows]), state))
    assert state.get is not None
    blob = state.get[0]
    assert StreamReadProgress.from_blob(blob)[0].key_groups == 4
    two = make_stream_function("sequence", factory, lambda _s: ("p.events.s", 1), key_groups=2)
    with pytest.raises(ValueError, match="made with 4 key group"):
        list(two(("s", 1), iter([rows]), _FakeState(blob)))


PATTERN = "SEQ(a: type == 'SHELF', b: type == 'EXIT') PARTITION BY id WITHIN 60 ms"


@pytest.mark.parametrize(("pattern", "ta_us", "groups"), [
    (PATTERN, None, 1),  # thesis mode reads T_a live from every source of the stream
    (PATTERN, 2_000, 4),
    (f"{PATTERN} MODE per_event", None, 4),
    ("SEQ(a: type == 'SHELF', b: type == 'EXIT') WITHIN 60 ms MODE per_event", None, 1),
])
def test_the_pattern_plan_spreads_a_partitioned_pattern_unless_t_a_is_read_live(pattern: str, ta_us: int | None,
                                                                                 groups: int) -> None:
    from spark_jobs.pattern import PatternOptions
    from spark_jobs.pattern import key_groups_plan as pattern_plan

    planned, why = pattern_plan(PatternSpec.parse(pattern), PatternOptions("", pattern, ta_us=ta_us, key_groups=4),
                                default_groups=2)
    assert planned == groups
    assert why.startswith("one key group" if groups == 1 else "4 key group(s) per stream, keyed by PARTITION BY id")


@pytest.mark.parametrize(("pattern", "ta_us"), [(f"{PATTERN} MODE per_event MAX_UNCERTAINTY 5 ms", 0),
                                                (PATTERN, 3_000)])
@pytest.mark.parametrize("seed", range(3))
def test_a_pattern_split_by_key_gives_the_whole_streams_records_exactly(pattern: str, ta_us: int,
                                                                        seed: int) -> None:
    from spark_jobs.pattern import PatternStreamCore, pattern_key_groups

    spec = PatternSpec.parse(pattern)
    groups = 4
    rnd = random.Random(seed)
    batches = _stream(seed)
    for rows in batches:
        for row in rows:
            if row["kind"] == "event":
                row["uncertainty_us"] = rnd.randrange(0, 4_000)
                row["rtt_us"] = rnd.randrange(0, 9_000)  # per event mode must not read it; thesis has T_a fixed

    routing = pattern_key_groups(spec, groups)
    assert routing is not None

    def group_of(row: dict[str, Any]) -> int:
        return routed_group(row, routing)

    def core() -> PatternStreamCore:
        return PatternStreamCore("s", spec, ta_us, spec.mode == "thesis", 30_000, None)  # as the job builds it

    whole = (StreamReadProgress(2), core())
    parts = [(StreamReadProgress(2), core()) for _ in range(groups)]
    expected: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, dict[str, Any]]] = []
    for rows in batches:
        expected += run_stream_batch(*whole, rows, job="pattern", stream="s")
        for g, (progress, part_core) in enumerate(parts):
            mine = [r for r in rows if r["kind"] == "punctuation" or group_of(r) == g]
            got += run_stream_batch(progress, part_core, mine, job="pattern", stream="s")
    kinds = Counter(v["record"] for _, v in expected)
    assert kinds["match"] > 0 and kinds["too_late"] > 0
    records = Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in got)
    assert records == Counter(orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in expected)
