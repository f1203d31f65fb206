"""Atheris (libFuzzer) entry points: `python -m tests.reliability.atheris_target session|timesync -runs=N ...`."""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from contract.wire.frames import HEADER
    from tests.reliability.fuzz import SessionHarness, TimesyncHarness

_session = SessionHarness()
_timesync = TimesyncHarness()


def fuzz_session(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    chunk = fdp.ConsumeIntInRange(0, 64)
    while fdp.remaining_bytes() > 0:
        length = fdp.ConsumeIntInRange(0, 600)
        body = fdp.ConsumeBytes(length)
        framed = fdp.ConsumeBool()
        _session.feed(HEADER.pack(len(body)) + body if framed else body, chunk)
    assert _session.report.unexplained == 0


def fuzz_timesync(data: bytes) -> None:
    _timesync.feed(data, f"a{len(data) % 7}")


def main() -> None:
    target = sys.argv.pop(1)
    atheris.Setup(sys.argv, fuzz_session if target == "session" else fuzz_timesync)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
