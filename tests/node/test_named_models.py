"""A model the receiver holds already goes by its digest (gossip/digest.py): real nodes over the
in-memory transport, as they start together from one seed and as one joins a trained swarm."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from node.daemon.node import Node
from node.transport.base import Transport
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import (
    config,
    memory_swarm,
    refusals_past_joining,
    replica_matches_sender,
)

TIMEOUT_S = 60.0
SETTINGS = {
    "trainer.steps": 60,
    "gossip.codec": "int8",
    "gossip.idle_round_interval_s": None,
}
NAMED = "named by its digest"


def settled(nodes: list[Node]) -> bool:
    """Every node holds every neighbour's public copy as it is now, to the bit."""
    by_id = {n.node_id: n for n in nodes}
    return all(
        n.state.replicas.keys() == n.peers.links.keys()
        and all(replica_matches_sender(n, by_id[p]) for p in n.peers.links)
        for n in nodes
    )


async def test_nodes_that_start_from_one_model_send_it_by_name(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node.daemon.joiner")
    async with memory_swarm(tmp_path, 3, SETTINGS) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        await nodes[0].wait_until(lambda: settled(nodes), TIMEOUT_S)
        # The joiners held the model they pulled: its name came back, not its values.
        assert caplog.text.count(NAMED) == 2
        for n in nodes:
            assert n.peers.links
            for link in n.peers.links.values():
                assert link.stats.named >= 1  # the first snapshot of every link
                assert link.machine.may_name
            assert refusals_past_joining(n) == {}
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.8


async def test_a_joiner_of_a_trained_swarm_pulls_the_values_and_sends_them_when_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node.daemon.joiner")
    network = MemoryNetwork()
    async with memory_swarm(tmp_path, 2, SETTINGS, network=network) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        assert caplog.text.count(NAMED) == 1
        cfg = config(
            tmp_path / "late",
            listen="mem:0",
            shard_index=2,
            shard_count=3,
            join=(nodes[0].address,),
            wait_members=3,
            **SETTINGS,
        )
        transport: Transport = MemoryTransport(network)
        late = await Node.create(cfg, transport=transport)
        await late.start()
        try:
            everyone = [*nodes, late]
            await late.wait_until(late.training_finished.is_set, TIMEOUT_S)
            await late.wait_until(lambda: settled(everyone), TIMEOUT_S)
            assert caplog.text.count(NAMED) == 1  # the trained model came whole
            # The model it pulled is one its neighbours' public copies left behind: its
            # snapshots go whole from the first, and the replicas are exact.
            assert len(late.peers.links) == 2
            for link in late.peers.links.values():
                assert link.machine.may_name  # never refused: it never named one
                assert link.stats.named == 0
                assert link.stats.snapshots_sent >= 1
            for n in everyone:
                assert refusals_past_joining(n) == {}
        finally:
            await late.stop(grace_s=0)
