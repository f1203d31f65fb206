"""Every bad input to the `skewless` command is one line on stderr and a non-zero exit code, no traceback
(issue 15 item 1); `--debug` shows the traceback; help text renders fully; README's commands exist.

Most cases run the real entry point (`skewless.cli.main`, what the console script calls) in this process; the
ones about the process as a whole (librdkafka writing to fd 2, --debug's traceback) run it as a subprocess."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from skewless.cli import main, package_version

ROOT = Path(__file__).resolve().parents[3]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def one_error_line(err: str) -> str:
    """The single line of stderr, checked to be an `error:` line without a traceback."""
    assert "Traceback" not in err
    assert "╭" not in err  # Rich's traceback panel
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    return lines[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("SKEWLESS_BOOTSTRAP", "SKEWLESS_HMAC_SECRET", "SKEWLESS_DEBUG", "SKEWLESS_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
    # `skewless gateway` configures the root logger onto this test's captured stderr; the next test must not
    # inherit a handler on a closed stream.
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_a_missing_config_file(capsys, tmp_path):
    code, _, err = run(capsys, "gateway", "--config", str(tmp_path / "gw.toml"))
    assert code == 2
    assert one_error_line(err) == f"error: config file {tmp_path / 'gw.toml'} does not exist (--config)"


def test_malformed_toml(capsys, tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text("[gateway\nport = 1\n")
    code, _, err = run(capsys, "gateway", "--config", str(path))
    assert code == 2
    assert one_error_line(err) == (f"error: {path}: malformed TOML: Expected ']' at the end of a table declaration "
                                   f"(at line 1, column 9)")


def test_a_misspelled_table(capsys, tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text("[gatway]\nport = 7000\n")
    code, _, err = run(capsys, "gateway", "--config", str(path))
    assert code == 2
    assert one_error_line(err) == (f"error: {path}: unknown table [gatway]; did you mean [gateway]? a config file "
                                   f"holds [gateway], [kafka]")


def test_an_unknown_key(capsys, tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text("[gateway]\nprot = 7000\n")
    code, _, err = run(capsys, "gateway", "--config", str(path))
    assert code == 2
    assert one_error_line(err).startswith(f"error: {path} [gateway] prot: unknown gateway setting 'prot'; did you "
                                          f"mean 'port'? known: advertised_host, ")


def test_a_wrong_type_in_the_file(capsys, tmp_path):
    path = tmp_path / "gw.toml"
    path.write_text('[gateway]\nshards = "six"\n')
    code, _, err = run(capsys, "gateway", "--config", str(path))
    assert code == 2
    assert one_error_line(err) == f"error: {path} [gateway] shards: shards must be an integer, got 'six'"


@pytest.mark.parametrize("args", [["--port", "99999"], ["--metrics-port", "-1"]])
def test_ports_are_range_checked(capsys, args):
    code, _, err = run(capsys, "gateway", *args)
    assert code == 2
    name = args[0].removeprefix("--").replace("-", "_")
    assert one_error_line(err) == (f"error: {args[0]}: {name} must be a port in 0..65535 (0 = any free port), got "
                                   f"{args[1]}")


def test_a_bad_environment_value(capsys, monkeypatch):
    monkeypatch.setenv("SKEWLESS_GATEWAY_PORT", "abc")
    code, _, err = run(capsys, "gateway")
    assert code == 2
    assert one_error_line(err) == "error: SKEWLESS_GATEWAY_PORT: port must be an integer, got 'abc'"


def test_a_log_level_outside_the_choices(capsys):
    code, _, err = run(capsys, "gateway", "--log-level", "VERBOSE")
    assert code == 2
    assert one_error_line(err) == ("error: skewless gateway: Invalid value for '--log-level': 'VERBOSE' is not one "
                                   "of 'debug', 'info', 'warning', 'error', 'critical'. (see 'skewless gateway "
                                   "--help')")


@pytest.mark.parametrize("args", [
    ["kafka", "topics", "bad name!"],
    ["spark", "window-count", "--stream", "bad/name"],
])
def test_a_bad_stream_name_is_refused_before_kafka_is_asked(capsys, args):
    code, _, err = run(capsys, *args)
    assert code == 2
    line = one_error_line(err)
    assert "must match ^[A-Za-z0-9._-]{1,200}$" in line or "must match" in line
    assert "bad" in line


def test_a_missing_trace_file(capsys, tmp_path):
    code, _, err = run(capsys, "source", "replay", str(tmp_path / "nope.jsonl"))
    assert code == 2
    assert one_error_line(err) == (f"error: skewless source replay: Invalid value for 'trace': file "
                                   f"'{tmp_path / 'nope.jsonl'}' does not exist. (see 'skewless source replay "
                                   f"--help')")


def test_a_trace_that_is_not_json(capsys, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("this is not json\n")
    code, _, err = run(capsys, "source", "replay", str(path))
    assert code == 2
    line = one_error_line(err)
    assert line.startswith(f"error: skewless source replay: Invalid value for 'TRACE': {path} is not a JSON Lines "
                           f"trace: ")
    assert line.endswith("(docs/traces.md) (see 'skewless source replay --help')")


def test_no_maven(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("SKEWLESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run(capsys, "setup")
    assert code == 1
    assert one_error_line(err) == ("error: Maven (mvn) is required to fetch the Kafka/Spark jars; install it "
                                   "(apt-get install maven)")


def test_an_unreachable_gateway(capsys, tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text('{"source_id":"a","stream":"s","seq":0,"true_ts_us":1,"source_ts_us":1,"arrival_ts_us":1}\n')
    port = closed_port()
    code, _, err = run(capsys, "source", "replay", str(path), "--port", str(port), "--no-progress")
    assert code == 1
    line = one_error_line(err)
    assert line.startswith(f"error: cannot reach the gateway at 127.0.0.1:{port} (")
    assert line.endswith("); start it with `skewless gateway`, or pass its --host and --port")


def test_an_unreachable_kafka_is_one_line_after_a_bounded_wait(tmp_path):
    # A subprocess: librdkafka writes its own log lines to file descriptor 2, which capsys would not see.
    port = closed_port()
    result = subprocess.run([sys.executable, "-m", "skewless", "gateway", "--port", "0", "--no-timesync",
                             "--bootstrap", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, check=False)
    assert result.returncode == 1
    assert result.stdout == ""
    assert one_error_line(result.stderr) == (
        f"error: Kafka at 127.0.0.1:{port} did not answer within 10 s (Failed to get metadata: Local: Broker "
        f"transport failure); check --bootstrap / SKEWLESS_BOOTSTRAP and the [kafka] security properties, and that "
        f"the broker runs (`skewless kafka status` for a local one)")


def test_a_misspelled_kafka_property(capsys):
    code, _, err = run(capsys, "kafka", "topics", "s", "--kafka-property", "sasl.mechanismz=PLAIN")
    assert code == 2
    assert one_error_line(err) == ('error: bad Kafka client property: No such configuration property: '
                                   '"sasl.mechanismz" (check the [kafka] table and --kafka-property)')


def test_a_kafka_property_without_a_value(capsys):
    code, _, err = run(capsys, "kafka", "topics", "s", "--kafka-property", "client.id")
    assert code == 2
    assert one_error_line(err) == ("error: skewless kafka topics: Invalid value for '--kafka-property': 'client.id' "
                                   "is not KEY=VALUE (e.g. security.protocol=SASL_SSL) (see 'skewless kafka topics "
                                   "--help')")


def test_a_too_long_ref_id_is_refused_not_truncated(capsys):
    code, _, err = run(capsys, "timesync", "--ref-id", "TOOLONGID")
    assert code == 2
    assert one_error_line(err) == ("error: skewless timesync: Invalid value for '--ref-id': 'TOOLONGID' must be 1 "
                                   "to 4 ASCII characters (e.g. XSKW, GPS) (see 'skewless timesync --help')")


@pytest.mark.parametrize(("args", "option", "text"), [
    (["spark", "window-count", "--window", "abc"], "--window", "abc"),
    (["spark", "window-count", "--allowed-lateness", "5"], "--allowed-lateness", "5"),
    (["timesync", "--duration-s", "soon"], "--duration-s", "soon"),
    (["source", "replay", "x.jsonl", "--linger-ms", "2 fortnights"], "--linger-ms", "2 fortnights"),
])
def test_a_bad_duration(capsys, args, option, text):
    code, _, err = run(capsys, *args)
    assert code == 2
    assert f"Invalid value for '{option}': not a duration: '{text}' (a number and a unit, e.g. 250ms, 5s, 2m; " \
           f"units: us, ms, s," in one_error_line(err)


def test_the_gateway_reads_durations_with_units(capsys):
    code, _, err = run(capsys, "gateway", "--max-future-s", "a while")
    assert code == 2
    assert one_error_line(err).startswith("error: --max-future-s: max_future_s: not a duration: 'a while'")


def test_an_unknown_command(capsys):
    code, _, err = run(capsys, "gatewya")
    assert code == 2
    assert one_error_line(err) == ("error: skewless: No such command 'gatewya'. Did you mean 'gateway'? (see "
                                   "'skewless --help')")


def test_debug_shows_the_traceback(tmp_path):
    command = [sys.executable, "-m", "skewless", "timesync", "--ref-id", "TOOLONGID"]
    plain = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    debug = subprocess.run([*command, "--debug"], capture_output=True, text=True, timeout=60, check=False)
    assert plain.returncode == 2
    one_error_line(plain.stderr)
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "'TOOLONGID' must be 1 to 4 ASCII characters" in debug.stderr


def test_help_keeps_bracketed_words(capsys):
    code, out, _ = run(capsys, "gateway", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "TOML file with a [gateway] table" in flat
    assert "[127.0.0.1:9092]" in flat
    assert "--log-level [DEBUG|INFO|WARNING|ERROR|CRITICAL]" in flat or "<debug|info|warning|error|critical>" in flat


def test_kafka_start_defaults_to_9092(capsys):
    code, out, _ = run(capsys, "kafka", "start", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "[default: 9092; 0<=x<=65535]" in flat
    assert "0 = any free port" in flat


def test_version(capsys):
    code, out, err = run(capsys, "--version")
    assert (code, out, err) == (0, f"skewless {package_version()}\n", "")
    assert re.fullmatch(r"\d+\.\d+\.\d+.*", package_version())


def readme_commands() -> list[list[str]]:
    readme = (ROOT / "README.md").read_text()
    block = readme.split("## The command line", 1)[1].split("```", 2)[1]
    commands = []
    for line in block.splitlines():
        if line.startswith("skewless "):
            commands.append(line.split())
        elif line.startswith(" ") and commands:  # a continuation: more options of the command above
            commands[-1].extend(line.split())
    return commands


def test_every_command_and_option_in_the_readme_exists(capsys):
    commands = readme_commands()
    assert len(commands) >= 15
    for words in commands:
        path = []
        for word in words[1:]:
            if word.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*(\|[a-z]+)*", word):
                break
            path.append(word)
        if path == ["--version"] or words[1] == "--version":
            continue
        for variant in path[-1].split("|") if path else [""]:
            argv = [*path[:-1], variant] if path else []
            code, out, _ = run(capsys, *argv, "--help")
            assert code == 0, f"README: `skewless {' '.join(argv)}` does not exist"
            for option in (w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")):
                assert option in out, f"README: `skewless {' '.join(argv)}` has no {option}"


def test_a_port_in_use(capsys):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "timesync", "--host", "127.0.0.1", "--port", str(port), "--duration-s", "1")
    assert code == 2
    assert one_error_line(err) == (f"error: port {port} (udp, 127.0.0.1) already in use: another process listens on "
                                   "it; pick another port, or 0 for any free one")


def test_kafka_start_on_a_port_in_use_names_the_port_at_once(capsys, tmp_path):
    # issue 28 item 5: the broker used to start anyway and fail its readiness wait 90 s later, naming no port.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, _, err = run(capsys, "kafka", "start", "--port", str(port), "--dir", str(tmp_path / "kafka"))
    assert code == 2
    assert one_error_line(err) == (f"error: port {port} (tcp, 127.0.0.1) already in use: another process listens on "
                                   "it; pick another port, or 0 for any free one")
    assert not (tmp_path / "kafka").exists()  # nothing formatted, nothing started


def test_the_old_spellings_are_hidden_aliases(capsys, tmp_path):
    code, out, _ = run(capsys, "source", "replay", "--help")
    assert code == 0 and "--udp-port" not in out and "--timesync-port" in out
    code, out, _ = run(capsys, "gateway", "--help")
    assert code == 0 and "--auth-hmac-secret" not in out and "--hmac-secret" in out
    # still accepted: the replay gets as far as dialling the (closed) gateway port
    path = tmp_path / "trace.jsonl"
    path.write_text('{"source_id":"a","stream":"s","seq":0,"true_ts_us":1,"source_ts_us":1,"arrival_ts_us":1}\n')
    code, _, err = run(capsys, "source", "replay", str(path), "--port", str(closed_port()), "--udp-port", "7452",
                       "--no-progress")
    assert code == 1
    assert "cannot reach the gateway" in one_error_line(err)


def test_the_sdk_only_install_names_the_extra_the_command_needs():
    # As after `pip install skewless` (no typer): the console script's entry point says what to install.
    code = "import sys; sys.modules['typer'] = None; import skewless; skewless.main()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                            cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr == ("error: the skewless command needs typer, which is not installed: pip install "
                             "'skewless[gateway]'\n")


def test_a_misspelled_kafka_table_in_a_spark_or_topics_config(capsys, tmp_path):
    path = tmp_path / "skewless.toml"
    path.write_text('[kafak]\n"security.protocol" = "SSL"\n')
    code, _, err = run(capsys, "kafka", "topics", "s", "--config", str(path))
    assert code == 2
    assert one_error_line(err) == (f"error: {path}: unknown table [kafak]; did you mean [kafka]? a config file holds "
                                   f"[gateway], [kafka]")


def test_a_root_log_level_outside_the_choices(capsys):
    code, _, err = run(capsys, "--log-level", "VERBOSE", "traces", "profiles")
    assert code == 2
    assert one_error_line(err) == ("error: skewless: Invalid value for '--log-level' (env var: 'SKEWLESS_LOG_LEVEL'): "
                                   "'VERBOSE' is not one of 'debug', 'info', 'warning', 'error', 'critical'. "
                                   "(see 'skewless --help')")


def test_the_root_help_lists_the_log_options(capsys):
    code, out, _ = run(capsys, "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "--log-format <text|json> Log lines on stderr as text, or as one JSON object per line" in flat
    assert "--log-level <debug|info|warning|error|critical> Log level [INFO]." in flat
    assert "SKEWLESS_LOG_FORMAT" in flat and "SKEWLESS_LOG_LEVEL" in flat


@pytest.mark.parametrize(("args", "line"), [
    (["three-window", "--nope"],
     "error: submit.py three-window: No such option: --nope (Possible options: --mode) "
     "(see 'submit.py three-window --help')"),
    (["bogus"], "error: submit.py: No such command 'bogus'. (see 'submit.py --help')"),
])
def test_the_spark_submit_entry_point_reports_a_usage_error_in_one_line(args: list[str], line: str) -> None:
    result = subprocess.run([sys.executable, "spark_jobs/submit.py", *args], check=False, capture_output=True,
                            text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == line
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("argv", "line"), [
    (["source", "replay", "TRACE", "--speed", "nan"],
     "error: skewless source replay: Invalid value for '--speed': nan is not a finite number > 0 (2 plays the trace "
     "twice as fast) (see 'skewless source replay --help')"),
    (["source", "replay", "TRACE", "--speed", "inf"],
     "error: skewless source replay: Invalid value for '--speed': inf is not a finite number > 0 (2 plays the trace "
     "twice as fast) (see 'skewless source replay --help')"),
    (["source", "replay", "TRACE", "--skew-ppm", "nan"],
     "error: skewless source replay: Invalid value for '--skew-ppm': nan is not a finite number "
     "(see 'skewless source replay --help')"),
    (["source", "replay", "TRACE", "--skew-spread-ppm", "-5"],
     "error: skewless source replay: Invalid value for '--skew-spread-ppm': -5 is not a finite number >= 0 "
     "(see 'skewless source replay --help')"),
    (["timesync", "--clock-skew-ppm", "nan", "--duration-s", "1"],
     "error: skewless timesync: Invalid value for '--clock-skew-ppm': nan is not a finite number "
     "(see 'skewless timesync --help')"),
    (["timesync", "--rate-limit", "inf", "--duration-s", "1"],
     "error: skewless timesync: Invalid value for '--rate-limit': inf is not a finite number >= 0 "
     "(see 'skewless timesync --help')"),
    (["demo", "--rate", "nan"],
     "error: skewless demo: Invalid value for '--rate': nan is not a finite number > 0 (see 'skewless demo --help')"),
])
def test_a_float_option_that_is_not_a_finite_number_is_refused_at_the_option(capsys, tmp_path, argv, line):
    # issue 28 item 5: `--speed nan` used to end in "ValueError: cannot convert float NaN to integer".
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"source_id":"a","stream":"s","seq":0,"true_ts_us":1,"source_ts_us":1,"arrival_ts_us":1}\n')
    port = [] if argv[0] == "demo" else ["--port", str(closed_port())]
    code, _, err = run(capsys, *[str(trace) if a == "TRACE" else a for a in argv], *port)
    assert code == 2
    assert one_error_line(err) == line


def test_kafka_start_sets_the_group_min_session_timeout(capsys, monkeypatch, tmp_path):
    # issue 28 item 6: a gateway's session_timeout_s below Kafka's 6 s floor needs the broker's floor lowered.
    from broker.launcher import BrokerState, KafkaBroker, _server_properties
    from skewless import cli_kafka as broker_cli

    made: list[KafkaBroker] = []

    class NoJava(KafkaBroker):
        def start(self, ready_timeout_s: float = 0.0) -> BrokerState:
            made.append(self)
            return BrokerState(1, self.host, 9999, 9998, str(self.work_dir))

    monkeypatch.setattr(broker_cli, "KafkaBroker", NoJava)
    code, out, _ = run(capsys, "kafka", "start", "--dir", str(tmp_path), "--port", "0",
                       "--group-min-session-timeout", "1s")
    assert (code, out) == (0, "127.0.0.1:9999\n")
    assert made[0].group_min_session_timeout_ms == 1000
    lines = _server_properties("127.0.0.1", 1, 2, tmp_path, made[0].group_min_session_timeout_ms).splitlines()
    assert "group.min.session.timeout.ms=1000" in lines
    assert not any(line.startswith("group.min.session") for line in _server_properties(
        "127.0.0.1", 1, 2, tmp_path).splitlines())  # Kafka's own default unless asked


def test_the_gateway_takes_session_timeout_s_as_a_flag(capsys):
    code, out, _ = run(capsys, "gateway", "--help")
    assert code == 0 and "--session-timeout-s DURATION" in out
    # The flag reaches the settings' validation (before Kafka is asked).
    code, _, err = run(capsys, "gateway", "--session-timeout-s", "0.5", "--bootstrap", f"127.0.0.1:{closed_port()}")
    assert code == 2
    assert one_error_line(err) == "error: session_timeout_s must be >= 1.0, got 0.5"


def test_kafka_status_help_says_what_it_prints(capsys, tmp_path):
    code, out, _ = run(capsys, "kafka", "status", "--help")
    assert code == 0 and "running pid=PID bootstrap=HOST:PORT" in " ".join(out.split())
    code, out, _ = run(capsys, "kafka", "status", "--dir", str(tmp_path))
    assert (code, out) == (1, "not running\n")
