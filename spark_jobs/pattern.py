"""Job `pattern`: SEQ patterns under clock uncertainty (Pseudocode 3.1, Query 4.6/5.9, and any n).

Spark groups the ordered stream by (stream, PARTITION BY value); each group runs a cep.patterns
UncertainPatternMatcher. Every match goes to `skewless.results.pattern` with its confidence (Confirmed/Uncertain),
the matched events and the gaps that decided it; key `<stream>|<partition value>`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cep.patterns import PatternMatch, PatternSpec, UncertainPatternMatcher
from contract.records import RESULT_MATCH, RESULT_REJECTED, result_key, result_value
from contract.topics import TopicNames
from spark_jobs.contract import latest_ta_us
from spark_jobs.stateful import decode_payload, start_core_job

JOB_NAME = "pattern"


@dataclass(frozen=True)
class PatternOptions:
    bootstrap_servers: str
    pattern: str
    topic_prefix: str = "skewless"
    streams: tuple[str, ...] = ()
    ta_us: int | None = None
    watermark_delay: str = "0 seconds"
    checkpoint_dir: str | None = None
    available_now: bool = False
    processing_time: str = "1 second"
    console: bool = True


def event_ref(row: Mapping[str, Any], payload: Mapping[str, Any]) -> dict[str, Any]:
    """What a match record carries of each event: enough to find it in Kafka and to check the decision."""
    return {"source_id": row.get("source_id"), "seq": row.get("seq"), "ref_ts_us": row.get("ref_ts_us"),
            "uncertainty_us": row.get("uncertainty_us"), "payload": dict(payload)}


class PatternCore:
    """GroupCore adapter: one partition key's matcher."""

    def __init__(self, group: str, spec: PatternSpec, ta_us: int, blob: bytes | None) -> None:
        self.group = group
        self.stream, _, self.partition = group.partition("|")
        self.key = result_key(self.stream, self.partition)
        self.matcher = (UncertainPatternMatcher.restore(blob, spec) if blob is not None
                        else UncertainPatternMatcher(spec, ta_us=ta_us))
        self.rejected = 0

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            try:
                payload = decode_payload(row.get("payload"))
            except ValueError as exc:
                outputs.append((self.key, result_value(JOB_NAME, RESULT_REJECTED, self.stream,
                                                       source_id=row.get("source_id"), seq=row.get("seq"),
                                                       reason=str(exc))))
                continue
            matches = self.matcher.on_event(int(row["ref_ts_us"]), int(row.get("uncertainty_us") or 0), payload,
                                            event_ref(row, payload))
            outputs.extend(self._record(m) for m in matches)
        return outputs

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._record(m) for m in self.matcher.on_watermark(watermark_us)]

    def next_timer_us(self) -> int | None:
        return self.matcher.next_timer_us()

    def is_empty(self) -> bool:
        return self.matcher.buffered == 0 and self.matcher.held == 0

    def snapshot(self) -> bytes:
        return self.matcher.snapshot()

    def _record(self, match: PatternMatch) -> tuple[str, dict[str, Any]]:
        return self.key, result_value(JOB_NAME, RESULT_MATCH, self.stream, partition=self.partition,
                                      **match.to_dict())


def partition_column(spec: PatternSpec) -> Any:
    """`<stream>|<partition value>` as a Spark column (the value's JSON text; empty without PARTITION BY)."""
    from pyspark.sql import functions as F

    if spec.partition_by is None:
        return F.concat_ws("|", F.col("stream"), F.lit(""))
    value = F.get_json_object(F.col("payload"), "$." + spec.partition_by)
    return F.concat_ws("|", F.col("stream"), F.coalesce(value, F.lit("")))


def start(spark: Any, options: PatternOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    spec = PatternSpec.parse(options.pattern)
    ta_us = options.ta_us
    if spec.mode == "thesis" and ta_us is None:
        ta_us = latest_ta_us(options.bootstrap_servers, TopicNames(options.topic_prefix).sources)
    ta = ta_us or 0

    def factory(key: tuple[Any, ...], blob: bytes | None) -> PatternCore:
        return PatternCore(str(key[0]), spec, ta, blob)

    return start_core_job(spark, JOB_NAME, options, lambda: partition_column(spec), factory)
