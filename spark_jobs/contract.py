"""The record contract (docs/record-contract.md) for Spark: its schema, the options of every Kafka read and write of
the jobs, and a typed reader of the ordered stream for users' own jobs (docs/consume.md).

Kafka client settings reach a job through its Spark conf (``spark-submit --conf``, or ``spark.conf.set``):

    spark.skewless.kafka.<property>       option ``kafka.<property>`` of every Kafka source and sink: a property of
                                          Kafka's Java client (security.protocol, sasl.mechanism, sasl.jaas.config,
                                          ssl.truststore.location, ...), passed through unchanged
    spark.skewless.librdkafka.<property>  a setting of the confluent-kafka clients a job makes itself (creating its
                                          results topic, counting a topic's partitions, the watermark monitor):
                                          librdkafka's names (sasl.username, ssl.ca.location, ...).
                                          security.protocol and sasl.mechanism mean the same to both clients and are
                                          taken from spark.skewless.kafka.* when not given here
    spark.skewless.failOnDataLoss         the default of Spark's failOnDataLoss for every read (true)
    spark.skewless.replicationFactor      replicas of the topics a job creates (default: broker.admin's,
                                          min(3, brokers))

Two prefixes because the two clients do not share property names for credentials: the Java client takes a JAAS
line and JKS/PEM stores, librdkafka takes sasl.username and PEM files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from contract.records import EVENT, PUNCTUATION

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from broker.client import KafkaClientConfig

__all__ = ["FAIL_ON_DATA_LOSS_CONF", "INTERVAL_DEFAULTS", "KAFKA_CONF_PREFIX", "KAFKA_SOURCE_OPTIONS",
           "LIBRDKAFKA_CONF_PREFIX", "RECORD_COLUMNS", "REPLICATION_FACTOR_CONF", "StreamWatermark", "event_schema",
           "events", "interval_columns", "kafka_client_config", "kafka_conf", "kafka_options_from_conf",
           "kafka_sink_options", "kafka_source_options", "librdkafka_settings_from_conf", "punctuations", "read_kafka",
           "read_ordered_stream", "record_schema", "replication_factor", "replication_factor_from_conf",
           "skewless_conf", "stream_partitions"]

KAFKA_CONF_PREFIX = "spark.skewless.kafka."
LIBRDKAFKA_CONF_PREFIX = "spark.skewless.librdkafka."
FAIL_ON_DATA_LOSS_CONF = "spark.skewless.failOnDataLoss"
REPLICATION_FACTOR_CONF = "spark.skewless.replicationFactor"
_SKEWLESS_CONF_PREFIX = "spark.skewless."
# Same name, same meaning in Kafka's Java client and in librdkafka.
_SHARED_PROPERTIES = ("security.protocol", "sasl.mechanism")

# Options of every Kafka read of the jobs.
#   kafka.isolation.level=read_committed: the gateway publishes with Kafka transactions (fencing of a gateway that
#     lost its shard); Spark's default, read_uncommitted, would hand the jobs records of aborted transactions and a
#     zombie's writes. Offsets then have gaps (commit/abort markers, aborted records): Spark's source skips them
#     without calling them data loss since SPARK-25005 (Spark 2.4); tests/integration/test_spark_read_committed.py
#     reads across such gaps with failOnDataLoss=true.
KAFKA_SOURCE_OPTIONS: dict[str, str] = {
    "kafka.isolation.level": "read_committed",
}

# The columns of a contract record (events and punctuations share one schema; a field a kind lacks is null).
RECORD_COLUMNS: tuple[tuple[str, str], ...] = (
    ("v", "long"),
    ("kind", "string"),
    ("stream", "string"),
    ("source_id", "string"),
    ("seq", "long"),
    ("source_ts_us", "long"),
    ("ref_ts_us", "long"),
    ("uncertainty_us", "long"),
    ("arrival_ts_us", "long"),
    ("release_ts_us", "long"),
    ("late", "boolean"),
    ("late_reason", "string"),
    ("lateness_us", "long"),
    ("watermark_us", "long"),
    ("rtt_us", "long"),
    # Payloads are free-form: kept as their JSON text for jobs to parse with their own schema.
    ("payload", "string"),
    # Contract v2 (interval events): null in a v1 record; :func:`events` fills the v1 meaning in.
    ("start_ts_us", "long"),
    ("end_ts_us", "long"),
    ("start_uncertainty_us", "long"),
    ("source_start_ts_us", "long"),
    ("interval_id", "string"),
    ("endpoint", "string"),
)
# What a record without a v2 field means (v1, or a punctuation): the interval is the point [ref_ts_us, ref_ts_us].
# ``interval_id`` and ``endpoint`` stay null: only endpoint events carry them.
INTERVAL_DEFAULTS: dict[str, str] = {
    "start_ts_us": "ref_ts_us",
    "end_ts_us": "ref_ts_us",
    "start_uncertainty_us": "uncertainty_us",
    "source_start_ts_us": "source_ts_us",
}
# Kafka's columns kept next to the record's: where it was read (the punctuations' promise is per partition).
_KAFKA_COLUMNS = ("topic", "partition", "offset", "timestamp")


def record_schema() -> StructType:
    """The record contract as a Spark schema: the columns of :data:`RECORD_COLUMNS`, all nullable."""
    from pyspark.sql.types import BooleanType, DataType, LongType, StringType, StructField, StructType

    types: dict[str, DataType] = {"long": LongType(), "string": StringType(), "boolean": BooleanType()}
    return StructType([StructField(name, types[kind]) for name, kind in RECORD_COLUMNS])


def event_schema() -> StructType:
    """The schema the CEP jobs parse records with (the same as :func:`record_schema`)."""
    return record_schema()


# -- Kafka settings from the Spark conf ----------------------------------------------------------------------------

def skewless_conf(spark: SparkSession) -> dict[str, str]:
    """Every ``spark.skewless.*`` entry of the session's conf (spark-submit's --conf and later ``spark.conf.set``)."""
    entries = spark.conf.getAll
    return {str(k): str(v) for k, v in entries.items() if str(k).startswith(_SKEWLESS_CONF_PREFIX)}


def kafka_options_from_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """``spark.skewless.kafka.<p>`` -> ``kafka.<p>``: the options every Kafka source and sink gets."""
    return {f"kafka.{k.removeprefix(KAFKA_CONF_PREFIX)}": v for k, v in conf.items()
            if k.startswith(KAFKA_CONF_PREFIX) and len(k) > len(KAFKA_CONF_PREFIX)}


def librdkafka_settings_from_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """The settings of a job's own confluent-kafka clients: ``spark.skewless.librdkafka.<p>``, over the properties
    both clients share (``security.protocol``, ``sasl.mechanism``) from ``spark.skewless.kafka.<p>``."""
    shared = {p: conf[KAFKA_CONF_PREFIX + p] for p in _SHARED_PROPERTIES if KAFKA_CONF_PREFIX + p in conf}
    own = {k.removeprefix(LIBRDKAFKA_CONF_PREFIX): v for k, v in conf.items()
           if k.startswith(LIBRDKAFKA_CONF_PREFIX) and len(k) > len(LIBRDKAFKA_CONF_PREFIX)}
    return {**shared, **own}


def kafka_conf(kafka: Mapping[str, str] | None = None,
               librdkafka: Mapping[str, object] | None = None) -> dict[str, str]:
    """The Spark conf entries for Kafka properties (the inverse of the two functions above): what the CLI passes to
    its session and what a user writes as ``--conf`` pairs."""
    return {**{KAFKA_CONF_PREFIX + k: str(v) for k, v in (kafka or {}).items()},
            **{LIBRDKAFKA_CONF_PREFIX + k: _librdkafka_text(v) for k, v in (librdkafka or {}).items()}}


def _librdkafka_text(value: object) -> str:
    # librdkafka spells booleans in lower case; str(True) would be refused.
    return str(value).lower() if isinstance(value, bool) else str(value)


def kafka_client_config(spark: SparkSession, bootstrap_servers: str) -> KafkaClientConfig:
    """The configuration of the confluent-kafka clients a job makes (admin, producer, consumer): the bootstrap
    address with the session's ``spark.skewless.librdkafka.*`` settings. Picklable: executors may use it."""
    from broker.client import KafkaClientConfig

    return KafkaClientConfig(bootstrap_servers, librdkafka_settings_from_conf(skewless_conf(spark)))


def replication_factor_from_conf(conf: Mapping[str, str]) -> int | None:
    """``spark.skewless.replicationFactor`` as a number; None when unset (the broker-count default)."""
    text = conf.get(REPLICATION_FACTOR_CONF, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{REPLICATION_FACTOR_CONF} must be a whole number, got {text!r}") from None


def replication_factor(spark: SparkSession) -> int | None:
    """The replication factor for the topics a job creates (``replication_factor=`` of broker.admin)."""
    return replication_factor_from_conf(skewless_conf(spark))


def _fail_on_data_loss(conf: Mapping[str, str], requested: bool | None) -> str:
    if requested is not None:
        return "true" if requested else "false"
    configured = conf.get(FAIL_ON_DATA_LOSS_CONF, "true").strip().lower()
    if configured not in ("true", "false"):
        raise ValueError(f"{FAIL_ON_DATA_LOSS_CONF} must be true or false, got {configured!r}")
    return configured


# -- reading and writing -------------------------------------------------------------------------------------------

def kafka_source_options(bootstrap_servers: str, topics: Sequence[str] | str, starting_offsets: str,
                         max_offsets_per_trigger: int | None, *, fail_on_data_loss: bool = True,
                         kafka: Mapping[str, str] | None = None,
                         options: Mapping[str, str] | None = None) -> dict[str, str]:
    """Every option of a contract topic read: the topics (a list, or one Java regex), committed data only, then
    ``kafka`` (``kafka.<property>`` options from the conf) and ``options`` (anything of Spark's Kafka source; wins).

    ``fail_on_data_loss`` True (the default): a query stops when records it has not read yet are gone (deleted by
    retention while the query was down, a topic deleted and recreated) instead of skipping them silently; the
    transaction markers and aborted records of the gateway's transactions are not data loss."""
    subscription = ({"subscribePattern": topics} if isinstance(topics, str)
                    else {"subscribe": ",".join(topics)})
    limit = {} if max_offsets_per_trigger is None else {"maxOffsetsPerTrigger": str(max_offsets_per_trigger)}
    return {"kafka.bootstrap.servers": bootstrap_servers, "startingOffsets": starting_offsets, **limit,
            "failOnDataLoss": "true" if fail_on_data_loss else "false", **KAFKA_SOURCE_OPTIONS, **subscription,
            **(kafka or {}), **(options or {})}


def read_kafka(spark: SparkSession, bootstrap_servers: str, topics: Sequence[str] | str,
               starting_offsets: str = "earliest", max_offsets_per_trigger: int | None = None, *,
               fail_on_data_loss: bool | None = None, options: Mapping[str, str] | None = None) -> DataFrame:
    """The raw Kafka stream (key, value, topic, partition, offset, timestamp, ...) of the topics, committed records
    only, with the session's ``spark.skewless.kafka.*`` options. ``fail_on_data_loss`` None: the conf's
    ``spark.skewless.failOnDataLoss``, default true."""
    conf = skewless_conf(spark)
    return spark.readStream.format("kafka").options(**kafka_source_options(
        bootstrap_servers, topics, starting_offsets, max_offsets_per_trigger,
        fail_on_data_loss=_fail_on_data_loss(conf, fail_on_data_loss) == "true",
        kafka=kafka_options_from_conf(conf), options=options)).load()


def kafka_sink_options(spark: SparkSession, bootstrap_servers: str) -> dict[str, str]:
    """The options of a Kafka sink (``df.write.format("kafka").options(**...)``, or ``writeStream``): the address
    and the session's ``spark.skewless.kafka.*`` options. The caller adds ``topic`` (or a topic column)."""
    return {"kafka.bootstrap.servers": bootstrap_servers, **kafka_options_from_conf(skewless_conf(spark))}


def read_ordered_stream(spark: SparkSession, bootstrap_servers: str, prefix: str, stream: str, *,
                        starting_offsets: str = "earliest", include_late: bool = False,
                        max_offsets_per_trigger: int | None = None, fail_on_data_loss: bool | None = None,
                        options: Mapping[str, str] | None = None) -> DataFrame:
    """The stream's records as typed columns: those of :func:`record_schema`, then Kafka's ``topic``,
    ``partition``, ``offset`` and ``timestamp``. Events and punctuations come together, in offset order per
    partition, as Kafka hands them over; split them with :func:`events` and :func:`punctuations`.

    ``include_late``: also read ``<prefix>.late.<stream>`` (events behind a promise already made, each with
    ``late = true`` and a ``late_reason``). ``options`` go to Spark's Kafka source as they are (they win)."""
    from pyspark.sql import functions as F

    from contract.topics import TopicNames

    names = TopicNames(prefix)
    topics = [names.events(stream), *([names.late(stream)] if include_late else [])]
    raw = read_kafka(spark, bootstrap_servers, topics, starting_offsets, max_offsets_per_trigger,
                     fail_on_data_loss=fail_on_data_loss, options=options)
    parsed = raw.select(F.from_json(F.col("value").cast("string"), record_schema(), {"mode": "PERMISSIVE"})
                        .alias("record"), *_KAFKA_COLUMNS)
    return parsed.select("record.*", *_KAFKA_COLUMNS)


def interval_columns() -> dict[str, Column]:
    """The v2 interval columns with the v1 meaning filled in (``coalesce``): ``start_ts_us`` and ``end_ts_us``
    default to ``ref_ts_us``, ``start_uncertainty_us`` to ``uncertainty_us``, ``source_start_ts_us`` to
    ``source_ts_us``; so a job reads v1 and v2 records alike."""
    from pyspark.sql import functions as F

    return {name: F.coalesce(F.col(name), F.col(default)) for name, default in INTERVAL_DEFAULTS.items()}


def events(records: DataFrame) -> DataFrame:
    """The event rows of :func:`read_ordered_stream`'s records (every column), v1 records read as v2 ones:
    :func:`interval_columns` replaces the interval columns (a point event is ``[ref_ts_us, ref_ts_us]``)."""
    from pyspark.sql import functions as F

    return records.where(F.col("kind") == EVENT).withColumns(interval_columns())


def punctuations(records: DataFrame) -> DataFrame:
    """The punctuation rows: ``stream``, ``topic``, ``partition``, ``offset``, ``watermark_us`` (no event with a
    smaller ``ref_ts_us`` follows in that partition) and ``release_ts_us``."""
    from pyspark.sql import functions as F

    return (records.where(F.col("kind") == PUNCTUATION)
            .select("stream", "topic", "partition", "offset", "watermark_us", "release_ts_us"))


def stream_partitions(spark: SparkSession, bootstrap_servers: str, prefix: str, stream: str) -> int:
    """How many partitions the stream's events topic has (raises LookupError while it does not exist)."""
    from broker.admin import partition_count
    from contract.topics import TopicNames

    return partition_count(kafka_client_config(spark, bootstrap_servers), TopicNames(prefix).events(stream))


@dataclass
class StreamWatermark:
    """A stream's promise: ``W = min over its events topic's partitions of each one's latest punctuation``, None
    until every partition has punctuated. Once every row read so far is taken in, no event of the stream with
    ``ref_ts_us < W`` can follow in any partition: results for event times below W are final.

    Pure (no Spark): a job feeds it each micro-batch's punctuation rows, e.g. in ``foreachBatch``."""

    partitions: int
    latest_us: dict[int, int] = field(default_factory=dict)

    def observe(self, partition: int, watermark_us: int) -> None:
        # A partition's punctuations never go backwards; max() keeps a re-read batch from moving W back.
        if not 0 <= partition < self.partitions:
            raise ValueError(f"partition {partition} of a topic with {self.partitions} partitions")
        self.latest_us[partition] = max(watermark_us, self.latest_us.get(partition, watermark_us))

    def observe_rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Rows with ``partition`` and ``watermark_us`` (e.g. :func:`punctuations` of a batch, collected)."""
        for row in rows:
            self.observe(int(row["partition"]), int(row["watermark_us"]))

    @property
    def watermark_us(self) -> int | None:
        if len(self.latest_us) < self.partitions:
            return None
        return min(self.latest_us.values())
