"""Per-key state against the whole-blob state for the sequence job (issue 27 item 2: "measure and choose").

Two ways to keep a key group's state in Spark, the same sequence core, shell, Kafka read and results sink around
them, side by side in one Spark session on the same pre-loaded topics:

* ``blob_hdfs``: the job as it is (``applyInPandasWithState``): one state row per group holding the whole group's
  state as one blob (the engine's incremental snapshot assembled from the kept per-key bytes), pickled to the
  Python worker and written back whole every micro-batch; Spark's default HDFS-backed state store.
* ``blob_rocksdb``: the same with the RocksDB state store provider (so the next variant's provider is not
  mistaken for its access pattern).
* ``per_key``: ``transformWithStateInPandas`` (Spark 4's state API v2; RocksDB state store, which it requires): a
  ``MapState`` with one entry per partition key of the group (the engine's encoding of that key's partition) and a
  ``ValueState`` with the group's meta (read progress, the engine-wide part, and a random token naming the
  version). A worker that still holds the group's core in memory and finds the token it wrote reads nothing else;
  otherwise it reads every entry and restores. It writes only the changed keys (``SequenceEngine.snapshot_changes``).

Workloads: ``bench`` is benchmarks/spark_three_window.py's topic (50 keys per stream, one punctuation at the end,
micro-batches of up to ``--max-offsets`` records); ``keys`` has ``--keys`` keys per stream, a punctuation every
1,000 events per partition and a match every 300 events (so the state keeps growing under the default allowed
lateness of one hour, as a long-running job's does, and a micro-batch touches a part of the keys).

CPU per event (the Spark JVM, its Python workers, this driver: /proc) of each variant's best round and every
round; ``--rounds`` rounds, the order reversed every other round. Results are compared across variants (the same
records, but for none). Needs ``protobuf`` (pyspark's state API v2 client; in the dev extra, so ``make setup``
installs it; ``--pydeps DIR`` adds another directory holding it to the workers' path). Run:

    .venv/bin/python -m benchmarks.spark_per_key_state --workload keys --events 200000 --rounds 3 --json F
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import msgpack
import orjson
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql.streaming.stateful_processor import StatefulProcessor

from benchmarks.spark_cpu_split import Sampler
from benchmarks.spark_three_window import BASE_US, SEQUENCE_QUERY, preload, rate_of
from broker.admin import ensure_topics
from broker.launcher import KafkaBroker
from contract.records import PUNCTUATION_KEY, EventRecord, PunctuationRecord
from contract.topics import TopicNames

VARIANTS = ("blob_hdfs", "blob_rocksdb", "per_key", "per_key_log")
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
PROVIDER = {"blob_hdfs": HDFS_PROVIDER, "blob_rocksdb": ROCKSDB_PROVIDER, "per_key": ROCKSDB_PROVIDER,
            "per_key_log": ROCKSDB_PROVIDER}
# The engine's parts per key and the group's meta (StreamReadProgress.to_blob of the engine-wide part).
PARTS_KEY_SCHEMA = "key binary"
PARTS_VALUE_SCHEMA = "part binary"
META_SCHEMA = "token binary, progress binary, log_bytes long"
LOG_SCHEMA = "entry binary"


def preload_keyed(bootstrap: str, prefix: str, events: int, streams: tuple[str, ...], keys: int,
                  punctuate_every: int = 1_000, match_every: int = 300) -> None:
    """``events`` records over ``streams``: key ``i % keys`` (``id``), type ``ABC[i % 3]``, 100 us apart; every
    ``match_every`` events a triple A, B, C of a fresh key (a match); a punctuation every ``punctuate_every``
    events, 1 ms behind the last event, and one past the end."""
    topics = TopicNames(prefix)
    ensure_topics(bootstrap, [topics.events(s) for s in streams])
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.size": 1_000_000,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000})

    def send(topic: str, key: bytes, value: bytes) -> None:
        while True:
            try:
                producer.produce(topic, key=key, value=value)
                return
            except BufferError:
                producer.poll(0.05)

    per_stream = events // len(streams)
    for s, stream in enumerate(streams):
        topic = topics.events(stream)
        for i in range(per_stream):
            ts = BASE_US + i * 100
            key: Any = f"m{i // match_every}" if i % match_every < 3 else i % keys
            record = EventRecord(stream=stream, source_id=f"src-{s}-{i % 10}", seq=i // 10, source_ts_us=ts,
                                 ref_ts_us=ts, uncertainty_us=500, arrival_ts_us=ts, release_ts_us=ts,
                                 payload={"value": float(i % 97), "type": "ABC"[i % 3], "id": key})
            send(topic, record.key, record.to_json())
            if i % punctuate_every == punctuate_every - 1:
                mark = PunctuationRecord(stream=stream, watermark_us=ts - 1_000, release_ts_us=ts)
                send(topic, PUNCTUATION_KEY, mark.to_json())
        end = BASE_US + per_stream * 100 + 10_000_000
        send(topic, PUNCTUATION_KEY, PunctuationRecord(stream=stream, watermark_us=end, release_ts_us=end).to_json())
    producer.flush(120)


class PerKeyProcessor(StatefulProcessor):
    """The sequence job's state function as a ``StatefulProcessor`` of ``transformWithStateInPandas``: the shell
    of spark_jobs/stateful.py (parse, order, promise, kept cores, collector) per (stream,) group, the group's
    engine kept per partition key (``store``: ``map``, one MapState entry per key, or ``log``, a ListState of
    per-batch changes) and its meta in a ValueState with a random token naming the version."""

    def __init__(self, query_text: str, partitions_of: Any, store: str) -> None:
        self.query_text = query_text
        self.partitions_of = partitions_of
        self.store = store
        self.owner = uuid.uuid4().hex

    def init(self, handle: Any) -> None:
        self.meta = handle.getValueState("meta", META_SCHEMA)
        if self.store == "map":
            self.parts = handle.getMapState("parts", PARTS_KEY_SCHEMA, PARTS_VALUE_SCHEMA)
        else:
            self.log = handle.getListState("log", LOG_SCHEMA)

    def _restored(self, stream: str, meta: Any) -> tuple[Any, Any]:
        """The group's progress and core from the store (a kept core did not serve)."""
        from cep.sase import SequenceEngine, parse_query
        from spark_jobs import sequence
        from spark_jobs.stateful import StreamReadProgress

        options = sequence.SequenceOptions("-", self.query_text)
        query, config = parse_query(self.query_text), sequence.engine_config(options)
        core = sequence.SequenceStreamCore(stream, query, config, options.type_field, None)
        if meta is None:
            return StreamReadProgress(0), core
        RESTORES[self.store] += 1
        progress, engine_doc = StreamReadProgress.from_blob(bytes(meta[1]))
        if self.store == "map":
            entries: dict[bytes, bytes] = {bytes(k[0]): bytes(v[0]) for k, v in self.parts.iterator()}
        else:
            entries = {}
            for (entry,) in self.log.get():
                for part_key, encoded in msgpack.unpackb(bytes(entry), raw=False):
                    if encoded is None:
                        entries.pop(part_key, None)
                    else:
                        entries[part_key] = encoded
        core.engine = SequenceEngine.restore_parts(query, config, engine_doc, entries.items())
        return progress, core

    def _stored(self, engine: Any, changes: dict[bytes, bytes | None], meta: Any) -> int:
        """Write the changes; returns the log's bytes since its last compaction (0 for the map store)."""
        if self.store == "map":
            for part_key, encoded in changes.items():
                if encoded is None:
                    self.parts.removeKey((part_key,))
                else:
                    self.parts.updateValue((part_key,), (encoded,))
            return 0
        entry = msgpack.packb(list(changes.items()), use_bin_type=True)
        log_bytes = (0 if meta is None else int(meta[2])) + len(entry)
        live = engine._encoded  # a prototype: the kept encodings of every partition
        if log_bytes > 2 * sum(map(len, live.values())) + 1_000_000:
            # Compaction: the log becomes one entry holding every partition (a cost of the whole state, once the
            # changes written since the last one outweigh it twice).
            entry = msgpack.packb([(msgpack.packb(k, use_bin_type=True), v) for k, v in live.items()],
                                  use_bin_type=True)
            self.log.put([(entry,)])
            return len(entry)
        self.log.appendList([(entry,)])
        return log_bytes

    def _run(self, key: Any, rows: Iterator[Any]) -> list[tuple[str, dict[str, Any]]]:
        from spark_jobs import sequence
        from spark_jobs.stateful import UNPARSED_GROUP, _group_records, columns_of_frames, run_stream_columns
        from spark_jobs.stateful import worker_live_cores as cores

        stream = str(key[0])
        parsed = ("kind", "stream", *(c for c in sequence.SEQUENCE_COLUMNS
                                      if c not in ("kind", "stream", "topic", "partition", "offset")))
        columns, rejected = _group_records(sequence.JOB_NAME, stream, 0, columns_of_frames(rows), parsed)
        if stream == UNPARSED_GROUP:
            return rejected
        meta = self.meta.get()
        live = cores().take(self.owner, stream, None if meta is None else bytes(meta[0]))
        progress, core = live if live is not None else self._restored(stream, meta)
        if progress.partitions == 0:
            with contextlib.suppress(LookupError):  # only the late topic exists yet
                progress.events_topic, progress.partitions = self.partitions_of(stream)
        outputs = rejected + run_stream_columns(progress, core, columns, job=sequence.JOB_NAME, stream=stream)
        engine = cast("sequence.SequenceStreamCore", core).engine
        engine_doc, changes = engine.snapshot_changes()
        log_bytes = self._stored(engine, changes, meta)
        token = uuid.uuid4().bytes
        self.meta.update((token, progress.to_blob(engine_doc), log_bytes))
        cores().keep(self.owner, stream, token, progress, core)
        return outputs

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[Any]:
        import pandas as pd

        from spark_jobs.stateful import worker_collector
        from spark_jobs.worker_imports import keep_spark_zip_directories_of_this_worker

        collector = worker_collector()
        collector.before_group()
        keep_spark_zip_directories_of_this_worker()
        try:
            outputs = self._run(key, rows)
        finally:
            collector.after_group()
        if outputs:
            yield pd.DataFrame({"key": [k for k, _ in outputs],
                                "value": [orjson.dumps(v).decode() for _, v in outputs]})

    def close(self) -> None:
        if RESTORES:
            # The worker's stderr lands in the Spark log: how often a kept core did not serve.
            print(f"per-key state: restores so far in this worker {dict(RESTORES)}", file=sys.stderr, flush=True)


# Per Python worker: the groups restored from the store (a kept core did not serve), by store.
RESTORES: collections.Counter[str] = collections.Counter()


def start_variant(spark: Any, variant: str, bootstrap: str, prefix: str, checkpoint: str,
                  max_offsets: int) -> Any:
    """The sequence job (one key group per stream) with the variant's state, its results on
    ``<prefix>.results.<variant>``."""
    from pyspark.sql import functions as F

    from cep.sase import parse_query
    from spark_jobs import sequence
    from spark_jobs.contract import kafka_client_config
    from spark_jobs.stateful import (
        KAFKA_COLUMNS,
        OUTPUT_SCHEMA,
        RECORD_VALUE,
        UNPARSED_GROUP,
        EventsTopicPartitions,
        apply_stream_cores,
        job_topics,
        read_record_values,
        write_results,
    )

    spark.conf.set("spark.sql.streaming.stateStore.providerClass", PROVIDER[variant])
    topics = TopicNames(prefix)
    output_topic = topics.results(variant)
    ensure_topics(bootstrap, [output_topic])
    records = read_record_values(spark, bootstrap, job_topics(topics, ()), prefix,
                                 max_offsets_per_trigger=max_offsets)
    partitions_of = EventsTopicPartitions(kafka_client_config(spark, bootstrap), prefix)
    if variant.startswith("per_key"):
        keyed = records.withColumn("group_key", F.coalesce(F.col("stream"), F.lit(UNPARSED_GROUP)))
        store = "map" if variant == "per_key" else "log"
        results = (keyed.select("group_key", RECORD_VALUE, *KAFKA_COLUMNS).groupBy("group_key")
                   .transformWithStateInPandas(PerKeyProcessor(SEQUENCE_QUERY, partitions_of, store),
                                               OUTPUT_SCHEMA, "Append", "None"))
    else:
        query = parse_query(SEQUENCE_QUERY)
        options = sequence.SequenceOptions("-", SEQUENCE_QUERY)
        config = sequence.engine_config(options)

        def factory(stream: str, blob: bytes | None) -> Any:
            return sequence.SequenceStreamCore(stream, query, config, options.type_field, blob)

        results = apply_stream_cores(records, sequence.JOB_NAME, factory, partitions_of,
                                     input_columns=sequence.SEQUENCE_COLUMNS,
                                     events_topic_prefix=topics.events("x").removesuffix("x"))
    # The sink's records are the job's ("job": "sequence"); only the topic is the variant's.
    return write_results(results, job=sequence.JOB_NAME, bootstrap_servers=bootstrap, output_topic=output_topic,
                         checkpoint_dir=checkpoint, console=False, available_now=True, processing_time="1 second")


def results_of(bootstrap: str, topic: str) -> collections.Counter[tuple[bytes, bytes]]:
    """Every committed (key, value) of the results topic (read_committed) and how often it was written."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-{uuid.uuid4()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "isolation.level": "read_committed"})
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in meta.partitions]
        ends = {p.partition: consumer.get_watermark_offsets(p, timeout=30)[1] for p in parts}
        consumer.assign(parts)
        out: collections.Counter[tuple[bytes, bytes]] = collections.Counter()
        done = {p for p, end in ends.items() if end == 0}
        while len(done) < len(ends):
            msg = consumer.poll(5.0)
            if msg is None:
                break
            if msg.error() is None and msg.value() is not None:
                out[(msg.key() or b"", msg.value() or b"")] += 1
            partition, offset = msg.partition(), msg.offset()
            # The last offset is the last transaction's commit marker, which is never delivered.
            if partition is not None and offset is not None and offset >= ends[partition] - 2:
                done.add(partition)
        return out
    finally:
        consumer.close()


def state_metrics(query: Any) -> dict[str, float]:
    """The stateful operator's metrics summed over the micro-batches; the state's size (the HDFS store's
    ``stateOnCurrentVersionSizeBytes``, RocksDB's ``rocksdbSstFileSize``) and memory: the last batch's."""
    out: dict[str, float] = collections.defaultdict(float)
    for progress in query.recentProgress:
        for op in progress.get("stateOperators", []):
            custom = op.get("customMetrics", {})
            for name in ("allUpdatesTimeMs", "commitTimeMs", "numRowsUpdated", "numRowsRemoved"):
                out[name] += float(op.get(name, 0))
            for name in ("rocksdbPutCount", "rocksdbTotalBytesWritten", "rocksdbBytesCopied"):
                out[name] += float(custom.get(name, 0))
            out["state_bytes"] = float(custom.get("stateOnCurrentVersionSizeBytes",
                                                  custom.get("rocksdbSstFileSize", 0)))
            out["memoryUsedBytes"] = float(op.get("memoryUsedBytes", 0))
    return dict(out)


def run_rounds(spark: Any, bootstrap: str, args: argparse.Namespace) -> dict[str, Any]:
    prefix = f"pks{uuid.uuid4().hex[:6]}"
    if args.workload == "bench":
        preload(bootstrap, prefix, args.events, ("a", "b"))
    else:
        preload_keyed(bootstrap, prefix, args.events, ("a", "b"), args.keys)
    jvm = spark.sparkContext._gateway.proc.pid
    rounds: dict[str, list[dict[str, Any]]] = {v: [] for v in args.variants}
    loads = []
    # Round -1 warms up (the JIT, the Python workers, each variant's first plan) and is not counted.
    for r in range(-args.warmup, args.rounds):
        for variant in (args.variants if r % 2 == 0 else args.variants[::-1]):
            loads.append(os.getloadavg()[0])
            checkpoint = tempfile.mkdtemp(prefix=f"bench-{variant}-")
            sampler = Sampler(jvm)
            query = start_variant(spark, variant, bootstrap, prefix, checkpoint, args.max_offsets)
            query.awaitTermination()
            split = sampler.split()
            rows, seconds = rate_of(query)
            cpu_s = split["jvm_s"] + split["python_s"] + split["driver_s"]
            figures = {"rows": rows, "batch_s": seconds, "batches": len(query.recentProgress), "cpu_s": cpu_s,
                       "jvm_us": split["jvm_s"] * 1e6 / rows, "python_us": split["python_s"] * 1e6 / rows,
                       "driver_us": split["driver_s"] * 1e6 / rows, "cpu_us": cpu_s * 1e6 / rows,
                       **state_metrics(query)}
            if r >= 0:
                rounds[variant].append(figures)
            print(f"round {r} {variant}: {rows} rows, {figures['batches']} batches, {seconds:.1f} s of batches, "
                  f"CPU {figures['cpu_us']:.1f} us/event (JVM {figures['jvm_us']:.1f}, Python "
                  f"{figures['python_us']:.1f}, driver {figures['driver_us']:.1f}); state "
                  f"{figures['state_bytes'] / 1e6:.1f} MB, updates "
                  f"{figures['allUpdatesTimeMs']:.0f} ms, commit {figures['commitTimeMs']:.0f} ms, rows updated "
                  f"{figures['numRowsUpdated']:.0f}, RocksDB puts {figures['rocksdbPutCount']:.0f} "
                  f"({figures['rocksdbTotalBytesWritten'] / 1e6:.1f} MB)", flush=True)
            shutil.rmtree(checkpoint, ignore_errors=True)
    topics = TopicNames(prefix)
    results = {v: results_of(bootstrap, topics.results(v)) for v in args.variants}
    # Every variant ran as often on the same topic: equal records, equally often.
    runs = args.rounds + args.warmup
    same = {v: results[v] == results[args.variants[0]] for v in args.variants}
    per_round = {v: collections.Counter({k: n / runs for k, n in c.items()}) for v, c in results.items()}
    print(f"results per round: {({v: sum(c.values()) for v, c in per_round.items()})}; same as "
          f"{args.variants[0]}: {same}", flush=True)
    return {"workload": args.workload, "events": args.events, "keys": args.keys, "max_offsets": args.max_offsets,
            "rounds": rounds, "loads": loads, "results_per_round": {v: sum(c.values()) for v, c in per_round.items()},
            "same_results": same, "utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime())}


def summary(figures: dict[str, Any]) -> str:
    """A markdown table: per variant, CPU us/event of the best round, every round's, and the JVM / Python split."""
    lines = ["| variant | CPU us/event, best round | every round | JVM / Python / driver (best round) | state MB "
             "| state updates + commit ms (best round) |", "|---|---:|---|---:|---:|---:|"]
    for variant, rounds in figures["rounds"].items():
        best = min(rounds, key=lambda f: f["cpu_us"])
        every = ", ".join(f"{f['cpu_us']:.1f}" for f in rounds)
        lines.append(f"| {variant} | {best['cpu_us']:.1f} | {every} | {best['jvm_us']:.1f} / {best['python_us']:.1f} "
                     f"/ {best['driver_us']:.1f} | {best['state_bytes'] / 1e6:.1f} | "
                     f"{best['allUpdatesTimeMs']:.0f} + {best['commitTimeMs']:.0f} |")
    loads = figures["loads"]
    lines.append(f"\nload average {min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workload", choices=("bench", "keys"), default="keys")
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=20_000, help="keys per stream (workload keys)")
    parser.add_argument("--max-offsets", type=int, default=10_000, help="Kafka records per micro-batch at most")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="rounds run first and not counted")
    parser.add_argument("--variants", type=lambda t: tuple(t.split(",")), default=VARIANTS)
    parser.add_argument("--pydeps", type=Path, help="a directory holding protobuf, added to the workers' path")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.pydeps is not None:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"), str(args.pydeps))))
    from spark_jobs.session import create_spark_session, stop_spark

    work = Path(tempfile.mkdtemp(prefix="bench-pks-"))
    broker = KafkaBroker(work / "kafka")
    state = broker.start()
    spark = create_spark_session("bench-per-key-state")
    try:
        figures = run_rounds(spark, state.bootstrap_servers, args)
    finally:
        stop_spark(spark)
        broker.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(summary(figures))
    if args.json is not None:
        args.json.write_bytes(orjson.dumps(figures, option=orjson.OPT_INDENT_2))


if __name__ == "__main__":
    main()
