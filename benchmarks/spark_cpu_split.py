"""Where a Spark CEP job's CPU goes: the JVM (by thread, and by Java Flight Recorder samples: Kafka read, JSON,
shuffle, state store, Arrow, the Python runner) against the Python worker (by py-spy samples: Arrow to pandas,
the shell, the core, the snapshot, the output frame) and the driver (foreachBatch: the results sink).

The same pre-loaded topics as benchmarks/spark_three_window.py (N events, 2 streams, availableNow, local[2]). Each
job runs once to warm the JVM and start the Python workers, then once measured: CPU seconds per process (the JVM,
the pyspark daemon and its workers, this driver) and per JVM thread (/proc), Spark's own query progress (durations
and the state operator's metrics), a JFR recording of the JVM (``jcmd JFR.start``), and, with ``--py-spy PATH``,
py-spy's samples of the Python workers. Run:

    .venv/bin/python -m benchmarks.spark_cpu_split --events 200000 --jobs sequence --py-spy /tmp/pyspy/bin/py-spy

A job named ``JOB@rows`` (e.g. ``pattern@rows``) runs JOB with the results sink taking each micro-batch as
collected Rows, as it did before issue 27's Arrow path (benchmarks/spark_results_collect.py): the two side by side
in one run.

Prints the split as markdown (``--json F`` also writes the figures; ``--write-docs`` writes docs/spark-cpu-split.md).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import CLK_TCK, TreeCpuSampler, stat_command, stat_cpu_ticks, tree_cpu_s
from benchmarks.spark_three_window import preload, rate_of, start_job
from broker.launcher import KafkaBroker
from contract.topics import TopicNames


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """tid -> (thread name, CPU seconds) of one process."""
    out: dict[int, tuple[str, float]] = {}
    for entry in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # a thread that ended meanwhile
        out[int(entry.name)] = (stat_command(stat), stat_cpu_ticks(stat) / CLK_TCK)
    return out


def thread_kind(name: str) -> str:
    """A JVM thread's name (15 characters, /proc) as a kind: numbers dropped."""
    return re.sub(r"[-#\s]*\d+$", "", name).strip() or name


class Sampler(TreeCpuSampler):
    """CPU seconds per process and per JVM thread, sampled every 0.2 s (a Python worker that exits keeps what it
    had used at its last sample), and this driver's."""

    def __init__(self, jvm: int) -> None:
        self.start_threads = thread_cpu(jvm)
        self.threads = dict(self.start_threads)
        self._own_start = time.process_time()
        super().__init__(jvm)

    def sample(self) -> None:
        super().sample()
        self.threads.update(thread_cpu(self.root))

    def split(self) -> dict[str, Any]:
        """Stops sampling; the CPU seconds since the start by the JVM, its Python workers, this driver and per kind
        of JVM thread."""
        self.stop()
        python = sum(self.used_s(pid) for pid in self.last if pid != self.root)
        kinds: dict[str, float] = collections.defaultdict(float)
        for tid, (name, cpu) in self.threads.items():
            kinds[thread_kind(name)] += cpu - self.start_threads.get(tid, ("", 0.0))[1]
        return {"jvm_s": self.used_s(self.root), "python_s": python, "driver_s": time.process_time() - self._own_start,
                "jvm_threads_s": dict(sorted(kinds.items(), key=lambda kv: -kv[1]))}


# JFR: a sample's category is that of the first frame, from the leaf up, that matches a specific category; a stack
# no specific category matches gets the first generic one (GENERIC_JVM) that a frame matches.
JVM_CATEGORIES = (
    # Pickling happens in two places: the driver JVM's serve thread of a collect() to the driver's Python (the
    # results sink before issue 27's Arrow path), and the executor tasks of applyInPandasWithState, which hand each
    # group's state row to the worker pickled (the state blob is a byte array: PickleUtils.rawStringFromBytes).
    # jfr_split tells them apart by the sampled thread (PICKLE_TO_STATE).
    ("results to the driver's Python (collect, pickle)", r"razorvine|SerDeUtil|EvaluatePython|PythonRDD"),
    ("Kafka read (consumer, fetch, decompress)", r"^org\.apache\.kafka\.|KafkaDataConsumer|KafkaSourceRDD|"
     r"kafka010\.|^net\.jpountz|^org\.xerial|^com\.github\.luben"),
    ("from_json and JSON (Jackson)", r"^com\.fasterxml\.jackson|catalyst\.json\.|JsonToStructs|"
     r"catalyst\.expressions\.json"),
    ("Arrow (rows to Arrow batches and back)", r"^org\.apache\.arrow\.|execution\.arrow\.|ArrowWriter|"
     r"ArrowColumnVector|ArrowConverters|ArrowUtils"),
    ("Python runner (socket to the worker, batching)", r"api\.python\.|execution\.python\.|PythonRunner|"
     r"PythonWorker|ApplyInPandasWithState|FlatMapGroupsInPandasWithState"),
    ("state store (load, put, commit, checkpoint files)", r"execution\.streaming\.state\.|RocksDB|"
     r"HDFSBackedStateStore|CheckpointFileManager|^org\.apache\.hadoop\."),
    ("shuffle (write, fetch, sort, serialize)", r"^org\.apache\.spark\.shuffle\.|^org\.apache\.spark\.storage\.|"
     r"UnsafeExternalSorter|ShuffleExchange|^org\.apache\.spark\.network\.|^org\.apache\.spark\.serializer\.|"
     r"^org\.apache\.spark\.io\.|ExternalSorter"),
    ("generated code (projections, filters, sort)", r"GeneratedClass|^org\.apache\.spark\.sql\.catalyst\."),
)
GENERIC_JVM = (
    ("streaming driver (planning, offsets, progress, WAL)", r"execution\.streaming\.|^org\.apache\.spark\.sql\."),
    ("scheduler, RPC, other Spark", r"^org\.apache\.spark\."),
    ("JDK, Scala, other", r"."),
)


PICKLE_TO_STATE = "state rows to the Python worker (pickled: applyInPandasWithState's group state)"
# The threads that serve a collect() to the driver's Python (PythonRDD.serveToStream's thread names).
RESULTS_SERVE_THREAD = re.compile(r"^serve")


def categorize(frames: list[str], specific: Any, generic: Any) -> str:
    """The category of a stack given leaf first (see JVM_CATEGORIES)."""
    for tier in (specific, generic):
        for frame in frames:
            for name, pattern in tier:
                if pattern.search(frame):
                    return str(name)
    return "?"


def jvm_sample_category(frames: list[str], thread: str, specific: Any, generic: Any) -> str:
    """A JFR sample's category (frames leaf first); pickling off a collect's serve thread is the state rows'."""
    category = categorize(frames, specific, generic)
    if category == JVM_CATEGORIES[0][0] and not RESULTS_SERVE_THREAD.search(thread):
        return PICKLE_TO_STATE
    return category


def jfr_split(recording: Path) -> dict[str, Any]:
    """Execution samples of a JFR recording by category (JVM_CATEGORIES) and the top leaf methods."""
    printed = subprocess.run(["jfr", "print", "--json", "--events", "jdk.ExecutionSample", str(recording)],
                             capture_output=True, text=True, check=True).stdout
    events = json.loads(printed)["recording"]["events"]
    categories: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    compiled = [(name, re.compile(pattern)) for name, pattern in JVM_CATEGORIES]
    generic = [(name, re.compile(pattern)) for name, pattern in GENERIC_JVM]
    for event in events:
        frames = [(f["method"]["type"]["name"] + "." + f["method"]["name"]).replace("/", ".")
                  for f in event["values"]["stackTrace"]["frames"]]
        if not frames:
            continue
        leaves[frames[0]] += 1
        thread = ((event["values"].get("sampledThread") or {}).get("javaName")) or ""
        categories[jvm_sample_category(frames, thread, compiled, generic)] += 1
    total = sum(categories.values())
    return {"samples": total, "categories": dict(categories.most_common()), "top_leaves": leaves.most_common(15)}


# py-spy: as JVM_CATEGORIES, frames written "function (file:line)".
PYTHON_CATEGORIES = (
    ("gc.collect after each task (pyspark daemon.py, reused worker)", r"^manager \(daemon\.py:211\)"),
    ("task setup (importlib.invalidate_caches re-reads pyspark.zip)", r"setup_spark_files"),
    ("collector after a group (WorkerCollector: young collection, freeze)", r"after_group|before_group"),
    ("state restore (a core not kept in this worker)", r"restore|from_blob|unpackb"),
    ("snapshot (core state encoding, msgpack)", r"incremental_snapshot|snapshot \(|to_blob|packb"),
    ("record parse (orjson: the worker's columns, the payload)", r"decode_payload|record_columns|parse_record"),
    ("the core (engine / adapter per event)", r"/cep/|on_events \(|on_rows \(|_on_event"),
    ("output rows (result records, JSON, DataFrame)", r"result_value|result_key|_record \(|_side \(|dumps"),
    ("shell (columns, order, punctuations)", r"columns_of_frames|run_stream_columns|_sorted_indices|"
     r"MicroBatchColumns|column \(|make_stream_function"),
)
# The key-group routing stage (a Python stage of its own before the shuffle): every sample under it, whatever its
# innermost frame (its own record parse included).
ROUTING_STAGE = ("key-group routing stage (mapInArrow: parse, key, group)", re.compile(r"spark_jobs/key_routing\.py"))
GENERIC_PYTHON = (
    ("Arrow to pandas and back (pyspark serializers)", r"pyspark/sql/pandas/|serializers\.py|pyarrow|pandas/"),
    ("pyspark worker (socket, framing, other)", r"pyspark/|worker\.py|daemon\.py"),
    ("other", r"."),
)


def pyspy_split(raw: Path, specific: Any = PYTHON_CATEGORIES, generic: Any = GENERIC_PYTHON,
                stage: tuple[str, re.Pattern[str]] | None = ROUTING_STAGE) -> dict[str, Any]:
    """py-spy's collapsed stacks (``--format raw``) by category (PYTHON_CATEGORIES), idle samples apart."""
    compiled = [(name, re.compile(pattern)) for name, pattern in specific]
    generic_compiled = [(name, re.compile(pattern)) for name, pattern in generic]
    categories: collections.Counter[str] = collections.Counter()
    leaves: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")[::-1]  # innermost first
        in_stage = stage is not None and any(stage[1].search(frame) for frame in frames)
        categories[stage[0] if stage is not None and in_stage
                   else categorize(frames, compiled, generic_compiled)] += int(count)
        leaves[frames[0]] += int(count)
    return {"samples": sum(categories.values()), "categories": dict(categories.most_common()),
            "top_leaves": leaves.most_common(25)}


# The driver (this process) by py-spy's samples: a sample goes to the first category, innermost frame first.
DRIVER_CATEGORIES = (
    ("results sink: the batch to records (Arrow, or Rows with JOB@rows)", r"batch_records|table_records|_utf8_values|"
     r"rows_way|toArrow|_collect_as_arrow|collect \("),
    ("results sink: the Kafka transaction (produce, commit)", r"broker/batch_sink\.py|broker/transactions\.py"),
    ("this benchmark's /proc sampler", r"benchmarks/harness/processes\.py|thread_cpu|Sampler"),
)
GENERIC_DRIVER = (
    ("py4j (calls into the JVM, the callback server)", r"py4j/"),
    ("pyspark (streaming query, listener, other)", r"pyspark/"),
    ("other", r"."),
)


def spark_metrics(query: Any) -> dict[str, Any]:
    """Spark's own figures summed over the query's micro-batches: durations and the state operators'."""
    durations: collections.Counter[str] = collections.Counter()
    state: collections.Counter[str] = collections.Counter()
    for progress in query.recentProgress:
        durations.update(progress["durationMs"])
        for operator in progress.get("stateOperators", []):
            for name in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs", "numRowsUpdated"):
                state[name] += operator.get(name, 0)
            state["memoryUsedBytes (last)"] = operator.get("memoryUsedBytes", 0)
            for name, value in (operator.get("customMetrics") or {}).items():
                state[name] += value
    return {"batches": len(query.recentProgress), "durations_ms": dict(durations), "state": dict(state)}


ROWS_SINK_SUFFIX = "@rows"


@contextlib.contextmanager
def results_sink_way(job: str) -> Iterator[str]:
    """The job to start; for ``JOB@rows``, JOB with the sink's batches taken as collected Rows while it runs."""
    if not job.endswith(ROWS_SINK_SUFFIX):
        yield job
        return
    from benchmarks.spark_results_collect import rows_way
    from spark_jobs import results_sink

    arrow_way = results_sink.batch_records
    results_sink.batch_records = rows_way  # looked up by ResultsSink at each micro-batch
    try:
        yield job.removesuffix(ROWS_SINK_SUFFIX)
    finally:
        results_sink.batch_records = arrow_way


def results_end_offset(bootstrap: str, topic: str) -> int:
    """The summed end offsets of a results topic's partitions (0 before it exists)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"split-{uuid.uuid4().hex[:6]}"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions or {}
        return sum(consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions)
    finally:
        consumer.close()


def measure(spark: Any, job: str, bootstrap: str, prefix: str, py_spy: str | None, work: Path) -> dict[str, Any]:
    with results_sink_way(job) as started:
        topic = TopicNames(prefix).results(started)
        result = measure_job(spark, started, bootstrap, prefix, py_spy, work / job.replace("@", "-"))
        # The measured run only (the warm-up run wrote before measure_job's second start): its results and, for
        # the transactional sink, one commit marker per micro-batch.
        result["results_offsets"] = results_end_offset(bootstrap, topic) - result.pop("results_offset_at_start")
    return {**result, "job": job}


def measure_job(spark: Any, job: str, bootstrap: str, prefix: str, py_spy: str | None,
                files: Path) -> dict[str, Any]:
    """``files``: where the recordings go (``.jfr``, ``.pyspy.txt`` appended)."""
    jvm = spark.sparkContext._gateway.proc.pid
    checkpoint = tempfile.mkdtemp(prefix=f"split-{job}-")
    start_job(spark, job, bootstrap, prefix, checkpoint).awaitTermination()  # warm: JIT, Python workers
    shutil.rmtree(checkpoint, ignore_errors=True)
    checkpoint = tempfile.mkdtemp(prefix=f"split-{job}-")
    recording = files.with_name(f"{files.name}.jfr")
    subprocess.run(["jcmd", str(jvm), "JFR.start", f"name={job}", "settings=profile", f"filename={recording}"],
                   capture_output=True, check=True)
    spy = None
    daemons = [pid for pid, (name, _) in tree_cpu_s(jvm).items() if pid != jvm and name.startswith("python")]
    raw = files.with_name(f"{files.name}.pyspy.txt")
    if py_spy is not None and daemons:
        # The pyspark daemon (the oldest python child of the JVM) forks the workers: follow its subprocesses.
        spy = subprocess.Popen([py_spy, "record", "--pid", str(min(daemons)), "--subprocesses", "--format", "raw",
                                "--rate", "100", "--output", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    driver_raw = files.with_name(f"{files.name}.driver.pyspy.txt")
    driver_spy = None if py_spy is None else subprocess.Popen(
        [py_spy, "record", "--pid", str(os.getpid()), "--format", "raw", "--rate", "100", "--output",
         str(driver_raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if spy is not None or driver_spy is not None:
        time.sleep(1.0)
    results_offset_at_start = results_end_offset(bootstrap, TopicNames(prefix).results(job))
    sampler = Sampler(jvm)
    query = start_job(spark, job, bootstrap, prefix, checkpoint)
    query.awaitTermination()
    cpu = sampler.split()
    for recorder in (spy, driver_spy):
        if recorder is not None:
            recorder.send_signal(2)
            recorder.wait(60)
    subprocess.run(["jcmd", str(jvm), "JFR.stop", f"name={job}"], capture_output=True, check=True)
    rows, batch_s = rate_of(query)
    shutil.rmtree(checkpoint, ignore_errors=True)
    return {"job": job, "rows": rows, "batch_s": batch_s, **cpu, "results_offset_at_start": results_offset_at_start, "spark": spark_metrics(query),
            "jfr": jfr_split(recording), "pyspy": pyspy_split(raw) if raw.exists() else None,
            "driver_pyspy": pyspy_split(driver_raw, DRIVER_CATEGORIES, GENERIC_DRIVER, None)
            if driver_raw.exists() else None}


def _spy_table(title: str, part: str, spy: dict[str, Any], cpu_s: float, us: Callable[[float], str]) -> list[str]:
    """A process's CPU (``cpu_s``) shared out by its py-spy samples, one row per category."""
    lines = ["", title, "", f"| {part} | CPU us/event (est.) | share |", "|---|---:|---:|"]
    for name, count in spy["categories"].items():
        lines.append(f"| {name} | {us(cpu_s * count / spy['samples'])} | {count / spy['samples']:.0%} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    rows = result["rows"]
    total = result["jvm_s"] + result["python_s"] + result["driver_s"]

    def us(seconds: float) -> str:
        return f"{seconds * 1e6 / rows:.1f}"

    jit = sum(cpu for name, cpu in result["jvm_threads_s"].items() if name.startswith(("C1 Compiler", "C2 Compiler")))
    lines = [f"### {result['job']}: {rows:,} rows, {result['batch_s']:.1f} s of batches, {us(total)} CPU us/event",
             "", f"{us(total - jit)} CPU us/event without the JIT compiler threads (C1, C2: {us(jit)}); the "
             f"results topic grew by {result.get('results_offsets', 0):,} offsets (results, and one commit marker "
             "per micro-batch of the transactional sink).",
             "", "| where | CPU us/event | share |", "|---|---:|---:|"]
    for name, seconds in (("Spark JVM", result["jvm_s"]), ("Python workers (pyspark daemon and its workers)",
                                                           result["python_s"]), ("driver (this process)",
                                                                                 result["driver_s"])):
        lines.append(f"| {name} | {us(seconds)} | {seconds / total:.0%} |")
    jfr = result["jfr"]
    lines += ["", f"JVM by JFR execution samples ({jfr['samples']} samples), the JVM's CPU shared out by them:", "",
              "| JVM part | CPU us/event (est.) | share of JVM samples |", "|---|---:|---:|"]
    for name, count in jfr["categories"].items():
        lines.append(f"| {name} | {us(result['jvm_s'] * count / jfr['samples'])} | {count / jfr['samples']:.0%} |")
    lines += ["", "JVM threads by CPU (/proc):", "", "| thread | CPU us/event |", "|---|---:|"]
    for name, seconds in list(result["jvm_threads_s"].items())[:8]:
        lines.append(f"| {name} | {us(seconds)} |")
    if result["pyspy"]:
        spy = result["pyspy"]
        lines += _spy_table(f"Python workers by py-spy samples ({spy['samples']} samples, idle excluded), the "
                            "workers' CPU shared out by them:", "Python part", spy, result["python_s"], us)
    if result.get("driver_pyspy"):
        spy = result["driver_pyspy"]
        lines += _spy_table(f"The driver by py-spy's samples ({spy['samples']} samples, idle excluded), its CPU "
                            "shared out by them:", "driver part", spy, result["driver_s"], us)
    spark = result["spark"]
    lines += ["", f"Spark's query progress over {spark['batches']} micro-batches (ms, summed): "
              + ", ".join(f"{k} {v:,}" for k, v in sorted(spark["durations_ms"].items())),
              "state operator: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(spark["state"].items()))]
    return "\n".join(lines) + "\n"


DOCS = Path(__file__).resolve().parents[1] / "docs"


def write_docs(results: list[dict[str, Any]], events: int, started_utc: str) -> None:
    from benchmarks.spark_three_window import head_commit

    loads = ", ".join(f"{r['job']} {r['load']:.1f}" for r in results)
    text = f"""# Where a Spark job's CPU goes (generated by benchmarks/spark_cpu_split.py)

Run of {started_utc} UTC, commit {head_commit()}, {events:,} events on 2 streams (the topics of
benchmarks/spark_three_window.py), local[2], availableNow; each job ran once to warm up (JIT, Python workers), then
once measured. Command:

    .venv/bin/python -m benchmarks.spark_cpu_split --events {events} --jobs {','.join(r['job'] for r in results)} \\
        --py-spy PATH --write-docs

CPU per process and per JVM thread comes from /proc (sampled every 0.2 s). The JVM's CPU is shared out by Java
Flight Recorder's execution samples (`jcmd JFR.start settings=profile`; a sample goes to the first frame, from the
leaf up, of a known Spark layer), the Python workers' by py-spy's samples (100 Hz, idle samples excluded; a sample
goes to the first frame, innermost first, of a known phase of the shell). Samples are few (hundreds per job), so
read the split parts to within a few us/event; the process totals are measured, not estimated. The C2 and C1
compiler threads are the JIT compiling this query's generated code and the jobs' paths: a cost of a short run
that a long-running query pays once, and most of it falls on the first measured job of a run (the JVM's code is
compiled then): compare jobs by their CPU without the compiler threads. 1-minute load average at each job's start:
{loads}.

A job named `JOB@rows` is JOB with the results sink of before issue 27 (each micro-batch collected as pickled Rows,
then `str(...).encode()` per value), next to JOB with the Arrow path (`spark_jobs.results_sink.batch_records`), in
the same run. The driver's CPU is this whole process: the results sink, py4j, and this benchmark's own /proc
sampler (every JVM thread's stat five times a second), shared out by py-spy's samples of the driver. The JVM's
pickling is split by thread: the serve thread of a collect() is the results to the driver; pickling in executor
tasks is applyInPandasWithState handing each group's state row (the state blob) to its worker.

""" + "\n".join(markdown(r) for r in results)
    (DOCS / "spark-cpu-split.md").write_text(text)
    print(f"wrote {DOCS / 'spark-cpu-split.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--jobs", default="native_window,three_window,pattern,sequence,sequence_g2,iseq")
    parser.add_argument("--py-spy", help="path of py-spy (not a project dependency); without it no Python split")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--write-docs", action="store_true", help="write docs/spark-cpu-split.md")
    args = parser.parse_args()
    from spark_jobs.session import create_spark_session, stop_spark

    work = Path(tempfile.mkdtemp(prefix="split-spark-"))
    broker = KafkaBroker(work / "kafka")
    state = broker.start()
    spark = create_spark_session("bench-cpu-split")
    results = []
    started_utc = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    try:
        prefix = f"split{uuid.uuid4().hex[:6]}"
        preload(state.bootstrap_servers, prefix, args.events, ("a", "b"))
        for job in args.jobs.split(","):
            load = os.getloadavg()[0]
            result = measure(spark, job, state.bootstrap_servers, prefix, args.py_spy, work)
            result["load"] = load
            results.append(result)
            print(markdown(result) + f"\n(1-minute load average at the start: {load:.1f})\n", flush=True)
    finally:
        stop_spark(spark)
        broker.stop()
        shutil.rmtree(work / "kafka", ignore_errors=True)
        print(f"recordings kept in {work}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
    if args.write_docs:
        write_docs(results, args.events, started_utc)


if __name__ == "__main__":
    main()
