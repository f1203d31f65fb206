"""Job `sequence`: SASE sequence queries (EVENT SEQ(...) WHERE ... WITHIN ...) over the ordered stream.

Spark groups the stream's records (events and late topics) by stream and key group and runs one cep.sase
SequenceEngine per group (it partitions by the query's equality attributes itself): the query's equality key is
spread over `--key-groups` groups (default one), each of which gets every punctuation of the stream
(docs/spark-jobs.md). The engine's low watermark is the stream's promise (spark_jobs/stateful.py): purge and release
are exact, no K has to be guessed (a K-slack bound can still be set for inputs that are not ordered upstream).
Records on `skewless.results.sequence`, key `<stream>|<partition value>|<event ids>` (one key per matched sequence):
`record` = `match`, `retract` (-) or `add` (+) (aggressive mode's compensations), what the engine did with a late
event (docs/sase.md), `too_late` (an event behind the watermark past what the engine can still act on) or `rejected`
(an event the query cannot use), always with a reason. With a constraint (`--constraint`, docs/constraints.md) also
`monitor_terminated` (a trace that can no longer match: released, the rest of it ignored) and, with
`--early-alerts`, `early_alert` (a match is certain).

An event's type is the payload field named by `--type-field` (default `type`); its attributes are the payload.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from cep.key_groups import sequence_partition_key
from cep.lateness import DEFAULT_ALLOWED_LATENESS_US
from cep.sase import (
    EngineConfig,
    OutputKind,
    Query,
    SaseError,
    SaseEvent,
    SaseOutput,
    SequenceEngine,
    VerdictOutput,
    parse_query,
)
from contract.records import (
    RESULT_ADD,
    RESULT_EARLY_ALERT,
    RESULT_INVALIDATED,
    RESULT_LATE_MATCH,
    RESULT_MATCH,
    RESULT_MONITOR_TERMINATED,
    RESULT_REJECTED,
    RESULT_RETRACT,
    RESULT_TOO_LATE,
    result_key,
    result_value,
)
from spark_jobs.cep_jobs import TypedQueryOptions, equality_key_groups_plan, side_record, start_cep_job
from spark_jobs.key_routing import KeyGroups, TypedKey
from spark_jobs.pattern import partition_text
from spark_jobs.stateful import SHELL_COLUMNS, MicroBatchColumns, decode_payload

JOB_NAME = "sequence"
# What crosses into Python: the shell's columns and the payload (an engine event is its type, time and payload).
SEQUENCE_COLUMNS = (*SHELL_COLUMNS, "payload")

# The engine's output kinds are its own vocabulary; the results contract names the records.
RECORD_OF_OUTPUT: dict[OutputKind, str] = {
    "match": RESULT_MATCH, "add": RESULT_ADD, "retract": RESULT_RETRACT, "late_match": RESULT_LATE_MATCH,
    "invalidated": RESULT_INVALIDATED, "too_late": RESULT_TOO_LATE, "early_alert": RESULT_EARLY_ALERT,
    "monitor_terminated": RESULT_MONITOR_TERMINATED}


@dataclass(frozen=True)
class SequenceOptions(TypedQueryOptions):
    allowed_lateness_us: int = DEFAULT_ALLOWED_LATENESS_US
    constraint: str | None = None
    constraint_checker: Literal["basic", "lightweight"] = "lightweight"
    early_alerts: bool = False
    key_groups: int | None = None
    """G: key groups per stream (None: one; :func:`key_groups_plan`, spark_jobs/stateful.py)."""


class SequenceStreamCore:
    """StreamCore adapter: one stream's engine (it partitions by the query's equality attributes itself)."""

    def __init__(self, stream: str, query: Query, config: EngineConfig, type_field: str, blob: bytes | None) -> None:
        self.stream = stream
        self.query = query
        self.engine = (SequenceEngine.restore(query, config, blob) if blob is not None
                       else SequenceEngine(query, config))
        self.type_field = type_field

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
        outputs: list[tuple[str, dict[str, Any]]] = []
        for row in rows:
            self._on_event(row.get("payload"), int(row["ref_ts_us"]), row.get("source_id"), row.get("seq"), outputs)
        return outputs

    def on_events(self, batch: MicroBatchColumns) -> list[tuple[str, dict[str, Any]]]:
        """The batch's events as columns (the shell's columnar path): no row dict per event."""
        outputs: list[tuple[str, dict[str, Any]]] = []
        on_event = self._on_event
        for payload, ts, source_id, seq in zip(batch.column("payload"), batch.column("ref_ts_us"),
                                               batch.column("source_id"), batch.column("seq"), strict=True):
            on_event(payload, ts, source_id, seq, outputs)
        return outputs

    def _on_event(self, payload_text: Any, ts_us: int, source_id: Any, seq: Any,
                  outputs: list[tuple[str, dict[str, Any]]]) -> None:
        """One event (its contract columns as they came); the engine's records to ``outputs``."""
        try:
            # The worker's parse gives the payload as a dict already: decode only what is not one.
            payload = payload_text if type(payload_text) is dict else decode_payload(payload_text)
        except ValueError as exc:
            outputs.append(self._side(RESULT_REJECTED, source_id, seq, ts_us, "bad_payload", str(exc)))
            return
        event_type = payload.get(self.type_field)
        if not isinstance(event_type, str):
            outputs.append(self._side(RESULT_REJECTED, source_id, seq, ts_us, "no_event_type",
                                      f"payload field {self.type_field!r} is not a string"))
            return
        event = SaseEvent(event_type, ts_us, payload, f"{source_id}:{seq}")
        counters = self.engine.counters
        rejected = counters.rejected
        produced = self.engine.on_event(event)
        if counters.rejected > rejected:
            outputs.append(self._side(RESULT_REJECTED, source_id, seq, ts_us, "engine_rejected",
                                      "see the engine's rejection counters"))
        for output in produced:
            if output.kind == "too_late":  # only ever about the event just fed: report it from its row
                outputs.append(self._side(
                    RESULT_TOO_LATE, source_id, seq, ts_us, output.reason or "too_late",
                    f"ts {event.ts} < low watermark {self.engine.low_watermark} minus the allowed lateness"))
            else:
                outputs.append(self._record(output))

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]:
        return [self._record(o) for o in self.engine.on_punctuation(watermark_us)]

    def set_ta_us(self, ta_us: int) -> None:
        """SASE queries have no clock-uncertainty shift: T_a does not apply."""

    def snapshot(self) -> bytes:
        """The engine's state, re-encoding only the partition keys that changed since the previous micro-batch
        (a checkpoint of an earlier build, a full snapshot, restores too: cep/sase/engine.py)."""
        return self.engine.incremental_snapshot()

    def _partition(self, output: SaseOutput) -> str:
        if not output.events:
            return ""
        first = output.events[0]
        attr = self.query.partition_attributes.get(first.event_type)
        return "" if attr is None else partition_text(first.attrs.get(attr))

    def _record(self, output: SaseOutput) -> tuple[str, dict[str, Any]]:
        record = RECORD_OF_OUTPUT[output.kind]
        if isinstance(output, VerdictOutput):
            # At most one verdict per trace: the key names the trace, the verdict and the deciding event.
            part = "" if output.trace is None else partition_text(output.trace)
            key = result_key(self.stream, part, record, *(e.event_id for e in output.events))
            return key, result_value(JOB_NAME, record, self.stream, partition=part, **output.to_dict())
        # One key per matched sequence: a retract, add or invalidated names the match it concerns.
        part = self._partition(output)
        key = result_key(self.stream, part, *(e.event_id for e in output.events))
        return key, result_value(JOB_NAME, record, self.stream, partition=part, **output.to_dict())

    def _side(self, record: str, source_id: Any, seq: Any, ref_ts_us: int, reason: str,
              detail: str) -> tuple[str, dict[str, Any]]:
        return side_record(JOB_NAME, self.stream, record, source_id, seq, ref_ts_us, reason, detail)


def engine_config(options: SequenceOptions) -> EngineConfig:
    return EngineConfig(k_slack_us=options.k_slack_us, mode=options.mode,
                        allowed_lateness_us=options.allowed_lateness_us, constraint=options.constraint,
                        constraint_checker=options.constraint_checker, early_alerts=options.early_alerts)


def constraint_problem(query: Query, constraint: str, checker: Literal["basic", "lightweight"],
                       early_alerts: bool) -> str | None:
    """Why the constraint cannot be used with the query (a bad expression, a query the checker cannot key by
    trace, early alerts the checker cannot promise), or None; for the CLI, before Spark starts."""
    try:
        SequenceEngine(query, EngineConfig(constraint=constraint, constraint_checker=checker,
                                           early_alerts=early_alerts))
    except SaseError as exc:
        return str(exc)
    return None


def key_groups_plan(query: Query, options: SequenceOptions) -> tuple[int, str]:
    """G for the job and why: the query's equality key spread over ``options.key_groups``, or one group when it is
    not given, when there is no key, or when the engine reads its CLOCK across keys.

    One group unless asked (unlike the pattern job, whose default is the shuffle partitions): a record's
    ``emitted_at`` is the engine's CLOCK, and a group's engine sees only its own keys' timestamps, so G > 1 changes
    that field (every other field and every key stay the same)."""
    # The engine's CLOCK (the largest timestamp it has seen) is per engine, so in a key group it is the group's:
    # a K-slack low watermark, aggressive mode's match/add choice and the constraint monitor read it across keys.
    refusals = [
        (options.k_slack_us is not None,
         "one key group per stream: a K-slack bound needs the stream's largest timestamp in one engine"),
        (options.mode == "aggressive",
         "one key group per stream: aggressive mode tells match from add by the stream's largest timestamp"),
        (options.constraint is not None,
         "one key group per stream: key groups are not yet checked with a constraint monitor"),
    ]
    return equality_key_groups_plan(
        options.key_groups, sequence_partition_key(query), refusals,
        not_given="one key group per stream: --key-groups not given (G > 1 makes emitted_at the group's CLOCK)")


def sequence_key_groups(query: Query, type_field: str, groups: int) -> KeyGroups | None:
    """The routing of a keyed query's events over ``groups`` key groups (None: one group): by the attribute of the
    event's type in the equality class, an event of another type by the class's one attribute if it has one."""
    key = sequence_partition_key(query)
    if key is None or groups < 2:
        return None
    return KeyGroups(groups, TypedKey(type_field, dict(key.attribute_of_type), key.trace_attribute))


def start(spark: Any, options: SequenceOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    query = parse_query(options.query)
    config = engine_config(options)
    SequenceEngine(query, config)  # a bad constraint fails here, on the driver, not in every task

    def factory(stream: str, blob: bytes | None) -> SequenceStreamCore:
        return SequenceStreamCore(stream, query, config, options.type_field, blob)

    return start_cep_job(spark, JOB_NAME, options, factory, SEQUENCE_COLUMNS, key_groups_plan(query, options),
                         lambda groups: sequence_key_groups(query, options.type_field, groups))
