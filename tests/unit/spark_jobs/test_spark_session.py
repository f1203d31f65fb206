"""Which master and which conf a job's session gets: pure decisions, no Spark started."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from spark_jobs.package import PYFILES_PACKAGES, ROOT, package_files, write_pyfiles_zip
from spark_jobs.session import (
    SessionConfigError,
    kafka_connector_coordinate,
    parse_shuffle_partitions,
    plan_session,
)

PYTHON = "/opt/venv/bin/python"


def test_a_bare_run_is_local_2_on_loopback_with_this_python_and_the_maven_cache_jars() -> None:
    plan = plan_session({}, {}, python=PYTHON)
    assert (plan.master, plan.local, plan.connector) == ("local[2]", True, "maven_cache")
    assert plan.environ_defaults == {"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": PYTHON}
    assert plan.conf == {
        "spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1", "spark.ui.enabled": "false",
        "spark.driver.memory": "1g", "spark.sql.shuffle.partitions": "2", "spark.sql.session.timeZone": "UTC",
        "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"}


def test_skewless_spark_master_chooses_a_bare_runs_master_and_a_cluster_master_binds_nothing() -> None:
    plan = plan_session({}, {"SKEWLESS_SPARK_MASTER": "spark://10.0.0.5:7077"}, python=PYTHON)
    assert (plan.master, plan.local) == ("spark://10.0.0.5:7077", False)
    # Not local: no loopback driver (workers must reach it), no executor Python of ours, Spark's shuffle default.
    assert plan.environ_defaults == {}
    assert not {"spark.driver.host", "spark.driver.bindAddress", "spark.sql.shuffle.partitions",
                "spark.ui.enabled"} & plan.conf.keys()
    assert plan_session({}, {"SKEWLESS_SPARK_MASTER": "local[4]"}, master="local[1]").master == "local[1]"


def test_under_spark_submit_its_master_and_every_conf_it_set_stand() -> None:
    launcher = {"spark.master": "spark://10.0.0.5:7077", "spark.sql.shuffle.partitions": "64",
                "spark.sql.session.timeZone": "Europe/Paris", "spark.pyspark.python": "/usr/bin/python3",
                "spark.jars.packages": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"}
    plan = plan_session(launcher, {"SKEWLESS_SPARK_MASTER": "local[2]", "SKEWLESS_SPARK_PACKAGES": "x:y:1"},
                        master="local[3]", python=PYTHON)
    # No builder .master() (it would beat --master), no connector of ours, no driver memory (the JVM runs).
    assert (plan.master, plan.local, plan.connector) == (None, False, "launcher")
    assert plan.environ_defaults == {}
    assert plan.conf == {"spark.sql.streaming.forceDeleteTempCheckpointLocation": "true"}


def test_spark_submit_with_a_local_master_stays_on_loopback_but_keeps_its_conf() -> None:
    plan = plan_session({"spark.master": "local[*]", "spark.driver.host": "10.0.0.9"}, {"SPARK_LOCAL_IP": "127.0.0.2"},
                        python=PYTHON)
    assert (plan.master, plan.local, plan.connector) == (None, True, "launcher")
    assert plan.environ_defaults == {"SPARK_LOCAL_IP": "127.0.0.2", "PYSPARK_PYTHON": PYTHON}
    assert plan.conf["spark.driver.bindAddress"] == "127.0.0.2"
    assert "spark.driver.host" not in plan.conf  # spark-submit's
    assert "spark.driver.memory" not in plan.conf
    assert plan.conf["spark.sql.shuffle.partitions"] == "2"


def test_shuffle_partitions_option_then_env_then_launcher_then_the_local_default() -> None:
    launcher = {"spark.master": "spark://h:7077", "spark.sql.shuffle.partitions": "64"}
    env = {"SKEWLESS_SPARK_SHUFFLE_PARTITIONS": "8"}
    assert plan_session(launcher, env, shuffle_partitions=4).conf["spark.sql.shuffle.partitions"] == "4"
    assert plan_session(launcher, env).conf["spark.sql.shuffle.partitions"] == "8"
    assert "spark.sql.shuffle.partitions" not in plan_session(launcher, {}).conf  # the launcher's 64 stands
    assert plan_session({}, {}).conf["spark.sql.shuffle.partitions"] == "2"
    with pytest.raises(SessionConfigError, match="SKEWLESS_SPARK_SHUFFLE_PARTITIONS"):
        plan_session({}, {"SKEWLESS_SPARK_SHUFFLE_PARTITIONS": "0"})
    with pytest.raises(SessionConfigError, match="positive integer"):
        parse_shuffle_partitions("two", "--shuffle-partitions")


def test_skewless_spark_packages_resolves_the_connector_with_spark_in_a_bare_run() -> None:
    plan = plan_session({}, {"SKEWLESS_SPARK_PACKAGES": "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"})
    assert plan.connector == "packages"
    assert plan.conf["spark.jars.packages"] == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"


def test_the_packages_coordinate_follows_pyspark_scala_and_spark_versions(tmp_path: Path) -> None:
    (tmp_path / "scala-library-2.13.16.jar").touch()
    (tmp_path / "scala-reflect-2.13.16.jar").touch()
    assert kafka_connector_coordinate("4.0.0", tmp_path) == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    (tmp_path / "scala-library-2.12.18.jar").touch()
    with pytest.raises(SessionConfigError, match="Scala version"):
        kafka_connector_coordinate("4.0.0", tmp_path)


def test_the_installed_pyspark_needs_the_documented_coordinate() -> None:
    from spark_jobs.session import installed_kafka_connector_coordinate

    # docs/spark-jobs.md and deploy/spark.Dockerfile name this coordinate: a pyspark upgrade must update them.
    assert installed_kafka_connector_coordinate() == "org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0"
    docs = (ROOT / "docs" / "spark-jobs.md").read_text()
    assert "--packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.0.0" in docs


def _first_party_imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}


def test_the_pyfiles_zip_holds_every_package_the_jobs_import(tmp_path: Path) -> None:
    # Closure over our own packages, from spark_jobs: an import added to a floor below must land in the zip.
    needed, todo = set(), ["spark_jobs"]
    while todo:
        package = todo.pop()
        needed.add(package)
        for module in (ROOT / package).rglob("*.py"):
            todo += [p for p in _first_party_imports(module) if p not in needed and p not in todo]
    assert needed == set(PYFILES_PACKAGES)
    written = write_pyfiles_zip(tmp_path / "pyfiles.zip")
    with zipfile.ZipFile(written) as archive:
        names = archive.namelist()
    assert "spark_jobs/stateful.py" in names and "contract/records.py" in names and "cep/sase/__init__.py" in names
    assert names == [p.as_posix() for p in package_files()]
    assert not [n for n in names if "__pycache__" in n or not n.endswith((".py", "py.typed"))]
    # Byte for byte the same from the same sources.
    assert write_pyfiles_zip(tmp_path / "again.zip").read_bytes() == written.read_bytes()


def test_every_kafka_read_of_the_jobs_is_read_committed_and_stops_on_lost_data() -> None:
    from spark_jobs.contract import kafka_source_options

    options = kafka_source_options("b:9092", "p\\.(events|late)\\.(s)", "earliest", 1_000)
    assert options == {"kafka.bootstrap.servers": "b:9092", "startingOffsets": "earliest",
                       "maxOffsetsPerTrigger": "1000", "kafka.isolation.level": "read_committed",
                       "failOnDataLoss": "true", "subscribePattern": "p\\.(events|late)\\.(s)"}
    assert kafka_source_options("b:9092", ["t1", "t2"], "latest", 5)["subscribe"] == "t1,t2"


@pytest.mark.parametrize("value", ["0", "-3", "many"])
def test_a_bad_shuffle_partitions_option_is_refused_before_spark_starts(
        value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from spark_jobs import cli

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(cli, "create_spark_session", no_spark)
    result = CliRunner().invoke(cli.spark_app, ["three-window", "--shuffle-partitions", value])
    assert result.exit_code == 2
    assert "--shuffle-partitions" in result.output
