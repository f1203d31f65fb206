"""The per-key state benchmark's bookkeeping (benchmarks/spark_per_key_state.py): the state operator's metrics
summed over micro-batches as Spark reports them (the HDFS store's size, RocksDB's), and the table it prints."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from benchmarks.spark_per_key_state import state_metrics, summary


def progress(updates_ms: int, rows: int, custom: dict[str, int], memory: int) -> dict[str, Any]:
    return {"stateOperators": [{"allUpdatesTimeMs": updates_ms, "commitTimeMs": 10, "numRowsUpdated": rows,
                                "numRowsRemoved": 0, "memoryUsedBytes": memory, "customMetrics": custom}]}


def test_metrics_sum_the_batches_and_keep_the_last_size() -> None:
    rocksdb = SimpleNamespace(recentProgress=[
        progress(100, 3, {"rocksdbPutCount": 3, "rocksdbTotalBytesWritten": 1_000, "rocksdbSstFileSize": 500}, 7),
        progress(50, 2, {"rocksdbPutCount": 2, "rocksdbTotalBytesWritten": 400, "rocksdbSstFileSize": 800}, 9)])
    assert state_metrics(rocksdb) == {
        "allUpdatesTimeMs": 150.0, "commitTimeMs": 20.0, "numRowsUpdated": 5.0, "numRowsRemoved": 0.0,
        "rocksdbPutCount": 5.0, "rocksdbTotalBytesWritten": 1_400.0, "rocksdbBytesCopied": 0.0,
        "state_bytes": 800.0, "memoryUsedBytes": 9.0}
    hdfs = SimpleNamespace(recentProgress=[progress(5, 1, {"stateOnCurrentVersionSizeBytes": 1_234}, 1)])
    assert state_metrics(hdfs)["state_bytes"] == 1_234.0
    assert state_metrics(hdfs)["rocksdbPutCount"] == 0.0


def test_summary_gives_the_best_round_and_every_round() -> None:
    def figures(cpu: float) -> dict[str, float]:
        return {"cpu_us": cpu, "jvm_us": cpu / 2, "python_us": cpu / 4, "driver_us": cpu / 4, "state_bytes": 2e6,
                "allUpdatesTimeMs": 30.0, "commitTimeMs": 4.0}

    table = summary({"rounds": {"blob_hdfs": [figures(300.0), figures(200.0)]}, "loads": [1.0, 3.0, 2.0]})
    assert "| blob_hdfs | 200.0 | 300.0, 200.0 | 100.0 / 50.0 / 50.0 | 2.0 | 30 + 4 |" in table.splitlines()
    assert table.endswith("load average 1.0-3.0 (median 2.0)")
