"""`skewless spark ...`: run the Structured Streaming jobs."""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer

from broker.cli import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    KafkaConfigFile,
    KafkaProperties,
    Prefix,
    check_streams_exist,
    kafka_client_config,
    parse_kafka_properties,
    probe_kafka,
    validate_streams,
)
from contract.units import duration_parser
from spark_jobs import iseq as iseq_job
from spark_jobs import pattern as pattern_job
from spark_jobs import sequence as sequence_job
from spark_jobs import three_window, window_count
from spark_jobs.session import SHUFFLE_PARTITIONS_ENV, create_spark_session, stop_spark
from spark_jobs.stateful import JobOptions, remove_temporary_checkpoints

if TYPE_CHECKING:
    from cep.sase import Query

# rich_markup_mode=None and no pretty exceptions also under spark-submit (spark_jobs/submit.py runs this app alone).
spark_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, pretty_exceptions_enable=False,
                        help="PySpark Structured Streaming jobs over the ordered stream.")

_UNIT_REQUIRED = duration_parser(None)
_MS = duration_parser("ms")

SparkKafkaProperties = Annotated[list[str] | None, typer.Option(
    "--spark-kafka-property", metavar="KEY=VALUE",
    help="A property of Spark's Kafka source and sink (Kafka's Java client: sasl.jaas.config, "
         "ssl.truststore.location, ...), repeatable. --kafka-property and [kafka] are librdkafka's (the job's own "
         "clients); their security.protocol and sasl.mechanism reach Spark's client too.")]
ReplicationFactor = Annotated[int | None, typer.Option(
    min=1, help="Replicas of the results topic the job creates (default: min(3, brokers in the cluster)).")]
Streams = Annotated[list[str] | None, typer.Option("--stream", help="Stream(s) to read (default: every stream).")]
AllowedLateness = Annotated[int, typer.Option(
    "--allowed-lateness", metavar="DURATION", parser=_UNIT_REQUIRED, show_default="1h",
    help="How long (reference time) released results stay correctable by late events; later ones are too_late.")]
Checkpoint = Annotated[str | None, typer.Option(help="Checkpoint directory (default: a fresh temporary one).")]
AvailableNow = Annotated[bool, typer.Option(help="Process what is in Kafka now, then stop.")]
TaUs = Annotated[int | None, typer.Option(
    metavar="DURATION", parser=duration_parser("us"),
    help="Thesis mode T_a, e.g. 20ms; a bare number is microseconds (default: max round trip over the stream's "
         "sources, read live).")]
ShufflePartitions = Annotated[int | None, typer.Option(
    min=1, envvar=SHUFFLE_PARTITIONS_ENV,
    help="spark.sql.shuffle.partitions: tasks of the stateful operator (default: 2 in local mode, the spark-submit "
         "conf or Spark's default on a cluster). Fixed in the checkpoint once the query first ran.")]


ONE_HOUR_US = 3_600_000_000
# Properties both Kafka clients name alike (spark_jobs.contract reads the same pair).
_SHARED_PROPERTIES = ("security.protocol", "sasl.mechanism")


def _kafka_session_conf(bootstrap: str, config_file: Path | None, kafka_property: list[str] | None,
                        spark_kafka_property: list[str] | None, replication_factor: int | None, prefix: str,
                        streams: tuple[str, ...]) -> dict[str, str]:
    """Check Kafka is reachable with these settings and every named stream has its events topic (one line if not,
    before Spark starts: a misspelled stream would otherwise read nothing and exit 0), then return the session
    conf that carries them to the job: spark.skewless.librdkafka.* for the job's own confluent-kafka clients,
    spark.skewless.kafka.* for Spark's Kafka source and sink (spark_jobs.contract)."""
    from spark_jobs.contract import REPLICATION_FACTOR_CONF, kafka_conf

    client = kafka_client_config(bootstrap, config_file, kafka_property)
    probe_kafka(client)
    check_streams_exist(client, prefix, streams)
    java = {k: str(v) for k, v in client.settings.items() if k in _SHARED_PROPERTIES}
    java.update(parse_kafka_properties(spark_kafka_property or ()))
    conf = kafka_conf(java, dict(client.settings))
    if replication_factor is not None:
        conf[REPLICATION_FACTOR_CONF] = str(replication_factor)
    return conf


def _session(name: str, shuffle_partitions: int | None, bootstrap: str, config_file: Path | None,
             kafka_property: list[str] | None, spark_kafka_property: list[str] | None,
             replication_factor: int | None, prefix: str, stream: list[str] | None) -> Any:
    """The job's Spark session, carrying the Kafka settings once they are checked (:func:`_kafka_session_conf`)."""
    conf = _kafka_session_conf(bootstrap, config_file, kafka_property, spark_kafka_property,
                               replication_factor, prefix, _streams(stream))
    return create_spark_session(name, shuffle_partitions=shuffle_partitions, extra_conf=conf)


def _streams(stream: list[str] | None) -> tuple[str, ...]:
    return tuple(validate_streams(stream or (), "'--stream'"))


_Options = TypeVar("_Options", bound=JobOptions)


@dataclass(frozen=True)
class JobCommandArgs:
    """The options every job command takes, written once: :func:`_job_command` adds them to each command."""

    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP
    prefix: Prefix = "skewless"
    stream: Streams = None
    checkpoint: Checkpoint = None
    available_now: AvailableNow = False
    shuffle_partitions: ShufflePartitions = None
    config_file: KafkaConfigFile = None
    kafka_property: KafkaProperties = None
    spark_kafka_property: SparkKafkaProperties = None
    replication_factor: ReplicationFactor = None

    def options(self, kind: type[_Options], **own: Any) -> _Options:
        """The job's options (``kind``): these, the stream names checked, and the job's ``own``."""
        return kind(self.bootstrap, topic_prefix=self.prefix, streams=_streams(self.stream),
                    checkpoint_dir=self.checkpoint, available_now=self.available_now, **own)

    def session(self, name: str) -> Any:
        """The job's Spark session named ``name`` (:func:`_session`)."""
        return _session(name, self.shuffle_partitions, self.bootstrap, self.config_file, self.kafka_property,
                        self.spark_kafka_property, self.replication_factor, self.prefix, self.stream)


# --help lists these after a command's required options, before its other ones; the rest of JobCommandArgs last.
_LEADING_ARGS = ("bootstrap", "prefix", "stream")


def _job_command(name: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register ``body(job: JobCommandArgs, **own)`` as the job command ``name``, taking the body's own options and
    every job's (:class:`JobCommandArgs`). The body is returned as it is."""
    hints = typing.get_type_hints(JobCommandArgs, include_extras=True)
    shared = {f.name: inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                        annotation=hints[f.name]) for f in dataclasses.fields(JobCommandArgs)}

    def register(body: Callable[..., None]) -> Callable[..., None]:
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
               for p in list(inspect.signature(body, eval_str=True).parameters.values())[1:]]
        required = [p for p in own if p.default is inspect.Parameter.empty]
        leading = [shared[n] for n in _LEADING_ARGS]
        optional = [p for p in own if p.default is not inspect.Parameter.empty]
        rest = [p for n, p in shared.items() if n not in _LEADING_ARGS]
        params = [*required, *leading, *optional, *rest]

        def command(**values: Any) -> None:
            body(JobCommandArgs(**{n: values.pop(n) for n in shared}), **values)

        # typer reads a command's options from its signature and type hints.
        command.__signature__ = inspect.Signature(params, return_annotation=None)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        command.__doc__ = body.__doc__
        spark_app.command(name)(command)
        return body

    return register


@_job_command("window-count")
def window_count_command(
    job: JobCommandArgs,
    window_us: Annotated[int, typer.Option(
        "--window", metavar="DURATION", parser=_UNIT_REQUIRED, show_default="1s",
        help="Tumbling window length, e.g. 1s or 500ms.")] = 1_000_000,
    allowed_lateness_us: AllowedLateness = ONE_HOUR_US,
) -> None:
    """Count events per stream in tumbling event-time windows, exactly; corrections for late events."""
    options = job.options(window_count.WindowCountOptions, width_us=window_us, allowed_lateness_us=allowed_lateness_us)
    spark = job.session("skewless-window-count")
    _run(spark, window_count.start(spark, options))


def _run(spark: object, query: object) -> None:
    try:
        query.awaitTermination()  # type: ignore[attr-defined]
    finally:
        try:
            query.stop()  # type: ignore[attr-defined]
            stop_spark(spark)
        finally:
            remove_temporary_checkpoints()


@_job_command("three-window")
def three_window_command(
    job: JobCommandArgs,
    width_us: Annotated[int, typer.Option(
        "--width-ms", metavar="DURATION", parser=_MS, show_default="1000",
        help="Window length w, e.g. 1s; a bare number is milliseconds.")] = 1_000_000,
    slide_us: Annotated[int | None, typer.Option(
        "--slide-ms", metavar="DURATION", parser=_MS,
        help="Slide: sliding windows (default: tumbling); a bare number is milliseconds.")] = None,
    value_field: Annotated[str, typer.Option(help="Payload field aggregated (count/sum/avg/min/max).")] = "value",
    emit_early: Annotated[bool, typer.Option(
        help="Release each window type when it closes instead of all three at t + T_a/2 + w (Query 4.4).")] = False,
    mode: Annotated[Literal["per_event", "thesis"], typer.Option(
        help="per_event: shift by each event's uncertainty_us; thesis: shift by T_a/2.")] = "per_event",
    ta_us: TaUs = None,
    max_shift_us: Annotated[int, typer.Option(
        "--max-shift-ms", metavar="DURATION", parser=_MS, show_default="50",
        help="per_event mode: the largest shift HIGH windows wait for; a bare number is milliseconds.")] = 50_000,
    allowed_lateness_us: AllowedLateness = ONE_HOUR_US,
) -> None:
    """LOW/MIDDLE/HIGH windows per stream and their average (thesis 3.2.3.1): skewless.results.three_window."""
    spark = job.session("skewless-three-window")
    query = three_window.start(spark, job.options(
        three_window.ThreeWindowOptions, width_us=width_us, slide_us=slide_us, value_field=value_field,
        emit_early=emit_early, shift_mode="thesis" if mode == "thesis" else "per_event", ta_us=ta_us,
        max_shift_us=max_shift_us, allowed_lateness_us=allowed_lateness_us))
    _run(spark, query)


@_job_command("pattern")
def pattern_command(
    job: JobCommandArgs,
    pattern: Annotated[str, typer.Option(help="e.g. \"SEQ(kick: kind == 'kick', goal: kind == 'goal') "
                                              "PARTITION BY team WITHIN 2 s\" (docs/cep.md).")],
    ta_us: TaUs = None,
    allowed_lateness_us: AllowedLateness = ONE_HOUR_US,
    key_groups: Annotated[int | None, typer.Option(
        min=1, help="Key groups per stream: the PARTITION BY key spread over this many Spark groups (default: "
                    "spark.sql.shuffle.partitions; one group without PARTITION BY, or in thesis mode without "
                    "--ta-us). Fixed in the checkpoint.")] = None,
) -> None:
    """Confirmed/Uncertain sequence patterns under clock uncertainty; results to skewless.results.pattern."""
    from cep.patterns import PatternSpec

    try:
        PatternSpec.parse(pattern)
    except ValueError as exc:
        # One line: a condition's syntax error shows its column there (its caret lines follow).
        raise typer.BadParameter(str(exc).splitlines()[0], param_hint="'--pattern'") from None
    spark = job.session("skewless-pattern")
    query = pattern_job.start(spark, job.options(
        pattern_job.PatternOptions, pattern=pattern, ta_us=ta_us, allowed_lateness_us=allowed_lateness_us,
        key_groups=key_groups))
    _run(spark, query)


_SequenceKeyGroups = Annotated[int | None, typer.Option(
    min=1, help="Key groups per stream: the query's equality key (a.id = b.id = ...) spread over this many Spark "
                "groups (default 1; one group also without a key, with --k-slack-ms, aggressive mode or "
                "--constraint). A record's emitted_at is then its group's CLOCK. Fixed in the checkpoint.")]


@_job_command("sequence")
def sequence_command(
    job: JobCommandArgs,
    query: Annotated[str, typer.Option(help="e.g. \"EVENT SEQ(SHELF s, !(CHECKOUT c), EXIT e) WHERE s.id = c.id "
                                            "AND c.id = e.id WITHIN 1 hour\" (docs/sase.md).")],
    type_field: Annotated[str, typer.Option(help="Payload field holding the event type.")] = "type",
    mode: Annotated[Literal["conservative", "aggressive"], typer.Option(
        help="conservative: emit a match once no late event can invalidate it; aggressive: emit at once, then "
             "retract/add compensations.")] = "conservative",
    k_slack_us: Annotated[int | None, typer.Option(
        "--k-slack-ms", metavar="DURATION", parser=_MS,
        help="K-slack bound on disorder; a bare number is milliseconds (default: none, the gateway's punctuations "
             "drive purge and release).")] = None,
    allowed_lateness_us: AllowedLateness = ONE_HOUR_US,
    constraint: Annotated[str | None, typer.Option(
        help="The workflow the stream follows: a regular expression over event types, e.g. \"A+ K* B+ K C+\" "
             "(docs/constraints.md). A trace (partition) that can no longer match is released at once "
             "(monitor_terminated record).")] = None,
    constraint_checker: Annotated[Literal["basic", "lightweight"], typer.Option(
        help="basic (Algorithm 1) or lightweight (Algorithm 2) constraint checking.")] = "lightweight",
    early_alerts: Annotated[bool, typer.Option(
        help="With --constraint: an early_alert record once a match is certain. Sound only if every trace of the "
             "constraint spans less than the query's WITHIN window (your promise).")] = False,
    key_groups: _SequenceKeyGroups = None,
) -> None:
    """SASE sequence queries over the ordered stream; matches and compensations to skewless.results.sequence."""
    from cep.sase import SaseError, parse_query

    try:
        parsed = parse_query(query)
    except SaseError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--query'") from None
    _check_constraint(parsed, constraint, constraint_checker, early_alerts)
    spark = job.session("skewless-sequence")
    started = sequence_job.start(spark, job.options(
        sequence_job.SequenceOptions, query=query, type_field=type_field,
        mode="aggressive" if mode == "aggressive" else "conservative", k_slack_us=k_slack_us,
        allowed_lateness_us=allowed_lateness_us, constraint=constraint, constraint_checker=constraint_checker,
        early_alerts=early_alerts, key_groups=key_groups))
    _run(spark, started)


def _check_constraint(parsed: Query, constraint: str | None, checker: Literal["basic", "lightweight"],
                      early_alerts: bool) -> None:
    """One line naming the option when --constraint does not fit the query, or --early-alerts comes without it."""
    if constraint is not None:
        problem = sequence_job.constraint_problem(parsed, constraint, checker, early_alerts)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint="'--constraint'")
    elif early_alerts:
        raise typer.BadParameter("needs --constraint", param_hint="'--early-alerts'")


@_job_command("iseq")
def iseq_command(
    job: JobCommandArgs,
    query: Annotated[str, typer.Option(help="e.g. \"EVENT ISEQ[a.te < b.ts AND b.te < d.te AND d.ts < c.ts AND "
                                            "b.te < c.ts](A a, B b, !D d, C c; 30 s)\" (docs/intervals.md).")],
    type_field: Annotated[str, typer.Option(help="Payload field holding the event type.")] = "type",
    mode: Annotated[Literal["conservative", "aggressive"], typer.Option(
        help="conservative: emit a result once no later interval can negate it; aggressive: emit at once, then "
             "retract/add compensations.")] = "conservative",
    k_slack_us: Annotated[int | None, typer.Option(
        "--k-slack-ms", metavar="DURATION", parser=_MS,
        help="K-ISlack: feed intervals at once, tolerating K of disorder; a bare number is milliseconds (default: "
             "none, intervals wait for the gateway's punctuations and the engine runs in order, K = 0).")] = None,
    indexing: Annotated[Literal["naive", "ais", "ibp"], typer.Option(
        help="naive, ais (basic indexing, Li's Algorithm 11) or ibp (interval begin punctuation, Algorithm 13).")
    ] = "ais",
    punctuated_type: Annotated[list[str] | None, typer.Option(
        "--punctuated-type", metavar="TYPE",
        help="A type whose intervals always come as endpoints, start first (its begins are IBPs), repeatable.")
    ] = None,
    from_points: Annotated[str | None, typer.Option(
        metavar="FIELD", help="Turn point events with this numeric payload field into level intervals (Li 5.4.2), "
                              "one level sequence per source.")] = None,
    levels: Annotated[str, typer.Option(
        help="Levels for --from-points: names and bounds alternating, LOW,50,MEDIUM,100,HIGH reads "
             "LOW <= 50 < MEDIUM <= 100 < HIGH.")] = "LOW,50,MEDIUM,100,HIGH",
    key_groups: Annotated[int | None, typer.Option(
        min=1, help="Key groups per stream: the query's equality key (a.id = b.id = ...) spread over this many Spark "
                    "groups (default 1; one group also without a key, with a negated element or --k-slack-ms). "
                    "Both endpoints of an interval sent as endpoints must then carry the key. Fixed in the "
                    "checkpoint.")] = None,
) -> None:
    """ISEQ interval queries over the ordered stream; results and compensations to skewless.results.iseq."""
    options = job.options(
        iseq_job.IseqOptions, query=query, type_field=type_field,
        mode="aggressive" if mode == "aggressive" else "conservative", k_slack_us=k_slack_us,
        indexing="naive" if indexing == "naive" else "ibp" if indexing == "ibp" else "ais",
        punctuated_types=tuple(punctuated_type or ()), from_points=from_points, levels=levels, key_groups=key_groups)
    _check_iseq(options)
    spark = job.session("skewless-iseq")
    _run(spark, iseq_job.start(spark, options))


def _check_iseq(options: iseq_job.IseqOptions) -> None:
    """One line naming the option when --levels or the query (with the options it needs) does not hold."""
    from cep.intervals import IntervalError

    try:
        iseq_job.parse_levels(options.levels)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="'--levels'") from None
    try:
        iseq_job.check_options(options)
    except IntervalError as exc:
        # A syntax error's message spans three lines (the text and a caret): the first says what and where.
        raise typer.BadParameter(str(exc).splitlines()[0], param_hint="'--query'") from None


def register(app: typer.Typer) -> None:
    app.add_typer(spark_app, name="spark")
