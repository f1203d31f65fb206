"""Trace format, generator, sync simulation and the replay metrics on small hand-made traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from reorder.eval.cli import parse_duration_us
from reorder.eval.replay import APPROACHES, ReplayOptions, replay
from reorder.eval.syncsim import SourceClockModel, SyncPlan, plan_sync
from reorder.eval.traces import PROFILES, TraceEvent, TraceFormatError, TraceSpec, generate, read_trace, write_trace


def te(seq: int, true_us: int, arrival_us: int, source: str = "s0") -> TraceEvent:
    return TraceEvent(source, "R1", seq, true_us, true_us, arrival_us)


# E1, E2, E4, E5, E6, E3, E7 of section 3.2.1, 100 us apart; E3 arrives 350 us late.
THESIS_EXAMPLE = [
    te(0, 0, 10),
    te(1, 100, 110),
    te(2, 200, 560),
    te(3, 300, 310),
    te(4, 400, 410),
    te(5, 500, 510),
    te(6, 600, 610),
]


def test_metrics_on_the_thesis_example_for_every_approach() -> None:
    injected = 1  # arrival order ts: 0 100 300 400 500 200 600 -> only E3 has a larger predecessor
    seq = replay(THESIS_EXAMPLE, ReplayOptions(approach="sequence", sync=False, heartbeats=False)).metrics
    # E4, E5, E6 wait for E3 (560): 250 + 150 + 50 us; others 0.  Mean = 450 / 7 us.
    assert seq["avg_latency_ms"] == round(450 / 7 / 1000, 4)
    assert seq["max_latency_ms"] == 0.25
    assert (seq["out_of_order_events"], seq["injected_out_of_order_events"]) == (0, injected)
    assert seq["accuracy_pct"] == 100.0
    assert seq["peak_buffered_events"] == 3
    oracle = replay(THESIS_EXAMPLE, ReplayOptions(approach="oracle")).metrics
    assert oracle["avg_latency_ms"] == seq["avg_latency_ms"]
    # a thesis timeout of 0 (no inter-arrival statistics yet... here 100 us apart) skips E3
    thesis = replay(
        THESIS_EXAMPLE, ReplayOptions(approach="thesis", sync=False, heartbeats=False, latency_threshold_us=100)
    ).metrics
    assert thesis["out_of_order_events"] == 1
    assert thesis["accuracy_pct"] == 0.0
    assert thesis["late_events"] == 1
    for approach in APPROACHES:
        m = replay(THESIS_EXAMPLE, ReplayOptions(approach=approach, sync=False, heartbeats=False)).metrics
        assert m["released_events"] == 7


def test_in_order_trace_waits_zero_in_sequence_mode() -> None:
    trace = [te(i, 100 * i, 100 * i + 500) for i in range(1000)]
    m = replay(trace, ReplayOptions(sync=False, heartbeats=False)).metrics
    assert (m["avg_latency_ms"], m["max_latency_ms"], m["peak_buffered_events"]) == (0.0, 0.0, 0)
    assert m["accuracy_pct"] == 100.0


def test_replay_is_deterministic_and_lines_may_be_in_any_order(tmp_path: Path) -> None:
    trace = generate(TraceSpec(PROFILES["dataset1"], events_per_source=3000, sources=2, seed=3))
    path = tmp_path / "t.jsonl"
    write_trace(path, reversed(trace))
    back = read_trace(path)
    assert sorted(back) == sorted(trace)
    a = replay(back, ReplayOptions(emit=True))
    b = replay(trace, ReplayOptions(emit=True))
    assert a.metrics == b.metrics
    assert a.emitted == b.emitted


def test_generator_is_seeded_and_shaped_like_the_profiles() -> None:
    spec = TraceSpec(PROFILES["dataset1"], events_per_source=20_000, seed=7)
    t1, t2 = generate(spec), generate(spec)
    assert t1 == t2
    assert generate(TraceSpec(PROFILES["dataset1"], events_per_source=20_000, seed=8)) != t1
    duration_s = (max(e.true_ts_us for e in t1) - min(e.true_ts_us for e in t1)) / 1e6
    assert 14_000 < len(t1) / duration_s < 16_500  # ~15k events/s as DEBS 2013
    m = replay(t1, ReplayOptions(approach="oracle")).metrics
    assert 0.08 < int(m["injected_out_of_order_events"]) / len(t1) < 0.14  # section 5.1: ~8-12 %
    assert {e.payload["sid"] for e in t1 if e.payload} >= {4, 8, 10, 12}


def test_multi_source_and_drift_variants() -> None:
    t = generate(TraceSpec(PROFILES["dataset3"], events_per_source=1000, sources=3, drift_us=60_000_000, skew_ppm=10))
    by_source = {s: [e for e in t if e.source_id == s] for s in ("s0", "s1", "s2")}
    e0, e2 = by_source["s0"][0], by_source["s2"][0]
    first0 = min(by_source["s0"], key=lambda e: e.seq)
    first2 = min(by_source["s2"], key=lambda e: e.seq)
    assert first2.true_ts_us - first0.true_ts_us == 6_000  # +3 ms per source id
    assert all(e.source_ts_us == e.true_ts_us for e in by_source["s0"])
    assert all(e.source_ts_us - e.true_ts_us == 60_000_000 + int(20e-6 * e.true_ts_us) for e in by_source["s2"])
    assert e0.stream == e2.stream


def test_sync_simulation_recovers_offset_and_skew_within_tens_of_microseconds() -> None:
    model = SourceClockModel(0, 3_600_000_000, 1 + 50e-6)  # 1 h ahead, 50 ppm fast
    rounds = plan_sync("s1", model, 1_000_000, 20_000_000, SyncPlan(), seed=1)
    est = rounds[-1].estimate
    assert est is not None
    for true_us in (15_000_000, 20_000_000):
        err = est.to_reference_us(model.read(true_us)) - true_us
        assert abs(err) < 50
        assert abs(err) <= est.error_bound_us(true_us)


def test_with_sync_drifted_sources_stay_ordered_without_it_they_do_not() -> None:
    spec = TraceSpec(PROFILES["dataset1"], events_per_source=4000, sources=2, drift_us=10_000)
    trace = generate(spec)
    synced = replay(trace, ReplayOptions()).metrics
    raw = replay(trace, ReplayOptions(sync=False)).metrics
    assert int(raw["out_of_order_events_ms"]) > 20 * max(1, int(synced["out_of_order_events_ms"]))


def test_malformed_trace_lines_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"source_id": "a", "stream": "r", "seq": 0, "true_ts_us": 0, "source_ts_us": 0}\n')
    with pytest.raises(TraceFormatError, match="line 1: missing field 'arrival_ts_us'"):
        read_trace(path)


def test_parse_duration() -> None:
    assert [parse_duration_us(x) for x in ("1h", "1min", "5ms", "250us", "7", "1.5s")] == [
        3_600_000_000,
        60_000_000,
        5_000,
        250,
        7,
        1_500_000,
    ]


def test_cli_generate_and_replay_json(tmp_path: Path) -> None:
    import typer

    from reorder.eval.cli import register

    app = typer.Typer()
    register(app)
    runner = CliRunner()
    out = tmp_path / "t.jsonl"
    res = runner.invoke(app, ["traces", "generate", "--profile", "pool", "--events", "2000", "--out", str(out)])
    assert res.exit_code == 0, res.output
    emit = tmp_path / "e.jsonl"
    res = runner.invoke(app, ["replay", "--trace", str(out), "--approach", "sequence", "--json", "--emit", str(emit)])
    assert res.exit_code == 0, res.output
    metrics = json.loads(res.output)
    for key in (
        "avg_latency_ms",
        "max_latency_ms",
        "out_of_order_events",
        "injected_out_of_order_events",
        "accuracy_pct",
        "late_events",
        "peak_buffered_events",
    ):
        assert key in metrics
    rows = [json.loads(line) for line in emit.read_text().splitlines()]
    assert set(rows[0]) == {"source_id", "stream", "seq", "release_ts_us", "ref_ts_us"}
    assert len(rows) == metrics["released_events"]
