"""Accusations against a live node over real gRPC, with real keys (issue 21): a death heard
from another member is only a suspicion, which the accused refutes; forged ones change nothing."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
import pytest

from gossip.messages import PROTOCOL_VERSION, Hello
from gossip.swim import Kind, MemberRecord, Status, SwimMessage
from node.daemon.node import Node
from node.security.identity import Identity
from node.security.signing import record_signer
from node.transport import wire
from protos import murmur_pb2_grpc as pb_grpc
from tests.node.helpers import SwimResponder, config, fixed_identity, poll


@dataclass
class Swarm:
    node: Node
    stub: pb_grpc.MurmurStub
    peer: SwimResponder
    accuser: SwimResponder

    def held(self, node_id: str) -> MemberRecord:
        record = self.node.peers.swim.record(node_id)
        assert record is not None
        return record

    async def send(self, sender: SwimResponder, *updates: MemberRecord) -> None:
        assert sender.swim is not None
        message = SwimMessage(Kind.PING, sender.node_id, sender.swim.address, 1, updates=updates)
        await self.stub.Swim(wire.swim_to_pb(message, PROTOCOL_VERSION))


@pytest.fixture
async def swarm(tmp_path: Path) -> AsyncIterator[Swarm]:
    # Waits for a member that never comes: it serves and probes, but does not train.
    node = await Node.create(config(tmp_path, wait_members=4, wait_timeout_s=None))
    await node.start()
    channel = grpc.aio.insecure_channel(node.address)
    stub = pb_grpc.MurmurStub(channel)  # type: ignore[no-untyped-call]
    members = [SwimResponder(fixed_identity(21)), SwimResponder(fixed_identity(22))]
    for m in members:
        await m.start()
        assert m.swim is not None
        await stub.Hello(wire.hello_to_pb(Hello(PROTOCOL_VERSION, m.swim.me, node.fingerprint, ())))
    yield Swarm(node, stub, *members)
    await channel.close()
    await node.stop(grace_s=0)
    for m in members:
        await m.stop()


def accusation(record: MemberRecord, accuser: str, key: Identity) -> MemberRecord:
    """``record``'s member said dead by ``accuser``, signed with ``key``."""
    dead = dataclasses.replace(record, status=Status.DEAD, accuser=accuser)
    return dataclasses.replace(dead, accuser_signature=record_signer(key)(dead.accusation()))


async def test_a_forged_death_changes_nothing_and_a_real_one_is_a_refuted_suspicion(
    swarm: Swarm,
) -> None:
    real = swarm.held(swarm.peer.node_id)
    swim = swarm.node.peers.swim
    forged_before = swim.forged
    # The peer's own alive signature (every Status hands it out) turned into a death, and a
    # death in the accuser's name signed with another key.
    bare = dataclasses.replace(real, status=Status.DEAD)
    impostor = accusation(real, swarm.accuser.node_id, fixed_identity(23))
    await swarm.send(swarm.accuser, bare, impostor)
    assert swim.forged == forged_before + 2
    assert swarm.held(swarm.peer.node_id) == real
    # Signed by the accuser itself: a suspicion here, not a death; the peer stays in the view.
    await swarm.send(swarm.accuser, accusation(real, swarm.accuser.node_id, swarm.accuser.identity))
    assert swarm.held(swarm.peer.node_id).status is Status.SUSPECT
    assert swarm.peer.node_id in swarm.node.peers.view
    # The node probes the suspect and tells it; it refutes, and is alive again.

    async def refuted() -> MemberRecord | None:
        held = swarm.held(swarm.peer.node_id)
        return held if held.status is Status.ALIVE else None

    back = await poll(refuted, "the peer to refute", 15.0)
    assert back.incarnation > real.incarnation
