"""Credentials for the hello's ``token`` field: a static token, or an HMAC token made fresh per connection.

HMAC format (the gateway checks the same one, gateway/auth.py)::

    token = f"{ts_us}:{hexdigest}"    hexdigest = HMAC-SHA256(secret, f"{source_id}:{ts_us}").hexdigest()

``ts_us`` is the source's best idea of the reference clock (integer microseconds since the epoch) when it
connects; the gateway refuses a token whose ``ts_us`` is too far from its own clock, so a captured token is only
good for a short while.

``secret`` is the source's own key: with a gateway configured with a master secret (``hmac_master``), the key is
``derive_source_key(master, source_id)`` (64 hex digits, used as the bytes of that text), printed by
``skewless keys derive --source ID``; a source holding its key cannot sign as any other source. Pass it as
``SkewlessClient(..., hmac_secret=key.encode())``.
"""

from __future__ import annotations

from collections.abc import Callable

from contract.wire import auth as wire_auth

__all__ = ["TokenProvider", "derive_source_key", "hmac_provider", "hmac_token", "parse_hmac_token", "static_token"]


TokenProvider = Callable[[], str]
"""Called once per connection attempt; returns the hello's ``token``."""


def hmac_token(secret: bytes, source_id: str, ts_us: int) -> str:
    """``f"{ts_us}:{HMAC-SHA256(secret, f'{source_id}:{ts_us}')}"`` (pure)."""
    if not secret:
        raise ValueError("the HMAC secret must not be empty")
    if ts_us < 0:
        raise ValueError("ts_us must be >= 0")
    return wire_auth.hmac_token(secret, source_id, ts_us)


def derive_source_key(master: bytes, source_id: str) -> str:
    """A source's own key from the deployment's master secret: hex of HMAC-SHA256(master, "skewless source key
    v1:" + source_id) (pure). For provisioning: a source needs only its own key, never the master."""
    if not master:
        raise ValueError("the master secret must not be empty")
    return wire_auth.derive_source_key(master, source_id)


def parse_hmac_token(token: str) -> tuple[int, str]:
    """``(ts_us, hexdigest)`` of an HMAC token; ValueError if it does not have that shape."""
    ts_text, sep, digest = token.partition(":")
    if not sep or not ts_text.isdigit() or len(digest) != 64:
        raise ValueError("not an HMAC token '<ts_us>:<64 hex digits>'")
    int(digest, 16)
    return int(ts_text), digest


def static_token(token: str) -> TokenProvider:
    """A provider that always returns ``token``."""
    return lambda: token


def hmac_provider(secret: bytes, source_id: str, ts_us: Callable[[], int]) -> TokenProvider:
    """A provider that signs ``ts_us()`` (read at each connection attempt).

    The gateway accepts each token once (a replayed hello is refused), so two connection attempts within the same
    microsecond (a pool reconnecting at once) get strictly increasing timestamps."""
    if not secret:
        raise ValueError("the HMAC secret must not be empty")
    last = [-1]

    def provide() -> str:
        ts = max(ts_us(), last[0] + 1)
        last[0] = ts
        return hmac_token(secret, source_id, ts)

    return provide
