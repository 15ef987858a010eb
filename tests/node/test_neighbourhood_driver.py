"""The topology owner (node/daemon/neighbourhood.py) on virtual time over the in-memory transport.

Each node is a real :class:`Membership` whose changes drive a real :class:`Neighbourhood`, as
node/daemon/peers.py wires them; links are the one part left out (a link here is its peer and
nothing more: what the owner opens and closes is what is checked). Nodes join through one
member (the records a hello carries) and one leaves; every node's neighbour set must end equal
to the topology function's answer for the swarm's membership.
"""

from __future__ import annotations

from dataclasses import dataclass

from gossip.membership import MemberView
from gossip.messages import Member
from gossip.swim import MemberRecord, Swim, SwimConfig, SwimMessage
from gossip.topology import build
from node.config import GossipConfig
from node.daemon.membership import Membership
from node.daemon.neighbourhood import Neighbourhood
from node.daemon.steps import run_here
from node.runtime import Runtime
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.drivers import Refusing, cases, faults
from tests.vtime import run_until, runtime, virtual, virtual_now

SWIM = SwimConfig()
GOSSIP = GossipConfig(topology="exponential")


@dataclass(frozen=True)
class Edge:
    peer: Member
    healthy: bool = True


class Node(Refusing):
    def __init__(self, index: int, network: MemoryNetwork, rt: Runtime) -> None:
        self.node_id = f"{index:02d}" * 16
        self.transport = MemoryTransport(network)
        self.swim = Swim(self.node_id, "", 1, SWIM, rt.clock, rt.fork_rng())
        self.membership = Membership(self.swim, self.transport, rt, self._changed)
        self.applied: list[frozenset[str]] = []  # what the gossip state was told, in order
        self.closed: list[str] = []
        self.neighbourhood: Neighbourhood[Edge] = Neighbourhood(
            MemberView(self.swim),
            GOSSIP,
            Edge,
            lambda edge: self.closed.append(edge.peer.node_id),
            lambda peer: self.membership.send([self.swim.ping(peer.address)]),
            lambda mine, plan: self.applied.append(mine),
        )

    async def start(self) -> None:
        self.swim.address = await self.transport.serve(self, "mem:0")
        run_here(self.neighbourhood.start_linking())
        self.membership.start()

    async def _changed(self, records: list[MemberRecord]) -> None:
        run_here(self.neighbourhood.update())

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        self.membership.receive(message)
        return self.node_id

    def join_through(self, helper: Node) -> None:
        """What a hello exchanges: the joiner's record for the helper's records."""
        helper.membership.merge([self.swim.me], relayer=self.node_id)
        self.membership.merge([helper.swim.me, *helper.swim.records()])


def expected(nodes: list[Node]) -> dict[str, frozenset[str]]:
    graph = build(GOSSIP.topology, [n.node_id for n in nodes], degree=GOSSIP.degree, seed=0)
    return {n.node_id: frozenset(graph.neighbours(n.node_id)) for n in nodes}


def agree(nodes: list[Node]) -> bool:
    want = expected(nodes)
    return all(
        n.neighbourhood.neighbours == want[n.node_id] == frozenset(n.neighbourhood.links)
        for n in nodes
    )


@virtual
@cases
async def test_after_joins_and_a_leave_every_neighbour_set_is_the_topologys_answer(
    loss: float, order: str
) -> None:
    net = faults(loss, order, seed=17)
    network = MemoryNetwork(net.drop, net.delay)
    rt = runtime(9)
    nodes = [Node(i, network, rt) for i in range(8)]
    founders, joiners = nodes[:3], nodes[3:]
    for n in founders:
        await n.start()
    for n in founders[1:]:
        n.join_through(founders[0])
    try:
        took = [await run_until(lambda: agree(founders), 30.0, "the founders' graph")]
        swarm = list(founders)
        for k, joiner in enumerate(joiners):
            await joiner.start()
            joiner.join_through(swarm[k % len(swarm)])
            swarm.append(joiner)
            took.append(await run_until(lambda: agree(swarm), 30.0, f"the graph after join {k}"))
        leaver = swarm[2]
        await leaver.membership.leave(list(leaver.neighbourhood.links), 8)
        await leaver.membership.stop()
        swarm.remove(leaver)
        took.append(await run_until(lambda: agree(swarm), 30.0, "the graph after the leave"))
        # It stays so: another half a minute of protocol under the same loss and order.
        settled = virtual_now()
        await run_until(lambda: not agree(swarm) or virtual_now() > settled + 30.0, 31.0)
        assert agree(swarm)
        for n in swarm:
            assert n.applied[-1] == n.neighbourhood.neighbours  # the gossip state took them
            assert leaver.node_id not in n.neighbourhood.links
        print(f"loss {loss} {order}: graph agreed after " + ", ".join(f"{t:.2f}" for t in took))
    finally:
        for n in nodes:
            await n.membership.stop()
