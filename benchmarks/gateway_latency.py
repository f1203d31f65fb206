"""Added latency at a steady rate on the real broker, split into the sources' schedule and the gateway's own share,
per core (python, native) side by side in one run. Writes docs/gateway-latency.md, its JSON and a PNG.

The load of docs/gateway-benchmark.md's paced table (20 sources x 500 events/s, a frame every 5 ms, spread-out
phases; 1 source x 5,000 events/s as the control), with the load generator in its own process (spawned; its figures
come back over a pipe), in two variants: "same host" (normal priority: the sources' send schedule competes with the
gateway, the broker and everything else on this 2-core machine) and "own host" (the source process at SCHED_FIFO
real-time priority: a model of devices on their own hosts, whose schedule does not depend on this host's load). The
gateway and the broker run at normal priority in both.

Per event, from its record in Kafka: ``added`` = release - arrival (as the gateway benchmark reports it); the
**floor** = the earliest time any correct merge could have released it given when the other sources' frames actually
reached the gateway (``release_floors_us``); ``excess`` = release - floor, what the gateway added by the records'
stamps. A release stamp is the read time of the frame whose handling released the event, so it may lie below the
floor when frames were handled out of their read order; the ack may not: an ack before the floor would be a release
before every other source had shown it would send nothing older, and the run fails on one.

Run: .venv/bin/python -m benchmarks.gateway_latency [--repeats 3] [--seconds 5] [--cores python native]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import multiprocessing
import os
import tempfile
import time
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from benchmarks.gateway_throughput import (
    CORE_LABELS,
    frame_gaps_ms,
    load_averages,
    paced_gateway,
    paced_source,
    scratch_broker_state,
    unaccounted,
)
from benchmarks.harness.processes import jit_compiler_cpu_s
from benchmarks.harness.resending_source import ResendingSource
from benchmarks.harness.stats import percentile
from broker.reader import read_topic
from contract.records import EVENT

DOCS = Path(__file__).resolve().parents[1] / "docs"
RESULTS = DOCS / "gateway-latency.json"
FRAME_EVERY_S = 0.005
# The sources' loop wakes each this long before its frame is due and sleeps out the rest (paced_source's lead_s):
# its timers alone made frames leave up to a millisecond late, counted in the sources' schedule, not the gateway's.
SEND_LEAD_S = 0.002
# Before the first measured run, one gateway carries the 20-source load this long, not measured: a fresh broker's JVM
# compiles its produce path meanwhile (its JIT compiler threads ran 1.8 s of CPU in the first 5-s run, in stretches
# of 1-3 ms that the gateway's thread waited behind, and 0.26 s by the sixth), which a broker in service did long ago.
BROKER_WARM_UP_S = 30.0
LOADS = ((1, 5000.0), (20, 500.0))  # (sources, events/s per source): the control, then issue 26's target 3
# normal priority; the source process at real-time priority; that and the gateway's main thread (its event loop) at
# real-time priority too, one below the sources'
VARIANTS = ("same host", "own host", "gateway first")
FloorInput = tuple[str, int, int, int]  # (source_id, seq, ref_ts_us, arrival_ts_us) of one event


def release_floors_us(events: Sequence[FloorInput]) -> list[int | None]:
    """Per event, the earliest release any correct merge could give it: the merge may release an event of source A
    at reference time t once every other live source B has delivered an event at or past t (reorder/merger.py: an
    empty source blocks a head only while its frontier is below the head's t; equal times go by source id, which
    holds nothing back). So the floor is the latest, over the other sources, of the arrival of B's first event (in
    seq order) whose stamps reached t, and never before the event's own arrival. None where some other source never
    reached t (the tail of a run: a heartbeat or the source's departure released it, not a frame). The sources are
    those of ``events``."""
    by_source: dict[str, list[tuple[int, int, int]]] = {}
    for source_id, seq, ref_us, arrival_us in events:
        by_source.setdefault(source_id, []).append((seq, ref_us, arrival_us))
    reach: dict[str, tuple[list[int], list[int]]] = {}
    for source_id, rows in by_source.items():
        rows.sort()
        reached, arrivals, high = [], [], -(1 << 62)
        for _seq, ref_us, arrival_us in rows:
            high = max(high, ref_us)  # the source's frontier after this event
            reached.append(high)
            arrivals.append(arrival_us)
        reach[source_id] = (reached, arrivals)
    shown: dict[tuple[str, int], int | None] = {}  # (source, t): when every other source had shown t
    floors: list[int | None] = []
    for source_id, _seq, ref_us, arrival_us in events:
        key = (source_id, ref_us)
        if key not in shown:
            shown[key] = others_reached_us(reach, source_id, ref_us)
        others = shown[key]
        floors.append(None if others is None else max(others, arrival_us))
    return floors


def others_reached_us(reach: dict[str, tuple[list[int], list[int]]], source_id: str, ref_us: int) -> int | None:
    """The latest, over the sources other than ``source_id``, arrival of their first event whose frontier reached
    ``ref_us`` (None if one never did)."""
    latest = -(1 << 62)
    for other, (reached, arrivals) in reach.items():
        if other == source_id:
            continue
        index = bisect_left(reached, ref_us)
        if index == len(reached):
            return None
        latest = max(latest, arrivals[index])
    return latest


@dataclass
class Shares:
    """Per event with a floor, in us: added = release - arrival, waited = floor - arrival (the part no merge could
    avoid), excess = release - floor (what the records say the gateway added), acked = ack - floor (the gateway's
    whole share up to its ack: the merge's own waits, the frames' queueing, the produce and the transaction's
    commit); scheduled = the floor on the sources' send stamps instead of the gateway's arrival stamps less the
    event's own send stamp (what the sources' schedule alone forces on any merge, with instant transport and reads);
    read_lag = arrival - send stamp (loopback, and how late the gateway read the frame); ``tail``: events without a
    floor (released by a heartbeat or a departure)."""
    added_us: list[int]
    waited_us: list[int]
    excess_us: list[int]
    acked_us: list[int]
    scheduled_us: list[int]
    read_lag_us: list[int]
    tail: int


def ack_times_us(acks: Sequence[tuple[int, int]], seqs: Sequence[int]) -> list[int]:
    """When each of ``seqs`` was acked: the first of ``acks`` ((acked seq, when), cumulative, in the order they came)
    that covers it."""
    covered = [seq for seq, _when in acks]
    return [acks[bisect_left(covered, seq)][1] for seq in seqs]


def latency_shares(records: Sequence[dict[str, Any]], acks: dict[str, list[tuple[int, int]]]) -> Shares:
    """The event records' shares. ``release_ts_us`` is the arrival stamp of the frame whose handling released the
    event, and frames of different connections may be handled in another order than they were read, so a release
    stamp may lie before the floor (a negative excess) without any release before the promise. The ack cannot: the
    gateway acks an event only after it released and committed it, so an ack before the floor is a release before the
    promise, and raises AssertionError."""
    floors = release_floors_us([(str(r["source_id"]), int(r["seq"]), int(r["ref_ts_us"]), int(r["arrival_ts_us"]))
                                for r in records])
    # The paced sources stamp a frame's events with the real clock as they send it: the stamp is the send time.
    sent_floors = release_floors_us([(str(r["source_id"]), int(r["seq"]), int(r["ref_ts_us"]), int(r["ref_ts_us"]))
                                     for r in records])
    acked = {source_id: dict(zip(seqs, ack_times_us(acks[source_id], seqs), strict=True)) for source_id, seqs in
             _seqs_by_source(records).items()}
    shares = Shares([], [], [], [], [], [], 0)
    for record, floor, sent_floor in zip(records, floors, sent_floors, strict=True):
        if floor is None or sent_floor is None:
            shares.tail += 1
            continue
        release, arrival = int(record["release_ts_us"]), int(record["arrival_ts_us"])
        ack = acked[str(record["source_id"])][int(record["seq"])]
        assert ack >= floor, (f"{record['source_id']} seq {record['seq']}: acked at {ack} us, before its floor "
                              f"{floor} us (arrival {arrival} us): a release before the merge's promise")
        shares.added_us.append(release - arrival)
        shares.waited_us.append(floor - arrival)
        shares.excess_us.append(release - floor)
        shares.acked_us.append(ack - floor)
        shares.scheduled_us.append(sent_floor - int(record["ref_ts_us"]))
        shares.read_lag_us.append(arrival - int(record["ref_ts_us"]))
    return shares


def _seqs_by_source(records: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
    seqs: dict[str, list[int]] = {}
    for record in records:
        seqs.setdefault(str(record["source_id"]), []).append(int(record["seq"]))
    return seqs


class AckTimedSource(ResendingSource):
    """A ResendingSource that notes when each cumulative ack came (the real clock, us)."""

    def __init__(self, host: str, port: int, source_id: str, stream: str) -> None:
        super().__init__(host, port, source_id, stream)
        self.acks: list[tuple[int, int]] = []  # (acked seq, when)

    def _heard(self, message: object) -> None:
        before = self.acked_seq
        super()._heard(message)
        if self.acked_seq > before:
            self.acks.append((self.acked_seq, time.time_ns() // 1000))


async def scheduled_source(link: AckTimedSource, source: int, rate: float, seconds: float, frame_every_s: float,
                           ) -> tuple[int, int, list[float]]:
    """gateway_throughput's ``paced_source`` (a frame every ``frame_every_s`` on a fixed schedule from a phase of
    its own, the events due since its start, stamped with the real clock), that also says how late each frame left
    against its schedule (ms): the source's own slip, before any socket or gateway. Returns the events sent, the
    reconnects and those slips."""
    slips_ms: list[float] = []
    sent, reconnects = await paced_source(link, source, rate, seconds, frame_every_s, slips_ms, SEND_LEAD_S)
    return sent, reconnects, slips_ms


async def source_load(port: int, sources: int, rate: float, seconds: float, frame_every_s: float,
                      ) -> dict[str, Any]:
    """Every source says hello before any sends (as gateway_throughput's ``paced_load``), then runs its schedule."""
    links = [AckTimedSource("127.0.0.1", port, f"src-{s}", "bench") for s in range(sources)]
    await asyncio.gather(*(link.connect() for link in links))
    done = await asyncio.gather(*(scheduled_source(links[s], s, rate, seconds, frame_every_s)
                                  for s in range(sources)))
    return {"counts": [sent for sent, _, _ in done], "reconnects": sum(r for _, r, _ in done),
            "slips_ms": [slip for _, _, slips in done for slip in slips],
            "acks": {link.source_id: link.acks for link in links}}


def load_process(pipe: Connection, port: int, sources: int, rate: float, seconds: float, frame_every_s: float,
                 rt_priority: int | None) -> None:
    """The load generator's process: at SCHED_FIFO ``rt_priority`` if given (threads it starts inherit it), and
    whether that took, with its figures, back over ``pipe``."""
    if rt_priority is not None:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(rt_priority))
    # Off: each source keeps every event it wrote (to resend), and the collector's full passes over them stopped
    # every source at once for up to 32 ms, counted as the sources' slip. Nothing here makes a reference cycle that
    # must be collected within a run.
    gc.disable()
    started_s, cpu_s = time.monotonic(), time.process_time()
    result = asyncio.run(source_load(port, sources, rate, seconds, frame_every_s))
    result["cpu_s"], result["wall_s"] = time.process_time() - cpu_s, time.monotonic() - started_s
    result["fifo"] = os.sched_getscheduler(0) == os.SCHED_FIFO
    pipe.send(result)
    pipe.close()


def run_load(port: int, sources: int, rate: float, seconds: float, frame_every_s: float,
             rt_priority: int | None) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    receiving, sending = context.Pipe(duplex=False)
    process = context.Process(target=load_process, args=(sending, port, sources, rate, seconds, frame_every_s,
                                                         rt_priority), daemon=True)
    process.start()
    sending.close()
    try:
        if not receiving.poll(seconds + 120):
            raise TimeoutError(f"the load process sent nothing within {seconds + 120:.0f} s")
        result: dict[str, Any] = receiving.recv()
    except EOFError as exc:
        raise RuntimeError(f"the load process ended without its figures (exit code {process.exitcode})") from exc
    finally:
        process.join(30)
        if process.is_alive():
            process.terminate()
    return result


def warm_up_broker(bootstrap: str, broker_pid: int) -> float:
    """BROKER_WARM_UP_S of the 20-source load through a native-core gateway, not measured; returns the CPU seconds
    the broker's JIT compiler used meanwhile."""
    compiled_s = jit_compiler_cpu_s(broker_pid)
    sources, rate = LOADS[-1]
    with paced_gateway(bootstrap, f"warmup{time.time_ns()}", "native", None) as (_process, port):
        run_load(port, sources, rate, BROKER_WARM_UP_S, FRAME_EVERY_S, None)
    return jit_compiler_cpu_s(broker_pid) - compiled_s


def latency_run(bootstrap: str, sources: int, rate: float, seconds: float, core: str,
                rt_priority: int | None, variant: str, tree: Path | None = None,
                broker_pid: int | None = None) -> dict[str, Any]:
    """One gateway (``--core core``; ``tree``: another checkout's), one load process; the figures of its records.
    ``rt_priority``: the sources' SCHED_FIFO priority in the variants that have one (not "same host").
    ``broker_pid``: also the CPU seconds the broker's JIT compiler used during the load."""
    prefix = f"latency{sources}x{time.time_ns()}"
    if variant == "same host":
        rt_priority = None
    loop_priority = max(1, rt_priority - 1) if variant == "gateway first" and rt_priority is not None else None
    with tempfile.TemporaryFile() as log:
        with paced_gateway(bootstrap, prefix, core, loop_priority, tree=tree, stderr=log) as (process, port):
            before = main_thread_sched_ns(process.pid), time.monotonic_ns()
            compiled_before_s = None if broker_pid is None else jit_compiler_cpu_s(broker_pid)
            load = run_load(port, sources, rate, seconds, FRAME_EVERY_S, rt_priority)
            after = main_thread_sched_ns(process.pid), time.monotonic_ns()
            compiled_s = (None if broker_pid is None or compiled_before_s is None
                          else jit_compiler_cpu_s(broker_pid) - compiled_before_s)
        log.seek(0)
        gateway_log = log.read().decode(errors="replace")
    records = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.events.bench", 120, settled=True)]
    events = [r for r in records if r.get("kind") == EVENT]
    late = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.late.bench", 30, settled=True)]
    missing, repeated = unaccounted(load["counts"], [*events, *late])
    assert not missing and not repeated, (f"{sources} sources ({core}): missing {missing[:10]}, more than once "
                                          f"{repeated[:10]}; gateway log:\n{gateway_log[-10_000:]}")
    assert rt_priority is None or load["fifo"], "the load process did not get its real-time priority"
    return {"sources": sources, "core": core, "variant": variant,
            "events_per_s": sum(load["counts"]) / seconds, "late": len(late), "reconnects": load["reconnects"],
            "source_cpu_share": load["cpu_s"] / load["wall_s"],
            "gateway_cpu_share": (after[0][0] - before[0][0]) / (after[1] - before[1]),
            "gateway_runqueue_share": (after[0][1] - before[0][1]) / (after[1] - before[1]),
            "broker_jit_s": compiled_s,
            **figures(latency_shares(events, load["acks"]), frame_gaps_ms(events), load["slips_ms"])}


def main_thread_sched_ns(pid: int) -> tuple[int, int]:
    """(ns on a CPU, ns runnable but waiting for one) of the process's main thread, the one whose event loop reads
    the sockets (/proc/<pid>/schedstat)."""
    on_cpu, waiting, _slices = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(on_cpu), int(waiting)


def figures(shares: Shares, gaps_ms: list[float], slips_ms: list[float]) -> dict[str, Any]:
    """p50/p99/max (ms) of each share, of the frame gaps at the gateway and of the sources' send slips."""
    negative = [v for v in shares.excess_us if v < 0]
    out: dict[str, Any] = {"events": len(shares.added_us), "tail": shares.tail, "stamp_inversions": len(negative),
                           "excess_min_ms": min(negative, default=0) / 1e3}
    for name, values in (("added", [v / 1e3 for v in shares.added_us]), ("waited", [v / 1e3 for v in shares.waited_us]),
                         ("excess", [v / 1e3 for v in shares.excess_us]), ("acked", [v / 1e3 for v in shares.acked_us]),
                         ("scheduled", [v / 1e3 for v in shares.scheduled_us]),
                         ("read_lag", [v / 1e3 for v in shares.read_lag_us]),
                         ("gap", gaps_ms), ("slip", slips_ms)):
        out.update({f"{name}_p50_ms": percentile(values, 0.5), f"{name}_p99_ms": percentile(values, 0.99),
                    f"{name}_max_ms": max(values, default=float("nan"))})
    return out


def plan(repeats: int, cores: list[str]) -> list[tuple[int, str, int, float, str]]:
    """(repeat, variant, sources, rate, core) in run order: variants and cores alternate from one repeat and load
    to the next, so that none always runs first on a warming or cooling machine."""
    steps = []
    for repeat in range(repeats):
        variants = VARIANTS if repeat % 2 == 0 else VARIANTS[::-1]
        for index, variant in enumerate(variants):
            for load_index, (sources, rate) in enumerate(LOADS):
                flip = (repeat + index + load_index) % 2
                steps += [(repeat, variant, sources, rate, core) for core in (cores[::-1] if flip else cores)]
    return steps


def run_all(repeats: int, seconds: float, cores: list[str], rt_priority: int) -> dict[str, Any]:
    """Every run of the plan on one broker, with the 1-minute load average at the start and the end."""
    load = {"start": load_averages()}
    print(f"load average at start: {load['start']}", flush=True)
    rows = []
    with scratch_broker_state() as broker:
        bootstrap = broker.bootstrap_servers
        warm_up_jit_s = warm_up_broker(bootstrap, broker.pid)
        print(f"broker warm-up ({BROKER_WARM_UP_S:.0f} s): its JIT compiler used {warm_up_jit_s:.2f} s of CPU",
              flush=True)
        for repeat, variant, sources, rate, core in plan(repeats, cores):
            row = latency_run(bootstrap, sources, rate, seconds, core, rt_priority, variant, broker_pid=broker.pid)
            row["repeat"] = repeat
            print(f"#{repeat} {variant:>9} {CORE_LABELS[core]:>11} {sources:>2} x {rate:,.0f}/s: added p50/p99/max "
                  f"{row['added_p50_ms']:.2f}/{row['added_p99_ms']:.2f}/{row['added_max_ms']:.2f} ms, waited p99 "
                  f"{row['waited_p99_ms']:.2f}, excess p50/p99/max {row['excess_p50_ms']:.2f}/"
                  f"{row['excess_p99_ms']:.2f}/{row['excess_max_ms']:.2f} (below 0: {row['stamp_inversions']}, "
                  f"min {row['excess_min_ms']:.2f}), ack-floor p50/p99 {row['acked_p50_ms']:.1f}/"
                  f"{row['acked_p99_ms']:.1f}, scheduled p50/p99 {row['scheduled_p50_ms']:.2f}/{row['scheduled_p99_ms']:.2f}, "
                  f"read lag p99 {row['read_lag_p99_ms']:.2f}, gateway main thread on a CPU {row['gateway_cpu_share']:.2f} "
                  f"waiting for one {row['gateway_runqueue_share']:.2f}, sources' CPU {row['source_cpu_share']:.2f}, gap p99 {row['gap_p99_ms']:.2f}, "
                  f"slip p99 {row['slip_p99_ms']:.2f}, tail {row['tail']}, late {row['late']}, "
                  f"broker JIT {row['broker_jit_s']:.2f} s, "
                  f"reconnects {row['reconnects']}", flush=True)
            rows.append(row)
    load["end"] = load_averages()
    print(f"load average at end: {load['end']}", flush=True)
    return {"rows": rows, "load_average": load, "seconds": seconds, "frame_ms": FRAME_EVERY_S * 1e3,
            "send_lead_ms": SEND_LEAD_S * 1e3, "rt_priority": rt_priority,
            "broker_warm_up_s": BROKER_WARM_UP_S, "broker_warm_up_jit_s": warm_up_jit_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="how long each run's sources send")
    parser.add_argument("--cores", nargs="+", choices=["python", "native"], default=["python", "native"])
    parser.add_argument("--rt-priority", type=int, default=10, help="SCHED_FIFO priority of the 'own host' sources")
    parser.add_argument("--no-report", action="store_true", help="print, do not write docs/")
    parser.add_argument("--report-from-saved", action="store_true", help=f"rewrite the page from {RESULTS.name}")
    args = parser.parse_args()
    if args.report_from_saved:
        write_page(orjson.loads(RESULTS.read_bytes()))
        return
    saved = run_all(args.repeats, args.seconds, list(dict.fromkeys(args.cores)), args.rt_priority)
    if not args.no_report:
        RESULTS.write_bytes(orjson.dumps(saved, option=orjson.OPT_INDENT_2))
        write_page(saved)




def runs_of(rows: list[dict[str, Any]], variant: str, core: str, sources: int) -> list[dict[str, Any]]:
    return [r for r in rows if r["variant"] == variant and r["core"] == core and r["sources"] == sources]


def spread(runs: list[dict[str, Any]], key: str) -> str:
    """The median over the runs, and their range."""
    values = sorted(r[key] for r in runs)
    median = values[len(values) // 2] if len(values) % 2 else (values[len(values) // 2 - 1] + values[len(values) // 2]) / 2
    return f"{median:.2f} ({values[0]:.2f}-{values[-1]:.2f})" if len(values) > 1 else f"{median:.2f}"


def median_of(runs: list[dict[str, Any]], key: str) -> float:
    values = sorted(r[key] for r in runs)
    middle = len(values) // 2
    return float(values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2)


def configurations(saved: dict[str, Any], sources: int) -> list[tuple[str, str, list[dict[str, Any]], int]]:
    """(variant, core, its runs at ``sources``, in how many of them the added p99 met the target) for each variant and
    core that ran."""
    target_ms = saved["frame_ms"] + 1
    out = []
    for variant in VARIANTS:
        for core in dict.fromkeys(r["core"] for r in saved["rows"]):
            runs = runs_of(saved["rows"], variant, core, sources)
            if runs:
                out.append((variant, core, runs, sum(r["added_p99_ms"] <= target_ms for r in runs)))
    return out


def summary_rows(saved: dict[str, Any], sources: int) -> str:
    """One line per variant and core at ``sources``: medians over the runs and their ranges."""
    lines = []
    for variant, core, runs, met in configurations(saved, sources):
        lines.append(
            f"| {variant} | {CORE_LABELS[core]} | {len(runs)} | {spread(runs, 'added_p50_ms')} | "
            f"{spread(runs, 'added_p99_ms')} | {met} of {len(runs)} | {spread(runs, 'waited_p99_ms')} | "
            f"{spread(runs, 'excess_p99_ms')} | {sum(r['stamp_inversions'] for r in runs):,} "
            f"({min(r['excess_min_ms'] for r in runs):.2f}) | {spread(runs, 'scheduled_p99_ms')} | "
            f"{spread(runs, 'read_lag_p99_ms')} | {spread(runs, 'slip_p99_ms')} | {spread(runs, 'gap_p99_ms')} | "
            f"{spread(runs, 'acked_p50_ms')} | {spread(runs, 'acked_p99_ms')} | {spread(runs, 'gateway_cpu_share')} | "
            f"{spread(runs, 'gateway_runqueue_share')} | {spread(runs, 'source_cpu_share')} |")
    return "\n".join(lines)


def all_rows(saved: dict[str, Any]) -> str:
    return "\n".join(
        f"| {r['repeat']} | {r['variant']} | {CORE_LABELS[r['core']]} | {r['sources']} | {r['events_per_s']:,.0f} | "
        f"{r['added_p50_ms']:.2f} / {r['added_p99_ms']:.2f} / {r['added_max_ms']:.2f} | "
        f"{r['waited_p50_ms']:.2f} / {r['waited_p99_ms']:.2f} / {r['waited_max_ms']:.2f} | "
        f"{r['excess_p50_ms']:.2f} / {r['excess_p99_ms']:.2f} / {r['excess_max_ms']:.2f} | "
        f"{r['stamp_inversions']:,} ({r['excess_min_ms']:.2f}) | {r['scheduled_p50_ms']:.2f} / "
        f"{r['scheduled_p99_ms']:.2f} | {r['read_lag_p50_ms']:.2f} / {r['read_lag_p99_ms']:.2f} | "
        f"{r['slip_p99_ms']:.2f} | {r['gap_p50_ms']:.2f} / {r['gap_p99_ms']:.2f} | {r['acked_p50_ms']:.1f} / "
        f"{r['acked_p99_ms']:.1f} | {r['gateway_cpu_share']:.2f} / {r['gateway_runqueue_share']:.2f} | "
        f"{r['source_cpu_share']:.2f} | {r['tail']} | {r['late']} | {r['reconnects']} |" for r in saved["rows"])


def verdicts(saved: dict[str, Any]) -> str:
    """Per variant and core at 20 sources: the target on added p99, and what the gateway itself added."""
    target_ms = saved["frame_ms"] + 1
    lines = []
    for variant, core, runs, met in configurations(saved, 20):
        verdict = "met" if met == len(runs) else "missed" if met == 0 else f"met in {met} of {len(runs)} runs"
        lines.append(
            f"- **{variant}, {CORE_LABELS[core]}: {verdict}** (added p99 {spread(runs, 'added_p99_ms')} ms against "
            f"{target_ms:.0f} ms). The floor alone (waited p99) {spread(runs, 'waited_p99_ms')} ms; on the send "
            f"stamps (the sources' schedule with instant reads) {spread(runs, 'scheduled_p99_ms')} ms. The "
            f"gateway's excess over the floor by the records' stamps: p99 {spread(runs, 'excess_p99_ms')} ms, "
            f"max {max(r['excess_max_ms'] for r in runs):.2f} ms; stamps below the floor in "
            f"{sum(r['stamp_inversions'] for r in runs):,} of {sum(r['events'] for r in runs):,} events (down to "
            f"{min(r['excess_min_ms'] for r in runs):.2f} ms); read lag p99 {spread(runs, 'read_lag_p99_ms')} ms; "
            f"ack after the floor p50 {spread(runs, 'acked_p50_ms')} ms, p99 {spread(runs, 'acked_p99_ms')} ms.")
    return "\n".join(lines)


def plot(saved: dict[str, Any]) -> None:
    from benchmarks.plotstyle import axis_labels, pyplot, save

    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6))
    configs = [(v, c) for v in VARIANTS for c in dict.fromkeys(r["core"] for r in saved["rows"])
               if runs_of(saved["rows"], v, c, 20)]
    names = [f"{v}\n{CORE_LABELS[c]}" for v, c in configs]
    for ax, keys in ((left, (("added_p99_ms", "added"), ("waited_p99_ms", "floor - arrival"),
                             ("scheduled_p99_ms", "floor on send stamps - send"), ("excess_p99_ms", "excess"))),
                     (right, (("slip_p99_ms", "send slip at the source"), ("read_lag_p99_ms", "read lag"),
                              ("gap_p99_ms", "frame gap at the gateway")))):
        width = 0.8 / len(keys)
        for index, (key, label) in enumerate(keys):
            runs = [runs_of(saved["rows"], v, c, 20) for v, c in configs]
            medians = [median_of(r, key) for r in runs]
            low = [m - min(x[key] for x in r) for m, r in zip(medians, runs, strict=True)]
            high = [max(x[key] for x in r) - m for m, r in zip(medians, runs, strict=True)]
            xs = [x + (index - (len(keys) - 1) / 2) * width for x in range(len(configs))]
            ax.bar(xs, medians, width, yerr=[low, high], capsize=3, label=f"p99 {label}")
        ax.set_xticks(range(len(configs)), names)
        axis_labels(ax, ("20 sources x 500 events/s (median of the runs, bars: their range)", None), ("latency", "ms"))
    left.axhline(saved["frame_ms"] + 1, color="red", linestyle="--", label="target: frame interval + 1 ms")
    left.set_title("added latency and its floor")
    right.set_title("the sources' schedule and the gateway's reads")
    left.legend()
    right.legend()
    save(fig, DOCS / "gateway-latency.png")


def warm_up_text(saved: dict[str, Any]) -> str:
    """The broker's warm-up and its JIT compiler's CPU during the measured runs (pages saved before: none)."""
    if "broker_warm_up_s" not in saved:
        return ""
    during = [r["broker_jit_s"] for r in saved["rows"] if r.get("broker_jit_s") is not None]
    return f"""

Before the first measured run the broker is warmed up: one native-core gateway carries the 20-source load for
{saved['broker_warm_up_s']:.0f} s, not measured. A fresh broker's JVM compiles its produce path meanwhile (its JIT
compiler used {saved['broker_warm_up_jit_s']:.2f} s of CPU in this warm-up); unwarmed, the first runs waited behind
its compiler threads, which run for 1-3 ms at a stretch (`perf sched timehist`). During the measured runs it used
{min(during, default=0):.2f}-{max(during, default=0):.2f} s per run."""


def method_text(saved: dict[str, Any]) -> str:
    load = saved["load_average"]
    return f"""Measured on this project's 2-core machine, shared with the broker (a JVM), the gateway, the load generator and
other work (1-minute load average {load['start'][0]:.2f} at the start of the run, {load['end'][0]:.2f} at its end).
{len({r['repeat'] for r in saved['rows']})} repeats; in each, every variant, load and core ran once, in alternating
order. Each run: a fresh `skewless gateway --core X` (time sync off, the defaults otherwise: one shard,
transactions, commit every 100 ms) on one broker, and a load generator in a process of its own (spawned; its
figures come back over a pipe) whose sources say hello, then send on a fixed schedule for {saved['seconds']:.0f} s:
a frame every {saved['frame_ms']:.0f} ms at spread-out phases, stamped with the real clock as it is sent (the load
of docs/gateway-benchmark.md's paced table; here each source's last {saved.get('send_lead_ms', 0):.0f} ms before a
frame is a blocking sleep, as the event loop's timers wake up to a millisecond late, and the load process runs
without the cyclic collector, whose passes stopped all sources at once: this page's runs before commit 3d32cad, and
that table, had neither). 20 sources x 500 events/s is issue 26's target 3; 1 source x 5,000
events/s is the control (no other source to wait for).{warm_up_text(saved)}

Three variants, all reported:

- **same host**: the load generator at normal priority. Its send schedule competes for the 2 cores with the
  gateway, the broker and everything else here: the case of sources on the gateway's own host.
- **own host**: the load generator at real-time priority (`SCHED_FIFO`, priority {saved['rt_priority']}). This models
  devices on their own hosts, whose send schedule does not depend on this host's load. The gateway and the broker
  stay at normal priority, so here the sources take their CPU before the gateway does: this variant does not give
  the gateway more of the machine.
- **gateway first**: as own host, and the gateway's main thread (its event loop: it reads the sockets, runs the
  cores and produces) at real-time priority too, one below the sources'. This models a gateway with a core of its
  own: it runs whenever it has work, ahead of the broker and the other work here (librdkafka's threads stay at
  normal priority). What it changes against own host is what waiting for a core cost the gateway's reads.

Per event, from its record in Kafka and the acks its source received:

- **added** = `release_ts_us - arrival_ts_us` (as docs/gateway-benchmark.md reports it).
- **floor**: the earliest time any correct merge could release the event given when the other sources' frames
  reached the gateway: the latest, over the other sources, of the arrival stamp of their first event stamped at or
  past the event's time (reorder/merger.py holds an event while an empty source's frontier is below it; equal
  times hold nothing back), and never before the event's own arrival (`release_floors_us`, tested by hand on 3
  sources in tests/unit/benchmarks/test_latency_floor.py). Events of a run's last frames, which some other source
  never reached (a heartbeat or a departure released them), have no floor and are left out ("tail").
- **floor - arrival**: the wait no merge could avoid with these arrivals. **excess** = release - floor: what the
  gateway added by the records' stamps.
- **floor on send stamps - send**: the same floor on the sources' send stamps instead of the arrival stamps: what
  the sources' schedule alone forces (instant transport and reads). **read lag** = arrival - send stamp of the
  event's own frame: loopback plus how late the gateway read it (and, same host, any preemption of the source
  between its stamp and its write).
- **send slip**: how late each frame left against its schedule, measured in the load generator. **frame gap**:
  the gap between the arrival stamps of a source's consecutive frames.
- **gateway main thread on / waiting for a CPU**: the share of the run's wall time the gateway's main thread (its
  event loop, which reads the sockets) ran, and the share it was runnable but waited for a core
  (`/proc/<pid>/schedstat`). **sources' CPU**: the load generator's CPU time over its wall time.
- **ack - floor**: the gateway acks an event once it released it and committed it to Kafka, so the ack comes after
  the floor in every correct run; the benchmark fails on an ack before it (a release before the merge's promise).
  This is the gateway's whole share with the transaction's commit (every 100 ms) in it.

`release_ts_us` is the arrival stamp of the frame whose handling released the event, not a clock reading at the
release: the time a frame waits between its read and its handling is in no record's stamps. Frames of different
connections can be handled in another order than they were read, and then an event's release stamp lies before
its floor without any release before the promise (the ack shows it was not). "stamps below the floor" counts
those events; each one's distance below the floor is a lower bound on how long a frame waited to be handled.
"""


def gateway_first(rows: list[dict[str, Any]], per_core: Callable[[str, str], str],
                  med: Callable[[str, str], float]) -> str:
    """The findings' bullet on the variant whose gateway runs first, when the run had it."""
    if not any(r["variant"] == "gateway first" for r in rows):
        return ("  Which of the two sets the tail of the reads is not separated here, and whether a gateway on a host "
                "of its own reads within a millisecond is not measured here.\n")
    first, own = "gateway first", "own host"
    return f"""- **Gateway first (its event loop at real-time priority).** Its main thread waited for a core
  {med(first, 'gateway_runqueue_share'):.2f} of the wall time (own host: {med(own, 'gateway_runqueue_share'):.2f}) and
  ran {med(first, 'gateway_cpu_share'):.2f} of it. Read lag p99 {per_core(first, 'read_lag_p99_ms')} (own host:
  {per_core(own, 'read_lag_p99_ms')}); frame gaps at the gateway p99 {per_core(first, 'gap_p99_ms')}; added p99
  {per_core(first, 'added_p99_ms')} against the target of {FRAME_EVERY_S * 1e3 + 1:.0f} ms.
"""


def findings(saved: dict[str, Any]) -> str:
    """What the run says, from its own figures (medians over the runs at 20 sources)."""
    rows = [r for r in saved["rows"] if r["sources"] == 20]
    target_ms = saved["frame_ms"] + 1
    cores = list(dict.fromkeys(r["core"] for r in rows))

    def med(variant: str, key: str, core: str | None = None) -> float:
        return median_of([r for r in rows if r["variant"] == variant and core in (None, r["core"])], key)

    def per_core(variant: str, key: str, digits: int = 1) -> str:
        return ", ".join(f"{CORE_LABELS[c]} {med(variant, key, c):.{digits}f} ms" for c in cores)
    own, same = "own host", "same host"
    kept = med(own, "scheduled_p99_ms") <= target_ms
    inversions = [r for r in rows if r["stamp_inversions"]]
    lone = [r for r in saved["rows"] if r["sources"] == 1]
    return f"""## What the run says

Medians over the runs at 20 sources; the sources' own figures over both cores' runs.

- **Own host (the sources keep time).** Send slip p99 {med(own, 'slip_p99_ms'):.2f} ms; on the send stamps the floor's
  p99 is {med(own, 'scheduled_p99_ms'):.2f} ms, {'within' if kept else 'above'} the target of {target_ms:.0f} ms: \
{'a merge that read every frame as it was sent would meet it' if kept else 'the schedule alone misses it'}. The added
  p99 ({per_core(own, 'added_p99_ms')}) is set by frames the gateway read late: read lag p99
  {per_core(own, 'read_lag_p99_ms')}; frame gaps at the gateway p99 {per_core(own, 'gap_p99_ms')}. An event waits for
  the last of the other 19 sources' frames to be read, so its p99 follows the tail of their reads.
- **Same host.** Send slip p99 {med(same, 'slip_p99_ms'):.2f} ms, floor on send stamps p99
  {med(same, 'scheduled_p99_ms'):.2f} ms: here the sources' schedule itself \
{'slips past the target' if med(same, 'scheduled_p99_ms') > target_ms else 'stays within the target'}, and the
  gateway's late reads come on top: added p99 {per_core(same, 'added_p99_ms')}; read lag p99 {per_core(same, 'read_lag_p99_ms')}.
- **Why the reads are late.** The gateway's main thread (its event loop reads the sockets) was busy on a CPU
  {med(own, 'gateway_cpu_share'):.2f} (own host) and {med(same, 'gateway_cpu_share'):.2f} (same host) of the wall
  time, and runnable but waiting for a core {med(own, 'gateway_runqueue_share'):.2f} and
  {med(same, 'gateway_runqueue_share'):.2f} of it (the 2 cores taken by the broker, the sources and other work here).
{gateway_first(rows, per_core, med)}- **The merge itself.** By the records' stamps the gateway never held an event past its floor: excess p99
  {max(r['excess_p99_ms'] for r in rows):.2f} ms and max {max(r['excess_max_ms'] for r in rows):.2f} ms over all
  runs (a release comes with the first frame that allows it). {f'''Stamps below the floor in {len(inversions)} of
  {len(rows)} runs ({', '.join(sorted({CORE_LABELS[r['core']] for r in inversions}))}; down to
  {min(r['excess_min_ms'] for r in inversions):.1f} ms): frames handled that long after they were read, later than
  frames of other connections read after them; that queueing is in no record's added latency.''' if inversions else
  'No release stamp lay below its floor.'} No ack came before its floor.
- **Control.** 1 source adds 0 (in-order events of a lone source leave with their own frame); its read lag p99
  {median_of(lone, 'read_lag_p99_ms'):.2f} ms (both cores, every variant) is one connection's.
- **Acks** (the gateway's whole share up to Kafka's commit, every 100 ms), own host: ack - floor p50
  {per_core(own, 'acked_p50_ms', 0)}; p99 {per_core(own, 'acked_p99_ms', 0)}.
"""


def write_page(saved: dict[str, Any]) -> None:
    plot(saved)
    header_20 = ("| variant | core | runs | added p50 (ms) | added p99 (ms) | p99 <= frame + 1 ms | floor - arrival p99 "
                 "(ms) | excess p99 (ms) | stamps below the floor: events (min, ms) | floor on send stamps - send p99 "
                 "(ms) | read lag p99 (ms) | send slip p99 (ms) | frame gap p99 (ms) | ack - floor p50 (ms) | "
                 "ack - floor p99 (ms) | gateway main thread on a CPU | ... waiting for a CPU | sources' CPU |\n|"
                 + "---|" * 18)
    (DOCS / "gateway-latency.md").write_text(f"""# Added latency: the sources' schedule and the gateway's share \
(benchmarks/gateway_latency.py)

{method_text(saved)}
## 20 sources x 500 events/s, a frame every {saved['frame_ms']:.0f} ms

Median over the runs, their range in brackets.

{header_20}
{summary_rows(saved, 20)}

![latency](gateway-latency.png)

## Issue 26, target 3: p99 added latency <= the frame interval + 1 ms ({saved['frame_ms'] + 1:.0f} ms)

{verdicts(saved)}

{findings(saved)}
## Control: 1 source x 5,000 events/s

{header_20}
{summary_rows(saved, 1)}

## Every run

p50 / p99 / max unless marked; all in ms except events/s and the counts.

| repeat | variant | core | sources | events/s | added | floor - arrival | excess | stamps below the floor (min) | floor on send stamps - send p50 / p99 | read lag p50 / p99 | send slip p99 | frame gap p50 / p99 | ack - floor p50 / p99 | gateway main thread on / waiting for a CPU | sources' CPU | tail | late | reconnects |
|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|
{all_rows(saved)}
""")


if __name__ == "__main__":
    main()
