"""Nodes behind real NAT take part (issue 16): two public nodes and four behind two home routers
(namespaces that masquerade, forward no port and drop every connection started outside; both
homes use the same private subnet), six ``murmur run`` processes over mutual TLS. The home nodes
join through the seed's address with no ``--advertise``: the seed cannot call them back, so they
go by addresses of their own and open dial-out sessions. Every node reaches the target, and the
nodes agree about as closely as the same six do with everyone reachable (a control run on the
host, first); then one public node, a relay of every home node, is killed (SIGKILL), and the home
nodes name the other as their relay within seconds and go on training; at the end a home node is
killed, and the seed finds it dead.

The nodes behind NAT cannot be dialled by the test either: what they did is read from their own
metrics logs (metrics.jsonl in each state dir), and what the others know of them from the public
nodes' Status.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import pytest

from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.daemon.node import METRICS_FILE
from node.telemetry.status import NodeStatus
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.e2e.watch import wait_for
from tests.natnet import NatNet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: NatNet says so otherwise

PREFIX, WAN, HOME = "nat", "10.79.22", "192.168.7"
PUBLIC, HOMES, PER_HOME = 2, 2, 2
N = PUBLIC + HOMES * PER_HOME
TARGET = 0.9
RELAY_MOVE_S = 30.0  # issue 16: "within a few SWIM periods" (1 s each), with margin for load
CFG = SwarmConfig(nodes=N, steps=3000, eval_every=100, alpha=0.5, gossip=GossipConfig(codec="int8"))


def evals(p: NodeProcess) -> list[dict[str, float]]:
    """The node's own evaluation records so far."""
    path = p.state_dir / METRICS_FILE
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a line being written
        if record.get("event") == "eval":
            records.append(record)
    return records


#: The steps over which how closely the nodes agree is compared: the start, then later, before
#: the kill (which comes once every node is past LATER).
EARLY = (0, CFG.steps // 6)
LATER = (CFG.steps // 6, CFG.steps // 2)


def disagreement(procs: list[NodeProcess], window: tuple[int, int]) -> float:
    """The nodes' mean distance to their neighbours' replicas (RMS, as each node's eval
    records it) over their evaluations in ``window`` (steps)."""
    lo, hi = window
    values = [
        r["distance_rms"]
        for p in procs
        for r in evals(p)
        if lo < r["step"] <= hi and r["distance_rms"] >= 0
    ]
    assert values
    return sum(values) / len(values)


async def all_reachable_disagreement(tmp_path: Path) -> tuple[float, float]:
    """The control: the same six nodes on the host, everyone reachable: how closely they
    agree over EARLY and LATER."""
    procs = [NodeProcess(i, tmp_path / f"reachable-{i}") for i in range(N)]
    provision(CFG, tmp_path / "reachable", [p.state_dir for p in procs])
    try:
        await procs[0].start(node_argv(CFG, 0, procs[0].state_dir, None, N), 120)
        await asyncio.gather(
            *(
                p.start(node_argv(CFG, p.index, p.state_dir, procs[0].address, N), 120)
                for p in procs[1:]
            )
        )

        async def done() -> bool:
            return all(any(r["step"] >= LATER[1] for r in evals(p)) for p in procs)

        await poll(done, "the all-reachable control to train past the compared steps", 300)
    finally:
        codes = await asyncio.gather(*(p.stop(60) for p in procs))
    assert codes == [0] * N, codes
    return disagreement(procs, EARLY), disagreement(procs, LATER)


def relays_of(status: NodeStatus, node_id: str) -> tuple[str, ...] | None:
    """The relays ``status``'s node knows ``node_id`` by, if it holds it alive."""
    for m in status.members:
        if m.node_id == node_id and m.status is Status.ALIVE:
            return m.relays
    return None


def test_the_nat_network_lets_homes_out_and_nobody_in() -> None:
    with NatNet(PREFIX, PUBLIC, HOMES, PER_HOME, WAN, HOME) as net:
        assert net.connects(net.home_ns(0, 0), net.public_address(0))
        assert net.connects(net.home_ns(1, 1), net.public_address(1))
        assert net.connects(net.home_ns(0, 0), net.home_address(1))  # its own home
        assert not net.connects(net.public_ns(0), net.home_address(0))
        assert not net.connects(net.public_ns(0), f"{WAN}.100")  # the router forwards nothing
        assert not net.connects(net.home_ns(0, 0), f"{WAN}.101")  # nor does the other home's


@pytest.mark.timeout(600)
async def test_two_public_and_four_nated_nodes_train_and_survive_their_relays_death(
    tmp_path: Path,
) -> None:
    control = await all_reachable_disagreement(tmp_path)
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(N)]
    with NatNet(PREFIX, PUBLIC, HOMES, PER_HOME, WAN, HOME) as net:
        hosts = [(net.public_ns(i), net.public_address(i)) for i in range(PUBLIC)]
        hosts += [
            (net.home_ns(r, k), net.home_address(k)) for r in range(HOMES) for k in range(PER_HOME)
        ]

        def argv(i: int, join: str | None) -> list[str]:
            line = node_argv(CFG, i, procs[i].state_dir, join, N)
            line[line.index("--listen") + 1] = f"{hosts[i][1]}:7070"
            return [*net.exec_argv(hosts[i][0]), *line]

        tls = provision(CFG, tmp_path, [p.state_dir for p in procs])  # mutual TLS
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        public, behind = procs[:PUBLIC], procs[PUBLIC:]
        try:
            await procs[0].start(argv(0, None), 120)
            seed = procs[0].address
            await asyncio.gather(*(p.start(argv(p.index, seed), 120) for p in procs[1:]))
            ids = {p.node_id for p in procs}

            # Every node, behind NAT or not, knows all six alive, and trains.
            def everyone_in(statuses: list[NodeStatus]) -> bool:
                return all(
                    {m.node_id for m in s.members if m.status is Status.ALIVE} == ids
                    and all(relays_of(s, p.node_id) for p in behind)
                    for s in statuses
                )

            statuses = await wait_for(
                transport, public, everyone_in, "the public nodes to know everyone", 240
            )
            for p in behind:
                relays = relays_of(statuses[0], p.node_id)
                assert relays is not None
                assert set(relays) <= {q.address for q in public}

            async def trained_some() -> bool:
                return all(evals(p) and evals(p)[-1]["members"] == N for p in behind)

            await poll(trained_some, "the nodes behind NAT to train with all six", 240)

            async def past_window() -> bool:
                return all(any(r["step"] >= LATER[1] for r in evals(p)) for p in procs)

            await poll(past_window, "every node to train past the compared steps", 240)
            nat = disagreement(procs, EARLY), disagreement(procs, LATER)

            # kill -9 the public node that is not the seed: a relay of the home nodes.
            victim = procs[1]
            assert victim.proc is not None
            steps_before = {p.index: evals(p)[-1]["step"] for p in behind}
            victim.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic()

            def moved(statuses: list[NodeStatus]) -> bool:
                return all(relays_of(statuses[0], p.node_id) == (seed,) for p in behind)

            await wait_for(
                transport, [procs[0]], moved, "the home nodes to name the seed alone", RELAY_MOVE_S
            )
            moved_s = time.monotonic() - killed_at

            async def trained_on() -> bool:
                # A node that had spent its budget before the kill has nothing left to train.
                return all(
                    evals(p)[-1]["step"] > steps_before[p.index]
                    or steps_before[p.index] == CFG.steps
                    for p in behind
                )

            await poll(trained_on, "the home nodes to train on after the kill", 120)
            survivors = [p for p in procs if p is not victim]

            async def all_trained() -> dict[int, dict[str, float]] | None:
                last = {p.index: [r for r in evals(p) if r["step"] == CFG.steps] for p in survivors}
                return {i: r[0] for i, r in last.items() if r} if all(last.values()) else None

            finals = await poll(
                all_trained, "every node's evaluation at the end of its budget", 300
            )

            # Alive all along, the nodes behind NAT are alive in the seed's view; one killed
            # (its sessions end with it) is found dead.
            seen = await transport.call_status(seed, 10)
            assert all(relays_of(seen, p.node_id) for p in behind)
            gone = behind[0]
            assert gone.proc is not None
            gone.proc.send_signal(signal.SIGKILL)
            died_at = time.monotonic()

            def found_dead(statuses: list[NodeStatus]) -> bool:
                return relays_of(statuses[0], gone.node_id) is None

            await wait_for(
                transport, [procs[0]], found_dead, "the seed to find the home node dead", 60
            )
            dead_s = time.monotonic() - died_at
        finally:
            codes = await asyncio.gather(*(p.stop(60) for p in procs))
            await transport.close(0)
    print(
        f"\nrelays moved {moved_s:.1f} s after the kill; final accuracy per node "
        f"{ {i: round(r['accuracy'], 3) for i, r in finals.items()} }; distance to the "
        f"neighbours' replicas, steps {EARLY} then {LATER}: {nat[0]:.3g} then {nat[1]:.3g} "
        f"behind NAT, {control[0]:.3g} then {control[1]:.3g} all reachable"
    )
    # The disagreement falls as it does with everyone reachable (to 0.3-0.4 of where it
    # started, measured), and stays near it: 1.6-3.4x measured (the nodes behind NAT have two
    # neighbours each, the public ones five). The two levels come from two runs that share two
    # cores with everything else, so the bound on them is loose; relays that lost most deltas
    # would keep the disagreement behind NAT from falling, which the bound on its fall catches.
    assert control[1] <= 0.6 * control[0], control
    assert nat[1] <= 0.6 * nat[0], nat
    assert nat[1] <= 5.0 * control[1], (nat, control)
    print(f"a killed home node was found dead {dead_s:.1f} s after")
    killed = (1, PUBLIC)
    assert [codes[i] for i in killed] == [-signal.SIGKILL] * 2, codes
    assert [c for i, c in enumerate(codes) if i not in killed] == [0] * (N - 2), codes
    for i, record in finals.items():
        assert record["step"] == CFG.steps
        assert record["accuracy"] >= TARGET, (i, record)
