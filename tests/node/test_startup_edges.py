"""Start-up edges after a neighbour's view flickers (issue 13's stall before training).

A node gates its training on both directions of every edge (node/daemon/neighbourhood.py ``ready``):
it must hold each neighbour's public copy. A neighbour's copy is forgotten whenever the view
stops counting it as a neighbour (gossip/replicas.py ``set_peers``) and must then come again as
a snapshot. During a join storm a receiver's view can drop a sender and take it back (with the
exponential graph, six members leave the node opposite out, five and seven do not) while the
sender's own view never drops the receiver: the sender's link stays streaming, and before
training it streams nothing, so nothing tells it to send the snapshot again. The receiver then
waited for that sender to train; when every node waits on another this way, none ever does. The
receiver now parks a dropped neighbour's copy and takes it back with the neighbour
(gossip/replicas.py ``set_peers``).

Here five in-memory nodes (waiting for seven members, so none trains) have every edge up both
ways; receiver B alone learns a member X placed so that six members put sender A opposite B,
then learns that X left: B forgets A's copy and counts A as a neighbour again, A's view never
changes (B is cut off from the network meanwhile, so nobody else hears of X alive).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gossip.swim_messages import Status
from gossip.topology import exponential
from node.daemon.node import Node
from node.security.signing import record_signer
from node.transport.memory import MemoryNetwork
from tests.node.helpers import fixed_identity, memory_swarm, poll, signed_record

N = 5
WAIT_MEMBERS = N + 2  # nobody trains: the start-up phase, held open


def edges_up(node: Node) -> bool:
    hood = node.peers.neighbourhood
    return len(hood.links) == N - 1 and not hood.down(node.gossiper.replicated)


async def test_a_neighbour_that_forgot_our_copy_gets_it_again_before_anyone_trains(
    tmp_path: Path,
) -> None:
    cut: set[str] = set()
    network = MemoryNetwork(drop=lambda caller, callee, _: caller in cut or callee in cut)
    async with memory_swarm(tmp_path, N, {"wait_members": WAIT_MEMBERS}, network) as nodes:

        async def all_edges_up() -> bool:
            return all(edges_up(n) for n in nodes)

        await poll(all_edges_up, "every edge up both ways", 20)
        by_id = {n.node_id: n for n in nodes}
        ring = sorted(by_id)
        b, a = by_id[ring[0]], by_id[ring[2]]
        # X between B and A on the short side: six members put A opposite B (no edge).
        x = next(
            ident
            for s in range(1, 10_000)
            if ring[0] < (ident := fixed_identity(s)).node_id < ring[2]
        )
        assert a.node_id not in exponential([*ring, x.node_id]).neighbours(b.node_id)
        alive = signed_record(x, "mem:x", incarnation=1)
        left = dataclasses.replace(alive, incarnation=2, status=Status.LEFT)
        left = dataclasses.replace(left, signature=record_signer(x)(left.claim()))

        cut.add(b.address)  # B's view flickers on its own
        b.peers.membership.merge([alive])
        await b.peers.membership.settle()
        assert a.node_id not in b.peers.neighbourhood.neighbours
        assert a.node_id not in b.gossiper.replicated  # A's copy is forgotten
        b.peers.membership.merge([left])
        await b.peers.membership.settle()
        assert a.node_id in b.peers.neighbourhood.neighbours
        cut.clear()
        assert b.node_id in a.peers.neighbourhood.neighbours  # A's view never changed

        async def b_holds_a() -> bool:
            return a.node_id in b.gossiper.replicated and edges_up(b)

        try:
            await poll(b_holds_a, "B holding A's public copy again", 5)
        except AssertionError as err:
            link = a.peers.links[b.node_id]
            raise AssertionError(
                f"{err}: A's link to B says {link.progress()!r} (healthy: {link.healthy}); "
                f"B holds {sorted(p[:8] for p in b.gossiper.replicated)}, waits for "
                f"{[p[:8] for p in b.peers.neighbourhood.down(b.gossiper.replicated)]}"
            ) from None
        assert all(n.trainer.step == 0 for n in nodes)  # no round did it: nobody trains
