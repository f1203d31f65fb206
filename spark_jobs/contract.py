"""The record contract (docs/record-contract.md) as a Spark schema, and the parse step every job shares."""

from __future__ import annotations

from typing import Any

from broker.client import Servers
from broker.reader import read_topic
from contract.records import EVENT, ClockRecord, RecordError, decode_record


def event_schema() -> Any:
    from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

    return StructType([
        StructField("v", LongType()),
        StructField("kind", StringType()),
        StructField("stream", StringType()),
        StructField("source_id", StringType()),
        StructField("seq", LongType()),
        StructField("source_ts_us", LongType()),
        StructField("ref_ts_us", LongType()),
        StructField("uncertainty_us", LongType()),
        StructField("arrival_ts_us", LongType()),
        StructField("release_ts_us", LongType()),
        StructField("late", BooleanType()),
        StructField("late_reason", StringType()),
        StructField("lateness_us", LongType()),
        StructField("watermark_us", LongType()),
        # Payloads are free-form: kept as their JSON text for jobs to parse with their own schema.
        StructField("payload", StringType()),
    ])


def read_events(spark: Any, bootstrap_servers: str, topic_pattern: str, starting_offsets: str = "earliest") -> Any:
    """Kafka source -> parsed contract columns plus `event_time` (timestamp from ref_ts_us).

    Both events and punctuation records come out; `events_only` keeps the events."""
    from pyspark.sql import functions as F

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap_servers)
        .option("subscribePattern", topic_pattern)
        .option("startingOffsets", starting_offsets)
        .option("failOnDataLoss", "false")
        .load()
    )
    parsed = raw.select(
        F.from_json(F.col("value").cast("string"), event_schema(), {"mode": "PERMISSIVE"}).alias("e"),
        F.col("topic"), F.col("partition"), F.col("offset"),
    ).select("e.*", "topic", "partition", "offset")
    return parsed.withColumn("event_time", F.timestamp_micros(F.col("ref_ts_us")))


def events_only(parsed: Any) -> Any:
    from pyspark.sql import functions as F

    return parsed.where((F.col("kind") == EVENT) & F.col("ref_ts_us").isNotNull())


def latest_ta_us(servers: Servers, sources_topic: str) -> int:
    """Eq. 3.16: T_a = max RTT over the sources, from each source's latest clock record (0 if none synced)."""
    latest: dict[str, int] = {}
    for _key, value in read_topic(servers, sources_topic):
        try:
            record = decode_record(value)
        except RecordError:
            continue  # not a clock state (a hand-written or foreign record): T_a is over what is known
        if isinstance(record, ClockRecord):
            latest[record.source_id] = record.rtt_us
    return max(latest.values(), default=0)
