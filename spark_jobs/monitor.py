"""Spark's own late-row filter, watched: ``numRowsDroppedByWatermark`` from every query progress.

The jobs declare no Spark watermark (spark_jobs/stateful.py says why), so the count is 0 by construction. A job
that declares one (a user's own job started with :func:`watch_watermark_drops`, or a regression) would lose rows
silently: the count only shows in the query progress. Here each non-zero count becomes an ERROR log line, a
counter, and a ``dropped_by_watermark`` record on the job's results topic.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson

from contract.records import RESULT_DROPPED_BY_WATERMARK, result_key, result_value

if TYPE_CHECKING:
    from broker.client import Servers

logger = logging.getLogger("skewless.spark")

def dropped_by_watermark(progress: Mapping[str, Any]) -> int:
    """Rows Spark's stateful operators dropped as late in one query progress (its JSON form)."""
    return sum(int(op.get("numRowsDroppedByWatermark") or 0) for op in progress.get("stateOperators") or ())

class WatermarkDropReport:
    """Turns progresses into result records (pure: the listener below only feeds it and sends what it returns)."""

    def __init__(self, job: str) -> None:
        self.job = job
        self.dropped_total = 0

    def on_progress(self, progress: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | None:
        dropped = dropped_by_watermark(progress)
        if dropped == 0:
            return None
        self.dropped_total += dropped
        batch_id = progress.get("batchId")
        return result_key("*", RESULT_DROPPED_BY_WATERMARK, progress.get("id"), batch_id), result_value(
            self.job, RESULT_DROPPED_BY_WATERMARK, "*", query_id=progress.get("id"), batch_id=batch_id,
            rows=dropped, dropped_total=self.dropped_total,
            reason="Spark's late-row filter dropped rows behind its event-time watermark")


class _Watched:
    """One watched query: its report and where its records go."""

    def __init__(self, job: str, bootstrap_servers: Servers, output_topic: str) -> None:
        self.report = WatermarkDropReport(job)
        self.bootstrap_servers = bootstrap_servers
        self.output_topic = output_topic
        # Made on the first drop only: a producer per job that never sends would hold a connection for nothing.
        self.producer: Any = None

    def on_progress(self, progress: Mapping[str, Any]) -> None:
        got = self.report.on_progress(progress)
        if got is None:
            return
        key, value = got
        logger.error("%s: %s rows dropped by Spark's watermark in batch %s (total %s)", self.report.job,
                     value["rows"], value["batch_id"], value["dropped_total"])
        if self.producer is None:
            from broker.client import KafkaClientConfig

            self.producer = KafkaClientConfig.of(self.bootstrap_servers).producer()
        self.producer.produce(self.output_topic, key=key.encode(), value=orjson.dumps(value))
        self.producer.flush(30)


_SESSION_ATTRIBUTE = "_skewless_watched_queries"


def watch_watermark_drops(spark: Any, query: Any, *, job: str, bootstrap_servers: Servers,
                          output_topic: str) -> WatermarkDropReport:
    """Report ``query``'s watermark drops (log, counter, result record) for as long as it runs.
    ``bootstrap_servers``: the address, or the whole client configuration (spark_jobs.contract.kafka_client_config:
    the job's ``spark.skewless.librdkafka.*`` settings, security included).

    One listener per session serves every watched query: each listener costs a Python callback per progress of
    every query of the session."""
    watched: dict[str, _Watched] | None = getattr(spark, _SESSION_ATTRIBUTE, None)
    if watched is None:
        watched = {}
        setattr(spark, _SESSION_ATTRIBUTE, watched)
        spark.streams.addListener(_listener(watched))
    entry = watched[str(query.id)] = _Watched(job, bootstrap_servers, output_topic)
    return entry.report


def _listener(watched: dict[str, _Watched]) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class DropListener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            progress = orjson.loads(event.progress.json)
            entry = watched.get(str(progress.get("id")))
            if entry is not None:
                entry.on_progress(progress)

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            # A restarted query keeps its id: the next start registers it again.
            watched.pop(str(event.id), None)

    return DropListener()
