"""Where Skewless keeps fetched jars and runtime state."""

from __future__ import annotations

import os
from pathlib import Path

RESOURCES_DIR = Path(__file__).with_name("resources")


def cache_dir() -> Path:
    """Jars and broker state live here; SKEWLESS_CACHE_DIR overrides the checkout-local default."""
    configured = os.environ.get("SKEWLESS_CACHE_DIR")
    if configured:
        return Path(configured)
    # An editable/source checkout keeps the cache beside the code (git-ignored); an installed wheel uses ~/.cache.
    checkout = Path(__file__).resolve().parents[1]
    if (checkout / "pyproject.toml").exists():
        return checkout / ".cache"
    return Path.home() / ".cache" / "skewless"


def kafka_jars_dir() -> Path:
    return cache_dir() / "jars" / "kafka"


def spark_jars_dir() -> Path:
    return cache_dir() / "jars" / "spark"
