"""Membership in whole nodes, in memory: joining through anyone, leaving, crashing, resuming."""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

import torch

from gossip.swim import Status, SwimConfig
from gossip.topology import build
from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.daemon.node import Node
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, memory_swarm

TIMEOUT_S = 60.0
FAST = SwimConfig(period_s=0.2)
#: Nobody is ever declared dead by suspicion: only a departure can remove a member.
NO_SUSPICION = SwimConfig(period_s=0.2, suspicion_mult=1e6)


def knows_exactly(node: Node, ids: set[str]) -> bool:
    return {m.node_id for m in node.peers.view.members} == ids


def links_follow_the_graph(node: Node, ids: set[str]) -> bool:
    return knows_exactly(node, ids) and set(node.peers.links) == build(
        "exponential", ids
    ).neighbours(node.node_id)


def holds_replica_of(node: Node, sender: Node) -> bool:
    """Whether ``node`` has a replica of ``sender``'s current log (its session, this run)."""
    replica = node.state.replicas.get(sender.node_id)
    return replica is not None and replica.session == sender.state.session


def mixes_all_neighbours(node: Node, nodes: list[Node]) -> bool:
    """Every neighbour is in ``node``'s mix, with the degree it has now (a copy taken back
    from the parked ones is out of the mix until the sender's next delta confirms it)."""
    mix = node.gossiper.mixer.weights()
    degrees = {n.node_id: len(n.peers.links) for n in nodes}
    return mix.keys() == node.peers.links.keys() and all(
        node.state.replicas[p].degree == degrees[p] for p in mix
    )


async def test_nodes_joining_through_random_earlier_ones_all_learn_everyone(
    tmp_path: Path,
) -> None:
    network = MemoryNetwork()
    rng = random.Random(5)
    nodes: list[Node] = []
    try:
        for i in range(7):
            helper = [rng.choice(nodes).address] if nodes else []
            cfg = config(
                tmp_path / f"n{i}",
                listen="mem:0",
                join=tuple(helper),
                membership=FAST,
                **{"trainer.steps": 1},
            )
            node = await Node.create(cfg, transport=MemoryTransport(network))
            nodes.append(node)
            await node.start()
        ids = {n.node_id for n in nodes}
        # A few protocol periods: the bound is loose, the check is that it happens at all.
        for n in nodes:
            await n.wait_until(partial(links_follow_the_graph, n, ids), 50 * FAST.period_s)
        for n in nodes:  # and every neighbour is in the mix, with its degree as it is now
            await n.wait_until(partial(mixes_all_neighbours, n, nodes), TIMEOUT_S)
        weights: dict[tuple[str, str], float] = {}
        for n in nodes:
            status = await n.status()
            weights.update({(n.node_id, s.node_id): s.weight for s in status.neighbours})
        # Both ends of every edge count it, with the same weight.
        for (one, other), w in weights.items():
            assert weights[(other, one)] == w
    finally:
        for n in nodes:
            await n.stop(grace_s=0)


async def test_a_node_that_stops_is_dropped_by_its_neighbours_at_once(tmp_path: Path) -> None:
    async with memory_swarm(
        tmp_path, 4, {"trainer.steps": 100_000, "membership": NO_SUSPICION}
    ) as nodes:
        leaver, *rest = nodes
        ids = {n.node_id for n in rest}
        for n in nodes:
            await n.wait_until(partial(lambda n: n.trainer.step > 20, n), TIMEOUT_S)
        await leaver.stop()
        for n in rest:
            # Suspicion never ends in death here: only the announced departure removes it.
            await n.wait_until(partial(links_follow_the_graph, n, ids), TIMEOUT_S)
            assert n.peers.swim.record(leaver.node_id).status is Status.LEFT  # type: ignore[union-attr]
            assert n.trainer.running


async def test_a_crashed_node_leaves_the_mix_then_the_view_and_training_goes_on(
    tmp_path: Path,
) -> None:
    crashed: set[str] = set()
    network = MemoryNetwork(drop=lambda caller, callee, _: bool({caller, callee} & crashed))
    settings = {"trainer.steps": 100_000, "gossip.silence_limit_s": 0.5, "membership": FAST}
    async with memory_swarm(tmp_path, 4, settings, network) as nodes:
        a, *_others, dead = nodes
        await a.wait_until(lambda: a.trainer.step > 50, TIMEOUT_S)
        crashed.add(dead.address)  # it can neither send nor receive: a crash, seen from outside
        dead.trainer.request_stop()
        steps_then = a.trainer.step
        ids = {n.node_id for n in nodes if n is not dead}
        for n in nodes[:-1]:
            await n.wait_until(partial(links_follow_the_graph, n, ids), TIMEOUT_S)
            assert n.peers.swim.record(dead.node_id).status is Status.DEAD  # type: ignore[union-attr]
        status = await a.status()
        assert all(s.in_mix for s in status.neighbours)
        assert a.trainer.step > steps_then


async def test_a_joiner_starts_from_the_swarms_model(tmp_path: Path) -> None:
    network = MemoryNetwork()
    settings = {"trainer.steps": 100, "gossip.idle_round_interval_s": None}
    async with memory_swarm(tmp_path, 3, settings, network) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        cfg = config(
            tmp_path / "joiner",
            listen="mem:0",
            join=(nodes[1].address,),
            shard_index=3,
            shard_count=4,
            wait_members=4,
            **{"trainer.steps": 1_000_000},
        )
        joiner = await Node.create(cfg, transport=MemoryTransport(network))
        initial = joiner.flat.flat.clone()
        try:
            await joiner.start()
            # Before its first step, the joiner holds one member's model, to the bit.
            pulled = joiner.flat.flat.clone() if joiner.trainer.step == 0 else None
            assert pulled is not None
            # (The members have finished training and make no more rounds: their models hold.)
            assert any(torch.equal(pulled, n.flat.flat) for n in nodes)
            assert not torch.equal(pulled, initial)
            assert torch.equal(joiner.state.public, pulled)
        finally:
            await joiner.stop(grace_s=0)


async def test_a_restarted_node_resumes_from_its_checkpoint_and_rejoins(tmp_path: Path) -> None:
    network = MemoryNetwork()
    settings = {"trainer.steps": 100_000, "membership": FAST}
    async with memory_swarm(tmp_path, 3, settings, network) as nodes:
        node = nodes[2]
        await node.wait_until(lambda: node.trainer.step > 100, TIMEOUT_S)
        await node.stop()
        saved = load_checkpoint(tmp_path / "node-2" / CHECKPOINT_FILE)
        step = int(saved.meta["step"])
        assert step >= 100
        assert {m["node_id"] for m in saved.meta["members"]} == {n.node_id for n in nodes[:2]}

        # The same state dir and no --join: it finds the swarm through the members it remembers.
        again = await Node.create(
            config(tmp_path / "node-2", listen="mem:0", shard_index=2, shard_count=3, **settings),
            transport=MemoryTransport(network),
        )
        assert again.node_id == node.node_id
        assert again.trainer.step == step
        for name, value in again.task.model.state_dict().items():
            assert torch.equal(value, saved.model[name])
        assert saved.optimizer is not None
        optimizer = again.trainer.optimizer.state_dict()
        assert optimizer["param_groups"] == saved.optimizer["param_groups"]
        try:
            await again.start()
            ids = {n.node_id for n in nodes}
            for n in [*nodes[:2], again]:
                await n.wait_until(partial(links_follow_the_graph, n, ids), TIMEOUT_S)
            await again.wait_until(lambda: again.trainer.step > step + 50, TIMEOUT_S)
            # Its neighbours resynced their replicas of it (a new session) and it theirs.
            for n in nodes[:2]:
                await n.wait_until(partial(holds_replica_of, n, again), TIMEOUT_S)
        finally:
            await again.stop(grace_s=0)
