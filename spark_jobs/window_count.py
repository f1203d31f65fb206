"""Job `window_count`: tumbling event-time windows (on ref_ts_us) counted per stream, with a watermark.

Results are upserts: every trigger re-emits the windows whose count changed ("update" mode), keyed by
`<stream>|<window_start_us>` so the last record per key in `skewless.results.window_count` is the final count.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Any

from broker.admin import ensure_topics
from contract.topics import TopicNames

JOB_NAME = "window_count"


@dataclass(frozen=True)
class WindowCountOptions:
    bootstrap_servers: str
    topic_prefix: str = "skewless"
    window: str = "1 second"
    watermark: str = "2 seconds"
    checkpoint_dir: str | None = None
    available_now: bool = False
    processing_time: str = "2 seconds"
    console: bool = True


def window_counts(events: Any, window: str, watermark: str) -> Any:
    """The pure transformation, reusable on any DataFrame with `stream` and `event_time` columns."""
    from pyspark.sql import functions as F

    counted = (
        events.withWatermark("event_time", watermark)
        .groupBy(F.window("event_time", window).alias("w"), F.col("stream"))
        .agg(F.count(F.lit(1)).alias("count"))
    )
    return counted.select(
        F.col("stream"),
        F.unix_micros(F.col("w.start")).alias("window_start_us"),
        F.unix_micros(F.col("w.end")).alias("window_end_us"),
        F.col("count"),
    )


def to_kafka_records(results: Any) -> Any:
    from pyspark.sql import functions as F

    return results.select(
        F.concat_ws("|", F.col("stream"), F.col("window_start_us").cast("string")).alias("key"),
        F.to_json(F.struct(F.lit(JOB_NAME).alias("job"), "stream", "window_start_us", "window_end_us",
                           "count")).alias("value"),
    )


def start(spark: Any, options: WindowCountOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    from spark_jobs.contract import events_only, read_events

    topics = TopicNames(options.topic_prefix)
    output_topic = topics.results(JOB_NAME)
    ensure_topics(options.bootstrap_servers, [output_topic])
    results = window_counts(events_only(read_events(spark, options.bootstrap_servers, topics.events_pattern)),
                            options.window, options.watermark)

    def write_batch(batch: Any, batch_id: int) -> None:
        if options.console:
            rows = batch.orderBy("stream", "window_start_us").collect()
            for row in rows:
                print(f"[window_count batch {batch_id}] stream={row['stream']} "
                      f"window=[{row['window_start_us']}, {row['window_end_us']}) count={row['count']}",
                      flush=True)
        (to_kafka_records(batch).write.format("kafka")
         .option("kafka.bootstrap.servers", options.bootstrap_servers)
         .option("topic", output_topic).save())

    writer = results.writeStream.outputMode("update").foreachBatch(write_batch).queryName(JOB_NAME)
    # A foreachBatch sink needs a checkpoint; without a configured one, a fresh directory means "start over".
    checkpoint = options.checkpoint_dir or tempfile.mkdtemp(prefix="skewless-window-count-")
    writer = writer.option("checkpointLocation", checkpoint)
    writer = writer.trigger(availableNow=True) if options.available_now else writer.trigger(
        processingTime=options.processing_time)
    return writer.start()
