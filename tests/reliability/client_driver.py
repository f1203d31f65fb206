"""A child process running SDK sources, for scenarios that kill the client or put it in another network namespace.

Each source sends events `next_seq .. events-1` of stream "s" (so a source restarted from its spool continues where
the spool says it stopped) with payload {"src": id, "i": seq} and, with --ts-base, the deterministic source time
`ts_base + seq * ts_step + k` (k = the source's index), then flushes. Progress lines ("progress SRC NEXT ACKED
UNACKED") go to stdout while sending; the last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

import orjson

from clients import Backoff, SkewlessClient


async def run_source(args: argparse.Namespace, k: int, source_id: str, barrier: asyncio.Barrier) -> dict[str, object]:
    spool = f"{args.spool_dir}/{source_id}.spool" if args.spool_dir else None
    client = SkewlessClient(args.host, args.port, source_id, ["s"], udp_port=args.udp_port, batch_events=args.batch,
                            max_unacked=args.max_unacked, spool_path=spool, connect_timeout_s=args.connect_timeout_s,
                            backoff=Backoff(initial_s=0.05, max_s=args.backoff_max_s), resync_interval_s=None)
    recovered = client.stats.recovered_from_spool
    await client.connect()
    # Every source joins the gateway's merge before any sends: otherwise the first one's events could pass a
    # watermark before a late joiner's first events, and two runs of the same workload would differ.
    await barrier.wait()
    first = client.next_seq("s")
    for i in range(first, args.events):
        ts = None if args.ts_base is None else args.ts_base + i * args.ts_step + k
        assert await client.send("s", {"src": source_id, "i": i}, source_ts_us=ts) == i
        if args.pace_every and i % args.pace_every == args.pace_every - 1:
            await client.send_pending()
            print(f"progress {source_id} {client.next_seq('s')} {client.acked_through('s')} {client.unacked_count}",
                  flush=True)
            await asyncio.sleep(args.pace_s)
    await client.flush(timeout_s=args.flush_timeout_s)
    stats = client.stats
    summary = {"source_id": source_id, "first_seq": first, "recovered_from_spool": recovered,
               "acked_through": client.acked_through("s"), "unacked": client.unacked_count,
               "reconnects": stats.reconnects, "connection_losses": stats.connection_losses,
               "events_resent": stats.events_resent, "events_sent": stats.events_sent}
    await client.close()
    return summary


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--udp-port", type=int)
    parser.add_argument("--sources", required=True, help="comma-separated source ids")
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--max-unacked", type=int, default=100_000)
    parser.add_argument("--spool-dir")
    parser.add_argument("--ts-base", type=int)
    parser.add_argument("--ts-step", type=int, default=1_000)
    parser.add_argument("--pace-every", type=int, default=0)
    parser.add_argument("--pace-s", type=float, default=0.0)
    parser.add_argument("--connect-timeout-s", type=float, default=60.0)
    parser.add_argument("--flush-timeout-s", type=float, default=120.0)
    parser.add_argument("--backoff-max-s", type=float, default=0.5)
    args = parser.parse_args()
    sources = [s for s in args.sources.split(",") if s]
    barrier = asyncio.Barrier(len(sources))
    results = await asyncio.gather(*(run_source(args, k, s, barrier) for k, s in enumerate(sources)))
    sys.stdout.write(orjson.dumps({"sources": results}).decode() + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    asyncio.run(main())
