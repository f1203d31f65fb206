"""The sequence job's key groups on real Kafka + Spark: G = 1 and G = 4 give the pure engine's records."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from broker.reader import read_topic
from cep.key_groups import key_group
from cep.patterns import PatternSpec
from cep.sase import parse_query
from contract.topics import TopicNames
from spark_jobs import sequence as sequence_job
from spark_jobs.stateful import StreamReadProgress, run_stream_batch
from tests.integration.spark_job_support import BASE_US, event_record, produce, punctuation_record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MS = 1_000
QUERY = "EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 300 ms"
LATENESS_US = 30_000


def trace(seed: int) -> list[list[dict[str, Any]]]:
    """Two batches of one stream: ids of several JSON types (1 and 1.0 are one key to the engine), events up to
    150 ms behind the newest (late and too late across the batches), each batch closed by a punctuation."""
    rnd = random.Random(seed)
    batches, seq, now_us = [], 0, 0
    for number in range(2):
        rows: list[dict[str, Any]] = []
        if number:
            # Behind the first batch's punctuation (now - 100 ms): within the allowed lateness, and past it.
            for behind_us, event_type in ((110 * MS, "EXIT"), (140 * MS, "SHELF")):
                for item in (1, 2, 3, 4, 5, 6):
                    late_payload: dict[str, Any] = {"type": event_type, "id": item}
                    rows.append(event_record("store", "rfid-late", seq, BASE_US + now_us - behind_us, 0, late_payload))
                    seq += 1
        for _ in range(120):
            now_us += rnd.randrange(0, 20 * MS)
            ts = max(0, now_us - rnd.choice([0, 0, 0, 40 * MS, 150 * MS]))
            payload: dict[str, Any] = {"type": rnd.choice(["SHELF", "SHELF", "CHECKOUT", "EXIT", "OTHER"]),
                                       "id": rnd.choice([1, 1.0, 2, 3, 4, 5, 6, "7", "x", True])}
            rows.append(event_record("store", f"rfid-{seq % 3}", seq, BASE_US + ts, 0, payload))
            seq += 1
        rows.append(punctuation_record("store", BASE_US + now_us - 100 * MS))
        batches.append(rows)
    return batches


def expected_records(batches: list[list[dict[str, Any]]], events_topic: str) -> list[tuple[str, dict[str, Any]]]:
    """The pure core over the same records, batch by batch, as the job's single-partition topic holds them."""
    query = parse_query(QUERY)
    config = sequence_job.engine_config(options("", "", 1))
    progress = StreamReadProgress(1, events_topic)
    core = sequence_job.SequenceStreamCore("store", query, config, "type", None)
    outputs: list[tuple[str, dict[str, Any]]] = []
    offset = 0
    for batch in batches:
        rows = []
        for record in batch:
            payload = record.get("payload")
            rows.append({**record, "payload": None if payload is None else orjson.dumps(payload).decode(),
                         "topic": events_topic, "partition": 0, "offset": offset})
            offset += 1
        outputs += run_stream_batch(progress, core, rows, job="sequence", stream="store")
    return outputs


def options(servers: str, prefix: str, groups: int, checkpoint: str | None = None) -> sequence_job.SequenceOptions:
    return sequence_job.SequenceOptions(
        bootstrap_servers=servers, query=QUERY, topic_prefix=prefix, streams=("store",),
        allowed_lateness_us=LATENESS_US, key_groups=groups, checkpoint_dir=checkpoint, available_now=True,
        console=False)


def multiset(records: list[tuple[str, dict[str, Any]]], *, clock: bool) -> Counter[tuple[str, bytes]]:
    """Records regardless of order; without ``clock`` the engine's ``emitted_at`` (its CLOCK, the largest
    timestamp its key group has seen) is set aside: the one field a group does not share with the stream."""
    return Counter((key, orjson.dumps({k: v for k, v in value.items() if clock or k != "emitted_at"},
                                      option=orjson.OPT_SORT_KEYS)) for key, value in records)


def test_g1_and_g4_give_the_pure_engines_records(kafka: Any, spark: Any, topic_prefix: str, tmp_path: Path) -> None:
    batches = trace(seed=3)
    results: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for groups in (1, 4):
        topics = TopicNames(f"{topic_prefix}g{groups}")
        for batch in batches:  # two runs from one checkpoint: two micro-batches, as the pure core is fed
            produce(kafka.bootstrap_servers, topics.events("store"), batch)
            query = sequence_job.start(spark, options(kafka.bootstrap_servers, topics.prefix, groups,
                                                      str(tmp_path / f"ckpt-{groups}")))
            query.awaitTermination()
            assert query.exception() is None
            # One state row per (stream, key group): every group got the punctuation, so every group has state.
            assert query.lastProgress["stateOperators"][0]["numRowsTotal"] == groups
        results[groups] = [((k or b"").decode(), orjson.loads(v))
                           for k, v in read_topic(kafka.bootstrap_servers, topics.results("sequence"))]
    expected = expected_records(batches, TopicNames(f"{topic_prefix}g1").events("store"))
    kinds = Counter(v["record"] for _, v in expected)
    assert kinds["match"] > 0 and kinds["late_match"] > 0 and kinds["too_late"] > 0
    assert multiset(results[1], clock=True) == multiset(expected, clock=True)
    assert multiset(results[4], clock=False) == multiset(expected, clock=False)


# Key values as JSON, the way the gateway's records and others may carry them.
KEY_VALUES = ["1", "1.0", "1e0", "1.5", "-0.0", "0", "1e20", "1e-4", "0.001", "1234567.0", "1e7", "0.1", "123.456",
              "12345678901234567890123", "1180591620717411303424", "9007199254740993",
              "1.7976931348623157e308", "true", "false", "null", '"1"', '"007"', '" 2 "', '"1d"', '"0x1p3"', '"inf"',
              '"NaN"', '"-Infinity"', '"x"', '""', '"True"', '"true"', '"1e400"', '"\\u00e9t\\u00e9"',
              '{"a":1.5,"b":[1,"x"]}', "[1e20]", "[]"]


def test_the_python_routing_gives_every_key_the_group_the_jvm_routing_of_earlier_builds_gave(spark: Any) -> None:
    """A checkpoint made by a build that routed in the JVM keeps its keys in their groups: the earlier build's
    expression (the key's JSON text as Spark's get_json_object gives it; true/false as 1/0; what Spark casts to a
    double by that double plus 0.0 cast to string; else the text; no key ""), run here by Spark, against
    spark_jobs.key_routing.canonical_key_text on the value orjson parses. Not in the table: subnormal doubles, which
    this JDK (17) prints with other digits than the shortest (5e-324 as 4.9E-324; Python: 5.0E-324)."""
    from pyspark.sql import functions as F

    from spark_jobs.key_routing import canonical_key_text

    frame = spark.createDataFrame([(f'{{"k":{value}}}',) for value in KEY_VALUES], "record string")
    key_text = F.get_json_object(F.col("record"), "$.k")
    numeric = F.when(key_text == "true", F.lit("1")).when(key_text == "false", F.lit("0")).otherwise(key_text)
    number = numeric.try_cast("double")
    text = F.when(number.isNotNull(), (number + F.lit(0.0)).cast("string")).otherwise(F.coalesce(key_text, F.lit("")))
    group = F.pmod(F.crc32(text.cast("binary")), F.lit(7)).cast("int")
    rows = frame.select("record", text.alias("text"), group.alias("group")).collect()
    jvm = {row["record"]: (row["text"], row["group"]) for row in rows}
    python = {}
    for value in KEY_VALUES:
        canonical = canonical_key_text(orjson.loads(f'{{"k":{value}}}')["k"])
        python[f'{{"k":{value}}}'] = (canonical, key_group(canonical, 7))
    assert python == jvm


PATTERN = "SEQ(a: type == 'SHELF', b: type == 'EXIT') PARTITION BY id WITHIN 60 ms MODE per_event MAX_UNCERTAINTY 5 ms"


def test_pattern_job_with_g1_and_g4_gives_the_pure_cores_records(kafka: Any, spark: Any, topic_prefix: str,
                                                                 tmp_path: Path) -> None:
    from spark_jobs import pattern as pattern_job

    rows = [record for batch in trace(seed=5) for record in batch]
    for i, record in enumerate(rows):
        if record["kind"] == "event":
            record["uncertainty_us"] = (i * 7919) % (4 * MS)
    results: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for groups in (1, 4):
        topics = TopicNames(f"{topic_prefix}p{groups}")
        produce(kafka.bootstrap_servers, topics.events("store"), rows)
        query = pattern_job.start(spark, pattern_job.PatternOptions(
            bootstrap_servers=kafka.bootstrap_servers, pattern=PATTERN, topic_prefix=topics.prefix,
            streams=("store",), allowed_lateness_us=LATENESS_US, key_groups=groups,
            checkpoint_dir=str(tmp_path / f"ckpt-p{groups}"), available_now=True, console=False))
        query.awaitTermination()
        assert query.lastProgress["stateOperators"][0]["numRowsTotal"] == groups
        results[groups] = [((k or b"").decode(), orjson.loads(v))
                           for k, v in read_topic(kafka.bootstrap_servers, topics.results("pattern"))]
    events_topic = TopicNames(f"{topic_prefix}p1").events("store")
    core = pattern_job.PatternStreamCore("store", PatternSpec.parse(PATTERN), 0, False, LATENESS_US, None)
    expected = run_stream_batch(StreamReadProgress(1, events_topic), core, [
        {**record, "payload": orjson.dumps(record["payload"]).decode() if "payload" in record else None,
         "topic": events_topic, "partition": 0, "offset": offset} for offset, record in enumerate(rows)],
        job="pattern", stream="store")
    assert Counter(v["record"] for _, v in expected)["match"] > 0
    assert multiset(results[1], clock=True) == multiset(expected, clock=True)
    assert multiset(results[4], clock=True) == multiset(expected, clock=True)


ISEQ = "EVENT ISEQ[m.te = h.ts](MEDIUM m, HIGH h; 2 s) WHERE m.source = h.source"


def iseq_trace(seed: int) -> list[list[dict[str, Any]]]:
    """Two batches of one stream for ISEQ: temperature readings of three sources (--from-points: level intervals
    keyed by their source), MEDIUM and HIGH events whose payload names a source (``5`` and ``5.0`` are one key,
    ``"5"`` another, equal to the source id "5") as atomic intervals, endpoint pairs and v1 points, meeting each
    other and the levels just read; a numeric string as a reading (rejected) and an event without a type; the
    second batch opens with events behind the first batch's punctuation (too late). Each batch ends with a
    punctuation."""
    rnd = random.Random(seed)
    batches: list[list[dict[str, Any]]] = []
    seqs: Counter[str] = Counter()
    temps = {"t1": 70, "t2": 70, "5": 70}
    now_us = 0

    def event(source: str, ref_us: int, payload: Any, **fields: Any) -> dict[str, Any]:
        seq = seqs[source]
        seqs[source] += 1
        return {**event_record("plant", source, seq, BASE_US + ref_us, 0, payload), **fields}

    def interval(source: str, start_us: int, end_us: int, payload: Any) -> list[dict[str, Any]]:
        shape = rnd.choice(["atomic", "atomic", "pair", "point"])
        if shape == "point" or start_us == end_us:
            return [event(source, end_us, payload)]
        v2 = {"v": 2}
        if shape == "atomic":
            return [event(source, end_us, payload, start_ts_us=BASE_US + start_us, **v2)]
        iid = f"i{seqs[source]}"
        return [event(source, at_us, payload, start_ts_us=BASE_US + at_us, interval_id=iid, endpoint=endpoint, **v2)
                for at_us, endpoint in ((start_us, "start"), (end_us, "end"))]

    for number in range(2):
        rows: list[dict[str, Any]] = []
        if number:
            for behind_us in (150 * MS, 400 * MS):
                rows += interval("late", now_us - behind_us, now_us - behind_us, {"type": "HIGH", "source": "t1"})
        for _ in range(60):
            now_us += rnd.randrange(20 * MS, 80 * MS)
            for source in rnd.sample(sorted(temps), 2):
                temps[source] = max(0, min(160, temps[source] + rnd.choice([-40, -20, 0, 20, 40])))
                rows.append(event(source, now_us, {"temp": temps[source]}))
            named = rnd.choice(["t1", "t2", "5", 5, 5.0, True])
            if rnd.random() < 0.5:  # a MEDIUM of a payload's source ending now; a HIGH starting now
                rows += interval(f"e{rnd.randrange(3)}", now_us - rnd.choice([0, 30 * MS, 200 * MS]), now_us,
                                 {"type": "MEDIUM", "source": named})
            if rnd.random() < 0.5:
                rows += interval(f"e{rnd.randrange(3)}", now_us, now_us + rnd.choice([0, 10 * MS]),
                                 {"type": "HIGH", "source": rnd.choice([named, named, 1])})
            if rnd.random() < 0.03:
                rows.append(event("t1", now_us, {"temp": "55"}))
                rows.append(event("e0", now_us, {"type": 7, "source": "t1"}))
        rows.append(punctuation_record("plant", BASE_US + now_us - 100 * MS))
        batches.append(rows)
    return batches


def test_iseq_job_with_g1_and_g4_gives_the_pure_cores_records(kafka: Any, spark: Any, topic_prefix: str,
                                                              tmp_path: Path) -> None:
    from cep.intervals import parse_iseq
    from spark_jobs import iseq as iseq_job

    batches = iseq_trace(seed=7)
    results: dict[int, list[tuple[str, dict[str, Any]]]] = {}
    for groups in (1, 4):
        topics = TopicNames(f"{topic_prefix}i{groups}")
        for batch in batches:  # two runs from one checkpoint: two micro-batches, as the pure core is fed
            produce(kafka.bootstrap_servers, topics.events("plant"), batch)
            query = iseq_job.start(spark, iseq_job.IseqOptions(
                bootstrap_servers=kafka.bootstrap_servers, query=ISEQ, topic_prefix=topics.prefix,
                streams=("plant",), from_points="temp", key_groups=groups,
                checkpoint_dir=str(tmp_path / f"ckpt-i{groups}"), available_now=True, console=False))
            query.awaitTermination()
            assert query.exception() is None
            assert query.lastProgress["stateOperators"][0]["numRowsTotal"] == groups
        results[groups] = [((k or b"").decode(), orjson.loads(v))
                           for k, v in read_topic(kafka.bootstrap_servers, topics.results("iseq"))]
    events_topic = TopicNames(f"{topic_prefix}i1").events("plant")
    options = iseq_job.IseqOptions("", ISEQ, from_points="temp")
    core = iseq_job.IseqStreamCore("plant", parse_iseq(ISEQ), iseq_job.engine_config(options), options, None)
    progress = StreamReadProgress(1, events_topic)
    expected: list[tuple[str, dict[str, Any]]] = []
    offset = 0
    for batch in batches:
        rows = []
        for record in batch:
            payload = record.get("payload")
            rows.append({**record, "payload": None if payload is None else orjson.dumps(payload).decode(),
                         "topic": events_topic, "partition": 0, "offset": offset})
            offset += 1
        expected += run_stream_batch(progress, core, rows, job="iseq", stream="plant")
    # Levels meet levels of their source, and payloads naming it (ids: "<source>~<n>", "e<k>:<seq>", "e<k>#i<n>").
    sources = [{m["event_id"][:2] for m in v["members"]} for _k, v in expected if v["record"] == "match"]
    assert {"t1"} in sources and {"5~"} in sources and any(s & {"t1", "t2"} and s - {"t1", "t2"} for s in sources)
    assert {v.get("reason") for _k, v in expected} >= {"behind_clock", "bad_value", "no_event_type"}
    assert multiset(results[1], clock=True) == multiset(expected, clock=True)
    assert multiset(results[4], clock=True) == multiset(expected, clock=True)
