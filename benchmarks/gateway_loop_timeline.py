"""What the gateway's event loop runs, step by step, and the bursts that keep its sockets unread.

One real gateway (native core, its event loop's thread at real-time priority, as docs/gateway-latency.md's "gateway
first" variant runs it) on a real broker, the paced load of that page (20 sources x 500 events/s, a frame every
5 ms) for ``--seconds``. The gateway process starts with a hook (a ``sitecustomize`` module on its PYTHONPATH, this
benchmark's only: the gateway's code is unchanged) that times, on the loop's thread, every step of every asyncio
task (asyncio's Python Task, which uvloop then creates, with its step timed) and every ``data_received`` of a
connection, and writes them out when the process exits. From them, over the middle 90 % of the run:

  per kind of step (a task's name with its digits as N, ``read`` for a connection's ``data_received``): how many,
  p50/p99/max in us, and the share of the wall time;
  the longest bursts: steps that follow one another with less than ``--gap-us`` between them, i.e. the stretches in
  which the loop read no socket unless a ``read`` is among them, with what they were made of.

Found with it (docs/hot-paths.md, target 3's experiments (h)): the loop stayed busy for 10-23 ms after each commit
(its delivery reports in one 2.3 ms step, the confirmations, the producer task's backlog), the frames read late in
between. The Python Task runs slower than asyncio's C Task: read the shares and the bursts' make-up, not the
absolute times. Prints, writes nothing; the analysis is pure and unit-tested (tests/unit/benchmarks/
test_gateway_loop_timeline.py).

Run: .venv/bin/python -m benchmarks.gateway_loop_timeline [--seconds 5] [--tree CHECKOUT]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks.harness.stats import percentile

__all__ = ["Burst", "Step", "StepKind", "bursts", "report", "steady_window", "step_kinds", "steps_of"]

ENV = "SKEWLESS_LOOP_TIMELINE"
# The gateway process's hook: asyncio.Task replaced (before uvloop reads it) by the Python Task with its step timed,
# ConnectionHandler.data_received wrapped once gateway.connection is imported; the steps written at exit.
HOOK = '''
import os
if os.environ.get("{env}"):
    import asyncio, atexit, json, sys, time
    from asyncio import tasks
    _steps = []
    _clock = time.perf_counter_ns

    def _wrap_reads():
        connection = sys.modules.get("gateway.connection")
        handler = getattr(connection, "ConnectionHandler", None)
        if handler is None or getattr(handler, "_timed", False):
            return
        received = handler.data_received
        def data_received(self, data):
            start = _clock()
            try:
                return received(self, data)
            finally:
                _steps.append((start, _clock(), "read"))
        handler.data_received = data_received
        handler._timed = True

    class TimedTask(tasks._PyTask):
        def _Task__step(self, *args):
            _wrap_reads()
            start = _clock()
            try:
                return super()._Task__step(*args)
            finally:
                _steps.append((start, _clock(), self.get_name()))

    asyncio.Task = tasks.Task = TimedTask
    atexit.register(lambda: open(os.environ["{env}"], "w").write(json.dumps(_steps)))
'''.replace("{env}", ENV)


@dataclass(frozen=True, slots=True, order=True)
class Step:
    start_ns: int
    end_ns: int
    kind: str  # a task's name with its digits as N, or "read"

    @property
    def us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3


@dataclass(frozen=True, slots=True)
class StepKind:
    kind: str
    count: int
    p50_us: float
    p99_us: float
    max_us: float
    share: float  # of the window's wall time


@dataclass(frozen=True, slots=True)
class Burst:
    start_ns: int
    end_ns: int
    us_by_kind: tuple[tuple[str, float], ...]  # most first

    @property
    def us(self) -> float:
        return (self.end_ns - self.start_ns) / 1e3


def steps_of(raw: Sequence[tuple[int, int, str]]) -> list[Step]:
    """The hook's (start, end, name) triples as Steps in start order, the digits of each name as N."""
    return sorted(Step(start, end, re.sub(r"\d+", "N", name)) for start, end, name in raw)


def steady_window(steps: Sequence[Step], trim: float = 0.05) -> list[Step]:
    """The steps that start between the read at ``trim`` of all reads and the one at 1 - ``trim``: the paced load's
    steady middle, without the gateway's start and the sources' ramp and end."""
    reads = [s.start_ns for s in steps if s.kind == "read"]
    if not reads:
        return []
    first, last = reads[int(len(reads) * trim)], reads[min(len(reads) - 1, int(len(reads) * (1 - trim)))]
    return [s for s in steps if first <= s.start_ns <= last]


def step_kinds(steps: Sequence[Step]) -> list[StepKind]:
    """Per kind, most loop time first."""
    if not steps:
        return []
    wall_ns = max(s.end_ns for s in steps) - steps[0].start_ns
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    for step in steps:
        by_kind[step.kind].append(step.us)
    out = [StepKind(kind, len(us), percentile(us, 0.5), percentile(us, 0.99), max(us), sum(us) * 1e3 / wall_ns)
           for kind, us in by_kind.items()]
    return sorted(out, key=lambda k: -k.share)


def bursts(steps: Sequence[Step], gap_us: float) -> list[Burst]:
    """Runs of steps, in start order, each beginning less than ``gap_us`` after the run's end so far; longest first."""
    out: list[Burst] = []
    run: list[Step] = []
    run_end = 0
    for step in steps:
        if run and step.start_ns - run_end >= gap_us * 1e3:
            out.append(_burst(run, run_end))
            run = []
        run_end = step.end_ns if not run else max(run_end, step.end_ns)
        run.append(step)
    if run:
        out.append(_burst(run, run_end))
    return sorted(out, key=lambda b: -b.us)


def _burst(run: list[Step], end_ns: int) -> Burst:
    by_kind: dict[str, float] = collections.defaultdict(float)
    for step in run:
        by_kind[step.kind] += step.us
    return Burst(run[0].start_ns, end_ns, tuple(sorted(by_kind.items(), key=lambda item: -item[1])))


def report(steps: Sequence[Step], gap_us: float, longest: int = 12) -> str:
    lines = [f"{'step':24} {'count':>7} {'p50 us':>8} {'p99 us':>8} {'max us':>9} {'of the wall':>11}"]
    lines += [f"{k.kind:24} {k.count:7,} {k.p50_us:8.1f} {k.p99_us:8.1f} {k.max_us:9.1f} {k.share:11.1%}"
              for k in step_kinds(steps)]
    lines.append(f"the longest bursts (steps less than {gap_us:g} us apart), us, and what they were made of:")
    for burst in bursts(steps, gap_us)[:longest]:
        lines.append(f"{burst.us:9.0f}  " + ", ".join(f"{kind} {us:.0f}" for kind, us in burst.us_by_kind[:5]))
    return "\n".join(lines)


def _record(seconds: float, tree: Path | None, rt_priority: int, out: Path, hook_dir: Path) -> None:
    """The gateway (with the hook first on its PYTHONPATH; ``tree``'s modules next, run from there as
    gateway_throughput.start_gateway runs another checkout) under the paced load; its steps end up in ``out``."""
    from benchmarks.gateway_latency import FRAME_EVERY_S, run_load
    from benchmarks.gateway_throughput import paced_gateway, scratch_broker

    (hook_dir / "sitecustomize.py").write_text(HOOK)
    with scratch_broker() as bootstrap, paced_gateway(
            bootstrap, f"timeline{time.time_ns()}", "native", max(1, rt_priority - 1), tree=tree,
            path_first=hook_dir, env={ENV: str(out)}) as (_process, port):
        run_load(port, 20, 500.0, seconds, FRAME_EVERY_S, rt_priority)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long the sources send")
    parser.add_argument("--tree", type=Path, help="the gateway of another checkout (its modules first)")
    parser.add_argument("--gap-us", type=float, default=30.0, help="steps closer than this belong to one burst")
    parser.add_argument("--rt-priority", type=int, default=10, help="the sources' SCHED_FIFO priority (the loop's: "
                        "one less)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("gateway_loop_timeline: needs root (real-time priorities, as gateway_latency's variants)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "steps.txt"
        _record(args.seconds, args.tree, args.rt_priority, out, Path(tmp))
        raw = json.loads(out.read_text())
    steps = steady_window(steps_of(raw))
    print(f"gateway event loop, native core, 20 x 500 events/s for {args.seconds:g} s: {len(steps):,} steps in the "
          f"steady window")
    print(report(steps, args.gap_us))


if __name__ == "__main__":
    main()
