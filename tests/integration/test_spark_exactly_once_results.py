"""Exactly-once results through real driver deaths (issue 27 item 4), on real Kafka and a real local Spark job.

`skewless spark window-count` runs as its own process on a fixed input; ``SKEWLESS_SINK_FAULT`` makes the driver
``os._exit`` at the worst moments of the results sink: in the middle of a batch's transaction (half of its results
in the broker's log), and after the batch's transaction committed but before Spark recorded the batch in its
checkpoint (so Spark replays it). Each time the job is restarted from the same checkpoint. The results topic read
with read_committed must then hold exactly the pure core's results over the same records, each once; read
uncommitted it shows the aborted half-batch and nothing else: the replay wrote nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import Consumer, TopicPartition

from broker.admin import ensure_topics
from broker.batch_sink import SINK_FAULT_ENV, SINK_FAULT_EXIT_CODE
from broker.launcher import BrokerState
from broker.reader import read_topic
from contract.topics import TopicNames
from spark_jobs.stateful import StreamReadProgress, run_stream_batch
from spark_jobs.window_count import JOB_NAME, WindowCountCore, WindowCountOptions
from tests.integration.spark_job_support import BASE_US, event_record, punctuation_record

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(600)]

STREAM = "s"
MS = 1_000
# (topic kind, ("e", ref ms) | ("p", watermark ms)). Part 1 releases six windows in batch 0; part 2 (batch 1) adds a
# late event for the released [12 s, 13 s): a revision under the same key.
PART_1 = [("events", x) for x in [("e", 10_100), ("e", 10_500), ("e", 11_200), ("e", 11_700), ("e", 12_300),
                                  ("e", 13_400), ("e", 14_000), ("e", 15_500), ("p", 16_000)]]
PART_2 = [("events", ("e", 16_200)), ("events", ("e", 17_900)), ("events", ("p", 19_000)),
          ("late", ("e", 12_500))]
# A short-lived JVM on 2 shared cores: the C1 compiler alone and one GC thread start it for far less CPU.
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


def contract_records(part: list[tuple[str, tuple[str, int]]], first_seq: int) -> list[tuple[str, dict[str, Any]]]:
    """(topic kind, record) in the order written."""
    out: list[tuple[str, dict[str, Any]]] = []
    for seq, (kind, (what, ms)) in enumerate(part, start=first_seq):
        if what == "p":
            out.append((kind, punctuation_record(STREAM, BASE_US + ms * MS)))
            continue
        record = event_record(STREAM, "src", seq, BASE_US + ms * MS, 0, {"value": 1})
        if kind == "late":
            record.update(late=True, late_reason="source_timeout")
        out.append((kind, record))
    return out


def write(bootstrap: str, topics: TopicNames, records: list[tuple[str, dict[str, Any]]]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for kind, record in records:
        topic = topics.events(STREAM) if kind == "events" else topics.late(STREAM)
        key = b"__punctuation__" if record["kind"] == "punctuation" else b"src"
        producer.produce(topic, key=key, value=orjson.dumps(record), partition=0)
    assert producer.flush(30) == 0


def core_results(parts: list[list[tuple[str, dict[str, Any]]]], topics: TopicNames) -> list[tuple[bytes, bytes]]:
    """The pure core's records over the same records, one micro-batch per part, as the job's sink encodes them."""
    core = WindowCountCore(STREAM, WindowCountOptions(bootstrap_servers=""), None)
    progress = StreamReadProgress(1, topics.events(STREAM))
    offsets = {"events": 0, "late": 0}
    out: list[tuple[bytes, bytes]] = []
    for part in parts:
        rows = []
        for kind, record in part:
            topic = topics.events(STREAM) if kind == "events" else topics.late(STREAM)
            rows.append({**record, "topic": topic, "partition": 0, "offset": offsets[kind]})
            offsets[kind] += 1
        outputs = run_stream_batch(progress, core, rows, job=JOB_NAME, stream=STREAM)
        out += [(key.encode(), orjson.dumps(value)) for key, value in outputs]
    return out


def read_uncommitted(bootstrap: str, topic: str) -> list[tuple[bytes, bytes]]:
    """Every data record of partition 0, aborted and open transactions included (markers are never returned)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-uncommitted",
                         "isolation.level": "read_uncommitted", "enable.auto.commit": False})
    try:
        partition = TopicPartition(topic, 0, 0)
        end = consumer.get_watermark_offsets(partition, timeout=30)[1]
        consumer.assign([partition])
        records: list[tuple[bytes, bytes]] = []
        deadline = time.monotonic() + 30
        while consumer.position([TopicPartition(topic, 0)])[0].offset < end:
            assert time.monotonic() < deadline, f"{topic}: stuck before offset {end}"
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                records.append((message.key() or b"", message.value() or b""))
        return records
    finally:
        consumer.close()


def run_job(bootstrap: str, prefix: str, checkpoint: Path, fault: str | None) -> subprocess.CompletedProcess[str]:
    """The job's driver in its own process group, run to its end (or its death); returns once the driver's JVM,
    which exits when its Python parent is gone, is gone too: a restart must not share the checkpoint with it."""
    env = {**os.environ, "JAVA_TOOL_OPTIONS": QUICK_JVM}
    env.pop(SINK_FAULT_ENV, None)
    if fault is not None:
        env[SINK_FAULT_ENV] = fault
    process = subprocess.Popen(
        [str(Path(sys.executable).parent / "skewless"), "spark", "window-count", "--bootstrap", bootstrap,
         "--prefix", prefix, "--stream", STREAM, "--checkpoint", str(checkpoint), "--available-now"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        start_new_session=True)
    try:
        stdout, stderr = process.communicate(timeout=240)
    finally:
        wait_for_group_exit(process.pid)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def wait_for_group_exit(group: int, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while members := live_group_members(group):
        if time.monotonic() > deadline:
            for pid in members:  # only processes of the group this test started
                os.kill(pid, 9)
            raise AssertionError(f"the driver's processes {members} outlived it by {timeout_s} s")
        time.sleep(0.2)


def live_group_members(group: int) -> list[int]:
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state not in ("Z", "X"):
            members.append(int(stat.parent.name))
    return members


def recorded_batches(checkpoint: Path, log: str) -> list[int]:
    return sorted(int(p.name) for p in (checkpoint / log).iterdir() if p.name.isdigit())


def test_results_are_exactly_once_through_driver_deaths_mid_transaction_and_after_commit(
        kafka: BrokerState, topic_prefix: str, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    topics = TopicNames(topic_prefix)
    results_topic = topics.results(JOB_NAME)
    ensure_topics(bootstrap, [topics.events(STREAM), topics.late(STREAM)])
    checkpoint = tmp_path / "ckpt"
    part_1, part_2 = contract_records(PART_1, 0), contract_records(PART_2, 100)
    expected_0 = core_results([part_1], topics)
    expected = core_results([part_1, part_2], topics)
    assert len(expected_0) == 6 and len(expected) > len(expected_0)
    write(bootstrap, topics, part_1)
    started = time.monotonic()

    # 1. Death with batch 0's transaction open, three of its six results in the log.
    died = run_job(bootstrap, topic_prefix, checkpoint, "mid_transaction@0")
    assert died.returncode == SINK_FAULT_EXIT_CODE, died.stderr
    assert (recorded_batches(checkpoint, "offsets"), recorded_batches(checkpoint, "commits")) == ([0], [])
    assert read_uncommitted(bootstrap, results_topic) == expected_0[:3]

    # 2. Restarted: Spark replays batch 0, the sink fences the dead driver (its transaction aborts) and commits
    # the batch; death before Spark records it.
    died = run_job(bootstrap, topic_prefix, checkpoint, "committed@0")
    assert died.returncode == SINK_FAULT_EXIT_CODE, died.stderr
    assert recorded_batches(checkpoint, "commits") == []
    assert read_topic(bootstrap, results_topic) == expected_0
    assert read_uncommitted(bootstrap, results_topic) == expected_0[:3] + expected_0

    # 3. Restarted with more data: batch 0 replayed again and skipped, batch 1 written; console mode prints both.
    write(bootstrap, topics, part_2)
    done = run_job(bootstrap, topic_prefix, checkpoint, None)
    elapsed_s = time.monotonic() - started
    print(f"three driver runs in {elapsed_s:.0f} s")
    assert done.returncode == 0, done.stderr
    assert recorded_batches(checkpoint, "commits") == [0, 1]
    assert f"[{JOB_NAME} batch 0] a replay of a committed batch: its 6 results are on {results_topic}" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith(f"[{JOB_NAME} batch 1] ")] == [
        f"[{JOB_NAME} batch 1] {value.decode()}" for _key, value in expected[6:]]

    committed = read_topic(bootstrap, results_topic)
    assert committed == expected  # every result once, in the core's order, keys and values byte for byte
    assert read_uncommitted(bootstrap, results_topic) == expected_0[:3] + expected  # the replay wrote nothing
    # The late event revised [12 s, 13 s) under the window's own key: a compacted topic keeps count 2.
    final = {key: orjson.loads(value) for key, value in committed}
    revised = final[f"{STREAM}|{BASE_US + 12_000_000}".encode()]
    assert (revised["count"], revised["revision"]) == (2, 1)
