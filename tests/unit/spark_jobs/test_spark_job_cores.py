"""The Spark jobs' core adapters without Spark: records are exact, state round-trips."""

from typing import Any

import orjson

from spark_jobs.three_window import ThreeWindowCore, ThreeWindowOptions

BASE = 1_700_000_000_000_000
ROWS = [  # (ref offset us, uncertainty us, payload, partition, offset)
    (990_000, 20_000, {"value": 20}, 0, 1),
    (100_000, 20_000, {"value": 10}, 0, 0),
    (1_010_000, 20_000, {"value": "n/a"}, 0, 2),
    (1_500_000, 0, {"other": 1}, 0, 3),
]


def rows() -> list[dict[str, Any]]:
    return [{"kind": "event", "stream": "s", "source_id": "a", "seq": off, "ref_ts_us": BASE + ts,
             "uncertainty_us": unc, "payload": orjson.dumps(p).decode(), "partition": part, "offset": off}
            for ts, unc, p, part, off in ROWS]


def core() -> ThreeWindowCore:
    return ThreeWindowCore("s", ThreeWindowOptions(bootstrap_servers="", width_us=1_000_000, max_shift_us=50_000),
                           0, None)


def test_the_row_path_releases_the_hand_computed_windows() -> None:
    by_rows = core()
    assert by_rows.on_rows(sorted(rows(), key=lambda r: r["ref_ts_us"])) == []
    released_rows = by_rows.on_watermark(BASE + 10_000_000)
    finals = {v["nominal_start_us"] - BASE: v for _k, v in released_rows if v["record"] == "final"}
    # MIDDLE 0 = {100 ms: 10, 990 ms: 20}; 1 010 ms carries no number, 1 500 ms no value field: counted only.
    middle0 = next(v for _k, v in released_rows
                   if v["record"] == "window" and v["window_type"] == "MIDDLE" and v["nominal_start_us"] == BASE)
    assert (middle0["count"], middle0["sum"], middle0["value_count"], middle0["revision"]) == (2, 30.0, 2, 0)
    # LOW 1 = 990+20, 1010+20, 1500 ; MIDDLE 1 = 1010, 1500 ; HIGH 1 = 1500 (990-20 and 1010-20 fall in HIGH 0).
    assert finals[1_000_000]["window_counts"] == [3, 2, 1]


def test_a_snapshot_restores_the_same_core() -> None:
    first = core()
    first.on_rows(sorted(rows(), key=lambda r: r["ref_ts_us"]))
    again = ThreeWindowCore("s", ThreeWindowOptions(bootstrap_servers=""), 0, first.snapshot())
    assert again.on_watermark(BASE + 10_000_000) == first.on_watermark(BASE + 10_000_000)


def test_the_aggregator_timer_is_the_next_release() -> None:
    from cep.three_window import ThreeWindowAggregator

    agg = ThreeWindowAggregator(1_000, max_shift_us=50)
    assert agg.next_release_us() is None
    agg.add(1_200, 1.0, 10)  # LOW/MIDDLE/HIGH slots of t = 1000; HIGH waits for max_shift
    assert agg.next_release_us() == 2_050  # emit_early=False: all three at t + w + max_shift
    assert agg.advance(2_049) == []
    assert len(agg.advance(2_050)) == 4  # three windows + the final
    assert agg.next_release_us() is None


def test_the_sequence_engine_timer_and_idleness() -> None:
    from cep.sase import EngineConfig, SaseEvent, SequenceEngine, parse_query

    engine = SequenceEngine(parse_query("EVENT SEQ(A a, !(N n), B b) WITHIN 100"), EngineConfig(allowed_lateness_us=0))
    assert engine.is_idle() and engine.next_timer_us() is None
    engine.on_event(SaseEvent("A", 10))
    assert engine.on_event(SaseEvent("B", 20)) == []  # held: an N between 10 and 20 may still come
    timer = engine.next_timer_us()
    assert timer is not None and timer <= 20
    assert [o.kind for o in engine.on_punctuation(20)] == ["match"]
    engine.on_punctuation(1_000)
    assert engine.is_idle() and engine.next_timer_us() is None


def test_thesis_t_a_follows_the_records_round_trips_while_the_job_runs() -> None:
    from spark_jobs.stateful import StreamReadProgress, run_stream_batch

    options = ThreeWindowOptions(bootstrap_servers="", width_us=1_000_000, shift_mode="thesis")
    live, fixed = ThreeWindowCore("s", options, 0, None), ThreeWindowCore(
        "s", ThreeWindowOptions(bootstrap_servers="", shift_mode="thesis", ta_us=9_000), 9_000, None)
    progress = StreamReadProgress(1)
    batch = [{**r, "rtt_us": 4_000 + 1_000 * i, "source_id": f"src-{i % 2}", "topic": "t"}
             for i, r in enumerate(sorted(rows(), key=lambda r: r["offset"]))]
    run_stream_batch(progress, live, batch[:2], job="three_window", stream="s")
    assert live.aggregator.ta_us == 5_000  # src-0 4 ms, src-1 5 ms
    run_stream_batch(progress, live, batch[2:], job="three_window", stream="s")
    assert live.aggregator.ta_us == 7_000  # src-0 re-synced at 6 ms, src-1 at 7 ms
    run_stream_batch(StreamReadProgress(1), fixed, batch, job="three_window", stream="s")
    assert fixed.aggregator.ta_us == 9_000  # --ta-us wins


def pattern_row(seq: int, ts_ms: int, kind: str, team: str = "a") -> dict[str, Any]:
    return {"kind": "event", "stream": "m", "source_id": "cam", "seq": seq, "ref_ts_us": BASE + ts_ms * 1_000,
            "uncertainty_us": 0, "payload": orjson.dumps({"team": team, "k": kind}).decode(), "topic": "t",
            "partition": 0, "offset": seq}


def test_a_late_event_completes_a_match_marked_late_and_a_too_late_one_is_said_so() -> None:
    from cep.patterns import PatternSpec
    from spark_jobs.pattern import PatternStreamCore

    spec = PatternSpec.parse("SEQ(x: k == 'kick', y: k == 'goal') PARTITION BY team WITHIN 2 s MODE thesis")
    core = PatternStreamCore("m", spec, 0, True, 5_000_000, None)
    assert core.on_rows([pattern_row(0, 1_000, "kick")]) == []
    assert core.on_watermark(BASE + 4_000_000) == []  # the kick waits for a goal within 2 s: none came in time
    # The goal at 1.5 s arrives late (from the late topic): it completes the match, flagged late.
    late = core.on_rows([pattern_row(1, 1_500, "goal")])
    assert [(v["record"], v["late"], [e["seq"] for e in v["events"]]) for _k, v in late] == [("match", True, [0, 1])]
    assert late[0][0] == "m|a|cam:0|cam:1"
    # A partition key never seen before still knows the stream's promise; past the allowed lateness: too_late.
    core.on_watermark(BASE + 9_000_000)
    too_late = core.on_rows([pattern_row(2, 1_000, "kick", team="b")])
    assert [(v["record"], v["partition"], v["seq"]) for _k, v in too_late] == [("too_late", "b", 2)]
    again = PatternStreamCore("m", spec, 0, True, 5_000_000, core.snapshot())
    assert again.watermark_us == BASE + 9_000_000


def sase_row(seq: int, ts: int, etype: str) -> dict[str, Any]:
    return {"kind": "event", "stream": "st", "source_id": "r", "seq": seq, "ref_ts_us": ts, "uncertainty_us": 0,
            "payload": orjson.dumps({"type": etype}).decode(), "topic": "t", "partition": 0, "offset": seq}


def test_conservative_sequence_job_says_what_it_did_with_each_late_event() -> None:
    from cep.sase import EngineConfig, parse_query
    from spark_jobs.sequence import SequenceStreamCore

    query = parse_query("EVENT SEQ(A a, !(N n), B b) WITHIN 100")
    core = SequenceStreamCore("st", query, EngineConfig(mode="conservative", allowed_lateness_us=1_000), "type",
                              None)
    core.on_rows([sase_row(0, 10, "A"), sase_row(1, 20, "B")])
    assert [(v["record"], k) for k, v in core.on_watermark(50)] == [("match", "st||r:0|r:1")]
    # A late N between them: the released match is reported invalidated, with the N as its cause.
    invalidated = core.on_rows([sase_row(2, 15, "N")])
    assert [(v["record"], k, v["cause"]["event_id"]) for k, v in invalidated] == [("invalidated", "st||r:0|r:1", "r:2")]
    # A late A and a late B after the N: a match completed late.
    core.on_rows([sase_row(3, 22, "A")])
    assert [(v["record"], k) for k, v in core.on_rows([sase_row(4, 45, "B")])] == [("late_match", "st||r:3|r:4")]
    core.on_watermark(5_000)
    too_late = core.on_rows([sase_row(5, 100, "A")])
    assert [(v["record"], k, v["reason"]) for k, v in too_late] == [
        ("too_late", "st|too_late|r|5", "beyond_allowed_lateness")]


def mixed_stream_batches() -> list[list[dict[str, Any]]]:
    """Three micro-batches of one stream as the shell sees them: events out of release order, a bad payload, a
    payload without the type field, a punctuation per batch, and late events (one still correctable, one past the
    allowed lateness)."""
    def ev(seq: int, ts_ms: int, kind: str, pid: int, payload: Any = None, unc: int | None = 300) -> dict[str, Any]:
        body = payload if payload is not None else orjson.dumps({"type": kind, "k": kind, "id": pid,
                                                                 "value": seq % 7}).decode()
        return {"kind": "event", "stream": "s", "source_id": f"src{seq % 3}", "seq": seq,
                "ref_ts_us": BASE + ts_ms * 1_000, "uncertainty_us": unc, "payload": body,
                "topic": "p.events.s", "partition": 0, "offset": seq}

    def punct(ms: int, offset: int) -> dict[str, Any]:
        return {"kind": "punctuation", "stream": "s", "watermark_us": BASE + ms * 1_000, "topic": "p.events.s",
                "partition": 0, "offset": offset}

    first = [ev(i, 10 * i + (5 if i % 4 == 0 else 0), "ABC"[i % 3], i % 2) for i in range(40)]
    first = first[::2] + first[1::2] + [ev(40, 405, "A", 0, payload="[1]"), ev(41, 407, "A", 0, payload="{}"),
                                        ev(42, 409, "B", 1, unc=None), punct(300, 43)]
    second = [ev(44 + i, 420 + 10 * i, "ABC"[i % 3], i % 2) for i in range(30)] + [punct(2_600, 80)]
    late = [{**ev(81, 250, "B", 0), "topic": "p.late.s"}, {**ev(82, 1, "A", 1), "topic": "p.late.s"},
            {**ev(83, 2_500, "C", 0), "topic": "p.late.s"}, punct(3_000, 84)]
    return [first, second, late]


def run_both_paths(make: Any) -> tuple[list[Any], list[Any]]:
    """The same batches through the columnar path (on_events) and through the rows path (on_rows)."""
    from spark_jobs.stateful import StreamReadProgress, run_stream_batch

    class RowsOnly:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def on_rows(self, rows: Any) -> Any:
            return self.inner.on_rows(rows)

        def on_watermark(self, watermark_us: int) -> Any:
            return self.inner.on_watermark(watermark_us)

        def set_ta_us(self, ta_us: int) -> None:
            self.inner.set_ta_us(ta_us)

        def snapshot(self) -> bytes:
            return bytes(self.inner.snapshot())

    columnar, by_rows = make(), RowsOnly(make())
    assert hasattr(columnar, "on_events")
    out_columns, out_rows = [], []
    progress_c, progress_r = StreamReadProgress(1, "p.events.s"), StreamReadProgress(1, "p.events.s")
    for batch in mixed_stream_batches():
        out_columns += run_stream_batch(progress_c, columnar, batch, job="j", stream="s")
        out_rows += run_stream_batch(progress_r, by_rows, batch, job="j", stream="s")
    assert columnar.snapshot() == by_rows.snapshot()
    return out_columns, out_rows


def test_the_columnar_path_gives_the_rows_path_records_for_every_job() -> None:
    from cep.patterns import PatternSpec
    from cep.sase import EngineConfig, parse_query
    from spark_jobs.pattern import PatternStreamCore
    from spark_jobs.sequence import SequenceStreamCore
    from spark_jobs.window_count import WindowCountCore, WindowCountOptions

    spec = PatternSpec.parse("SEQ(a: k == 'A', b: k == 'B') PARTITION BY id WITHIN 30 ms MODE per_event "
                             "MAX_UNCERTAINTY 1 ms")
    query = parse_query("EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 100 ms")
    lateness = 2_000_000
    makers = {
        "three_window": lambda: ThreeWindowCore("s", ThreeWindowOptions(
            bootstrap_servers="", width_us=100_000, max_shift_us=1_000, allowed_lateness_us=lateness), 0, None),
        "window_count": lambda: WindowCountCore("s", WindowCountOptions(
            bootstrap_servers="", width_us=100_000, allowed_lateness_us=lateness), None),
        "pattern": lambda: PatternStreamCore("s", spec, 0, False, lateness, None),
        "sequence": lambda: SequenceStreamCore("s", query, EngineConfig(
            mode="conservative", allowed_lateness_us=lateness), "type", None),
    }
    records: dict[str, set[str]] = {}
    for job, make in makers.items():
        by_columns, by_rows = run_both_paths(make)
        assert by_columns == by_rows, job
        records[job] = {v["record"] for _k, v in by_columns}
    # The trace reaches the interesting branches: releases, corrections or late matches, too-late, rejected.
    assert {"window", "final", "too_late"} <= records["three_window"]
    assert {"window", "too_late"} <= records["window_count"]
    assert {"match", "rejected", "too_late"} <= records["pattern"]
    assert {"match", "rejected", "too_late"} <= records["sequence"]


def test_the_columns_a_job_ships_to_python_give_the_records_of_every_column() -> None:
    """sequence and pattern ship only the shell's columns and their own (SEQUENCE_COLUMNS, PATTERN_COLUMNS): on
    the mixed trace (late, rejected and too-late events), rows cut to those columns give every record and the
    state that the rows with every contract column give."""
    from cep.patterns import PatternSpec
    from cep.sase import EngineConfig, parse_query
    from spark_jobs.pattern import PATTERN_COLUMNS, PatternStreamCore
    from spark_jobs.sequence import SEQUENCE_COLUMNS, SequenceStreamCore
    from spark_jobs.stateful import StreamReadProgress, run_stream_batch

    spec = PatternSpec.parse("SEQ(a: k == 'A', b: k == 'B') PARTITION BY id WITHIN 30 ms MODE per_event "
                             "MAX_UNCERTAINTY 1 ms")
    query = parse_query("EVENT SEQ(A a, B b, C c) WHERE a.id = b.id AND b.id = c.id WITHIN 100 ms")
    lateness = 2_000_000
    jobs: dict[str, tuple[tuple[str, ...], Any]] = {
        "pattern": (PATTERN_COLUMNS, lambda: PatternStreamCore("s", spec, 0, False, lateness, None)),
        "sequence": (SEQUENCE_COLUMNS, lambda: SequenceStreamCore("s", query, EngineConfig(
            mode="conservative", allowed_lateness_us=lateness), "type", None)),
    }
    for job, (shipped, make) in jobs.items():
        every: Any = make()
        cut: Any = make()
        progress_every, progress_cut = StreamReadProgress(1, "p.events.s"), StreamReadProgress(1, "p.events.s")
        out_every, out_cut = [], []
        for batch in mixed_stream_batches():
            rows = [{**row, "late": row["topic"] == "p.late.s", "late_reason": "x"} for row in batch]
            out_every += run_stream_batch(progress_every, every, rows, job=job, stream="s")
            out_cut += run_stream_batch(progress_cut, cut, [{c: row[c] for c in shipped if c in row} for row in rows],
                                        job=job, stream="s")
        assert out_cut == out_every, job
        assert cut.snapshot() == every.snapshot(), job
        assert {"match", "rejected", "too_late"} <= {v["record"] for _k, v in out_every}, job


def test_pattern_job_reports_every_match_it_truncates() -> None:
    # Issue 25 item 3: 1,200 `kick` and one `goal` for one team complete 1,200 matches; the matcher's default cap
    # reports 1,000 of them; the other 200 must reach the output as a `truncated` record with its reason and count.
    from cep.patterns import PatternSpec
    from contract.records import RESULT_TRUNCATED
    from spark_jobs.pattern import PatternStreamCore

    spec = PatternSpec.parse("SEQ(x: k == 'kick', y: k == 'goal') PARTITION BY team WITHIN 1 h MODE per_event")
    core = PatternStreamCore("m", spec, 0, True, 5_000_000, None)
    rows = [pattern_row(i, 1_000 + i, "kick") for i in range(1_200)] + [pattern_row(1_200, 5_000, "goal")]
    out = core.on_rows(rows)
    kinds: dict[str, int] = {}
    for _key, value in out:
        kinds[value["record"]] = kinds.get(value["record"], 0) + 1
    assert kinds == {"match": 1_000, RESULT_TRUNCATED: 1}
    (key, truncated), = [(k, v) for k, v in out if v["record"] == RESULT_TRUNCATED]
    assert key == "m|truncated|max_matches_per_event|cam:1200"
    assert {f: truncated[f] for f in ("job", "stream", "partition", "source_id", "seq", "ref_ts_us", "reason",
                                      "truncated_matches", "reported_matches", "limit")} == {
        "job": "pattern", "stream": "m", "partition": "a", "source_id": "cam", "seq": 1_200,
        "ref_ts_us": BASE + 5_000_000, "reason": "max_matches_per_event", "truncated_matches": 200,
        "reported_matches": 1_000, "limit": 1_000}
    # The count survives the state: the stream's totals over every partition, restored from a snapshot.
    again = PatternStreamCore("m", spec, 0, True, 5_000_000, core.snapshot())
    assert again.truncated_matches() == 200
