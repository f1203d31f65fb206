"""Spark's own zips keep their directory in a Python worker: pyspark's worker calls ``importlib.invalidate_caches()``
at the start of every task (it may just have put a task's ``--py-files`` on ``sys.path``), and on Python 3.11 that
makes every zip importer re-read its archive's directory. A worker has ``$SPARK_HOME/python/lib/pyspark.zip``
(1,220 files) and Spark's core jar on its path: about 0.1 CPU second per task, every micro-batch, per shuffle partition
(docs/spark-benchmark.md, where a job's CPU goes). Those zips belong to the Spark installation the worker runs from
and do not change while it lives, so their importers keep their directory; every other importer (a task's
``--py-files``) is invalidated as before.

Done by the jobs' state function on every call in a worker process (pyspark reuses a worker for later tasks; its
daemon and worker module cannot be ours: pyspark runs only modules named ``pyspark...`` there).
"""

from __future__ import annotations

import os
import sys
import zipimport
from pathlib import Path
from typing import Any


def _keep_directory() -> None:
    """Nothing to re-read: the archive does not change while the worker lives."""


def keep_spark_zip_directories(path_importer_cache: dict[str, Any], spark_home: str | None) -> list[str]:
    """Make every zip importer of Spark's own archives (``$SPARK_HOME/python/lib/*.zip`` and ``$SPARK_HOME/jars/*``:
    Spark puts its core jar on the workers' path too; one importer per package imported from a zip, each re-reading
    the whole archive's directory) ignore ``invalidate_caches``; returns the path entries of those it changed now.
    Not the rest of ``$SPARK_HOME``: a standalone worker keeps the tasks' files in ``$SPARK_HOME/work``."""
    if not spark_home:
        return []
    spark_dirs = (Path(spark_home, "python", "lib"), Path(spark_home, "jars"))
    kept = []
    for entry, importer in list(path_importer_cache.items()):
        if (isinstance(importer, zipimport.zipimporter) and vars(importer).get("invalidate_caches") is None
                and Path(importer.archive).parent in spark_dirs):
            importer.invalidate_caches = _keep_directory  # type: ignore[method-assign]
            kept.append(entry)
    return kept


def keep_spark_zip_directories_of_this_worker() -> None:
    """:func:`keep_spark_zip_directories` for this process (cheap: a walk over the importer cache; a package
    imported since the last call has a new importer)."""
    keep_spark_zip_directories(sys.path_importer_cache, os.environ.get("SPARK_HOME"))
