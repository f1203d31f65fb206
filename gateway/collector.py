"""The gateway process and Python's cyclic garbage collector.

A saturated gateway holds a large, changing set of Python objects: the events decoded ahead of their connection's
worker (up to ``MAX_PENDING_READ_BYTES`` of reads per connection), the events the merge holds, the records and
their delivery references of the open transaction. Almost none of them is part of a cycle (reference counting
frees them), yet with CPython's default thresholds (700, 10, 10) the collector traverses them over and over: in the
20-source run of benchmarks/gateway_throughput.py with the native core it took 2.3-2.9 us of CPU per event
(docs/gateway-profile-e2e.txt), 16-19 % of the event loop's thread, mostly in full collections that walk every
object the process holds (some 150,000 then).

So, once the gateway has started (imports, configuration, Kafka clients: objects that live as long as the process):

* ``gc.freeze()`` moves what exists to the permanent generation, which no collection traverses again;
* a young collection runs after ``YOUNG_COLLECTION_ALLOCATIONS`` container allocations (net) instead of 700: a
  full collection, which CPython runs at most every 11 young ones, then comes about 30 times less often.

Cyclic garbage is still collected, later: what a young collection finds unreachable it frees as before. Nothing the
gateway writes, acknowledges or counts depends on when a collection runs. With the native core the per-event objects
it builds (IncomingEvent, Produce, DeliveryRef) are not on the collector's lists at all (native/src/records/slots.rs:
they cannot close a cycle), so a young collection no longer walks them either.
"""

from __future__ import annotations

import gc

__all__ = ["YOUNG_COLLECTION_ALLOCATIONS", "settle_collector"]

#: Container allocations (less deallocations) between two young collections; CPython's default is 700. Measured in
#: the 20-source run: 20,000 took the collector's share from 2.3-2.9 to 0.3-0.7 us per event.
YOUNG_COLLECTION_ALLOCATIONS = 20_000


def settle_collector() -> None:
    """Call once the process has started serving: collect, freeze what is there, raise the young threshold (the
    older generations' thresholds stay CPython's)."""
    gc.collect()
    gc.freeze()
    _young, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_ALLOCATIONS, middle, old)
