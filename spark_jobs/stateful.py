"""The thin Spark shell around the pure CEP cores: one core per stream, driven by the gateway's own promises.

Why not Spark's event-time watermark: Spark keeps one watermark per query, the maximum event time a source has
read minus a fixed delay, and its stateful operators drop every row behind it before any core sees it. The
gateway's promise is per stream and per partition ("no event below watermark_us follows in this partition"), and
a stream may legally carry an event below an earlier event's reference time (a source that timed out and came
back above the watermark). No single delay makes Spark's watermark equal to that promise, so Spark's late-row
filter would drop data the gateway delivered. The jobs therefore declare no Spark watermark at all: nothing is
ever dropped by Spark (``numRowsDroppedByWatermark`` stays 0, and :mod:`spark_jobs.monitor` turns any non-zero
count into a logged, counted result record), and each stream's core advances with exactly its stream's promise:

    W(stream) = min over the partitions p of the stream's events topic of the latest punctuation of p

(None until every partition has punctuated). The promise is exact because Kafka hands each partition over in
offset order and a punctuation covers everything after it in its partition: once the rows of a micro-batch are
in, no event below ``W`` can follow in any partition. One stream lagging another holds back only itself.

Every job (window_count, three_window, pattern, sequence, iseq) is the same loop, run by Spark per stream and
micro-batch: restore the stream's progress and core from the group state, feed the core the batch's events (the
events topic and the late topic, in reference-time order), advance it to ``W``, store both back. The cores know
nothing of Spark; :func:`run_stream_batch` is the Spark-free heart, unit-tested without Spark.

T_a (thesis MaxDelay, Eq. 3.16) per stream is read from the records themselves: every event carries the round
trip of the clock estimate that mapped it (``rtt_us``); T_a is the maximum over the stream's sources of the latest
one. It follows re-syncs while the job runs and, read from the data, is the same when a batch is replayed.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import msgpack
import orjson

from contract.records import EVENT, PUNCTUATION, RESULT_REJECTED, result_key, result_value
from spark_jobs.key_routing import KEY_GROUP, KeyGroups, route_record_batches
from spark_jobs.record_columns import json_text, record_columns
from spark_jobs.worker_imports import keep_spark_zip_directories_of_this_worker

if TYPE_CHECKING:
    from broker.client import Servers

# Spark-side schemas: every job emits (key, value) JSON records, ready for the Kafka sink.
OUTPUT_SCHEMA = "key string, value string"
STATE_SCHEMA = "blob binary"
# Columns every job hands to its cores (a job may add its own, e.g. a grouping key).
INPUT_COLUMNS = ("kind", "stream", "source_id", "seq", "ref_ts_us", "uncertainty_us", "watermark_us", "rtt_us",
                 "late", "late_reason", "payload", "topic", "partition", "offset")
# The columns the shell itself reads (grouping, order, promises, T_a, where a rejected record is): a core adds its own.
SHELL_COLUMNS = ("kind", "stream", "source_id", "seq", "ref_ts_us", "watermark_us", "rtt_us", "topic", "partition",
                 "offset")
# Kafka's columns that travel with every record: where it is in Kafka (not parsed from its value).
KAFKA_COLUMNS = ("topic", "partition", "offset")
# The raw Kafka value (bytes) the Python worker parses (spark_jobs.record_columns).
RECORD_VALUE = "value"
# The stream of no stream: a value that is not a contract record (no stream) is reported under it, never fed to a
# core (and rows of a topic that is no stream's are grouped under it).
UNPARSED_GROUP = ""
# A micro-batch reads at most this many Kafka records: a backlog is worked off in bounded steps.
DEFAULT_MAX_OFFSETS_PER_TRIGGER = 200_000
_STATE_VERSION = 1

Output = tuple[str, dict[str, Any]]


class StreamCore(Protocol):
    """What the shell needs from a pure core (adapters in each job wrap the cep package's objects)."""

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[Output]:
        """Events of the stream, on time and late, in reference-time order."""
        ...

    def on_watermark(self, watermark_us: int) -> list[Output]: ...

    def set_ta_us(self, ta_us: int) -> None: ...

    def snapshot(self) -> bytes: ...


CoreFactory = Callable[[str, bytes | None], StreamCore]


@dataclass
class StreamReadProgress:
    """The stream's promise and clock facts, as far as the job has read them."""

    partitions: int
    """Partitions of the stream's events topic: each one's punctuations bound the stream's watermark (0: not known
    yet, the topic does not exist; nothing is promised then)."""
    events_topic: str = ""
    """The stream's events topic: only its punctuations are promises ("" in tests: any topic)."""
    promised_us: dict[int, int] = field(default_factory=dict)
    """Latest punctuation per partition."""
    rtt_us: dict[str, int] = field(default_factory=dict)
    """Latest clock round trip per source (from its events' ``rtt_us``)."""
    key_groups: int = 1
    """G the state was made with: a key's state lives in the group G routed it to, so G is fixed by the
    checkpoint (a restart with another G is refused, not silently re-routed)."""

    def observe_punctuation(self, partition: int, watermark_us: int) -> None:
        if 0 < self.partitions <= partition:
            # A partition the job did not know of (the topic grew): it has punctuated, so it exists.
            self.partitions = partition + 1
        if watermark_us > self.promised_us.get(partition, watermark_us - 1):
            self.promised_us[partition] = watermark_us

    @property
    def watermark_us(self) -> int | None:
        """min over every partition of its latest punctuation; None while one has not punctuated yet."""
        if self.partitions == 0 or len(self.promised_us) < self.partitions:
            return None
        return min(self.promised_us.values())

    @property
    def ta_us(self) -> int:
        return max(self.rtt_us.values(), default=0)

    def to_blob(self, core_blob: bytes) -> bytes:
        packed: bytes = msgpack.packb({
            "v": _STATE_VERSION, "partitions": self.partitions, "events_topic": self.events_topic,
            "promised_us": self.promised_us,
            "rtt_us": self.rtt_us, "key_groups": self.key_groups, "core": core_blob}, use_bin_type=True)
        return packed

    @classmethod
    def from_blob(cls, blob: bytes) -> tuple[StreamReadProgress, bytes]:
        state = msgpack.unpackb(blob, raw=False, strict_map_key=False)
        if state.get("v") != _STATE_VERSION:
            raise ValueError(f"unsupported stream state version {state.get('v')!r}")
        progress = cls(state["partitions"], state["events_topic"],
                       {int(p): w for p, w in state["promised_us"].items()}, dict(state["rtt_us"]),
                       int(state.get("key_groups", 1)))
        return progress, bytes(state["core"])


def _int_or_none(value: Any) -> int | None:
    # Arrow hands integer columns with nulls to pandas as floats (NaN for null).
    if value is None or value != value:  # noqa: PLR0124 - NaN is the only value unequal to itself
        return None
    return int(value)


# Integer contract columns: a batch mixing events and punctuations reaches pandas with them as floats, and a result
# record must carry ``"seq": 3``, not ``3.0``.
_INT_COLUMNS = ("seq", "ref_ts_us", "uncertainty_us", "watermark_us", "rtt_us", "partition", "offset")


def run_stream_batch(progress: StreamReadProgress, core: StreamCore, rows: Sequence[Mapping[str, Any]],
                     *, job: str, stream: str) -> list[Output]:
    """One micro-batch of one stream given as rows (tests, small inputs): see :func:`run_stream_columns`."""
    return run_stream_columns(progress, core, columns_of_rows(rows), job=job, stream=stream)


def columns_of_rows(rows: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """Rows as columns (every key any row has; a row without it holds None), integer columns normalized."""
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    columns = {name: [row.get(name) for row in rows] for name in names}
    for name in _INT_COLUMNS:
        if name in columns:
            columns[name] = [_int_or_none(v) for v in columns[name]]
    return columns


def columns_of_frames(frames: Iterable[Any]) -> dict[str, list[Any]]:
    """Spark's pandas chunks of one group as Python columns: one C-level ``tolist`` per column instead of a dict
    per row (``DataFrame.to_dict("records")`` was most of the shell's time per event). An integer column that
    Arrow turned into floats (it has nulls: events and punctuations mixed) becomes ints and None again."""
    import pandas as pd

    chunks = list(frames)
    frame = chunks[0] if len(chunks) == 1 else pd.concat(chunks, ignore_index=True)
    columns: dict[str, list[Any]] = {}
    for name in frame.columns:
        series = frame[name]
        values = series.tolist()
        if name in _INT_COLUMNS and series.dtype.kind not in "iu":
            values = [_int_or_none(v) for v in values]
        columns[str(name)] = values
    return columns


class MicroBatchColumns:
    """The events of one micro-batch of one stream in reference-time order (ties: topic, partition, offset), as
    columns: a core reads only the columns it needs (:meth:`column`), or rows if it has no columnar path."""

    def __init__(self, columns: Mapping[str, list[Any]], order: Sequence[int]) -> None:
        self._columns = columns
        self._order = order
        self._cache: dict[str, list[Any]] = {}

    def __len__(self) -> int:
        return len(self._order)

    @property
    def names(self) -> list[str]:
        return list(self._columns)

    def column(self, name: str) -> list[Any]:
        """The column in event order (all None if the batch does not have it)."""
        cached = self._cache.get(name)
        if cached is None:
            source = self._columns.get(name)
            cached = [None] * len(self._order) if source is None else [source[i] for i in self._order]
            self._cache[name] = cached
        return cached

    def row(self, index: int) -> dict[str, Any]:
        """Event ``index`` (in event order) as a row: for the rare per-event record (too late, rejected)."""
        at = self._order[index]
        return {name: values[at] for name, values in self._columns.items()}

    def rows(self) -> list[dict[str, Any]]:
        names = self.names
        return [dict(zip(names, values, strict=True)) for values in zip(*(self.column(n) for n in names),
                                                                         strict=True)] if names else []


class ColumnarCore(StreamCore, Protocol):
    """A core that takes a micro-batch's events as columns (:class:`MicroBatchColumns`) instead of rows."""

    def on_events(self, batch: MicroBatchColumns) -> list[Output]: ...


def _sorted_indices(indices: Sequence[int], *keys: list[Any]) -> list[int]:
    """``indices`` ordered by the key columns (first key first); ties keep their order (as ``sorted`` does)."""
    import numpy as np

    if len(indices) < 2:
        return list(indices)
    picked = np.asarray(indices, dtype=np.int64)
    arrays = []
    for key in keys:
        values = [key[i] for i in indices]
        if values and isinstance(next((v for v in values if v is not None), 0), str):
            # Strings (topic names; None sorts as ""): their rank among the batch's few distinct names.
            rank = {name: r for r, name in enumerate(sorted({v or "" for v in values}))}
            arrays.append(np.fromiter((rank[v or ""] for v in values), dtype=np.int64, count=len(values)))
        else:
            arrays.append(np.fromiter((v or 0 for v in values), dtype=np.int64, count=len(values)))
    # lexsort is stable and sorts by its last key first.
    ordered: list[int] = picked[np.lexsort(arrays[::-1])].tolist()
    return ordered


def run_stream_columns(progress: StreamReadProgress, core: StreamCore, columns: Mapping[str, list[Any]],
                       *, job: str, stream: str) -> list[Output]:
    """One micro-batch of one stream: T_a, events in reference-time order, then the stream's promise.

    ``columns`` holds the batch's rows as columns (integer columns as ints or None). Punctuations and rejected
    rows are taken in release order (topic, partition, offset); the events go to the core in reference-time order
    (ties: release order) through ``on_events`` if it has one, else as rows."""
    outputs: list[Output] = []
    kinds = columns.get("kind") or []
    refs = columns.get("ref_ts_us") or [None] * len(kinds)
    topics, partitions, offsets = (columns.get(c) or [None] * len(kinds) for c in ("topic", "partition", "offset"))
    events = [i for i, (kind, ref) in enumerate(zip(kinds, refs, strict=True)) if kind == EVENT and ref is not None]
    if len(events) < len(kinds):
        is_event = set(events)
        others = _sorted_indices([i for i in range(len(kinds)) if i not in is_event], topics, partitions, offsets)
        names = list(columns)
        for i in others:
            row = {name: columns[name][i] for name in names}
            if row.get("kind") == PUNCTUATION:
                watermark, partition = row.get("watermark_us"), row.get("partition")
                if progress.events_topic and row.get("topic") != progress.events_topic:
                    outputs.append(rejected_record(job, stream, row, "misplaced_punctuation",
                                                   f"promises count only on {progress.events_topic}"))
                elif watermark is not None and partition is not None:
                    progress.observe_punctuation(partition, watermark)
                continue
            outputs.append(rejected_record(job, stream, row, "not_an_event",
                                           f"kind {row.get('kind')!r} with ref_ts_us {row.get('ref_ts_us')!r}"))
    ta_before = progress.ta_us
    rtts, sources = columns.get("rtt_us"), columns.get("source_id")
    if rtts is not None and sources is not None:
        with_rtt = [i for i in events if rtts[i] is not None and sources[i] is not None]
        # The latest round trip per source in release order wins.
        for i in _sorted_indices(with_rtt, topics, partitions, offsets):
            progress.rtt_us[str(sources[i])] = rtts[i]
    if progress.ta_us != ta_before:
        core.set_ta_us(progress.ta_us)
    if events:
        batch = MicroBatchColumns(columns, _sorted_indices(events, refs, topics, partitions, offsets))
        on_events = getattr(core, "on_events", None)
        outputs.extend(on_events(batch) if on_events is not None else core.on_rows(batch.rows()))
    watermark = progress.watermark_us
    if watermark is not None:
        outputs.extend(core.on_watermark(watermark))
    return outputs


def rejected_record(job: str, stream: str, row: Mapping[str, Any], reason: str, detail: str) -> Output:
    """A record the job cannot use, reported with where it is in Kafka (never dropped silently)."""
    where = (row.get("topic"), _int_or_none(row.get("partition")), _int_or_none(row.get("offset")))
    return result_key(stream, RESULT_REJECTED, *where), result_value(
        job, RESULT_REJECTED, stream, topic=where[0], partition=where[1], offset=where[2],
        source_id=row.get("source_id"), seq=_int_or_none(row.get("seq")), reason=reason, detail=detail)


class LiveCores:
    """Cores kept alive in a Python worker from one micro-batch to the next, so the next batch of the same stream
    need not restore its core from the state blob (restoring was about half of the state cost of the pattern and
    sequence jobs, whose blobs hold every partition key of a stream: docs/spark-benchmark.md).

    Exact by construction: a kept core is used only if the blob Spark hands the next batch is byte for byte the blob
    that core was snapshotted to (its state is then what restoring that blob would give); a replayed batch, a
    retried task or another worker gets an older or no blob and restores as before. An entry is taken out while a
    batch runs, so a batch that fails half way leaves nothing behind."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self._entries: OrderedDict[tuple[str, str], tuple[bytes, StreamReadProgress, StreamCore]] = OrderedDict()

    def take(self, owner: str, stream: str, blob: bytes | None) -> tuple[StreamReadProgress, StreamCore] | None:
        """The live progress and core whose state is ``blob``, or None (restore from the blob)."""
        entry = self._entries.pop((owner, stream), None)
        if entry is None or blob is None or entry[0] != blob:
            return None
        return entry[1], entry[2]

    def keep(self, owner: str, stream: str, blob: bytes, progress: StreamReadProgress, core: StreamCore) -> None:
        self._entries[(owner, stream)] = (blob, progress, core)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)


# Per Python worker process: Spark reuses its Python workers across tasks (spark.python.worker.reuse, default on).
_LIVE_CORES = LiveCores()


def worker_live_cores() -> LiveCores:
    """This process's kept cores. A module-level function: Spark's pickler ships it by reference, so every task in
    a reused worker reaches the same object (a global named in the shipped closure would travel as a fresh copy)."""
    return _LIVE_CORES


class WorkerCollector:
    """When a Python worker's cyclic garbage collector runs, around each group of a job (never what it collects).

    The kept cores are most of a worker's heap and live from batch to batch; Python's automatic full collections
    walk all of it again and again while a group adds its events (the sequence core in-process: 9.2-14.7 us/event
    with the collector on, 7.0-7.4 off, docs/spark-benchmark.md),
    and pyspark's reused worker runs one more full collection after every task (daemon.py: ``gc.collect()``). So a
    group runs with the automatic collector off; after it, a young collection (the objects made since the last
    freeze, not the kept cores) collects the garbage cycles it made, and the survivors go to the permanent
    generation, where pyspark's collection after the task does not walk them. Every ``full_every``-th group leaves
    them out of it, so that collection collects any garbage among the long-lived objects too.

    The young collection walks every object a group made and kept (the pattern job: 5-8 us/event in-process). One
    that finds no garbage doubles the number of groups until the next (up to ``young_every_max``); the groups in
    between freeze what they made unwalked, and the full collection every ``full_every`` groups collects any cycle
    among it. A young collection that finds garbage brings it back to every group."""

    def __init__(self, full_every: int = 16, young_every_max: int = 8) -> None:
        self.full_every = full_every
        self.young_every_max = young_every_max
        self.groups = 0
        self.young_collections = 0
        self._young_every = 1
        self._since_young = 0
        self._enabled = True

    def before_group(self) -> None:
        gc.unfreeze()
        self._enabled = gc.isenabled()
        gc.disable()

    def after_group(self) -> None:
        if self._enabled:
            gc.enable()
        self._since_young += 1
        if self._since_young >= self._young_every:
            self._since_young = 0
            self.young_collections += 1
            found = gc.collect(1)
            self._young_every = 1 if found else min(2 * self._young_every, self.young_every_max)
        self.groups += 1
        if self.groups % self.full_every:
            gc.freeze()


# Per Python worker process, as _LIVE_CORES.
_COLLECTOR = WorkerCollector()


def worker_collector() -> WorkerCollector:
    """This process's collector policy (a module-level function, as :func:`worker_live_cores`)."""
    return _COLLECTOR


def _restored_core(job: str, stream: str, blob: bytes | None, factory: CoreFactory,
                   key_groups: int) -> tuple[StreamReadProgress, StreamCore]:
    """A group's progress and core from its state blob (a fresh pair without one), when no kept core serves."""
    if blob is None:
        return StreamReadProgress(0, key_groups=key_groups), factory(stream, None)
    progress, core_blob = StreamReadProgress.from_blob(blob)
    if progress.key_groups != key_groups:
        raise ValueError(
            f"{job}: the checkpoint's state of stream {stream!r} was made with {progress.key_groups} "
            f"key group(s), this run has {key_groups}: keep --key-groups {progress.key_groups} or "
            "start from a fresh checkpoint")
    return progress, factory(stream, core_blob)


def _group_records(job: str, stream: str, key_group: int, columns: dict[str, list[Any]],
                   value_columns: Sequence[str]) -> tuple[dict[str, list[Any]], list[Output]]:
    """A group's columns with each raw value parsed (once) into ``value_columns``, without the records that are not
    the stream's, each reported instead: a value that is not a contract record (no ``stream``) as before the
    worker parsed values (``not_a_record``, under no stream), and a record whose ``stream`` names another stream
    than its topic's (``misplaced_record``: the topic's promise does not cover it). A punctuation went to every key
    group: group 0 alone reports it."""
    values = columns.pop(RECORD_VALUE, None)
    if values is not None:
        columns.update(record_columns(values, value_columns))
    streams = columns.get("stream")
    if stream != UNPARSED_GROUP and (streams is None or streams.count(stream) == len(streams)):
        return columns, []
    names = list(columns)
    size = len(columns[names[0]]) if names else 0
    keep = [] if streams is None or stream == UNPARSED_GROUP else [i for i in range(size) if streams[i] == stream]
    kept = set(keep)
    rejected: list[Output] = []
    for i in range(size):
        if i in kept:
            continue
        row = {name: columns[name][i] for name in names}
        if key_group and row.get("kind") == PUNCTUATION:
            continue
        if row.get("stream") is None or stream == UNPARSED_GROUP:
            rejected.append(rejected_record(job, UNPARSED_GROUP, row, "not_a_record",
                                            "not a contract record (no stream)"))
        else:
            rejected.append(rejected_record(job, stream, row, "misplaced_record",
                                            f"stream {row['stream']!r} on {row.get('topic')}, a topic of "
                                            f"stream {stream!r}"))
    return {name: [column[i] for i in keep] for name, column in columns.items()}, rejected


def make_stream_function(job: str, factory: CoreFactory,
                         partitions_of: Callable[[str], tuple[str, int]],
                         live_cores: LiveCores | None = None, key_groups: int = 1,
                         collector_policy: WorkerCollector | None = None,
                         value_columns: Sequence[str] = ()) -> Callable[..., Any]:
    """The function for ``applyInPandasWithState(..., outputMode="append", timeoutConf=NoTimeout)``; the
    grouping key is (stream,) or, with key groups, (stream, key group) of ``key_groups`` per stream. A group's
    rows carry the raw Kafka ``value`` (:func:`read_record_values`), parsed here into the contract columns
    ``value_columns`` (Kafka's columns come as they are); rows that already carry contract columns (tests) are
    taken as they are."""
    # Made on the driver, the same in every task of this query: a kept core is only ever reused by its own query
    # (the factory's options are not in the blob).
    owner = uuid.uuid4().hex
    # The stream and kind always: the worker checks each record's stream against its topic's.
    parsed_columns = tuple(dict.fromkeys(("kind", "stream", *(c for c in value_columns if c not in KAFKA_COLUMNS))))

    def run(key: tuple[Any, ...], frames: Any, state: Any) -> list[Output]:
        stream = str(key[0])
        # The key group (absent: a plan grouped by stream only). Each group of a stream has its own state and core.
        slot = stream if len(key) < 2 else f"{stream}#{int(key[1])}"
        columns, rejected = _group_records(job, stream, 0 if len(key) < 2 else int(key[1]),
                                           columns_of_frames(frames), parsed_columns)
        if stream == UNPARSED_GROUP:
            return rejected
        cores = worker_live_cores() if live_cores is None else live_cores
        blob = bytes(state.get[0]) if state.exists else None
        live = cores.take(owner, slot, blob)
        progress, core = live if live is not None else _restored_core(job, stream, blob, factory, key_groups)
        if progress.partitions == 0:
            # LookupError: only the late topic exists yet; its events are fed, nothing is released until then.
            with contextlib.suppress(LookupError):
                progress.events_topic, progress.partitions = partitions_of(stream)
        outputs = rejected + run_stream_columns(progress, core, columns, job=job, stream=stream)
        blob = progress.to_blob(core.snapshot())
        state.update((blob,))
        cores.keep(owner, slot, blob, progress, core)
        return outputs

    def apply(key: tuple[Any, ...], frames: Any, state: Any) -> Any:
        import pandas as pd

        collector = worker_collector() if collector_policy is None else collector_policy
        collector.before_group()
        keep_spark_zip_directories_of_this_worker()
        try:
            outputs = run(key, frames, state)
            frame = None if not outputs else pd.DataFrame(
                {"key": [k for k, _ in outputs], "value": [orjson.dumps(v).decode() for _, v in outputs]})
        finally:
            collector.after_group()
        if frame is not None:
            yield frame

    return apply


def read_contract_records(spark: Any, bootstrap_servers: str, topics: Sequence[str] | str,
                          starting_offsets: str = "earliest",
                          max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER) -> Any:
    """Events, late and punctuation records of the given topics (a list, or one Java regex) as contract columns,
    with no Spark watermark (see the module docstring)."""
    from pyspark.sql import functions as F

    from spark_jobs.contract import event_schema, read_kafka

    # Committed records only: a fenced gateway's aborted transaction is not part of the stream.
    raw = read_kafka(spark, bootstrap_servers, topics, starting_offsets, max_offsets_per_trigger)
    return raw.select(
        F.from_json(F.col("value").cast("string"), event_schema(), {"mode": "PERMISSIVE"}).alias("e"),
        F.col("topic"), F.col("partition"), F.col("offset"),
    ).select("e.*", "topic", "partition", "offset")


def read_record_values(spark: Any, bootstrap_servers: str, topics: Sequence[str] | str, topic_prefix: str,
                       starting_offsets: str = "earliest",
                       max_offsets_per_trigger: int = DEFAULT_MAX_OFFSETS_PER_TRIGGER) -> Any:
    """The records of the topics as the CEP jobs read them: the raw Kafka ``value`` (parsed once, in the Python
    worker: :mod:`spark_jobs.record_columns`), where it is in Kafka (:data:`KAFKA_COLUMNS`), and the ``stream``
    whose events or late topic it was read from (:func:`topic_stream`: no JSON parse in the JVM). No Spark
    watermark (see the module docstring)."""
    from pyspark.sql import functions as F

    from spark_jobs.contract import read_kafka

    raw = read_kafka(spark, bootstrap_servers, topics, starting_offsets, max_offsets_per_trigger)
    return raw.select(F.col(RECORD_VALUE), *KAFKA_COLUMNS, topic_stream(topic_prefix).alias("stream"))


# Kafka's limit on a topic name's length.
_TOPIC_LENGTH_MAX = 249


def topic_stream(topic_prefix: str) -> Any:
    """Spark column: the stream of the record's topic, ``<prefix>.events.<stream>`` or ``<prefix>.late.<stream>``
    (null for any other topic). The contract puts a stream's records on its own topics, and the stream's promise
    W(stream) covers its events topic only: a record is its topic's stream's (the worker reports one whose
    ``stream`` field names another, :func:`make_stream_function`)."""
    from pyspark.sql import functions as F

    from contract.topics import TopicNames

    names = TopicNames(topic_prefix)
    topic = F.col("topic")
    stream: Any = None
    for prefix in (names.events("x").removesuffix("x"), names.late("x").removesuffix("x")):
        branch = F.substring(topic, len(prefix) + 1, _TOPIC_LENGTH_MAX)
        stream = (F.when(topic.startswith(prefix), branch) if stream is None
                  else stream.when(topic.startswith(prefix), branch))
    return stream


def apply_stream_cores(records: Any, job: str, factory: CoreFactory,
                       partitions_of: Callable[[str], tuple[str, int]],
                       input_columns: Sequence[str] = INPUT_COLUMNS,
                       key_groups: KeyGroups | None = None, events_topic_prefix: str = "") -> Any:
    """Group the records (:func:`read_record_values`) by stream and run the cores. What crosses into Python is each
    record's raw value and where it is in Kafka; the worker parses the value into the contract columns of
    ``input_columns`` (a job that needs fewer parses fewer).

    With ``key_groups`` (G > 1), a stream's records are grouped by (stream, key group) instead: a first Python
    stage (:func:`spark_jobs.key_routing.route_record_batches`, ``mapInArrow``) gives each event the group of its
    key, and every punctuation on ``<events_topic_prefix><stream>`` (the stream's events topic) to every group, so
    each group's core advances with the stream's whole promise W(stream), unchanged. The JVM parses no JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    group_columns = ["group_key"]
    groups = 1 if key_groups is None else key_groups.groups
    if key_groups is not None and groups > 1:
        route = functools.partial(route_record_batches, key_groups=key_groups,
                                  events_topic_prefix=events_topic_prefix, value_column=RECORD_VALUE)
        records = records.select("stream", RECORD_VALUE, *KAFKA_COLUMNS).mapInArrow(route, _ROUTED_SCHEMA)
        group_columns.append(KEY_GROUP)
    keyed = records.withColumn("group_key", F.coalesce(F.col("stream"), F.lit(UNPARSED_GROUP)))
    return (
        keyed.select(*group_columns, RECORD_VALUE, *KAFKA_COLUMNS)
        .groupBy(*group_columns)
        .applyInPandasWithState(make_stream_function(job, factory, partitions_of, key_groups=groups,
                                                     value_columns=input_columns),
                                OUTPUT_SCHEMA, STATE_SCHEMA,
                                "append", GroupStateTimeout.NoTimeout)
    )


# The routing stage's output: the records as read (Kafka's value, topic, partition, offset and the topic's stream)
# and the key group.
_ROUTED_SCHEMA = (f"stream string, {RECORD_VALUE} binary, topic string, partition int, offset long, "
                  f"{KEY_GROUP} int")


def checked_key_groups(requested: int) -> int:
    """``--key-groups`` as asked, refused when below 1 (every job's G goes through here)."""
    if requested < 1:
        raise ValueError(f"key groups must be at least 1, got {requested}")
    return requested


def job_topics(topic_names: Any, streams: Sequence[str]) -> str:
    """What a job reads, as one topic pattern: the named streams' events and late topics, or every one of them.
    A pattern, not a list, even for named streams: a late topic that does not exist yet is not an error."""
    if not streams:
        return str(topic_names.events_and_late_pattern)
    names = "|".join(re.escape(s) for s in streams)
    return f"{re.escape(topic_names.prefix)}\\.(events|late)\\.({names})"


class EventsTopicPartitions:
    """``stream -> (its events topic, that topic's partition count)``, looked up in Kafka once per stream and
    process (executors call it when a stream's state is created)."""

    def __init__(self, bootstrap_servers: Servers, topic_prefix: str) -> None:
        # A KafkaClientConfig (frozen, picklable) carries the job's Kafka settings to the executors.
        self.bootstrap_servers = bootstrap_servers
        self.topic_prefix = topic_prefix
        self._known: dict[str, tuple[str, int]] = {}

    def __call__(self, stream: str) -> tuple[str, int]:
        if stream not in self._known:
            from broker.admin import partition_count
            from contract.topics import TopicNames

            topic = TopicNames(self.topic_prefix).events(stream)
            # LookupError (no such topic yet) propagates uncached: the caller asks again next batch.
            self._known[stream] = (topic, partition_count(self.bootstrap_servers, topic))
        return self._known[stream]


@dataclass(frozen=True)
class JobOptions:
    """The options every core job shares (:func:`start_core_job` reads them): a job's options dataclass derives
    from it and adds its own fields. All but ``bootstrap_servers`` are keyword-only, so a job's own required fields
    (a query) may follow it."""

    bootstrap_servers: str
    _: KW_ONLY
    topic_prefix: str = "skewless"
    streams: tuple[str, ...] = ()
    checkpoint_dir: str | None = None
    available_now: bool = False
    processing_time: str = "1 second"
    console: bool = True


def write_results(results: Any, *, job: str, bootstrap_servers: str, output_topic: str, checkpoint_dir: str,
                  console: bool, available_now: bool, processing_time: str) -> Any:
    """Results to `skewless.results.<job>` (and the console), each micro-batch in one Kafka transaction that
    also records its batch id, so a batch Spark replays after a driver failure is written once
    (spark_jobs.results_sink); returns the started query."""
    from broker.batch_sink import sink_fault_from_env
    from spark_jobs.contract import kafka_client_config
    from spark_jobs.results_sink import ResultsSink

    # Read once, not on every micro-batch (foreachBatch runs on the driver). The sink is a confluent-kafka
    # client: the session's spark.skewless.librdkafka.* settings configure it.
    spark = results.sparkSession
    sink = ResultsSink(spark, job=job, servers=kafka_client_config(spark, bootstrap_servers),
                       output_topic=output_topic, console=console, fault=sink_fault_from_env())
    writer = (results.writeStream.outputMode("append").foreachBatch(sink).queryName(job)
              .option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_time)
    return writer.start()


# Checkpoint directories this process made for runs without --checkpoint: a temporary checkpoint cannot be resumed
# by anyone (its path is random), so it is removed when the job ends, also on Ctrl-C (issue 28 item 4).
_TEMPORARY_CHECKPOINTS: list[str] = []


def temporary_checkpoint(job: str) -> str:
    """A fresh ``skewless-<job>-XXXX`` directory under the temp dir, removed by
    :func:`remove_temporary_checkpoints` (called when the job's query ends, and at interpreter exit: a
    KeyboardInterrupt that unwinds the whole program still runs atexit handlers)."""
    import atexit
    import tempfile

    path = tempfile.mkdtemp(prefix=f"skewless-{job.replace('_', '-')}-")
    if not _TEMPORARY_CHECKPOINTS:
        atexit.register(remove_temporary_checkpoints)
    _TEMPORARY_CHECKPOINTS.append(path)
    return path


def remove_temporary_checkpoints() -> None:
    """Remove every temporary checkpoint made so far. Call it after the query (and its JVM) stopped: a running
    query would write the directory again."""
    import shutil

    while _TEMPORARY_CHECKPOINTS:
        shutil.rmtree(_TEMPORARY_CHECKPOINTS.pop(), ignore_errors=True)


def start_core_job(spark: Any, job: str, options: JobOptions, factory: CoreFactory,
                   **apply_options: Any) -> Any:
    """Read the streams' events and late topics, run one core per stream, write `skewless.results.<job>`;
    returns the query. ``apply_options`` go to :func:`apply_stream_cores`."""
    from broker.admin import ensure_topics
    from contract.topics import TopicNames
    from spark_jobs.contract import kafka_client_config, replication_factor
    from spark_jobs.monitor import watch_watermark_drops

    topics = TopicNames(options.topic_prefix)
    output_topic = topics.results(job)
    # The session's spark.skewless.librdkafka.* settings reach every client of the job (docs/consume.md).
    client = kafka_client_config(spark, options.bootstrap_servers)
    ensure_topics(client, [output_topic], replication_factor=replication_factor(spark))
    records = read_record_values(spark, options.bootstrap_servers, job_topics(topics, options.streams),
                                 options.topic_prefix)
    partitions_of = EventsTopicPartitions(client, options.topic_prefix)
    events_topic_prefix = topics.events("x").removesuffix("x")
    results = apply_stream_cores(records, job, factory, partitions_of, events_topic_prefix=events_topic_prefix,
                                 **apply_options)
    checkpoint = options.checkpoint_dir or temporary_checkpoint(job)
    query = write_results(results, job=job, bootstrap_servers=options.bootstrap_servers, output_topic=output_topic,
                          checkpoint_dir=checkpoint, console=options.console, available_now=options.available_now,
                          processing_time=options.processing_time)
    watch_watermark_drops(spark, query, job=job, bootstrap_servers=client, output_topic=output_topic)
    return query


def decode_payload(payload: Any) -> dict[str, Any]:
    """The payload as an object: as the worker parsed it with its record (:mod:`spark_jobs.record_columns`: a dict,
    or a string, which is JSON text as Spark's payload column was), or as JSON text. Anything but an object is a
    ValueError the caller reports per event."""
    if type(payload) is dict:
        return payload
    if payload is None or payload == "":
        return {}
    if isinstance(payload, str):
        value = orjson.loads(payload)
        if isinstance(value, dict):
            return value
        text = payload
    else:
        text = json_text(payload)
    # A data error the caller reports per event, not a programming error: ValueError, not TypeError.
    raise ValueError(f"payload is not a JSON object: {text[:80]!r}")
