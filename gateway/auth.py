"""Source authentication for the hello message, sans-IO.

Two credential kinds, checked in this order:
- a static token per source (`tokens`: source_id -> token), compared in constant time;
- an HMAC token `"<ts_us>:<hex>"` with hex = HMAC-SHA256(secret, "<source_id>:<ts_us>"), accepted when ts_us is
  within `max_skew_us` of the gateway clock, so a captured hello cannot be replayed for long.
With neither configured every source is accepted (development mode); `allowed_sources` restricts ids either way.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from gateway.errors import RemoteProtocolError

DEFAULT_HMAC_MAX_SKEW_US = 300_000_000  # 5 minutes, as Kerberos and most signed-request schemes allow


class AuthenticationFailed(RemoteProtocolError):
    code = "unauthenticated"


class UnknownSource(RemoteProtocolError):
    code = "unknown_source"


def hmac_token(secret: bytes, source_id: str, ts_us: int) -> str:
    digest = hmac.new(secret, f"{source_id}:{ts_us}".encode(), hashlib.sha256).hexdigest()
    return f"{ts_us}:{digest}"


@dataclass(frozen=True)
class SourceAuthenticator:
    tokens: Mapping[str, str] = field(default_factory=dict)
    hmac_secret: bytes | None = None
    allowed_sources: Collection[str] | None = None
    max_skew_us: int = DEFAULT_HMAC_MAX_SKEW_US

    @property
    def enabled(self) -> bool:
        return bool(self.tokens) or self.hmac_secret is not None

    def check(self, source_id: str, token: str | None, now_us: int) -> None:
        """Raises UnknownSource or AuthenticationFailed; returns None when the source may stream."""
        if self.allowed_sources is not None and source_id not in self.allowed_sources:
            raise UnknownSource(f"source {source_id!r} is not registered with this gateway")
        if not self.enabled:
            return
        if token is None:
            raise AuthenticationFailed(f"source {source_id!r}: credentials required")
        expected = self.tokens.get(source_id)
        if expected is not None:
            if hmac.compare_digest(token.encode(), expected.encode()):
                return
            raise AuthenticationFailed(f"source {source_id!r}: wrong token")
        if self.hmac_secret is None:
            raise UnknownSource(f"source {source_id!r} has no credentials on this gateway")
        self._check_hmac(source_id, token, now_us)

    def _check_hmac(self, source_id: str, token: str, now_us: int) -> None:
        ts_text, _, _digest = token.partition(":")
        try:
            ts_us = int(ts_text)
        except ValueError:
            raise AuthenticationFailed(f"source {source_id!r}: malformed HMAC token") from None
        if abs(now_us - ts_us) > self.max_skew_us:
            raise AuthenticationFailed(f"source {source_id!r}: HMAC token timestamp too far from gateway time")
        assert self.hmac_secret is not None
        if not hmac.compare_digest(token.encode(), hmac_token(self.hmac_secret, source_id, ts_us).encode()):
            raise AuthenticationFailed(f"source {source_id!r}: wrong HMAC")
