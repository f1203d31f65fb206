"""Job `three_window`: LOW/MIDDLE/HIGH time batch windows per stream (thesis 3.2.3.1, Query 4.4/4.5/5.7).

Spark groups the stream's records (events and late topics) by `stream`; each stream's
cep.three_window.ThreeWindowAggregator counts every event in its three slots and releases them as the stream's
promise (spark_jobs/stateful.py) passes their end. Records on `skewless.results.three_window`, key
`<stream>|<record>|<window_type>|<nominal_start_us>`: `record = "window"` (one window type) and `"final"` (the
three averaged as Query 4.5/5.7), each with a `revision` (0 when released; a late event for a released slot
re-emits that slot and its final with the next revision under the same key), and `"too_late"` (a late event past
the allowed lateness, with its reason; key also names the event).

T_a for thesis mode is the maximum over the stream's sources of the round trip carried by their latest event
(Eq. 3.16), updated while the job runs; `ta_us` fixes it instead. Per-event mode follows each event's uncertainty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.three_window import FinalResult, LateEvent, ThreeWindowAggregator, WindowResult
from contract.records import RESULT_FINAL, RESULT_TOO_LATE, RESULT_WINDOW, result_key, result_value
from spark_jobs.stateful import SHELL_COLUMNS, JobOptions, MicroBatchColumns, decode_payload, start_core_job

JOB_NAME = "three_window"
# What the core reads besides the shell's columns: the payload (its value field), the uncertainty, and the late
# reason a too-late record repeats.
THREE_WINDOW_COLUMNS = (*SHELL_COLUMNS, "payload", "uncertainty_us", "late_reason")


@dataclass(frozen=True)
class ThreeWindowOptions(JobOptions):
    width_us: int = 1_000_000
    slide_us: int | None = None
    value_field: str = "value"
    emit_early: bool = False
    shift_mode: Literal["per_event", "thesis"] = "per_event"
    ta_us: int | None = None
    max_shift_us: int = 50_000
    allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US


def numeric_value(payload: Mapping[str, Any], field: str) -> float | None:
    """The aggregated payload field; booleans and non-numbers count as events without a value."""
    value = payload.get(field)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class ThreeWindowCore:
    """StreamCore adapter: one stream's aggregator, fed contract rows."""

    def __init__(self, stream: str, options: ThreeWindowOptions, ta_us: int, blob: bytes | None) -> None:
        self.stream = stream
        if blob is not None:
            self.aggregator = ThreeWindowAggregator.restore(blob)
        else:
            self.aggregator = ThreeWindowAggregator(
                options.width_us, slide_us=options.slide_us, emit_early=options.emit_early,
                shift_mode=options.shift_mode, max_shift_us=options.max_shift_us, ta_us=ta_us,
                allowed_lateness_us=options.allowed_lateness_us)
        self.value_field = options.value_field
        # A fixed --ta-us wins over the T_a read from the records.
        self.fixed_ta = options.ta_us is not None

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            late = self.aggregator.add(int(row["ref_ts_us"]), self._value(row), int(row.get("uncertainty_us") or 0))
            outputs.extend(self._too_late_record(item, row) for item in late)
        return outputs

    def on_events(self, batch: MicroBatchColumns) -> list[tuple[str, dict[str, Any]]]:
        """The batch's events as columns: one ``add`` per event, no row dict (the shell's columnar path)."""
        outputs: list[tuple[str, dict[str, Any]]] = []
        values = [self._value({"payload": payload}) for payload in batch.column("payload")]
        add = self.aggregator.add
        for i, (ts, value, uncertainty) in enumerate(zip(batch.column("ref_ts_us"), values,
                                                         batch.column("uncertainty_us"), strict=True)):
            late = add(ts, value, uncertainty or 0)
            if late:
                row = batch.row(i)
                outputs.extend(self._too_late_record(item, row) for item in late)
        return outputs

    def _value(self, row: Mapping[str, Any]) -> float | None:
        try:
            return numeric_value(decode_payload(row.get("payload")), self.value_field)
        except ValueError:
            return None

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._result_record(r) for r in self.aggregator.advance(watermark_us)]

    def set_ta_us(self, ta_us: int) -> None:
        if not self.fixed_ta:
            self.aggregator.set_ta_us(ta_us)

    def snapshot(self) -> bytes:
        return self.aggregator.snapshot()

    def _result_record(self, result: WindowResult | FinalResult) -> tuple[str, dict[str, Any]]:
        # A correction has the key of the result it revises: a compacted results topic keeps the final truth.
        if isinstance(result, FinalResult):
            # A final averages all three window types: "ALL" keeps the key's four parts.
            key = result_key(self.stream, RESULT_FINAL, "ALL", result.nominal_start_us)
            return key, result_value(JOB_NAME, RESULT_FINAL, self.stream, **result.to_dict())
        key = result_key(self.stream, RESULT_WINDOW, result.window_type, result.nominal_start_us)
        return key, result_value(JOB_NAME, RESULT_WINDOW, self.stream, **result.to_dict())

    def _too_late_record(self, late: LateEvent, row: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        key = result_key(self.stream, RESULT_TOO_LATE, late.window_type, late.nominal_start_us, row.get("source_id"),
                         row.get("seq"))
        return key, result_value(JOB_NAME, RESULT_TOO_LATE, self.stream, source_id=row.get("source_id"),
                                 seq=row.get("seq"), gateway_late_reason=row.get("late_reason"), **late.to_dict())


def start(spark: Any, options: ThreeWindowOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""

    def factory(stream: str, blob: bytes | None) -> ThreeWindowCore:
        return ThreeWindowCore(stream, options, options.ta_us or 0, blob)

    return start_core_job(spark, JOB_NAME, options, factory, input_columns=THREE_WINDOW_COLUMNS)
