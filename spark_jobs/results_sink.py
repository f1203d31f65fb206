"""The jobs' ``foreachBatch`` results sink: each micro-batch in one Kafka transaction, a replayed one skipped.

The decisions are broker.batch_ledger's, the Kafka IO broker.batch_sink's; this module only hands them Spark's
micro-batches. The transactional id comes from the query's id, which Spark keeps in the checkpoint: found once,
at the first batch, among the session's active queries by the query's name (the job's name; Spark refuses two
active queries of one name in a session).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from broker.batch_ledger import BatchDecision, sink_transactional_id
from broker.batch_sink import SinkRecord, StepHook, TransactionalBatchSink

if TYPE_CHECKING:
    from broker.client import Servers

log = logging.getLogger("skewless.spark")

# Per SparkSession: the open sinks by the run id of their query (a restarted query keeps its id, not its run
# id: the end of the previous run must not close the new run's sink), closed when that run terminates.
_SESSION_ATTRIBUTE = "_skewless_results_sinks"


class ResultsSink:
    """The ``foreachBatch`` function of one job's query."""

    def __init__(self, spark: Any, *, job: str, servers: Servers, output_topic: str, console: bool,
                 fault: StepHook | None = None) -> None:
        self.spark = spark
        self.job = job
        self.servers = servers
        self.output_topic = output_topic
        self.console = console
        self.fault = fault
        self._sink: TransactionalBatchSink | None = None

    def __call__(self, batch: Any, batch_id: int) -> None:
        # One action per micro-batch, also for a replay that is then skipped: each action runs the stateful
        # operator, and running it is what writes the state version of this batch again.
        records = batch_records(batch)
        decision = self._open_sink().write(batch_id, records, on_step=self.fault)
        if not self.console:
            return
        if decision is BatchDecision.SKIP:
            print(f"[{self.job} batch {batch_id}] a replay of a committed batch: its {len(records)} results are on "
                  f"{self.output_topic} already", flush=True)
            return
        for _, value in records:
            print(f"[{self.job} batch {batch_id}] {'(null)' if value is None else value.decode()}", flush=True)

    def _open_sink(self) -> TransactionalBatchSink:
        if self._sink is None:
            query_id, run_id = self._query_ids()
            sink = TransactionalBatchSink(self.servers, self.output_topic,
                                          sink_transactional_id(self.output_topic, query_id))
            _register(self.spark, run_id, sink)
            sink.open()
            self._sink = sink
        return self._sink

    def _query_ids(self) -> tuple[str, str]:
        """(id, run id) of this job's query: the id persists across restarts from the checkpoint."""
        for query in self.spark.streams.active:
            if query.name == self.job:
                return str(query.id), str(query.runId)
        raise RuntimeError(f"no active streaming query named {self.job!r} in this session: the results sink "
                           f"derives its transactional id from the query's id")


def batch_records(batch: Any) -> list[SinkRecord]:
    """A micro-batch's ``(key, value)`` string columns as the records the sink writes: their UTF-8 bytes, a null
    as Kafka's null (no key; a value's null is a tombstone), as Spark's own Kafka sink writes it.

    The JVM casts each column to binary (a Spark string is UTF-8 bytes already: the cast copies them) and hands the
    batch over as Arrow; Python takes each column's values as bytes in one call per column. Collecting Rows instead
    (the JVM pickles each one, Python unpickles it, then ``str(...).encode()`` per value) cost the driver and the
    JVM several times more per result (benchmarks/spark_results_collect.py)."""
    from pyspark.sql import functions as F

    return table_records(batch.select(F.col("key").cast("binary").alias("key"),
                                      F.col("value").cast("binary").alias("value")).toArrow())


def table_records(table: Any) -> list[SinkRecord]:
    """The rows of an Arrow table's ``key`` and ``value`` columns (binary or string) as ``(key, value)`` bytes,
    in the table's order; a null stays None."""
    return list(zip(_utf8_values(table.column("key")), _utf8_values(table.column("value")), strict=True))


def _utf8_values(column: Any) -> list[bytes | None]:
    import pyarrow as pa

    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary() if pa.types.is_large_string(column.type) else pa.binary())
    # Arrow's conversion to a NumPy object array makes the bytes objects in C++; ``to_pylist`` would build an Arrow
    # scalar per value first (6x slower per value, measured).
    # A null comes out as None.
    values: list[bytes | None] = column.to_numpy(zero_copy_only=False).tolist()
    return values


def _register(spark: Any, run_id: str, sink: TransactionalBatchSink) -> None:
    sinks: dict[str, TransactionalBatchSink] | None = getattr(spark, _SESSION_ATTRIBUTE, None)
    if sinks is None:
        sinks = {}
        setattr(spark, _SESSION_ATTRIBUTE, sinks)
        spark.streams.addListener(_listener(sinks))
    sinks[run_id] = sink


def _listener(sinks: dict[str, TransactionalBatchSink]) -> Any:
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class SinkCloser(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            pass

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            # A producer per ended query would keep its broker connections (and log their loss) until exit.
            sink = sinks.pop(str(event.runId), None)
            if sink is not None:
                sink.close()

    return SinkCloser()
