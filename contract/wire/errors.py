"""Protocol errors, split by who broke the protocol (h11-style): the remote peer or this process; and the error codes
of a gateway cluster's routing, which are nobody's protocol error."""

from __future__ import annotations

# Routing error codes (docs/wire-protocol.md, "Shards and routing"). Both are fatal (the gateway closes the connection)
# and neither is the source's fault, so a client must not give up on them: it backs off (at least the frame's
# ``retry_after_ms`` when given), forgets the owner it remembered, goes through its address list again and resends
# every event not acknowledged yet (the owner drops duplicates).
SHARD_UNAVAILABLE = "shard_unavailable"
"""The source's shard has no serving owner right now (its owner is recovering it, or it is failing over)."""
SHARD_MOVED = "shard_moved"
"""This gateway stopped serving the source's shard (revoked, fenced, or restarting): another owner takes it."""
ROUTING_ERROR_CODES = frozenset({SHARD_UNAVAILABLE, SHARD_MOVED})


class ProtocolError(Exception):
    """Base class; `code` travels to the client in the error frame, `fatal` closes the connection."""

    code = "protocol_error"
    fatal = True


class RemoteProtocolError(ProtocolError):
    """The client sent something the protocol forbids."""


class FrameTooLarge(RemoteProtocolError):
    code = "frame_too_large"


class MalformedFrame(RemoteProtocolError):
    code = "malformed_frame"


class InvalidMessage(RemoteProtocolError):
    code = "invalid_message"


class InvalidPayload(RemoteProtocolError):
    """One event's payload cannot travel unchanged in a JSON record: that event is refused, the connection goes on
    (contract.wire.messages.payload_problem has the rules)."""

    code = "invalid_payload"
    fatal = False


class UnexpectedMessage(RemoteProtocolError):
    """A message type that the session's current state does not accept."""

    code = "unexpected_message"


class UnsupportedVersion(RemoteProtocolError):
    code = "unsupported_version"


class SessionTimeout(RemoteProtocolError):
    code = "timeout"


class LocalProtocolError(ProtocolError):
    """This side tried to do something its own state forbids: a bug, never the client's fault."""

    code = "internal_error"
