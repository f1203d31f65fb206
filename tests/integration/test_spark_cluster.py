"""The jobs on a real Spark standalone cluster (issue 13 item 7): three_window and sequence, submitted with
spark-submit and the `.py` entry point to a master and 2 workers started from pyspark's own launch script, produce
exactly the records the same jobs produce in local mode on the same topics, which are exactly what the pure cores
produce from those records.

The input is one stream on a 2-partition events topic (and a 2-partition late topic) whose partitions punctuate
independently: partition 0 promises 20 s, partition 1 only 4.3 s, so the stream's promise is the minimum, 4.3 s.
A job that took any one partition's promise (or the maximum) would release the [4 s, 5 s) windows and more.

Both runs write the same results topic, one after the other (the jobs read `<prefix>.events.<stream>` and write
`<prefix>.results.<job>`, so a second prefix would mean other input topics): the cluster run's records are what the
topic holds beyond the local run's, and the topic must hold every local record exactly twice. No result field is
run-specific (no wall-clock time, no host, no Spark id), so records are compared whole: key and value; but for the
sequence job's `emitted_at`, since the cluster runs it in 4 key groups (issue 27 item 1) and local mode in one.
That the cluster ran 4 groups is read from its checkpoint with Spark's state data source: one state row per
(stream, key group), each holding the stream's whole promise.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from confluent_kafka import KafkaError, Message, Producer

from broker.admin import ensure_topics
from broker.jars import ensure_spark_jars
from broker.reader import read_topic
from cep.sase import EngineConfig, parse_query
from contract.records import EventRecord, PunctuationRecord
from contract.topics import TopicNames
from spark_jobs import sequence as sequence_job
from spark_jobs import three_window
from spark_jobs.package import write_pyfiles_zip
from spark_jobs.session import connector_jars
from spark_jobs.stateful import INPUT_COLUMNS, StreamReadProgress, run_stream_batch
from tests.integration.spark_cluster import LOOPBACK, SparkCluster, pyspark_home, standalone_cluster
from tests.integration.spark_job_support import BASE_US

# ~2.5 min on this 2-core machine when shared (load 9-10; broker, cluster start and 6 JVMs of the two submitted
# apps): more than the suite's 300 s default would allow at a higher load; every wait inside is bounded itself
# (cluster start 90 s, each spark-submit 240 s).
pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.timeout(480)]

MS = 1_000
STREAM = "s"
CLUSTER_KEY_GROUPS = 4
SUBMIT_TIMEOUT_S = 240.0
QUICK_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUERY = "EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id AND c.id = e.id WITHIN 10 s"
# Per partition, in offset order: ("e", ref ms, id, type, value, uncertainty ms) or ("p", promise ms).
# id 1: SHELF (p0) -> EXIT (p1): a match. id 7: SHELF (p1) -> EXIT (p0): a match. id 2: its CHECKOUT (p1) lies
# between SHELF and EXIT (p0): none. id 3: SHELF and CHECKOUT on p1, EXIT on p0: none. ids 4, 5: no EXIT.
EVENTS_PARTITIONS: dict[int, list[tuple[Any, ...]]] = {
    0: [("e", 1_000, 1, "SHELF", 5, 0), ("e", 1_500, 2, "SHELF", 1, 20), ("e", 2_500, 2, "EXIT", 3, 0),
        ("e", 2_600, 7, "EXIT", 4, 0), ("e", 4_000, 3, "EXIT", 2, 10), ("p", 5_000), ("e", 5_200, 4, "SHELF", 7, 0),
        ("p", 20_000)],
    1: [("e", 1_800, 2, "CHECKOUT", 4, 0), ("e", 2_000, 1, "EXIT", 6, 30), ("e", 2_200, 7, "SHELF", 2, 0),
        ("e", 3_000, 3, "SHELF", 8, 0), ("p", 3_200), ("e", 3_500, 3, "CHECKOUT", 9, 0), ("e", 4_100, 5, "SHELF", 1, 0),
        ("p", 4_300)],
}
# A late event (the gateway gave up waiting for it): it belongs to [1 s, 2 s), not released yet when it is read.
LATE_PARTITIONS: dict[int, list[tuple[Any, ...]]] = {0: [("e", 1_200, 6, "SHELF", 10, 0)]}


def write_input(bootstrap: str, prefix: str) -> list[dict[str, Any]]:
    """Produce the records; returns them as the rows Spark hands the cores (contract columns plus topic, partition
    and offset, read from the delivery reports)."""
    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.events(STREAM), topics.late(STREAM)], partitions=2)
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    rows: list[dict[str, Any]] = []
    seq = 0

    def delivered(record: dict[str, Any]) -> Any:
        def report(error: KafkaError | None, message: Message) -> None:
            assert error is None, error
            rows.append({**record, "topic": message.topic(), "partition": message.partition(),
                         "offset": message.offset()})
        return report

    for topic, partitions, late in ((topics.events(STREAM), EVENTS_PARTITIONS, False),
                                    (topics.late(STREAM), LATE_PARTITIONS, True)):
        for partition, items in partitions.items():
            for item in items:
                if item[0] == "p":
                    punctuation = PunctuationRecord(STREAM, BASE_US + item[1] * MS, BASE_US + item[1] * MS)
                    producer.produce(topic, key=b"__punctuation__", value=punctuation.to_json(), partition=partition,
                                     on_delivery=delivered(orjson.loads(punctuation.to_json())))
                    continue
                _e, ref_ms, item_id, event_type, value, uncertainty_ms = item
                ref_us = BASE_US + ref_ms * MS
                event = EventRecord(STREAM, f"reader-{partition}", seq, ref_us, ref_us, uncertainty_ms * MS,
                                    ref_us, ref_us, late=late, late_reason="source_timeout" if late else None,
                                    payload={"id": item_id, "type": event_type, "value": value}, rtt_us=2_000)
                producer.produce(topic, key=event.key, value=event.to_json(), partition=partition,
                                 on_delivery=delivered(orjson.loads(event.to_json())))
                seq += 1
    assert producer.flush(30) == 0
    return rows


def spark_row(record: dict[str, Any]) -> dict[str, Any]:
    """A record as the Kafka source and from_json give it to the cores: every contract column (None if absent),
    the payload as JSON text."""
    row = {name: record.get(name) for name in INPUT_COLUMNS}
    if record.get("payload") is not None:
        row["payload"] = orjson.dumps(record["payload"]).decode()
    return row


def pure_results(prefix: str, job: str, rows: list[dict[str, Any]], core: Any) -> list[tuple[str, bytes]]:
    """The core alone on the same records, as one micro-batch with the stream's 2-partition promise (an
    available-now run reads them in one: far below its 200,000 records per micro-batch)."""
    progress = StreamReadProgress(2, TopicNames(prefix).events(STREAM))
    return [(key, orjson.dumps(value)) for key, value in run_stream_batch(progress, core, rows, job=job,
                                                                          stream=STREAM)]


def results(bootstrap: str, prefix: str, job: str) -> list[tuple[str, bytes]]:
    # Re-serialised: the job's sink and orjson agree on values, not necessarily on bytes.
    return [(key.decode() if key else "", orjson.dumps(orjson.loads(value)))
            for key, value in read_topic(bootstrap, TopicNames(prefix).results(job))]


@dataclass
class Submitted:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    started_s: float

    def wait(self, cluster: SparkCluster) -> float:
        """Wait for spark-submit to exit (it must succeed); returns how long it ran (s)."""
        try:
            returncode = self.process.wait(timeout=SUBMIT_TIMEOUT_S)
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        assert returncode == 0, f"spark-submit {self.name} failed:\n{self.log.read_text()[-6000:]}\n{cluster.logs()}"
        return time.monotonic() - self.started_s


def submit(cluster: SparkCluster, work_dir: Path, name: str, job_args: list[str]) -> Submitted:
    """Start spark-submit of the `.py` entry point to the cluster: each app takes one executor on each worker, so
    both jobs run at once, each across the 2 workers."""
    jars = connector_jars(ensure_spark_jars(), pyspark_home() / "jars")
    pyfiles = write_pyfiles_zip(work_dir / f"{name}-pyfiles.zip")
    command = [
        str(pyspark_home() / "bin" / "spark-submit"), "--master", cluster.master_url,
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2",
        "--driver-memory", "512m", "--conf", "spark.ui.enabled=false",
        # Short-lived JVMs on 2 shared cores: the C1 compiler alone and one GC thread cost far less CPU to start.
        "--driver-java-options", QUICK_JVM, "--conf", f"spark.executor.extraJavaOptions={QUICK_JVM}",
        "--jars", ",".join(str(j) for j in jars), "--py-files", str(pyfiles),
        str(Path(__file__).resolve().parents[2] / "spark_jobs" / "submit.py"), *job_args,
    ]
    log = work_dir / f"{name}.log"
    with log.open("wb") as out:
        # The driver on loopback is the launcher's choice here (the workers are on loopback), not the job's.
        # Own session: a timed-out submit is killed with its driver JVM and Python.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   env={**_clean_env(), "SPARK_LOCAL_IP": LOOPBACK})
    return Submitted(name, process, log, time.monotonic())


def _clean_env() -> dict[str, str]:
    # Nothing of a bare run's defaults may leak into the submitted job: master and Python come from spark-submit.
    return {k: v for k, v in os.environ.items()
            if k not in ("SKEWLESS_SPARK_MASTER", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME")}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkCluster]:
    # 2 cores a worker (this machine has 2 in all): room for one executor of each of the two jobs on each worker.
    with standalone_cluster(tmp_path_factory.mktemp("spark-cluster"), workers=2, cores=2) as started:
        yield started


def common_args(bootstrap: str, prefix: str, checkpoint: Path) -> list[str]:
    # 2 shuffle partitions as in local mode: Spark's default of 200 would run 200 stateful tasks (each with its
    # state store files) per micro-batch for one stream on 2 one-core executors.
    return ["--bootstrap", bootstrap, "--prefix", prefix, "--stream", STREAM, "--available-now",
            "--checkpoint", str(checkpoint), "--shuffle-partitions", "2"]


def without_clock(records: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [(key, orjson.dumps({k: v for k, v in orjson.loads(value).items() if k != "emitted_at"},
                               option=orjson.OPT_SORT_KEYS)) for key, value in records]


def group_states(spark: Any, checkpoint: Path) -> dict[tuple[Any, ...], StreamReadProgress]:
    """The stateful operator's rows in a checkpoint, as Spark's state data source reads them (a batch read of the
    files the executors wrote): grouping key ((stream,) or (stream, key group)) -> the group's read progress."""
    rows = spark.read.format("statestore").load(str(checkpoint)).collect()
    return {tuple(row["key"]): StreamReadProgress.from_blob(bytes(row["value"]["groupState"]["blob"]))[0]
            for row in rows}


def twice(records: list[tuple[str, bytes]]) -> Counter[tuple[str, bytes]]:
    counts = Counter(records)
    return counts + counts


def test_three_window_and_sequence_on_a_standalone_cluster_equal_local_mode_and_the_pure_cores(
        kafka: Any, spark: Any, cluster: SparkCluster, topic_prefix: str, tmp_path: Path) -> None:
    bootstrap = kafka.bootstrap_servers
    rows = [spark_row(r) for r in write_input(bootstrap, topic_prefix)]

    # Local mode (the tests' local[2] session), then the same jobs on the cluster.
    three_options = three_window.ThreeWindowOptions(
        bootstrap_servers=bootstrap, topic_prefix=topic_prefix, streams=(STREAM,), width_us=1_000_000,
        max_shift_us=50_000, checkpoint_dir=str(tmp_path / "local-three"), available_now=True, console=False)
    sequence_options = sequence_job.SequenceOptions(
        bootstrap_servers=bootstrap, query=QUERY, topic_prefix=topic_prefix, streams=(STREAM,),
        checkpoint_dir=str(tmp_path / "local-sequence"), available_now=True, console=False)
    for query in (three_window.start(spark, three_options), sequence_job.start(spark, sequence_options)):
        query.awaitTermination()
        assert query.exception() is None
    local_three = results(bootstrap, topic_prefix, "three_window")
    local_sequence = results(bootstrap, topic_prefix, "sequence")

    submitted = [
        submit(cluster, tmp_path, "three-window", [
            "three-window", *common_args(bootstrap, topic_prefix, tmp_path / "cluster-three"),
            "--width-ms", "1000", "--max-shift-ms", "50"]),
        # On the cluster in 4 key groups (issue 27 item 1): the same matches as local mode's one group.
        submit(cluster, tmp_path, "sequence", [
            "sequence", "--query", QUERY, "--key-groups", str(CLUSTER_KEY_GROUPS),
            *common_args(bootstrap, topic_prefix, tmp_path / "cluster-sequence")])]
    try:
        three_s, sequence_s = (job.wait(cluster) for job in submitted)
    finally:
        for job in submitted:
            if job.process.poll() is None:
                os.killpg(job.process.pid, signal.SIGKILL)
                job.process.wait()
    print(f"spark-submit on the cluster: three-window {three_s:.1f} s, sequence {sequence_s:.1f} s")

    # The cluster really ran them: both apps finished on the master, whose 2 workers are alive.
    state = cluster.state()
    assert sum(1 for w in state["workers"] if w["state"] == "ALIVE") == 2
    finished = {app["id"]: app["name"] for app in state["completedapps"] if app["state"] == "FINISHED"}
    assert sorted(finished.values()) == ["skewless-sequence", "skewless-three-window"]
    # Each ran executors on both workers (a worker keeps a directory per application it ran an executor for).
    assert cluster.apps_on_worker(0) == cluster.apps_on_worker(1) == set(finished)

    # The cluster's sequence job ran 4 key groups of the stream, local mode one: one state row per grouping key,
    # and every group holds the stream's whole promise, 4.3 s (the minimum over both partitions), so every group
    # got every punctuation. A run in fewer groups, or one that routed a punctuation to one group, fails here.
    promise_us = BASE_US + 4_300 * MS
    cluster_groups = group_states(spark, tmp_path / "cluster-sequence")
    assert sorted(cluster_groups) == [(STREAM, group) for group in range(CLUSTER_KEY_GROUPS)]
    assert {(p.key_groups, p.watermark_us) for p in cluster_groups.values()} == {(CLUSTER_KEY_GROUPS, promise_us)}
    local_groups = group_states(spark, tmp_path / "local-sequence")
    assert list(local_groups) == [(STREAM,)]
    assert [(p.key_groups, p.watermark_us) for p in local_groups.values()] == [(1, promise_us)]

    # Identical records from both runs...
    all_three = results(bootstrap, topic_prefix, "three_window")
    all_sequence = results(bootstrap, topic_prefix, "sequence")
    assert Counter(all_three) == twice(local_three)
    # emitted_at set aside: the engine's clock is its key group's largest timestamp, the one field a group does not
    # share with the stream (tests/integration/test_spark_key_groups.py).
    assert Counter(without_clock(all_sequence)) == twice(without_clock(local_sequence))
    # ...and exactly the pure cores' records on the same input.
    pure_three = pure_results(topic_prefix, "three_window", rows,
                              three_window.ThreeWindowCore(STREAM, three_options, 0, None))
    pure_sequence = pure_results(topic_prefix, "sequence", rows, sequence_job.SequenceStreamCore(
        STREAM, parse_query(QUERY), EngineConfig(k_slack_us=None, mode=sequence_options.mode,
                                                 allowed_lateness_us=sequence_options.allowed_lateness_us),
        sequence_options.type_field, None))
    assert Counter(local_three) == Counter(pure_three)
    assert Counter(local_sequence) == Counter(pure_sequence)

    # What those records are, by hand: windows released up to the stream's 4.3 s promise (the minimum over both
    # partitions), MIDDLE counting every event (the late one included) in its nominal window...
    windows = [orjson.loads(v) for _k, v in local_three]
    middle = {(w["nominal_start_us"] - BASE_US) // MS: w["count"] for w in windows
              if w["record"] == "window" and w["window_type"] == "MIDDLE"}
    assert middle == {1_000: 4, 2_000: 4, 3_000: 2}
    # Released when the promise passes start + 1 s + the 50 ms largest shift: [3 s, 4 s) at 4.05 s, [4 s, 5 s)
    # would need 5.05 s.
    assert {(w["nominal_start_us"] - BASE_US) // MS for w in windows} == {1_000, 2_000, 3_000}
    # ...and the two matches without a checkout between SHELF and EXIT.
    matches = [orjson.loads(v) for _k, v in local_sequence]
    assert [(m["record"], m["partition"], [e["event_type"] for e in m["events"]]) for m in matches] == [
        ("match", "1", ["SHELF", "EXIT"]), ("match", "7", ["SHELF", "EXIT"])]
