"""SparkSession factory: a bare `skewless spark ...` runs local[2] with Spark's Kafka connector from our Maven cache;
under `spark-submit` the launcher's master and conf are kept as given (docs/spark-jobs.md, "On a cluster")."""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from broker.jars import ensure_spark_jars
from broker.paths import cache_dir

_VERSION_SUFFIX = re.compile(r"-\d[\w.+-]*\.jar$")
_SCALA_LIBRARY = re.compile(r"^scala-library-(\d+\.\d+)\.[\w.+-]*\.jar$")

DEFAULT_LOCAL_MASTER = "local[2]"
# Two cores here: Spark's default of 200 shuffle partitions would run 200 mostly empty stateful tasks a batch.
DEFAULT_LOCAL_SHUFFLE_PARTITIONS = 2
LOOPBACK = "127.0.0.1"
# The connector artifact; its coordinate is completed with pyspark's Scala and Spark versions.
KAFKA_CONNECTOR_ARTIFACT = "org.apache.spark:spark-sql-kafka-0-10"

MASTER_ENV = "SKEWLESS_SPARK_MASTER"
PACKAGES_ENV = "SKEWLESS_SPARK_PACKAGES"
SHUFFLE_PARTITIONS_ENV = "SKEWLESS_SPARK_SHUFFLE_PARTITIONS"
DRIVER_MEMORY_ENV = "SKEWLESS_SPARK_DRIVER_MEMORY"
# Set by a JVM that started this Python process (spark-submit of a .py file, the pyspark shell): the launcher's
# conf then already holds spark.master and whatever the user passed with --conf.
GATEWAY_PORT_ENV = "PYSPARK_GATEWAY_PORT"

Connector = Literal["maven_cache", "packages", "launcher"]


class SessionConfigError(ValueError):
    """A session setting that cannot work (e.g. a non-positive shuffle partition count)."""


def _artifact(jar_name: str) -> str:
    return _VERSION_SUFFIX.sub("", jar_name)


def connector_jars(jars_dir: Path, pyspark_jars_dir: Path) -> list[Path]:
    """The connector's jars minus artifacts pyspark already ships (two versions of one artifact on the
    classpath is how NoSuchMethodErrors happen)."""
    bundled = {_artifact(p.name) for p in pyspark_jars_dir.glob("*.jar")}
    return sorted(p for p in jars_dir.glob("*.jar") if _artifact(p.name) not in bundled)


def kafka_connector_coordinate(spark_version: str, pyspark_jars_dir: Path) -> str:
    """The `--packages` coordinate matching an installed pyspark, e.g.
    ``org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0``: the connector must be built for the same Scala binary
    version as the Spark it runs in (read from the bundled scala-library jar) and be the same Spark release."""
    scala = sorted({m.group(1) for p in pyspark_jars_dir.glob("scala-library-*.jar")
                    if (m := _SCALA_LIBRARY.match(p.name))})
    if len(scala) != 1:
        raise SessionConfigError(f"cannot tell pyspark's Scala version from {pyspark_jars_dir} (found {scala})")
    return f"{KAFKA_CONNECTOR_ARTIFACT}_{scala[0]}:{spark_version}"


def pyspark_jars_dir() -> Path:
    """The jars of the Spark this pyspark drives: $SPARK_HOME/jars (set by spark-submit, whose drivers import
    pyspark from python/lib/pyspark.zip), else the pip-installed pyspark's own jars directory."""
    import pyspark

    here = Path(pyspark.__file__).resolve().parent
    candidates = [Path(os.environ["SPARK_HOME"]) / "jars"] if os.environ.get("SPARK_HOME") else []
    candidates += [parent / "jars" for parent in (here, *here.parents)]
    return next((c for c in candidates if any(c.glob("scala-library-*.jar"))), here / "jars")


def installed_kafka_connector_coordinate() -> str:
    import pyspark

    return kafka_connector_coordinate(pyspark.__version__, pyspark_jars_dir())


@dataclass(frozen=True)
class SessionPlan:
    """What :func:`create_spark_session` sets, decided from the launcher's conf and the environment alone."""

    master: str | None
    """The master to set on the builder; None under spark-submit (its --master stands)."""
    local: bool
    """A local[...] master: driver and executors are this process's JVM, on loopback."""
    conf: dict[str, str]
    """Conf to set on the builder: only keys the launcher did not set."""
    environ_defaults: dict[str, str]
    """Environment variables to default before Spark starts (only for a local master)."""
    connector: Connector
    """Where the Kafka connector comes from: our Maven cache (spark.jars), Spark's Ivy (spark.jars.packages), or
    whatever spark-submit was given (--packages / --jars / the cluster's own jars)."""


def parse_shuffle_partitions(text: str | None, source: str) -> int | None:
    if text is None or text == "":
        return None
    try:
        value = int(text)
    except ValueError:
        raise SessionConfigError(f"{source}: shuffle partitions must be a positive integer, got {text!r}") from None
    if value < 1:
        raise SessionConfigError(f"{source}: shuffle partitions must be a positive integer, got {value}")
    return value


def plan_session(launcher_conf: Mapping[str, str], environ: Mapping[str, str], *, master: str | None = None,
                 shuffle_partitions: int | None = None, python: str = sys.executable) -> SessionPlan:
    """Pure: which master and which conf.

    * Under spark-submit (``spark.master`` in the launcher's conf) the launcher's master and every conf key it set
      stand: a builder's ``.master()`` would silently beat ``spark-submit --master``. ``master`` and
      SKEWLESS_SPARK_MASTER only choose the master of a bare run (default local[2]).
    * Only a local master binds the driver to loopback (SPARK_LOCAL_IP, default 127.0.0.1) and runs the Python
      workers in this interpreter; on a cluster the executors' Python is ``spark.pyspark.python`` (conf) and the
      driver must be reachable from the workers, so neither is touched.
    * Shuffle partitions (the stateful operator's task count, fixed in a checkpoint once the query first ran):
      ``shuffle_partitions`` (the CLI's ``--shuffle-partitions``), else SKEWLESS_SPARK_SHUFFLE_PARTITIONS, else the
      launcher's ``spark.sql.shuffle.partitions``, else 2 for a local master and Spark's own default on a cluster.
    """
    submitted = "spark.master" in launcher_conf
    chosen_master = (launcher_conf["spark.master"] if submitted
                     else master or environ.get(MASTER_ENV) or DEFAULT_LOCAL_MASTER)
    local = chosen_master.startswith("local")
    conf: dict[str, str] = {}
    environ_defaults: dict[str, str] = {}

    def default(key: str, value: str) -> None:
        if key not in launcher_conf:
            conf[key] = value

    if local:
        # Loopback only: a local job must not open driver ports on the machine's interfaces.
        host = environ.get("SPARK_LOCAL_IP", LOOPBACK)
        environ_defaults["SPARK_LOCAL_IP"] = host
        # Python workers (pandas UDFs, stateful cores) must run in this interpreter: it has pandas, pyarrow and
        # skewless. On a cluster this interpreter's path means nothing on the workers.
        environ_defaults["PYSPARK_PYTHON"] = python
        default("spark.driver.host", host)
        default("spark.driver.bindAddress", host)
        default("spark.ui.enabled", "false")
    if not submitted:
        # Too late under spark-submit: its JVM is already running with --driver-memory.
        default("spark.driver.memory", environ.get(DRIVER_MEMORY_ENV, "1g"))
    partitions = (shuffle_partitions
                  or parse_shuffle_partitions(environ.get(SHUFFLE_PARTITIONS_ENV), SHUFFLE_PARTITIONS_ENV))
    if partitions is not None:
        conf["spark.sql.shuffle.partitions"] = str(partitions)  # asked for explicitly: wins over the launcher
    elif local:
        default("spark.sql.shuffle.partitions", str(DEFAULT_LOCAL_SHUFFLE_PARTITIONS))
    # Semantics of the jobs, not of the deployment: results carry UTC times; a temporary checkpoint is ours.
    default("spark.sql.session.timeZone", "UTC")
    default("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")

    connector: Connector
    if submitted:
        connector = "launcher"
    elif environ.get(PACKAGES_ENV):
        # Container images resolve the connector with Spark's own Ivy instead of a Maven-filled cache.
        connector = "packages"
        conf["spark.jars.packages"] = environ[PACKAGES_ENV]
    else:
        connector = "maven_cache"
    return SessionPlan(None if submitted else chosen_master, local, conf, environ_defaults, connector)


# Spark's own WARN lines a job prints on every healthy run (native Hadoop missing, AQE off in streaming, a long plan
# string truncated, cancelling an availableNow job's finished group): ERROR only, unless the project runs at DEBUG.
NOISY_SPARK_LOGGERS = (
    "org.apache.hadoop.util.NativeCodeLoader",
    "org.apache.spark.sql.execution.streaming.ResolveWriteToStream",
    "org.apache.spark.sql.catalyst.util.SparkStringUtils",
    "org.apache.spark.util.SparkStringUtils",
    "org.apache.spark.scheduler.DAGScheduler",
)
# Python level -> log4j level of the JVM side. INFO (the project's default) is WARN for Spark: its INFO lines are
# per-task chatter (about 80 a job), not news of the job.
_LOG4J_LEVEL = {logging.DEBUG: "debug", logging.INFO: "warn", logging.WARNING: "warn", logging.ERROR: "error",
                logging.CRITICAL: "fatal"}
# log4j2 PatternLayouts for the project's two --log-format styles (gateway/logs.py: TEXT_FORMAT, JsonFormatter).
_TEXT_PATTERN = "%d{yyyy-MM-dd HH:mm:ss,SSS} %p %c %m%n%ex"
_JSON_PATTERN = ('{"ts_us": %d{UNIX_MILLIS}000, "level": "%level{WARN=warning, ERROR=error, INFO=info, DEBUG=debug, '
                 'TRACE=debug, FATAL=critical}", "logger": "%enc{%c}{JSON}", "message": "%enc{%m%ex}{JSON}"}%n')


def log4j2_level(python_level: int) -> str:
    return next((name for level, name in sorted(_LOG4J_LEVEL.items(), reverse=True) if python_level >= level),
                "debug")


def log4j2_properties(python_level: int, json_format: bool) -> str:
    """Pure: the log4j2 configuration of a bare run's JVM, following the project's --log-level/--log-format: one
    console appender on stderr, the root at :func:`log4j2_level`, :data:`NOISY_SPARK_LOGGERS` at ERROR above DEBUG."""
    pattern = _JSON_PATTERN if json_format else _TEXT_PATTERN
    lines = ["status = error", "appender.console.type = Console", "appender.console.name = console",
             "appender.console.target = SYSTEM_ERR", "appender.console.layout.type = PatternLayout",
             f"appender.console.layout.pattern = {pattern}",
             f"rootLogger.level = {log4j2_level(python_level)}", "rootLogger.appenderRef.console.ref = console"]
    if python_level > logging.DEBUG:
        for index, name in enumerate(NOISY_SPARK_LOGGERS):
            lines += [f"logger.noisy{index}.name = {name}", f"logger.noisy{index}.level = error"]
    return "".join(line + "\n" for line in lines)


def project_log_style() -> tuple[int, bool]:
    """The project's log level and format, as `skewless --log-level/--log-format` configured the root logger
    (gateway/logs.py; read from the logger, not imported: spark_jobs may not import gateway)."""
    root = logging.getLogger()
    json_format = any(type(h.formatter).__name__ == "JsonFormatter" for h in root.handlers)
    return root.getEffectiveLevel(), json_format


class Py4jShutdown(logging.Filter):
    """Once :func:`stop_spark` stops the JVM, py4j's threads find their sockets closed under them and log it with a
    traceback (e.g. ``ValueError: PyMemoryView_FromBuffer(): info->buf must not be NULL`` after a job that exited
    0): the JVM going away as asked, not an error. Those records pass only at DEBUG."""

    def __init__(self) -> None:
        super().__init__()
        self.stopping = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.stopping or logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


PY4J_SHUTDOWN = Py4jShutdown()


def _quiet_py4j(python_level: int) -> None:
    """py4j logs every callback connection it opens and closes at INFO (about 20 lines a job): WARNING at least,
    unless the project runs at DEBUG."""
    py4j = logging.getLogger("py4j")
    py4j.setLevel(max(python_level, logging.WARNING) if python_level > logging.DEBUG else python_level)
    PY4J_SHUTDOWN.stopping = False
    for name in ("py4j", "py4j.clientserver", "py4j.java_gateway"):
        # A logger's filters see only its own records: each py4j module logs on its own logger.
        if PY4J_SHUTDOWN not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(PY4J_SHUTDOWN)


def _log_config_file(python_level: int, json_format: bool) -> Path:
    text = log4j2_properties(python_level, json_format)
    path = cache_dir() / "spark" / f"log4j2-{log4j2_level(python_level)}-{'json' if json_format else 'text'}.properties"
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(text)
        temporary.replace(path)  # atomic: two jobs starting at once never read half a file
    return path


def launcher_conf() -> dict[str, str]:
    """The conf of the JVM that started this process (spark-submit), or {} for a bare run: a bare run's JVM does
    not exist yet and is started with the conf we decide on, so asking for it would start it too early."""
    if GATEWAY_PORT_ENV not in os.environ:
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # connects to the launcher's JVM (PYSPARK_GATEWAY_PORT), starts nothing
    return {str(k): str(v) for k, v in SparkConf().getAll()}


def create_spark_session(app_name: str = "skewless", master: str | None = None,
                         extra_conf: dict[str, str] | None = None,
                         shuffle_partitions: int | None = None) -> Any:
    """A bare run: local[2] (SKEWLESS_SPARK_MASTER overrides), loopback, UI off, 2 shuffle partitions, the
    connector from our Maven cache. Under spark-submit: its master and conf, see :func:`plan_session`."""
    plan = plan_session(launcher_conf(), os.environ, master=master, shuffle_partitions=shuffle_partitions)
    for name, value in plan.environ_defaults.items():
        os.environ.setdefault(name, value)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if plan.master is not None:
        builder = builder.master(plan.master)
    if plan.connector == "maven_cache":
        jars = connector_jars(ensure_spark_jars(), pyspark_jars_dir())
        builder = builder.config("spark.jars", ",".join(str(j) for j in jars))
    python_level, json_format = project_log_style()
    _quiet_py4j(python_level)
    logs: dict[str, str] = {}
    if plan.master is not None:
        # A bare run starts its JVM here: it logs through our log4j2 file from its first line (under spark-submit the
        # launcher's JVM already runs with its own). Spark's progress bar only on a terminal: off one, it is a
        # stream of carriage returns in a log file.
        java_options = f"-Dlog4j2.configurationFile=file:{_log_config_file(python_level, json_format)}"
        given = (extra_conf or {}).get("spark.driver.extraJavaOptions")
        logs["spark.driver.extraJavaOptions"] = f"{given} {java_options}" if given else java_options
        logs["spark.ui.showConsoleProgress"] = "true" if sys.stderr.isatty() else "false"
    for key, value in {**plan.conf, **(extra_conf or {}), **logs}.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(os.environ.get("SKEWLESS_SPARK_LOG_LEVEL", log4j2_level(python_level).upper()))
    return session


def stop_spark(session: Any) -> None:
    """Stop the session and its JVM: a stopped session's JVM keeps cached Kafka producers alive, which then log
    connection errors once the broker is gone (and hold ~1 GB of memory). Under spark-submit the JVM is the
    launcher's: it is left to exit on its own when this process does."""
    from pyspark import SparkContext

    PY4J_SHUTDOWN.stopping = True
    session.stop()
    gateway = SparkContext._gateway
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)
    if process is None:
        return
    gateway.shutdown()
    process.terminate()
    process.wait(timeout=30)
    SparkContext._gateway = None
    SparkContext._jvm = None
