"""The compiled cores (native/, ``skewless_native``) as the factories the floors below take.

Floor 2 (reorder/, reorder/eval/) may not import the extension module, so the CLI injects them: ``skewless replay
--core native`` runs :class:`reorder.pipeline.IngestPipeline` with the Rust ``SequenceReorderer`` in place of
reorder/sequence.py's, which stays its executable specification (tests/unit/test_native_sequence.py).
"""

from __future__ import annotations

from reorder.pipeline import ReordererFactory, SequenceCore
from reorder.records import GapSkipped, Late, Released
from reorder.sequence import SequenceConfig

__all__ = ["native_sequence_reorderer", "reorderer_cores"]


def native_sequence_reorderer(source_id: str, stream: str, config: SequenceConfig) -> SequenceCore:
    """The Rust reorderer of (source_id, stream), with the Python core's API and output records."""
    import skewless_native

    return skewless_native.SequenceReorderer(source_id, stream, config, records=(Released, Late, GapSkipped))


def reorderer_cores() -> dict[str, ReordererFactory]:
    """The reorderer cores this install has beyond the Python one: ``native`` once the extension is built."""
    try:
        import skewless_native  # noqa: F401  (only whether it imports)
    except ModuleNotFoundError:
        return {}
    return {"native": native_sequence_reorderer}
