"""Fetch the official Apache Kafka broker jars and Spark's Kafka connector from Maven Central.

Maven does the resolution (versions pinned in resources/pom.xml); the jars land in a git-ignored cache and a
marker file records that the copy finished, so an interrupted download is retried rather than half-used.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from broker.paths import RESOURCES_DIR, kafka_jars_dir, spark_jars_dir

_MARKER = ".complete"


class JarFetchError(RuntimeError):
    pass


def _fetch(profile: str, target: Path) -> Path:
    if (target / _MARKER).exists():
        return target
    mvn = shutil.which("mvn")
    if mvn is None:
        raise JarFetchError("Maven (mvn) is required to fetch the Kafka/Spark jars; install it (apt-get install maven)")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    command = [
        mvn, "-q", "-B", "-U",
        "-s", str(RESOURCES_DIR / "settings.xml"),
        "-f", str(RESOURCES_DIR / "pom.xml"),
        f"-P{profile}",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={target}",
        "-DincludeScope=runtime",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise JarFetchError(f"mvn failed fetching the {profile} jars:\n{result.stdout[-4000:]}{result.stderr[-2000:]}")
    (target / _MARKER).write_text("ok\n")
    return target


def ensure_kafka_jars() -> Path:
    return _fetch("kafka", kafka_jars_dir())


def ensure_spark_jars() -> Path:
    return _fetch("spark", spark_jars_dir())
