"""What the reorder benchmark compares with, and the names both its run and its report use.

benchmarks/reorder_replay.py runs the replays and imports benchmarks/reorder_report.py, which writes the
Markdown; both read this module and neither imports the other back.
"""

from __future__ import annotations

from reorder.eval.replay import Approach

# Thesis 003, Tables 5.4-5.10 (ms, %, counts), copied as published.
THESIS_T54 = {"sequence": (4.09, 10.98), "mpkslack": (399.56, 465.37), "aqkslack": (79.04, 133.27)}
THESIS_T55 = {"sequence": (5, 99.99), "mpkslack": (5, 99.99), "aqkslack": (5, 99.99)}
THESIS_T56 = {
    "dataset1": {"sequence": 4.09, "mpkslack": 399.56, "aqkslack": 79.04},
    "dataset2": {"sequence": 6.52, "mpkslack": 1397.52, "aqkslack": 176.48},
    "dataset3": {"sequence": 398.12, "mpkslack": 62507.29, "aqkslack": 10462.98},
}
THESIS_T57 = {
    "dataset1": {"sequence": 99.99, "mpkslack": 99.99, "aqkslack": 99.99},
    "dataset2": {"sequence": 99.97, "mpkslack": 99.98, "aqkslack": 99.96},
    "dataset3": {"sequence": 99.98, "mpkslack": 99.99, "aqkslack": 99.98},
}
THESIS_T58 = {
    1: (398.12, 62507.29, 10462.98),
    2: (412.23, 67274.41, 12634.21),
    5: (552.72, 72937.56, 13432.69),
    10: (652.34, 66178.05, 16134.3),
    20: (963.54, 78200.31, 19313.43),
}
THESIS_T59 = {1: (99.98, 99.99, 99.98), 2: (99.97, 99.98, 99.47), 5: (99.97, 99.99, 99.12),
              10: (99.97, 99.99, 99.02), 20: (99.97, 99.99, 99.08)}  # fmt: skip
THESIS_T510 = {"0ms": (52, 99.97, 52, 99.97), "1ms": (502560, -201.98, 78, 99.95),
               "5ms": (505235, -203.58, 75, 99.95), "10ms": (539849, -224.38, 72, 99.96),
               "1min": (441979, -165.57, 74, 99.96), "1h": (18001, 89.18, 73, 99.96)}  # fmt: skip

APPROACH_LABEL = {
    "sequence": "Sequence (ours, adaptive)",
    "sequence-gateway": "Sequence (ours), gateway settings",
    "sequence-fixedwait": "Sequence (ours), merge wait not learned",
    "sequence-gateway-fixedwait": "Sequence (ours), gateway settings, merge wait not learned",
    "thesis": "Sequence (thesis Eq. 3.11)",
    "kslack": "K-slack (K = 100 ms)",
    "mpkslack": "MP-K-slack (Siddhi kslack)",
    "aqkslack": "AQ-K-slack (Siddhi akslack)",
    "oracle": "Oracle (100 % order)",
    "sequence-fixed": "Sequence (ours), 2 s threshold not learned, 100k buffer",
}
ALL: tuple[Approach, ...] = ("sequence", "thesis", "kslack", "mpkslack", "aqkslack", "oracle")
# the per-profile runs: every approach, and the sequence approach as the gateway configures it
PROFILE_RUNS = ("sequence", "sequence-gateway", "thesis", "kslack", "mpkslack", "aqkslack", "oracle")
# the multi-source uplink-stall profiles (issue 12 item 7): the sequence runs with and without the learned merge wait
MULTI_SOURCE_RUNS = ("sequence", "sequence-fixedwait", "sequence-gateway", "sequence-gateway-fixedwait", "thesis",
                     "mpkslack", "aqkslack", "oracle")  # fmt: skip
# Table 5.10: source s1's clock offset per row; it also runs SKEW_PPM fast (except at 0 ms)
DRIFTS = {"0ms": 0, "1ms": 1_000, "5ms": 5_000, "10ms": 10_000, "1min": 60_000_000, "1h": 3_600_000_000}
SKEW_PPM = 20.0
# the per-profile traces (events, seed 1) and the further seeds sequence and MP-K-slack run on (issue 25 item 5)
PROFILE_SIZES = {"dataset1": 500_000, "dataset2": 500_000, "dataset3": 1_000_000, "heavytail": 300_000,
                 "pool": 300_000}  # fmt: skip
EXTRA_SEEDS = (2, 3)
