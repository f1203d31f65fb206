"""The thin Spark shell around the pure CEP cores: one core object per group, driven by Spark's event-time
watermark, persisted as one opaque blob of GroupState.

Every stateful job (three_window, pattern, sequence) is the same loop: restore the group's core from its blob,
feed it this micro-batch's rows in reference-time order, advance it to the watermark, store the blob back and
arm an event-time timer for the core's next release. The cores know nothing of Spark; this module knows nothing
of CEP.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import orjson

from contract.records import EVENT, PUNCTUATION

# Spark-side schemas: every job emits (key, value) JSON records, ready for the Kafka sink.
OUTPUT_SCHEMA = "key string, value string"
STATE_SCHEMA = "blob binary"
# Columns every job hands to its cores (a job may add its own, e.g. a grouping key).
INPUT_COLUMNS = ("kind", "stream", "source_id", "seq", "ref_ts_us", "uncertainty_us", "watermark_us", "payload",
                 "partition", "offset")
PUNCTUATION_KEY = "\x00punctuation"


class GroupCore(Protocol):
    """What the shell needs from a pure core (adapters in each job wrap the cep package's objects)."""

    def on_rows(self, rows: Sequence[Mapping[str, Any]]) -> list[tuple[str, dict[str, Any]]]: ...

    def on_watermark(self, watermark_us: int) -> list[tuple[str, dict[str, Any]]]: ...

    def next_timer_us(self) -> int | None: ...

    def is_empty(self) -> bool: ...

    def snapshot(self) -> bytes: ...


CoreFactory = Callable[[tuple[Any, ...], bytes | None], GroupCore]


class CoreJobOptions(Protocol):
    """The options every core job shares (each job's options dataclass has these fields)."""

    @property
    def bootstrap_servers(self) -> str: ...
    @property
    def topic_prefix(self) -> str: ...
    @property
    def streams(self) -> tuple[str, ...]: ...
    @property
    def watermark_delay(self) -> str: ...
    @property
    def checkpoint_dir(self) -> str | None: ...
    @property
    def available_now(self) -> bool: ...
    @property
    def processing_time(self) -> str: ...
    @property
    def console(self) -> bool: ...


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Reference-time order; ties keep the gateway's release order (the Kafka offset)."""
    return sorted(rows, key=lambda r: (r.get("ref_ts_us") or 0, r.get("partition") or 0, r.get("offset") or 0))


def run_group(core: GroupCore, batches: Iterator[list[dict[str, Any]]], watermark_us: int | None,
              timed_out: bool) -> list[tuple[str, dict[str, Any]]]:
    """One invocation for one group: the Spark-free heart of the shell (unit-tested without Spark).

    Punctuation rows in the group's own batch (three_window groups by stream, so it receives its stream's
    punctuations) advance the core right away: the gateway's promise holds for everything after it in the topic,
    and waiting for Spark's watermark would cost one more micro-batch."""
    outputs: list[tuple[str, dict[str, Any]]] = []
    punctuation_us: int | None = None
    if not timed_out:
        for rows in batches:
            outputs.extend(core.on_rows(sort_rows([r for r in rows if r.get("kind") == EVENT])))
            punctuation_us = _later(punctuation_us, max(
                (int(r["watermark_us"]) for r in rows
                 if r.get("kind") == PUNCTUATION and r.get("watermark_us") is not None), default=None))
    watermark_us = _later(watermark_us, punctuation_us)
    if watermark_us is not None:
        outputs.extend(core.on_watermark(watermark_us))
    return outputs


def _later(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else max(a, b)


def event_frame(frame: Any) -> Any:
    """A micro-batch chunk as the columnar path sees it: events only, in reference-time then Kafka order."""
    events = frame[frame["kind"] == EVENT]
    return events.sort_values(["ref_ts_us", "partition", "offset"], kind="stable")


def make_group_function(factory: CoreFactory) -> Callable[..., Iterator[Any]]:
    """The function for `applyInPandasWithState(..., outputMode="append", timeoutConf=EventTimeTimeout)`."""

    def apply(key: tuple[Any, ...], frames: Iterator[Any], state: Any) -> Iterator[Any]:
        import pandas as pd

        if key and key[0] == PUNCTUATION_KEY:
            # Punctuation rows only move Spark's watermark; their group holds nothing.
            for _ in frames:
                pass
            return
        blob = bytes(state.get[0]) if state.exists else None
        core = factory(key, blob)
        watermark_ms = state.getCurrentWatermarkMs()
        watermark_us = watermark_ms * 1000 if watermark_ms > 0 else None
        on_frame = getattr(core, "on_frame", None)
        if on_frame is not None:
            # Columnar fast path: no per-row dicts (cores that aggregate columns skip most Python work).
            outputs: list[tuple[str, dict[str, Any]]] = []
            if not state.hasTimedOut:
                for frame in frames:
                    outputs.extend(on_frame(event_frame(frame)))
                    promised = frame.loc[frame["kind"] == PUNCTUATION, "watermark_us"].dropna()
                    if len(promised):
                        watermark_us = _later(watermark_us, int(promised.max()))
            if watermark_us is not None:
                outputs.extend(core.on_watermark(watermark_us))
        else:
            batches = (frame.to_dict("records") for frame in frames)
            outputs = run_group(core, batches, watermark_us, timed_out=state.hasTimedOut)
        if core.is_empty():
            state.remove()
        else:
            state.update((core.snapshot(),))
            timer_us = core.next_timer_us()
            if timer_us is not None:
                # Spark fires a timer once the watermark passes it; it must not lie behind the current one.
                state.setTimeoutTimestamp(max(timer_us // 1000 + 1, watermark_ms + 1))
        if outputs:
            yield pd.DataFrame({"key": [k for k, _ in outputs],
                                "value": [orjson.dumps(v).decode() for _, v in outputs]})

    return apply


def read_ordered_stream(spark: Any, bootstrap_servers: str, topics: Sequence[str] | str, watermark_delay: str,
                        starting_offsets: str = "earliest") -> Any:
    """The gateway's ordered events plus its punctuations, with an event-time watermark.

    `event_time` is the reference time (events) or the promised watermark (punctuations), so Spark's watermark
    advances even while a stream is quiet. Given a list of topics, each gets its own Kafka source and watermark and
    Spark keeps the minimum (its default policy): one stream running ahead cannot push another's events behind the
    watermark. A string is a topic pattern read as one source."""
    from pyspark.sql import functions as F

    from spark_jobs.contract import read_events

    def one(pattern: str) -> Any:
        parsed = read_events(spark, bootstrap_servers, pattern, starting_offsets)
        return (
            parsed.where(F.col("kind").isin(EVENT, PUNCTUATION))
            .withColumn("event_time", F.timestamp_micros(F.coalesce(F.col("ref_ts_us"), F.col("watermark_us"))))
            .where(F.col("event_time").isNotNull())
            .withWatermark("event_time", watermark_delay)
        )

    if isinstance(topics, str):
        return one(topics)
    sources = [one(re.escape(topic)) for topic in topics]
    ordered = sources[0]
    for other in sources[1:]:
        ordered = ordered.unionByName(other)
    return ordered


def apply_cores(ordered: Any, key_column: Any, factory: CoreFactory,
                extra_columns: Mapping[str, Any] | None = None, punctuation_key: Any | None = None,
                input_columns: Sequence[str] = INPUT_COLUMNS) -> Any:
    """Group the watermarked stream by `key_column` and run the cores. Punctuations go to `punctuation_key`'s
    group (a job grouped by stream passes the stream, so its cores see them at once) or to an inert group of their
    own; `extra_columns` (name -> Spark column) are computed in the JVM and handed to the cores too, and a job that
    does not need every contract column can ship fewer (`input_columns`) to Python."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming.state import GroupStateTimeout

    punctuation_group = F.lit(PUNCTUATION_KEY) if punctuation_key is None else punctuation_key
    keyed = ordered.withColumn(
        "group_key", F.when(F.col("kind") == PUNCTUATION, punctuation_group).otherwise(key_column))
    # Events without a key (the partition attribute missing) still get a group so they are reported, not lost.
    keyed = keyed.withColumn("group_key", F.coalesce(F.col("group_key"), F.lit("")))
    extras = [column.alias(name) for name, column in (extra_columns or {}).items()]
    return (
        keyed.select("group_key", "event_time", *input_columns, *extras)
        .groupBy("group_key")
        .applyInPandasWithState(make_group_function(factory), OUTPUT_SCHEMA, STATE_SCHEMA, "append",
                                GroupStateTimeout.EventTimeTimeout)
    )


def stream_topics(topic_names: Any, streams: Sequence[str]) -> Sequence[str] | str:
    """The topics a job reads: the named streams' topics, or every events topic (a pattern) if none is named."""
    if not streams:
        return str(topic_names.events_pattern)
    return [str(topic_names.events(s)) for s in streams]


def write_results(results: Any, *, job: str, bootstrap_servers: str, output_topic: str, checkpoint_dir: str,
                  console: bool, available_now: bool, processing_time: str) -> Any:
    """Results to `skewless.results.<job>` (and the console); returns the started query."""

    def write_batch(batch: Any, batch_id: int) -> None:
        if not console:
            (batch.write.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
             .option("topic", output_topic).save())
            return
        # Two actions on one micro-batch would run the stateful operator twice: collect once, write what was seen.
        rows = batch.collect()
        for row in rows:
            print(f"[{job} batch {batch_id}] {row['value']}", flush=True)
        if rows:
            (batch.sparkSession.createDataFrame(rows, OUTPUT_SCHEMA).write.format("kafka")
             .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", output_topic).save())

    writer = (results.writeStream.outputMode("append").foreachBatch(write_batch).queryName(job)
              .option("checkpointLocation", checkpoint_dir))
    writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=processing_time)
    return writer.start()


def start_core_job(spark: Any, job: str, options: CoreJobOptions, key_column: Callable[[], Any],
                   factory: CoreFactory, **apply_options: Any) -> Any:
    """Read the ordered stream(s), run one core per group, write `skewless.results.<job>`; returns the query.
    `key_column` builds the grouping column (called once Spark is up); `apply_options` go to `apply_cores`."""
    import tempfile

    from broker.admin import ensure_topics
    from contract.topics import TopicNames

    topics = TopicNames(options.topic_prefix)
    output_topic = topics.results(job)
    ensure_topics(options.bootstrap_servers, [output_topic])
    ordered = read_ordered_stream(spark, options.bootstrap_servers, stream_topics(topics, options.streams),
                                  options.watermark_delay)
    results = apply_cores(ordered, key_column(), factory, **apply_options)
    checkpoint = options.checkpoint_dir or tempfile.mkdtemp(prefix=f"skewless-{job.replace('_', '-')}-")
    return write_results(results, job=job, bootstrap_servers=options.bootstrap_servers, output_topic=output_topic,
                         checkpoint_dir=checkpoint, console=options.console, available_now=options.available_now,
                         processing_time=options.processing_time)


def decode_payload(payload: str | None) -> dict[str, Any]:
    """Payloads travel as JSON text; a payload that is not a JSON object is reported by the caller."""
    if not payload:
        return {}
    value = orjson.loads(payload)
    if not isinstance(value, dict):
        # A data error the caller reports per event, not a programming error: ValueError, not TypeError.
        raise ValueError(f"payload is not a JSON object: {payload[:80]!r}")  # noqa: TRY004
    return value
