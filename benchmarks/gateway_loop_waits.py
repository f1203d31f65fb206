"""Why the gateway's event loop reads late: where its thread is when it is not on a CPU, and who wakes it.

One real gateway (native core, its event loop's thread at real-time priority as docs/gateway-latency.md's "gateway
first" variant gives it) on a real broker, the paced load of that page (20 sources x 500 events/s, a frame every
5 ms) for ``--seconds``, while ``perf record -e sched:sched_switch -e sched:sched_wakeup -a -g`` records the
scheduler's events of the whole machine. From them, for the loop's thread (its tid is the gateway's pid):

  off-CPU intervals by why it left the CPU: ``epoll`` (waiting for its sockets: idle), ``futex`` (a lock: the
  GIL, mostly), ``preempted`` (runnable, another task took the CPU), ``other``; count, total, p50/p99/max, how many
  over 1 ms; the threads whose wakeup ended the futex waits over 0.5 ms; on-CPU bursts (from a switch in to the
  next switch out) by length.

Found with it (docs/hot-paths.md, target 3's experiments): 37 GIL waits over 1 ms in 6 s, ended by the executor
threads that serve librdkafka's delivery reports in ``flush`` (gateway/collector.py's switch interval). Needs root
and ``perf`` (Debian's linux-perf); prints, writes nothing. The parsing is pure and unit-tested
(tests/unit/benchmarks/test_gateway_loop_waits.py).

Run: .venv/bin/python -m benchmarks.gateway_loop_waits [--seconds 6] [--core native]
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.harness.stats import percentile

__all__ = ["Interval", "LoopWaits", "SchedEvent", "loop_waits", "parse_perf_script", "report"]

_SWITCH = re.compile(r"^(?P<comm>.+?)\s+(?P<tid>\d+)\s+(?P<time>\d+\.\d+):\s+sched:sched_switch:\s+prev_comm=.*?"
                     r"prev_pid=(?P<prev>\d+)\s.*?prev_state=(?P<state>\S+)\s+==>\s+next_comm=.*?"
                     r"next_pid=(?P<next>\d+)\s")
_WAKEUP = re.compile(r"^(?P<comm>.+?)\s+(?P<tid>\d+)\s+(?P<time>\d+\.\d+):\s+sched:sched_wakeup:\s+comm=.*?"
                     r"pid=(?P<woken>\d+)\s")


@dataclass(frozen=True, slots=True)
class SchedEvent:
    """One scheduler event of ``perf script``: a switch (``prev_tid`` leaves the CPU in ``state``, ``next_tid`` comes
    on) or a wakeup (``tid``, running as ``comm``, wakes ``woken_tid``); ``stack``: the leaving or waking task's
    frames, innermost first (symbols only)."""

    kind: str  # "switch" or "wakeup"
    time_s: float
    comm: str
    tid: int
    prev_tid: int = 0
    state: str = ""
    next_tid: int = 0
    woken_tid: int = 0
    stack: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Interval:
    """The loop's thread off a CPU from ``start_s`` for ``ms``, why (``reason``), and who woke it (comm:tid)."""

    start_s: float
    ms: float
    reason: str
    waker: str | None


@dataclass
class LoopWaits:
    off_cpu: list[Interval] = field(default_factory=list)
    bursts_ms: list[float] = field(default_factory=list)  # on-CPU stretches, switch in to switch out


def parse_perf_script(lines: Iterable[str]) -> Iterator[SchedEvent]:
    """``perf script -F comm,tid,time,event,trace,ip,sym`` output (with call graphs) as events, in their order: a
    header line, the task's frames, a blank line."""
    header: re.Match[str] | None = None
    kind = ""
    stack: list[str] = []
    for line in lines:
        if not line.strip():
            if header is not None:
                yield _event(kind, header, tuple(stack))
            header, stack = None, []
        elif header is None:
            switch = _SWITCH.match(line)
            header = switch or _WAKEUP.match(line)
            kind = "switch" if switch else "wakeup"
        elif len(parts := line.split()) >= 2:
            stack.append(parts[1])
    if header is not None:
        yield _event(kind, header, tuple(stack))


def _event(kind: str, header: re.Match[str], stack: tuple[str, ...]) -> SchedEvent:
    time_s, comm, tid = float(header["time"]), header["comm"].strip(), int(header["tid"])
    if kind == "switch":
        return SchedEvent("switch", time_s, comm, tid, prev_tid=int(header["prev"]), state=header["state"],
                          next_tid=int(header["next"]), stack=stack)
    return SchedEvent("wakeup", time_s, comm, tid, woken_tid=int(header["woken"]), stack=stack)


def _reason(event: SchedEvent) -> str:
    if event.state.startswith("R"):
        return "preempted"
    frames = " ".join(event.stack)
    if "epoll" in frames:
        return "epoll"
    if "futex" in frames:
        return "futex"
    return "other"


def loop_waits(events: Iterable[SchedEvent], tid: int) -> LoopWaits:
    """The off-CPU intervals and on-CPU bursts of thread ``tid``: an interval runs from its switch out to its next
    switch in; its waker is the last task that woke it in between."""
    out = LoopWaits()
    left: SchedEvent | None = None
    came_s: float | None = None
    waker: str | None = None
    for event in events:
        if event.kind == "wakeup":
            if event.woken_tid == tid and left is not None:
                waker = f"{event.comm}:{event.tid}"
            continue
        if event.prev_tid == tid:
            if came_s is not None:
                out.bursts_ms.append((event.time_s - came_s) * 1e3)
            left, came_s, waker = event, None, None
        elif event.next_tid == tid:
            if left is not None:
                out.off_cpu.append(Interval(left.time_s, (event.time_s - left.time_s) * 1e3, _reason(left), waker))
            left, came_s = None, event.time_s
    return out


def report(waits: LoopWaits) -> str:
    lines = ["off the CPU, by why it left:"]
    by_reason: dict[str, list[float]] = collections.defaultdict(list)
    for interval in waits.off_cpu:
        by_reason[interval.reason].append(interval.ms)
    for reason, values in sorted(by_reason.items(), key=lambda item: -sum(item[1])):
        lines.append(f"  {reason:>9}: {len(values):6,} times, {sum(values):8.1f} ms in all, p50 "
                     f"{percentile(values, 0.5):.3f} p99 {percentile(values, 0.99):.3f} max {max(values):.2f} "
                     f"ms, over 1 ms: {sum(1 for v in values if v > 1.0)}")
    wakers = collections.Counter(i.waker or "?" for i in waits.off_cpu if i.reason == "futex" and i.ms > 0.5)
    lines.append("futex waits over 0.5 ms, by the task that woke the loop: "
                 + (", ".join(f"{name} {count}" for name, count in wakers.most_common(6)) or "none"))
    bursts = waits.bursts_ms
    lines.append(f"on the CPU: {len(bursts):,} bursts, p50 {percentile(bursts, 0.5):.3f} p99 "
                 f"{percentile(bursts, 0.99):.3f} max {max(bursts, default=0.0):.2f} ms, over 4 ms: "
                 f"{sum(1 for b in bursts if b > 4.0)}")
    return "\n".join(lines)


def _record(seconds: float, core: str, rt_priority: int, out: Path) -> int:
    """Run the gateway and the load while perf records; returns the loop thread's tid (the gateway's pid)."""
    from benchmarks.gateway_latency import FRAME_EVERY_S, run_load
    from benchmarks.gateway_throughput import paced_gateway, scratch_broker

    with scratch_broker() as bootstrap, paced_gateway(
            bootstrap, f"loopwaits{time.time_ns()}", core, max(1, rt_priority - 1)) as (process, port):
        perf = subprocess.Popen(["perf", "record", "-q", "-e", "sched:sched_switch", "-e", "sched:sched_wakeup", "-a",
                                 "-g", "-o", str(out), "--", "sleep", str(seconds + 1)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run_load(port, 20, 500.0, seconds, FRAME_EVERY_S, rt_priority)
        perf.wait(timeout=seconds + 60)
        return process.pid


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=6.0, help="how long the sources send")
    parser.add_argument("--core", choices=["native", "python"], default="native")
    parser.add_argument("--rt-priority", type=int, default=10, help="the sources' SCHED_FIFO priority (the loop's: "
                        "one less)")
    args = parser.parse_args()
    if shutil.which("perf") is None or os.geteuid() != 0:
        sys.exit("gateway_loop_waits: needs root and perf (apt-get install linux-perf)")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "sched.data"
        tid = _record(args.seconds, args.core, args.rt_priority, data)
        script = subprocess.run(["perf", "script", "-i", str(data), "-F", "comm,tid,time,event,trace,ip,sym"],
                                capture_output=True, text=True, check=True).stdout
    print(f"gateway loop thread {tid}, {args.core} core, 20 x 500 events/s for {args.seconds:g} s")
    print(report(loop_waits(parse_perf_script(script.splitlines()), tid)))


if __name__ == "__main__":
    main()
