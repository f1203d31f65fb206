"""`skewless timesync` command: help text, a short run, key file parsing."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from skewless.cli_timesync import load_keys, register


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def noop() -> None:  # a second command keeps typer in multi-command mode
        """Nothing."""

    return app


def test_help_lists_options() -> None:
    result = CliRunner().invoke(_app(), ["timesync", "--help"])
    assert result.exit_code == 0
    for option in ("--host", "--port", "--clock-offset-us", "--keys-file", "--upstream"):
        assert option in result.output


def test_runs_for_a_bounded_time() -> None:
    result = CliRunner().invoke(
        _app(), ["timesync", "--host", "127.0.0.1", "--port", "0", "--clock-offset-us", "5", "--duration-s", "0.2"]
    )
    assert result.exit_code == 0, result.output
    assert "serving NTP on 127.0.0.1" in result.output
    assert '"replied": 0' in result.output


def test_load_keys(tmp_path: Path) -> None:
    p = tmp_path / "keys.txt"
    p.write_text("# comment\nsensor-1 = 00ff10\n\nsensor-2=abcd  # trailing\n", encoding="utf-8")
    assert load_keys(p) == {"sensor-1": b"\x00\xff\x10", "sensor-2": b"\xab\xcd"}
    p.write_text("broken line\n", encoding="utf-8")
    with pytest.raises(typer.BadParameter):
        load_keys(p)
    p.write_text("a = nothex\n", encoding="utf-8")
    with pytest.raises(typer.BadParameter):
        load_keys(p)
