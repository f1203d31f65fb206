"""SparkSession factory wired to Spark's own Kafka connector jars (fetched from Maven Central)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from broker.jars import ensure_spark_jars

_VERSION_SUFFIX = re.compile(r"-\d[\w.+-]*\.jar$")


def _artifact(jar_name: str) -> str:
    return _VERSION_SUFFIX.sub("", jar_name)


def connector_jars(jars_dir: Path, pyspark_jars_dir: Path) -> list[Path]:
    """The connector's jars minus artifacts pyspark already ships (two versions of one artifact on the
    classpath is how NoSuchMethodErrors happen)."""
    bundled = {_artifact(p.name) for p in pyspark_jars_dir.glob("*.jar")}
    return sorted(p for p in jars_dir.glob("*.jar") if _artifact(p.name) not in bundled)


def create_spark_session(app_name: str = "skewless", master: str | None = None,
                         extra_conf: dict[str, str] | None = None) -> Any:
    """local[2] by default (SKEWLESS_SPARK_MASTER overrides); loopback only; UI off; small shuffles."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (pandas UDFs, stateful cores) must run in this interpreter: it has pandas, pyarrow and skewless.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    import pyspark
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name).master(
        master or os.environ.get("SKEWLESS_SPARK_MASTER", "local[2]"))
    packages = os.environ.get("SKEWLESS_SPARK_PACKAGES")
    if packages:
        # Container images resolve the connector with Spark's own Ivy instead of a Maven-filled cache.
        builder = builder.config("spark.jars.packages", packages)
    else:
        jars = connector_jars(ensure_spark_jars(), Path(pyspark.__file__).parent / "jars")
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    builder = (
        builder
        .config("spark.driver.host", os.environ["SPARK_LOCAL_IP"])
        .config("spark.driver.bindAddress", os.environ["SPARK_LOCAL_IP"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
        .config("spark.driver.memory", os.environ.get("SKEWLESS_SPARK_DRIVER_MEMORY", "1g"))
    )
    for key, value in (extra_conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("SKEWLESS_SPARK_LOG_LEVEL", "WARN"))
    return session


def stop_spark(session: Any) -> None:
    """Stop the session and its JVM: a stopped session's JVM keeps cached Kafka producers alive, which then log
    connection errors once the broker is gone (and hold ~1 GB of memory)."""
    from pyspark import SparkContext

    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    gateway.shutdown()
    if process is not None:
        process.terminate()
        process.wait(timeout=30)
    SparkContext._gateway = None
    SparkContext._jvm = None
