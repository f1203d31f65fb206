"""The counters of one client, written by every room of the SDK (connection, time sync, send window)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ClientStats"]


@dataclass
class ClientStats:
    """Counters of one client (read them any time)."""

    events_sent: int = 0
    """Events written to a socket, resends included."""
    events_resent: int = 0
    """Events written again after their connection was lost (or recovered from the spool)."""
    events_acked: int = 0
    """Events the gateway acknowledged, refused ones included (they are done with too)."""
    events_refused: int = 0
    """Events the gateway refused (``SkewlessClient.refused`` has the latest, with the reason)."""
    frames_sent: int = 0
    heartbeats_sent: int = 0
    connects: int = 0
    reconnects: int = 0
    connection_losses: int = 0
    liveness_timeouts: int = 0
    """Connections dropped because their gateway owed an answer for ``liveness_timeout_s`` and sent nothing."""
    redirects_to_suspects: int = 0
    """Redirects naming a gateway this source found dead, waited out instead of followed."""
    syncs: int = 0
    resyncs_requested: int = 0  # resync requests from the gateway (a clock step it saw), each obeyed or covered
    recovered_from_spool: int = 0
    redirects: int = 0
    """Redirects followed: a gateway that does not own the source's shard named the owner."""
    shard_moves: int = 0
    """``shard_moved`` errors: the owner stopped serving the shard (revoked, fenced, restarting); the client went
    back through its address list and resent what was not acknowledged."""
    shard_unavailable: int = 0
    """``shard_unavailable`` errors: no gateway served the shard at that moment (recovery, failover)."""
    time_sync_moves: int = 0
    """Times the time sync moved to another gateway's time-sync server (the owner changed)."""
    seqs_given_up: int = 0
    """Seqs the gateway gave up (``gap`` notices, docs/wire-protocol.md "Gaps"): the acks moved past them. Those never
    sent (an explicit ``seq=`` that skipped some) count here only."""
    events_given_up: int = 0
    """Events of those seqs this client held, or was given after the notice (a replay's late arrival): their futures
    fail with ``EventGivenUp``, each is written once more (the gateway publishes it on the late topic), and ``flush()``
    does not wait for them."""
    conflicts: int = 0
    """Events refused with ``seq_conflict`` (also in ``events_refused``): their seq was accepted with another payload
    or ``source_ts_us``, from another sender with this source id or an earlier run of this one."""
