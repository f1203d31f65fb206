"""Job `three_window`: LOW/MIDDLE/HIGH time batch windows per stream (thesis 3.2.3.1, Query 4.4/4.5/5.7).

Spark groups the ordered stream by `stream`; each group's cep.three_window.ThreeWindowAggregator counts every event
in its three slots and releases them as Spark's watermark passes their end. Records on
`skewless.results.three_window` (key `<stream>|<record>|<window_type>|<nominal_start_us>`):
`record = "window"` (one window type), `"final"` (the three averaged as Query 4.5/5.7) and `"late"` (an event whose
slot was already released: reported with its reason, never dropped silently).

T_a for thesis mode is read once, when the job starts, from the sources topic (max RTT over the latest clock record
of every source, Eq. 3.16), as the thesis fixes it per query; per-event mode follows every event's own uncertainty.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cep.three_window import FinalResult, LateEvent, ThreeWindowAggregator, WindowResult
from contract.records import RESULT_FINAL, RESULT_LATE, RESULT_WINDOW, result_key, result_value
from contract.topics import TopicNames
from spark_jobs import contract as spark_contract
from spark_jobs.stateful import INPUT_COLUMNS, decode_payload, start_core_job

JOB_NAME = "three_window"


@dataclass(frozen=True)
class ThreeWindowOptions:
    bootstrap_servers: str
    topic_prefix: str = "skewless"
    streams: tuple[str, ...] = ()
    width_us: int = 1_000_000
    slide_us: int | None = None
    value_field: str = "value"
    emit_early: bool = False
    shift_mode: Literal["per_event", "thesis"] = "per_event"
    ta_us: int | None = None
    max_shift_us: int = 50_000
    watermark_delay: str = "0 seconds"
    checkpoint_dir: str | None = None
    available_now: bool = False
    processing_time: str = "1 second"
    console: bool = True


def numeric_value(payload: Mapping[str, Any], field: str) -> float | None:
    """The aggregated payload field; booleans and non-numbers count as events without a value."""
    value = payload.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class ThreeWindowCore:
    """GroupCore adapter: one stream's aggregator, fed contract rows."""

    def __init__(self, stream: str, options: ThreeWindowOptions, ta_us: int, blob: bytes | None) -> None:
        self.stream = stream
        if blob is not None:
            self.aggregator = ThreeWindowAggregator.restore(blob)
        else:
            self.aggregator = ThreeWindowAggregator(
                options.width_us, slide_us=options.slide_us, emit_early=options.emit_early,
                shift_mode=options.shift_mode, max_shift_us=options.max_shift_us, ta_us=ta_us)
        self.value_field = options.value_field

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            try:
                value = numeric_value(decode_payload(row.get("payload")), self.value_field)
            except ValueError:
                value = None
            late = self.aggregator.add(int(row["ref_ts_us"]), value, int(row.get("uncertainty_us") or 0))
            outputs.extend(self._late_record(item, row) for item in late)
        return outputs

    def on_frame(self, frame: Any) -> list[tuple[str, dict[str, Any]]]:
        """Columnar path: `value` was extracted from the payload by Spark (NaN = no numeric value)."""
        ts = frame["ref_ts_us"].astype("int64").tolist()
        uncertainty = frame["uncertainty_us"].fillna(0).astype("int64").tolist()
        raw = frame["value"].tolist()
        values = [None if v is None or math.isnan(v) else float(v) for v in raw]
        late = self.aggregator.add_many(ts, values, uncertainty)
        if not late:
            return []
        # Late slots are rare: find their events' identity by timestamp only then.
        ids = dict(zip(ts, zip(frame["source_id"].tolist(), frame["seq"].tolist(), strict=True), strict=True))
        return [self._late_record(item, {"source_id": ids[item.ts_us][0], "seq": ids[item.ts_us][1]})
                for item in late]

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._result_record(r) for r in self.aggregator.advance(watermark_us)]

    def next_timer_us(self) -> int | None:
        return self.aggregator.next_release_us()

    def is_empty(self) -> bool:
        # One small state per stream, kept for good: its release frontier is what recognises a late event.
        return False

    def snapshot(self) -> bytes:
        return self.aggregator.snapshot()

    def _result_record(self, result: WindowResult | FinalResult) -> tuple[str, dict[str, Any]]:
        if isinstance(result, FinalResult):
            # A final averages all three window types: "ALL" keeps the key's four parts.
            key = result_key(self.stream, RESULT_FINAL, "ALL", result.nominal_start_us)
            return key, result_value(JOB_NAME, RESULT_FINAL, self.stream, **result.to_dict())
        key = result_key(self.stream, RESULT_WINDOW, result.window_type, result.nominal_start_us)
        return key, result_value(JOB_NAME, RESULT_WINDOW, self.stream, **result.to_dict())

    def _late_record(self, late: LateEvent, row: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        key = result_key(self.stream, RESULT_LATE, late.window_type, late.nominal_start_us)
        return key, result_value(JOB_NAME, RESULT_LATE, self.stream, source_id=row.get("source_id"),
                                 seq=row.get("seq"), **late.to_dict())


def start(spark: Any, options: ThreeWindowOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    from pyspark.sql import functions as F

    ta_us = options.ta_us
    if options.shift_mode == "thesis" and ta_us is None:
        ta_us = spark_contract.latest_ta_us(options.bootstrap_servers, TopicNames(options.topic_prefix).sources)
    ta = ta_us or 0

    def factory(key: tuple[Any, ...], blob: bytes | None) -> ThreeWindowCore:
        return ThreeWindowCore(str(key[0]), options, ta, blob)

    # The aggregated field is extracted in the JVM (a double, null when absent or not a number); the payload
    # itself stays there: the aggregator needs times, uncertainty, the value and (for late records) identities.
    value = F.get_json_object(F.col("payload"), f"$.{options.value_field}").cast("double")
    return start_core_job(spark, JOB_NAME, options, lambda: F.col("stream"), factory, extra_columns={"value": value},
                          punctuation_key=F.col("stream"),
                          input_columns=[c for c in INPUT_COLUMNS if c != "payload"])
