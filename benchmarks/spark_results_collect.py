"""How the results sink takes a micro-batch's (key, value) rows from Spark, side by side on one local session.

Each way turns a DataFrame of N (string key, string value) rows (cached, so every way reads the same in-memory
rows) into the ``(key bytes, value bytes)`` records the Kafka sink writes; CPU is measured per process (the JVM from
/proc, this driver process by ``time.process_time``) and per row, the ways interleaved round by round:

* ``rows``: ``collect()`` (the JVM pickles Rows, Python unpickles them) then ``str(...).encode()`` per row (the sink
  before issue 27's change);
* ``arrow_str``: ``toArrow()`` of the string columns, then ``to_pylist`` and ``encode`` per value;
* ``arrow_binary``: the columns cast to binary in the JVM (UTF-8 bytes as they are), ``toArrow()``, ``to_pylist``
  gives the bytes (spark_jobs.results_sink.batch_records).

Run: ``.venv/bin/python -m benchmarks.spark_results_collect --rows 200000 --rounds 3``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness.processes import CLK_TCK, stat_cpu_ticks

Records = list[tuple[bytes, bytes]]


def jvm_cpu_s(pid: int) -> float:
    """User + system CPU of a process (all its threads), from /proc."""
    return stat_cpu_ticks(Path(f"/proc/{pid}/stat").read_text()) / CLK_TCK


def rows_way(batch: Any) -> Records:
    return [(str(row["key"]).encode(), str(row["value"]).encode()) for row in batch.collect()]


def arrow_str_way(frame: Any) -> Records:
    table = frame.toArrow()
    return [(k.encode(), v.encode()) for k, v in zip(table.column("key").to_pylist(),
                                                     table.column("value").to_pylist(), strict=True)]


def arrow_binary_way(frame: Any) -> Records:
    from spark_jobs.results_sink import batch_records

    return batch_records(frame)


WAYS: dict[str, Callable[[Any], Records]] = {"rows": rows_way, "arrow_str": arrow_str_way,
                                             "arrow_binary": arrow_binary_way}


def result_frame(spark: Any, rows: int) -> Any:
    """Keys and values shaped like the pattern job's: a key of ~40 characters, a JSON value of ~250 (some of it
    not ASCII)."""
    from pyspark.sql import functions as F

    ids = spark.range(rows, numPartitions=2)
    key = F.concat(F.lit("a|match|A-B-C|sensor-"), (F.col("id") % 997).cast("string"), F.lit("|"),
                   F.col("id").cast("string"))
    value = F.concat(F.lit('{"job":"pattern","kind":"match","stream":"a","key":"sensor-'),
                     (F.col("id") % 997).cast("string"),
                     F.lit('","events":[{"source_id":"s\u00e9nsor-1","seq":'), F.col("id").cast("string"),
                     F.lit(',"ref_ts_us":1700000000000000},{"source_id":"\u6e29\u5ea6","seq":'),
                     (F.col("id") + 1).cast("string"),
                     F.lit(',"ref_ts_us":1700000000000100}],"probability":0.8125,"late":false,"revision":0}'))
    frame = ids.select(key.alias("key"), value.alias("value")).cache()
    frame.count()
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from spark_jobs.session import create_spark_session, stop_spark

    spark = create_spark_session("bench-results-collect")
    try:
        frame = result_frame(spark, args.rows)
        jvm = spark.sparkContext._gateway.proc.pid
        expected = rows_way(frame)
        for way in WAYS.values():  # warm: JIT, and every way gives the same records
            if sorted(way(frame)) != sorted(expected):
                raise AssertionError(f"{way.__name__} gives other records")
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in WAYS}
        for _ in range(args.rounds):
            for name, way in WAYS.items():
                jvm0, driver0, wall0 = jvm_cpu_s(jvm), time.process_time(), time.perf_counter()
                way(frame)
                figures[name].append(((jvm_cpu_s(jvm) - jvm0) * 1e6 / args.rows,
                                      (time.process_time() - driver0) * 1e6 / args.rows,
                                      (time.perf_counter() - wall0) * 1e6 / args.rows))
        print(f"{args.rows:,} rows, {args.rounds} rounds, 1-minute load {os.getloadavg()[0]:.1f}; us/row "
              "median [min-max]")
        print("| way | JVM CPU | driver CPU | JVM + driver | wall |\n|---|---:|---:|---:|---:|")
        for name, runs in figures.items():
            columns = [[r[0] for r in runs], [r[1] for r in runs], [r[0] + r[1] for r in runs], [r[2] for r in runs]]
            print(f"| {name} | " + " | ".join(f"{statistics.median(c):.1f} [{min(c):.1f}-{max(c):.1f}]"
                                              for c in columns) + " |")
    finally:
        stop_spark(spark)


if __name__ == "__main__":
    main()
