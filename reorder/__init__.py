"""Order restoration for event streams, as production runs it: per-source sequence reordering (sequence.py),
multi-source merging by reference time with exact watermarks (merger.py), and pipeline.py, the one wiring of
reorderers -> reference mapping -> merger that the gateway and the replay both use.

Pure and I/O-free; every component takes the current time as an argument. The thesis evaluation harness (K-slack
family, oracle, traces, sync simulation, replay) lives in :mod:`reorder.eval`. See docs/reorder.md.
"""
