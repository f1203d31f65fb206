"""The iseq job's key groups without Spark: the key an ISEQ query implies, the plan, and a stream split by key
(with its punctuations in every group) giving exactly the one-group core's records."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import orjson
import pytest

from cep.intervals import parse_iseq
from cep.key_groups import EqualityKey, iseq_partition_key
from spark_jobs.iseq import IseqOptions, IseqStreamCore, engine_config, key_groups_plan
from spark_jobs.key_routing import KeyGroups, ReadingsBySource, TypedKey
from spark_jobs.stateful import StreamReadProgress, run_stream_batch
from tests.unit.spark_jobs.routing_support import routed_group

MS = 1_000
TOPIC = "p.events.s"
# No negation: a result is emitted when its last member arrives.
CHAIN = "EVENT ISEQ[a.te < b.ts AND b.ts < c.te](A a, B b, C c; 400 ms) WHERE a.id = b.id AND b.id = c.id"
OVERLAP = ("EVENT ISEQ[a1 overlaps a2 AND a2.te <= b.te](A a1, A a2, B b; 300 ms) "
           "WHERE a1.id = a2.id AND a2.id = b.id AND b.v > 2")
LEVELS = "EVENT ISEQ[m.te = h.ts](MEDIUM m, HIGH h; 300 ms) WHERE m.source = h.source"
NEGATED = ("EVENT ISEQ[a.te < d.ts AND d.te <= b.te AND a.te < b.ts](A a, !D d, B b; 10 s) "
           "WHERE a.id = b.id AND b.id = d.id")


def test_the_equality_class_covering_every_element_is_the_iseq_key() -> None:
    assert iseq_partition_key(parse_iseq(CHAIN)) == EqualityKey({"A": "id", "B": "id", "C": "id"})
    assert iseq_partition_key(parse_iseq(LEVELS)) == EqualityKey({"MEDIUM": "source", "HIGH": "source"})
    negated = iseq_partition_key(parse_iseq(NEGATED))
    assert negated == EqualityKey({"A": "id", "B": "id", "D": "id"})


@pytest.mark.parametrize("text", [
    "EVENT ISEQ[a.te < b.ts](A a, B b; 1 s)",
    "EVENT ISEQ[a.te < b.ts](A a, B b; 1 s) WHERE a.id < b.id",
    "EVENT ISEQ[a.te < b.ts AND b.te < c.ts](A a, B b, C c; 1 s) WHERE a.id = b.id",  # c is not in the class
    "EVENT ISEQ[a.te < d.ts AND d.te < b.ts](A a, !D d, B b; 1 s) WHERE a.id = b.id",  # nor is the negated d
])
def test_an_iseq_query_without_such_a_class_has_no_key(text: str) -> None:
    assert iseq_partition_key(parse_iseq(text)) is None


@pytest.mark.parametrize(("options", "groups"), [
    (IseqOptions("", CHAIN), 1),  # not asked for
    (IseqOptions("", CHAIN, key_groups=4), 4),
    (IseqOptions("", CHAIN, key_groups=4, mode="aggressive", indexing="ibp", punctuated_types=("B",)), 4),
    (IseqOptions("", LEVELS, key_groups=3, from_points="temp"), 3),
    (IseqOptions("", "EVENT ISEQ[a.te < b.ts](A a, B b; 1 s)", key_groups=4), 1),
    (IseqOptions("", NEGATED, key_groups=4), 1),
    (IseqOptions("", CHAIN, key_groups=4, k_slack_us=1_000), 1),
])
def test_the_plan_spreads_a_keyed_query_without_negation_or_k_and_says_why_otherwise(options: IseqOptions,
                                                                                     groups: int) -> None:
    planned, why = key_groups_plan(parse_iseq(options.query), options)
    assert planned == groups
    assert why.startswith("one key group" if groups == 1 else f"{groups} key group(s) per stream, keyed by")
    with pytest.raises(ValueError, match="at least 1"):
        key_groups_plan(parse_iseq(CHAIN), IseqOptions("", CHAIN, key_groups=0))


def _route(row: dict[str, Any], key: EqualityKey, from_points: str | None, groups: int) -> int:
    """The key group the job's routing (spark_jobs.iseq.iseq_key_groups) gives an event row: a reading by its
    source, any other event by its type's key attribute in its own payload."""
    events = TypedKey("type", dict(key.attribute_of_type))
    key_of = events if from_points is None else ReadingsBySource(from_points, events)
    return routed_group(row, KeyGroups(groups, key_of))


def _stream(seed: int, *, types: str, levels: bool = False, endpoint_types: str = "") -> list[list[dict[str, Any]]]:
    """Batches of one stream over two partitions: atomic intervals, v1 points and endpoint pairs (both endpoints
    carry the key), ids of several JSON types (1, 1.0 and true are one key), events up to 150 ms behind the newest
    (late, and behind the promise across batches), unusable and foreign records; with ``levels`` also temperature
    readings of four sources (a numeric string among them) and MEDIUM and HIGH events whose payload names a
    source. Each
    batch is closed by both partitions' punctuations."""
    rnd = random.Random(seed)
    batches: list[list[dict[str, Any]]] = []
    offset, seqs, now_us = 0, Counter[str](), 0
    temps = {s: 70.0 for s in ("t0", "t1", "t2", "5")}

    def row(source: str, ref_us: int, payload: Any, **fields: Any) -> dict[str, Any]:
        nonlocal offset
        seq = seqs[source]
        seqs[source] += 1
        offset += 1
        text = payload if isinstance(payload, str) else orjson.dumps(payload).decode()
        return {"kind": "event", "stream": "s", "source_id": source, "seq": seq, "ref_ts_us": ref_us,
                "payload": text, "topic": TOPIC, "partition": seq % 2, "offset": offset, **fields}

    for _ in range(10):
        rows: list[dict[str, Any]] = []
        for _ in range(30):
            now_us += rnd.randrange(0, 25 * MS)
            end_us = max(0, now_us - rnd.choice([0, 0, 0, 30 * MS, 150 * MS]))
            start_us = max(0, end_us - rnd.choice([0, 10 * MS, 40 * MS, 120 * MS]))
            event_type = rnd.choice(types)
            payload = {"type": event_type, "id": rnd.choice([1, 1.0, True, 2, 3, "x", "3"]), "v": rnd.randrange(5)}
            source = rnd.choice(["e0", "e1", "e2"])
            shape = rnd.random()
            if event_type in endpoint_types or shape < 0.2:
                iid = f"i{offset}"
                rows.append(row(source, start_us, payload, start_ts_us=start_us, interval_id=iid, endpoint="start"))
                rows.append(row(source, end_us, payload, start_ts_us=end_us, interval_id=iid, endpoint="end"))
            elif shape < 0.3:
                rows.append(row(source, end_us, payload))  # a v1 point
            elif shape < 0.33:
                rows.append(row(source, end_us, rnd.choice(["[1]", "{", {"id": 1}, {"type": "Z", "id": 1}])))
            else:
                rows.append(row(source, end_us, payload, start_ts_us=start_us))
            if levels:
                for thermo in rnd.sample(sorted(temps), 2):
                    temps[thermo] = max(0.0, min(160.0, temps[thermo] + rnd.choice([-40, -20, 0, 20, 40])))
                    reading: Any = {"temp": temps[thermo]} if rnd.random() > 0.02 else {"temp": "55"}
                    rows.append(row(thermo, now_us, reading))
                if rnd.random() < 0.3:  # meeting the levels just read, from payloads naming a source ("5" is not 5)
                    named = rnd.choice(["t1", "5", 5])
                    rows.append(row("e9", now_us, {"type": "MEDIUM", "source": named}, start_ts_us=now_us - 40 * MS))
                    rows.append(row("e9", now_us, {"type": "HIGH", "source": rnd.choice([named, named, "5"])},
                                    start_ts_us=now_us))
        for partition in (0, 1):
            offset += 1
            rows.append({"kind": "punctuation", "stream": "s", "watermark_us": now_us - 100 * MS,
                         "partition": partition, "offset": offset, "topic": TOPIC, "ref_ts_us": None, "seq": None})
        batches.append(rows)
    return batches


def _split(options: IseqOptions, batches: list[list[dict[str, Any]]], groups: int,
           ) -> tuple[list[tuple[str, dict[str, Any]]], list[tuple[str, dict[str, Any]]]]:
    """The records of one core over the whole stream, and of ``groups`` cores each given its keys' events and
    every punctuation (as spark_jobs.stateful.apply_stream_cores routes them)."""
    query = parse_iseq(options.query)
    key = iseq_partition_key(query)
    assert key is not None
    config = engine_config(options)

    def core() -> IseqStreamCore:
        return IseqStreamCore("s", query, config, options, None)

    whole = (StreamReadProgress(2, TOPIC), core())
    parts = [(StreamReadProgress(2, TOPIC), core()) for _ in range(groups)]
    expected: list[tuple[str, dict[str, Any]]] = []
    got: list[tuple[str, dict[str, Any]]] = []
    for rows in batches:
        expected += run_stream_batch(*whole, rows, job="iseq", stream="s")
        for g, (progress, part) in enumerate(parts):
            mine = [r for r in rows
                    if r["kind"] == "punctuation" or _route(r, key, options.from_points, groups) == g]
            got += run_stream_batch(progress, part, mine, job="iseq", stream="s")
    return expected, got


def _records(outputs: list[tuple[str, dict[str, Any]]]) -> Counter[tuple[str, bytes]]:
    """Records regardless of order (groups interleave), every field compared."""
    return Counter((key, orjson.dumps(value, option=orjson.OPT_SORT_KEYS)) for key, value in outputs)


@pytest.mark.parametrize(("options", "types", "endpoint_types"), [
    (IseqOptions("", CHAIN), "AABBCZ", ""),
    (IseqOptions("", CHAIN, mode="aggressive", indexing="naive"), "AABBCZ", ""),
    (IseqOptions("", CHAIN, indexing="ibp", punctuated_types=("B",)), "AABBCZ", "B"),
    (IseqOptions("", OVERLAP, mode="aggressive"), "AAAB", ""),
])
@pytest.mark.parametrize("seed", range(4))
def test_a_stream_split_by_key_with_its_punctuations_in_every_group_gives_the_whole_streams_records(
        options: IseqOptions, types: str, endpoint_types: str, seed: int) -> None:
    expected, got = _split(options, _stream(seed, types=types, endpoint_types=endpoint_types), groups=4)
    kinds = Counter(v["record"] for _k, v in expected)
    assert kinds["match"] > 0 and kinds["too_late"] > 0 and kinds["rejected"] > 0
    assert _records(got) == _records(expected)


@pytest.mark.parametrize("seed", range(4))
def test_level_intervals_split_by_source_give_the_whole_streams_records(seed: int) -> None:
    options = IseqOptions("", LEVELS, from_points="temp")
    expected, got = _split(options, _stream(seed, types="AZ", levels=True), groups=3)
    sources = [{m["event_id"][:2] for m in v["members"]} for _k, v in expected if v["record"] == "match"]
    assert {"e9"} in sources and any("e9" in s and len(s) == 2 for s in sources)  # payloads meet levels too
    assert Counter(v.get("reason") for _k, v in expected)["bad_value"] > 0
    assert _records(got) == _records(expected)


def test_a_negating_query_split_by_key_releases_its_results_at_other_clocks() -> None:
    # Why a negated element keeps one group: (a1, b1) of key 1 waits for D's end bound b.te (<=: final only once
    # CLOCK passes it). In the whole stream key 2's A at 4.5 s releases it; in key 1's group only the promise does.
    options = IseqOptions("", NEGATED)
    query = parse_iseq(NEGATED)

    def event(seq: int, ref_ms: int, event_type: str, key: int, start_ms: int) -> dict[str, Any]:
        return {"kind": "event", "stream": "s", "source_id": "s", "seq": seq, "ref_ts_us": ref_ms * MS,
                "start_ts_us": start_ms * MS, "payload": orjson.dumps({"type": event_type, "id": key}).decode(),
                "topic": TOPIC, "partition": 0, "offset": seq}

    rows = [event(0, 1000, "A", 1, 0), event(1, 4000, "B", 1, 3000), event(2, 4500, "A", 2, 4400),
            {"kind": "punctuation", "stream": "s", "watermark_us": 20_000 * MS, "partition": 0, "offset": 9,
             "topic": TOPIC}]

    def emitted(rows: list[dict[str, Any]]) -> list[tuple[str, int]]:
        outputs = run_stream_batch(StreamReadProgress(1, TOPIC), IseqStreamCore(
            "s", query, engine_config(options), options, None), rows, job="iseq", stream="s")
        return [(v["record"], v["emitted_at_us"]) for _k, v in outputs]

    assert emitted(rows) == [("match", 4500 * MS)]
    assert emitted([r for r in rows if r.get("seq") != 2]) == [("match", 20_000 * MS)]


@pytest.mark.parametrize(("args", "groups"), [([], None), (["--key-groups", "4"], 4)])
def test_the_cli_hands_key_groups_to_the_job(args: list[str], groups: int | None,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from spark_jobs import cli
    from spark_jobs import iseq as iseq_job

    started: list[IseqOptions] = []
    monkeypatch.setattr(cli, "_session", lambda *_args: None)
    monkeypatch.setattr(iseq_job, "start", lambda _spark, options: started.append(options))
    monkeypatch.setattr(cli, "_run", lambda *_args: None)
    result = CliRunner().invoke(cli.spark_app, ["iseq", "--query", CHAIN, *args])
    assert result.exit_code == 0, result.output
    assert [o.key_groups for o in started] == [groups]


def test_the_cli_refuses_zero_key_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from spark_jobs import cli

    def no_spark(*_args: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, ["iseq", "--query", CHAIN, "--key-groups", "0"])
    assert result.exit_code == 2
    assert "--key-groups" in result.output


def test_an_interval_whose_endpoints_carry_different_keys_is_not_paired_across_groups() -> None:
    # Why G > 1 needs the key in both endpoints: the start (id 1) and the end (id 2) reach two groups.
    query = "EVENT ISEQ[a.te < b.ts](A a, B b; 10 s) WHERE a.id = b.id"
    options = IseqOptions("", query)
    key = iseq_partition_key(parse_iseq(query))
    assert key is not None

    def event(seq: int, ref_ms: int, payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
        return {"kind": "event", "stream": "s", "source_id": "s", "seq": seq, "ref_ts_us": ref_ms * MS,
                "payload": orjson.dumps(payload).decode(), "topic": TOPIC, "partition": 0, "offset": seq, **fields}

    rows = [event(0, 0, {"type": "A", "id": 1}, start_ts_us=0, interval_id="a", endpoint="start"),
            event(1, 100, {"type": "A", "id": 2}, start_ts_us=100 * MS, interval_id="a", endpoint="end"),
            event(2, 300, {"type": "B", "id": 2}, start_ts_us=200 * MS),
            *({"kind": "punctuation", "stream": "s", "watermark_us": 1000 * MS, "partition": p, "offset": 9,
               "topic": TOPIC} for p in (0, 1))]
    groups = 2
    assert [_route(r, key, None, groups) for r in rows[:3]] == [1, 0, 0]
    expected, got = _split(options, [rows], groups)
    assert [(k, v["record"]) for k, v in expected] == [("s|s#a|s:2", "match")]
    assert [(k, v["record"], v["reason"]) for k, v in got] == [("s|rejected|s|1", "rejected", "unpaired_end")]
