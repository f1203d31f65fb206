"""The three_window and pattern jobs on real Kafka + Spark, with hand-computed expected outputs."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.reader import read_topic
from contract.topics import TopicNames
from spark_jobs import pattern as pattern_job
from spark_jobs import three_window
from tests.integration.spark_job_support import (
    BASE_US,
    event_record,
    produce,
    punctuation_record,
    wait_for_results,
)

pytestmark = [pytest.mark.integration, pytest.mark.spark]

MS = 1_000

# (offset_ms, uncertainty_ms, value). Width 1 s, per-event shift = uncertainty:
#   e0 100/20 -> LOW 0, MIDDLE 0, HIGH 0      e1 990/20 -> LOW 1 (1010), MIDDLE 0, HIGH 0 (970)
#   e2 1010/20 -> LOW 1, MIDDLE 1, HIGH 0 (990)   e3 1500/0 -> 1, 1, 1    e4 2030/40 -> LOW 2, MIDDLE 2, HIGH 1 (1990)
WINDOW_TRACE = [(100, 20, 10.0), (990, 20, 20.0), (1010, 20, 30.0), (1500, 0, 40.0), (2030, 40, 50.0)]
EXPECTED_WINDOWS = {  # (type, k): (count, sum)
    ("LOW", 0): (1, 10.0), ("LOW", 1): (3, 90.0), ("LOW", 2): (1, 50.0),
    ("MIDDLE", 0): (2, 30.0), ("MIDDLE", 1): (2, 70.0), ("MIDDLE", 2): (1, 50.0),
    ("HIGH", 0): (3, 60.0), ("HIGH", 1): (2, 90.0),
}
EXPECTED_FINALS = {  # k: (mean count, mean sum, mean of the windows' averages)
    0: (2.0, 100.0 / 3, 15.0),
    1: (7 / 3, 250.0 / 3, (30.0 + 35.0 + 45.0) / 3),
}


def window_trace(stream: str) -> list[dict[str, Any]]:
    records = [event_record(stream, "s1", i, BASE_US + ms * MS, unc * MS, {"value": value})
               for i, (ms, unc, value) in enumerate(WINDOW_TRACE)]
    return [*records, punctuation_record(stream, BASE_US + 10_000 * MS)]


def latest_by_key(records: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[str, Any]]:
    out: dict[tuple[str, str, int], dict[str, Any]] = {}
    for r in records:
        kind = "ALL" if r["record"] == "final" else r.get("window_type", "")
        out[(r["record"], kind, (r["nominal_start_us"] - BASE_US) // 1_000_000)] = r
    return out


def test_three_window_job_matches_the_hand_computed_windows(kafka, spark, topic_prefix, tmp_path):
    topics = TopicNames(topic_prefix)
    produce(kafka.bootstrap_servers, topics.events("temps"), window_trace("temps"))
    query = three_window.start(spark, three_window.ThreeWindowOptions(
        bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, streams=("temps",),
        width_us=1_000_000, max_shift_us=50 * MS, checkpoint_dir=str(tmp_path / "ckpt"), console=False,
        processing_time="500 milliseconds"))
    try:
        records = wait_for_results(
            kafka.bootstrap_servers, topics.results("three_window"),
            lambda rs: sum(r["record"] == "final" for r in rs) >= 3, query)
        query.processAllAvailable()
    finally:
        query.stop()
    by_key = latest_by_key(records)
    windows = {(t, k): (r["count"], r["sum"]) for (rec, t, k), r in by_key.items() if rec == "window" and r["count"]}
    assert windows == EXPECTED_WINDOWS
    for k, (count, total, avg) in EXPECTED_FINALS.items():
        final = by_key[("final", "ALL", k)]
        assert final["count"] == pytest.approx(count)
        assert final["sum"] == pytest.approx(total)
        assert final["avg"] == pytest.approx(avg)
    assert by_key[("final", "ALL", 2)]["window_counts"] == [1, 1, 0]
    assert not [r for r in records if r["record"] == "late"]
    assert all(r["stream"] == "temps" for r in records)


# Thesis mode, T_a = 10 ms, PARTITION BY team, WITHIN 2 s (Pseudocode 3.1 / Query 5.9):
#   a: kick 1.000 -> goal 1.044  gap 44 ms > T_a: Confirmed
#   b: kick 2.000 -> goal 2.005  gap 5 ms <= T_a: Uncertain
#   c: goal 3.000 -> kick 3.008  reversed, 8 ms <= T_a: Uncertain
#   d: goal 4.000 -> kick 4.050  reversed, 50 ms > T_a: nothing
#   e: kick 5.000 -> goal 7.500  beyond WITHIN: nothing
PATTERN_TRACE = [("a", "kick", 1000), ("a", "goal", 1044), ("b", "kick", 2000), ("b", "goal", 2005),
                 ("c", "goal", 3000), ("c", "kick", 3008), ("d", "goal", 4000), ("d", "kick", 4050),
                 ("e", "kick", 5000), ("e", "goal", 7500)]


def test_pattern_job_labels_confirmed_and_uncertain_exactly(kafka, spark, topic_prefix, tmp_path, capsys):
    topics = TopicNames(topic_prefix)
    records = [event_record("match", f"cam-{team}", i, BASE_US + ms * MS, 5 * MS, {"team": team, "kind": kind})
               for i, (team, kind, ms) in enumerate(PATTERN_TRACE)]
    produce(kafka.bootstrap_servers, topics.events("match"),
            [*records, punctuation_record("match", BASE_US + 20_000 * MS)])
    query = pattern_job.start(spark, pattern_job.PatternOptions(
        bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, streams=("match",),
        pattern="SEQ(kick: kind == 'kick', goal: kind == 'goal') PARTITION BY team WITHIN 2 s MODE thesis",
        ta_us=10 * MS, checkpoint_dir=str(tmp_path / "ckpt"), console=True, processing_time="500 milliseconds"))
    try:
        wait_for_results(kafka.bootstrap_servers, topics.results("pattern"), lambda rs: len(rs) >= 3, query)
        query.processAllAvailable()
    finally:
        query.stop()
    results = [orjson.loads(v) for _k, v in read_topic(kafka.bootstrap_servers, topics.results("pattern"))]
    got = sorted((r["partition"], r["confidence"], tuple(r["gaps_us"]), r["in_observed_order"]) for r in results)
    assert got == [("a", "Confirmed", (44 * MS,), True), ("b", "Uncertain", (5 * MS,), True),
                   ("c", "Uncertain", (-8 * MS,), False)]
    for r in results:
        assert [e["payload"]["kind"] for e in r["events"]] == ["kick", "goal"]
        assert r["tolerances_us"] == [10 * MS]
    # The console shows exactly what went to Kafka (one execution of the micro-batch for both).
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[pattern batch")]
    assert sorted(orjson.loads(line.split("] ", 1)[1])["partition"] for line in printed) == ["a", "b", "c"]


def test_pattern_job_reports_the_matches_its_cap_truncates(kafka, spark, topic_prefix, tmp_path):
    # Issue 25 item 3: 1,200 kicks and one goal for one team complete 1,200 matches. The matcher reports 1,000 (its
    # default max_matches_per_event); the other 200 must reach the results topic as one `truncated` record.
    topics = TopicNames(topic_prefix)
    kicks = [event_record("burst", "cam", i, BASE_US + i * MS, 0, {"team": "a", "kind": "kick"})
             for i in range(1_200)]
    goal = event_record("burst", "cam", 1_200, BASE_US + 5_000 * MS, 0, {"team": "a", "kind": "goal"})
    produce(kafka.bootstrap_servers, topics.events("burst"),
            [*kicks, goal, punctuation_record("burst", BASE_US + 20_000 * MS)])
    query = pattern_job.start(spark, pattern_job.PatternOptions(
        bootstrap_servers=kafka.bootstrap_servers, topic_prefix=topic_prefix, streams=("burst",),
        pattern="SEQ(kick: kind == 'kick', goal: kind == 'goal') PARTITION BY team WITHIN 1 h MODE per_event",
        checkpoint_dir=str(tmp_path / "ckpt"), console=False, processing_time="500 milliseconds"))
    try:
        wait_for_results(kafka.bootstrap_servers, topics.results("pattern"),
                         lambda rs: any(r["record"] == "truncated" for r in rs), query)
        query.processAllAvailable()
    finally:
        query.stop()
    results = [orjson.loads(v) for _k, v in read_topic(kafka.bootstrap_servers, topics.results("pattern"))]
    kinds: dict[str, int] = {}
    for r in results:
        kinds[r["record"]] = kinds.get(r["record"], 0) + 1
    assert kinds == {"match": 1_000, "truncated": 1}
    (truncated,) = [r for r in results if r["record"] == "truncated"]
    assert (truncated["reason"], truncated["truncated_matches"], truncated["reported_matches"], truncated["limit"],
            truncated["partition"], truncated["seq"]) == ("max_matches_per_event", 200, 1_000, 1_000, "a", 1_200)
    # 1,000 reported + 200 counted = every kick paired with the goal exactly once.
    assert len({r["events"][0]["seq"] for r in results if r["record"] == "match"}) == 1_000
