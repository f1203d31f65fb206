"""benchmarks/gateway_loop_timeline.py: its analysis of hand-made steps (kinds, window, bursts, exactly), and its hook
in a real interpreter under uvloop (every task step timed under the task's name, connections' reads wrapped)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gateway_loop_timeline import ENV, HOOK, Step, bursts, report, steady_window, step_kinds, steps_of

US = 1_000  # ns


def test_steps_are_sorted_by_start_with_the_digits_of_their_names_as_n() -> None:
    steps = steps_of([(5 * US, 6 * US, "connection-12"), (1 * US, 3 * US, "read"), (2 * US, 4 * US, "kafka-commit-0")])
    assert steps == [Step(1 * US, 3 * US, "read"), Step(2 * US, 4 * US, "kafka-commit-N"),
                     Step(5 * US, 6 * US, "connection-N")]
    assert steps[0].us == 2.0


def test_the_steady_window_drops_what_starts_before_or_after_the_trimmed_reads() -> None:
    reads = [Step(t * US, t * US + 10, "read") for t in range(0, 100, 10)]  # reads at 0, 10, ..., 90 us
    early, late = Step(5 * US, 6 * US, "kafka-poll-N"), Step(95 * US, 96 * US, "kafka-poll-N")
    middle = Step(45 * US, 46 * US, "kafka-poll-N")
    steps = sorted([*reads, early, middle, late])
    window = steady_window(steps, trim=0.1)  # from the read at index 1 (10 us) to the one at index 9 (90 us)
    assert window[0] == reads[1] and window[-1] == reads[9]
    assert middle in window and early not in window and late not in window
    assert steady_window([Step(0, 1, "kafka-poll-N")]) == []  # no read: no window


def test_step_kinds_count_percentiles_and_share_of_the_wall() -> None:
    steps = [Step(0, 100 * US, "read"), Step(100 * US, 110 * US, "read"), Step(200 * US, 230 * US, "kafka-poll-N"),
             Step(300 * US, 400 * US, "read")]
    kinds = step_kinds(steps)  # wall: 0 .. 400 us
    assert [(k.kind, k.count, k.p50_us, k.p99_us, k.max_us) for k in kinds] == [
        ("read", 3, 100.0, 100.0, 100.0), ("kafka-poll-N", 1, 30.0, 30.0, 30.0)]
    assert kinds[0].share == pytest.approx(210 / 400)
    assert kinds[1].share == pytest.approx(30 / 400)
    assert step_kinds([]) == []


def test_bursts_join_steps_closer_than_the_gap_longest_first() -> None:
    steps = [Step(0, 100 * US, "read"),
             Step(120 * US, 200 * US, "kafka-commit-N"),  # 20 us after: the same burst
             Step(210 * US, 250 * US, "read"),  # 10 us after
             Step(300 * US, 310 * US, "read"),  # 50 us after: a new burst
             Step(1000 * US, 1500 * US, "kafka-produce-N")]
    found = bursts(steps, gap_us=30)
    assert [(b.start_ns, b.end_ns, b.us_by_kind) for b in found] == [
        (1000 * US, 1500 * US, (("kafka-produce-N", 500.0),)),
        (0, 250 * US, (("read", 140.0), ("kafka-commit-N", 80.0))),
        (300 * US, 310 * US, (("read", 10.0),))]
    assert found[1].us == 250.0
    text = report(steps, gap_us=30, longest=1)
    assert "kafka-produce-N 500" in text and "read 140" not in text


def test_the_hook_times_every_task_step_under_uvloop_and_wraps_the_connections_reads(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    out = tmp_path / "steps.json"
    script = (
        "import asyncio, uvloop\n"
        "import gateway.connection as connection\n"
        "async def work():\n"
        "    for _ in range(3):\n"
        "        await asyncio.sleep(0)\n"
        "async def main():\n"
        "    await asyncio.create_task(work(), name='work-7')\n"
        "    assert connection.ConnectionHandler._timed\n"
        "uvloop.run(main())\n")
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, ENV: str(out), "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, cwd=root, timeout=60)
    steps = steps_of([tuple(step) for step in json.loads(out.read_text())])
    assert [s.kind for s in steps].count("work-N") == 4  # the first step and one after each of the 3 sleeps
    assert all(s.end_ns >= s.start_ns for s in steps)
