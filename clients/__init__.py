"""Client SDK for Skewless event sources (docs/sdk.md).

* :class:`SkewlessClient` — async; :func:`connect` is Sample Code 4.1 (``connect(host, tcp_port, udp_port,
  source_id, sync_attempts, streams=...)``);
* :class:`SyncSkewlessClient` / :func:`connect_sync` — the same behind a background event-loop thread;
* :class:`SimulatedClock` — a source clock with an offset and a skew, for demos and tests;
* :func:`hmac_token` — the hello's HMAC credentials.
"""

from clients.auth import hmac_token
from clients.client import (
    ClientClosed,
    ClientStats,
    GatewayFailed,
    GatewayRejected,
    GatewayRerouted,
    RefusedEvent,
    SkewlessClient,
    connect,
)
from clients.core import Backoff, EventTooLarge, GatewayAddress
from clients.sync import SyncSkewlessClient, connect_sync
from timesync.clocks import SimulatedClock

__all__ = [
    "Backoff",
    "ClientClosed",
    "ClientStats",
    "EventTooLarge",
    "GatewayAddress",
    "GatewayFailed",
    "GatewayRejected",
    "GatewayRerouted",
    "RefusedEvent",
    "SimulatedClock",
    "SkewlessClient",
    "SyncSkewlessClient",
    "connect",
    "connect_sync",
    "hmac_token",
]
