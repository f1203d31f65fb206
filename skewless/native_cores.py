"""The compiled cores (native/, ``skewless_native``) as the cores the floors below take.

Floor 2 (reorder/, reorder/eval/) may not import the extension module, so the CLI injects them: ``skewless replay
--core native`` runs :class:`reorder.pipeline.IngestPipeline` with the Rust ``SequenceReorderer`` and
``MultiSourceMerger`` (gateway/native.py's, the gateway's own) in place of reorder/sequence.py's and
reorder/merger.py's, which stay their executable specification (tests/unit/native/test_native_sequence.py,
test_native_merger.py, test_native_replay.py).
"""

from __future__ import annotations

from gateway.native import NATIVE_PIPELINE_CORES, native_available
from reorder.pipeline import PipelineCores

__all__ = ["pipeline_cores"]


def pipeline_cores() -> dict[str, PipelineCores]:
    """The pipeline cores this install has beyond the Python ones: ``native`` once the extension is built."""
    return {"native": NATIVE_PIPELINE_CORES} if native_available() else {}
