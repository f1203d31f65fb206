"""The record contract (docs/record-contract.md) as a Spark schema."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
        StructField("rtt_us", LongType()),
        # Payloads are free-form: kept as their JSON text for jobs to parse with their own schema.
        StructField("payload", StringType()),
    ])


# Options of every Kafka read of the jobs.
#   kafka.isolation.level=read_committed: the gateway publishes with Kafka transactions (fencing of a gateway that
#     lost its shard); Spark's default, read_uncommitted, would hand the jobs records of aborted transactions and a
#     zombie's writes. Offsets then have gaps (commit/abort markers, aborted records): Spark's source copes with
#     non-consecutive offsets since SPARK-25005 (Spark 2.4).
#   failOnDataLoss=false: such gaps must not stop the job; records really gone (retention) cannot be re-read anyway.
KAFKA_SOURCE_OPTIONS: dict[str, str] = {
    "kafka.isolation.level": "read_committed",
    "failOnDataLoss": "false",
}


def kafka_source_options(bootstrap_servers: str, topics: Sequence[str] | str, starting_offsets: str,
                         max_offsets_per_trigger: int) -> dict[str, str]:
    """Every option of a contract topic read: the topics (a list, or one Java regex), committed data only."""
    subscription = ({"subscribePattern": topics} if isinstance(topics, str)
                    else {"subscribe": ",".join(topics)})
    return {"kafka.bootstrap.servers": bootstrap_servers, "startingOffsets": starting_offsets,
            "maxOffsetsPerTrigger": str(max_offsets_per_trigger), **KAFKA_SOURCE_OPTIONS, **subscription}


def read_kafka(spark: Any, bootstrap_servers: str, topics: Sequence[str] | str, starting_offsets: str,
               max_offsets_per_trigger: int) -> Any:
    """The raw Kafka stream (key, value, topic, partition, offset, ...) of the topics, committed records only."""
    reader = spark.readStream.format("kafka")
    for key, value in kafka_source_options(bootstrap_servers, topics, starting_offsets,
                                           max_offsets_per_trigger).items():
        reader = reader.option(key, value)
    return reader.load()
