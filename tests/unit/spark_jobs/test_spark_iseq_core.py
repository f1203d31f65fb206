"""The iseq job's core without Spark: contract rows in, exact result records out (against the brute-force reference),
endpoint pairing, points to level intervals, v1 records, held inputs across micro-batches, snapshots at every cut."""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest

from cep.intervals import Interval, parse_iseq, reference_keys
from spark_jobs.iseq import IseqOptions, IseqStreamCore, engine_config, parse_levels
from spark_jobs.stateful import StreamReadProgress, run_stream_batch

BASE = 1_700_000_000_000_000
MS = 1_000
# "No D entirely inside the gap between a and b" (D's end is bounded above by b's start: final once b is in).
GAP = "EVENT ISEQ[a.te < b.ts AND a.te < d.ts AND d.te < b.ts](A a, !D d, B b; 10 s)"
# IO3's gap query: no D intersecting (b.te, c.ts); D's end is not bounded above, its start is (D's begins are IBPs).
IO3 = "EVENT ISEQ[a.te < b.ts AND b.te < c.ts AND d.ts < c.ts AND b.te < d.te](A a, B b, !D d, C c; 10 s)"

Key = tuple[tuple[str, int, int, str | None], ...]


def event(source: str, seq: int, ref_ms: int, event_type: str | None, *, start_ms: int | None = None,
          interval_id: str | None = None, endpoint: str | None = None, partition: int = 0,
          payload: Any = None, topic: str = "t.events.s") -> dict[str, Any]:
    """A contract event row as the shell hands it to a core (v2 fields absent: a v1 record)."""
    body = {"type": event_type} if payload is None else payload
    row: dict[str, Any] = {"kind": "event", "stream": "s", "source_id": source, "seq": seq,
                           "ref_ts_us": BASE + ref_ms * MS, "payload": orjson.dumps(body).decode(),
                           "topic": topic, "partition": partition, "offset": seq}
    if start_ms is not None:
        row["start_ts_us"] = BASE + start_ms * MS
    if interval_id is not None:
        row["interval_id"], row["endpoint"] = interval_id, endpoint
    return row


def punctuation(at_ms: int, partition: int = 0, offset: int = 10_000) -> dict[str, Any]:
    return {"kind": "punctuation", "stream": "s", "watermark_us": BASE + at_ms * MS, "topic": "t.events.s",
            "partition": partition, "offset": offset}


def core(query: str = GAP, blob: bytes | None = None, **options: Any) -> IseqStreamCore:
    opts = IseqOptions(bootstrap_servers="", query=query, **options)
    return IseqStreamCore("s", parse_iseq(query), engine_config(opts), opts, blob)


def run(batches: list[list[dict[str, Any]]], *, partitions: int = 1, restore_between: bool = False,
        **options: Any) -> list[tuple[str, dict[str, Any]]]:
    """The shell's loop over micro-batches; with ``restore_between`` every batch starts from the previous snapshot."""
    progress, the_core = StreamReadProgress(partitions), core(**options)
    outputs: list[tuple[str, dict[str, Any]]] = []
    for rows in batches:
        if restore_between:
            progress, blob = StreamReadProgress.from_blob(progress.to_blob(the_core.snapshot()))
            the_core = core(blob=blob, **options)
        outputs += run_stream_batch(progress, the_core, rows, job="iseq", stream="s")
    return outputs


def keys(outputs: list[tuple[str, dict[str, Any]]], *records: str) -> list[Key]:
    return sorted(tuple((m["event_type"], m["start_ts_us"], m["end_ts_us"], m["event_id"]) for m in v["members"])
                  for _k, v in outputs if v["record"] in records)


def interval(event_type: str, start_ms: int, end_ms: int, event_id: str) -> Interval:
    return Interval(event_type, BASE + start_ms * MS, BASE + end_ms * MS, {}, event_id)


# A1 an atomic interval (v2), A2 sent as endpoints, D1 inside A1's gap to B1 only, A3 a v1 point, B2 later.
GAP_ROWS = [
    event("s1", 0, 1000, "A", start_ms=0),
    event("s2", 0, 500, "A", interval_id="a2", endpoint="start"),
    event("s3", 0, 1800, "D", start_ms=1500, partition=1),
    event("s2", 1, 2500, "A", interval_id="a2", endpoint="end"),
    event("s1", 1, 4000, "B", start_ms=3000),
    event("s1", 2, 5000, "A"),
    event("s1", 3, 12500, "B", start_ms=12000),
]
GAP_INTERVALS = [interval("A", 0, 1000, "s1:0"), interval("A", 500, 2500, "s2#a2"), interval("D", 1500, 1800, "s3:0"),
                 interval("B", 3000, 4000, "s1:1"), interval("A", 5000, 5000, "s1:2"),
                 interval("B", 12000, 12500, "s1:3")]


def test_intervals_endpoints_and_v1_points_give_the_reference_results_exactly() -> None:
    expected = reference_keys(parse_iseq(GAP), GAP_INTERVALS)
    assert expected == [  # (A1, B1) is negated by D1; (A1/A2, B2) span more than 10 s
        (("A", BASE + 500 * MS, BASE + 2500 * MS, "s2#a2"), ("B", BASE + 3000 * MS, BASE + 4000 * MS, "s1:1")),
        (("A", BASE + 5000 * MS, BASE + 5000 * MS, "s1:2"), ("B", BASE + 12_000 * MS, BASE + 12_500 * MS, "s1:3"))]
    for mode in ("conservative", "aggressive"):
        outputs = run([[*sorted(GAP_ROWS, key=lambda r: r["ref_ts_us"]), punctuation(20_000)]], mode=mode)
        assert keys(outputs, "match") == expected
        assert [v["record"] for _k, v in outputs] == ["match", "match"]
    key, value = run([[*GAP_ROWS, punctuation(20_000)]])[0]
    assert key == "s|s2#a2|s1:1"
    assert value == {
        "job": "iseq", "record": "match", "stream": "s", "mode": "conservative", "aliases": ["a", "b"],
        "members": [
            {"event_type": "A", "start_ts_us": BASE + 500 * MS, "end_ts_us": BASE + 2500 * MS,
             "attrs": {"type": "A"}, "event_id": "s2#a2"},
            {"event_type": "B", "start_ts_us": BASE + 3000 * MS, "end_ts_us": BASE + 4000 * MS,
             "attrs": {"type": "B"}, "event_id": "s1:1"}],
        "start_ts_us": BASE + 500 * MS, "end_ts_us": BASE + 4000 * MS, "emitted_at_us": BASE + 4000 * MS,
        "cause": None}


def test_inputs_wait_for_the_promise_so_a_slower_partition_is_not_too_late() -> None:
    # Partition 0 is read up to 12.5 s in the first micro-batch, partition 1 (D1 at 1.8 s) only in the second:
    # fed at once with K = 0, D1 would be behind the engine's clock; held until W passes, it is in order.
    first = [r for r in GAP_ROWS if r["partition"] == 0] + [punctuation(13_000, 0), punctuation(1_000, 1)]
    second = [r for r in GAP_ROWS if r["partition"] == 1] + [punctuation(13_000, 1, 10_001)]
    for restore in (False, True):
        outputs = run([first, second], partitions=2, restore_between=restore)
        assert keys(outputs, "match") == reference_keys(parse_iseq(GAP), GAP_INTERVALS)
        assert not [v for _k, v in outputs if v["record"] != "match"]
    # Nothing is released while the slow partition has promised only 1 s (A1 ends at 1 s: not yet before W).
    assert run([first], partitions=2) == []
    # Fed at once (K-ISlack with K = 1 s), the same D1 is 10.7 s behind the clock: reported, never joined.
    outputs = run([first, second], partitions=2, k_slack_us=1_000_000)
    late = [v for _k, v in outputs if v["record"] == "too_late"]
    assert [(v["source_id"], v["seq"], v["reason"], v["item"]["event_id"]) for v in late] == [
        ("s3", 0, "behind_clock", "s3:0")]
    # ... and without D1, A1's gap to B1 is empty: the result the reference excludes is reported (K was wrong).
    assert keys(outputs, "match") == sorted([*reference_keys(parse_iseq(GAP), GAP_INTERVALS), (
        ("A", BASE, BASE + 1000 * MS, "s1:0"), ("B", BASE + 3000 * MS, BASE + 4000 * MS, "s1:1"))])


def test_a_snapshot_at_every_cut_changes_no_record() -> None:
    rows = sorted([*GAP_ROWS, event("s9", 0, 1200, "A", interval_id="lost", endpoint="end")],
                  key=lambda r: r["ref_ts_us"])
    rows = [*rows[:3], punctuation(1000), *rows[3:], punctuation(20_000, offset=10_001)]
    for mode in ("conservative", "aggressive"):
        whole = run([rows], mode=mode)
        assert [v["reason"] for _k, v in whole if v["record"] == "rejected"] == ["unpaired_end"]
        for cut in range(len(rows) + 1):
            assert run([rows[:cut], rows[cut:]], restore_between=True, mode=mode) == whole, cut


# IO3 4.1 (corrected, docs/intervals.md): A, B, C a result; D's start (an IBP) arrives after the result was emitted
# in aggressive mode -> retract (its end is unknown: +inf); its end at b.te shows it misses the gap -> add again.
IO3_ROWS = [
    event("s", 0, 2, "A", start_ms=1),
    event("s", 1, 6, "B", start_ms=4),
    event("s", 2, 12, "C", start_ms=10),
    event("d", 0, 5, "D", interval_id="d1", endpoint="start", topic="t.late.s"),
    event("d", 1, 6, "D", interval_id="d1", endpoint="end", topic="t.late.s"),
]


def test_aggressive_mode_compensates_a_late_negation_and_nets_to_the_reference() -> None:
    first, second = IO3_ROWS[:3], [*IO3_ROWS[3:], punctuation(100)]
    options: dict[str, Any] = {"query": IO3, "k_slack_us": 10 * MS, "punctuated_types": ("D",)}
    outputs = run([first, second], mode="aggressive", **options)
    result = (("A", BASE + MS, BASE + 2 * MS, "s:0"), ("B", BASE + 4 * MS, BASE + 6 * MS, "s:1"),
              ("C", BASE + 10 * MS, BASE + 12 * MS, "s:2"))
    assert [(v["record"], v["cause"] and (v["cause"]["item"], v["cause"]["event_id"])) for _k, v in outputs] == [
        ("match", None), ("retract", ("begin", "d#d1")), ("add", ("interval", "d#d1"))]
    assert {k for k, _v in outputs} == {"s|s:0|s:1|s:2"}
    net: Counter[Key] = Counter()
    for _k, v in outputs:
        net[keys([(_k, v)], "match", "add", "retract")[0]] += -1 if v["record"] == "retract" else 1
    intervals = [interval("A", 1, 2, "s:0"), interval("B", 4, 6, "s:1"), interval("C", 10, 12, "s:2"),
                 interval("D", 5, 6, "d#d1")]
    assert +net == Counter(reference_keys(parse_iseq(IO3), intervals)) == Counter([result])
    # Conservative mode holds the result until D's begin could no longer come (c.ts + K), and the late D misses.
    conservative = run([first, second], mode="conservative", **options)
    assert [(v["record"], v["emitted_at_us"]) for _k, v in conservative] == [("match", BASE + 100 * MS)]
    assert keys(conservative, "match") == [result]


def test_point_readings_become_level_intervals_per_source() -> None:
    # Li 5.4.1: 55, 70, 95, 80, 110, 120, 90, 60, 30 every 2 s -> MEDIUM(0, 8), HIGH(8, 12), MEDIUM(12, 16), LOW open.
    query = "EVENT ISEQ[m.te = h.ts](MEDIUM m, HIGH h; 60 s)"
    readings = [55, 70, 95, 80, 110, 120, 90, 60, 30]
    rows = [event("thermo", i, 2000 * i, None, payload={"temp": v}) for i, v in enumerate(readings)]
    rows += [event("thermo", 9, 17_000, None, payload={"temp": "n/a"}),
             event("door", 0, 17_000, "OPEN", payload={"type": "OPEN"})]
    outputs = run([[*rows, punctuation(30_000)]], query=query, from_points="temp")
    assert keys(outputs, "match") == [(("MEDIUM", BASE, BASE + 8000 * MS, "thermo~0"),
                                       ("HIGH", BASE + 8000 * MS, BASE + 12_000 * MS, "thermo~1"))]
    assert [(v["record"], v["source_id"], v["seq"], v["reason"]) for _k, v in outputs if "reason" in v] == [
        ("rejected", "thermo", 9, "bad_value")]
    # Custom levels: names and bounds alternating.
    levels = parse_levels("COLD, 0, MILD, 25.5, HOT")
    assert (list(levels.names), list(levels.bounds), levels.level(25.5), levels.level(26)) == (
        ["COLD", "MILD", "HOT"], [0.0, 25.5], "MILD", "HOT")
    assert engine_config(IseqOptions("", query, from_points="temp")).punctuated_types == frozenset(
        {"LOW", "MEDIUM", "HIGH"})


@pytest.mark.parametrize("text", ["LOW", "LOW,50", "LOW,x,HIGH", "LOW,50,LOW", "LOW,50,MID,40,HIGH", ",1,A"])
def test_bad_levels_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"(?i)level"):
        parse_levels(text)


def test_unusable_records_are_reported_with_a_reason_never_dropped() -> None:
    rows = [
        {**event("s", 0, 10, "A"), "payload": "[1, 2]"},
        event("s", 1, 11, None, payload={"kind": "A"}),
        event("s", 2, 12, "A", start_ms=13),
        event("s", 3, 14, "A", interval_id="x", endpoint="middle"),
        event("s", 4, 15, "A", interval_id="y", endpoint="start"),
        event("s", 5, 16, "A", interval_id="y", endpoint="start"),
    ]
    outputs = run([[*rows, punctuation(100)]])
    assert [(k, v["record"], v["reason"]) for k, v in outputs] == [
        ("s|rejected|s|0", "rejected", "bad_payload"),
        ("s|rejected|s|1", "rejected", "no_event_type"),
        ("s|rejected|s|2", "rejected", "bad_interval"),
        ("s|rejected|s|3", "rejected", "bad_endpoint"),
        ("s|rejected|s|5", "rejected", "bad_endpoint"),
    ]
    assert "second start" in outputs[-1][1]["detail"]


@pytest.mark.parametrize(("args", "message"), [
    (["--query", "EVENT ISEQ[a.te < b.ts](A a, B b; 10"],
     "Invalid value for '--query': expected ')' at line 1, column 37"),
    (["--query", "EVENT ISEQ[a.te < b.ts](A a, !D d, B b; 10 s)"], "!d needs its end bounded below"),
    (["--query", "EVENT ISEQ[a.te < d.ts AND d.ts < b.ts](A a, !D d, B b; 10 s)"], "no result could ever be"),
    (["--query", GAP, "--levels", "LOW,x,HIGH"], "Invalid value for '--levels': level bounds must be numbers"),
    (["--query", GAP, "--k-slack-ms", "soon"], "not a duration"),
])
def test_the_cli_refuses_a_bad_query_before_spark_starts(args: list[str], message: str,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from spark_jobs import cli

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "create_spark_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, ["iseq", *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_events_of_other_types_are_not_held() -> None:
    the_core = core()
    assert the_core.on_rows([event("s", 0, 10, "Z"), event("s", 1, 11, "Z", interval_id="z", endpoint="start"),
                             event("s", 2, 12, "A")]) == []
    assert [(i.source_id, i.seq) for i in the_core.held] == [("s", 2)]


def test_an_end_whose_start_cannot_come_in_time_is_reported_and_forgotten() -> None:
    from cep.intervals import EndpointPairer, IntervalBegin

    pairer = EndpointPairer()
    assert pairer.end("A", "x", 10) == [] and pairer.discard("x") and not pairer.discard("x")
    assert pairer.start("A", "x", 5) == [IntervalBegin("A", 5, "x")] and pairer.open_count == 1
    # Held until the promise (K = 0): the end at 10 ms is released at W = 20 ms with no start before it.
    end = event("s", 0, 10, "A", interval_id="x", endpoint="end")
    late_start = event("s", 1, 5, "A", interval_id="x", endpoint="start", topic="t.late.s")
    outputs = run([[end, punctuation(20)], [late_start]])
    assert [(k, v["reason"], v["ref_ts_us"]) for k, v in outputs] == [
        ("s|rejected|s|0", "unpaired_end", BASE + 10 * MS), ("s|too_late|s|1", "behind_clock", BASE + 5 * MS)]
    # K-ISlack, K = 5 ms: a start 4 ms late still pairs; an end left alone goes once it is K behind the clock.
    k_rows = [event("s", 0, 10, "A", interval_id="x", endpoint="end"), event("s", 2, 12, "B", start_ms=12)]
    outputs = run([[*k_rows, punctuation(12)], [event("s", 1, 8, "A", interval_id="x", endpoint="start"),
                                                event("s", 3, 14, "A", interval_id="y", endpoint="end"),
                                                punctuation(19)], [punctuation(20)]], k_slack_us=5 * MS)
    assert [(k, v["record"], v.get("reason")) for k, v in outputs] == [
        ("s|s#x|s:2", "match", None), ("s|rejected|s|3", "rejected", "unpaired_end")]


# Issue 25.1: D sent as endpoints with separate payloads (the SDK's send_interval_start/end): the start carries no
# v, the end v = 100.  D started before c and is still open after a ends: it negates <a, c>.
BEGIN_TRUST = "EVENT ISEQ[a.te < c.ts AND a.te < d.te AND d.ts < c.ts](A a, !(D d), C c; 30 s) WHERE d.v > 50"
BEGIN_TRUST_ROWS = [
    event("s", 0, 1000, "A", start_ms=0),
    event("d", 0, 2000, "D", interval_id="d1", endpoint="start", payload={"type": "D"}),
    event("s", 1, 4000, "C", start_ms=3000),
]


@pytest.mark.parametrize("k_slack_us", [None, 1000 * MS])
@pytest.mark.parametrize("mode", ["conservative", "aggressive"])
def test_a_negating_interval_is_not_judged_on_its_start_payload(mode: str, k_slack_us: int | None) -> None:
    """Before the fix the start's payload (no v) ruled D out: <a, c> went out at the promise that passed c.ts and
    D's end (v = 100) came too late to negate it."""
    end = event("d", 1, 20_000, "D", interval_id="d1", endpoint="end", payload={"type": "D", "v": 100})
    options: dict[str, Any] = {"query": BEGIN_TRUST, "punctuated_types": ("D",), "mode": mode}
    if k_slack_us is not None:
        options["k_slack_us"] = k_slack_us
    outputs = run([[*BEGIN_TRUST_ROWS, punctuation(10_000)], [end, punctuation(40_000)]], **options)
    intervals = [interval("A", 0, 1000, "s:0"), interval("C", 3000, 4000, "s:1"),
                 Interval("D", BASE + 2000 * MS, BASE + 20_000 * MS, {"type": "D", "v": 100}, "d#d1")]
    assert reference_keys(parse_iseq(BEGIN_TRUST), intervals) == []
    assert [v["record"] for _k, v in outputs] == []
