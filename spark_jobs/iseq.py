"""Job `iseq`: ISEQ interval queries (EVENT ISEQ[TList](E1..Em; W), cep.intervals) over the ordered stream.

Spark groups the stream's records (events and late topics) by stream and runs one cep.intervals IntervalEngine per
stream, or, with `--key-groups`, by stream and key group: the query's equality key spread over G groups, each of
which gets every punctuation of the stream (docs/spark-jobs.md, "Key groups"). What an event record is to the
engine (docs/intervals.md, "Spark job"):

* an interval ``[start_ts_us, end_ts_us]`` (contract v2; ``end_ts_us`` is ``ref_ts_us``); a v1 record, or a point
  event, is the interval ``[ref_ts_us, ref_ts_us]``;
* an endpoint (``interval_id`` + ``endpoint`` "start"/"end", IO3's model): the two endpoints of one source are
  paired by id (cep.intervals.EndpointPairer); a start is an interval begin punctuation (IBP), the interval exists
  once both arrived;
* with ``from_points`` (Li 2010 5.4.2): a point event whose payload has that field as a number is a reading of its
  source, turned into level intervals (LOW / MEDIUM / HIGH by thresholds) by cep.intervals.PointToIntervalOperator.

The event type is the payload field named by ``type_field`` (a level interval's type is its level name), the
attributes are the payload; events of types the query does not name are skipped.

Time. The ordered topic is ordered by ``ref_ts_us``, an interval's end (its item time), per partition; across the
partitions of a stream and across micro-batches it is not (a micro-batch reads each partition up to its own
offset). The stream's promise W (spark_jobs/stateful.py) is what is exact: by default (no K) the core holds each
input until W passes it and feeds the engine in item-time order (ties: begins first), then moves its clock to W,
so the engine runs with K = 0 and every purge, drop and release is exact. With ``k_slack_us`` the inputs go to the
engine at once (K-ISlack: lower latency, aggressive mode compensates late arrivals) and an item more than K behind
the engine's clock is ``too_late``. Records on `skewless.results.iseq`: ``match``, ``add`` (+) and ``retract`` (-)
with the members; ``too_late`` and ``rejected`` side records, each with a reason, one per input; never silent.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from cep.intervals import (
    EndpointPairer,
    IndexingProfile,
    Interval,
    IntervalBegin,
    IntervalEngine,
    IntervalEngineConfig,
    IntervalError,
    IntervalOutput,
    IntervalQuery,
    PointToIntervalOperator,
    ThresholdLevels,
    parse_iseq,
)
from cep.key_groups import iseq_partition_key
from contract.records import (
    ENDPOINTS,
    RESULT_ADD,
    RESULT_MATCH,
    RESULT_REJECTED,
    RESULT_RETRACT,
    RESULT_TOO_LATE,
    result_key,
)
from contract.records import result_value as contract_result_value
from spark_jobs.cep_jobs import TypedQueryOptions, equality_key_groups_plan, side_record, start_cep_job
from spark_jobs.key_routing import KeyGroups, ReadingsBySource, TypedKey
from spark_jobs.stateful import SHELL_COLUMNS, MicroBatchColumns, decode_payload

JOB_NAME = "iseq"
# What the core reads besides the shell's columns: the payload and the contract v2 columns (a null start_ts_us,
# a v1 record's, is ref_ts_us).
ISEQ_COLUMNS = (*SHELL_COLUMNS, "payload", "start_ts_us", "interval_id", "endpoint")
RECORD_OF_OUTPUT = {"match": RESULT_MATCH, "add": RESULT_ADD, "retract": RESULT_RETRACT}
# Reasons of the side records (docs/intervals.md lists them).
REASON_BAD_PAYLOAD = "bad_payload"
REASON_NO_EVENT_TYPE = "no_event_type"
REASON_BAD_INTERVAL = "bad_interval"
REASON_BAD_ENDPOINT = "bad_endpoint"
REASON_BAD_VALUE = "bad_value"
REASON_BEHIND_CLOCK = "behind_clock"
REASON_READING_OUT_OF_ORDER = "reading_out_of_order"
REASON_UNPAIRED_END = "unpaired_end"
ENDPOINT_START, ENDPOINT_END = ENDPOINTS
_STATE_VERSION = 1

Output = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class IseqOptions(TypedQueryOptions):
    """``k_slack_us`` None: inputs wait for the stream's promise, the engine runs with K = 0 (exact); a number:
    inputs are fed at once (K-ISlack)."""

    indexing: IndexingProfile = "ais"
    punctuated_types: tuple[str, ...] = ()
    """Types whose every interval is preceded by its begin (sent as endpoints): IBP indexing, start-bounded
    negation. The level names are added with ``from_points``."""
    from_points: str | None = None
    """Payload field of a point reading's number: point events with it become level intervals."""
    levels: str = "LOW,50,MEDIUM,100,HIGH"
    key_groups: int | None = None
    """G: key groups per stream (None: one; :func:`key_groups_plan`)."""


def parse_levels(text: str) -> ThresholdLevels:
    """``"LOW,50,MEDIUM,100,HIGH"``: names and bounds alternating, read LOW <= 50 < MEDIUM <= 100 < HIGH."""
    parts = [p.strip() for p in text.split(",")]
    if len(parts) < 3 or len(parts) % 2 == 0:
        raise ValueError(f"levels must alternate names and bounds, NAME,BOUND,NAME[,BOUND,NAME...]: {text!r}")
    names, bounds = parts[0::2], parts[1::2]
    if any(not n for n in names) or len(set(names)) != len(names):
        raise ValueError(f"level names must be distinct and non-empty: {text!r}")
    try:
        numbers = [float(b) for b in bounds]
    except ValueError:
        raise ValueError(f"level bounds must be numbers: {text!r}") from None
    try:
        return ThresholdLevels(tuple(numbers), tuple(names))
    except IntervalError as exc:
        raise ValueError(f"{exc}: {text!r}") from None


def engine_config(options: IseqOptions) -> IntervalEngineConfig:
    """The engine's settings (raises IntervalError or ValueError on bad ones: the CLI checks them up front)."""
    punctuated = set(options.punctuated_types)
    if options.from_points is not None:
        punctuated |= set(parse_levels(options.levels).names)  # the operator sends each level's begin first
    return IntervalEngineConfig(k_slack_us=options.k_slack_us or 0, mode=options.mode, indexing=options.indexing,
                                punctuated_types=frozenset(punctuated))


def check_options(options: IseqOptions) -> IntervalQuery:
    """Parse the query and build an engine once: every error a job would hit at its first event, now."""
    query = parse_iseq(options.query)
    IntervalEngine(query, engine_config(options))
    return query


@dataclass(frozen=True, slots=True)
class _Input:
    """One usable event record, as the engine will get it (held in the state until the promise passes it)."""

    ref_ts_us: int
    rank: int
    """0 for a start endpoint (an IBP), 1 otherwise: begins before intervals at equal times (docs/intervals.md)."""
    arrival: int
    """The core's arrival counter: ties keep their order, the same on every replay."""
    what: str
    """``interval``, ``start``, ``end`` or ``reading``."""
    source_id: str
    seq: int | None
    event_type: str
    start_ts_us: int
    attrs: dict[str, Any]
    interval_id: str | None = None
    value: float | None = None

    def sort_key(self) -> tuple[int, int, int]:
        return self.ref_ts_us, self.rank, self.arrival

    def to_list(self) -> list[Any]:
        return [getattr(self, f.name) for f in dataclasses.fields(self)]

    @classmethod
    def from_list(cls, values: Sequence[Any]) -> _Input:
        return cls(*values)


def _int_or_none(value: Any) -> int | None:
    # Arrow hands an integer column with nulls to pandas as floats (NaN for null).
    if value is None or value != value:  # noqa: PLR0124 - NaN is the only value unequal to itself
        return None
    return int(value)


class IseqStreamCore:
    """StreamCore adapter: one stream's IntervalEngine, its endpoint pairer and one point operator per source."""

    def __init__(self, stream: str, query: IntervalQuery, config: IntervalEngineConfig, options: IseqOptions,
                 blob: bytes | None) -> None:
        self.stream = stream
        self.query = query
        self.mode = config.mode
        self.hold = options.k_slack_us is None
        self.type_field = options.type_field
        self.value_field = options.from_points
        self.levels = parse_levels(options.levels) if options.from_points is not None else None
        self.engine = IntervalEngine(query, config)
        self.types = query.event_types()
        self.pairer = EndpointPairer()
        self.points: dict[str, PointToIntervalOperator] = {}
        self.held: list[_Input] = []
        self.arrivals = 0
        self.open_ends: dict[str, tuple[str, int | None, int]] = {}
        """Pair id -> (source_id, seq, ref_ts_us) of an end whose start has not come: reported once it cannot."""
        if blob is not None:
            self._restore(blob)

    # -- the shell's interface ---------------------------------------------------------------------------------
    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[Output]:
        outputs: list[Output] = []
        for row in rows:
            self._on_event(row.get("payload"), row["ref_ts_us"], row.get("start_ts_us"), row.get("source_id"),
                           row.get("seq"), row.get("interval_id"), row.get("endpoint"), outputs)
        return outputs

    def on_events(self, batch: MicroBatchColumns) -> list[Output]:
        outputs: list[Output] = []
        on_event = self._on_event
        for payload, ref, start, source_id, seq, interval_id, endpoint in zip(
                batch.column("payload"), batch.column("ref_ts_us"), batch.column("start_ts_us"),
                batch.column("source_id"), batch.column("seq"), batch.column("interval_id"),
                batch.column("endpoint"), strict=True):
            on_event(payload, ref, start, source_id, seq, interval_id, endpoint, outputs)
        return outputs

    def on_watermark(self, watermark_us: int) -> list[Output]:
        """The stream's promise: no event with ``ref_ts_us < watermark_us`` follows."""
        outputs: list[Output] = []
        if self.hold and self.held:
            self.held.sort(key=_Input.sort_key)
            cut = 0
            while cut < len(self.held) and self.held[cut].ref_ts_us < watermark_us:
                cut += 1
            due, self.held = self.held[:cut], self.held[cut:]
            for item in due:
                self._feed(item, outputs)
        outputs.extend(self._record(o) for o in self.engine.advance_clock(watermark_us))
        self._expire_open_ends(outputs)
        return outputs

    def _expire_open_ends(self, outputs: list[Output]) -> None:
        """An end whose start has not come by the time the end is K behind the engine's clock: any start still to
        come is earlier, so it would be too late. Reported (``unpaired_end``) and forgotten, not kept forever."""
        clock = self.engine.clock_us
        if clock is None or not self.open_ends:
            return
        horizon = clock - self.engine.config.k_slack_us
        for pair_id, (source, seq, ref_ts_us) in sorted(self.open_ends.items(), key=lambda kv: kv[1][2]):
            if ref_ts_us >= horizon:
                break
            del self.open_ends[pair_id]
            self.pairer.discard(pair_id)
            outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_UNPAIRED_END,
                                      f"no start of interval {pair_id!r} came before its end fell behind the "
                                      f"engine's clock {clock} minus K: a start still to come would be too late"))

    def set_ta_us(self, ta_us: int) -> None:
        """Interval queries have no clock-uncertainty shift: T_a does not apply."""

    def snapshot(self) -> bytes:
        packed: bytes = msgpack.packb({
            "v": _STATE_VERSION, "engine": self.engine.export_state(), "pairer": self.pairer.export_state(),
            "points": {s: op.export_state() for s, op in self.points.items()},
            "held": [i.to_list() for i in self.held], "arrivals": self.arrivals,
            "open_ends": [[k, *v] for k, v in self.open_ends.items()]}, use_bin_type=True)
        return packed

    def _restore(self, blob: bytes) -> None:
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if state.get("v") != _STATE_VERSION:
            raise ValueError(f"unsupported iseq core state version {state.get('v')!r}")
        self.engine.import_state(state["engine"])
        self.pairer.import_state(state["pairer"])
        for source, op_state in state["points"].items():
            op = PointToIntervalOperator(source, self.levels)
            op.import_state(op_state)
            self.points[source] = op
        self.held = [_Input.from_list(v) for v in state["held"]]
        self.arrivals = int(state["arrivals"])
        self.open_ends = {str(k): (str(source), seq, int(ref)) for k, source, seq, ref in state["open_ends"]}

    # -- one event record --------------------------------------------------------------------------------------
    def _on_event(self, payload_text: str | None, ref: Any, start: Any, source_id: Any, seq: Any,
                  interval_id: str | None, endpoint: str | None, outputs: list[Output]) -> None:
        ref_ts_us = int(ref)
        start_ts_us = _int_or_none(start)
        seq = _int_or_none(seq)
        source = "" if source_id is None else str(source_id)
        try:
            payload = decode_payload(payload_text)
        except ValueError as exc:
            outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_BAD_PAYLOAD, str(exc)))
            return
        start_ts_us = ref_ts_us if start_ts_us is None else start_ts_us
        if start_ts_us > ref_ts_us:
            outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_BAD_INTERVAL,
                                      f"start_ts_us {start_ts_us} > end (ref_ts_us) {ref_ts_us}"))
            return
        if (interval_id is None) != (endpoint is None) or endpoint not in (None, ENDPOINT_START, ENDPOINT_END):
            outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_BAD_ENDPOINT,
                                      f"interval_id {interval_id!r} with endpoint {endpoint!r}"))
            return
        value: float | None = None
        what = "interval" if endpoint is None else str(endpoint)
        if self.value_field is not None and endpoint is None and start_ts_us == ref_ts_us \
                and self.value_field in payload:
            raw = payload[self.value_field]
            if isinstance(raw, bool) or not isinstance(raw, int | float) or raw != raw:  # noqa: PLR0124 - NaN
                outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_BAD_VALUE,
                                          f"payload field {self.value_field!r} is not a number: {raw!r}"))
                return
            what, value = "reading", float(raw)
        event_type = payload.get(self.type_field)
        if what != "reading" and not isinstance(event_type, str):
            outputs.append(self._side(RESULT_REJECTED, source, seq, ref_ts_us, REASON_NO_EVENT_TYPE,
                                      f"payload field {self.type_field!r} is not a string"))
            return
        if what != "reading" and event_type not in self.types:
            return  # the engine would ignore it: not worth its place in the state
        item = _Input(ref_ts_us, 0 if what == ENDPOINT_START else 1, self.arrivals, what, source, seq,
                      event_type if isinstance(event_type, str) else "", start_ts_us, payload,
                      None if interval_id is None else str(interval_id), value)
        self.arrivals += 1
        if self.hold:
            self.held.append(item)
        else:
            self._feed(item, outputs)

    def _feed(self, item: _Input, outputs: list[Output]) -> None:
        """One input to the engine (through the pairer or the point operator); its records to ``outputs``."""
        try:
            items = self._items(item)
        except IntervalError as exc:
            reading = item.what == "reading"
            outputs.append(self._side(RESULT_TOO_LATE if reading else RESULT_REJECTED, item.source_id, item.seq,
                                      item.ref_ts_us, REASON_READING_OUT_OF_ORDER if reading else REASON_BAD_ENDPOINT,
                                      str(exc)))
            return
        for engine_item in items:
            for out in self.engine.on_item(engine_item):
                if out.kind == "too_late":  # only ever about the item just fed
                    outputs.append(self._side(
                        RESULT_TOO_LATE, item.source_id, item.seq, item.ref_ts_us, REASON_BEHIND_CLOCK,
                        f"item time {_item_time(engine_item)} < engine clock {out.emitted_at_us} minus "
                        f"K {self.engine.config.k_slack_us}", cause=_item_dict(engine_item)))
                else:
                    outputs.append(self._record(out))

    def _items(self, item: _Input) -> list[Interval | IntervalBegin]:
        if item.what == "interval":
            return [Interval(item.event_type, item.start_ts_us, item.ref_ts_us, item.attrs,
                             f"{item.source_id}:{item.seq}")]
        pair_id = f"{item.source_id}#{item.interval_id}"
        if item.what == ENDPOINT_START:
            self.open_ends.pop(pair_id, None)
            return self.pairer.start(item.event_type, pair_id, item.ref_ts_us, item.attrs)
        if item.what == ENDPOINT_END:
            items = self.pairer.end(item.event_type, pair_id, item.ref_ts_us, item.attrs)
            if not items:
                self.open_ends[pair_id] = (item.source_id, item.seq, item.ref_ts_us)
            return items
        op = self.points.get(item.source_id)
        if op is None:
            op = self.points[item.source_id] = PointToIntervalOperator(item.source_id, self.levels)
        assert item.value is not None
        # The operator numbers a source's levels "<source>:<n>"; "~" keeps them apart from events' "<source>:<seq>".
        return [dataclasses.replace(i, event_id=f"{item.source_id}~{(i.event_id or '').rsplit(':', 1)[-1]}")
                for i in op.on_reading(item.ref_ts_us, item.value)]

    # -- records -----------------------------------------------------------------------------------------------
    def _record(self, output: IntervalOutput) -> Output:
        # One key per result: its retract / add compensations carry the same key (a compacted topic keeps the last).
        key = result_key(self.stream, *(m.event_id for m in output.members))
        return key, contract_result_value(
            JOB_NAME, RECORD_OF_OUTPUT[output.kind], self.stream, mode=self.mode,
            aliases=list(self.query.positives), members=[m.to_dict() for m in output.members],
            start_ts_us=min(m.start_ts_us for m in output.members),
            end_ts_us=max(m.end_ts_us for m in output.members), emitted_at_us=output.emitted_at_us,
            cause=None if output.cause is None else _item_dict(output.cause))

    def _side(self, record: str, source_id: str, seq: int | None, ref_ts_us: int, reason: str, detail: str,
              cause: dict[str, Any] | None = None) -> Output:
        return side_record(JOB_NAME, self.stream, record, source_id, seq, ref_ts_us, reason, detail, item=cause)


def _item_time(item: Interval | IntervalBegin) -> int:
    return item.start_ts_us if isinstance(item, IntervalBegin) else item.end_ts_us


def _item_dict(item: Interval | IntervalBegin) -> dict[str, Any]:
    return {"item": "begin" if isinstance(item, IntervalBegin) else "interval", **item.to_dict()}


def key_groups_plan(query: IntervalQuery, options: IseqOptions) -> tuple[int, str]:
    """G for the job and why: the query's equality key spread over ``options.key_groups``, or one group when it is
    not given, when there is no key, when the query negates, or with K-ISlack.

    Without negation and with inputs held until the stream's promise, a key group's engine gives exactly the
    records the stream's one engine gives for its keys: every input is fed in item-time order, so the engine's
    CLOCK at an input is max(the promise before its batch, the input's time) in both, and a result is emitted
    when its last member arrives, with that CLOCK. One group unless asked: an interval sent as endpoints is
    paired within its group, so with G > 1 both its endpoints must carry the key."""
    # An open negating interval's attributes are not trusted before its end (docs/intervals.md), so it holds
    # results of every key; and a held result is released by the next input of any key, at that CLOCK.
    negation = "one key group per stream: a negated element holds and releases results across keys"
    k_islack = "one key group per stream: K-ISlack judges an input late by the largest item time of the stream"
    return equality_key_groups_plan(options.key_groups, iseq_partition_key(query),
                                    [(bool(query.negatives), negation), (options.k_slack_us is not None, k_islack)],
                                    not_given="one key group per stream: --key-groups not given")


def iseq_key_groups(query: IntervalQuery, options: IseqOptions, groups: int) -> KeyGroups | None:
    """The routing of a keyed query's events over ``groups`` key groups (None: one group).

    An event is routed by the key attribute of its type in its payload (an endpoint by its own payload; a type
    outside the query by no key: the core skips it). With ``from_points``, a reading goes by its source: its level
    intervals carry ``{"source": <source_id>}``, so the source is their key when the class names ``source`` for
    their type, and they match nothing otherwise; and a source's readings must reach one point operator. A record
    the routing takes for a reading that the core does not (a numeric string, say: Spark's cast to double, which
    the JVM routing of earlier builds read it by) is rejected by the core wherever it goes."""
    key = iseq_partition_key(query)
    if key is None or groups < 2:
        return None
    events = TypedKey(options.type_field, dict(key.attribute_of_type))
    if options.from_points is None:
        return KeyGroups(groups, events)
    return KeyGroups(groups, ReadingsBySource(options.from_points, events))


def start(spark: Any, options: IseqOptions) -> Any:
    """Start the streaming query; returns it (call awaitTermination / stop on it)."""
    query = check_options(options)
    config = engine_config(options)

    def factory(stream: str, blob: bytes | None) -> IseqStreamCore:
        return IseqStreamCore(stream, query, config, options, blob)

    return start_cep_job(spark, JOB_NAME, options, factory, ISEQ_COLUMNS, key_groups_plan(query, options),
                         lambda groups: iseq_key_groups(query, options, groups))
