"""The one table of gateway settings (gateway/settings.py) and what is derived from it: the config keys and checks,
the environment variables, the flags of `skewless gateway` and the tables of docs/operations.md."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from gateway.config import build_config, load_settings
from gateway.server import GatewayConfig
from gateway.settings import BOOL, BY_NAME, SETTINGS, TABLE, Setting, settings_markdown, with_settings_table
from skewless import cli_gateway
from skewless.cli import main

DOC = Path(__file__).resolve().parents[3] / "docs" / "operations.md"
WITH_DEFAULT = [setting for setting in SETTINGS if setting.default is not None]

# The flags `skewless gateway` had when they were written out by hand (b5e9227), the hidden one included.
FLAGS_BEFORE = {
    "--config", "--host", "--port", "--bootstrap", "--kafka-property", "--replication-factor", "--prefix",
    "--max-frame-bytes", "--metrics-port", "--metrics", "--no-metrics", "--metrics-host", "--tls-cert", "--tls-key",
    "--hmac-secret", "--auth-hmac-secret", "--timesync", "--no-timesync", "--timesync-port", "--clock-offset-us",
    "--max-future-s", "--shards", "--cluster", "--gateway-id", "--advertised-host", "--instance-id",
    "--session-timeout-s", "--reference-clock-error", "--reorder-mode", "--pass-late", "--drop-late", "--core",
    "--workers", "--log-json", "--log-level",
}


class Stop(Exception):
    pass


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("setting", WITH_DEFAULT, ids=lambda s: s.name)
def test_writing_a_documented_default_changes_nothing(setting: Setting) -> None:
    written = build_config(load_settings(None, env={}, overrides={setting.name: setting.default}))
    assert written == build_config({})


def test_a_changed_value_is_seen_by_the_comparison_above() -> None:
    assert build_config(load_settings(None, env={}, overrides={"merge_timeout_s": "501ms"})) != build_config({})


def test_settings_without_a_default_leave_their_field_unset() -> None:
    config, fresh = build_config({}), GatewayConfig()
    unset = [s for s in SETTINGS if s.default is None and s.config_field is not None]
    assert [s.name for s in unset] == ["replication_factor", "gateway_id", "advertised_host", "instance_id"]
    assert [getattr(config, s.config_field or "") for s in unset] == [None] * 4
    assert [getattr(fresh, s.config_field or "") for s in unset] == [None] * 4


@pytest.mark.parametrize("setting", [s for s in WITH_DEFAULT if s.kind != TABLE], ids=lambda s: s.name)
def test_every_variable_the_table_names_is_read(setting: Setting) -> None:
    text = setting.default_text if setting.kind == BOOL else str(setting.default)
    for variable in setting.environment:
        read = load_settings(None, env={variable: text})
        assert list(read) == [setting.name]
        assert build_config(read) == build_config({})


def test_the_shared_variables_win_over_the_gateways_own() -> None:
    shared = {s.name: s.environment for s in SETTINGS if s.shared_env}
    assert shared == {
        "bootstrap": ("SKEWLESS_BOOTSTRAP", "SKEWLESS_GATEWAY_BOOTSTRAP"),
        "hmac_secret": ("SKEWLESS_HMAC_SECRET", "SKEWLESS_GATEWAY_HMAC_SECRET"),
        "hmac_master": ("SKEWLESS_HMAC_MASTER", "SKEWLESS_GATEWAY_HMAC_MASTER"),
    }
    settings = load_settings(None, env={"SKEWLESS_GATEWAY_BOOTSTRAP": "own:1", "SKEWLESS_BOOTSTRAP": "shared:1"})
    assert settings == {"bootstrap": "shared:1"}


def test_tables_come_from_a_file_only() -> None:
    tables = [s.name for s in SETTINGS if s.kind == TABLE]
    assert tables == ["kafka", "producer", "source_keys", "auth_tokens", "sync_keys"]
    assert all(BY_NAME[name].environment == () for name in tables)


def _gateway_command() -> Any:
    local = typer.Typer()
    cli_gateway.register(local)
    return typer.main.get_command(local).commands["gateway"]  # type: ignore[attr-defined]


def test_the_gateway_keeps_every_flag_it_had() -> None:
    params = _gateway_command().params
    assert {flag for p in params for flag in (*p.opts, *p.secondary_opts)} == FLAGS_BEFORE
    hidden = [p.name for p in params if getattr(p, "hidden", False)]
    assert hidden == ["auth_hmac_secret"]
    flagged = [s.name for s in SETTINGS if s.flag]
    assert [p.name for p in params][1:len(flagged) + 1] == flagged  # after --config, in the table's order


def test_flag_help_says_the_default_the_unit_and_the_shared_variable() -> None:
    helps = {p.name: p.help for p in _gateway_command().params}
    assert helps["port"] == "TCP listen port, 0 = any free port [7700]."
    assert helps["bootstrap"] == "Kafka bootstrap servers (env SKEWLESS_BOOTSTRAP) [127.0.0.1:9092]."
    assert helps["max_future_s"] == ("Quarantine events whose reference time is this far ahead of the gateway "
                                     "clock; a bare number is seconds [60s].")
    assert helps["pass_late"].endswith("instead of the late topic only [--drop-late].")
    assert helps["tls_key"] == "PEM private key for --tls-cert."


def _config_of(monkeypatch: pytest.MonkeyPatch, *argv: str) -> GatewayConfig:
    """The configuration `skewless gateway ARGV` builds (it stops before reaching Kafka)."""
    built: list[GatewayConfig] = []

    def probe(_client: object, *_: object) -> int:
        raise Stop

    def build(settings: Any) -> GatewayConfig:
        built.append(build_config(settings))
        return built[-1]

    monkeypatch.setattr(cli_gateway, "probe_kafka", probe)
    monkeypatch.setattr(cli_gateway, "build_config", build)
    for variable in [v for s in SETTINGS for v in s.environment]:
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(Stop):
        main(["--debug", "gateway", *argv])
    return built[0]


def test_every_flag_given_its_documented_default_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    argv: list[str] = []
    for setting in WITH_DEFAULT:
        if setting.flag is None:
            continue
        if setting.kind == BOOL:
            on, off = setting.flag.split("/")
            argv.append(on if setting.default else off)
        else:
            argv += [setting.flag, str(setting.default)]
    assert len(argv) > 30
    assert _config_of(monkeypatch, *argv) == build_config({})
    changed = _config_of(monkeypatch, "--prefix", "p", "--no-metrics", "--pass-late", "--core", "python")
    assert (changed.topic_prefix, changed.metrics_port, changed.pipeline.drop_late, changed.core) == (
        "p", None, False, "python")


def test_the_deprecated_flag_still_sets_the_secret_and_the_new_one_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _config_of(monkeypatch, "--auth-hmac-secret", "old").authenticator.hmac_secret == b"old"
    both = _config_of(monkeypatch, "--auth-hmac-secret", "old", "--hmac-secret", "new")
    assert both.authenticator.hmac_secret == b"new"


def test_a_row_of_the_docs_table() -> None:
    lines = settings_markdown().splitlines()
    assert "| `port` | port | `7700` | `SKEWLESS_GATEWAY_PORT` | `--port` | TCP listen port, 0 = any free port. |" \
        in lines
    assert ("| `producer` | table |  | (a file only) |  | librdkafka properties for the producer only "
            "(`[gateway.producer]`), on top of `[kafka]`. Both sit on the gateway's defaults: acks=all, idempotence, "
            "lz4, batches of up to 10,000 records (broker/client.py), and `linger.ms` 100 with transactions (their "
            "records are visible at the commit, whose flush sends what lingers; broker/transactions.py), 2 without "
            "(acks wait for the delivery). |") in lines
    assert sum(line.startswith("| `") for line in lines) == len(SETTINGS)


def test_the_operations_doc_holds_the_generated_tables() -> None:
    text = DOC.read_text()
    assert with_settings_table(text) == text, "run `make docs-settings` (python -m scripts.settings_doc)"


def test_a_doc_without_markers_is_refused() -> None:
    with pytest.raises(ValueError, match=re.escape("no <!-- settings:begin --> ... <!-- settings:end --> markers")):
        with_settings_table("# no table here\n")
    assert with_settings_table("a\n<!-- settings:begin -->\nold\n<!-- settings:end -->\nb\n") == (
        f"a\n<!-- settings:begin -->\n{settings_markdown()}\n<!-- settings:end -->\nb\n")
