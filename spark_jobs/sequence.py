"""Job `sequence`: SASE sequence queries (EVENT SEQ(...) WHERE ... WITHIN ...) over the ordered stream.

Spark groups events by (stream, the query's equality-partitioning attribute for the event's type) and runs a
cep.sase SequenceEngine per group. The engine's low watermark is Spark's event-time watermark, which the gateway's
punctuations drive: purge and release are exact, no K has to be guessed (a K-slack bound can still be set for
inputs that are not ordered upstream). Records on `skewless.results.sequence`, key `<stream>|<partition value>`:
`record` = `match`, `retract` (-) or `add` (+) (aggressive mode's compensations), `late` (an event behind the
watermark the engine already acted on) or `rejected` (an event the query cannot use), always with a reason.

An event's type is the payload field named by `--type-field` (default `type`); its attributes are the payload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cep.sase import EngineConfig, OutputKind, Query, SaseEvent, SaseOutput, SequenceEngine, parse_query
from contract.records import (
    RESULT_ADD,
    RESULT_LATE,
    RESULT_MATCH,
    RESULT_REJECTED,
    RESULT_RETRACT,
    result_key,
    result_value,
)
from spark_jobs.stateful import decode_payload, start_core_job

JOB_NAME = "sequence"

# The engine's output kinds are its own vocabulary; the results contract names the records.
RECORD_OF_OUTPUT: dict[OutputKind, str] = {"match": RESULT_MATCH, "add": RESULT_ADD, "retract": RESULT_RETRACT}


@dataclass(frozen=True)
class SequenceOptions:
    bootstrap_servers: str
    query: str
    topic_prefix: str = "skewless"
    streams: tuple[str, ...] = ()
    type_field: str = "type"
    mode: Literal["conservative", "aggressive"] = "conservative"
    k_slack_us: int | None = None
    watermark_delay: str = "0 seconds"
    checkpoint_dir: str | None = None
    available_now: bool = False
    processing_time: str = "1 second"
    console: bool = True


class SequenceCore:
    """GroupCore adapter: one partition's engine, fed contract rows."""

    def __init__(self, group: str, query: Query, config: EngineConfig, type_field: str, blob: bytes | None) -> None:
        self.group = group
        self.stream, _, self.partition = group.partition("|")
        self.key = result_key(self.stream, self.partition)
        self.engine = (SequenceEngine.restore(query, config, blob) if blob is not None
                       else SequenceEngine(query, config))
        self.type_field = type_field

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        counters = self.engine.counters
        for row in rows:
            try:
                payload = decode_payload(row.get("payload"))
            except ValueError as exc:
                outputs.append(self._side(RESULT_REJECTED, row, "bad_payload", str(exc)))
                continue
            event_type = payload.get(self.type_field)
            if not isinstance(event_type, str):
                outputs.append(self._side(RESULT_REJECTED, row, "no_event_type",
                                          f"payload field {self.type_field!r} is not a string"))
                continue
            event = SaseEvent(event_type, int(row["ref_ts_us"]), payload, f"{row.get('source_id')}|{row.get('seq')}")
            too_late, rejected = counters.too_late, counters.rejected
            produced = self.engine.on_event(event)
            if counters.too_late > too_late:
                outputs.append(self._side(RESULT_LATE, row, "behind_watermark",
                                          f"ts {event.ts} < low watermark {self.engine.low_watermark}"))
            elif counters.rejected > rejected:
                outputs.append(self._side(RESULT_REJECTED, row, "engine_rejected",
                                          "see the engine's rejection counters"))
            outputs.extend(self._record(o) for o in produced)
        return outputs

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._record(o) for o in self.engine.on_punctuation(watermark_us)]

    def next_timer_us(self) -> int | None:
        return self.engine.next_timer_us()

    def is_empty(self) -> bool:
        return self.engine.is_idle()

    def snapshot(self) -> bytes:
        return self.engine.snapshot()

    def _record(self, output: SaseOutput) -> tuple[str, dict[str, Any]]:
        return self.key, result_value(JOB_NAME, RECORD_OF_OUTPUT[output.kind], self.stream,
                                      partition=self.partition, **output.to_dict())

    def _side(self, record: str, row: Mapping[str, Any], reason: str, detail: str) -> tuple[str, dict[str, Any]]:
        return self.key, result_value(JOB_NAME, record, self.stream, partition=self.partition,
                                      source_id=row.get("source_id"), seq=row.get("seq"),
                                      ref_ts_us=row.get("ref_ts_us"), reason=reason, detail=detail)


def partition_column(query: Query, type_field: str) -> Any:
    """`<stream>|<partition attribute value>`: per event type, the attribute the query's equalities name."""
    from pyspark.sql import functions as F

    value: Any = F.lit("")
    if query.partition_attributes:
        event_type = F.get_json_object(F.col("payload"), f"$.{type_field}")
        cases = None
        for etype, attr in sorted(query.partition_attributes.items()):
            attr_value = F.get_json_object(F.col("payload"), f"$.{attr}")
            cases = (F.when(event_type == etype, attr_value) if cases is None
                     else cases.when(event_type == etype, attr_value))
        assert cases is not None
        value = F.coalesce(cases.otherwise(F.lit("")), F.lit(""))
    return F.concat_ws("|", F.col("stream"), value)


def start(spark: Any, options: SequenceOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    query = parse_query(options.query)
    config = EngineConfig(k_slack_us=options.k_slack_us, mode=options.mode)

    def factory(key: tuple[Any, ...], blob: bytes | None) -> SequenceCore:
        return SequenceCore(str(key[0]), query, config, options.type_field, blob)

    return start_core_job(spark, JOB_NAME, options, lambda: partition_column(query, options.type_field), factory)
