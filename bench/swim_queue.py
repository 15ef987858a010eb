"""SWIM's update queue under a large merge: the heaps of gossip/dissemination.py against a scan.

    python -m bench.swim_queue [--records 1024] [--capacity 256] [--piggyback 8] [--repeats 5]

One member merges a push-pull of ``--records`` records into a queue of ``--capacity`` (the
default ``SwimConfig.max_pending``), then piggybacks ``--piggyback`` records on each of as many
messages: what every member of a simulated swarm does at its start, and a daemon does when a
large swarm's member list arrives. The baseline is the queue as it was, a dict scanned whole
for each record dropped and each message's choice (tests/gossip/test_dissemination.py holds the
two to the same choices). Both run in this process; the figure is the best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import heapq
import time
from collections.abc import Callable

from gossip.dissemination import UpdateQueue
from gossip.swim_messages import MemberRecord


class ScanQueue:
    """The queue before gossip/dissemination.py: a dict in queue order, scanned per choice."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: dict[str, tuple[MemberRecord, int]] = {}

    def push(self, record: MemberRecord, sends: int) -> bool:
        self.items.pop(record.node_id, None)
        full = len(self.items) >= self.capacity
        if full:
            del self.items[min(self.items, key=lambda i: self.items[i][1])]
        self.items[record.node_id] = (record, sends)
        return not full

    def take(self, k: int) -> list[MemberRecord]:
        chosen = heapq.nlargest(k, self.items.items(), key=lambda kv: kv[1][1])
        for node_id, (record, left) in chosen:
            if left <= 1:
                del self.items[node_id]
            else:
                self.items[node_id] = (record, left - 1)
        return [record for _, (record, _) in chosen]


def workload(make: Callable[[], UpdateQueue | ScanQueue], records: int, k: int) -> float:
    batch = [
        MemberRecord(f"m{i:05d}", f"10.0.{i // 250}.{i % 250}:7000", 1) for i in range(records)
    ]
    queue = make()
    started = time.perf_counter()
    for i, record in enumerate(batch):
        queue.push(record, 20 + i % 7)
    for _ in range(records):
        queue.take(k)
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1024)
    ap.add_argument("--capacity", type=int, default=256)
    ap.add_argument("--piggyback", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    runs: dict[str, Callable[[], UpdateQueue | ScanQueue]] = {
        "scan (before)": lambda: ScanQueue(args.capacity),
        "heaps": lambda: UpdateQueue(args.capacity),
    }
    best = {
        name: min(workload(make, args.records, args.piggyback) for _ in range(args.repeats))
        for name, make in runs.items()
    }
    base = best["scan (before)"]
    print(f"{args.records} records into a queue of {args.capacity}, {args.piggyback} a message")
    print("| queue | ms | vs scan |\n|---|---:|---:|")
    for name, seconds in best.items():
        print(f"| {name} | {seconds * 1e3:.1f} | {seconds / base:.3f} |")


if __name__ == "__main__":
    main()
