"""`skewless spark ...` option errors come before any Spark session starts."""

import pytest
from typer.testing import CliRunner

from spark_jobs import cli


@pytest.mark.parametrize("args", [
    ["window-count", "--allowed-lateness", "5"],
    ["window-count", "--window", "abc"],
    ["three-window", "--allowed-lateness", "an hour"],
    ["pattern", "--pattern", "SEQ(a: k == 'a', b: k == 'b') WITHIN 1 s", "--allowed-lateness", "x"],
    ["sequence", "--query", "EVENT SEQ(A a, B b) WITHIN 1 s", "--allowed-lateness", "-"],
])
def test_a_bad_duration_is_refused_before_spark_starts(args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "create_spark_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, args)
    assert result.exit_code == 2
    assert "not a duration" in result.output
