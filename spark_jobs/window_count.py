"""Job `window_count`: tumbling event-time windows (on ref_ts_us) counted per stream, exactly.

Spark groups the stream's records (events and late topics) by stream; each stream's cep.window_count
TumblingWindowCounter counts events per window and releases a window once the stream's promise passes its end
(spark_jobs/stateful.py): no watermark delay to tune, nothing dropped. Records on `skewless.results.window_count`,
key `<stream>|<window_start_us>`: `record = "window"` with `count` and `revision` (0 when released; a late event
for a released window re-emits it with the next revision under the same key, so the last record per key is the
final count), and `"too_late"` (a late event past the allowed lateness, with its reason).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.window_count import TooLate, TumblingWindowCounter, WindowCount
from contract.records import RESULT_TOO_LATE, RESULT_WINDOW, result_key, result_value
from spark_jobs.stateful import JobOptions, MicroBatchColumns, start_core_job

JOB_NAME = "window_count"


@dataclass(frozen=True)
class WindowCountOptions(JobOptions):
    width_us: int = 1_000_000
    allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US


class WindowCountCore:
    """StreamCore adapter: one stream's counter."""

    def __init__(self, stream: str, options: WindowCountOptions, blob: bytes | None) -> None:
        self.stream = stream
        self.counter = (TumblingWindowCounter.restore(blob) if blob is not None else
                        TumblingWindowCounter(options.width_us, allowed_lateness_us=options.allowed_lateness_us))

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            too_late = self.counter.add(int(row["ref_ts_us"]))
            if too_late is not None:
                outputs.append(self._too_late_record(too_late, row))
        return outputs

    def _too_late_record(self, too_late: TooLate, row: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        key = result_key(self.stream, RESULT_TOO_LATE, too_late.window_start_us, row.get("source_id"), row.get("seq"))
        return key, result_value(
            JOB_NAME, RESULT_TOO_LATE, self.stream, source_id=row.get("source_id"), seq=row.get("seq"),
            ref_ts_us=row.get("ref_ts_us"), window_start_us=too_late.window_start_us,
            reason=too_late.reason, gateway_late_reason=row.get("late_reason"))

    def on_events(self, batch: MicroBatchColumns) -> list[tuple[str, dict[str, Any]]]:
        """The batch's events as columns (the shell's columnar path): only their times, no row dict."""
        add = self.counter.add
        late = [(i, too_late) for i, ts in enumerate(batch.column("ref_ts_us")) if (too_late := add(ts)) is not None]
        return [self._too_late_record(too_late, batch.row(i)) for i, too_late in late]

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._record(w) for w in self.counter.advance(watermark_us)]

    def set_ta_us(self, ta_us: int) -> None:
        """Tumbling counts take the reference time as it is: T_a does not apply."""

    def snapshot(self) -> bytes:
        return self.counter.snapshot()

    def _record(self, window: WindowCount) -> tuple[str, dict[str, Any]]:
        return result_key(self.stream, window.window_start_us), result_value(
            JOB_NAME, RESULT_WINDOW, self.stream, window_start_us=window.window_start_us,
            window_end_us=window.window_end_us, count=window.count, revision=window.revision)


def start(spark: Any, options: WindowCountOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""

    def factory(stream: str, blob: bytes | None) -> WindowCountCore:
        return WindowCountCore(stream, options, blob)

    return start_core_job(spark, JOB_NAME, options, factory,
                          input_columns=["kind", "stream", "source_id", "seq", "ref_ts_us", "watermark_us", "rtt_us",
                                         "late_reason", "topic", "partition", "offset"])
