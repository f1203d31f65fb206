"""Client SDK for Skewless event sources."""

from clients.client import GatewayRejected, SkewlessClient

__all__ = ["GatewayRejected", "SkewlessClient"]
