"""Hostile peers in a process of their own, for the connection-flood scenario of test_hostile_network.py.

Run as ``python -m tests.reliability.flood_peers PORT FLOOD OVERSIZED``. In the test's own event loop the peers'
first bytes left a second or more after the gateway had accepted their connections (thousands of coroutines on a
loaded host), so the gateway rightly timed out peers that had not written yet. Here each peer writes right after its
blocking connect, so what the gateway sees is what the scenario says.

1. FLOOD connections, every third sending an HTTP request (a 1.19 GB frame length), the rest silent;
2. OVERSIZED connections each sending a hello and a 4 GiB frame header; each is read to its end and the code of the
   gateway's last frame recorded;
3. prints one JSON line ``{"codes": [...]}`` and keeps the flood open until a line arrives on stdin.
"""

from __future__ import annotations

import json
import resource
import socket
import sys

from contract.wire.frames import HEADER, FrameDecoder, encode_frame

HTTP_REQUEST = b"GET / HTTP/1.1\r\n\r\n"


def oversized_code(sock: socket.socket) -> str:
    decoder = FrameDecoder()
    frames: list[dict[str, object]] = []
    sock.settimeout(60)
    while data := sock.recv(65536):
        frames += decoder.feed(data)
    return str(frames[-1]["code"]) if frames else "closed without a frame"


def main(port: int, flood: int, oversized: int) -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    flood_sockets = []
    for k in range(flood):
        sock = socket.create_connection(("127.0.0.1", port))
        if k % 3 == 0:
            sock.sendall(HTTP_REQUEST)
        flood_sockets.append(sock)
    big = []
    for k in range(oversized):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(encode_frame({"type": "hello", "version": 1, "source_id": f"big-{k}", "streams": ["s"]})
                     + HEADER.pack(2**32 - 1) + b"\x00" * 1024)
        big.append(sock)
    codes = []
    for sock in big:
        try:
            codes.append(oversized_code(sock))
        except OSError as exc:
            codes.append(f"{type(exc).__name__}: {exc}")
        finally:
            sock.close()
    print(json.dumps({"codes": codes}), flush=True)
    sys.stdin.readline()
    for sock in flood_sockets:
        sock.close()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
