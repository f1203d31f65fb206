"""The documented newcomer path, for real: `skewless traces generate --sources 3 --events N`, `skewless gateway` with
its defaults, `skewless source replay` at its default speed (issue 25 item 9).

The trace's clocks are perfect: a clock-step alarm is a false alarm, and no event may go to the late topic for a
clock step. Its delay bursts (dataset1: three events 750-1000 ms late, twice) and a busy host's stalls are delays:
the gateway must take them for what they are. Also pinned to one CPU (`taskset -c 0`, gateway and replay), where
the replay falls far behind its plan and the gateway behind the replay. Checked: every event in Kafka exactly once,
0 clock steps, 0 false alarms, 0 `clock_step_unresolved`, under 0.5 % on the late topic. And a zombie gateway
(SIGSTOP while the sources send, then SIGCONT): every source's next events look seconds late, no step for that.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.reliability.harness import REPO, GatewayProcess, child_env, read_delivery, record_outcome, rss_kib

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

LONG = pytest.mark.reliability_long
ONE_CPU = ("taskset", "-c", "0")
SOURCES = 3
STREAM = "sensors"
LATE_BUDGET = 0.005


async def _skewless(*args: str, wrapper: tuple[str, ...] = (), timeout_s: float, log: Path | None = None) -> str:
    process = await asyncio.create_subprocess_exec(
        *wrapper, sys.executable, "-m", "skewless", *args, env=child_env(), cwd=REPO,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout_s)
    if log is not None:
        await asyncio.to_thread(log.write_bytes, err)
    assert process.returncode == 0, err.decode(errors="replace")[-2000:]
    return out.decode().strip()


@pytest.mark.parametrize(("events_per_source", "one_cpu", "zombie_s"), [
    # 3x5000 lost 1 of 15,000 events in a fresh-clone run on 8ee39a5: flush() returned with a given-up seq's one
    # send still queued, and close() dropped it (fixed: test_flush_writes_a_given_up_seqs_one_send_before_it_returns).
    # It lost 1 of 15,000 again (8 late) on 91848d4 and in 2 of 16 runs in a loop: the gap notice for a trace's
    # late seq came before the application sent it, its ack after; the SDK queued the seq as a new event, the ack
    # released it unsent and the sender skipped it (fixed: test_an_ack_passing_events_never_written_gives_them_up_
    # and_they_go_out_once, test_a_seq_of_a_gap_notice_sent_before_its_ack_came_is_given_up_at_once).
    pytest.param(5_000, False, 0.0, id="3x5000"),
    pytest.param(5_000, True, 0.0, id="3x5000-one-cpu"),
    pytest.param(25_000, False, 0.0, id="3x25000", marks=LONG),
    pytest.param(25_000, True, 0.0, id="3x25000-one-cpu", marks=LONG),
    pytest.param(25_000, False, 3.0, id="3x25000-gateway-stopped-3s", marks=LONG),
    pytest.param(25_000, False, 12.0, id="3x25000-gateway-stopped-12s", marks=LONG),
])
async def test_the_newcomer_path_raises_no_clock_alarm_and_sends_under_half_a_percent_late(
        kafka: Any, topic_prefix: str, tmp_path: Path, events_per_source: int, one_cpu: bool,
        zombie_s: float) -> None:
    """With ``zombie_s``: 5 s into the replay (its sources still send for seconds) the gateway is stopped (SIGSTOP)
    for that long, then woken: every source's next events look that much delayed. (Not at a slower replay speed:
    the trace's 1 s delay bursts would become 10 s, past the gateway's gap timeout.)"""
    if one_cpu and shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    wrapper = ONE_CPU if one_cpu else ()
    trace = tmp_path / "t.jsonl"
    await _skewless("traces", "generate", "--out", str(trace), "--sources", str(SOURCES), "--events",
                    str(events_per_source), "--no-progress", timeout_s=120)
    gateway = GatewayProcess(kafka.bootstrap_servers, topic_prefix, tmp_path, timesync_port=0,
                             netns_prefix=wrapper)
    await gateway.start()
    try:
        loop = asyncio.get_running_loop()
        started_s = loop.time()
        replay = asyncio.ensure_future(_skewless("source", "replay", str(trace), "--port", str(gateway.port),
                                                 "--no-progress", wrapper=wrapper, timeout_s=480,
                                                 log=tmp_path / "replay.log"))
        if zombie_s:
            await asyncio.sleep(5.0)  # the replay started, connected and is sending
            os.kill(gateway.pid, signal.SIGSTOP)
            await asyncio.sleep(zombie_s)
            os.kill(gateway.pid, signal.SIGCONT)
        summary = await replay
        replay_s = loop.time() - started_s
        metrics = await gateway.metrics()
        rss = rss_kib(gateway.pid)
    finally:
        log = await gateway.stop()

    expected = {f"s{k}": events_per_source for k in range(SOURCES)}
    total = sum(expected.values())
    delivery = read_delivery(kafka.bootstrap_servers, topic_prefix, STREAM)
    counts = delivery.summary(expected)
    late_reasons = Counter(r["late_reason"] for r in delivery.late)
    clock = {name: int(metrics.get(f"skewless_gateway_{name}", -1))
             for name in ("clock_steps", "clock_step_false_alarms", "clock_step_unresolved", "clock_delay_resyncs")}
    record_outcome(
        f"Newcomer path: 3 x {events_per_source:,} events{' on one CPU' if one_cpu else ''}"
        f"{f', gateway stopped {zombie_s:g} s' if zombie_s else ''}", group="clock",
        injected=f"`skewless traces generate --sources 3 --events {events_per_source}` (dataset1, perfect clocks), "
                 f"gateway and `skewless source replay` with their defaults"
                 f"{', both pinned with taskset -c 0' if one_cpu else ''}"
                 f"{f'; the gateway SIGSTOPped {zombie_s:g} s, 5 s into the replay' if zombie_s else ''}",
        checked="every event in Kafka exactly once; 0 clock steps, 0 false alarms, 0 clock_step_unresolved; "
                "late < 0.5 %",
        outcome={"events": total, "late": len(delivery.late), "late_reasons": dict(late_reasons),
                 "lost": counts["lost"], "duplicated": counts["duplicated"], **clock,
                 "replay_s": round(replay_s, 1), "gateway_rss_kib": rss, "replay_summary": summary})
    if counts["lost"] or counts["duplicated"]:
        # Every lost seq with its neighbours' records, and the whole gateway log beside the test's files.
        around = {source_id: delivery.around_missing(source_id, n) for source_id, n in expected.items()}
        dump = {"around": around, "late": delivery.late, "summary": summary, "metrics": metrics}
        (tmp_path / "loss.json").write_bytes(orjson.dumps(dump, option=orjson.OPT_NON_STR_KEYS))
        raise AssertionError(f"{counts}; around the missing seqs: {around}; replay: {summary}; "
                             f"files in {tmp_path}; log tail: {log[-3000:]}")
    assert (clock["clock_steps"], clock["clock_step_false_alarms"], clock["clock_step_unresolved"]) == (0, 0, 0), (
        clock, [line for line in log.splitlines() if "clock" in line][:10])
    assert late_reasons["clock_step_unresolved"] == 0
    assert len(delivery.late) < LATE_BUDGET * total, (late_reasons, summary)
