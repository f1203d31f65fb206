"""The gateway process and two of the interpreter's process-wide settings: the cyclic garbage collector, and how
long the event loop's thread keeps the GIL from the gateway's other threads.

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

The GIL: the gateway's other threads (the executor's ``flush`` and ``commit`` of each transaction, whose delivery
reports confluent-kafka serves by taking the GIL once per record, callback or not) ask for it while the event loop
runs, and after ``sys.getswitchinterval()`` (5 ms by default) the loop's thread is made to hand it over, then waits
until that thread got a core, ran its few lines and handed it back: the sockets go unread meanwhile (a profile of
the loop's thread at 20 sources x 500 events/s: 1,374 such waits in 6 s, 37 over 1 ms). The loop gives the GIL up
by itself whenever it waits for the sockets (a third of the time or more at that load) and in every ``poll`` of
librdkafka (every 2 ms, saturated or not), so those threads are not starved by a longer interval; the loop is no
longer preempted for their single callbacks. Measured at 20 sources x 500 events/s (gateway first, native core, 10
side-by-side rounds; docs/hot-paths.md): p99 added latency 7.46 and 7.57 against 7.73 and 7.69 ms (medians of two
sets), read lag p99 2.82-2.93 against 3.23-3.42 ms; at saturation the same events/s (68,447 against 62,217 in one
side-by-side run, within its spread).
"""

from __future__ import annotations

import gc
import sys

__all__ = ["LOOP_SWITCH_INTERVAL_S", "YOUNG_COLLECTION_ALLOCATIONS", "settle_collector", "settle_switch_interval"]

#: How long a thread may hold the GIL while another asks for it before it must hand it over (CPython: 0.005).
LOOP_SWITCH_INTERVAL_S = 0.05

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


def settle_switch_interval() -> None:
    """Call once in the serving process: the event loop's thread is made to hand the GIL over after
    ``LOOP_SWITCH_INTERVAL_S``, not CPython's 5 ms (module doc)."""
    sys.setswitchinterval(LOOP_SWITCH_INTERVAL_S)
