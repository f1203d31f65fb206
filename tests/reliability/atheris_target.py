"""Atheris (libFuzzer) entry points: `python -m tests.reliability.atheris_target session|publish|timesync -runs=N ...`.

publish: the input is spliced in as the payload of one events frame (any msgpack, or none) and goes through
GatewaySession + IngestCore + record encoding; PublishHarness asserts that the event is published unchanged as JSON
or refused once with invalid_payload, or that the frame is refused whole with one fatal malformed_frame.
"""

from __future__ import annotations

import logging
import sys

import atheris

with atheris.instrument_imports():
    from contract.wire.frames import HEADER
    from tests.reliability.fuzz import PublishHarness, SessionHarness, TimesyncHarness

_session = SessionHarness()
_timesync = TimesyncHarness()
_publish = PublishHarness()
# One warning per refused event would be most of the output.
logging.getLogger("gateway").setLevel(logging.ERROR)


def fuzz_session(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    chunk = fdp.ConsumeIntInRange(0, 64)
    while fdp.remaining_bytes() > 0:
        length = fdp.ConsumeIntInRange(0, 600)
        body = fdp.ConsumeBytes(length)
        framed = fdp.ConsumeBool()
        _session.feed(HEADER.pack(len(body)) + body if framed else body, chunk)
    assert _session.report.unexplained == 0


def fuzz_publish(data: bytes) -> None:
    # The next seq is the count of events consumed so far: a frame refused whole consumes none.
    _publish.send_raw_payload(_publish.report.events, data)
    assert not _publish.sent, "an event neither published nor refused"


def fuzz_timesync(data: bytes) -> None:
    _timesync.feed(data, f"a{len(data) % 7}")


def main() -> None:
    target = sys.argv.pop(1)
    targets = {"session": fuzz_session, "publish": fuzz_publish, "timesync": fuzz_timesync}
    atheris.Setup(sys.argv, targets[target])
    atheris.Fuzz()


if __name__ == "__main__":
    main()
