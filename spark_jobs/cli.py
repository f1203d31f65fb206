"""`skewless spark ...`: run the Structured Streaming jobs."""

from __future__ import annotations

from typing import Annotated

import typer

from contract.units import DurationError, parse_duration_us
from spark_jobs import pattern as pattern_job
from spark_jobs import sequence as sequence_job
from spark_jobs import three_window, window_count
from spark_jobs.session import SHUFFLE_PARTITIONS_ENV, create_spark_session, stop_spark

spark_app = typer.Typer(no_args_is_help=True, help="PySpark Structured Streaming jobs over the ordered stream.")


Bootstrap = Annotated[str, typer.Option(help="Kafka bootstrap servers.", envvar="SKEWLESS_BOOTSTRAP")]
Prefix = Annotated[str, typer.Option(help="Topic prefix.")]
Streams = Annotated[list[str] | None, typer.Option("--stream", help="Stream(s) to read (default: every stream).")]
AllowedLateness = Annotated[str, typer.Option(
    help="How long (reference time) released results stay correctable by late events; later ones are too_late.")]
Checkpoint = Annotated[str | None, typer.Option(help="Checkpoint directory (default: a fresh temporary one).")]
AvailableNow = Annotated[bool, typer.Option(help="Process what is in Kafka now, then stop.")]
TaUs = Annotated[int | None, typer.Option(
    help="Thesis mode T_a in microseconds (default: max round trip over the stream's sources, read live).")]
ShufflePartitions = Annotated[int | None, typer.Option(
    min=1, envvar=SHUFFLE_PARTITIONS_ENV,
    help="spark.sql.shuffle.partitions: tasks of the stateful operator (default: 2 in local mode, the spark-submit "
         "conf or Spark's default on a cluster). Fixed in the checkpoint once the query first ran.")]


def _duration_us(text: str, option: str) -> int:
    try:
        return parse_duration_us(text, require_unit=True)
    except DurationError as exc:
        raise typer.BadParameter(str(exc), param_hint=option) from exc


@spark_app.command("window-count")
def window_count_command(
    bootstrap: Bootstrap = "127.0.0.1:9092",
    prefix: Prefix = "skewless",
    stream: Streams = None,
    window: Annotated[str, typer.Option(help="Tumbling window length, e.g. \"1 s\" or \"500 ms\".")] = "1 s",
    allowed_lateness: AllowedLateness = "1 hour",
    checkpoint: Checkpoint = None,
    available_now: AvailableNow = False,
    shuffle_partitions: ShufflePartitions = None,
) -> None:
    """Count events per stream in tumbling event-time windows, exactly; corrections for late events."""
    lateness_us = _duration_us(allowed_lateness, "--allowed-lateness")
    options = window_count.WindowCountOptions(
        bootstrap_servers=bootstrap, topic_prefix=prefix, streams=tuple(stream or ()),
        width_us=_duration_us(window, "--window"),
        allowed_lateness_us=lateness_us,
        checkpoint_dir=checkpoint, available_now=available_now)
    spark = create_spark_session("skewless-window-count", shuffle_partitions=shuffle_partitions)
    _run(spark, window_count.start(spark, options))


def _run(spark: object, query: object) -> None:
    try:
        query.awaitTermination()  # type: ignore[attr-defined]
    finally:
        query.stop()  # type: ignore[attr-defined]
        stop_spark(spark)


@spark_app.command("three-window")
def three_window_command(
    bootstrap: Bootstrap = "127.0.0.1:9092",
    prefix: Prefix = "skewless",
    stream: Streams = None,
    width_ms: Annotated[int, typer.Option(help="Window length w in milliseconds.")] = 1000,
    slide_ms: Annotated[int | None, typer.Option(help="Slide in milliseconds: sliding windows (default: tumbling).")]
    = None,
    value_field: Annotated[str, typer.Option(help="Payload field aggregated (count/sum/avg/min/max).")] = "value",
    emit_early: Annotated[bool, typer.Option(
        help="Release each window type when it closes instead of all three at t + T_a/2 + w (Query 4.4).")] = False,
    mode: Annotated[str, typer.Option(
        help="per_event: shift by each event's uncertainty_us; thesis: shift by T_a/2.")] = "per_event",
    ta_us: TaUs = None,
    max_shift_ms: Annotated[int, typer.Option(help="per_event mode: the largest shift HIGH windows wait for.")] = 50,
    allowed_lateness: AllowedLateness = "1 hour",
    checkpoint: Checkpoint = None,
    available_now: AvailableNow = False,
    shuffle_partitions: ShufflePartitions = None,
) -> None:
    """LOW/MIDDLE/HIGH windows per stream and their average (thesis 3.2.3.1): skewless.results.three_window."""
    if mode not in ("per_event", "thesis"):
        raise typer.BadParameter("mode must be per_event or thesis", param_hint="--mode")
    lateness_us = _duration_us(allowed_lateness, "--allowed-lateness")  # before Spark starts
    spark = create_spark_session("skewless-three-window", shuffle_partitions=shuffle_partitions)
    query = three_window.start(spark, three_window.ThreeWindowOptions(
        bootstrap_servers=bootstrap, topic_prefix=prefix, streams=tuple(stream or ()), width_us=width_ms * 1000,
        slide_us=None if slide_ms is None else slide_ms * 1000, value_field=value_field, emit_early=emit_early,
        shift_mode="thesis" if mode == "thesis" else "per_event", ta_us=ta_us, max_shift_us=max_shift_ms * 1000,
        allowed_lateness_us=lateness_us, checkpoint_dir=checkpoint,
        available_now=available_now))
    _run(spark, query)


@spark_app.command("pattern")
def pattern_command(
    pattern: Annotated[str, typer.Option(help="e.g. \"SEQ(kick: kind == 'kick', goal: kind == 'goal') "
                                              "PARTITION BY team WITHIN 2 s\" (docs/cep.md).")],
    bootstrap: Bootstrap = "127.0.0.1:9092",
    prefix: Prefix = "skewless",
    stream: Streams = None,
    ta_us: TaUs = None,
    allowed_lateness: AllowedLateness = "1 hour",
    checkpoint: Checkpoint = None,
    available_now: AvailableNow = False,
    shuffle_partitions: ShufflePartitions = None,
) -> None:
    """Confirmed/Uncertain sequence patterns under clock uncertainty; results to skewless.results.pattern."""
    from cep.patterns import PatternSpec

    try:
        PatternSpec.parse(pattern)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--pattern") from exc
    lateness_us = _duration_us(allowed_lateness, "--allowed-lateness")  # before Spark starts
    spark = create_spark_session("skewless-pattern", shuffle_partitions=shuffle_partitions)
    query = pattern_job.start(spark, pattern_job.PatternOptions(
        bootstrap_servers=bootstrap, pattern=pattern, topic_prefix=prefix, streams=tuple(stream or ()), ta_us=ta_us,
        allowed_lateness_us=lateness_us, checkpoint_dir=checkpoint,
        available_now=available_now))
    _run(spark, query)


@spark_app.command("sequence")
def sequence_command(
    query: Annotated[str, typer.Option(help="e.g. \"EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id "
                                            "AND c.id = e.id WITHIN 1 hour\" (docs/sase.md).")],
    bootstrap: Bootstrap = "127.0.0.1:9092",
    prefix: Prefix = "skewless",
    stream: Streams = None,
    type_field: Annotated[str, typer.Option(help="Payload field holding the event type.")] = "type",
    mode: Annotated[str, typer.Option(
        help="conservative: emit a match once no late event can invalidate it; aggressive: emit at once, then "
             "retract/add compensations.")] = "conservative",
    k_slack_ms: Annotated[int | None, typer.Option(
        help="K-slack bound on disorder (default: none, the gateway's punctuations drive purge and release).")]
    = None,
    allowed_lateness: AllowedLateness = "1 hour",
    checkpoint: Checkpoint = None,
    available_now: AvailableNow = False,
    shuffle_partitions: ShufflePartitions = None,
) -> None:
    """SASE sequence queries over the ordered stream; matches and compensations to skewless.results.sequence."""
    from cep.sase import SaseError, parse_query

    try:
        parse_query(query)
    except SaseError as exc:
        raise typer.BadParameter(str(exc), param_hint="--query") from exc
    if mode not in ("conservative", "aggressive"):
        raise typer.BadParameter("mode must be conservative or aggressive", param_hint="--mode")
    lateness_us = _duration_us(allowed_lateness, "--allowed-lateness")  # before Spark starts
    spark = create_spark_session("skewless-sequence", shuffle_partitions=shuffle_partitions)
    started = sequence_job.start(spark, sequence_job.SequenceOptions(
        bootstrap_servers=bootstrap, query=query, topic_prefix=prefix, streams=tuple(stream or ()),
        type_field=type_field, mode="aggressive" if mode == "aggressive" else "conservative",
        k_slack_us=None if k_slack_ms is None else k_slack_ms * 1000,
        allowed_lateness_us=lateness_us, checkpoint_dir=checkpoint,
        available_now=available_now))
    _run(spark, started)


def register(app: typer.Typer) -> None:
    app.add_typer(spark_app, name="spark")
