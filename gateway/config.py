"""Gateway settings from a TOML file, environment variables and flags (later ones win)."""

from __future__ import annotations

import os
import ssl
import tomllib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from contract.units import DurationError, parse_duration_us
from gateway.auth import SourceAuthenticator
from gateway.server import GatewayConfig
from gateway.session import SessionTimeouts
from reorder.pipeline import PipelineConfig
from timesync.responder import ResponderConfig
from timesync.server import DEFAULT_PORT as DEFAULT_SYNC_PORT
from timesync.server import ServerConfig

ENV_PREFIX = "SKEWLESS_GATEWAY_"
_INT_KEYS = {"port", "max_frame_bytes", "metrics_port", "handshake_timeout_s", "idle_timeout_s",
             "partial_frame_timeout_s", "timesync_port", "clock_offset_us", "max_future_s", "clock_step_max_held",
             "shards"}
# Ordering waits, in seconds (TOML floats or env strings): how long a gap or a silent source is waited for before
# the gateway gives up on it. A deployment that must ride out network partitions of N seconds sets them above N.
_FLOAT_KEYS = {"gap_timeout_min_s", "gap_timeout_max_s", "merge_timeout_s", "reconnect_grace_s", "join_grace_s",
               "clock_step_hold_s", "session_timeout_s", "commit_interval_s", "source_retention_s",
               "idle_punctuation_lag_s"}
KNOWN_KEYS = _INT_KEYS | _FLOAT_KEYS | {
    "host", "bootstrap_servers", "topic_prefix", "metrics_host", "tls_cert", "tls_key", "auth_tokens",
    "auth_hmac_secret", "allowed_sources", "kafka", "producer", "timesync", "timesync_host", "sync_keys",
    "upstream_ntp", "merge_wait_learned", "cluster", "gateway_id", "advertised_host", "instance_id", "transactions",
    "reference_clock_error"}


class ConfigError(ValueError):
    pass


def load_settings(config_file: Path | None, env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    settings: dict[str, Any] = {}
    if config_file is not None:
        with config_file.open("rb") as handle:
            settings.update(tomllib.load(handle).get("gateway", {}))
    for key, value in (os.environ if env is None else env).items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):].lower()
            settings[name] = int(value) if name in _INT_KEYS else float(value) if name in _FLOAT_KEYS else value
    settings.update({k: v for k, v in (overrides or {}).items() if v is not None})
    unknown = set(settings) - KNOWN_KEYS
    if unknown:
        raise ConfigError(f"unknown gateway settings: {sorted(unknown)}; known: {sorted(KNOWN_KEYS)}")
    return settings


def build_config(settings: Mapping[str, Any]) -> GatewayConfig:
    config = GatewayConfig()
    for name in ("host", "port", "bootstrap_servers", "topic_prefix", "max_frame_bytes", "metrics_host",
                 "metrics_port", "clock_step_max_held", "shards", "cluster", "gateway_id", "advertised_host",
                 "instance_id"):
        if name in settings:
            setattr(config, name, settings[name])
    if config.shards < 1:
        raise ConfigError(f"shards must be >= 1, got {config.shards}")
    if "idle_punctuation_lag_s" in settings:
        lag_s = float(settings["idle_punctuation_lag_s"])
        # 0 (or less) turns rule 10 off: a deployment whose every shard always has live sources of every stream.
        config.idle_punctuation_lag_s = lag_s if lag_s > 0 else None
    if "source_retention_s" in settings:
        retention_s = float(settings["source_retention_s"])
        if retention_s <= 0:
            raise ConfigError(f"source_retention_s must be > 0, got {retention_s}")
        config.source_retention_us = round(retention_s * 1_000_000)
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
    if config.clock_step_max_held < 1:
        raise ConfigError(f"clock_step_max_held must be >= 1, got {config.clock_step_max_held}")
    config.kafka_settings = dict(settings.get("kafka", {}))
    config.producer_config = dict(settings.get("producer", {}))
    secret = settings.get("auth_hmac_secret")
    allowed = settings.get("allowed_sources")
    if isinstance(allowed, str):
        allowed = [s for s in allowed.split(",") if s]
    config.authenticator = SourceAuthenticator(
        tokens=dict(settings.get("auth_tokens", {})),
        hmac_secret=secret.encode() if isinstance(secret, str) else None,
        allowed_sources=frozenset(allowed) if allowed is not None else None,
    )
    defaults = SessionTimeouts()
    config.timeouts = SessionTimeouts(
        handshake_us=int(settings.get("handshake_timeout_s", defaults.handshake_us / 1e6) * 1_000_000),
        partial_frame_us=int(settings.get("partial_frame_timeout_s", defaults.partial_frame_us / 1e6) * 1_000_000),
        idle_us=int(settings.get("idle_timeout_s", defaults.idle_us / 1e6) * 1_000_000),
    )
    if _truthy(settings.get("timesync", True)):
        keys = {k: v.encode() for k, v in dict(settings.get("sync_keys", {})).items()}
        upstream = settings.get("upstream_ntp", ())
        if isinstance(upstream, str):
            upstream = [u for u in upstream.split(",") if u]
        config.timesync = ServerConfig(
            host=settings.get("timesync_host", config.host), port=settings.get("timesync_port", DEFAULT_SYNC_PORT),
            clock_offset_us=settings.get("clock_offset_us", 0), responder=ResponderConfig(keys=keys),
            upstream_servers=tuple(upstream))
    if "max_future_s" in settings:
        config.pipeline = replace(config.pipeline, max_future_us=int(settings["max_future_s"]) * 1_000_000)
    config.pipeline = _with_ordering_waits(config.pipeline, settings)
    cert, key = settings.get("tls_cert"), settings.get("tls_key")
    if (cert is None) != (key is None):
        raise ConfigError("tls_cert and tls_key go together")
    if cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        config.ssl_context = context
    return config


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
