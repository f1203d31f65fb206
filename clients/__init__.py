"""Client SDK for Skewless event sources (docs/sdk.md).

* :class:`SkewlessClient` — async; :func:`connect` is Sample Code 4.1 (``connect(host, tcp_port, udp_port,
  source_id, sync_attempts, streams=...)``); options are typed (:class:`ClientOptions`, :class:`ConnectOptions`);
* :class:`SyncSkewlessClient` / :func:`connect_sync` — the same behind a background event-loop thread;
* :class:`SkewlessError` — the base of every error the SDK raises;
* interval events (docs/wire-protocol.md, "Interval events"): ``send_interval`` (an interval sent once it ended),
  ``send_interval_start`` / ``send_interval_end`` (each endpoint on its own, paired by id), each with a
  ``*_tracked`` variant; :class:`InvalidInterval` for arguments the gateway would refuse;
* :class:`SimulatedClock` — a source clock ``ahead_us`` ahead that runs ``skew_ppm`` fast, for demos and tests;
* :func:`hmac_token` — the hello's HMAC credentials.
"""

from clients.auth import hmac_token
from clients.client import SkewlessClient, connect
from clients.connection import GatewayRerouted
from clients.core import Backoff, GatewayAddress
from clients.errors import (
    ClientClosed,
    EventGivenUp,
    EventRefused,
    EventTooLarge,
    FlushTimeout,
    GatewayFailed,
    GatewayRejected,
    GatewayUnreachable,
    InvalidPayload,
    SkewlessError,
    SpoolError,
    TimeSyncError,
)
from clients.options import ClientOptions, ConnectOptions
from clients.stats import ClientStats
from clients.sync import SyncSkewlessClient, connect_sync
from clients.window import InvalidInterval, RefusedEvent
from timesync.clocks import SimulatedClock

__all__ = [
    "Backoff",
    "ClientClosed",
    "ClientOptions",
    "ClientStats",
    "ConnectOptions",
    "EventGivenUp",
    "EventRefused",
    "EventTooLarge",
    "FlushTimeout",
    "GatewayAddress",
    "GatewayFailed",
    "GatewayRejected",
    "GatewayRerouted",
    "GatewayUnreachable",
    "InvalidInterval",
    "InvalidPayload",
    "RefusedEvent",
    "SimulatedClock",
    "SkewlessClient",
    "SkewlessError",
    "SpoolError",
    "SyncSkewlessClient",
    "TimeSyncError",
    "connect",
    "connect_sync",
    "hmac_token",
]
