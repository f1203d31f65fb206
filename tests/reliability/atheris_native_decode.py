"""Atheris entry point for the native connection decoder: `python -m tests.reliability.atheris_native_decode
-runs=N ...`. Each input is one connection: a valid hello or not, then frames and raw bytes cut from the input, fed
in chunks to GatewaySession (the Python path) and to the same session with the native decoder in its loop
(tests/native_session.py). Any difference, any exception but the asserted protocol errors, or a crash stops the run.

Coverage guidance comes from the Python side (the Rust code is not built with libFuzzer's instrumentation); the
native side is checked on every input all the same.
"""

from __future__ import annotations

import sys

import atheris

with atheris.instrument_imports():
    from contract.wire.frames import HEADER, encode_frame
    from tests.native_session import HELLO, run_both

_HELLO_FRAME = encode_frame(HELLO)


def fuzz_native_decode(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    max_frame_bytes = fdp.PickValueInList([64, 600, 1024 * 1024])
    parts = [_HELLO_FRAME] if fdp.ConsumeBool() else []
    while fdp.remaining_bytes() > 0:
        body = fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 600))
        parts.append(HEADER.pack(len(body)) + body if fdp.ConsumeBool() else body)
    stream = b"".join(parts)
    chunk = 1 + len(data) % 97
    run_both([stream[i:i + chunk] for i in range(0, len(stream), chunk)] or [b""], max_frame_bytes=max_frame_bytes)


def main() -> None:
    atheris.Setup(sys.argv, fuzz_native_decode)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
