"""Gateway settings from a TOML file, environment variables and flags (later ones win)."""

from __future__ import annotations

import difflib
import os
import ssl
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.units import DurationError, parse_duration_us
from contract.wire.messages import MAX_STREAMS_PER_SOURCE
from gateway.auth import SourceAuthenticator
from gateway.native import NativeCoreMissing, resolve_core
from gateway.scheduling import MAX_SLICE_US, MIN_SLICE_US
from gateway.server import GatewayConfig
from gateway.session import SessionTimeouts
from gateway.settings import (
    BOOL,
    BY_NAME,
    COUNT,
    DEPRECATED_ALIASES,
    DURATION_TEXT,
    ENV_PREFIX,
    FRACTION,
    LIST,
    MICROS,
    PORT,
    POSITIVE,
    SECONDS,
    SETTINGS,
    TABLE,
)
from reorder.pipeline import PipelineConfig
from reorder.sequence import SequenceConfig
from timesync.responder import ResponderConfig
from timesync.server import DEFAULT_PORT as DEFAULT_SYNC_PORT
from timesync.server import ServerConfig

# Tables a config file may hold: the gateway's settings and the librdkafka properties every Kafka client shares.
TABLES = ("gateway", "kafka")
# Query 5.3's Eq. 3.11 threshold (the replay's `thesis` approach).
THESIS_LATENCY_THRESHOLD_US = 500_000
# /metrics and /healthz: outside Prometheus' own 9090-9094 and the exporters' 9100+ (docs/operations.md).
DEFAULT_METRICS_PORT = 7780

# The kind of every setting (gateway.settings); durations are numbers in their unit or strings with a unit.
SCHEMA: dict[str, str] = {setting.name: setting.kind for setting in SETTINGS}
KNOWN_KEYS = frozenset(SCHEMA)
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}


class ConfigError(ValueError):
    pass


def _suggest(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def coerce(key: str, value: Any, where: str) -> Any:
    """``value`` as setting ``key`` holds it (ports and counts checked; durations in seconds, or µs for ``_us``);
    ConfigError names ``where`` it came from (a file and table, an environment variable, a flag)."""
    kind = SCHEMA[key]
    text = value.strip() if isinstance(value, str) else None
    if kind == FRACTION:
        try:
            number = float(text if text is not None else value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: {key} must be a number in (0, 1], got {value!r}") from None
        if isinstance(value, bool) or not 0.0 < number <= 1.0:
            raise ConfigError(f"{where}: {key} must be in (0, 1], got {value!r}")
        return number
    if kind in (PORT, POSITIVE, COUNT):
        if isinstance(value, bool) or not isinstance(value, int):
            try:
                value = int(text) if text is not None else int("not an int")
            except ValueError:
                raise ConfigError(f"{where}: {key} must be an integer, got {value!r}") from None
        if kind == PORT and not 0 <= value <= 65535:
            raise ConfigError(f"{where}: {key} must be a port in 0..65535 (0 = any free port), got {value}")
        if kind == POSITIVE and value < 1:
            raise ConfigError(f"{where}: {key} must be >= 1, got {value}")
        if kind == COUNT and value < 0:
            raise ConfigError(f"{where}: {key} must be >= 0, got {value}")
        return value
    if kind in (SECONDS, MICROS):
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ConfigError(f"{where}: {key} must be a duration (a number, or e.g. \"250ms\", \"5s\", \"2m\")")
        bare = "s" if kind == SECONDS else "us"
        try:
            us = parse_duration_us(str(value), bare_unit=bare, allow_negative=True)
        except DurationError as exc:
            raise ConfigError(f"{where}: {key}: {exc}") from None
        return us / 1_000_000 if kind == SECONDS else us
    if kind == BOOL:
        if isinstance(value, bool):
            return value
        if text is not None and text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"{where}: {key} must be true or false, got {value!r}")
    if kind == TABLE:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{where}: {key} must be a table ([gateway.{key}] in the file)")
        return dict(value)
    if kind == LIST:
        if text is not None:
            return [part.strip() for part in text.split(",") if part.strip()]
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
        raise ConfigError(f"{where}: {key} must be a list of strings or a comma-separated string")
    if kind == DURATION_TEXT and value == 0 and not isinstance(value, bool):
        return value  # reference_clock_error = 0: checked in build_config with its "chrony" alternative
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {key} must be a string, got {value!r}")
    return value


def read_config_file(path: Path) -> dict[str, Any]:
    """The tables of a config file: [gateway] and [kafka] (anything else is a misspelling, refused)."""
    try:
        with path.open("rb") as handle:
            document = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist (--config)") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory (--config wants a TOML file)") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    for name, value in document.items():
        if name not in TABLES or not isinstance(value, dict):
            close = difflib.get_close_matches(name, TABLES, n=1)
            hint = f"did you mean [{close[0]}]? " if close else ""
            raise ConfigError(f"{path}: unknown table [{name}]; {hint}a config file holds "
                              f"{', '.join(f'[{t}]' for t in TABLES)}")
    return document


def kafka_table(document: Mapping[str, Any], path: Path | str) -> dict[str, Any]:
    """The [kafka] table: librdkafka properties (security.protocol, sasl.*, ssl.*, client.id, ...), scalars."""
    table = dict(document.get("kafka", {}))
    for key, value in table.items():
        if isinstance(value, dict | list):
            raise ConfigError(f"{path} [kafka] {key}: a librdkafka property takes a string, number or boolean "
                              f"(quote dotted names: \"sasl.mechanism\" = \"PLAIN\")")
    return table


def load_settings(config_file: Path | None, env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Settings from the file's [gateway] table (and [kafka]), then the environment, then flags (later wins);
    every value checked against :data:`SCHEMA` with the place it came from in the error."""
    settings: dict[str, Any] = {}

    def put(name: str, value: Any, where: str) -> None:
        key = DEPRECATED_ALIASES.get(name, name)
        if key not in SCHEMA:
            raise ConfigError(f"{where}: unknown gateway setting {name!r}; {_suggest(name, SCHEMA)}"
                              f"known: {', '.join(sorted(SCHEMA))}")
        value = coerce(key, value, where)
        if key == "kafka":  # flags and the [kafka] table add properties; they do not replace the others
            value = {**settings.get("kafka", {}), **value}
        settings[key] = value

    if config_file is not None:
        document = read_config_file(config_file)
        if document.get("kafka"):
            put("kafka", kafka_table(document, config_file), f"{config_file} [kafka]")
        for name, value in document.get("gateway", {}).items():
            put(name, value, f"{config_file} [gateway] {name}")
    environ = os.environ if env is None else env
    for variable, value in sorted(environ.items()):
        if variable.startswith(ENV_PREFIX):
            put(variable[len(ENV_PREFIX):].lower(), value, variable)
    for setting in SETTINGS:  # the variables every command shares win over SKEWLESS_GATEWAY_<NAME>
        if setting.shared_env is not None and setting.shared_env in environ:
            put(setting.name, environ[setting.shared_env], setting.shared_env)
    for name, value in (overrides or {}).items():
        if value is not None:
            put(name, value, _flag_of(name))
    return settings


def _flag_of(name: str) -> str:
    setting = BY_NAME.get(DEPRECATED_ALIASES.get(name, name))
    flag = setting.flag_name if setting is not None else None
    return flag or f"--{name.replace('_', '-')}"


def build_config(settings: Mapping[str, Any]) -> GatewayConfig:
    """The gateway's configuration from ``settings`` (load_settings' result, or a dict of plain values); each
    setting with a ``config_field`` in gateway.settings is copied unchanged, the others are converted here."""
    settings = _without_aliases(settings)
    config = GatewayConfig()
    config.metrics_port = DEFAULT_METRICS_PORT
    for setting in SETTINGS:
        if setting.config_field is not None and setting.name in settings:
            setattr(config, setting.config_field, settings[setting.name])
    if not _truthy(settings.get("metrics", True)):  # metrics = false (--no-metrics): no endpoint at all
        config.metrics_port = None
    if config.shards < 1:
        raise ConfigError(f"shards must be >= 1, got {config.shards}")
    if config.clock_step_max_held < 1:
        raise ConfigError(f"clock_step_max_held must be >= 1, got {config.clock_step_max_held}")
    if config.loop_slice_us and not MIN_SLICE_US <= config.loop_slice_us <= MAX_SLICE_US:
        raise ConfigError(f"loop_slice_us must be 0 (the kernel's default) or {MIN_SLICE_US}us.."
                          f"{MAX_SLICE_US // 1000}ms, got {config.loop_slice_us}us")
    _cluster(config, settings)
    config.kafka_settings = dict(settings.get("kafka", {}))
    config.producer_config = dict(settings.get("producer", {}))
    config.authenticator = _authenticator(settings)
    _limits(config, settings)
    defaults = SessionTimeouts()
    config.timeouts = SessionTimeouts(
        handshake_us=int(settings.get("handshake_timeout_s", defaults.handshake_us / 1e6) * 1_000_000),
        partial_frame_us=int(settings.get("partial_frame_timeout_s", defaults.partial_frame_us / 1e6) * 1_000_000),
        idle_us=int(settings.get("idle_timeout_s", defaults.idle_us / 1e6) * 1_000_000),
    )
    _timesync(config, settings)
    if "max_future_s" in settings:
        config.pipeline = replace(config.pipeline, max_future_us=round(float(settings["max_future_s"]) * 1_000_000))
    config.pipeline = _with_ordering_waits(_with_reorderer(config.pipeline, settings), settings)
    if "core" in settings:
        try:
            resolve_core(settings["core"])
        except (ValueError, NativeCoreMissing) as exc:
            raise ConfigError(f"core: {exc}") from None
        config.core = settings["core"]
    if "direct_produce" in settings:
        config.direct_produce = _truthy(settings["direct_produce"])
    config.ssl_context = _tls(settings)
    return config


def _without_aliases(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` under today's names; a setting given under both names keeps today's value."""
    renamed = {DEPRECATED_ALIASES[name]: value for name, value in settings.items() if name in DEPRECATED_ALIASES}
    return {**renamed, **{name: value for name, value in settings.items() if name not in DEPRECATED_ALIASES}}


def _cluster(config: GatewayConfig, settings: Mapping[str, Any]) -> None:
    """The checkpoints, the reference clock's error and the Kafka group and transactions (docs/cluster.md)."""
    if "idle_punctuation_lag_s" in settings:
        lag_s = float(settings["idle_punctuation_lag_s"])
        # 0 (or less) turns rule 10 off: a deployment whose every shard always has live sources of every stream.
        config.idle_punctuation_lag_s = lag_s if lag_s > 0 else None
    if (source_retention_us := _positive_us(settings, "source_retention_s")) is not None:
        config.source_retention_us = source_retention_us
    if "reference_clock_error" in settings:
        _reference_error(config, settings["reference_clock_error"])
    if "transactions" in settings:
        config.transactions = _truthy(settings["transactions"])
    for name, low_s in (("session_timeout_s", 1.0), ("commit_interval_s", 0.001)):
        if name in settings:
            value_s = float(settings[name])
            if value_s < low_s:
                raise ConfigError(f"{name} must be >= {low_s}, got {value_s}")
            setattr(config, name, value_s)
    if "clock_step_hold_s" in settings:
        hold_s = float(settings["clock_step_hold_s"])
        if hold_s < 0:
            raise ConfigError(f"clock_step_hold_s must be >= 0, got {hold_s}")
        config.clock_step_hold_us = round(hold_s * 1_000_000)
    if "takeover_grace_s" in settings:
        grace_s = float(settings["takeover_grace_s"])
        if grace_s < 0:
            raise ConfigError(f"takeover_grace_s must be >= 0, got {grace_s}")
        config.takeover_grace_us = round(grace_s * 1_000_000)  # 0: no takeover window (gateway.ingest, rule 15)


def _authenticator(settings: Mapping[str, Any]) -> SourceAuthenticator:
    secret, master = settings.get("hmac_secret"), settings.get("hmac_master")
    allowed = settings.get("allowed_sources")
    if isinstance(allowed, str):
        allowed = [s for s in allowed.split(",") if s]
    return SourceAuthenticator(
        tokens=dict(settings.get("auth_tokens", {})),
        hmac_secret=secret.encode() if isinstance(secret, str) else None,
        allowed_sources=frozenset(allowed) if allowed is not None else None,
        hmac_master=master.encode() if isinstance(master, str) and master else None,
        source_keys=_source_keys(settings),
    )


def _timesync(config: GatewayConfig, settings: Mapping[str, Any]) -> None:
    if not _truthy(settings.get("timesync", True)):
        return
    keys = {k: v.encode() for k, v in dict(settings.get("sync_keys", {})).items()}
    upstream = settings.get("upstream_ntp", ())
    if isinstance(upstream, str):
        upstream = [u for u in upstream.split(",") if u]
    config.timesync = ServerConfig(
        host=settings.get("timesync_host", config.host), port=settings.get("timesync_port", DEFAULT_SYNC_PORT),
        clock_offset_us=settings.get("clock_offset_us", 0), responder=ResponderConfig(keys=keys),
        upstream_servers=tuple(upstream))


def _tls(settings: Mapping[str, Any]) -> ssl.SSLContext | None:
    cert, key = settings.get("tls_cert"), settings.get("tls_key")
    if (cert is None) != (key is None):
        raise ConfigError("tls_cert and tls_key go together")
    if cert is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"tls_cert/tls_key: cannot load {cert} with {key}: {exc}") from None
    return context


def _source_keys(settings: Mapping[str, Any]) -> dict[str, str]:
    """The key table: `source_keys_file` (a TOML file with a [source_keys] table: source id = key), then the
    `source_keys` table of the settings (which wins). Keys are strings (used as the bytes of their text)."""
    keys: dict[str, Any] = {}
    path = settings.get("source_keys_file")
    if path is not None:
        try:
            with Path(path).open("rb") as handle:
                document = tomllib.load(handle)
        except FileNotFoundError:
            raise ConfigError(f"source_keys_file {path} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"source_keys_file {path}: {exc}") from None
        table = document.get("source_keys")
        if not isinstance(table, dict):
            raise ConfigError(f"source_keys_file {path}: no [source_keys] table (source id = \"key\")")
        keys.update(table)
    keys.update(settings.get("source_keys", {}))
    for source_id, key in keys.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"source_keys: the key of {source_id!r} must be a non-empty string")
    return keys


def _limits(config: GatewayConfig, settings: Mapping[str, Any]) -> None:
    per_source = settings.get("max_streams_per_source", config.max_streams_per_source)
    if not 1 <= per_source <= MAX_STREAMS_PER_SOURCE:
        raise ConfigError(f"max_streams_per_source must be in 1..{MAX_STREAMS_PER_SOURCE} (the wire protocol's "
                          f"bound), got {per_source}")
    config.max_streams_per_source = per_source
    if "max_streams" in settings:
        config.max_streams = settings["max_streams"] or None  # 0: no cap
    allowed = settings.get("allowed_streams")
    if allowed is not None:
        config.allowed_streams = frozenset(allowed)
    if (idle_retention_us := _positive_us(settings, "idle_source_retention_s")) is not None:
        config.idle_source_retention_us = idle_retention_us
    if (slow_reader_us := _positive_us(settings, "slow_reader_timeout_s")) is not None:
        config.slow_reader_timeout_us = slow_reader_us


def _positive_us(settings: Mapping[str, Any], name: str) -> int | None:
    """A duration setting (seconds) that must be above 0, in microseconds; None when it is not set."""
    if name not in settings:
        return None
    value_s = float(settings[name])
    if value_s <= 0:
        raise ConfigError(f"{name} must be > 0, got {value_s}")
    return round(value_s * 1_000_000)


REORDER_MODES = ("sequence", "thesis")


def _with_reorderer(pipeline: PipelineConfig, settings: Mapping[str, Any]) -> PipelineConfig:
    """`reorder_mode`, `reorder_alpha`, `reorder_beta`, `pass_late` (issue 25 item 8): "thesis" runs Eq. 3.11's
    gap timeout and the thesis' merge, as the replay's `thesis` approach does (reorder.eval.replay.pipeline_config),
    with Query 5.3's 500 ms threshold unless `gap_timeout_max_s` sets it (applied after this)."""
    mode = settings.get("reorder_mode", "sequence")
    if mode not in REORDER_MODES:
        raise ConfigError(f"reorder_mode must be one of {', '.join(map(repr, REORDER_MODES))}, got {mode!r}")
    sequence, merger = pipeline.sequence, pipeline.merger
    if mode == "thesis":
        sequence = SequenceConfig.thesis(latency_threshold_us=THESIS_LATENCY_THRESHOLD_US,
                                         drop_late=sequence.drop_late)
        merger = replace(merger, mode="thesis")
    if "reorder_alpha" in settings:
        sequence = replace(sequence, alpha=float(settings["reorder_alpha"]))
    if "reorder_beta" in settings:
        sequence = replace(sequence, beta=float(settings["reorder_beta"]))
    pipeline = replace(pipeline, sequence=sequence, merger=merger)
    if "pass_late" in settings:
        pipeline = replace(pipeline, drop_late=not _truthy(settings["pass_late"]))
    return pipeline


def _reference_error(config: GatewayConfig, value: Any) -> None:
    """`reference_clock_error`: "chrony" (the host's chronyd bound), or a duration ("2 ms"; 0 on one host)."""
    if isinstance(value, str) and value.strip().lower() == "chrony":
        config.reference_error_from_chrony = True
        return
    try:
        config.reference_error_us = 0 if value in (0, "0") else parse_duration_us(str(value), require_unit=True)
    except DurationError as exc:
        raise ConfigError(f"reference_clock_error: {exc} (or \"chrony\")") from exc


def _with_ordering_waits(pipeline: PipelineConfig, settings: Mapping[str, Any]) -> PipelineConfig:
    def us(name: str) -> int | None:
        if name not in settings:
            return None
        value = float(settings[name])
        if value < 0:
            raise ConfigError(f"{name} must be >= 0, got {value}")
        return round(value * 1_000_000)

    sequence = pipeline.sequence
    if (low := us("gap_timeout_min_s")) is not None:
        sequence = replace(sequence, min_timeout_us=low)
    if (high := us("gap_timeout_max_s")) is not None:
        sequence = replace(sequence, latency_threshold_us=high)
    if (learned := us("gap_timeout_learned_max_s")) is not None:
        # 0 (or anything up to gap_timeout_max_s): no learning, gap_timeout_max_s is a hard maximum.
        sequence = replace(sequence, max_latency_threshold_us=learned)
    if sequence.min_timeout_us > sequence.latency_threshold_us:
        raise ConfigError("gap_timeout_min_s must not exceed gap_timeout_max_s")
    merger = pipeline.merger
    if (merge := us("merge_timeout_s")) is not None:
        merger = replace(merger, default_timeout_us=merge)
    if "merge_wait_learned" in settings:
        # off: the merge waits for a silent source only as long as its reorderer's gap wait says (docs/reorder.md)
        merger = replace(merger, learn_wait=_truthy(settings["merge_wait_learned"]))
    pipeline = replace(pipeline, sequence=sequence, merger=merger)
    if (grace := us("reconnect_grace_s")) is not None:
        pipeline = replace(pipeline, reconnect_grace_us=grace)
    if (join := us("join_grace_s")) is not None:
        pipeline = replace(pipeline, join_grace_us=join)
    return pipeline


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in {"0", "false", "no", "off", ""}
    return bool(value)
