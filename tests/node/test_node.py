"""Whole nodes, several to a process: membership, training together, resync, failures, state."""

from __future__ import annotations

import logging
from functools import partial
from pathlib import Path

import pytest
import torch

from gossip.messages import Delta, SnapshotHeader
from gossip.simulate import consensus_distance
from gossip.swim import SwimConfig
from gossip.topology import build
from node.daemon.checkpoint import CHECKPOINT_FILE, load_checkpoint
from node.daemon.node import SUMMARY_FILE, JoinError, Node
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import (
    config,
    memory_swarm,
    refusals_past_joining,
    replica_matches_sender,
)

TIMEOUT_S = 60.0


def links_match_graph(node: Node, ids: set[str]) -> bool:
    """The node knows exactly ``ids`` and links to exactly its neighbours in their graph."""
    known = {m.node_id for m in node.peers.view.members}
    return known == ids and set(node.peers.links) == build("exponential", ids).neighbours(
        node.node_id
    )


async def test_nodes_joining_through_one_learn_everyone_and_agree_on_neighbours(
    tmp_path: Path,
) -> None:
    async with memory_swarm(tmp_path, 5, {"trainer.steps": 1}) as nodes:
        ids = {n.node_id for n in nodes}
        for n in nodes:
            await n.wait_until(partial(links_match_graph, n, ids), TIMEOUT_S)
        for a in nodes:
            for b_id in a.peers.links:
                b = next(n for n in nodes if n.node_id == b_id)
                assert a.node_id in b.peers.links  # edges are symmetric


async def test_a_swarm_trains_to_consensus_with_replicas_bit_identical(tmp_path: Path) -> None:
    # No idle rounds after training, so that the swarm falls quiet and can be inspected: the
    # distance checked is the one training ends with. One codec, int8, so that the bound does
    # not depend on which codec ``auto`` measured best on each link of this machine: links on
    # sign or int4 end training 2-5 times further apart (measured 4e-4 to 1.5e-3 of the
    # models' norm under auto, 1e-4 to 3e-4 on int8).
    settings = {
        "alpha": 0.5,
        "trainer.steps": 300,
        "gossip.idle_round_interval_s": None,
        "gossip.codec": "int8",
    }
    async with memory_swarm(tmp_path, 4, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        for receiver in nodes:
            for sender in nodes:
                if sender.node_id in receiver.peers.links:
                    await receiver.wait_until(
                        partial(replica_matches_sender, receiver, sender), TIMEOUT_S
                    )
        for n in nodes:
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.9
            assert n.counters.rounds > 20
            assert refusals_past_joining(n) == {}
        models = {n.node_id: n.flat.flat.clone() for n in nodes}
        mean_sq_norm = sum(float(m.pow(2).sum()) for m in models.values()) / len(models)
        assert consensus_distance(models) < 1e-3 * mean_sq_norm


async def test_lost_deltas_are_repaired_by_snapshots(tmp_path: Path) -> None:
    lost = []

    def drop_every_fifth_delta_early_on(caller: str, callee: str, message: object) -> bool:
        if isinstance(message, Delta) and message.step < 100 and message.seq % 5 == 0:
            lost.append(message.seq)
            return True
        return False

    network = MemoryNetwork(drop=drop_every_fifth_delta_early_on)
    async with memory_swarm(
        tmp_path, 3, {"trainer.steps": 150, "gossip.idle_round_interval_s": None}, network
    ) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        # Nothing is lost in the last 50 steps: every replica ends on its sender's copy exactly.
        for receiver in nodes:
            for sender in nodes:
                if sender is not receiver:
                    await receiver.wait_until(
                        partial(replica_matches_sender, receiver, sender), TIMEOUT_S
                    )
        assert lost
        assert (
            sum(link.stats.snapshots_sent for n in nodes for link in n.peers.links.values()) > 2 * 3
        )


async def test_a_silent_neighbour_leaves_the_mix_and_training_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="node.daemon.gossiper")
    silent: set[str] = set()
    network = MemoryNetwork(drop=lambda caller, callee, _: caller in silent)
    # Never declared dead (no suspicion timeout), so only its silence takes it out of the mix.
    settings = {
        "trainer.steps": 100_000,
        "gossip.silence_limit_s": 0.5,
        "membership": SwimConfig(suspicion_mult=1e6),
    }
    async with memory_swarm(tmp_path, 3, settings, network) as nodes:
        a, b, dead = nodes
        await a.wait_until(lambda: a.trainer.step > 50, TIMEOUT_S)
        silent.add(dead.address)
        steps_then = a.trainer.step

        async def out_of_mix() -> bool:
            status = await a.status()
            return not next(s for s in status.neighbours if s.node_id == dead.node_id).in_mix

        await a.wait_until(lambda: a.trainer.step > steps_then + 200, TIMEOUT_S)
        assert await out_of_mix()
        still = next(s for s in (await a.status()).neighbours if s.node_id == b.node_id)
        assert still.in_mix
        assert f"{dead.node_id} silent for" in caplog.text

        # It speaks again: back in the mix.
        assert dead.node_id in a.gossiper.silenced
        silent.clear()
        await a.wait_until(lambda: dead.node_id not in a.gossiper.silenced, TIMEOUT_S)
        assert not await out_of_mix()
        assert f"{dead.node_id} speaks again: back in the mix" in caplog.text


async def test_a_member_that_never_sends_its_copy_holds_the_start_only_for_the_grace(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The third node takes its neighbours' copies but every copy of its own is lost, so their
    edges to it never come up both ways. They start after the grace (0.5 s), not the wait
    timeout (an hour), and name it; it keeps waiting, since its own edges never come up."""
    caplog.set_level(logging.WARNING, logger="node.daemon.startup")
    silent_address = "mem:2"  # the in-memory network numbers its nodes in order
    network = MemoryNetwork(
        drop=lambda caller, _, msg: caller == silent_address and isinstance(msg, SnapshotHeader)
    )
    settings = {"trainer.steps": 100_000, "wait_timeout_s": None, "snapshot_grace_s": 0.5}
    async with memory_swarm(tmp_path, 3, settings, network) as nodes:
        a, b, silent = nodes
        assert silent.address == silent_address
        await a.wait_until(lambda: a.trainer.step > 20, TIMEOUT_S)
        await b.wait_until(lambda: b.trainer.step > 20, TIMEOUT_S)
        assert silent.trainer.step == 0
        assert "without waiting longer for its neighbours' copies" in caplog.text
        assert f"{silent.node_id[:8]}: ours snapshot acked, theirs not received" in caplog.text
        status = await a.status()
        mixed = {s.node_id for s in status.neighbours if s.in_mix}
        assert b.node_id in mixed
        assert silent.node_id not in mixed


async def test_a_node_refuses_a_swarm_that_trains_something_else(tmp_path: Path) -> None:
    network = MemoryNetwork()
    async with memory_swarm(tmp_path / "a", 1, {"trainer.steps": 1}, network) as [first]:
        cfg = config(
            tmp_path / "b", listen="mem:0", join=(first.address,), **{"gossip.codec": "int4"}
        )
        other = await Node.create(cfg, transport=MemoryTransport(network))
        with pytest.raises(JoinError, match="codec: we have auto, you have int4"):
            await other.start()
        await other.stop()
        assert len(first.peers.view) == 1
        assert first.counters.rejected == {"fingerprint": 1}


async def test_joining_nobody_fails_in_time(tmp_path: Path) -> None:
    cfg = config(tmp_path, listen="mem:0", join=("mem:404",), wait_timeout_s=0.3)
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    with pytest.raises(JoinError, match="did not answer"):
        await node.start()
    await node.stop()


async def test_stopping_writes_a_checkpoint_and_a_summary(tmp_path: Path) -> None:
    async with memory_swarm(tmp_path, 2, {"trainer.steps": 50}) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        node = nodes[0]
        await node.stop()
        ckpt = load_checkpoint(tmp_path / "node-0" / CHECKPOINT_FILE)
        state, public, meta = ckpt.model, ckpt.public, ckpt.meta
        for name, param in node.task.model.state_dict().items():
            assert torch.equal(state[name], param)
        assert torch.equal(public, node.state.public)
        assert meta["step"] == 50
        assert meta["node_id"] == node.node_id
        assert (tmp_path / "node-0" / SUMMARY_FILE).exists()


async def test_the_same_state_dir_keeps_the_same_identity(tmp_path: Path) -> None:
    first = await Node.create(config(tmp_path, listen="mem:0"), MemoryTransport(MemoryNetwork()))
    again = await Node.create(config(tmp_path, listen="mem:0"), MemoryTransport(MemoryNetwork()))
    assert first.node_id == again.node_id
    assert len(first.node_id) == 32
    assert (tmp_path / "node_key.pem").stat().st_mode & 0o777 == 0o600


async def test_a_swarm_with_local_steps_and_an_outer_nesterov_step_trains(tmp_path: Path) -> None:
    settings = {
        "alpha": 0.5,
        "trainer.steps": 300,
        "gossip.local_steps": 10,
        "gossip.outer_lr": 0.7,
        "gossip.idle_round_interval_s": None,
    }
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, TIMEOUT_S)
        for n in nodes:
            assert n.gossiper.outer is not None
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy >= 0.9
            assert 5 <= n.counters.rounds <= 300 // 10 + 1  # a round at most every 10 steps
