"""`skewless gateway`: run the ingestion gateway."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import signal
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from broker.admin import TopicConfigError
from broker.cli import CommandError, KafkaProperties, parse_kafka_properties, probe_kafka
from gateway.auth import derive_source_key
from gateway.config import BOOTSTRAP_ENV, HMAC_MASTER_ENV, HMAC_SECRET_ENV, ConfigError, build_config, load_settings
from gateway.launch import GatewayAddresses, GatewayLaunchError, ready_lines, spawn_gateway
from gateway.logs import LogLevel, child_env, configure_logging, current_log_format, current_log_level
from gateway.server import ClusterConfigError, Gateway, GatewayConfig


def gateway(
    config_file: Annotated[Path | None, typer.Option(
        "--config", help="TOML file with a [gateway] table (settings: docs/architecture.md) and a [kafka] table of "
                         "librdkafka properties shared by every Kafka client.")] = None,
    host: Annotated[str | None, typer.Option(help="TCP listen address [127.0.0.1].")] = None,
    port: Annotated[int | None, typer.Option(help="TCP listen port, 0 = any free port [7700].")] = None,
    bootstrap: Annotated[str | None, typer.Option(
        help=f"Kafka bootstrap servers (env {BOOTSTRAP_ENV}) [127.0.0.1:9092].")] = None,
    kafka_property: KafkaProperties = None,
    replication_factor: Annotated[int | None, typer.Option(
        help="Replicas of every topic the gateway creates [min(3, brokers in the cluster)].")] = None,
    prefix: Annotated[str | None, typer.Option(help="Topic prefix [skewless].")] = None,
    max_frame_bytes: Annotated[int | None, typer.Option(help="Largest accepted frame body [1 MiB].")] = None,
    metrics_port: Annotated[int | None, typer.Option(
        help="Serve /metrics and /healthz on this port, 0 = any free port [7780].")] = None,
    metrics: Annotated[bool | None, typer.Option(
        "--metrics/--no-metrics", help="Serve /metrics and /healthz (docs/operations.md) [on].")] = None,
    metrics_host: Annotated[str | None, typer.Option(help="Address of the metrics endpoint [127.0.0.1].")] = None,
    tls_cert: Annotated[Path | None, typer.Option(help="PEM certificate: enables TLS.")] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key for --tls-cert.")] = None,
    hmac_secret: Annotated[str | None, typer.Option(
        help=f"Require HMAC tokens made with this secret (env {HMAC_SECRET_ENV}).")] = None,
    auth_hmac_secret: Annotated[str | None, typer.Option(hidden=True, help="Deprecated spelling of --hmac-secret.")
                                ] = None,
    timesync: Annotated[bool | None, typer.Option(
        "--timesync/--no-timesync", help="Run the NTP-format time-sync server and map source clocks [on].")] = None,
    timesync_port: Annotated[int | None, typer.Option(help="UDP port of the time-sync server [7452].")] = None,
    clock_offset_us: Annotated[str | None, typer.Option(
        metavar="DURATION", help="Shift the gateway's reference clock by this much, e.g. 250ms or -1.5s; a bare "
                                 "number is microseconds (demos of a skewed reference).")] = None,
    max_future_s: Annotated[str | None, typer.Option(
        metavar="DURATION", help="Quarantine events whose reference time is this far ahead of the gateway clock; "
                                 "a bare number is seconds [60s].")] = None,
    shards: Annotated[int | None, typer.Option(
        help="Shards of the deployment (S): fixed for its life; every stream's topics get S partitions [1].")] = None,
    cluster: Annotated[str | None, typer.Option(
        help="Name of the deployment; a second cluster on the same topic prefix is refused [skewless].")] = None,
    gateway_id: Annotated[str | None, typer.Option(help="This gateway's id in logs and redirects [address+random].")
                          ] = None,
    advertised_host: Annotated[str | None, typer.Option(
        help="Address sources are redirected to [--host, or the host name for a wildcard --host].")] = None,
    instance_id: Annotated[str | None, typer.Option(
        help="Kafka static membership id: a restart with the same id takes its shards back at once.")] = None,
    session_timeout_s: Annotated[str | None, typer.Option(
        metavar="DURATION", help="Kafka group session timeout: a gateway silent this long loses its shards to the "
                                 "others (the failover time); at least 1s and within the broker's "
                                 "group.min/max.session.timeout.ms; a bare number is seconds [6s].")] = None,
    reference_clock_error: Annotated[str | None, typer.Option(
        help="This host's clock error against common time, added to every event's uncertainty: a duration "
             "(2ms), or 'chrony' to read chronyd's bound [0: gateways share one host's clock].")] = None,
    reorder_mode: Annotated[str | None, typer.Option(
        help="The reorderer: 'sequence' (adaptive) or 'thesis' (Eq. 3.11's gap timeout and the thesis' merge) "
             "[sequence].")] = None,
    pass_late: Annotated[bool | None, typer.Option(
        "--pass-late/--drop-late", help="Publish late events on the events topic flagged late, instead of the late "
                                        "topic only [--drop-late].")] = None,
    core: Annotated[str | None, typer.Option(
        help="The per-event cores: 'native' (Rust: connection decoder, sequence reorderers), 'python' (their "
             "specification) or 'auto' (native when built) [auto].")] = None,
    workers: Annotated[int, typer.Option(
        help="Gateway processes on this host, one cluster (ports --port, --port+1, ...; same for the time-sync and "
             "metrics ports).", min=1)] = 1,
    log_json: Annotated[bool | None, typer.Option(
        "--log-json", help="Same as `skewless --log-format json gateway ...`.")] = None,
    log_level: Annotated[LogLevel | None, typer.Option(
        case_sensitive=False, help="Same as `skewless --log-level LEVEL gateway ...`.")] = None,
) -> None:
    """Accept events from sources over TCP and publish them to Kafka; prints `listening HOST:PORT` when ready (after
    the time-sync and metrics addresses, if any).

    Settings come from --config (TOML: the [gateway] and [kafka] tables), then SKEWLESS_GATEWAY_<SETTING>
    environment variables (and SKEWLESS_BOOTSTRAP, SKEWLESS_HMAC_SECRET), then flags. Durations take a unit
    (250ms, 5s, 2m, 1h); a bare number is in the unit the setting's name ends with.
    """
    if log_json is not None or log_level is not None:  # the older spellings of the root command's options
        configure_logging((log_level or current_log_level()).upper(),
                          json_format=log_json if log_json is not None else current_log_format() == "json")
    try:
        settings = load_settings(config_file, overrides={
            "host": host, "port": port, "bootstrap": bootstrap, "topic_prefix": prefix,
            "kafka": parse_kafka_properties(kafka_property) if kafka_property else None,
            "replication_factor": replication_factor, "max_frame_bytes": max_frame_bytes,
            "metrics_port": metrics_port, "metrics": metrics, "metrics_host": metrics_host,
            "tls_cert": str(tls_cert) if tls_cert else None, "tls_key": str(tls_key) if tls_key else None,
            "hmac_secret": hmac_secret or auth_hmac_secret, "timesync": timesync, "timesync_port": timesync_port,
            "clock_offset_us": clock_offset_us, "max_future_s": max_future_s, "shards": shards, "cluster": cluster,
            "gateway_id": gateway_id, "advertised_host": advertised_host, "instance_id": instance_id,
            "session_timeout_s": session_timeout_s,
            "reference_clock_error": reference_clock_error, "reorder_mode": reorder_mode, "pass_late": pass_late,
            "core": core,
        })
        config = build_config(settings)
    except ConfigError as exc:
        raise CommandError(str(exc), 2) from None
    # Before any listener, producer or worker: an unreachable Kafka is one line after a bounded wait.
    probe_kafka(config.kafka_client)
    if workers > 1:
        raise typer.Exit(run_workers(workers, config))
    _raise_fd_limit()
    try:
        import uvloop

        runner: asyncio.Runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        try:
            runner.run(_serve(config))
        except (ClusterConfigError, TopicConfigError) as exc:
            # A deployment mistake the operator must fix (shard count, cluster name, more replicas than brokers):
            # one line, no traceback.
            raise CommandError(str(exc), 2) from None


# Flags every worker gets its own value of (the rest of the command line is passed on unchanged).
_PER_WORKER_FLAGS = ("--workers", "--port", "--timesync-port", "--metrics-port", "--gateway-id", "--instance-id")


def worker_arguments(argv: list[str], index: int, config: GatewayConfig) -> list[str]:
    """The `skewless gateway` arguments of worker ``index``: ``argv`` (what follows `gateway`) without the
    per-worker flags, then worker ``index``'s ports (base + index; 0 stays 0: any free port) and ids."""
    passed: list[str] = []
    skip_value = False
    for arg in argv:
        if skip_value:
            skip_value = False
            continue
        name = arg.split("=", 1)[0]
        if name in _PER_WORKER_FLAGS:
            skip_value = "=" not in arg
            continue
        passed.append(arg)

    def port(base: int) -> str:
        return str(base + index if base else 0)

    passed += ["--port", port(config.port)]
    if config.timesync is not None:
        passed += ["--timesync-port", port(config.timesync.port)]
    if config.metrics_port is not None:
        passed += ["--metrics-port", port(config.metrics_port)]
    if config.gateway_id:
        passed += ["--gateway-id", f"{config.gateway_id}-{index}"]
    if config.instance_id:
        passed += ["--instance-id", f"{config.instance_id}-{index}"]
    return passed


def run_workers(count: int, config: GatewayConfig) -> int:
    """`--workers N`: N gateway processes of one cluster on this host, each on its own ports (they find each other
    through Kafka like gateways on different hosts: no second mechanism). Prints each worker's lines, then the
    first worker's ready line; forwards SIGINT/SIGTERM; a worker that dies is started again (its shards move to the
    others meanwhile)."""
    log = logging.getLogger(__name__)
    argv = sys.argv[sys.argv.index("gateway") + 1:] if "gateway" in sys.argv else sys.argv[1:]
    processes = []
    first: GatewayAddresses | None = None
    for i in range(count):
        process, addresses = spawn_gateway(worker_arguments(argv, i, config), env=child_env(), stderr=None)
        processes.append(process)
        for line in ready_lines(addresses):
            typer.echo(f"worker {i} {line}")
        first = first or addresses
    assert first is not None
    for line in ready_lines(first):
        typer.echo(line)
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for process in processes:
            if process.poll() is None:
                process.terminate()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while not stopping:
        for i, process in enumerate(processes):
            if process.poll() is not None and not stopping:
                log.error("gateway worker %d exited with %s; starting it again", i, process.returncode)
                try:
                    processes[i], _ = spawn_gateway(worker_arguments(argv, i, config), env=child_env(),
                                                    stderr=None)
                except GatewayLaunchError as exc:
                    log.error("gateway worker %d did not come back: %s", i, exc)  # noqa: TRY400 - one line, retried
        time.sleep(0.5)
    for process in processes:
        process.wait()
    return 0


def _raise_fd_limit() -> None:
    """One descriptor per connection: raise the soft RLIMIT_NOFILE to the hard limit (often 1024 -> 10^5+)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            logging.getLogger(__name__).warning("could not raise RLIMIT_NOFILE from %d to %d: %s", soft, hard, exc)


async def _serve(config: GatewayConfig) -> None:
    gw = Gateway(config)
    await gw.start()
    addresses = GatewayAddresses(
        config.host, gw.port, timesync_host=config.timesync.host if config.timesync else None,
        timesync_port=gw.timesync_port, metrics_host=config.metrics_host, metrics_port=gw.metrics_port)
    for line in ready_lines(addresses):  # gateway.launch reads them: the ready line comes last
        typer.echo(line)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await gw.stop()
    typer.echo(f"stopped; counters: {gw.counters}")


def keys_derive(
    source: Annotated[str, typer.Option("--source", help="The source id whose key to print.")],
    master_file: Annotated[Path | None, typer.Option(
        help=f"File holding the master secret (its text, a trailing newline stripped) [env {HMAC_MASTER_ENV}].")
    ] = None,
) -> None:
    """Print a source's own HMAC key, derived from the deployment's master secret (docs/wire-protocol.md,
    "Authentication"): give the source this key, never the master. The master is read from --master-file or the
    environment, not from the command line (other users can read a process's arguments)."""
    if master_file is not None:
        try:
            master = master_file.read_text().rstrip("\r\n")
        except OSError as exc:
            raise CommandError(f"cannot read the master secret ({master_file}): {exc.strerror}", 2) from None
    else:
        master = os.environ.get(HMAC_MASTER_ENV, "")
    if not master:
        raise CommandError(f"no master secret: set {HMAC_MASTER_ENV} or pass --master-file", 2)
    typer.echo(derive_source_key(master.encode(), source))


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
    keys = typer.Typer(help="Per-source HMAC keys (docs/wire-protocol.md, \"Authentication\").", no_args_is_help=True)
    keys.command("derive")(keys_derive)
    app.add_typer(keys, name="keys")
