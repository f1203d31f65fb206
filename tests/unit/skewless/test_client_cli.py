"""`skewless source replay`: the pure replay plan, and a replay against the in-process fake gateway."""

from __future__ import annotations

import asyncio
import threading
from collections import defaultdict

import pytest
import typer.main
from typer.testing import CliRunner

from reorder.eval.traces import PROFILES, TraceEvent, TraceSpec, generate, write_trace
from skewless.cli import _register_subcommands, app
from skewless.cli_source import SourceReplayOptions, plan_replay, replay_trace, source_clocks
from tests.unit.clients.test_client_loopback import FakeGateway

START_US = 1_800_000_000_000_000


def ev(source: str, seq: int, true_us: int, arrival_us: int, source_us: int | None = None) -> TraceEvent:
    return TraceEvent(source, "s", seq, true_us, true_us if source_us is None else source_us, arrival_us, {"n": seq})


TRACE = [ev("a", 1, 2_000, 9_000), ev("a", 0, 1_000, 3_000), ev("b", 0, 1_500, 4_000, source_us=1_700),
         ev("a", 2, 3_000, 5_000)]


def plan(options: SourceReplayOptions, trace: list[TraceEvent] = TRACE):
    clocks = source_clocks(sorted({e.source_id for e in trace}), options, START_US, base=lambda: START_US)
    return plan_replay(trace, options, START_US, clocks)


def test_plan_follows_arrival_order_and_rebases_the_trace_to_now():
    steps = plan(SourceReplayOptions())
    assert [(p.source_id, p.seq) for p in steps] == [("a", 0), ("b", 0), ("a", 2), ("a", 1)]
    assert [p.at_s for p in steps] == [0.002, 0.003, 0.004, 0.008]  # arrival - first instant (true 1000)
    assert [p.source_ts_us for p in steps] == [START_US, START_US + 500 + 200, START_US + 2_000, START_US + 1_000]
    assert steps[0].payload == {"n": 0}


def test_plan_speed_compresses_the_whole_timeline():
    steps = plan(SourceReplayOptions(speed=2.0))
    assert [p.at_s for p in steps] == [0.001, 0.0015, 0.002, 0.004]
    assert steps[-1].source_ts_us == START_US + 500


def test_plan_injects_offset_and_skew_per_source():
    steps = plan(SourceReplayOptions(ahead_us=3_600_000_000, skew_ppm=200.0))
    a_late = next(p for p in steps if p.seq == 2)
    # true time START + 2000 µs; 200 ppm of 2000 µs is 0.4 µs -> rounds to 0
    assert a_late.source_ts_us == START_US + 2_000 + 3_600_000_000
    spread = source_clocks(["a", "b", "c"], SourceReplayOptions(ahead_spread_us=1_000, skew_spread_ppm=50.0, seed=3),
                           START_US, base=lambda: START_US)
    assert len({c.ahead_us for c in spread.values()}) == 3
    assert all(abs(c.ahead_us) <= 1_000 and abs(c.skew_ppm) <= 50 for c in spread.values())
    again = source_clocks(["a", "b", "c"], SourceReplayOptions(ahead_spread_us=1_000, skew_spread_ppm=50.0, seed=3),
                          START_US, base=lambda: START_US)
    assert [c.ahead_us for c in again.values()] == [c.ahead_us for c in spread.values()]  # seeded


def test_plan_filters_limits_renumbers_and_jitters():
    assert [(p.source_id, p.seq) for p in plan(SourceReplayOptions(sources=("b",)))] == [("b", 0)]
    assert len(plan(SourceReplayOptions(limit=2))) == 2
    assert {p.seq for p in plan(SourceReplayOptions(keep_seqs=False))} == {None}
    jittered = plan(SourceReplayOptions(jitter_us=10_000, seed=5))
    assert [p.at_s for p in jittered] == sorted(p.at_s for p in jittered)
    assert [(p.source_id, p.seq) for p in jittered] != [("a", 0), ("b", 0), ("a", 2), ("a", 1)]
    assert plan(SourceReplayOptions(), trace=[]) == []
    with pytest.raises(ValueError, match="speed"):
        plan(SourceReplayOptions(speed=0))


async def test_replay_delivers_the_trace_with_its_seqs_through_a_pool():
    trace = generate(TraceSpec(PROFILES["dataset1"], events_per_source=300, sources=3, seed=2))
    async with FakeGateway() as gw:
        summary = await replay_trace(trace, "127.0.0.1", gw.port, SourceReplayOptions(speed=50.0), pool_size=2,
                                     batch_events=10)
    assert summary.events == 900
    assert summary.acked == 900
    assert summary.sources == 3
    expected: dict[tuple[str, str], list[int]] = defaultdict(list)
    for e in trace:
        expected[(e.source_id, e.stream)].append(e.seq)
    for key, seqs in expected.items():
        assert gw.events_of(*key) == sorted(seqs)
    assert "replayed 900 events from 3 sources" in summary.line()


def test_cli_help_and_a_replay_run(tmp_path):
    _register_subcommands()
    runner = CliRunner()
    result = runner.invoke(app, ["source", "replay", "--help"])
    assert result.exit_code == 0
    assert "--skew-ppm" in result.output
    assert "--pool" in result.output

    path = tmp_path / "trace.jsonl"
    write_trace(path, [ev("a", i, 1_000 * i, 1_000 * i + 500) for i in range(20)])
    loop = asyncio.new_event_loop()
    gw = FakeGateway()
    loop.run_until_complete(gw.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        result = runner.invoke(app, ["source", "replay", str(path), "--port", str(gw.port), "--speed", "10",
                                     "--offset-us", "5000", "--no-progress"])
    finally:
        asyncio.run_coroutine_threadsafe(gw.__aexit__(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
    assert result.exit_code == 0, result.output
    assert "replayed 20 events from 1 sources" in result.output
    assert gw.events_of("a", "s") == list(range(20))


def test_a_replay_sends_a_given_up_seq_instead_of_taking_it_for_a_repeat():
    """The trace's late arrival whose gap the gateway gave up (its ack passed it) is sent for the late topic; only a
    seq the gateway acked without a gap notice means the trace was replayed to it before."""
    from collections import deque
    from types import SimpleNamespace

    from contract.wire.messages import GapNotice
    from skewless.cli_source import PlannedSend, _given_up

    client = SimpleNamespace(gaps=deque([GapNotice("sensors", 1602, 1602, "timeout"),
                                         GapNotice("sensors", 1820, 1822, "timeout")]))

    def send(stream: str, seq: int) -> PlannedSend:
        return PlannedSend(0.0, "s0", stream, seq, 1, {})

    assert [_given_up(client, send("sensors", q)) for q in (1601, 1602, 1603, 1819, 1820, 1822, 1823)] == [
        False, True, False, False, True, True, False]
    assert not _given_up(client, send("other", 1602))


@pytest.mark.parametrize(("flag", "spread_flag"), [("--ahead-us", "--ahead-spread-us"),
                                                   ("--offset-us", "--offset-spread-us")])  # deprecated spelling
def test_replay_ahead_flags_and_their_deprecated_spellings(tmp_path, flag, spread_flag):
    _register_subcommands()
    path = tmp_path / "trace.jsonl"
    write_trace(path, [ev("a", 0, 1_000, 1_500)])
    replay_command = typer.main.get_command(app).commands["source"].commands["replay"]
    ctx = replay_command.make_context("replay", [str(path), flag, "-1.5s", spread_flag, "5ms"])
    assert (ctx.params["ahead_us"], ctx.params["ahead_spread_us"]) == (-1_500_000, 5_000)
