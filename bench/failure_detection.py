"""SWIM failure detection on the discrete-event simulator: detection time, false positives, traffic.

    python -m bench.failure_detection [--sizes 32 128] [--losses 0 0.05 0.2] [--seeds 5] [--quick]
        [--full-quiet]

Every run is :class:`gossip.swim_sim.SwimSimulation` with the default :class:`SwimConfig`, a
uniform 1-20 ms one-way delay and independent loss of each message, started in a steady state
(see ``steady_start``). Times are simulated seconds, so the figures do not depend on the
machine; only the wall time does. Two kinds of run:

* Detection (one per size, loss and seed): the swarm runs ``--warm-s`` seconds plus a random
  fraction of a period, then one member, picked at random, crashes. Measured: the time until
  the first live member suspects it (or has it dead; 0 if one already suspected it when it
  crashed), and until every live member has it dead, waiting at most twice the configured
  bound ``SwimConfig.detection_deadline_s(n)`` ("never" if that passes). The table gives the
  median and the maximum over the seeds, the bound, max / bound, the number of crashes that
  took longer than the bound, and how many *other* members were declared dead by anyone during
  these runs (false positives), summed over the runs.
* Quiet (one per size and loss, no crash): ``--quiet-s`` seconds, less for larger swarms (see
  ``quiet_seconds``) unless ``--full-quiet``. Counted over the whole run: suspicion episodes
  (a member at one incarnation, suspected by anyone) and how many were refuted by the end,
  distinct members declared dead by anyone (all false positives) and the number of such
  declarations, and
  whether every member's view holds all n members at the end. Counted after ``--warm-s``:
  messages sent per member per second (pings, acks, ping-reqs, nacks and relayed pings and
  acks), piggybacked records per message (the sender's own record included), and an
  *estimate* of bytes per member per second, taking a record as ``len(node_id) +
  len(address) + 12`` bytes and a message's header as 40 bytes: the simulator has no wire
  format, and the node's protobuf encoding (with keys and signatures) and real addresses
  differ; push-pulls (whole member lists, swapped now and then) are counted apart, in bytes.

Runs are independent and spread over ``--jobs`` processes. The simulator's cost per simulated
second grows faster than n^2 (each event asks every member for its next deadline, which looks
at every member it knows), which is why the quiet run of a large swarm is shorter.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import time
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass

from gossip.swim import Kind, Outgoing, Status, SwimConfig
from gossip.swim_sim import SwimSimulation

CFG = SwimConfig()
HEADER_BYTES = 40
RECORD_OVERHEAD_BYTES = 12  # incarnation and status, besides the id and the address


@dataclass(frozen=True)
class Detection:
    n: int
    loss: float
    seed: int
    first_suspect_s: float | None
    all_dead_s: float | None  # None: not everyone had it dead within the run's limit
    false_deaths: int  # other live members declared dead by anyone during the run
    cpu_s: float


@dataclass(frozen=True)
class Quiet:
    n: int
    loss: float
    quiet_s: float
    suspicions: int
    refuted: int
    falsely_dead: int  # distinct live members declared dead by anyone
    dead_declarations: int  # (observer, member) pairs
    whole_at_end: bool
    traffic_s: float
    messages: int  # push-pulls apart
    records: int
    est_bytes: int
    push_pull_bytes: int
    cpu_s: float


def steady_start(sim: SwimSimulation) -> None:
    """Start from a swarm that has been running for a while.

    The simulator introduces every member to every other through ``merge``, which queues all n
    records for piggybacking, ``retransmit_limit(n)`` times each: at 128 members, messages are
    full of this start-up news for about 100 seconds, and sorting it makes those seconds the
    slowest to simulate. A swarm that has been up for a while has sent it long ago, so the
    queues are emptied (``Swim.clear_updates``).
    """
    for member in sim.members.values():
        member.clear_updates()


def quiet_seconds(n: int, quiet_s: float, full: bool = False) -> float:
    """``quiet_s`` up to 32 members (or at any size if ``full``), (32/n)^2 of it above (the
    simulator's cost per simulated second grows faster than n^2), but at least a minute."""
    return quiet_s if full else max(60.0, quiet_s * min(1.0, (32 / n) ** 2))


def detect(n: int, loss: float, seed: int, warm_s: float) -> Detection:
    cpu0 = time.process_time()
    sim = SwimSimulation(n, CFG, loss=loss, seed=seed)
    steady_start(sim)
    rng = random.Random(f"victim-{seed}")
    victim = f"m{rng.randrange(n):04d}"
    crash_at = warm_s + rng.uniform(0, CFG.period_s)
    sim.run_until(crash_at)
    sim.crash(f"sim://{victim}")
    for address in sim.live_addresses():
        sim.members[address].drain_changes()
    live = sim.live_addresses()
    first_suspect: list[float] = []
    all_dead: list[float] = []
    falsely_dead: set[str] = set()

    def check() -> None:
        now = sim.clock.now()
        if not first_suspect and any(sim.status(a, victim) is not Status.ALIVE for a in live):
            first_suspect.append(now)
        if not all_dead and all(sim.status(a, victim) is Status.DEAD for a in live):
            all_dead.append(now)
        for a in live:
            for r in sim.members[a].drain_changes():
                if r.status is Status.DEAD and r.node_id != victim:
                    falsely_dead.add(r.node_id)

    check()
    limit = crash_at + 2 * CFG.detection_deadline_s(n)
    while not all_dead and sim.clock.now() < limit:
        sim.run_until(min(sim.clock.now() + CFG.period_s, limit), check)
    return Detection(
        n,
        loss,
        seed,
        first_suspect[0] - crash_at if first_suspect else None,
        all_dead[0] - crash_at if all_dead else None,
        len(falsely_dead),
        time.process_time() - cpu0,
    )


def quiet(n: int, loss: float, seed: int, quiet_s: float, warm_s: float) -> Quiet:
    cpu0 = time.process_time()
    counts = {"messages": 0, "records": 0, "bytes": 0, "push-pull bytes": 0}
    counting = False

    def on_message(out: Outgoing) -> None:
        if not counting:
            return
        updates = out.message.updates
        nbytes = HEADER_BYTES + sum(
            len(r.node_id) + len(r.address) + RECORD_OVERHEAD_BYTES for r in updates
        )
        if out.message.kind in (Kind.PUSH_PULL, Kind.PUSH_PULL_REPLY):
            counts["push-pull bytes"] += nbytes
            return
        counts["messages"] += 1
        counts["records"] += len(updates)
        counts["bytes"] += nbytes

    sim = SwimSimulation(n, CFG, loss=loss, seed=seed, on_message=on_message)
    steady_start(sim)
    suspected: set[tuple[str, int]] = set()
    dead: set[str] = set()
    declarations = 0

    def watch() -> None:
        nonlocal declarations
        for address in sim.live_addresses():
            for r in sim.members[address].drain_changes():
                if r.status is Status.SUSPECT:
                    suspected.add((r.node_id, r.incarnation))
                elif r.status is Status.DEAD:
                    dead.add(r.node_id)
                    declarations += 1

    sim.run_until(warm_s, watch)
    counting = True
    sim.run_until(quiet_s, watch)
    incarnation = {m.node_id: m.incarnation for m in sim.members.values()}
    whole = all(len(m.live_members()) == n for m in sim.members.values())
    return Quiet(
        n,
        loss,
        quiet_s,
        len(suspected),
        sum(incarnation[node] > inc for node, inc in suspected),
        len(dead),
        declarations,
        whole,
        quiet_s - warm_s,
        counts["messages"],
        counts["records"],
        counts["bytes"],
        counts["push-pull bytes"],
        time.process_time() - cpu0,
    )


def _fmt(x: float, digits: int = 1) -> str:
    return "never" if math.isinf(x) else f"{x:.{digits}f}"


def _loss(loss: float) -> str:
    return f"{100 * loss:g}%"


def detection_table(results: list[Detection], sizes: list[int], losses: list[float]) -> None:
    """A crash not dead to everyone within twice the bound ("never") counts as infinitely late."""
    print(
        "| members | loss | crashes | first suspect s (median / max) | "
        "all dead s (median / max) | bound s | max / bound | crashes over bound | "
        "others falsely dead |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        bound = CFG.detection_deadline_s(n)
        for loss in losses:
            rows = [r for r in results if r.n == n and r.loss == loss]
            first = [math.inf if r.first_suspect_s is None else r.first_suspect_s for r in rows]
            dead = [math.inf if r.all_dead_s is None else r.all_dead_s for r in rows]
            print(
                f"| {n} | {_loss(loss)} | {len(rows)} | "
                f"{_fmt(statistics.median(first))} / {_fmt(max(first))} | "
                f"{_fmt(statistics.median(dead))} / {_fmt(max(dead))} | {bound:.1f} | "
                f"{_fmt(max(dead) / bound, 2)} | {sum(d > bound for d in dead)} | "
                f"{sum(r.false_deaths for r in rows)} |"
            )


def quiet_table(results: list[Quiet], sizes: list[int], losses: list[float]) -> None:
    print(
        "| members | loss | quiet s | suspicions (refuted) | members falsely dead "
        "(declarations) | views whole at end | msgs / member / s | records / msg | "
        "~bytes / member / s | push-pull ~bytes / member / s |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        for loss in losses:
            [r] = [r for r in results if r.n == n and r.loss == loss]
            member_s = n * r.traffic_s
            print(
                f"| {n} | {_loss(loss)} | {r.quiet_s:.0f} | {r.suspicions} ({r.refuted}) | "
                f"{r.falsely_dead} ({r.dead_declarations}) | {'yes' if r.whole_at_end else 'no'} "
                f"| {r.messages / member_s:.2f} | {r.records / max(r.messages, 1):.2f} | "
                f"{r.est_bytes / member_s:.0f} | {r.push_pull_bytes / member_s:.0f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--losses", type=float, nargs="+", default=[0.0, 0.05, 0.2])
    parser.add_argument("--seeds", type=int, default=5, help="crashes per size and loss")
    parser.add_argument("--warm-s", type=float, default=10.0, help="run before the crash")
    parser.add_argument(
        "--quiet-s", type=float, default=2000.0, help="quiet run at 32 members or fewer"
    )
    parser.add_argument(
        "--full-quiet", action="store_true", help="quiet runs last --quiet-s at every size"
    )
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--quick", action="store_true", help="2 seeds, 300 s quiet runs")
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.quiet_s = 2, 300.0
    if args.warm_s >= 60:
        parser.error("--warm-s must be under a minute (the shortest quiet run)")
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.jobs) as pool:
        quiet_runs: list[Future[Quiet]] = []
        detections: list[Future[Detection]] = []
        # The largest runs first, so that the last to finish are short.
        for n in sorted(args.sizes, reverse=True):
            for loss in sorted(args.losses, reverse=True):
                q = quiet_seconds(n, args.quiet_s, args.full_quiet)
                quiet_runs.append(pool.submit(quiet, n, loss, 1000, q, args.warm_s))
            for loss in sorted(args.losses, reverse=True):
                for seed in range(args.seeds):
                    detections.append(pool.submit(detect, n, loss, seed, args.warm_s))
        quiet_results = [f.result() for f in quiet_runs]
        detection_results = [f.result() for f in detections]
    wall = time.monotonic() - t0
    cpu = sum(r.cpu_s for r in quiet_results) + sum(r.cpu_s for r in detection_results)
    print(
        f"# SWIM, default SwimConfig (period {CFG.period_s:g} s, ping timeout "
        f"{CFG.ping_timeout_s:g} s, k={CFG.indirect_probes} and a retry, suspicion "
        f"{CFG.suspicion_mult:g}*max(1, log10 n) periods, x{CFG.suspicion_max_mult:g} "
        f"unconfirmed, K={CFG.confirmations}; local health up to x{CFG.max_health + 1}); "
        f"times in simulated seconds ({wall:.0f} s wall, {cpu:.0f} s CPU in {args.jobs} processes)"
    )
    print()
    detection_table(detection_results, args.sizes, args.losses)
    print()
    quiet_table(quiet_results, args.sizes, args.losses)


if __name__ == "__main__":
    main()
