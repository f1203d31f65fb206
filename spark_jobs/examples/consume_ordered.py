"""A user's own Spark job on the ordered stream: count a stream's events per tumbling window of reference time and
publish each window once, when it is final (docs/consume.md walks through it).

A window [t, t + w) is final when the stream's watermark W (spark_jobs.contract.StreamWatermark: the minimum over
the events topic's partitions of each one's latest punctuation) reaches t + w: no event below W can follow in any
partition. Nothing is guessed (no watermark delay) and nothing is dropped.

    spark-submit --master spark://spark-master:7077 \\
        --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0 \\
        --py-files dist/skewless-pyfiles.zip \\
        --conf spark.skewless.kafka.security.protocol=SASL_SSL \\
        spark_jobs/examples/consume_ordered.py --bootstrap kafka:9093 --prefix skewless --stream orders \\
        --window-ms 1000 --checkpoint /shared/checkpoints/consume_ordered

Results go to ``<prefix>.results.consume_ordered``: key ``<stream>|<window_start_us>``, value ``{"job",
"record": "window", "stream", "window_start_us", "window_end_us", "count"}``.

The open windows (a count each) and the partitions' latest punctuations live on the driver, in a JSON file in
the checkpoint directory (a local or mounted path), saved after each micro-batch with its batch id: a batch that
Spark runs again after a failure is applied once, and its results, written again, are the same records.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __name__ == "__main__":
    # Run as a file from a checkout: its packages (contract, spark_jobs, broker) after any installed or --py-files
    # copy on the path.
    sys.path.append(str(Path(__file__).resolve().parents[2]))

from contract.records import RESULT_WINDOW, result_key, result_value
from contract.topics import TopicNames
from spark_jobs.contract import (
    StreamWatermark,
    events,
    kafka_client_config,
    kafka_sink_options,
    punctuations,
    read_ordered_stream,
    replication_factor,
    stream_partitions,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

JOB = "consume_ordered"
STATE_FILE = "consume_ordered_state.json"


@dataclass
class WindowCounts:
    """Pure: the open windows' counts and the stream's watermark; :meth:`close` hands out the final windows."""

    window_us: int
    watermark: StreamWatermark
    counts: dict[int, int] = field(default_factory=dict)
    batch_id: int = -1
    """The last micro-batch applied (Spark numbers them from 0)."""

    def add(self, window_start_us: int, count: int) -> None:
        self.counts[window_start_us] = self.counts.get(window_start_us, 0) + count

    def close(self) -> list[tuple[int, int]]:
        """(window start, count) of every open window that the watermark has passed, in time order."""
        watermark_us = self.watermark.watermark_us
        if watermark_us is None:
            return []
        final = sorted((start, n) for start, n in self.counts.items() if start + self.window_us <= watermark_us)
        for start, _ in final:
            del self.counts[start]
        return final

    def to_json(self) -> str:
        return json.dumps({"window_us": self.window_us, "batch_id": self.batch_id,
                           "partitions": self.watermark.partitions,
                           "latest_us": {str(p): w for p, w in self.watermark.latest_us.items()},
                           "counts": {str(s): n for s, n in self.counts.items()}})

    @classmethod
    def from_json(cls, text: str) -> WindowCounts:
        raw = json.loads(text)
        watermark = StreamWatermark(int(raw["partitions"]), {int(p): int(w) for p, w in raw["latest_us"].items()})
        return cls(int(raw["window_us"]), watermark, {int(s): int(n) for s, n in raw["counts"].items()},
                   int(raw["batch_id"]))


@dataclass(frozen=True)
class ConsumeOptions:
    bootstrap_servers: str
    prefix: str
    stream: str
    window_us: int
    checkpoint_dir: str
    starting_offsets: str = "earliest"
    max_offsets_per_trigger: int | None = None
    available_now: bool = False


def load_state(path: Path, window_us: int, partitions: int) -> WindowCounts:
    if path.exists():
        state = WindowCounts.from_json(path.read_text())
        if state.window_us != window_us or state.watermark.partitions != partitions:
            raise ValueError(f"{path}: written with window {state.window_us} us over {state.watermark.partitions} "
                             f"partitions, now {window_us} us over {partitions}: use a new checkpoint")
        return state
    return WindowCounts(window_us, StreamWatermark(partitions))


def save_state(path: Path, state: WindowCounts) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(state.to_json())
    os.replace(temporary, path)  # a crash leaves the old state or the new one, never half of one


def start(spark: SparkSession, options: ConsumeOptions) -> StreamingQuery:
    """Start the job; returns the running query."""
    from pyspark.sql import functions as F

    from broker.admin import ensure_topics

    output_topic = TopicNames(options.prefix).results(JOB)
    ensure_topics(kafka_client_config(spark, options.bootstrap_servers), [output_topic],
                  replication_factor=replication_factor(spark))
    partitions = stream_partitions(spark, options.bootstrap_servers, options.prefix, options.stream)
    state_path = Path(options.checkpoint_dir) / STATE_FILE
    state_path.parent.mkdir(parents=True, exist_ok=True)
    window_us = options.window_us

    def each_batch(batch: DataFrame, batch_id: int) -> None:
        state = load_state(state_path, window_us, partitions)
        if batch_id <= state.batch_id:
            return  # applied (and its results written) before a failure: Spark runs it again
        batch.persist()
        try:
            # Two small aggregates reach the driver, never the events themselves.
            start_us = F.col("ref_ts_us") - F.pmod(F.col("ref_ts_us"), F.lit(window_us))
            for row in events(batch).groupBy(start_us.alias("start_us")).count().collect():
                state.add(int(row["start_us"]), int(row["count"]))
            state.watermark.observe_rows(
                r.asDict() for r in punctuations(batch).groupBy("partition")
                .agg(F.max("watermark_us").alias("watermark_us")).collect())
        finally:
            batch.unpersist()
        final = state.close()
        if final:
            rows = [(result_key(options.stream, s),
                     json.dumps(result_value(JOB, RESULT_WINDOW, options.stream, window_start_us=s,
                                             window_end_us=s + window_us, count=n), separators=(",", ":")))
                    for s, n in final]
            # One task writes them: the results topic gets the windows in time order.
            (batch.sparkSession.createDataFrame(rows, "key string, value string").coalesce(1).write.format("kafka")
             .options(**kafka_sink_options(spark, options.bootstrap_servers)).option("topic", output_topic).save())
        state.batch_id = batch_id
        save_state(state_path, state)

    records = read_ordered_stream(spark, options.bootstrap_servers, options.prefix, options.stream,
                                  starting_offsets=options.starting_offsets,
                                  max_offsets_per_trigger=options.max_offsets_per_trigger)
    writer = (records.writeStream.foreachBatch(each_batch).queryName(JOB)
              .option("checkpointLocation", str(Path(options.checkpoint_dir) / "query")))
    writer = writer.trigger(availableNow=True) if options.available_now else writer.trigger(processingTime="1 second")
    return writer.start()


def argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="consume_ordered.py", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers")
    parser.add_argument("--prefix", default="skewless", help="topic prefix of the deployment")
    parser.add_argument("--stream", required=True, help="the stream to read")
    parser.add_argument("--window-ms", type=int, default=1000, help="window width in milliseconds")
    parser.add_argument("--checkpoint", required=True, help="checkpoint directory (driver-local or mounted)")
    parser.add_argument("--available-now", action="store_true", help="read what is there, then stop")
    return parser


def options_from(argv: list[str] | None = None) -> ConsumeOptions:
    args = argument_parser().parse_args(argv)
    return ConsumeOptions(args.bootstrap, args.prefix, args.stream, args.window_ms * 1000, args.checkpoint,
                          available_now=args.available_now)


def main(argv: list[str] | None = None) -> None:
    options = options_from(argv)
    from spark_jobs.session import create_spark_session

    spark: Any = create_spark_session(JOB)
    query = start(spark, options)
    query.awaitTermination()


if __name__ == "__main__":
    main()
