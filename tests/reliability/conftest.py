"""The reliability campaign gets its own broker: its scenarios stop it (SIGSTOP) and flood it."""

from __future__ import annotations

from tests.integration.conftest import kafka, topic_prefix

__all__ = ["kafka", "topic_prefix"]
