"""Source authentication for the hello message, sans-IO.

Two credential kinds, checked in this order:
- a static token per source (`tokens`: source_id -> token), compared in constant time;
- an HMAC token `"<ts_us>:<hex>"` with hex = HMAC-SHA256(key, "<source_id>:<ts_us>"), accepted when ts_us is
  within `max_skew_us` of the gateway clock and used for the first time: a captured hello cannot be replayed (each
  accepted HMAC token is remembered until it is too old to pass the clock check anyway).

The HMAC key is the source's own (docs/wire-protocol.md, "Authentication"), first found of:
- its entry in the key table (`source_keys`: source_id -> key);
- its key derived from the master secret (`hmac_master`): ``derive_source_key(master, source_id)``, the hex of
  HMAC-SHA256(master, "skewless source key v1:" + source_id). The gateway keeps only the master; each source gets
  its own key (``skewless keys derive --source ID``) and cannot sign as another;
- the shared secret (`hmac_secret`, the older scheme): one key for every source, so any holder can sign as any
  source id.
A key is used as the bytes of its text (UTF-8): a derived key is its 64 hex digits.
With none configured every source is accepted (development mode); `allowed_sources` restricts ids either way.
"""

from __future__ import annotations

import heapq
import hmac
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from contract.wire.auth import derive_source_key, hmac_token
from contract.wire.errors import RemoteProtocolError

# derive_source_key and hmac_token are the wire's (contract/wire/auth.py), re-exported for the gateway's callers.
__all__ = ["DEFAULT_HMAC_MAX_SKEW_US", "AuthenticationFailed", "ReplayGuard", "SourceAuthenticator", "UnknownSource",
           "derive_source_key", "hmac_token"]

DEFAULT_HMAC_MAX_SKEW_US = 300_000_000  # 5 minutes, as Kerberos and most signed-request schemes allow


class AuthenticationFailed(RemoteProtocolError):
    code = "unauthenticated"


class UnknownSource(RemoteProtocolError):
    code = "unknown_source"


class ReplayGuard:
    """HMAC tokens already accepted, each kept until its timestamp leaves the accepted window.

    Only tokens whose MAC verified are stored, so the memory is bounded by the legitimate connection rate times the
    window, never by what an attacker sends."""

    def __init__(self) -> None:
        self._seen: set[tuple[str, int]] = set()
        self._expiry: list[tuple[int, str]] = []

    def __len__(self) -> int:
        return len(self._seen)

    def first_use(self, source_id: str, ts_us: int, now_us: int, window_us: int) -> bool:
        while self._expiry and self._expiry[0][0] < now_us - window_us:
            old_ts, old_source = heapq.heappop(self._expiry)
            self._seen.discard((old_source, old_ts))
        key = (source_id, ts_us)
        if key in self._seen:
            return False
        self._seen.add(key)
        heapq.heappush(self._expiry, (ts_us, source_id))
        return True


@dataclass(frozen=True)
class SourceAuthenticator:
    tokens: Mapping[str, str] = field(default_factory=dict)
    hmac_secret: bytes | None = None
    allowed_sources: Collection[str] | None = None
    hmac_master: bytes | None = None
    source_keys: Mapping[str, str] = field(default_factory=dict)
    max_skew_us: int = DEFAULT_HMAC_MAX_SKEW_US
    replay_guard: ReplayGuard = field(default_factory=ReplayGuard, compare=False, repr=False)

    @property
    def enabled(self) -> bool:
        return bool(self.tokens) or bool(self.source_keys) or self.hmac_secret is not None or \
            self.hmac_master is not None

    def key_of(self, source_id: str) -> bytes | None:
        """The HMAC key ``source_id`` must sign with (module doc), or None if it has none here."""
        key = self.source_keys.get(source_id)
        if key is not None:
            return key.encode()
        if self.hmac_master is not None:
            return derive_source_key(self.hmac_master, source_id).encode()
        return self.hmac_secret

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
        key = self.key_of(source_id)
        if key is None:
            raise UnknownSource(f"source {source_id!r} has no credentials on this gateway")
        self._check_hmac(source_id, token, now_us, key)

    def _check_hmac(self, source_id: str, token: str, now_us: int, key: bytes) -> None:
        ts_text, _, _digest = token.partition(":")
        try:
            ts_us = int(ts_text)
        except ValueError:
            raise AuthenticationFailed(f"source {source_id!r}: malformed HMAC token") from None
        if abs(now_us - ts_us) > self.max_skew_us:
            raise AuthenticationFailed(f"source {source_id!r}: HMAC token timestamp too far from gateway time")
        if not hmac.compare_digest(token.encode(), hmac_token(key, source_id, ts_us).encode()):
            raise AuthenticationFailed(f"source {source_id!r}: wrong HMAC")
        if not self.replay_guard.first_use(source_id, ts_us, now_us, self.max_skew_us):
            raise AuthenticationFailed(f"source {source_id!r}: HMAC token already used (replayed hello)")
