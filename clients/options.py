"""The SDK's options: :class:`ClientSettings` is the one place each is written, with its default, unit and meaning.

``SkewlessClient(host, port, source_id, streams, **options)`` builds a ``ClientSettings`` from its keywords (bad
values raise ``ValueError`` here); :class:`ClientOptions` / :class:`ConnectOptions` name the same keywords for the
type checker (``**options: Unpack[ClientOptions]``), and a test keeps them in step with the dataclass.
"""

from __future__ import annotations

import inspect
import os
import ssl as ssl_module
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import TypedDict

from clients.auth import TokenProvider
from clients.core import DEFAULT_KEEPALIVE_S, DEFAULT_LIVENESS_TIMEOUT_S, DEFAULT_MAX_REDIRECTS, Backoff
from clients.spool import DEFAULT_SPOOL_MAX_BYTES
from timesync.client import DEFAULT_COUNT
from timesync.clocks import ClockUs, system_time_us

__all__ = ["DEFAULT_BATCH_EVENTS", "DEFAULT_MAX_UNACKED", "ClientOptions", "ClientSettings", "ConnectOptions"]

DEFAULT_BATCH_EVENTS = 500
# 100k events of ~100 bytes: ~10 MB of memory per source, ~0.5 s of a fast source's output.
DEFAULT_MAX_UNACKED = 100_000
DEFAULT_HEARTBEAT_INTERVAL_S = 1.0
DEFAULT_RESYNC_INTERVAL_S = 60.0
# How long the sender waits for a batch to fill before writing a partial one.
DEFAULT_LINGER_S = 0.002


@dataclass(frozen=True, kw_only=True)
class ClientSettings:
    """Every keyword option of ``SkewlessClient``, checked once (``ValueError`` for a bad value)."""

    gateways: Sequence[tuple[str, int]] = ()
    """More gateway addresses ``(host, port)`` of the same cluster, tried after ``host:port``."""
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    """Redirects followed in a row before backing off and starting again from the list."""
    time_sync: bool = True
    """Sync the source clock with the owner gateway's time-sync server; False never syncs."""
    udp_port: int | None = None
    """The time-sync UDP port to use when the gateway announces none (its welcome, or a redirect naming it, carries
    ``timesync_port`` whenever it runs a time-sync server, and that port wins). None: only the announced port; a
    gateway that announces none and no ``udp_port`` means no time server to sync with."""
    sync_attempts: int = DEFAULT_COUNT
    """Requests per sync burst (the thesis' 10)."""
    resync_interval_s: float | None = DEFAULT_RESYNC_INTERVAL_S
    """Seconds between background re-syncs; None syncs only once, at ``connect()``."""
    sync_timeout_s: float = 0.5
    """How long one sync request waits for its reply."""
    timesync_key: bytes | None = None
    """Key authenticating the time-sync extension, when the time-sync server requires one."""
    clock_us: ClockUs = system_time_us
    """The source clock (integer µs since the epoch); inject a ``SimulatedClock`` to simulate drift."""
    token: str | TokenProvider | None = None
    """The hello's static token, or a callable returning one per connection attempt."""
    hmac_secret: bytes | None = None
    """Sign an HMAC token per connection attempt instead (see ``clients.auth``)."""
    ssl: ssl_module.SSLContext | None = None
    """A client ``ssl.SSLContext`` for TLS."""
    server_hostname: str | None = None
    """Overrides the name TLS checks."""
    pool_size: int = 1
    """TCP connections of this source; batches go round-robin over the live ones."""
    batch_events: int = DEFAULT_BATCH_EVENTS
    """Events per frame at most (frames are also kept under the gateway's ``max_frame_bytes``)."""
    linger_s: float = DEFAULT_LINGER_S
    """How long a partial batch waits for more events before it is written."""
    max_unacked: int = DEFAULT_MAX_UNACKED
    """Bound on events kept for resend; ``send()`` blocks at the bound."""
    heartbeat_interval_s: float | None = DEFAULT_HEARTBEAT_INTERVAL_S
    """Idle time of the whole source (no connection of the pool wrote) after which one connection sends a heartbeat;
    None disables heartbeats (and keepalives)."""
    keepalive_interval_s: float = DEFAULT_KEEPALIVE_S
    """Idle time after which any one pool connection writes a heartbeat anyway, below the gateway's idle timeout
    (120 s)."""
    liveness_timeout_s: float | None = DEFAULT_LIVENESS_TIMEOUT_S
    """A connection that owes an answer (an ack for events it carried, the answer to a heartbeat) and received
    nothing for this long is taken for a dead gateway (paused, frozen, cut off without a reset): it is dropped, its
    unacknowledged events are resent through the cluster, and that gateway is dialed last for twice this long
    (docs/sdk.md, "Gateway liveness"). None disables the check."""
    backoff: Backoff | None = None
    """Reconnect policy (each pool connection gets its own copy); ``max_attempts`` bounds retries."""
    connect_timeout_s: float = 60.0
    """Bound on one TCP connect + handshake (the gateway creates missing topics before it answers the hello, which
    can take seconds on a busy broker)."""
    spool_path: str | os.PathLike[str] | None = None
    """Append-only file keeping unacked events across restarts (``clients.spool``)."""
    spool_max_bytes: int = DEFAULT_SPOOL_MAX_BYTES
    """The spool's bound."""
    spool_fsync: bool = False
    """Whether each spooled batch is fsynced."""

    @classmethod
    def of(cls, caller: str, options: ClientOptions) -> ClientSettings:
        """``ClientSettings(**options)``, with the ``TypeError`` Python gives ``caller`` for a keyword it lacks."""
        unknown = [name for name in options if name not in _OPTION_NAMES]
        if unknown:
            raise TypeError(f"{caller}() got an unexpected keyword argument {unknown[0]!r}")
        return cls(**options)

    def __post_init__(self) -> None:
        if self.batch_events < 1:
            raise ValueError("batch_events must be >= 1")
        if self.sync_attempts < 1:
            raise ValueError("sync_attempts must be >= 1")
        if self.token is not None and self.hmac_secret is not None:
            raise ValueError("pass either token or hmac_secret, not both")
        object.__setattr__(self, "gateways", tuple((str(h), int(p)) for h, p in self.gateways))


_OPTION_NAMES = frozenset(f.name for f in fields(ClientSettings))


class ConnectOptions(TypedDict, total=False):
    """``SkewlessClient``'s keyword options but ``udp_port`` and ``sync_attempts`` (``connect()`` takes those
    positionally, as Sample Code 4.1 does): ``**options: Unpack[ConnectOptions]`` lets mypy check every name and
    type, so a misspelled ``pool_sise=2`` is an error. The meanings and defaults are :class:`ClientSettings`'s; a
    test keeps the names in step with it."""

    gateways: Sequence[tuple[str, int]]
    max_redirects: int
    time_sync: bool
    resync_interval_s: float | None
    sync_timeout_s: float
    timesync_key: bytes | None
    clock_us: ClockUs
    token: str | TokenProvider | None
    hmac_secret: bytes | None
    ssl: ssl_module.SSLContext | None
    server_hostname: str | None
    pool_size: int
    batch_events: int
    linger_s: float
    max_unacked: int
    heartbeat_interval_s: float | None
    keepalive_interval_s: float
    liveness_timeout_s: float | None
    backoff: Backoff | None
    connect_timeout_s: float
    spool_path: str | os.PathLike[str] | None
    spool_max_bytes: int
    spool_fsync: bool


class ClientOptions(ConnectOptions, total=False):
    """Every keyword option of ``SkewlessClient`` (``SyncSkewlessClient`` takes them as ``**options``)."""

    udp_port: int | None
    sync_attempts: int


def keyword_signature(init: Callable[..., None], settings: type[ClientSettings]) -> inspect.Signature:
    """``init``'s signature with its ``**options`` spelled out as the keyword-only fields of ``settings``."""
    head = [p for p in inspect.signature(init).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    options = [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
               for f in fields(settings)]
    return inspect.Signature([*head, *options], return_annotation=None)
