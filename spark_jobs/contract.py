"""The record contract (docs/record-contract.md) as a Spark schema."""

from __future__ import annotations

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
