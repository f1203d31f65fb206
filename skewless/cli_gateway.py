"""`skewless gateway`: run the ingestion gateway."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import resource
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from broker.admin import TopicConfigError
from broker.cli import CommandError, KafkaProperties, parse_kafka_properties, probe_kafka
from gateway.auth import derive_source_key
from gateway.collector import settle_collector, settle_switch_interval
from gateway.config import ConfigError, build_config, load_settings
from gateway.launch import GatewayAddresses, GatewayLaunchError, ready_lines, spawn_gateway
from gateway.logs import LogLevel, child_env, configure_logging, current_log_format, current_log_level
from gateway.scheduling import request_loop_slice
from gateway.server import ClusterConfigError, Gateway, GatewayConfig
from gateway.settings import (
    BOOL,
    BY_NAME,
    COUNT,
    HMAC_MASTER_ENV,
    MICROS,
    PATH,
    PORT,
    POSITIVE,
    SECONDS,
    SETTINGS,
    TABLE,
    Setting,
)


def gateway(
    config_file: Annotated[Path | None, typer.Option(
        "--config", help="TOML file with a [gateway] table (settings: docs/operations.md) and a [kafka] table of "
                         "librdkafka properties shared by every Kafka client.")] = None,
    auth_hmac_secret: Annotated[str | None, typer.Option(hidden=True, help="Deprecated spelling of --hmac-secret.")
                                ] = None,
    workers: Annotated[int, typer.Option(
        help="Gateway processes on this host, one cluster (ports --port, --port+1, ...; same for the time-sync and "
             "metrics ports).", min=1)] = 1,
    log_json: Annotated[bool | None, typer.Option(
        "--log-json", help="Same as `skewless --log-format json gateway ...`.")] = None,
    log_level: Annotated[LogLevel | None, typer.Option(
        case_sensitive=False, help="Same as `skewless --log-level LEVEL gateway ...`.")] = None,
    **flags: Any,
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
    overrides = {name: _flag_value(BY_NAME[name], value) for name, value in flags.items()}
    overrides["hmac_secret"] = overrides["hmac_secret"] or auth_hmac_secret
    try:
        config = build_config(load_settings(config_file, overrides=overrides))
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
    settle_collector()  # what exists now lives as long as the process (gateway.collector)
    settle_switch_interval()  # the event loop keeps the GIL from the executor's report callbacks (gateway.collector)
    logging.getLogger("gateway.scheduling").info("%s", request_loop_slice(config.loop_slice_us))
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


def _flag_value(setting: Setting, value: Any) -> Any:
    """A flag's value as load_settings takes it (None: the flag was not given)."""
    if setting.kind == TABLE:  # --kafka-property KEY=VALUE ...
        return parse_kafka_properties(value) if value else None
    if setting.kind == PATH:
        return str(value) if value else None
    return value


def _flag_help(setting: Setting) -> str:
    text = setting.help
    if setting.shared_env:
        text += f" (env {setting.shared_env})"
    if setting.kind in (SECONDS, MICROS):
        text += f"; a bare number is {'seconds' if setting.kind == SECONDS else 'microseconds'}"
    default = setting.default_text
    if setting.kind == BOOL and not setting.shown and setting.flag:
        on, off = setting.flag.split("/")
        default = on if setting.default else off
    return f"{text} [{default}]." if default else f"{text}."


def _flag_parameter(setting: Setting) -> inspect.Parameter:
    """The typer option of a setting with a flag; its value is None when the flag is not given."""
    annotation: Any
    if setting.kind == TABLE:  # the one shared with every command that talks to Kafka
        annotation = KafkaProperties
    else:
        python_type = {PORT: int, POSITIVE: int, COUNT: int, BOOL: bool, PATH: Path}.get(setting.kind, str)
        duration = setting.kind in (SECONDS, MICROS)
        option = typer.Option(setting.flag, help=_flag_help(setting), metavar="DURATION" if duration else None)
        annotation = Annotated[python_type | None, option]
    return inspect.Parameter(setting.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation)


def _with_setting_flags(command: Callable[..., None]) -> None:
    """Give ``command`` (whose ``**flags`` receives them) one option per setting that has a flag in
    gateway.settings, after its first option (--config), in the table's order: typer reads the signature."""
    own = [p.replace(kind=p.KEYWORD_ONLY) for p in inspect.signature(command, eval_str=True).parameters.values()
           if p.kind != p.VAR_KEYWORD]
    flags = [_flag_parameter(setting) for setting in SETTINGS if setting.flag]
    setattr(command, "__signature__", inspect.Signature([own[0], *flags, *own[1:]]))  # noqa: B010


_with_setting_flags(gateway)


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
    keys = typer.Typer(help="Per-source HMAC keys (docs/wire-protocol.md, \"Authentication\").", no_args_is_help=True)
    keys.command("derive")(keys_derive)
    app.add_typer(keys, name="keys")
