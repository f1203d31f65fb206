"""What a new user hits on the command line against a real broker and gateway (issue 28): a replay repeated against
the same gateway, a misspelled stream, a gateway port already taken. Each is one line and an exit code."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from broker.admin import ensure_topics
from broker.launcher import BrokerState
from broker.reader import read_stream
from contract.topics import TopicNames
from gateway.launch import spawn_gateway
from skewless.cli import main

pytestmark = pytest.mark.timeout(120)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    out, err = capsys.readouterr()
    code = exited.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out, err


def one_line(err: str) -> str:
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def gateway_port(kafka: BrokerState, topic_prefix: str) -> Iterator[int]:
    process, addresses = spawn_gateway(["--port", "0", "--no-timesync", "--no-metrics", "--bootstrap",
                                        kafka.bootstrap_servers, "--prefix", topic_prefix])
    try:
        yield addresses.port
    finally:
        process.terminate()
        process.communicate(timeout=30)


def write_trace(path: Path, sources: tuple[str, ...], events: int) -> None:
    lines = [{"source_id": source, "stream": "sensors", "seq": seq, "true_ts_us": 1_000 * seq,
              "source_ts_us": 1_000 * seq, "arrival_ts_us": 1_000 * seq, "payload": {"i": seq}}
             for source in sources for seq in range(events)]
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))


def test_a_repeated_replay_says_what_to_do_and_source_suffix_makes_it_work(capsys, tmp_path, kafka, topic_prefix,
                                                                           gateway_port):
    trace = tmp_path / "trace.jsonl"
    write_trace(trace, ("a", "b"), 5)
    replay = ["source", "replay", str(trace), "--port", str(gateway_port), "--no-timesync", "--no-progress",
              "--speed", "1000"]
    code, out, _ = run(capsys, *replay)
    assert code == 0 and out.startswith("replayed 10 events from 2 sources")
    # The same trace again: the gateway already acknowledged these seqs of these sources.
    code, out, err = run(capsys, *replay)
    assert code == 1 and out == ""
    # Whichever source hears first: its seq 0 was refused (seq_conflict), or acknowledged before it was sent.
    assert one_line(err) in {
        f"error: the gateway already has source '{source}' stream 'sensors' seq 0 (this trace was replayed to it "
        "before); replay under fresh source ids with --source-suffix TEXT (e.g. --source-suffix -2)"
        for source in ("a", "b")}
    code, out, _ = run(capsys, *replay, "--source-suffix", "-2")
    assert code == 0 and out.startswith("replayed 10 events from 2 sources")
    events, _ = read_stream(kafka.bootstrap_servers, TopicNames(topic_prefix).events("sensors"))
    # Exactly the first replay and the suffixed one: the refused repeat sent nothing.
    assert Counter(e["source_id"] for e in events) == {"a": 5, "b": 5, "a-2": 5, "b-2": 5}
    assert sorted(e["seq"] for e in events if e["source_id"] == "a-2") == [0, 1, 2, 3, 4]


def test_a_gateway_port_in_use_names_the_port(kafka, topic_prefix):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([str(Path(sys.executable).parent / "skewless"), "gateway", "--port", str(port),
                               "--no-timesync", "--no-metrics", "--bootstrap", kafka.bootstrap_servers,
                               "--prefix", topic_prefix],
                              capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: port {port} (tcp, 127.0.0.1) already in use: another process listens on it; pick "
                      "another port, or 0 for any free one"]


def test_a_spark_job_on_a_stream_without_topics_is_one_line_and_exit_2_before_spark(capsys, monkeypatch, kafka,
                                                                                       topic_prefix):
    # issue 28 item 2: a misspelled --stream used to run 20 s, print nothing and exit 0.
    from spark_jobs import cli as spark_cli

    def no_spark(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a Spark session was started")

    monkeypatch.setattr(spark_cli, "create_spark_session", no_spark)
    names = TopicNames(topic_prefix)
    ensure_topics(kafka.bootstrap_servers, [names.events("sensors"), names.late("sensors"), names.events("doors")])
    code, out, err = run(capsys, "spark", "window-count", "--bootstrap", kafka.bootstrap_servers, "--prefix",
                         topic_prefix, "--stream", "sensors", "--stream", "nosuchstream", "--available-now")
    assert code == 2 and out == ""
    assert one_line(err) == (
        f"error: no stream 'nosuchstream' in Kafka (no topic {topic_prefix}.events.nosuchstream); streams under "
        f"prefix '{topic_prefix}': doors, sensors (a gateway creates a stream's topics when a source declares it; "
        "`skewless kafka topics STREAM` creates them ahead)")
