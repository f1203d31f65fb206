"""deploy/compose.yaml, Dockerfile, deploy/spark.Dockerfile and .dockerignore, read as they are.

No Docker engine runs here: these tests are what keeps the deployment files right. Every command line in the
compose file is parsed with the real command line (gateway flags, spark job flags), so a renamed flag fails here.
"""

from __future__ import annotations

import base64
import re
import shlex
import tomllib
from collections import Counter
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import typer
import typer.main
import yaml

from skewless import cli_gateway as gateway_cli
from spark_jobs import cli as spark_cli
from spark_jobs.session import installed_kafka_connector_coordinate

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose.yaml"
GATEWAY_DOCKERFILE = ROOT / "Dockerfile"
SPARK_DOCKERFILE = ROOT / "deploy" / "spark.Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
GATEWAY_COUNT = 3


# -- reading the files ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(loaded, dict)
    return loaded


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return dict(compose["services"])


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    return instructions


def dockerfile_env(path: Path) -> dict[str, str]:
    env: dict[str, str] = {}
    for keyword, args in dockerfile_instructions(path):
        if keyword == "ENV":
            for token in shlex.split(args):
                name, _, value = token.partition("=")
                env[name] = value
    return env


def dockerfile_copied(path: Path) -> set[str]:
    """Sources of the COPY instructions that read the build context (not --from another stage)."""
    copied: set[str] = set()
    for keyword, args in dockerfile_instructions(path):
        if keyword == "COPY" and "--from" not in args:
            copied.update(p.rstrip("/") for p in args.split()[:-1])
    return copied


def final_stage(path: Path) -> list[tuple[str, str]]:
    instructions = dockerfile_instructions(path)
    last_from = max(i for i, (keyword, _) in enumerate(instructions) if keyword == "FROM")
    return instructions[last_from:]


def run_commands(path: Path) -> str:
    return "\n".join(args for keyword, args in final_stage(path) if keyword == "RUN")


def image_user(path: Path) -> str:
    users = [args for keyword, args in final_stage(path) if keyword == "USER"]
    assert users, f"{path.name} runs as root"
    return users[-1].split(":")[0]


def built_from(service: dict[str, Any]) -> str:
    """The Dockerfile a service is built from, relative to deploy/ ("" for a pulled image)."""
    build = service.get("build")
    if not isinstance(build, dict):
        return ""
    return str(PurePosixPath(build.get("context", ".")) / build.get("dockerfile", "Dockerfile"))


def cli_params(argv: list[str]) -> dict[str, Any]:
    """Parse a `skewless ...` command line with the real commands (gateway, spark <job>) without running it."""
    app = typer.Typer()
    gateway_cli.register(app)
    spark_cli.register(app)
    command: Any = typer.main.get_command(app)
    args = list(argv)
    while hasattr(command, "commands"):
        assert args, f"{argv}: no subcommand"
        name, args = args[0], args[1:]
        assert name in command.commands, f"{argv}: no command {name!r}"
        command = command.commands[name]
    return dict(command.make_context(name, args).params)


def gateways(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items()
            if built_from(s) == "../Dockerfile" and s["command"][0] == "gateway"}


def gateway_params(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: cli_params(s["command"]) for name, s in gateways(services).items()}


def spark_submit_jobs(services: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in services.items() if s.get("command", [None])[0] == "spark-submit"}


def split_spark_submit(command: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """spark-submit's options (name -> values), the application file, the application's arguments."""
    options: dict[str, list[str]] = {}
    index = 1
    while command[index].startswith("--"):
        options.setdefault(command[index], []).append(command[index + 1])
        index += 2
    return options, command[index], command[index + 1:]


def spark_confs(options: dict[str, list[str]]) -> dict[str, str]:
    return dict(conf.split("=", 1) for conf in options.get("--conf", []))


def ports(service: dict[str, Any]) -> list[tuple[int, int, str]]:
    """(host port, container port, protocol) of the short syntax "HOST:CONTAINER[/PROTO]"."""
    mapped = []
    for entry in service.get("ports", []):
        spec, _, protocol = str(entry).partition("/")
        host, container = spec.rsplit(":", 1)[-2:] if spec.count(":") else (spec, spec)
        mapped.append((int(host), int(container), protocol or "tcp"))
    return mapped


def mounts(service: dict[str, Any]) -> dict[str, str]:
    """Container path -> named volume (or host path) of the short syntax "SOURCE:TARGET[:MODE]"."""
    return {str(v).split(":")[1]: str(v).split(":")[0] for v in service.get("volumes", [])}


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


# -- gateways ------------------------------------------------------------------------------------------------------

def test_three_gateways_form_one_cluster(services: dict[str, dict[str, Any]]) -> None:
    params = gateway_params(services)
    assert len(params) == GATEWAY_COUNT, sorted(params)
    # By setting name (gateway/settings.py): `--prefix` sets topic_prefix.
    for key in ("shards", "topic_prefix", "cluster", "bootstrap", "reference_clock_error"):
        values = {p[key] for p in params.values()}
        assert len(values) == 1 and None not in values, f"setting {key} differs or is missing: {values}"
    shards = next(iter(params.values()))["shards"]
    assert shards >= GATEWAY_COUNT, "every gateway owns a shard"
    for name, p in params.items():
        assert p["advertised_host"] == name, f"{name} advertises {p['advertised_host']!r}, not its service name"
        assert p["host"] == "0.0.0.0" and p["metrics_host"] == "0.0.0.0", f"{name} listens on loopback only"
        assert p["workers"] == 1, "one process a container: compose's gateways are the cluster"
    for key in ("instance_id", "gateway_id"):
        ids = [p[key] for p in params.values()]
        assert None not in ids and len(set(ids)) == len(ids), f"--{key.replace('_', '-')}: {ids}"


def test_gateways_reach_kafka_on_its_in_network_listener(services: dict[str, dict[str, Any]]) -> None:
    advertised = services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"].split(",")
    in_network = {a.split("://", 1)[1] for a in advertised if a.startswith("PLAINTEXT://")}
    for name, p in gateway_params(services).items():
        assert p["bootstrap"] in in_network, name
        assert services[name]["depends_on"]["kafka"]["condition"] == "service_healthy", name


def test_each_gateway_publishes_its_own_ports_unchanged(services: dict[str, dict[str, Any]]) -> None:
    """A redirect names (advertised host, the owner's --port, its --timesync-port): container port = host port
    keeps that address right inside the network and from the host."""
    for name, p in gateway_params(services).items():
        published = ports(services[name])
        assert all(host == container for host, container, _ in published), f"{name}: {published}"
        assert {(c, proto) for _, c, proto in published} == {
            (p["port"], "tcp"), (p["timesync_port"], "udp"), (p["metrics_port"], "tcp")}, name


def test_no_host_port_is_published_twice(services: dict[str, dict[str, Any]]) -> None:
    published = Counter((host, proto) for s in services.values() for host, _, proto in ports(s))
    assert [p for p, n in published.items() if n > 1] == []


def test_gateway_healthchecks_ask_their_own_healthz_with_the_images_python(services: dict[str, dict[str, Any]]) -> None:
    assert next(args for k, args in final_stage(GATEWAY_DOCKERFILE) if k == "FROM").startswith("python:")
    for name, p in gateway_params(services).items():
        test = services[name]["healthcheck"]["test"]
        assert test[:2] == ["CMD", "python"], f"{name}: only what the image has"
        assert f"127.0.0.1:{p['metrics_port']}/healthz" in " ".join(test), name


# -- Kafka ---------------------------------------------------------------------------------------------------------

def test_kafka_keeps_its_log_in_the_named_volume(services: dict[str, dict[str, Any]]) -> None:
    kafka = services["kafka"]
    assert kafka["image"].startswith("apache/kafka:")
    log_dirs = kafka["environment"]["KAFKA_LOG_DIRS"]
    assert mounts(kafka).get(log_dirs) == "kafka-data", f"KAFKA_LOG_DIRS={log_dirs} is not the volume's mount"


def test_kafka_listeners_serve_the_network_and_the_host(services: dict[str, dict[str, Any]]) -> None:
    env = services["kafka"]["environment"]
    names = dict(item.split(":") for item in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    listeners = {a.split("://")[0]: int(a.rsplit(":", 1)[1]) for a in env["KAFKA_LISTENERS"].split(",")}
    advertised = {a.split("://")[0]: a.split("://")[1] for a in env["KAFKA_ADVERTISED_LISTENERS"].split(",")}
    assert set(listeners) <= set(names) and set(advertised) <= set(listeners)
    assert advertised["PLAINTEXT"] == "kafka:9092"
    host_listeners = [n for n, a in advertised.items() if a.startswith("localhost:")]
    assert host_listeners, "no listener reachable from the host"
    for listener in host_listeners:
        port = int(advertised[listener].rsplit(":", 1)[1])
        assert listeners[listener] == port
        assert (port, port, "tcp") in ports(services["kafka"]), f"{listener} is not published"


def test_kafka_cluster_id_is_a_kraft_uuid(services: dict[str, dict[str, Any]]) -> None:
    cluster_id = services["kafka"]["environment"].get("CLUSTER_ID")
    if cluster_id is not None:
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, cluster_id


# -- Spark ---------------------------------------------------------------------------------------------------------

def test_spark_master_and_worker_run_sparks_own_daemons(services: dict[str, dict[str, Any]]) -> None:
    master, worker = services["spark-master"], services["spark-worker"]
    for service in (master, worker):
        assert built_from(service) == "../deploy/spark.Dockerfile"
        assert service["command"][0] == "spark-class"
    assert master["command"][1] == "org.apache.spark.deploy.master.Master"
    assert option(master["command"], "--host") == master["hostname"] == "spark-master"
    assert worker["command"][1] == "org.apache.spark.deploy.worker.Worker"
    assert worker["command"][2] == f"spark://spark-master:{option(master['command'], '--port')}"
    assert option(worker["command"], "--host") == worker["hostname"] == "spark-worker"
    assert worker["depends_on"]["spark-master"]["condition"] == "service_healthy"
    assert "healthcheck" in master and "healthcheck" in worker


def test_jobs_are_submitted_to_the_master(services: dict[str, dict[str, Any]]) -> None:
    jobs = spark_submit_jobs(services)
    assert {"window-count", "three-window"} <= set(jobs)
    master_url = services["spark-worker"]["command"][2]
    spark_env = dockerfile_env(SPARK_DOCKERFILE)
    gateway_prefix = {p["topic_prefix"] for p in gateway_params(services).values()}
    for name, service in jobs.items():
        assert built_from(service) == "../deploy/spark.Dockerfile"
        options, app_file, app_args = split_spark_submit(service["command"])
        conf = spark_confs(options)
        assert options["--master"] == [master_url], name
        assert options.get("--deploy-mode", ["client"]) == ["client"], "standalone runs no Python driver in cluster"
        assert options["--packages"] == [installed_kafka_connector_coordinate()], name
        # Executors run the image's venv Python, where skewless (spark_jobs, cep, contract, broker) is installed.
        assert conf["spark.pyspark.python"] == "/opt/skewless/bin/python"
        assert "python -m venv /opt/skewless" in run_commands(SPARK_DOCKERFILE)
        assert conf["spark.driver.host"] == service["hostname"] == name, "executors reach the driver by name"
        assert app_file == spark_env["SKEWLESS_SUBMIT"]
        assert app_file.endswith("/site-packages/spark_jobs/submit.py") and (ROOT / "spark_jobs/submit.py").exists()
        params = cli_params(["spark", *app_args])
        assert params["bootstrap"] == "kafka:9092" and {params["prefix"]} == gateway_prefix, name
        assert params["shuffle_partitions"] is not None, f"{name}: Spark's default of 200 tasks on one worker"


def pinned_version(package: str) -> str:
    """The exact version of ``package`` the project is tested with: constraints.txt, else an exact pyproject pin."""
    constraints = ROOT / "constraints.txt"
    lines = constraints.read_text().splitlines() if constraints.exists() else [
        p for ps in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"].values()
        for p in ps]
    return next(line.split("==")[1].split(";")[0].strip() for line in lines
                if line.lower().startswith(f"{package}=="))


def test_the_kafka_connector_matches_the_images_pyspark() -> None:
    assert installed_kafka_connector_coordinate().endswith(f":{pinned_version('pyspark')}")
    assert dockerfile_env(SPARK_DOCKERFILE)["SKEWLESS_SPARK_PACKAGES"] == installed_kafka_connector_coordinate()
    runs = run_commands(SPARK_DOCKERFILE)
    assert '"skewless[spark]==' in runs, "the image installs the spark extra"
    if (ROOT / "constraints.txt").exists():
        assert "-c constraints.txt" in runs, "at the versions the project is tested with"


def test_the_gateway_image_installs_the_gateway_extra_at_the_tested_versions() -> None:
    """The base install is the SDK alone: the gateway's Kafka, metrics and CLI dependencies come with the extra."""
    build = "\n".join(args for keyword, args in dockerfile_instructions(GATEWAY_DOCKERFILE) if keyword == "RUN")
    assert '".[gateway]"' in build and '"skewless[gateway]==' in run_commands(GATEWAY_DOCKERFILE)
    if (ROOT / "constraints.txt").exists():
        assert "-c constraints.txt" in build


def test_the_worker_has_a_core_for_every_job(services: dict[str, dict[str, Any]]) -> None:
    """A standalone application takes every free core unless spark.cores.max says otherwise: the second job would
    wait for executors forever."""
    worker = services["spark-worker"]["command"]
    wanted = [int(spark_confs(split_spark_submit(s["command"])[0])["spark.cores.max"])
              for s in spark_submit_jobs(services).values()]
    assert sum(wanted) <= int(option(worker, "--cores")), wanted


def test_checkpoints_are_shared_by_drivers_and_executors(services: dict[str, dict[str, Any]]) -> None:
    worker_mounts = mounts(services["spark-worker"])
    for name, service in spark_submit_jobs(services).items():
        checkpoint = PurePosixPath(option(split_spark_submit(service["command"])[2], "--checkpoint"))
        job_mounts = mounts(service)
        target = next((t for t in job_mounts if PurePosixPath(t) in checkpoint.parents), None)
        assert target is not None, f"{name}: --checkpoint {checkpoint} is in no volume"
        assert worker_mounts.get(target) == job_mounts[target], f"{name}: executors write the state stores there"


def test_volume_mount_points_belong_to_the_uid_the_jobs_run_as(services: dict[str, dict[str, Any]]) -> None:
    """A fresh named volume takes the ownership of the image's mount point; a root-owned one is not writable."""
    uid = image_user(SPARK_DOCKERFILE)
    assert uid == "10001"
    runs = run_commands(SPARK_DOCKERFILE)
    made = {p for m in re.finditer(r"mkdir -p ((?:/\S+\s*)+)", runs) for p in m.group(1).split()}
    owned = {m.group(1) for m in re.finditer(rf"chown -R {uid}:{uid} (/\S+)", runs)}
    spark_services = [s for s in services.values() if built_from(s) == "../deploy/spark.Dockerfile"]
    targets = {t for s in spark_services for t in mounts(s)}
    targets |= {option(s["command"], "--work-dir") for s in spark_services if "--work-dir" in s["command"]}
    assert targets
    for target in targets:
        assert target in made, f"{target} is not created in the image"
        assert any(PurePosixPath(o) in (PurePosixPath(target), *PurePosixPath(target).parents) for o in owned), target


# -- the whole file ------------------------------------------------------------------------------------------------

def test_every_named_volume_is_declared_and_used(compose: dict[str, Any], services: dict[str, dict[str, Any]]) -> None:
    used = {source for s in services.values() for source in mounts(s).values() if not source.startswith((".", "/"))}
    declared = set(compose.get("volumes") or {})
    assert used == declared


def test_dependencies_exist_and_wait_only_for_healthchecks(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        for dependency, condition in (service.get("depends_on") or {}).items():
            assert dependency in services, f"{name} depends on a missing {dependency}"
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[dependency], f"{name} waits for {dependency}'s missing healthcheck"


def test_both_images_copy_every_package() -> None:
    """The wheel is built from what the image copied: a package missing here is missing at import time."""
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    for dockerfile in (GATEWAY_DOCKERFILE, SPARK_DOCKERFILE):
        copied = dockerfile_copied(dockerfile)
        pins = {"constraints.txt"} if (ROOT / "constraints.txt").exists() else set()
        wanted = packages | {"pyproject.toml", "README.md"} | pins
        assert wanted <= copied, (dockerfile.name, wanted - copied)


def test_dockerignore_keeps_the_build_context_small_but_complete() -> None:
    patterns = {line.strip().rstrip("/") for line in DOCKERIGNORE.read_text().splitlines()
                if line.strip() and not line.startswith("#")}
    assert {".venv", ".cache", ".git", "artifacts", "**/__pycache__", "docs", ".env"} <= patterns
    for dockerfile in (GATEWAY_DOCKERFILE, SPARK_DOCKERFILE):
        assert not dockerfile_copied(dockerfile) & patterns, f"{dockerfile.name} copies an ignored path"


# -- users, healthchecks, volumes: what issue 15 found missing -----------------------------------------------------

ROOT_USERS = {"0", "root", "0:0", "root:root"}
# Images that run unprivileged by their own USER (appuser, nobody, grafana's 472) and own their data directories.
PULLED_IMAGES = {"apache/kafka", "prom/prometheus", "grafana/grafana"}


def test_no_service_runs_as_root(services: dict[str, dict[str, Any]]) -> None:
    """Built images end with USER 10001 (the checkpoint volume's owner); a compose `user:` may only repeat it. The
    pulled images run as their own unprivileged users, which own their data directories: no override."""
    images = {"../Dockerfile": GATEWAY_DOCKERFILE, "../deploy/spark.Dockerfile": SPARK_DOCKERFILE}
    for name, service in services.items():
        override = str(service.get("user", ""))
        assert override not in ROOT_USERS, f"{name} runs as root"
        dockerfile = built_from(service)
        if dockerfile:
            assert image_user(images[dockerfile]) == "10001", name
            assert override in ("", "10001", "10001:10001"), f"{name}: user {override} cannot write the volumes"
        else:
            assert service["image"].split(":")[0] in PULLED_IMAGES and override == "", name


def test_every_long_running_service_has_a_healthcheck_on_its_own_port(services: dict[str, dict[str, Any]]) -> None:
    """Kafka, the gateways and the Spark daemons are what others wait for (depends_on: service_healthy)."""
    daemons = {name for name, s in services.items() if s.get("command", ["-"])[0] != "spark-submit"}
    assert daemons == {"kafka", "spark-master", "spark-worker", "prometheus", "grafana", *gateways(services)}
    for name in daemons:
        test = " ".join(services[name]["healthcheck"]["test"])
        assert "127.0.0.1:" in test or "localhost:" in test, f"{name}: a healthcheck must ask the container itself"
    kafka_test = " ".join(services["kafka"]["healthcheck"]["test"])
    assert "localhost:9092" in kafka_test, "Kafka's healthcheck asks the listener the gateways use"


def test_state_lives_in_named_volumes(services: dict[str, dict[str, Any]]) -> None:
    """Recreating a container keeps Kafka's log and the jobs' checkpoints."""
    assert mounts(services["kafka"]) == {services["kafka"]["environment"]["KAFKA_LOG_DIRS"]: "kafka-data"}
    for name in ("spark-worker", *spark_submit_jobs(services)):
        assert mounts(services[name]) == {"/var/lib/skewless/checkpoints": "spark-checkpoints"}, name


def test_prometheus_scrapes_every_gateways_metrics_port(services: dict[str, dict[str, Any]]) -> None:
    prometheus = services["prometheus"]
    config_file = next(source for source, target in
                       ((str(v).split(":")[0], str(v).split(":")[1]) for v in prometheus["volumes"])
                       if target == "/etc/prometheus/prometheus.yml")
    scrape = yaml.safe_load((COMPOSE.parent / config_file).read_text())
    targets = {t for job in scrape["scrape_configs"] for group in job["static_configs"] for t in group["targets"]}
    assert targets == {f"{name}:{p['metrics_port']}" for name, p in gateway_params(services).items()}


def test_grafana_mounts_exist_in_the_checkout(services: dict[str, dict[str, Any]]) -> None:
    for name in ("prometheus", "grafana"):
        for source in mounts(services[name]).values():
            if source.startswith("."):
                assert (COMPOSE.parent / source).exists(), f"{name} mounts a missing {source}"


def test_the_gateway_image_builds_and_installs_the_native_data_plane() -> None:
    """The crate is built by maturin in its own stage from the locked crates, and the runtime stage installs that
    wheel beside skewless: a gateway image without it would fail at its first import of skewless_native."""
    instructions = dockerfile_instructions(GATEWAY_DOCKERFILE)
    stages = [args for keyword, args in instructions if keyword == "FROM"]
    assert any(args.startswith("rust:") and args.endswith(" AS native") for args in stages), stages
    runs = "\n".join(args for keyword, args in instructions if keyword == "RUN")
    assert "maturin build --release --locked --manifest-path native/Cargo.toml" in runs
    # Not an abi3 wheel: built for the runtime stage's CPython, which must be the one it was built for.
    assert "--interpreter python3.11" in runs
    assert stages[-1].startswith("python:3.11-"), stages
    assert "native" in dockerfile_copied(GATEWAY_DOCKERFILE)
    assert any(k == "COPY" and "--from=native" in a for k, a in instructions)
    assert "skewless-native==" in run_commands(GATEWAY_DOCKERFILE)
    assert (ROOT / "native" / "Cargo.lock").is_file()
    assert "native/target" in DOCKERIGNORE.read_text().split()


def test_every_spark_role_in_the_image_reads_the_projects_log4j2_file() -> None:
    """Master, workers and spark-submit's driver read $SPARK_HOME/conf/log4j2.properties: the shipped quiet file
    (tests/integration/test_spark_quiet.py keeps it equal to what a bare run generates)."""
    spark_home = dockerfile_env(SPARK_DOCKERFILE)["SPARK_HOME"]
    copies = [args.split() for keyword, args in final_stage(SPARK_DOCKERFILE) if keyword == "COPY"]
    assert ["deploy/spark-log4j2.properties", "$SPARK_HOME/conf/log4j2.properties"] in copies
    assert spark_home.endswith("/pyspark")
    assert (ROOT / "deploy" / "spark-log4j2.properties").is_file()


def test_every_documented_spark_submit_line_points_its_driver_at_the_log4j2_file() -> None:
    """A spark-submit outside the image starts its driver's JVM before any project code: only this option keeps
    Spark's ~80 INFO lines out (docs/spark-jobs.md, "On a cluster")."""
    blocks = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        text = page.read_text()
        blocks += [(page.name, text[i:].split("\n\n")[0]) for i in range(len(text))
                   if text.startswith("spark-submit \\", i)]
    assert {name for name, _ in blocks} >= {"consume.md", "spark-jobs.md"}
    for name, block in blocks:
        assert "--driver-java-options -Dlog4j2.configurationFile=deploy/spark-log4j2.properties" in block, name
