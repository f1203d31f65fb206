"""What every Kafka-facing command shares (the commands themselves are skewless/cli_*.py and spark_jobs/cli.py):
the Kafka client configuration (``--bootstrap``/``SKEWLESS_BOOTSTRAP``, the ``[kafka]`` table of a ``--config``
file, repeatable ``--kafka-property KEY=VALUE``), a bounded reachability probe, and one-line errors.

Below floor 4 because spark_jobs/cli.py takes these options too, and spark-submit runs it without the skewless
package (spark_jobs/submit.py; the executors' --py-files hold spark_jobs, cep, contract and broker)."""

from __future__ import annotations

import difflib
import logging
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer
from confluent_kafka import KafkaException

from broker.client import KafkaClientConfig
from contract.topics import InvalidStreamName, TopicNames, validate_stream_name

__all__ = ["BOOTSTRAP_ENV", "DEFAULT_BOOTSTRAP", "CommandError", "check_streams_exist", "kafka_client_config",
           "parse_kafka_properties",
           "probe_kafka", "read_kafka_table", "validate_streams"]

BOOTSTRAP_ENV = "SKEWLESS_BOOTSTRAP"
# The tables of the one config file every command may read (gateway/config.py reads [gateway] too).
CONFIG_TABLES = ("gateway", "kafka")
DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
# How long a command waits for Kafka's metadata before it reports the broker unreachable (one line, not
# librdkafka's retry log).
KAFKA_PROBE_TIMEOUT_S = 10.0


class CommandError(typer.TyperException):
    """A failure the user can fix: `skewless` prints ``error: <message>`` and exits with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


Bootstrap = Annotated[str, typer.Option(help=f"Kafka bootstrap servers (env {BOOTSTRAP_ENV}).",
                                        envvar=BOOTSTRAP_ENV, show_envvar=False)]
Prefix = Annotated[str, typer.Option(help="Topic prefix.")]
KafkaConfigFile = Annotated[Path | None, typer.Option(
    "--config", help="TOML file whose [kafka] table holds librdkafka properties shared by every Kafka client "
                     "(security.protocol, sasl.*, ssl.*, client.id, ...).")]
KafkaProperties = Annotated[list[str] | None, typer.Option(
    "--kafka-property", metavar="KEY=VALUE",
    help="A librdkafka property for every Kafka client, e.g. security.protocol=SASL_SSL (repeatable; wins over "
         "the [kafka] table).")]


def read_kafka_table(path: Path) -> dict[str, Any]:
    """The [kafka] table of a config file (other tables belong to other commands and are not read here)."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise CommandError(f"config file {path} does not exist (--config)", 2) from None
    except IsADirectoryError:
        raise CommandError(f"config file {path} is a directory (--config wants a TOML file)", 2) from None
    except tomllib.TOMLDecodeError as exc:
        raise CommandError(f"{path}: malformed TOML: {exc}", 2) from None
    for name in document:
        if name not in CONFIG_TABLES:
            close = difflib.get_close_matches(name, CONFIG_TABLES, n=1)
            hint = f"did you mean [{close[0]}]? " if close else ""
            raise CommandError(f"{path}: unknown table [{name}]; {hint}a config file holds "
                               f"{', '.join(f'[{t}]' for t in CONFIG_TABLES)}", 2)
    table = document.get("kafka", {})
    if not isinstance(table, dict):
        raise CommandError(f"{path}: kafka must be a table ([kafka])", 2)
    for key, value in table.items():
        if isinstance(value, dict | list):
            raise CommandError(f"{path} [kafka] {key}: a librdkafka property takes a string, number or boolean "
                               f"(quote dotted names: \"sasl.mechanism\" = \"PLAIN\")", 2)
    return dict(table)


def parse_kafka_properties(items: Iterable[str]) -> dict[str, str]:
    """``KEY=VALUE`` strings as librdkafka properties (librdkafka parses the values: "true", "5000")."""
    properties: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"{item!r} is not KEY=VALUE (e.g. security.protocol=SASL_SSL)",
                                     param_hint="'--kafka-property'")
        properties[key.strip()] = value
    return properties


def kafka_client_config(bootstrap: str, config_file: Path | None = None,
                        properties: Sequence[str] | None = None,
                        base: Mapping[str, Any] | None = None) -> KafkaClientConfig:
    """The one Kafka client configuration of a command: ``base``, then the file's [kafka] table, then
    ``--kafka-property`` (later wins)."""
    settings: dict[str, Any] = dict(base or {})
    if config_file is not None:
        settings.update(read_kafka_table(config_file))
    settings.update(parse_kafka_properties(properties or ()))
    return KafkaClientConfig(bootstrap, settings)


def _quiet_logger() -> logging.Logger:
    # The probe's own retries would print a librdkafka line per attempt; its verdict is the one line we print.
    logger = logging.getLogger("skewless.kafka_probe")
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(logging.NullHandler())
    return logger


def probe_kafka(client: KafkaClientConfig, timeout_s: float = KAFKA_PROBE_TIMEOUT_S) -> int:
    """Ask the cluster for its metadata (bounded wait); returns the broker count. An unreachable cluster or a bad
    property raises CommandError with one line saying where and what to check."""
    from confluent_kafka.admin import AdminClient

    try:
        admin = AdminClient(client.properties(overrides={"logger": _quiet_logger(), "error_cb": lambda _e: None}))
    except (KafkaException, ValueError, TypeError) as exc:
        raise CommandError(f"bad Kafka client property: {_kafka_reason(exc)} (check the [kafka] table and "
                           f"--kafka-property)", 2) from None
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as exc:
        raise CommandError(
            f"Kafka at {client.bootstrap_servers} did not answer within {timeout_s:g} s ({_kafka_reason(exc)}); "
            f"check --bootstrap / {BOOTSTRAP_ENV} and the [kafka] security properties, and that the broker runs "
            f"(`skewless kafka status` for a local one)") from None
    return len(metadata.brokers)


def check_streams_exist(client: KafkaClientConfig, prefix: str, streams: Iterable[str],
                        timeout_s: float = KAFKA_PROBE_TIMEOUT_S) -> None:
    """Raise CommandError (exit 2) naming the first stream without an events topic under ``prefix`` and the streams
    that have one. Call after :func:`probe_kafka` (the cluster answers)."""
    from confluent_kafka.admin import AdminClient

    wanted = list(streams)
    if not wanted:
        return
    names = TopicNames(prefix)
    admin = AdminClient(client.properties(overrides={"logger": _quiet_logger(), "error_cb": lambda _e: None}))
    topics = set(admin.list_topics(timeout=timeout_s).topics)
    missing = [s for s in wanted if names.events(s) not in topics]
    if not missing:
        return
    marker = f"{prefix}.events."
    existing = sorted(t.removeprefix(marker) for t in topics if t.startswith(marker))
    raise CommandError(
        f"no stream {missing[0]!r} in Kafka (no topic {names.events(missing[0])}); streams under prefix "
        f"{prefix!r}: {', '.join(existing) or 'none yet'} (a gateway creates a stream's topics when a source "
        f"declares it; `skewless kafka topics STREAM` creates them ahead)", 2)


def _kafka_reason(exc: Exception) -> str:
    first = exc.args[0] if exc.args else exc
    return str(first.str() if hasattr(first, "str") else first)


def validate_streams(streams: Iterable[str], option: str) -> list[str]:
    checked = []
    for stream in streams:
        try:
            checked.append(validate_stream_name(stream))
        except InvalidStreamName as exc:
            raise typer.BadParameter(str(exc), param_hint=option) from None
    return checked
