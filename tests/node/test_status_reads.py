"""Reading a node's status changes nothing it decides.

A status (``murmur status``, a ``/metrics`` scrape, an MQTT publish) reads the gossip state
through ``Gossiper.neighbour_views``. Only a round may decide who is out of the mix: a read
that did it (as one once did, noting silences while computing the weights it shows) would make
every scrape change the node's gossip. Two tests: the gossip worker driven by a script on a
clock the test moves, once with a status read after every event and once without, must decide
exactly the same (rounds, weights, who is silenced, the bytes of every delta); and a node of a
real in-memory swarm scraped in a loop over HTTP while its neighbours fall silent keeps its
decisions until it makes a round.
"""

from __future__ import annotations

import asyncio
import threading
import urllib.request
from pathlib import Path

import torch
from prometheus_client.parser import text_string_to_metric_families

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.messages import Delta
from gossip.replicas import GossipState
from node.daemon.flat import FlatParams
from node.daemon.gossiper import Gossiper
from node.daemon.node import Node
from tests.node.helpers import memory_swarm

DIM = 40
PEERS = ("a", "b", "c")
SILENCE_S = 5.0


class Decisions:
    """What the worker decides, event by event."""

    def __init__(self) -> None:
        self.log: list[object] = []

    def note(self, gossiper: Gossiper, what: str) -> None:
        r = gossiper.last_round
        self.log.append((what, gossiper.silenced, None if r is None else (r.seq, dict(r.weights))))


async def scripted_run(read_status: bool) -> list[object]:
    clock = ManualClock()
    model = torch.nn.Linear(DIM // 4, 4, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.arange(DIM, dtype=torch.float32).view(4, DIM // 4) / DIM)
    flat = FlatParams(model)
    state = GossipState(flat.flat, get_codec("int8", 16), clock, torch.Generator().manual_seed(1))
    gossiper = Gossiper("me", state, flat, threading.Lock(), 0.8, SILENCE_S, clock)
    decisions = Decisions()
    try:
        await gossiper.set_neighbours(PEERS)

        async def event(what: str, work: object = None) -> None:
            if callable(work):
                await gossiper.run(work)
            if read_status:
                for _ in range(3):
                    await gossiper.neighbour_views()
            decisions.note(gossiper, what)

        for k, peer in enumerate(PEERS):
            values = torch.full((DIM,), float(k))
            await event(
                f"snapshot {peer}", lambda p=peer, v=values: state.receive_snapshot(p, 1, 0, v)
            )
        for t in range(12):
            clock.advance(1.0)  # a crosses the silence limit at 6 s, and speaks again at 10 s
            await event(f"t={t + 1}")
            for seq, peer in enumerate(PEERS[1:] if t < 9 else PEERS, start=1):
                v = torch.full((DIM,), 0.5 * t + seq)
                await event(
                    f"hear {peer}", lambda p=peer, v=v, s=t: state.receive_snapshot(p, 1, s, v)
                )
            delta = await asyncio.wrap_future(gossiper.submit_round(t))
            assert isinstance(delta, Delta)
            await event(f"round {t}: {delta.payload.data.hex()}")
        decisions.log.append(flat.flat.clone().tolist())
    finally:
        gossiper.close()
    return decisions.log


async def test_reading_the_status_after_every_event_changes_no_decision() -> None:
    quiet = await scripted_run(read_status=False)
    read = await scripted_run(read_status=True)
    assert read == quiet
    silenced = [entry[1] for entry in quiet[:-1] if isinstance(entry, tuple)]
    # The script makes the worker decide both ways, so there was something to disturb.
    assert frozenset({"a"}) in silenced
    assert silenced[-1] == frozenset()


def scrape(node: Node) -> dict[tuple[str, str], float]:
    """Node staleness and in-mix gauges by (metric, neighbour), over HTTP."""
    assert node.metrics_server is not None
    url = f"http://127.0.0.1:{node.metrics_server.port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if "neighbour" in sample.labels:
                out[(sample.name, sample.labels["neighbour"])] = float(sample.value)
    return out


async def test_scraping_a_node_while_its_neighbours_fall_silent_changes_nothing_it_decided(
    tmp_path: Path,
) -> None:
    # No rounds after training but the one as it ends, so that from then on only a read could
    # change what the node decided.
    settings = {
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "trainer.steps": 60,
        "gossip.idle_round_interval_s": None,
        "gossip.silence_limit_s": 0.3,
    }
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, 60)
        node, gossiper = nodes[0], nodes[0].gossiper
        seen = []
        async with asyncio.timeout(60):
            while True:  # scrape until every neighbour has been silent for 3 silence limits
                metrics = await asyncio.to_thread(scrape, node)
                seen.append((node.counters.rounds, gossiper.last_round, gossiper.silenced))
                stale = [v for (m, _), v in metrics.items() if m == STALENESS]
                if len(stale) == 2 and min(stale) > 3 * 0.3:
                    break
        status = await node.status()
    # The reads saw the neighbours fall out of the mix...
    assert len(seen) > 1
    assert not any(n.in_mix for n in status.neighbours)
    # ...but what the node decided stayed what its last round decided, scrape after scrape.
    for rounds, last, silenced in seen:
        assert last is not None
        assert silenced == last.silenced, (rounds, silenced, last.silenced)
    rounds_seen = [rounds for rounds, _, _ in seen]
    assert rounds_seen[-1] - rounds_seen[0] <= 1  # at most the round as training ended


STALENESS = "murmur_neighbour_staleness_seconds"
