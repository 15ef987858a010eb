"""The membership driver (node/daemon/membership.py) on virtual time over the in-memory transport.

Several members, each a real :class:`Membership` over its own SWIM state, served as the daemon's
service serves SWIM calls. One member goes silent (everything to and from it is lost, as when
its host drops off the network); the others must suspect it and declare it dead within the
bound that follows from their SWIM config, and must never declare a live member dead.
"""

from __future__ import annotations

import math

from gossip.swim import MemberRecord, Status, Swim, SwimConfig, SwimMessage
from node.daemon.membership import Membership
from node.runtime import Runtime
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.drivers import Refusing, cases, faults
from tests.vtime import run_until, runtime, virtual, virtual_now

N = 6
CFG = SwimConfig()


def death_bound_s(cfg: SwimConfig, n: int) -> float:
    """The latest a silent member is dead to every live member, from the config alone.

    SWIM's expected detection time (``detection_deadline_s``: probes find it, the suspicion
    spreads, the minimum suspicion timeout) assumes the suspicion is confirmed by enough other
    members; under loss fewer confirmations may arrive, and Lifeguard lets an unconfirmed
    suspicion last up to ``suspicion_max_mult`` times its minimum (Lifeguard §4.2). The bound
    is therefore the spread of the suspicion plus its longest timeout.
    """
    low = cfg.suspicion_timeout_s(n)
    spread = math.ceil(math.log2(max(n, 2))) + 2
    return (3 + spread) * cfg.period_s + low * cfg.suspicion_max_mult


class Member(Refusing):
    def __init__(self, index: int, network: MemoryNetwork, rt: Runtime) -> None:
        self.node_id = f"{index:02d}" * 16
        self.transport = MemoryTransport(network)
        self.swim = Swim(self.node_id, "", 1, CFG, rt.clock, rt.fork_rng())
        self.membership = Membership(self.swim, self.transport, rt, self._changed)
        #: (virtual time, record) of every change this member's protocol reported.
        self.changes: list[tuple[float, MemberRecord]] = []

    async def serve(self) -> None:
        self.swim.address = await self.transport.serve(self, "mem:0")

    async def _changed(self, records: list[MemberRecord]) -> None:
        self.changes += [(virtual_now(), r) for r in records]

    async def rpc_swim(self, protocol_version: int, message: SwimMessage) -> str:
        self.membership.receive(message)
        return self.node_id

    def first(self, node_id: str, status: Status) -> float | None:
        return next(
            (t for t, r in self.changes if r.node_id == node_id and r.status is status), None
        )


@virtual
@cases
async def test_a_silent_member_is_dead_to_all_within_the_swim_bound_and_no_live_one_ever_is(
    loss: float, order: str
) -> None:
    net = faults(loss, order, seed=11)
    silent: set[str] = set()

    def drop(caller: str, callee: str, message: object) -> bool:
        return bool({caller, callee} & silent) or net.drop(caller, callee, message)

    network = MemoryNetwork(drop, net.delay)
    rt = runtime(5)
    members = [Member(i, network, rt) for i in range(N)]
    for m in members:
        await m.serve()
    for m in members:  # as after a join: everyone's record, from a hello
        m.membership.merge([o.swim.me for o in members if o is not m])
    for m in members:
        m.membership.start()
    try:
        await run_until(
            lambda: all(len(m.swim.live_members()) == N for m in members), 5.0, "a whole view"
        )
        await run_until(lambda: virtual_now() >= 20.0, 30.0, "a quiet time")
        victim, live = members[-1], members[:-1]
        silent.add(victim.swim.address)
        went_silent = virtual_now()
        bound = death_bound_s(CFG, N)
        took = await run_until(
            lambda: all(m.first(victim.node_id, Status.DEAD) is not None for m in live),
            bound,
            "every live member declaring the silent one dead",
        )
        suspected = [m.first(victim.node_id, Status.SUSPECT) for m in live]
        dead = [m.first(victim.node_id, Status.DEAD) for m in live]
        # Each saw the suspicion before the death (it was suspected, not struck off at once).
        assert all(
            s is not None and d is not None and s < d for s, d in zip(suspected, dead, strict=True)
        )
        # Still no one more: a minute more of protocol under the same loss and order.
        await run_until(lambda: virtual_now() > went_silent + took + 60.0, 70.0, "a minute")
        for m in live:
            deaths = {r.node_id for _, r in m.changes if r.status is Status.DEAD}
            assert deaths == {victim.node_id}, (m.node_id[:2], deaths)
            assert {r.node_id for r in m.swim.live_members()} == {o.node_id for o in live}
        print(
            f"loss {loss} {order}: dead to all {took:.2f} virtual s after going silent "
            f"(bound {bound:.1f} s, expected {CFG.detection_deadline_s(N):.1f} s); "
            f"{net.lost} messages lost"
        )
    finally:
        for m in members:
            await m.membership.stop()
