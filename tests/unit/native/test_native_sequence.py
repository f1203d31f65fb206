"""The native SequenceReorderer (native/src/sequence.rs) against its executable specification, reorder/sequence.py.

Differential property tests: random configs (both modes), arrival orders with duplicates, gaps, jumps, late events,
virtual time that advances (and now and then steps back), deadlines fired exactly and in between, batch calls; both
cores get the same calls and must give identical outputs (every field, the very event objects), counters, deadlines,
timeouts, merge waits and range bookkeeping after every call. The Python core has no snapshot/restore, so neither
does the native one.
"""

from __future__ import annotations

import math
from dataclasses import astuple, fields
from types import SimpleNamespace
from typing import Any

import pytest
import skewless_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reorder.records import GapSkipped, Late, Released, SourceEvent
from reorder.sequence import SequenceConfig, SequenceCounters, SequenceReorderer, warmup_samples_for

RECORDS = (Released, Late, GapSkipped)
COUNTER_FIELDS = [f.name for f in fields(SequenceCounters)]


def native(config: SequenceConfig | None = None, *, tagged: bool = False) -> skewless_native.SequenceReorderer:
    return skewless_native.SequenceReorderer("D1", "R1", config, records=None if tagged else RECORDS)


def ev(seq: int) -> SourceEvent:
    return SourceEvent("D1", "R1", seq, seq * 1000, {"seq": seq})


def tagged(outputs: list[Any]) -> list[tuple[Any, ...]]:
    """The Python core's records as the native core's tuples without record classes: (kind, *fields)."""
    kinds = {Released: 0, Late: 1, GapSkipped: 2}
    return [(kinds[type(o)], *o) for o in outputs]


def same_outputs(py_out: list[Any], nat_out: list[Any]) -> None:
    assert [(type(o).__name__, tuple(o)) for o in nat_out] == [(type(o).__name__, tuple(o)) for o in py_out]
    for p, n in zip(py_out, nat_out, strict=True):
        if not isinstance(p, GapSkipped):
            assert n.event is p.event  # the very object pushed: payloads are carried, never copied


def same_state(py: SequenceReorderer, nat: Any) -> None:
    assert astuple(py.counters) == tuple(getattr(nat.counters, f) for f in COUNTER_FIELDS)
    assert (py.expected_seq, py.buffered, py.next_deadline_us()) == (
        nat.expected_seq, nat.buffered, nat.next_deadline_us())
    assert (py._skipped.count, len(py._skipped), py._holes.count, len(py._holes)) == nat.tracked()
    assert (py.longest_gap_delay_us, py.effective_latency_threshold_us()) == (
        nat.longest_gap_delay_us, nat.effective_latency_threshold_us())


# -- strategies ------------------------------------------------------------------------------------------------------

configs = st.builds(
    SequenceConfig,
    mode=st.sampled_from(["adaptive", "thesis"]),
    latency_threshold_us=st.one_of(st.integers(0, 5_000), st.just(2_000_000)),
    alpha=st.floats(0.0, 1.0),
    beta=st.floats(0.0, 1.0),
    drop_late=st.booleans(),
    target_accuracy=st.one_of(st.floats(0.5, 0.99999), st.just(0.9999)),
    timeout_factor=st.floats(0.0, 4.0),
    quantile_half_life=st.one_of(st.floats(1.0, 1e5), st.just(10_000.0)),
    max_latency_threshold_us=st.one_of(st.integers(0, 20_000), st.just(60_000_000)),
    min_gap_samples=st.integers(0, 12),
    warmup_samples=st.one_of(st.none(), st.integers(0, 30)),
    warmup_min_timeout_us=st.integers(0, 3_000),
    min_timeout_us=st.integers(0, 2_000),
    initial_seq=st.one_of(st.none(), st.just(0), st.integers(-5, 10**6)),
    max_buffered=st.one_of(st.integers(1, 8), st.just(1_000_000)),
    max_skipped_tracked=st.one_of(st.integers(0, 25), st.just(100_000)),
)

# A seq is drawn relative to the Python core's expected seq when the op runs: near it (gaps, disorder, late ones,
# duplicates), or a jump far ahead.
offsets = st.one_of(st.integers(-12, 15), st.integers(-12, 15), st.integers(16, 10**7))
steps_us = st.one_of(st.integers(0, 400), st.integers(0, 5_000), st.integers(-300, -1))

ops = st.one_of(
    st.tuples(st.just("push"), offsets, steps_us),
    st.tuples(st.just("push"), offsets, steps_us),
    st.tuples(st.just("push"), offsets, steps_us),
    st.tuples(st.just("push_many"), st.lists(offsets, max_size=6), steps_us),
    st.tuples(st.just("take"), st.integers(-2, 2), steps_us),
    st.tuples(st.just("advance"), steps_us),
    st.tuples(st.just("at_deadline"), st.integers(-1, 0)),
    st.tuples(st.just("query"), steps_us),
    st.tuples(st.just("flush"), steps_us),
)


class Pair:
    """The two cores driven with the same calls, compared after each."""

    def __init__(self, config: SequenceConfig) -> None:
        self.py = SequenceReorderer("D1", "R1", config)
        self.nat = native(config)
        self.tag = native(config, tagged=True)
        self.now_us = 0

    def check(self, py_out: list[Any], nat_out: list[Any], tag_out: list[Any]) -> None:
        same_outputs(py_out, nat_out)
        assert tag_out == tagged(py_out)
        same_state(self.py, self.nat)

    def run(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "push":
            self.now_us += op[2]
            e = ev(self.py.expected_seq + op[1])
            self.check(self.py.push(e, self.now_us), self.nat.push(e, self.now_us), self.tag.push(e, self.now_us))
        elif kind == "push_many":
            self.now_us += op[2]
            events = [ev(self.py.expected_seq + off) for off in op[1]]
            py_outs = [self.py.push(e, self.now_us) for e in events]
            nat_outs = self.nat.push_many(events, self.now_us)
            tag_outs = self.tag.push_many(events, self.now_us)
            assert len(nat_outs) == len(tag_outs) == len(py_outs)
            for p, n, t in zip(py_outs, nat_outs, tag_outs, strict=True):
                self.check(p, n, t)
        elif kind == "take":
            self.now_us += op[2]
            seq = self.py.expected_seq + op[1]
            results = (self.py.take_in_order(seq, self.now_us), self.nat.take_in_order(seq, self.now_us),
                       self.tag.take_in_order(seq, self.now_us))
            assert results[0] == results[1] == results[2]
            same_state(self.py, self.nat)
        elif kind == "advance":
            self.now_us += op[1]
            self.check(self.py.advance(self.now_us), self.nat.advance(self.now_us), self.tag.advance(self.now_us))
        elif kind == "at_deadline":
            due = self.py.next_deadline_us()
            if due is not None:
                self.now_us = due + op[1]  # exactly at the deadline, or just before it
                self.check(self.py.advance(self.now_us), self.nat.advance(self.now_us),
                           self.tag.advance(self.now_us))
        elif kind == "query":
            # timeout_us refreshes the quantile's cache in both cores: it is an op, not a check after each call
            now_us = self.now_us + op[1]
            assert self.py.timeout_us() == self.nat.timeout_us() == self.tag.timeout_us()
            assert self.py.merge_wait_us(now_us) == self.nat.merge_wait_us(now_us) == self.tag.merge_wait_us(now_us)
        else:
            self.now_us += op[1]
            self.check(self.py.flush(self.now_us), self.nat.flush(self.now_us), self.tag.flush(self.now_us))


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.lists(ops, max_size=80))
def test_random_calls_give_identical_outputs_counters_and_state(config: SequenceConfig,
                                                                 calls: list[tuple[Any, ...]]) -> None:
    pair = Pair(config)
    for op in calls:
        pair.run(op)
    pair.run(("flush", 1))
    assert pair.nat.buffered == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, st.lists(st.tuples(st.integers(0, 60), st.integers(0, 800)), max_size=200))
def test_push_arrivals_is_the_replay_loop_in_one_call(config: SequenceConfig,
                                                       arrivals: list[tuple[int, int]]) -> None:
    """push_arrivals fires every deadline strictly before each arrival, then pushes: the replay's own loop."""
    arrivals.sort(key=lambda a: a[1])
    py = SequenceReorderer("D1", "R1", config)
    events = [ev(seq) for seq, _ in arrivals]
    expected: list[Any] = []
    for e, (_, t) in zip(events, arrivals, strict=True):
        while (due := py.next_deadline_us()) is not None and due < t:
            expected += py.advance(due)
        expected += py.push(e, t)
    nat = native(config)
    same_outputs(expected, nat.push_arrivals(events, [t for _, t in arrivals]))
    same_state(py, nat)


def test_long_adaptive_run_learns_the_same_quantile() -> None:
    """Thousands of gap samples (past the 200-sample trust and the 10,000-sample warm-up, through the quantile's
    lazy refresh every 32 samples), heavy-tailed closing delays, some gaps never closing."""
    import random

    rng = random.Random(7)
    config = SequenceConfig(latency_threshold_us=50_000, quantile_half_life=500.0)
    py = SequenceReorderer("D1", "R1", config)
    nat = native(config)
    arrivals: list[tuple[int, int]] = []
    for seq in range(40_000):
        delay = int(rng.paretovariate(1.5) * 20) if rng.random() < 0.4 else 0
        if rng.random() < 0.001:
            continue  # lost
        arrivals.append((10 * seq + delay, seq))
    arrivals.sort()
    events = [ev(seq) for _, seq in arrivals]
    expected: list[Any] = []
    for e, (t, _) in zip(events, arrivals, strict=True):
        while (due := py.next_deadline_us()) is not None and due < t:
            expected += py.advance(due)
        expected += py.push(e, t)
    out = nat.push_arrivals(events, [t for t, _ in arrivals])
    same_outputs(expected, out)
    same_state(py, nat)
    assert py.gap_delay.count > 10_000 and py.counters.timeouts > 0
    assert py.timeout_us() == nat.timeout_us()


@given(st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True))
def test_warmup_samples_for_matches_pythons_decimal_rounding(q: float) -> None:
    assert skewless_native.warmup_samples_for(q) == warmup_samples_for(q)


@pytest.mark.parametrize("q", [0.9999, 0.999, 0.99, 0.5, 0.1, 0.99999, 1 - 1e-9, 0.3333333333333333])
def test_warmup_samples_for_examples(q: float) -> None:
    assert skewless_native.warmup_samples_for(q) == warmup_samples_for(q)


def test_the_largest_contract_seq_and_far_times() -> None:
    max_seq = 2**63 - 1
    config = SequenceConfig(initial_seq=max_seq - 2)
    pair = Pair(config)
    pair.now_us = 2**62
    for op in [("push", 2, 0), ("push", 0, 5), ("at_deadline", 0), ("push", -1, 10), ("push", 0, 10), ("query", 0)]:
        pair.run(op)
    assert pair.nat.expected_seq == pair.py.expected_seq > 2**63 - 1  # past the i64 range, as Python ints go


def test_defaults_and_gateway_config_are_read_from_the_config_object() -> None:
    from reorder.pipeline import GATEWAY_SEQUENCE_DEFAULTS

    for config in (None, SequenceConfig(), GATEWAY_SEQUENCE_DEFAULTS, SequenceConfig.thesis()):
        nat = skewless_native.SequenceReorderer("s", "x", config)
        py = SequenceReorderer("s", "x", config)
        assert nat.timeout_us() == py.timeout_us()
        assert (nat.source_id, nat.stream, nat.config) == ("s", "x", config)
        e = ev(3)
        assert nat.push(e, 7) == [(*t,) for t in tagged(py.push(e, 7))]
        assert nat.next_deadline_us() == py.next_deadline_us()


# -- bad input: a clear error, nothing changed ----------------------------------------------------------------------


def test_bad_events_and_times_are_refused_and_change_nothing() -> None:
    nat = native()
    with pytest.raises(TypeError):
        nat.push(SimpleNamespace(seq="1"), 0)
    with pytest.raises(AttributeError):
        nat.push(object(), 0)
    with pytest.raises(OverflowError, match="now_us"):
        nat.push(ev(0), 2**70)
    with pytest.raises(OverflowError, match="seq"):
        nat.push(ev(2**65), 0)
    with pytest.raises(TypeError):  # one bad event refuses the whole batch before any is pushed
        nat.push_many([ev(0), ev(1), SimpleNamespace(seq=None)], 0)
    with pytest.raises(ValueError, match="2 events but 1 arrival"):
        nat.push_arrivals([ev(0), ev(1)], [0])
    assert (nat.expected_seq, nat.buffered, nat.counters.released) == (0, 0, 0)
    assert [o.event.seq for o in nat.push_many([ev(1), ev(0)], 3)[1]] == [0, 1]


def _namespace(**changes: Any) -> SimpleNamespace:
    base = {f.name: getattr(SequenceConfig(), f.name) for f in fields(SequenceConfig)}
    return SimpleNamespace(**{**base, **changes})


@pytest.mark.parametrize(("changes", "message"), [
    ({"latency_threshold_us": -1}, "latency_threshold_us must be >= 0"),
    ({"target_accuracy": 1.0}, "target_accuracy must be in"),
    ({"target_accuracy": math.nan}, "target_accuracy must be in"),
    ({"max_buffered": 0}, "max_buffered must be >= 1"),
    ({"min_timeout_us": -1}, "min_timeout_us must be >= 0"),
    ({"warmup_min_timeout_us": -1}, "warmup_min_timeout_us must be >= 0"),
    ({"alpha": 1.5}, "smoothing factor"),
    ({"max_latency_threshold_us": -1}, "max_latency_threshold_us must be >= 0"),
    ({"mode": "fast"}, "mode must be"),
    # the Python core accepts these and raises later (ZeroDivisionError at construction, OverflowError at a gap's
    # timeout, IndexError at the first give-up): the native core refuses them up front
    ({"quantile_half_life": 0.0}, "quantile_half_life"),
    ({"timeout_factor": math.inf}, "timeout_factor"),
    ({"max_skipped_tracked": -1}, "max_skipped_tracked"),
])
def test_bad_configs_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        skewless_native.SequenceReorderer("s", "x", _namespace(**changes))



# -- the replay runs either core ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("approach", "profile"), [("sequence", "dataset1"), ("thesis", "dataset1"),
                                                   ("sequence", "heavytail"), ("thesis", "pool")])
def test_the_replay_gives_identical_metrics_and_releases_with_either_core(approach: str, profile: str) -> None:
    from gateway.native import native_merger, native_sequence_reorderer
    from reorder.eval.replay import ReplayOptions, replay
    from reorder.eval.traces import PROFILES, TraceSpec, generate
    from reorder.pipeline import PipelineCores

    made: list[object] = []

    def counting(source_id: str, stream: str, config: SequenceConfig) -> Any:
        made.append(reorderer := native_sequence_reorderer(source_id, stream, config))
        return reorderer

    trace = generate(TraceSpec(PROFILES[profile], events_per_source=4000, sources=3, seed=11))
    opts = ReplayOptions(approach=approach, emit=True)  # type: ignore[arg-type]
    python_run = replay(trace, opts)
    native_run = replay(trace, ReplayOptions(approach=approach, emit=True,  # type: ignore[arg-type]
                                             cores=PipelineCores(counting, native_merger)))
    assert made and all(isinstance(r, skewless_native.SequenceReorderer) for r in made)
    assert native_run.metrics == python_run.metrics
    assert native_run.emitted == python_run.emitted
    assert native_run.series == python_run.series


def test_the_cli_runs_the_native_core_by_default_and_python_on_request(tmp_path: Any) -> None:
    import json

    import typer
    from typer.testing import CliRunner

    from skewless import cli_replay as cli
    from skewless.native_cores import pipeline_cores

    app = typer.Typer()
    cli.register(app, cores=pipeline_cores())
    assert set(cli.CORES) == {"python", "native"}
    runner = CliRunner()
    trace = tmp_path / "t.jsonl"
    assert runner.invoke(app, ["traces", "generate", "--profile", "dataset2", "--events", "3000", "--out",
                               str(trace)]).exit_code == 0
    outputs = {}
    for core in ([], ["--core", "native"], ["--core", "python"]):
        res = runner.invoke(app, ["replay", "--trace", str(trace), "--json", "--no-progress", *core])
        assert res.exit_code == 0, res.output
        outputs[tuple(core)] = json.loads(res.output)
    assert outputs[()] == outputs[("--core", "native")] == outputs[("--core", "python")]
    res = runner.invoke(app, ["replay", "--trace", str(trace), "--core", "rust"])
    assert res.exit_code != 0 and "unknown core" in res.output
    cli.register(typer.Typer())  # without the native core (floor 2 alone): python by default, native refused
    assert set(cli.CORES) == {"python"}
    res = runner.invoke(app, ["replay", "--trace", str(trace), "--core", "native"])
    assert res.exit_code != 0 and "not built" in res.output


# -- the gateway's pipeline with either core --------------------------------------------------------------------------

frames = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.lists(st.integers(-2, 8), min_size=1, max_size=5),
              st.integers(0, 3_000), st.booleans()),
    max_size=40)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(frames, st.sampled_from(["adaptive", "thesis"]), st.booleans())
def test_the_pipeline_gives_identical_records_with_either_core(
        calls: list[tuple[str, list[int], int, bool]], mode: str, drop_late: bool) -> None:
    """IngestPipeline.push_many (take_in_order's fast path, push's, frames of two sources) and heartbeats and
    deadlines, with the Python reorderer and with the native one: the same records, in the same order."""
    from contract.wire.messages import IncomingEvent
    from gateway.native import NATIVE_PIPELINE_CORES
    from reorder.pipeline import IngestPipeline, PipelineConfig
    from timesync.clocks import IdentityMapping

    sequence = SequenceConfig(mode=mode, latency_threshold_us=1_500, min_gap_samples=2,  # type: ignore[arg-type]
                              warmup_min_timeout_us=0)
    config = PipelineConfig(sequence=sequence, drop_late=drop_late)
    python = IngestPipeline(IdentityMapping(), config)
    rust = IngestPipeline(IdentityMapping(), NATIVE_PIPELINE_CORES.apply(
        PipelineConfig(sequence=sequence, drop_late=drop_late)))
    next_seq = {"a": 0, "b": 0}
    now_us = 10_000
    for source, offsets, step_us, heartbeat in calls:
        now_us += step_us
        due_py, due_rust = python.next_deadline_us(), rust.next_deadline_us()
        assert due_py == due_rust
        if due_py is not None and due_py <= now_us:
            assert rust.advance(now_us) == python.advance(now_us)
        if heartbeat:
            hb = {"R": next_seq[source]}
            assert rust.heartbeat(source, hb, now_us, now_us) == python.heartbeat(source, hb, now_us, now_us)
            continue
        events = [IncomingEvent("R", max(0, next_seq[source] + off), now_us - 500, {"n": k})
                  for k, off in enumerate(offsets)]
        next_seq[source] = max(next_seq[source], *(e.seq + 1 for e in events))
        assert rust.push_many(source, events, now_us) == python.push_many(source, events, now_us)
        assert rust.buffered() == python.buffered()
    assert rust.advance(1 << 60) == python.advance(1 << 60)  # the native cores take times within +-2^61 us
    assert rust.counters == python.counters
