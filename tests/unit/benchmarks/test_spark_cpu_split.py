"""The CPU split's attribution rules (benchmarks/spark_cpu_split.py): which JVM samples are the results' collect
and which the state rows' pickling, and how the driver's py-spy samples are shared out."""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks.spark_cpu_split import (
    DRIVER_CATEGORIES,
    GENERIC_DRIVER,
    GENERIC_JVM,
    JVM_CATEGORIES,
    PICKLE_TO_STATE,
    jvm_sample_category,
    pyspy_split,
    results_sink_way,
)

SPECIFIC = [(name, re.compile(pattern)) for name, pattern in JVM_CATEGORIES]
GENERIC = [(name, re.compile(pattern)) for name, pattern in GENERIC_JVM]
PICKLING = ["net.razorvine.pickle.PickleUtils.rawStringFromBytes", "net.razorvine.pickle.Pickler.save",
            "org.apache.spark.sql.execution.python.EvaluatePython$RowPickler.pickle"]


def test_pickling_on_a_serve_thread_is_the_results_collect() -> None:
    assert jvm_sample_category(PICKLING, "serve-DataFrame", SPECIFIC, GENERIC) == JVM_CATEGORIES[0][0]


def test_pickling_in_an_executor_task_is_the_state_rows() -> None:
    thread = "Executor task launch worker for task 0.0 in stage 3.0 (TID 6)"
    assert jvm_sample_category(PICKLING, thread, SPECIFIC, GENERIC) == PICKLE_TO_STATE


def test_other_samples_keep_their_category_on_any_thread() -> None:
    frames = ["org.apache.arrow.vector.VarCharVector.set", "org.apache.spark.sql.execution.arrow.ArrowWriter.write"]
    assert jvm_sample_category(frames, "serve-DataFrame", SPECIFIC, GENERIC) == "Arrow (rows to Arrow batches and back)"
    assert jvm_sample_category(["java.util.HashMap.get"], "main", SPECIFIC, GENERIC) == "JDK, Scala, other"


def test_driver_samples_by_category(tmp_path: Path) -> None:
    raw = tmp_path / "driver.txt"
    raw.write_text(
        "<module> (bench.py:1);__call__ (spark_jobs/results_sink.py:43);batch_records (spark_jobs/results_sink.py:80);"
        "toArrow (pyspark/sql/pandas/conversion.py:249) 7\n"
        "<module> (bench.py:1);__call__ (spark_jobs/results_sink.py:44);write (broker/batch_sink.py:130) 3\n"
        "run (threading.py:1);_run (benchmarks/harness/processes.py:306) 5\n"
        "run (threading.py:1);wait (py4j/clientserver.py:10) 2\n"
        "run (threading.py:1);wait (threading.py:2) 1\n")
    split = pyspy_split(raw, DRIVER_CATEGORIES, GENERIC_DRIVER, None)
    assert split["samples"] == 18
    assert split["categories"] == {DRIVER_CATEGORIES[0][0]: 7, DRIVER_CATEGORIES[2][0]: 5,
                                   DRIVER_CATEGORIES[1][0]: 3, GENERIC_DRIVER[0][0]: 2, GENERIC_DRIVER[2][0]: 1}


def test_a_rows_job_runs_its_job_with_the_row_path_and_puts_the_arrow_path_back() -> None:
    from benchmarks.spark_results_collect import rows_way
    from spark_jobs import results_sink

    arrow_way = results_sink.batch_records
    with results_sink_way("pattern@rows") as job:
        assert job == "pattern"
        assert results_sink.batch_records is rows_way
    assert results_sink.batch_records is arrow_way
    with results_sink_way("pattern") as job:
        assert job == "pattern"
        assert results_sink.batch_records is arrow_way
