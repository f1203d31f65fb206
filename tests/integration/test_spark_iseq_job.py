"""The iseq job on real Kafka + Spark: contract v2 records (atomic intervals, endpoint pairs, v1 points) over two
partitions, results equal to the brute-force reference evaluator on the same intervals, across micro-batches and a
restart from the checkpoint, in both modes; a late negation's compensations with K-ISlack."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.admin import ensure_topics
from broker.client import KafkaClientConfig
from broker.reader import read_topic
from cep.intervals import Interval, parse_iseq, reference_keys
from contract.records import PUNCTUATION_KEY, EventRecord, PunctuationRecord
from contract.topics import TopicNames
from spark_jobs import iseq as iseq_job

pytestmark = [pytest.mark.integration, pytest.mark.spark]

BASE_US = 1_700_000_000_000_000
MS = 1_000
STREAM = "plant"
# No D entirely inside the gap between a and b (D's end is bounded above by b's start).
QUERY = "EVENT ISEQ[a.te < b.ts AND a.te < d.ts AND d.te < b.ts](A a, !D d, B b; 10 s)"
# IO3's gap query: no D intersecting (b.te, c.ts); D's begins come first (endpoints), its end is not bounded above.
IO3 = "EVENT ISEQ[a.te < b.ts AND b.te < c.ts AND d.ts < c.ts AND b.te < d.te](A a, B b, !D d, C c; 10 s)"

Key = tuple[tuple[str, int, int, str | None], ...]
Record = EventRecord | PunctuationRecord | dict[str, Any]


def generated(seed: int = 16) -> tuple[dict[int, list[tuple[int, Record]]], list[Interval]]:
    """Per partition, (ref_ts_us, record) in the topic's order; and the intervals they stand for (the reference's
    input, with the job's event ids). Source "atom" sends atomic intervals, "pair" endpoint pairs (partition 0),
    "point" v1 point records (partition 1)."""
    rng = random.Random(seed)
    intervals: list[Interval] = []
    records: dict[int, list[tuple[int, Record]]] = {0: [], 1: []}
    seqs: Counter[str] = Counter()

    def event(source: str, ref_us: int, kind: str, **fields: Any) -> EventRecord:
        seq = seqs[source]
        seqs[source] += 1
        return EventRecord(STREAM, source, seq, ref_us, ref_us, 0, ref_us, ref_us, payload={"type": kind}, **fields)

    for i in range(36):
        kind = rng.choice("AABBD")
        start_us = BASE_US + rng.randrange(0, 40_000) * MS
        end_us = start_us + rng.choice([0, 200, 500, 1500, 3000]) * MS
        source = rng.choice(["atom", "pair", "point"]) if end_us > start_us else "point"
        if source == "atom":
            record = event(source, end_us, kind, start_ts_us=start_us)
            records[0].append((end_us, record))
            intervals.append(Interval(kind, start_us, end_us, {"type": kind}, f"atom:{record.seq}"))
        elif source == "pair":
            for at_us, endpoint in ((start_us, "start"), (end_us, "end")):
                records[0].append((at_us, event(source, at_us, kind, start_ts_us=at_us, interval_id=f"i{i}",
                                                endpoint=endpoint)))
            intervals.append(Interval(kind, start_us, end_us, {"type": kind}, f"pair#i{i}"))
        else:
            record = event(source, start_us, kind)
            v1 = orjson.loads(record.to_json())
            for name in ("start_ts_us", "end_ts_us", "start_uncertainty_us", "source_start_ts_us"):
                v1.pop(name, None)  # a v2 point record may leave them out too
            v1["v"] = 1
            records[1].append((start_us, v1))
            intervals.append(Interval(kind, start_us, start_us, {"type": kind}, f"point:{record.seq}"))
    for part in records.values():
        part.sort(key=lambda x: x[0])
    return records, intervals


def punctuation(at_us: int) -> PunctuationRecord:
    return PunctuationRecord(STREAM, at_us, at_us)


def produce(bootstrap: str, topic: str, partition: int, records: Iterable[Record]) -> None:
    producer = KafkaClientConfig(bootstrap).producer()
    for record in records:
        if isinstance(record, dict):
            producer.produce(topic, key=str(record["source_id"]).encode(), value=orjson.dumps(record),
                             partition=partition)
        else:
            key = record.key if isinstance(record, EventRecord) else PUNCTUATION_KEY
            producer.produce(topic, key=key, value=record.to_json(), partition=partition)
    assert producer.flush(30) == 0


def run_once(spark: Any, bootstrap: str, prefix: str, checkpoint: str, query: str, mode: str,
             **options: Any) -> None:
    """One available-now run: what is in Kafka now, then stop (the next run restarts from the checkpoint)."""
    started = iseq_job.start(spark, iseq_job.IseqOptions(
        bootstrap_servers=bootstrap, query=query, topic_prefix=prefix, streams=(STREAM,), mode=mode,  # type: ignore[arg-type]
        checkpoint_dir=checkpoint, available_now=True, console=False, **options))
    started.awaitTermination()
    assert started.exception() is None


def results(bootstrap: str, prefix: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _k, v in read_topic(bootstrap, TopicNames(prefix).results("iseq"))]


def member_keys(records: list[dict[str, Any]], *kinds: str) -> list[Key]:
    return sorted(tuple((m["event_type"], m["start_ts_us"], m["end_ts_us"], m["event_id"]) for m in r["members"])
                  for r in records if r["record"] in kinds)


def net(records: list[dict[str, Any]]) -> Counter[Key]:
    counts: Counter[Key] = Counter()
    for r in records:
        if r["record"] in ("match", "add", "retract"):
            counts[member_keys([r], r["record"])[0]] += -1 if r["record"] == "retract" else 1
    return +counts


def test_results_equal_the_reference_across_partitions_micro_batches_and_a_restart(
        kafka: Any, spark: Any, topic_prefix: str, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topic = TopicNames(topic_prefix).events(STREAM)
    ensure_topics(bootstrap, [topic], partitions=2)
    records, intervals = generated()
    query = parse_iseq(QUERY)
    expected = reference_keys(query, intervals)
    # The data decides something: results exist, and the negation removes some.
    without_negation = reference_keys(query, [i for i in intervals if i.event_type != "D"])
    assert len(expected) >= 3 and len(without_negation) > len(expected)

    # Step 1: partition 0 is read up to 30 s and promises 30 s, partition 1 only 12 s: W = 12 s.
    cut0, cut1 = BASE_US + 30_000 * MS, BASE_US + 12_000 * MS
    produce(bootstrap, topic, 0, [*(r for at, r in records[0] if at < cut0), punctuation(cut0)])
    produce(bootstrap, topic, 1, [*(r for at, r in records[1] if at < cut1), punctuation(cut1)])
    checkpoint = str(tmp_path / "ckpt-conservative")
    run_once(spark, bootstrap, topic_prefix, checkpoint, QUERY, "conservative")
    first = results(bootstrap, topic_prefix)
    # Exactly the results whose last member ended before W (D's that negate them end before too).
    assert member_keys(first, "match") == reference_keys(query, [i for i in intervals if i.end_ts_us < cut1])
    assert [r for r in first if r["record"] != "match"] == []

    # Step 2: the rest, then a promise past every interval; the job restarts from its checkpoint.
    end = BASE_US + 60_000 * MS
    produce(bootstrap, topic, 0, [*(r for at, r in records[0] if at >= cut0), punctuation(end)])
    produce(bootstrap, topic, 1, [*(r for at, r in records[1] if at >= cut1), punctuation(end)])
    run_once(spark, bootstrap, topic_prefix, checkpoint, QUERY, "conservative")
    conservative = results(bootstrap, topic_prefix)
    assert member_keys(conservative, "match") == expected
    assert [r["record"] for r in conservative] == ["match"] * len(expected)
    assert len({r["start_ts_us"] for r in conservative}) > 1

    # Aggressive mode on the complete topic (a fresh checkpoint): nets to the same results.
    run_once(spark, bootstrap, topic_prefix, str(tmp_path / "ckpt-aggressive"), QUERY, "aggressive")
    aggressive = results(bootstrap, topic_prefix)[len(conservative):]
    assert {r["mode"] for r in aggressive} == {"aggressive"}
    assert net(aggressive) == Counter(expected)


def test_a_late_negation_is_compensated_with_k_islack(kafka: Any, spark: Any, topic_prefix: str,
                                                      tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topics = TopicNames(topic_prefix)
    ensure_topics(bootstrap, [topics.events(STREAM), topics.late(STREAM)])

    def event(source: str, seq: int, ref_ms: int, kind: str, **fields: Any) -> EventRecord:
        ref_us = BASE_US + ref_ms * MS
        return EventRecord(STREAM, source, seq, ref_us, ref_us, 0, ref_us, ref_us, payload={"type": kind}, **fields)

    # A, B, C a result; D's endpoints arrive later, on the late topic (behind the promise, within K = 10 ms).
    positives = [event("s", 0, 2, "A", start_ts_us=BASE_US + MS), event("s", 1, 6, "B", start_ts_us=BASE_US + 4 * MS),
                 event("s", 2, 12, "C", start_ts_us=BASE_US + 10 * MS)]
    # An endpoint record's start fields are its own time (the gateway writes them so).
    late_d = [event("d", 0, 5, "D", start_ts_us=BASE_US + 5 * MS, interval_id="d1", endpoint="start", late=True,
                    late_reason="behind_watermark"),
              event("d", 1, 6, "D", start_ts_us=BASE_US + 6 * MS, interval_id="d1", endpoint="end", late=True,
                    late_reason="behind_watermark")]
    options = {"k_slack_us": 10 * MS, "punctuated_types": ("D",)}
    produce(bootstrap, topics.events(STREAM), 0, [*positives, punctuation(BASE_US + 12 * MS)])
    checkpoint = str(tmp_path / "ckpt-aggressive")
    run_once(spark, bootstrap, topic_prefix, checkpoint, IO3, "aggressive", **options)
    assert [r["record"] for r in results(bootstrap, topic_prefix)] == ["match"]

    produce(bootstrap, topics.late(STREAM), 0, late_d)
    produce(bootstrap, topics.events(STREAM), 0, [punctuation(BASE_US + 100 * MS)])
    run_once(spark, bootstrap, topic_prefix, checkpoint, IO3, "aggressive", **options)
    aggressive = results(bootstrap, topic_prefix)
    # D's start (its end unknown: +inf) hits the gap: retract; its end at b.te shows it misses: add again.
    assert [(r["record"], r["cause"] and (r["cause"]["item"], r["cause"]["event_id"])) for r in aggressive] == [
        ("match", None), ("retract", ("begin", "d#d1")), ("add", ("interval", "d#d1"))]
    intervals = [Interval(k, BASE_US + s * MS, BASE_US + e * MS, {"type": k}, i) for k, s, e, i in (
        ("A", 1, 2, "s:0"), ("B", 4, 6, "s:1"), ("C", 10, 12, "s:2"), ("D", 5, 6, "d#d1"))]
    expected = reference_keys(parse_iseq(IO3), intervals)
    assert net(aggressive) == Counter(expected) and len(expected) == 1

    # Conservative mode with the same K on the complete topics: the one result, once D could no longer begin.
    run_once(spark, bootstrap, topic_prefix, str(tmp_path / "ckpt-conservative"), IO3, "conservative", **options)
    conservative = results(bootstrap, topic_prefix)[len(aggressive):]
    assert [(r["record"], r["emitted_at_us"]) for r in conservative] == [("match", BASE_US + 100 * MS)]
    assert member_keys(conservative, "match") == expected


def test_point_readings_become_level_intervals_across_a_restart(kafka: Any, spark: Any, topic_prefix: str,
                                                                tmp_path: Path) -> None:
    from cep.intervals import PointToIntervalOperator

    bootstrap = kafka.bootstrap_servers
    topic = TopicNames(topic_prefix).events(STREAM)
    ensure_topics(bootstrap, [topic])
    # A HIGH level right after a MEDIUM one, per source (Li 5.4.2's levels: LOW <= 50 < MEDIUM <= 100 < HIGH).
    query = "EVENT ISEQ[m.te = h.ts](MEDIUM m, HIGH h; 20 s) WHERE m.source = h.source"
    rng = random.Random(5)
    readings = sorted((BASE_US + t * 500 * MS, source, rng.choice([30, 60, 90, 120, 150]))
                      for source in ("t1", "t2") for t in range(40))
    seqs: Counter[str] = Counter()
    records: list[tuple[int, EventRecord]] = []
    for at_us, source, value in readings:
        records.append((at_us, EventRecord(STREAM, source, seqs[source], at_us, at_us, 0, at_us, at_us,
                                           payload={"temp": value})))
        seqs[source] += 1
    # What the job should see: each source's level intervals (ids "<source>~<n>"), the reference over them.
    intervals: list[Interval] = []
    for source in ("t1", "t2"):
        op = PointToIntervalOperator(source)
        for at_us, s, value in readings:
            if s == source:
                intervals += [Interval(i.event_type, i.start_ts_us, i.end_ts_us, i.attrs,
                                       f"{source}~{(i.event_id or '').rsplit(':', 1)[-1]}")
                              for i in op.on_reading(at_us, value) if isinstance(i, Interval)]
    expected = reference_keys(parse_iseq(query), intervals)
    assert len(expected) >= 3

    cut_us = BASE_US + 9_000 * MS
    produce(bootstrap, topic, 0, [*(r for at, r in records if at < cut_us), punctuation(cut_us)])
    checkpoint = str(tmp_path / "ckpt")
    run_once(spark, bootstrap, topic_prefix, checkpoint, query, "conservative", from_points="temp")
    first = results(bootstrap, topic_prefix)
    # Before the cut: the results whose HIGH level ended (at the next level's first reading) before it.
    assert member_keys(first, "match") == reference_keys(parse_iseq(query),
                                                         [i for i in intervals if i.end_ts_us < cut_us])
    produce(bootstrap, topic, 0, [*(r for at, r in records if at >= cut_us), punctuation(BASE_US + 60_000 * MS)])
    run_once(spark, bootstrap, topic_prefix, checkpoint, query, "conservative", from_points="temp")
    assert member_keys(results(bootstrap, topic_prefix), "match") == expected


def test_the_contract_reader_takes_a_v1_record_as_a_v2_point(spark: Any) -> None:
    from pyspark.sql import functions as F

    from spark_jobs.contract import events, record_schema

    v2 = orjson.loads(EventRecord(STREAM, "a", 0, 90, 100, 5, 100, 100, start_ts_us=40, start_uncertainty_us=7,
                                  source_start_ts_us=30, interval_id="x", endpoint="end").to_json())
    v1 = {k: v for k, v in v2.items() if k not in ("start_ts_us", "end_ts_us", "start_uncertainty_us",
                                                   "source_start_ts_us", "interval_id", "endpoint")}
    v1["v"] = 1
    raw = spark.createDataFrame([(orjson.dumps(v).decode(),) for v in (v2, v1)], "value string")
    records = raw.select(F.from_json("value", record_schema()).alias("r")).select("r.*")
    rows = [r.asDict() for r in events(records).orderBy(F.col("v").desc()).collect()]
    names = ("v", "start_ts_us", "end_ts_us", "start_uncertainty_us", "source_start_ts_us", "interval_id", "endpoint")
    assert [tuple(r[n] for n in names) for r in rows] == [(2, 40, 100, 7, 30, "x", "end"),
                                                         (1, 100, 100, 5, 90, None, None)]
