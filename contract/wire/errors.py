"""Protocol errors, split by who broke the protocol (h11-style): the remote peer or this process."""

from __future__ import annotations


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
