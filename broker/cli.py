"""`skewless setup` and `skewless kafka start|stop|status|topics`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from broker.cluster import ClusterConfigError, ensure_partitions
from broker.jars import ensure_kafka_jars, ensure_spark_jars
from broker.launcher import KafkaBroker
from contract.topics import TopicNames

kafka_app = typer.Typer(no_args_is_help=True, help="Run a local single-node Apache Kafka broker (KRaft).")

WorkDir = Annotated[Path | None, typer.Option("--dir", help="Broker state/data directory (default: cache/kafka).")]


@kafka_app.command("start")
def kafka_start(
    work_dir: WorkDir = None,
    port: Annotated[int | None, typer.Option(help="Client port on 127.0.0.1 (default: a free one).")] = None,
) -> None:
    """Format storage, start the broker in the background and wait until it answers. The gateways create their
    topics (with one partition per shard) when they start."""
    state = KafkaBroker(work_dir, port=port).start()
    typer.echo(state.bootstrap_servers)


@kafka_app.command("stop")
def kafka_stop(work_dir: WorkDir = None) -> None:
    """Stop the broker cleanly (SIGTERM, then SIGKILL after 30 s)."""
    stopped = KafkaBroker(work_dir).stop()
    typer.echo("stopped" if stopped else "not running")


@kafka_app.command("status")
def kafka_status(work_dir: WorkDir = None) -> None:
    """Print the bootstrap address if the broker runs; exit 1 if not."""
    state = KafkaBroker(work_dir).running_state()
    if state is None:
        typer.echo("not running")
        raise typer.Exit(1)
    typer.echo(f"running pid={state.pid} bootstrap={state.bootstrap_servers}")


@kafka_app.command("topics")
def kafka_topics(
    streams: Annotated[list[str], typer.Argument(help="Stream names whose events/late topics to create.")],
    bootstrap: Annotated[str, typer.Option(help="Bootstrap servers.")] = "127.0.0.1:9092",
    prefix: Annotated[str, typer.Option(help="Topic prefix.")] = "skewless",
    shards: Annotated[int, typer.Option(help="The deployment's shard count: one partition per shard.", min=1)] = 1,
) -> None:
    """Create the events and late topics of the given streams, one partition per shard (docs/cluster.md)."""
    names = TopicNames(prefix)
    try:
        ensure_partitions(bootstrap, [t for s in streams for t in (names.events(s), names.late(s))], shards)
    except ClusterConfigError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def setup() -> None:
    """Fetch the Kafka broker and Spark Kafka-connector jars from Maven Central (idempotent)."""
    typer.echo(f"kafka jars: {ensure_kafka_jars()}")
    typer.echo(f"spark connector jars: {ensure_spark_jars()}")


def register(app: typer.Typer) -> None:
    app.add_typer(kafka_app, name="kafka")
    app.command("setup")(setup)
