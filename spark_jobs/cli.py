"""`skewless spark ...`: run the Structured Streaming jobs."""

from __future__ import annotations

from typing import Annotated

import typer

from spark_jobs import window_count
from spark_jobs.session import create_spark_session, stop_spark

spark_app = typer.Typer(no_args_is_help=True, help="PySpark Structured Streaming jobs over the ordered stream.")


@spark_app.command("window-count")
def window_count_command(
    bootstrap: Annotated[str, typer.Option(help="Kafka bootstrap servers.", envvar="SKEWLESS_BOOTSTRAP")]
    = "127.0.0.1:9092",
    prefix: Annotated[str, typer.Option(help="Topic prefix.")] = "skewless",
    window: Annotated[str, typer.Option(help="Tumbling window length (Spark interval).")] = "1 second",
    watermark: Annotated[str, typer.Option(help="Watermark delay (Spark interval).")] = "2 seconds",
    checkpoint: Annotated[str | None, typer.Option(help="Checkpoint directory.")] = None,
    available_now: Annotated[bool, typer.Option(help="Process what is in Kafka now, then stop.")] = False,
) -> None:
    """Count events per stream in tumbling event-time windows; print them and publish to the results topic."""
    spark = create_spark_session("skewless-window-count")
    query = window_count.start(spark, window_count.WindowCountOptions(
        bootstrap_servers=bootstrap, topic_prefix=prefix, window=window, watermark=watermark,
        checkpoint_dir=checkpoint, available_now=available_now))
    try:
        query.awaitTermination()
    finally:
        query.stop()
        stop_spark(spark)


def register(app: typer.Typer) -> None:
    app.add_typer(spark_app, name="spark")
