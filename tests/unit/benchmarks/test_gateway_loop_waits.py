"""benchmarks/gateway_loop_waits.py's parsing of ``perf script``: the loop thread's off-CPU intervals, why each began,
who ended it, and its on-CPU bursts, exactly, from a hand-written trace (the shape perf prints)."""

from __future__ import annotations

import pytest

from benchmarks.gateway_loop_waits import Interval, loop_waits, parse_perf_script, report

LOOP = 100


def switch(time: str, prev: tuple[str, int, int], state: str, next_: tuple[str, int, int], *stack: str) -> str:
    """A sched_switch as perf script prints it (task: comm, tid, priority), the leaving task's frames below."""
    (prev_comm, prev_tid, prev_prio), (next_comm, next_tid, next_prio) = prev, next_
    header = (f"{prev_comm} {prev_tid} {time}: sched:sched_switch: prev_comm={prev_comm} prev_pid={prev_tid} "
              f"prev_prio={prev_prio} prev_state={state} ==> next_comm={next_comm} next_pid={next_tid} "
              f"next_prio={next_prio}")
    return "\n".join([header, *(f"\tffffffff82265ec8 {frame}" for frame in stack)]) + "\n"


def wakeup(time: str, waker: tuple[str, int], woken: int, *stack: str) -> str:
    header = f"{waker[0]} {waker[1]} {time}: sched:sched_wakeup: comm=python pid={woken} prio=90 target_cpu=000"
    return "\n".join([header, *(f"\t          0a1b2c {frame}" for frame in stack)]) + "\n"


LOOP_TASK = ("python", LOOP, 90)
IDLE = ("swapper/0", 0, 120)
TRACE = "\n".join([
    switch("1.000000", LOOP_TASK, "S", IDLE, "__schedule", "do_epoll_wait", "epoll_pwait"),
    switch("1.001000", ("C2 CompilerThre", 55, 120), "S", ("swapper/1", 0, 120), "__schedule"),
    switch("1.002000", IDLE, "R", LOOP_TASK, "__schedule"),
    switch("1.003000", LOOP_TASK, "S", IDLE, "__schedule", "futex_wait_queue", "__futex_abstimed_wait_common"),
    wakeup("1.003500", ("python", 200), LOOP, "ttwu_do_activate", "pthread_cond_signal@@GLIBC_2.3.2"),
    switch("1.004500", IDLE, "R", LOOP_TASK, "__schedule"),
    switch("1.005000", LOOP_TASK, "R+", ("java", 300, 120), "__schedule"),
    switch("1.005100", ("java", 300, 120), "S", LOOP_TASK, "__schedule"),
])


def test_each_off_cpu_interval_has_its_reason_its_length_and_its_waker() -> None:
    events = list(parse_perf_script(TRACE.splitlines()))
    assert [e.kind for e in events] == ["switch", "switch", "switch", "switch", "wakeup", "switch", "switch", "switch"]
    assert events[1].comm == "C2 CompilerThre" and events[1].prev_tid == 55
    assert events[0].stack == ("__schedule", "do_epoll_wait", "epoll_pwait")
    waits = loop_waits(events, LOOP)
    assert [(i.start_s, round(i.ms, 6), i.reason, i.waker) for i in waits.off_cpu] == [
        (1.0, 2.0, "epoll", None),
        (1.003, 1.5, "futex", "python:200"),
        (1.005, 0.1, "preempted", None),
    ]
    assert [round(b, 6) for b in waits.bursts_ms] == [1.0, 0.5]  # the first switch in starts the first burst


def test_the_report_counts_each_reason_and_names_the_futex_wakers() -> None:
    text = report(loop_waits(parse_perf_script(TRACE.splitlines()), LOOP))
    lines = text.splitlines()
    assert lines[0] == "off the CPU, by why it left:"
    assert lines[1].split(":")[0].strip() == "epoll"  # the largest total first
    assert "futex:      1 times,      1.5 ms in all" in text and "over 1 ms: 1" in lines[2]
    assert lines[4] == "futex waits over 0.5 ms, by the task that woke the loop: python:200 1"
    assert lines[5] == "on the CPU: 2 bursts, p50 1.000 p99 1.000 max 1.00 ms, over 4 ms: 0"


def test_a_wakeup_of_another_thread_or_before_the_loop_left_names_no_waker() -> None:
    trace = TRACE.replace(" pid=100 prio=90 target_cpu", " pid=101 prio=90 target_cpu")
    waits = loop_waits(parse_perf_script(trace.splitlines()), LOOP)
    assert waits.off_cpu[1] == Interval(1.003, pytest.approx(1.5), "futex", None)  # type: ignore[arg-type]
