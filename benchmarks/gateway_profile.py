"""Where one gateway process spends its CPU end to end: the 20-source saturated run of benchmarks/gateway_throughput.py
(same load generator, same broker settings, transactions on, the native core by default) sampled from outside.

Three views of the same run, written to docs/gateway-profile-e2e.txt with the command that made it:

* CPU per event per thread (/proc/<pid>/task): the event loop's thread against librdkafka's threads;
* py-spy ``--native`` (Python and native frames in one stack, 100 Hz): each sample of the event loop's thread by
  what it was doing at the leaf (interpreted Python, Rust in skewless_native, the cyclic garbage collector,
  confluent-kafka/librdkafka, libc's allocator, the interpreter's object code), then per Python function the
  share of samples inside it (inclusive) and the share where it was the innermost Python frame of the gateway's
  own code (self: the native code it called included, which the Python-only view cannot split);
* the garbage collector's samples by the gateway function that triggered it.

py-spy ``--native`` stops the process for each sample: the run's events/s and CPU per event are slower than
without it (gateway_throughput.py measures those); the shares are what this file is for.

Run: .venv/bin/python -m benchmarks.gateway_profile [--core native] [--tree CHECKOUT] [--output FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from benchmarks.gateway_throughput import load, start_gateway
from benchmarks.harness.processes import CLK_TCK, cpu_s, stat_cpu_ticks
from broker.launcher import KafkaBroker

DOCS = Path(__file__).resolve().parents[1] / "docs"
SOURCES = 20
EVENTS = 200_000
OURS = ("gateway/", "reorder/", "broker/", "contract/", "timesync/")
_PY_FRAME = re.compile(r"^(.*) \((.*\.py):(\d+)\)$")
_GC_FRAMES = ("gc_collect", "collect_with_callback")


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds per thread, by name; the event loop's thread (the process's first) as "event loop"."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except FileNotFoundError:
            continue  # a thread that ended meanwhile
        key = "event loop" if task.name == str(pid) else name
        out[key] = out.get(key, 0.0) + stat_cpu_ticks(stat) / CLK_TCK
    return out


def leaf_kind(frames: list[str]) -> str:
    if any(marker in frame for frame in frames for marker in _GC_FRAMES):
        return "cyclic garbage collector"
    leaf = frames[-1]
    if _PY_FRAME.match(leaf):
        return "interpreted Python"
    where = leaf.rpartition(" (")[2]
    if ".rs:" in where or "skewless_native" in where:
        return "Rust (skewless_native)"
    if "rdkafka" in where or "confluent_kafka" in where:
        return "confluent-kafka / librdkafka"
    if "libc" in where or "malloc" in leaf:
        return "libc (malloc, memcpy, syscalls)"
    if ".c:" in where or ".h:" in where or "libpython" in where:
        return "CPython's C code (objects, calls)"
    return "other native"


def summarize(raw: Path, header: str, top: int = 45) -> str:
    """py-spy's raw stacks of the event loop's thread (the one running the gateway's coroutines)."""
    kinds: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    gc_by: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "Runner.run" not in stack:
            continue  # executor and librdkafka threads: their CPU is in the thread table
        samples = int(count)
        total += samples
        frames = stack.split(";")
        kind = leaf_kind(frames)
        kinds[kind] += samples
        matches = [m for m in (_PY_FRAME.match(f) for f in frames) if m is not None]
        for name in {f"{m[1]} ({m[2]})" for m in matches}:
            inclusive[name] += samples
        mine = [m for m in matches if m[2].startswith(OURS)]
        where = f"{mine[-1][1]} ({mine[-1][2]}:{mine[-1][3]})" if mine else "(the event loop itself)"
        own[where] += samples
        if kind == "cyclic garbage collector":
            gc_by[where] += samples

    def table(counts: Counter[str], keep: tuple[str, ...] = OURS) -> str:
        rows = [(n, k) for k, n in counts.most_common() if not keep or any(o in k for o in keep) or "(" not in k]
        return "\n".join(f"{100 * n / total:6.1f} %  {k}" for n, k in rows[:top])

    return (f"{header}\n\n{total} samples of the event loop's thread.\n\n"
            f"-- what the thread was doing (the sample's innermost frame)\n{table(kinds, ())}\n\n"
            f"-- inclusive: samples inside each function of the gateway's code\n{table(inclusive)}\n\n"
            f"-- self: samples whose innermost gateway frame is this line (native code it called included)\n"
            f"{table(own, ())}\n\n"
            f"-- the garbage collector's samples by the gateway line whose allocation triggered it\n"
            f"{table(gc_by, ())}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--core", choices=["native", "python"], default="native")
    parser.add_argument("--tree", type=Path, help="profile the gateway of another checkout (its modules first)")
    parser.add_argument("--output", type=Path, default=DOCS / "gateway-profile-e2e.txt")
    args = parser.parse_args()
    command = "python -m benchmarks.gateway_profile " + shlex.join(sys.argv[1:])
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            process, port = start_gateway(state.bootstrap_servers, f"profile{time.time_ns()}", tree=args.tree,
                                          core=args.core)
            raw = Path(tmp) / "py-spy.raw"
            try:
                time.sleep(0.5)
                spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                                        str(process.pid), "--native", "--format", "raw", "--rate", "100",
                                        "--output", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1.5)
                threads0, cpu0 = thread_cpu_s(process.pid), cpu_s(process.pid)
                seconds, _acks = asyncio.run(load(port, SOURCES, EVENTS // SOURCES))
                threads1, cpu1 = thread_cpu_s(process.pid), cpu_s(process.pid)
                spy.send_signal(2)
                spy.wait(timeout=60)
            finally:
                process.terminate()
                process.wait(timeout=30)
        finally:
            broker.stop()
        load_end = os.getloadavg()
        per_thread = sorted(((threads1[k] - threads0.get(k, 0.0)) * 1e6 / EVENTS, k) for k in threads1)
        thread_rows = "\n".join(f"{us:7.2f} us/event  {name}" for us, name in reversed(per_thread) if us >= 0.01)
        header = (f"{command}\n\n"
                  f"The {args.core} core's gateway{f' of {args.tree}' if args.tree else ''}, {SOURCES} in-order "
                  f"sources, {EVENTS:,} events, transactions on, py-spy --native attached (it slows the run): "
                  f"{EVENTS / seconds:,.0f} events/s, {(cpu1 - cpu0) * 1e6 / EVENTS:.2f} CPU us/event. Load "
                  f"average (1/5/15 min) {'/'.join(f'{x:.2f}' for x in load_start)} at the start, "
                  f"{'/'.join(f'{x:.2f}' for x in load_end)} at the end, on 2 cores.\n\n"
                  f"-- CPU per event per thread (/proc)\n{thread_rows}")
        args.output.write_text(summarize(raw, header))
    print(args.output.read_text())


if __name__ == "__main__":
    main()
