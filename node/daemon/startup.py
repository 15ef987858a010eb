"""When a node that joined starts training: once enough members are known and every edge is up
both ways, so that no node trains its first steps alone; after ``wait_timeout_s``, anyway."""

from __future__ import annotations

import asyncio
import logging
import math

from gossip.clock import Clock
from node.config import NodeConfig
from node.daemon.gossiper import Gossiper
from node.daemon.peers import Peers
from node.daemon.signals import Signals
from node.telemetry.console import with_countdown
from node.telemetry.progress import TickerConfig, fmt_duration

__all__ = ["wait_to_train"]

log = logging.getLogger(__name__)

#: The wait for members says what it waits for at once, then ever less often.
_WAIT_TICKS = TickerConfig(first_s=0.0, every_s=5.0, growth=2.0, max_s=30.0)


async def wait_to_train(
    cfg: NodeConfig,
    node_id: str,
    peers: Peers,
    gossiper: Gossiper,
    signals: Signals,
    clock: Clock,
) -> None:
    """Return once ``wait_members`` members are known and every edge is up both ways (each
    neighbour took our public copy and sent us its own), or after ``wait_timeout_s``.

    A neighbour that took our copy but never sends its own (a wedged or hostile member)
    holds the start only for a grace period once every edge of ours is up:
    ``snapshot_grace_s``, or as long as our own edges took if that is longer (its copy is
    as big as ours, so on a slow link it may well take as long to arrive).

    Args:
        peers: the member view and the links (``peers.neighbourhood``).
        gossiper: which neighbours' copies the worker published that it holds.
        signals: re-checks at every change, and is told when the grace runs out.
        clock: the time of the deadline and the grace.
    """
    want = cfg.wait_members
    hood = peers.neighbourhood
    started = clock.now()
    deadline = math.inf if cfg.wait_timeout_s is None else started + cfg.wait_timeout_s
    grace_end: float | None = None
    gave_up: list[str] = []  # what was still missing when the grace ran out

    def missing() -> list[str]:
        """What training still waits for: members, then both directions of every edge
        (they took our public copy, and we hold theirs). Read from what the worker
        published of the replicas: the event loop never reads the gossip state."""
        links = hood.links
        members = len(peers.view)
        waiting = []
        if members < want:
            waiting.append(f"members ({members} of {want} known)")
        replicated = gossiper.replicated
        down = hood.down(replicated)
        if down:
            edges = ", ".join(
                f"{p[:8]}: ours {links[p].progress()}, "
                f"theirs {'received' if p in replicated else 'not received'}"
                for p in sorted(down)
            )
            waiting.append(f"links ({len(links) - len(down)} of {len(links)} up; {edges})")
        return waiting

    def ready() -> bool:
        """Nothing is missing, or only neighbours' copies are and their grace is over."""
        nonlocal grace_end, gave_up
        if not missing():
            return True
        now = clock.now()
        if grace_end is None and len(peers.view) >= want and hood.links_up() == len(hood.links):
            grace = max(cfg.snapshot_grace_s, now - started)
            grace_end = now + grace
            asyncio.get_running_loop().call_later(grace, signals.changed)
        if grace_end is None or now < grace_end:
            return False
        # Said as decided here: the worker publishes the replicas from its own thread, so
        # a later look may see another moment.
        gave_up = missing()
        return True

    def describe() -> str | None:
        waiting = missing()
        if not waiting:
            return None
        until = deadline if grace_end is None else min(deadline, grace_end)
        if until == math.inf:
            return f"node {node_id[:8]} waiting for {' and '.join(waiting)} (no time limit)"
        left = fmt_duration(max(0.0, until - clock.now()))
        return (
            f"node {node_id[:8]} waiting for {' and '.join(waiting)}; "
            f"training starts anyway in {left}"
        )

    try:
        waited = signals.wait_until(ready, cfg.wait_timeout_s)
        await with_countdown(waited, describe, _WAIT_TICKS)
    except TimeoutError:
        log.warning(
            "node %s starts training with %d of %d members, %d of %d links up (still "
            "waiting for %s)",
            node_id[:8],
            len(peers.view),
            want,
            hood.links_up(),
            len(hood.links),
            " and ".join(missing()) or "nothing",
        )
    else:
        if gave_up:
            log.warning(
                "node %s starts training after %.1f s without waiting longer for its "
                "neighbours' copies (still waiting for %s); an edge counts once its copy "
                "arrives",
                node_id[:8],
                clock.now() - started,
                " and ".join(gave_up),
            )
        else:
            log.info(
                "node %s starts training: %d members, %d links up both ways, after %.1f s",
                node_id[:8],
                len(peers.view),
                len(hood.links),
                clock.now() - started,
            )
