"""Exact event time end to end on real Kafka + Spark (issue 12, item 1 and 2).

The default invocation (no --stream: every events and late topic of the prefix), two streams of which one lags the
other by 5 s, a two-partition events topic with its own punctuations per partition, a legal reference-time
inversion after a punctuation, the job restarted from its checkpoint between two parts of the data, and late
events from the late topic. Every event must be counted exactly once in its window (checked against a brute-force
count over everything written), corrections must carry the key of the window they revise, and Spark's own
late-row filter must never fire (``numRowsDroppedByWatermark`` read from every query progress).
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import orjson
import pytest
from confluent_kafka import Producer

from broker.admin import ensure_topics
from broker.reader import read_topic
from contract.topics import TopicNames
from spark_jobs import three_window, window_count
from tests.integration.spark_job_support import BASE_US, event_record, punctuation_record

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MS = 1_000
W_US = 1_000_000
# (stream, topic kind, partition, ("e", ref ms) | ("p", watermark ms)). Stream "fast" runs 5 s ahead of "slow".
PART_1 = [
    ("fast", "events", 0, [("e", 10_100), ("e", 10_400), ("e", 11_200), ("e", 11_900), ("p", 11_500),
                           ("e", 11_600)]),  # 11 600 < 11 900 but >= the 11 500 promise: a legal inversion
    ("fast", "events", 1, [("e", 10_300), ("e", 10_800), ("e", 11_000), ("p", 11_300)]),
    ("slow", "events", 0, [("e", 5_100), ("e", 5_900), ("p", 5_500), ("e", 5_600)]),
]
PART_2 = [
    ("fast", "events", 0, [("e", 12_100), ("p", 12_500), ("e", 12_600), ("p", 20_000)]),
    ("fast", "events", 1, [("e", 11_400), ("e", 12_200), ("p", 20_000)]),
    ("slow", "events", 0, [("e", 5_800), ("e", 6_100), ("p", 7_000)]),
    # Late events the gateway diverted: [10 s, 11 s) of "fast" went out in part 1, so this one corrects it.
    ("fast", "late", 0, [("e", 10_200)]),
    ("slow", "late", 0, [("e", 5_050)]),
]
# Released by the end: fast up to 20 s, slow up to 7 s (slow still lags: its later windows stay open).
FINAL_WATERMARK_MS = {"fast": 20_000, "slow": 7_000}


def write(bootstrap: str, prefix: str, part: list[tuple[str, str, int, list[tuple[str, int]]]],
          first_seq: int) -> list[tuple[str, int]]:
    """Produce one part; returns the (stream, ref_ts_us) of every event written."""
    topics = TopicNames(prefix)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    written: list[tuple[str, int]] = []
    seq = first_seq
    for stream, kind, partition, items in part:
        topic = topics.events(stream) if kind == "events" else topics.late(stream)
        for what, ms in items:
            if what == "p":
                producer.produce(topic, key=b"__punctuation__", partition=partition,
                                 value=orjson.dumps(punctuation_record(stream, BASE_US + ms * MS)))
                continue
            record = event_record(stream, f"{stream}-{partition}", seq, BASE_US + ms * MS, 0, {"value": 1})
            if kind == "late":
                record.update(late=True, late_reason="source_timeout")
            producer.produce(topic, key=record["source_id"].encode(), partition=partition, value=orjson.dumps(record))
            written.append((stream, BASE_US + ms * MS))
            seq += 1
    assert producer.flush(30) == 0
    return written


def create_topics(bootstrap: str, prefix: str) -> None:
    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.events("fast"), topics.late("fast")], partitions=2)
    ensure_topics(bootstrap, [topics.events("slow"), topics.late("slow")], partitions=1)


def brute_force_counts(events: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """Every released window's true count: all events, on time and late, by tumbling window of ref time."""
    counts = Counter((stream, ts - ts % W_US) for stream, ts in events)
    return {(s, t): n for (s, t), n in counts.items() if t + W_US <= BASE_US + FINAL_WATERMARK_MS[s] * MS}


def dropped_rows(query: Any) -> list[int]:
    return [op["numRowsDroppedByWatermark"] for progress in query.recentProgress
            for op in orjson.loads(progress.json)["stateOperators"]]


def run_available_now(query: Any) -> list[int]:
    query.awaitTermination()
    assert query.exception() is None
    drops = dropped_rows(query)
    assert drops, "no state operator progress: the stateful operator did not run"
    return drops


def results(bootstrap: str, prefix: str, job: str) -> list[tuple[str, dict[str, Any]]]:
    return [(k.decode(), orjson.loads(v)) for k, v in read_topic(bootstrap, TopicNames(prefix).results(job))]


def final_by_key(records: list[tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """What a compacted results topic keeps: the last value per key."""
    return dict(records)


def test_window_count_counts_every_event_once_across_streams_partitions_restarts_and_late_data(
        kafka, spark, topic_prefix, tmp_path):
    bootstrap = kafka.bootstrap_servers
    create_topics(bootstrap, topic_prefix)
    options = window_count.WindowCountOptions(
        bootstrap_servers=bootstrap, topic_prefix=topic_prefix, checkpoint_dir=str(tmp_path / "ckpt"),
        available_now=True, console=False, allowed_lateness_us=5_000 * MS)
    written = write(bootstrap, topic_prefix, PART_1, 0)
    drops = run_available_now(window_count.start(spark, options))
    first = results(bootstrap, topic_prefix, "window_count")
    # Part 1: fast's promise is min(11.5 s, 11.3 s) over its two partitions: only [10 s, 11 s) is out; slow's
    # 5.5 s releases nothing, and its events were not cut by fast running 6 s ahead.
    assert [(v["stream"], v["window_start_us"] - BASE_US, v["count"], v["revision"]) for _k, v in first] == [
        ("fast", 10_000_000, 4, 0)]

    written += write(bootstrap, topic_prefix, PART_2, len(written))
    drops += run_available_now(window_count.start(spark, options))  # restarted from the checkpoint
    # A crash after the sink wrote the last micro-batch but before Spark committed it: the restarted job replays
    # that batch, and the results sink, whose record in Kafka says the batch is committed, writes nothing.
    before = results(bootstrap, topic_prefix, "window_count")
    commits = tmp_path / "ckpt" / "commits"
    last = max(int(p.name) for p in commits.iterdir() if p.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # else Spark takes the leftover checksum for another writer
    drops += run_available_now(window_count.start(spark, options))
    replayed = results(bootstrap, topic_prefix, "window_count")
    assert replayed == before
    # Part 3: a late event for fast's [10 s, 11 s) after fast's promise reached 20 s: past the 5 s allowed lateness.
    write(bootstrap, topic_prefix, [("fast", "late", 1, [("e", 10_900)])], 100)
    drops += run_available_now(window_count.start(spark, options))

    records = results(bootstrap, topic_prefix, "window_count")
    windows = [(k, v) for k, v in records if v["record"] == "window"]
    final = {(v["stream"], v["window_start_us"]): v["count"] for v in final_by_key(windows).values()}
    assert final == brute_force_counts(written)
    # The correction: same key as the original, the next revision, the revised count; each record once.
    fast10 = [(v["count"], v["revision"]) for k, v in windows if k == f"fast|{BASE_US + 10_000_000}"]
    assert fast10 == [(4, 0), (5, 1)]
    slow5 = [(v["count"], v["revision"]) for k, v in windows if k == f"slow|{BASE_US + 5_000_000}"]
    # The late 5.05 s event arrived before its window was released: counted at once.
    assert slow5 == [(5, 0)]
    too_late = [v for _k, v in records if v["record"] == "too_late"]
    assert [(v["stream"], v["ref_ts_us"] - BASE_US, v["window_start_us"] - BASE_US) for v in too_late] == [
        ("fast", 10_900_000, 10_000_000)]
    assert drops == [0] * len(drops)
    assert not [v for _k, v in records if v["record"] == "dropped_by_watermark"]


def test_three_window_default_invocation_counts_every_event_once(kafka, spark, topic_prefix, tmp_path):
    bootstrap = kafka.bootstrap_servers
    create_topics(bootstrap, topic_prefix)
    options = three_window.ThreeWindowOptions(
        bootstrap_servers=bootstrap, topic_prefix=topic_prefix, width_us=W_US, max_shift_us=0,
        checkpoint_dir=str(tmp_path / "ckpt"), available_now=True, console=False)
    written = write(bootstrap, topic_prefix, PART_1, 0)
    drops = run_available_now(three_window.start(spark, options))
    written += write(bootstrap, topic_prefix, PART_2, len(written))
    drops += run_available_now(three_window.start(spark, options))

    final = final_by_key(results(bootstrap, topic_prefix, "three_window"))
    expected = brute_force_counts(written)
    # Uncertainty 0: LOW, MIDDLE and HIGH are the same tumbling window, and their average is its count.
    got_windows = {(v["stream"], v["window_type"], v["nominal_start_us"]): v["count"] for v in final.values()
                   if v["record"] == "window" and v["count"]}
    assert got_windows == {(s, t, start): n for (s, start), n in expected.items() for t in ("LOW", "MIDDLE", "HIGH")}
    got_finals = {(v["stream"], v["nominal_start_us"]): v["count"] for v in final.values()
                  if v["record"] == "final" and v["count"]}
    assert got_finals == pytest.approx({k: float(n) for k, n in expected.items()})
    revised = {k: v["revision"] for k, v in final.items() if v.get("revision")}
    assert revised == {f"fast|final|ALL|{BASE_US + 10_000_000}": 1,
                       **{f"fast|window|{t}|{BASE_US + 10_000_000}": 1 for t in ("LOW", "MIDDLE", "HIGH")}}
    assert drops == [0] * len(drops)


def test_a_job_with_a_spark_watermark_that_drops_rows_reports_them(kafka, spark, topic_prefix, tmp_path):
    """The monitor's failure path, on a user's job that declares Spark's watermark (the thing our jobs avoid): the
    inverted event is dropped by Spark, and that becomes a dropped_by_watermark result record, not silence."""
    from pyspark.sql import functions as F

    from spark_jobs.monitor import watch_watermark_drops
    from spark_jobs.stateful import read_contract_records

    bootstrap = kafka.bootstrap_servers
    topics = TopicNames(topic_prefix)
    ensure_topics(bootstrap, [topics.events("s"), topics.results("user_job")])
    records = read_contract_records(spark, bootstrap, [topics.events("s")])
    counted = (records.where(F.col("kind") == "event")
               .withColumn("event_time", F.timestamp_micros(F.col("ref_ts_us")))
               .withWatermark("event_time", "0 seconds")
               .groupBy(F.window("event_time", "1 second")).count())
    query = (counted.writeStream.outputMode("append").format("memory").queryName("user_job")
             .option("checkpointLocation", str(tmp_path / "ckpt")).start())
    report = watch_watermark_drops(spark, query, job="user_job", bootstrap_servers=bootstrap,
                                   output_topic=topics.results("user_job"))
    try:
        write(bootstrap, topic_prefix, [("s", "events", 0, [("e", 10_000), ("e", 20_000), ("p", 15_000)])], 0)
        query.processAllAvailable()
        write(bootstrap, topic_prefix, [("s", "events", 0, [("e", 16_000)])], 2)  # legal: above the 15 s promise
        query.processAllAvailable()
        assert sum(dropped_rows(query)) == 1  # Spark did drop it

        def reported() -> list[dict[str, Any]]:
            return [v for _k, v in results(bootstrap, topic_prefix, "user_job")
                    if v["record"] == "dropped_by_watermark"]

        deadline = time.monotonic() + 120  # the listener hears of a progress asynchronously
        while not reported() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        query.stop()
    assert [(v["job"], v["rows"]) for v in reported()] == [("user_job", 1)]
    assert report.dropped_total == 1
