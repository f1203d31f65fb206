"""Exact state round trip of a :class:`SequenceEngine` (msgpack).

Every stored event is written once (keyed by its arrival number ``seq``); stacks list (seq, RIP seq) pairs in
stack order, negation buffers and holding sets list seqs in their order.  The heaps are rebuilt from the
partitions: their order only decides which partition is purged first, and held matches are released by
(final_at, match_id), which the snapshot keeps, so a restored engine produces exactly the same output.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import fields
from typing import TYPE_CHECKING, Any

import msgpack

from .ais import Instance
from .events import SaseError, SaseEvent
from .negation import HeldMatch, negation_ranges

if TYPE_CHECKING:
    from .engine import SequenceEngine

__all__ = ["dump", "load"]

_VERSION = 1


def _fingerprint(engine: SequenceEngine) -> str:
    q = engine.query
    return repr((q.elements, q.predicates, q.window))


def dump(engine: SequenceEngine) -> bytes:
    from .engine import EngineCounters

    events: dict[int, SaseEvent] = {}
    parts: list[list[Any]] = []
    for key, part in engine._partitions.items():
        stacks = []
        for pos in range(engine.query.length):
            items = []
            for inst in part.ais.instances(pos):
                events[inst.seq] = inst.event
                items.append([inst.seq, inst.rip.seq if inst.rip is not None else None])
            stacks.append(items)
        negs = []
        for buf in part.neg:
            for _, seq, ev in buf.events:
                events[seq] = ev
            negs.append(buf.seqs())
        held = []
        for h in part.held.values():
            for seq, ev in zip(h.seqs, h.events, strict=True):
                events[seq] = ev
            held.append([h.match_id, list(h.seqs), h.kind])
        parts.append([key, part.ais.ais_clock, part.ais.rip_resets, part.ais.candidates, part.registered_ts,
                      stacks, negs, held])
    counters = {f.name: getattr(engine.counters, f.name) for f in fields(EngineCounters)}
    doc = {
        "v": _VERSION,
        "query": _fingerprint(engine),
        "clock": engine._clock,
        "punctuation": engine._punctuation,
        "seq": engine._seq,
        "match_id": engine._match_id,
        "counters": counters,
        "purge_log": [list(x) for x in engine.purge_log],
        "events": [[s, e.event_type, e.ts, dict(e.attrs), e.event_id] for s, e in sorted(events.items())],
        "partitions": parts,
    }
    try:
        return bytes(msgpack.packb(doc, use_bin_type=True))
    except (TypeError, ValueError, OverflowError) as exc:
        raise SaseError(f"engine state is not serialisable (attribute values must be msgpack types): {exc}") from exc


def _key(raw: Any) -> Hashable:
    return tuple(_key(x) for x in raw) if isinstance(raw, list) else raw


def load(engine: SequenceEngine, blob: bytes) -> SequenceEngine:
    from .engine import _Partition

    try:
        doc = msgpack.unpackb(blob, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.ExtraData) as exc:
        raise SaseError(f"not an engine snapshot: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("v") != _VERSION:
        raise SaseError("not an engine snapshot of a supported version")
    if doc["query"] != _fingerprint(engine):
        raise SaseError("snapshot was taken for a different query")
    q = engine.query
    events = {s: SaseEvent(t, ts, attrs, eid) for s, t, ts, attrs, eid in doc["events"]}
    engine._clock = doc["clock"]
    engine._punctuation = doc["punctuation"]
    engine._update_low()
    engine._seq = doc["seq"]
    engine._match_id = doc["match_id"]
    for name, value in doc["counters"].items():
        setattr(engine.counters, name, value)
    engine.purge_log = [(a, b, c) for a, b, c in doc["purge_log"]]
    import heapq

    for raw_key, ais_clock, rip_resets, candidates, registered_ts, stacks, negs, held in doc["partitions"]:
        key = _key(raw_key)
        part = _Partition(q)
        part.ais.ais_clock = ais_clock
        part.ais.rip_resets = rip_resets
        part.ais.candidates = candidates
        prev: dict[int, Instance] = {}
        for pos, items in enumerate(stacks):
            st = part.ais.stacks[pos]
            cur: dict[int, Instance] = {}
            for seq, rip_seq in items:
                inst = Instance(events[seq], seq)
                inst.rip = prev.get(rip_seq) if rip_seq is not None else None
                st.items.append(inst)
                st.ts.append(inst.ts)
                cur[seq] = inst
            prev = cur
        for buf, seqs in zip(part.neg, negs, strict=True):
            buf.restore([(events[s], s) for s in seqs])
        for mid, seqs, kind in held:
            evs = tuple(events[s] for s in seqs)
            ranges = negation_ranges(q, evs)
            final_at = max(hi for _, hi in ranges)
            part.held[mid] = HeldMatch(mid, evs, tuple(seqs), ranges, final_at, kind)
            heapq.heappush(engine._release_heap, (final_at, mid, key))
        engine._partitions[key] = part
        if registered_ts is not None:
            part.registered_ts = None
            engine._register(part, key, registered_ts)
    return engine
