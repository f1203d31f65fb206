"""The paced runs of benchmarks/gateway_throughput.py again and again (1 and 20 sources, python and native cores, one
broker, one run at a time), instrumented to tell an event lost from a short read: per run, the (source, seq) pairs
sent and not on the events topic at the first plain (not settled) read, whether a re-read finds them, the late
topic, the read_committed and read_uncommitted ends before the read, the missing events in a read_uncommitted read
(aborted or open transactions), the gateway's /metrics counters before its SIGTERM, its stderr and its last stdout
line. ``--stall FRAME=SECONDS``: one source instead, frozen between stamping that frame and writing it (a GC pause
of the load generator). Rows go to OUT/results.jsonl, stderr files beside it.

    python -m benchmarks.paced_loss_driver --runs 32 --out /tmp/paced-runs
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import IO, Any

import orjson
from confluent_kafka import Consumer, TopicPartition

from benchmarks.gateway_throughput import Connection, one_run, paced_load, plain_producer, read_some, say_hello
from broker.launcher import KafkaBroker
from broker.reader import read_topic
from contract.records import EVENT
from contract.wire.frames import encode_frame
from contract.wire.messages import Ack, build_event, build_events, build_heartbeat, parse_gateway_message
from gateway.launch import spawn_gateway


def watermarks(bootstrap: str, topic: str) -> dict[str, int]:
    """High watermark (read_uncommitted) and last stable offset (read_committed) of partition 0, now."""
    out = {}
    for level in ("read_uncommitted", "read_committed"):
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"wm-{time.time_ns()}",
                             "isolation.level": level, "enable.auto.commit": False})
        try:
            out[level] = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)[1]
        finally:
            consumer.close()
    return out


def read_uncommitted(bootstrap: str, topic: str) -> list[tuple[int, dict[str, Any]]]:
    """(offset, record) of every data record of partition 0, aborted and open transactions included."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"unc-{time.time_ns()}",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        partition = TopicPartition(topic, 0, 0)
        end = consumer.get_watermark_offsets(partition, timeout=30)[1]
        consumer.assign([partition])
        records = []
        deadline = time.monotonic() + 60
        while consumer.position([TopicPartition(topic, 0)])[0].offset < end and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None or message.error():
                continue
            offset, value = message.offset(), message.value()
            assert offset is not None and value is not None
            records.append((offset, orjson.loads(value)))
        return records
    finally:
        consumer.close()


def scrape(port: int | None) -> dict[str, float]:
    if port is None:
        return {}
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    wanted = ("late", "given", "duplicate", "refused", "fail", "committed", "published", "acked", "pause")
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if any(w in name for w in wanted):
            out[name] = float(value)
    return out


Key = tuple[str, int]


def event_keys(bootstrap: str, topic: str) -> list[Key]:
    return [(r["source_id"], r["seq"]) for r in (orjson.loads(v) for _k, v in read_topic(bootstrap, topic, 120))
            if r.get("kind") == EVENT]


async def stalling_source(connection: Connection, rate: float, seconds: float, frame_every_s: float,
                          stalls: dict[int, float], heard: list[Any]) -> int:
    """paced_source (source 0), frozen ``stalls[k]`` seconds between stamping frame k and writing it (a GC pause
    of the load generator: the whole process stops, its stamps grow old). ``heard``: what the gateway sent other
    than acks, and its first acks, with the seqs of the first frames sent."""
    reader, writer, decoder = connection
    seq = 0
    loop = asyncio.get_running_loop()
    start = loop.time()
    frame = 0
    while loop.time() - start < seconds:
        due = min(int(rate * (loop.time() - start)) + 1, seq + 2000)
        if due > seq:
            now_us = time.time_ns() // 1000
            batch = [build_event("bench", q, now_us, {"v": q & 255}) for q in range(seq, due)]
            if frame < 3:
                heard.append(("sent", frame, seq, due - 1, now_us))
            seq = due
            time.sleep(stalls.get(frame, 0.0))  # noqa: ASYNC251 - the freeze is the point
            writer.write(encode_frame(build_events(batch)))
        frame += 1
        await asyncio.sleep(max(0.0, start + frame * frame_every_s - loop.time()))
    writer.write(encode_frame(build_heartbeat(time.time_ns() // 1000, {"bench": seq})))
    want = Ack("bench", seq - 1)
    acks = 0
    async with asyncio.timeout(60):
        while True:
            messages = [parse_gateway_message(raw) for raw in decoder.feed(await read_some(reader, 0))]
            for message in messages:
                if not isinstance(message, Ack) or acks < 3:
                    heard.append(repr(message))
                acks += isinstance(message, Ack)
            if want in messages:
                break
    writer.close()
    return seq


async def counted_load(port: int, sources: int, rate: float, stalls: dict[int, float],
                       heard: list[Any]) -> list[int]:
    """Per source, how many events it sent (seqs 0 to that less one); one source: what it heard (stalling_source)."""
    if sources > 1:
        return (await paced_load(port, sources, rate, 5.0, 0.005))[0]
    return [await stalling_source(await say_hello(port, 0), rate, 5.0, 0.005, stalls, heard)]


def freeze_later(pid: int, after_s: float, for_s: float) -> threading.Thread:
    """SIGSTOP ``pid`` ``after_s`` from now, SIGCONT ``for_s`` later: a process starved of CPU, for no CPU."""
    def freeze() -> None:
        time.sleep(after_s)
        os.kill(pid, signal.SIGSTOP)
        time.sleep(for_s)
        os.kill(pid, signal.SIGCONT)
    thread = threading.Thread(target=freeze, daemon=True)
    thread.start()
    return thread


def one(bootstrap: str, sources: int, rate: float, core: str, out: Path, run: int,
        stalls: dict[int, float], freezes: list[tuple[int | None, float, float]] = []) -> dict[str, Any]:  # noqa: B006
    prefix = f"paced{sources}x{time.time_ns()}"
    args = ["--port", "0", "--no-timesync", "--bootstrap", bootstrap, "--prefix", prefix, "--core", core]
    stderr_path = out / f"{run:03d}-{prefix}.stderr"
    with stderr_path.open("wb") as stderr:
        process, addresses = spawn_gateway(args, stderr=stderr)
        try:
            time.sleep(0.5)
            heard: list[Any] = []
            for pid, after_s, for_s in freezes:
                freeze_later(process.pid if pid is None else pid, after_s, for_s)
            counts = asyncio.run(counted_load(addresses.port, sources, rate, stalls, heard))
            metrics = scrape(addresses.metrics_port)
        finally:
            process.terminate()
            stdout, _ = process.communicate(timeout=30)
    topic = f"{prefix}.events.bench"
    marks = watermarks(bootstrap, topic)
    first = event_keys(bootstrap, topic)
    sent = {(f"src-{s}", q) for s, count in enumerate(counts) for q in range(count)}
    expected = len(sent)
    result: dict[str, Any] = {"run": run, "sources": sources, "core": core, "events": expected,
                              "first_read": len(set(first) & sent), "duplicates": len(first) - len(set(first)),
                              "watermarks_before_first_read": marks,
                              "metrics": metrics, "stopped": stdout.decode(errors="replace")[-2000:],
                              "heard": heard}
    late = [orjson.loads(v) for _k, v in read_topic(bootstrap, f"{prefix}.late.bench", 30)]
    result["late"] = [{k: r.get(k) for k in ("source_id", "seq", "late_reason", "source_ts_us", "arrival_ts_us")}
                      for r in late][:50]
    result["late_count"] = len(late)
    if not sent <= set(first):
        result["missing_first"] = sorted(sent - set(first))[:50]
        for _attempt in range(10):
            time.sleep(1.0)
            again = event_keys(bootstrap, topic)
            result.setdefault("rereads", []).append(len(set(again) & sent))
            if sent <= set(again):
                break
        result["watermarks_after"] = watermarks(bootstrap, topic)
        missing = set(result["missing_first"])
        result["uncommitted_hits"] = [(o, r) for o, r in read_uncommitted(bootstrap, topic)
                                      if r.get("kind") == EVENT and (r["source_id"], r["seq"]) in missing]
    return result


def warm_up(bootstrap: str, events: int) -> None:
    """What benchmarks/gateway_throughput.py's main runs on the broker before its paced runs (--sources 1 20): the
    saturated runs per core, the no-transactions run, the plain producers."""
    runs = []
    for index, sources in enumerate((1, 20)):
        for core in ("python", "native") if index % 2 == 0 else ("native", "python"):
            runs.append(one_run(bootstrap, sources, events, core=core))
    one_run(bootstrap, 20, events, transactions=False, core="native")
    source_run = runs[3]  # 20 sources, the first core (python)
    replay = [source_run.records[i % len(source_run.records)] for i in range(source_run.events)]
    for headers in (False, True):
        plain_producer(bootstrap, replay, headers)


def write_row(results: IO[bytes], row: dict[str, Any]) -> None:
    results.write(orjson.dumps(row) + b"\n")
    results.flush()
    short = row["events"] - row["first_read"]
    print(f"run {row['run']} {row['sources']} src {row['core']}: {row['first_read']}/{row['events']} short {short} "
          f"dups {row['duplicates']} late {row['late_count']} rereads {row.get('rereads')} "
          f"wm {row['watermarks_before_first_read']}", flush=True)


def rounds_with_warm_up(out: Path, rounds: int, events: int) -> None:
    """Per round, a fresh broker, the warm-up, then the paced runs in the benchmark's order."""
    plan = [(1, 5000.0, "python"), (1, 5000.0, "native"), (20, 500.0, "native"), (20, 500.0, "python")]
    run = 0
    with (out / "results.jsonl").open("ab") as results:
        for _round in range(rounds):
            with tempfile.TemporaryDirectory() as tmp:
                broker = KafkaBroker(Path(tmp) / "kafka")
                state = broker.start()
                try:
                    warm_up(state.bootstrap_servers, events)
                    for sources, rate, core in plan:
                        write_row(results, one(state.bootstrap_servers, sources, rate, core, out, run, {}))
                        run += 1
                finally:
                    broker.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--out", type=Path, default=Path("/tmp/paced-runs"))
    parser.add_argument("--stall", nargs="*", default=[], help="FRAME=SECONDS: freeze the (single) source there")
    parser.add_argument("--freeze", nargs="*", default=[], help="WHO:AFTER:FOR (WHO gateway or broker): SIGSTOP it "
                        "AFTER seconds after the paced load starts, for FOR seconds")
    parser.add_argument("--warm-up", type=int, default=0, help="EVENTS: --runs rounds, each on a fresh broker: the "
                        "benchmark's saturated runs and plain producers at EVENTS, then its 4 paced runs")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.warm_up:
        rounds_with_warm_up(args.out, args.runs, args.warm_up)
        return
    plan = list(itertools.product(((1, 5000.0), (20, 500.0)), ("python", "native")))
    with tempfile.TemporaryDirectory() as tmp:
        broker = KafkaBroker(Path(tmp) / "kafka")
        state = broker.start()
        try:
            with (args.out / "results.jsonl").open("ab") as results:
                for run in range(args.runs):
                    (sources, rate), core = plan[run % len(plan)]
                    stalls = {int(k): float(v) for k, v in (x.split("=") for x in args.stall)}
                    if stalls or args.freeze:
                        sources, rate, core = 1, 5000.0, "python" if run % 2 == 0 else "native"
                    freezes = [(None if who == "gateway" else state.pid, float(after), float(length))
                               for who, after, length in (x.split(":") for x in args.freeze)]
                    write_row(results, one(state.bootstrap_servers, sources, rate, core, args.out, run, stalls,
                                           freezes))
        finally:
            broker.stop()


if __name__ == "__main__":
    main()
