"""`skewless setup` and `skewless kafka start|stop|status|topics`: fetch the jars, run a local broker, create
topics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.admin import TopicConfigError
from broker.cli import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CommandError,
    KafkaConfigFile,
    KafkaProperties,
    Prefix,
    kafka_client_config,
    probe_kafka,
    validate_streams,
)
from broker.cluster import ClusterConfigError, ensure_partitions
from broker.jars import JarFetchError, ensure_kafka_jars, ensure_spark_jars
from broker.launcher import KafkaBroker
from contract.topics import TopicNames
from skewless.cli_common import DURATION_BARE_MS

__all__ = ["register"]

DEFAULT_KAFKA_PORT = 9092

kafka_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Run a local single-node Apache Kafka broker (KRaft); create topics.")

WorkDir = Annotated[Path | None, typer.Option("--dir", help="Broker state/data directory (default: .cache/kafka).")]


@kafka_app.command("start")
def kafka_start(
    work_dir: WorkDir = None,
    port: Annotated[int, typer.Option(min=0, max=65535, help="Client port on 127.0.0.1; 0 = any free port.")]
    = DEFAULT_KAFKA_PORT,
    group_min_session_timeout_ms: Annotated[int | None, typer.Option(
        "--group-min-session-timeout", metavar="DURATION", parser=DURATION_BARE_MS,
        help="The broker's group.min.session.timeout.ms, e.g. 1s: the shortest session_timeout_s a gateway may "
             "use (a bare number is milliseconds) [Kafka's 6s].")] = None,
) -> None:
    """Format storage, start the broker in the background and wait until it answers; prints its bootstrap address.
    The gateways create their topics (one partition per shard) when they start."""
    try:
        state = KafkaBroker(work_dir, port=port or None,
                            group_min_session_timeout_ms=(None if group_min_session_timeout_ms is None
                                                          else group_min_session_timeout_ms // 1000)).start()
    except JarFetchError as exc:
        raise CommandError(_first_line(exc)) from None
    typer.echo(state.bootstrap_servers)


@kafka_app.command("stop")
def kafka_stop(work_dir: WorkDir = None) -> None:
    """Stop the broker cleanly (SIGTERM, then SIGKILL after 30 s)."""
    stopped = KafkaBroker(work_dir).stop()
    typer.echo("stopped" if stopped else "not running")


@kafka_app.command("status")
def kafka_status(work_dir: WorkDir = None) -> None:
    """Print `running pid=PID bootstrap=HOST:PORT` if the broker of --dir runs; `not running` and exit 1 if
    not (`skewless kafka start` prints the bare address)."""
    state = KafkaBroker(work_dir).running_state()
    if state is None:
        typer.echo("not running")
        raise typer.Exit(1)
    typer.echo(f"running pid={state.pid} bootstrap={state.bootstrap_servers}")


@kafka_app.command("topics")
def kafka_topics(
    streams: Annotated[list[str], typer.Argument(help="Stream names whose events/late topics to create.")],
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    prefix: Prefix = "skewless",
    partitions: Annotated[int, typer.Option(
        "--partitions", "--shards", min=1,
        help="Partitions of each topic = the deployment's shard count (docs/cluster.md).")] = 1,
    replication_factor: Annotated[int | None, typer.Option(
        min=1, help="Replicas of each topic (default: min(3, brokers in the cluster)).")] = None,
    config_file: KafkaConfigFile = None,
    kafka_property: KafkaProperties = None,
) -> None:
    """Create the events and late topics of the given streams, one partition per shard (docs/cluster.md)."""
    names = TopicNames(prefix)
    checked = validate_streams(streams, "'STREAMS...'")
    client = kafka_client_config(bootstrap, config_file, kafka_property)
    probe_kafka(client)
    try:
        ensure_partitions(client, [t for s in checked for t in (names.events(s), names.late(s))], partitions,
                          replication_factor=replication_factor)
    except (ClusterConfigError, TopicConfigError) as exc:
        raise CommandError(str(exc), 2) from None


def _first_line(exc: Exception) -> str:
    """A multi-line failure (mvn's output) as one line: its headline and the last line of detail."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if len(lines) > 1:
        return f"{lines[0]} {lines[-1]}"
    return lines[0] if lines else type(exc).__name__


def setup() -> None:
    """Fetch the Kafka broker and Spark Kafka-connector jars from Maven Central (idempotent)."""
    try:
        typer.echo(f"kafka jars: {ensure_kafka_jars()}")
        typer.echo(f"spark connector jars: {ensure_spark_jars()}")
    except JarFetchError as exc:
        raise CommandError(_first_line(exc)) from None


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")
    app.command("setup")(setup)
