"""Every error the SDK raises on its own account derives from :class:`SkewlessError` (``GatewayRerouted``, which
names a ``clients.core.GatewayAddress``, lives in ``clients.connection``; ``InvalidInterval`` in ``clients.window``).

Each class also keeps the builtin base it had before the hierarchy existed (``ConnectionError``, ``ValueError``,
``RuntimeError``, ``TimeoutError``, the time-sync module's ``TimeSyncError``), so an ``except`` written against those
still catches it. Errors of the network itself at ``connect()`` (``OSError``, ``ssl.SSLError``, ``TimeoutError``
from the last address dialed) pass through as the OS raised them. Invalid arguments (an undeclared stream,
``batch_events=0``, an integer beyond msgpack's 64 bits) stay plain ``ValueError``/``OverflowError``: they are
mistakes in the calling code, not conditions to handle.
"""

from __future__ import annotations

from timesync.client import TimeSyncError as _BaseTimeSyncError

__all__ = [
    "ClientClosed",
    "EventGivenUp",
    "EventRefused",
    "EventTooLarge",
    "FlushTimeout",
    "GatewayFailed",
    "GatewayRejected",
    "GatewayUnreachable",
    "InvalidPayload",
    "SkewlessError",
    "SpoolError",
    "TimeSyncError",
]


class SkewlessError(Exception):
    """Base of every error the SDK raises."""


class GatewayRejected(SkewlessError):
    """The gateway sent a fatal error frame (refused hello, bad credentials, a protocol error), or answered with
    something that is not the protocol (``code`` names what). The same hello or frames would be refused again."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class GatewayFailed(SkewlessError, ConnectionError):
    """The gateway closed the connection with a fatal error that is not the source's fault (``internal_error``,
    ``timeout``): handled as a lost connection, re-opened with backoff."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class GatewayUnreachable(SkewlessError, ConnectionError):
    """A pool connection used up ``backoff.max_attempts`` without reaching a gateway: the client fails with it.
    (``connect()`` itself raises the last dial's ``OSError`` as the OS raised it: refused, timed out, a TLS
    certificate refused.)"""


class TimeSyncError(SkewlessError, _BaseTimeSyncError):
    """A sync burst the SDK needed got no usable reply (the first one, at ``connect()``, or ``sync_now()``).
    Also a ``timesync.client.TimeSyncError``."""


class SpoolError(SkewlessError):
    """The spool file belongs to another source or is not a spool."""


class InvalidPayload(SkewlessError, TypeError):
    """``send`` was given a payload msgpack cannot encode (a datetime, a set, an object): the message names the
    field and what a payload may hold. Raised before the event is queued; a TypeError, as msgpack's was."""


class EventTooLarge(SkewlessError, ValueError):
    """One event alone does not fit in a frame the gateway accepts."""


class EventRefused(SkewlessError):
    """The gateway refused this event on its own: ``invalid_payload`` (its payload cannot travel in a JSON record),
    ``seq_conflict`` (its seq was already accepted with another payload or ``source_ts_us``: another sender with
    this source id, or an application reusing a seq), ``seq_jump`` (its seq lies more than the gateway's
    ``max_seq_jump`` above the stream's). It is not in Kafka (for a conflict: this event is not; the one accepted
    first is) and is never resent. A delivery future of that event fails with it."""

    def __init__(self, stream: str, seq: int, code: str, message: str) -> None:
        super().__init__(f"{stream} seq {seq} refused: {code}: {message}")
        self.stream = stream
        self.seq = seq
        self.code = code


class EventGivenUp(SkewlessError):
    """The gateway gave up waiting for this event (a ``gap`` notice: it did not have it when its reorder wait ran
    out, ``reason`` ``timeout`` or ``buffer_full``), and the acks moved past it. It is not on the events topic. The
    client resent it once (``resent``): arriving now, it is published on the late topic (``late_after_skip``),
    unless that resend is lost too. A delivery future of that event fails with it; ``flush()`` does not wait for it.
    """

    def __init__(self, stream: str, seq: int, reason: str, resent: bool) -> None:
        super().__init__(f"{stream} seq {seq} given up by the gateway ({reason}): not on the events topic"
                         + ("; resent once for the late topic" if resent else ""))
        self.stream = stream
        self.seq = seq
        self.reason = reason
        self.resent = resent


class ClientClosed(SkewlessError, RuntimeError):
    """``send()`` after ``close()``, or a delivery future of an event still unacknowledged when the client closed."""


class FlushTimeout(SkewlessError, TimeoutError):
    """``flush(timeout_s)`` ran out of time with events still unacknowledged."""
