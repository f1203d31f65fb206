"""The demo's second half: the CEP jobs on the demo's stream, each checked against its pure core."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import typer

from broker.reader import read_stream, read_topic
from contract.topics import TopicNames

STREAM = "sensors"
PATTERN = "SEQ(hot: celsius > 24, cold: celsius < 16) WITHIN 300 ms MODE per_event MAX_UNCERTAINTY 50 ms"
SEQUENCE = "EVENT SEQ(HOT h, !(OK o), COLD c) WITHIN 200 ms"
# Interval events from point readings (Li 2010 5.4.2): each source's celsius becomes COLD / OK / HOT level
# intervals, and ISEQ finds an OK spell that a HOT spell directly follows (Allen's "meets").
LEVELS = "COLD,17.5,OK,22.5,HOT"
ISEQ = "EVENT ISEQ[o.te = h.ts](OK o, HOT h; 1 s) WHERE o.source = h.source"


def run_cep_jobs(bootstrap: str, true_us: dict[tuple[str, int], int]) -> bool:
    """true_us: (source_id, seq) -> the true time the event was sent."""
    from spark_jobs import iseq, pattern, sequence, three_window
    from spark_jobs.session import create_spark_session, stop_spark

    # The stream's promise before the jobs start: the interval job has certainly passed it (the gateway keeps
    # punctuating while the jobs run, so the job may have seen a later one).
    _, punctuations = read_stream(bootstrap, TopicNames().events(STREAM))
    promise_us = max((p["watermark_us"] for p in punctuations), default=0)
    spark = create_spark_session("skewless-demo-cep")
    try:
        for query in (
            three_window.start(spark, three_window.ThreeWindowOptions(
                bootstrap_servers=bootstrap, streams=(STREAM,), value_field="celsius", max_shift_us=50_000,
                available_now=True, console=False)),
            pattern.start(spark, pattern.PatternOptions(
                bootstrap_servers=bootstrap, pattern=PATTERN, streams=(STREAM,), available_now=True, console=False)),
            sequence.start(spark, sequence.SequenceOptions(
                bootstrap_servers=bootstrap, query=SEQUENCE, streams=(STREAM,), available_now=True, console=False)),
            iseq.start(spark, iseq.IseqOptions(
                bootstrap_servers=bootstrap, query=ISEQ, streams=(STREAM,), from_points="celsius", levels=LEVELS,
                available_now=True, console=False)),
        ):
            query.awaitTermination()
    finally:
        stop_spark(spark)
    records, _ = read_stream(bootstrap, TopicNames().events(STREAM))
    return all([check_three_window(bootstrap, records, true_us), check_pattern(bootstrap, records),
                check_sequence(bootstrap, records), check_iseq(bootstrap, records, promise_us)])


def _results(bootstrap: str, job: str) -> list[dict[str, Any]]:
    return [orjson.loads(v) for _k, v in read_topic(bootstrap, TopicNames().results(job))]


def check_three_window(bootstrap: str, records: list[dict[str, Any]], true_us: dict[tuple[str, int], int]) -> bool:
    results = _results(bootstrap, "three_window")
    finals = {r["nominal_start_us"]: r for r in results if r["record"] == "final"}
    middles = {r["nominal_start_us"]: r["count"] for r in results
               if r["record"] == "window" and r["window_type"] == "MIDDLE"}
    by_ref = Counter(r["ref_ts_us"] - r["ref_ts_us"] % 1_000_000 for r in records)
    by_true = Counter(t - t % 1_000_000 for t in true_us.values())
    typer.echo(f"\nthree_window (1 s, shift = each event's uncertainty): {len(finals)} windows released")
    typer.echo(f"{'window (UTC s)':>16} {'true':>6} {'LOW':>5} {'MIDDLE':>7} {'HIGH':>5} {'3-window avg':>13} "
               f"{'avg celsius':>12}")
    for start in sorted(finals):
        f = finals[start]
        low, middle, high = f["window_counts"]
        typer.echo(f"{start // 1_000_000:>16} {by_true.get(start, 0):>6} {low:>5} {middle:>7} {high:>5} "
                   f"{f['count']:>13.2f} {f['avg'] or 0:>12.3f}")
    ok = bool(finals) and all(middles[t] == by_ref[t] for t in middles)
    if not ok:
        typer.echo(f"MISMATCH: MIDDLE windows {middles} vs records {dict(by_ref)}")
    return ok


def check_pattern(bootstrap: str, records: list[dict[str, Any]]) -> bool:
    from cep.patterns import PatternSpec, UncertainPatternMatcher
    from spark_jobs.pattern import event_ref

    matcher = UncertainPatternMatcher(PatternSpec.parse(PATTERN))
    expected: list[tuple[Any, ...]] = []
    for r in sorted(records, key=lambda r: r["ref_ts_us"]):
        ref = event_ref(r["source_id"], r["seq"], r["ref_ts_us"], r["uncertainty_us"], r["payload"])
        for m in matcher.on_event(r["ref_ts_us"], r["uncertainty_us"], r["payload"], ref):
            expected.append((str(m.confidence), tuple((e["source_id"], e["seq"]) for e in m.events)))
    got = [(r["confidence"], tuple((e["source_id"], e["seq"]) for e in r["events"]))
           for r in _results(bootstrap, "pattern") if r["record"] == "match"]
    labels = Counter(label for label, _ in got)
    typer.echo(f"\npattern {PATTERN!r}: {labels.get('Confirmed', 0)} Confirmed, {labels.get('Uncertain', 0)} "
               f"Uncertain")
    ok = sorted(got) == sorted(expected)
    if not ok:
        typer.echo(f"MISMATCH: Spark {len(got)} matches vs pure matcher {len(expected)}")
    return ok


def check_sequence(bootstrap: str, records: list[dict[str, Any]]) -> bool:
    from cep.sase import SaseEvent, parse_query, reference_matches

    events = [SaseEvent(r["payload"]["type"], r["ref_ts_us"], r["payload"], f"{r['source_id']}:{r['seq']}")
              for r in records]
    valid = {tuple(e.event_id for e in m) for m in reference_matches(parse_query(SEQUENCE), events)}
    got = [tuple(e["event_id"] for e in r["events"]) for r in _results(bootstrap, "sequence")
           if r["record"] == "match"]
    typer.echo(f"\nsequence {SEQUENCE!r}: {len(got)} matches released (conservative: each permanently valid), "
               f"{len(valid)} in the complete stream")
    ok = set(got) <= valid and len(got) == len(set(got))
    if not ok:
        typer.echo(f"MISMATCH: {sorted(set(got) - valid)} are not matches of the sorted stream")
    return ok


def check_iseq(bootstrap: str, records: list[dict[str, Any]], promise_us: int) -> bool:
    from cep.intervals import Interval, PointToIntervalOperator, parse_iseq, reference_keys
    from spark_jobs.iseq import parse_levels

    intervals: list[Interval] = []
    for source in sorted({r["source_id"] for r in records}):
        op = PointToIntervalOperator(source, parse_levels(LEVELS))
        for r in sorted((r for r in records if r["source_id"] == source), key=lambda r: r["ref_ts_us"]):
            intervals += [Interval(i.event_type, i.start_ts_us, i.end_ts_us, i.attrs,
                                   f"{source}~{(i.event_id or '').rsplit(':', 1)[-1]}")
                          for i in op.on_reading(r["ref_ts_us"], r["payload"]["celsius"]) if isinstance(i, Interval)]
    query = parse_iseq(ISEQ)
    valid = set(reference_keys(query, intervals))
    certain = set(reference_keys(query, [i for i in intervals if i.end_ts_us < promise_us]))
    got = [tuple((m["event_type"], m["start_ts_us"], m["end_ts_us"], m["event_id"]) for m in r["members"])
           for r in _results(bootstrap, "iseq") if r["record"] == "match"]
    typer.echo(f"\niseq {ISEQ!r} over level intervals {LEVELS!r}: {len(intervals)} intervals, {len(got)} matches "
               f"released, {len(valid)} in the complete stream")
    ok = certain <= set(got) <= valid and len(got) == len(set(got))
    if not ok:
        typer.echo(f"MISMATCH: {sorted(set(got) - valid)} are not matches; {sorted(certain - set(got))} missing")
    return ok
