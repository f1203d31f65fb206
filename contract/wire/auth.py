"""The hello's credentials, as both ends compute them (docs/wire-protocol.md, "Authentication"), pure.

An HMAC token is ``f"{ts_us}:{HMAC-SHA256(key, f'{source_id}:{ts_us}')}"``; a source's own key is derived from the
deployment's master secret with a domain-separation prefix, so that a source holds only its own key.
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["SOURCE_KEY_CONTEXT", "derive_source_key", "hmac_token"]

# Domain separation of derived keys: a key derived for one purpose is never a valid key for another.
SOURCE_KEY_CONTEXT = "skewless source key v1:"


def hmac_token(key: bytes, source_id: str, ts_us: int) -> str:
    digest = hmac.new(key, f"{source_id}:{ts_us}".encode(), hashlib.sha256).hexdigest()
    return f"{ts_us}:{digest}"


def derive_source_key(master: bytes, source_id: str) -> str:
    """Hex of HMAC-SHA256(master, SOURCE_KEY_CONTEXT + source_id)."""
    return hmac.new(master, (SOURCE_KEY_CONTEXT + source_id).encode(), hashlib.sha256).hexdigest()
