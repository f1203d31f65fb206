"""spark_jobs.worker_imports: the importers of Spark's own zips (the archive's and its packages') keep their
directory on invalidate_caches, every other importer is invalidated as before."""

from __future__ import annotations

import zipfile
import zipimport
from pathlib import Path

from spark_jobs.worker_imports import keep_spark_zip_directories


def _zip(path: Path, module: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{module}.py", "X = 1\n")
        archive.writestr("pkg/__init__.py", "")
    return str(path)


def _add(path: str, name: str) -> None:
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr(name, "X = 2\n")


def test_spark_zips_keep_their_directory_and_a_task_zip_is_re_read(tmp_path: Path) -> None:
    home = tmp_path / "spark"
    spark_zip = _zip(home / "python" / "lib" / "pyspark.zip", "in_spark")
    task_zip = _zip(tmp_path / "task.zip", "in_task")
    jar = _zip(home / "jars" / "spark-core_2.13-4.0.0.jar", "in_jar")
    # Neither in python/lib nor in jars: not Spark's (a standalone worker's task files are in $SPARK_HOME/work).
    elsewhere_zip = _zip(home / "work" / "app-1" / "0" / "job.zip", "elsewhere")
    entries = (spark_zip, f"{spark_zip}/pkg/", jar, task_zip, elsewhere_zip)
    cache = {entry: zipimport.zipimporter(entry) for entry in entries}
    assert keep_spark_zip_directories(cache, str(home)) == [spark_zip, f"{spark_zip}/pkg/", jar]
    assert keep_spark_zip_directories(cache, str(home)) == []  # already done
    assert keep_spark_zip_directories(cache, None) == []
    for path in (spark_zip, jar, task_zip, elsewhere_zip):
        _add(path, "added.py")
        _add(path, "pkg/added.py")
    for importer in cache.values():
        importer.invalidate_caches()
    assert cache[task_zip].find_spec("added") is not None
    assert cache[elsewhere_zip].find_spec("added") is not None
    assert cache[spark_zip].find_spec("added") is None
    assert cache[jar].find_spec("added") is None
    assert cache[f"{spark_zip}/pkg/"].find_spec("added") is None
    assert cache[spark_zip].find_spec("in_spark") is not None
