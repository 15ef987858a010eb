"""A partition heals (issue 13): six real nodes over mutual TLS, each in its own network
namespace on one bridge; once training is under way the network splits 3|3 for 30 s (iptables
drops everything between the halves), then heals.

Within 30 s of the heal every node's view holds all six alive, and within
``RECONVERGE_BOUND_S`` more the models have come back together: the consensus distance under
its value before the split, and every node at or above its accuracy before the split. The
times measured are printed (run with ``-s``) and recorded in bench/RESULTS.md.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gossip.simulate import consensus_distance
from gossip.swim import Status
from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision
from node.config import GossipConfig
from node.tasks import Shard, load_task
from node.tasks.base import evaluate
from node.telemetry.status import NodeStatus
from node.transport.grpc import GrpcTransport, GrpcTransportConfig
from tests.e2e.watch import pull_models, wait_for
from tests.netns import Testnet
from tests.node.helpers import poll

pytestmark = pytest.mark.e2e  # needs root, as the e2e stage runs: Testnet says so otherwise

PREFIX, SUBNET = "swim", "10.79.13"
N = 6
HALVES = [[0, 1, 2], [3, 4, 5]]
SPLIT_S = 30.0
HEAL_BOUND_S = 30.0  # issue 13: one view of all live members within 30 s
RECONVERGE_BOUND_S = 60.0  # after the heal: measured 2-10 s (bench/RESULTS.md), with margin
CFG = SwarmConfig(
    nodes=N,
    steps=10**6,  # trains until the test stops it, so accuracy still climbs after the heal
    alpha=0.5,
    eval_every=10**6,  # the test evaluates the models it pulls instead
    gossip=GossipConfig(),  # the defaults a user gets (--compress auto, the trigger)
)


def gap(models: dict[str, torch.Tensor], halves: list[list[str]]) -> float:
    """Squared distance between the two halves' mean models."""
    a, b = (torch.stack([models[i].to(torch.float64) for i in h]).mean(dim=0) for h in halves)
    return float(((a - b) ** 2).sum())


def host_argv(net: Testnet, i: int, state_dir: Path, join: str | None) -> list[str]:
    argv = node_argv(CFG, i, state_dir, join, N)
    argv[argv.index("--listen") + 1] = f"{net.address(i)}:0"
    return [*net.exec_argv(i), *argv]


def alive(s: NodeStatus) -> set[str]:
    return {m.node_id for m in s.members if m.status is Status.ALIVE}


def dead(s: NodeStatus) -> set[str]:
    return {m.node_id for m in s.members if m.status is Status.DEAD}


class Models:
    """Every node's current parameters, pulled at (nearly) the same moment, and evaluated on
    the task's shared held-out set."""

    def __init__(self, transport: GrpcTransport) -> None:
        self.transport = transport
        torch.manual_seed(CFG.seed)
        self.task = load_task(CFG.task)(Shard())

    async def pull(self, procs: list[NodeProcess]) -> dict[str, torch.Tensor]:
        return await pull_models(self.transport, procs, "partition-test")

    def accuracy(self, flat: torch.Tensor) -> float:
        offset = 0
        with torch.no_grad():
            for param in self.task.model.parameters():
                param.copy_(flat[offset : offset + param.numel()].view_as(param))
                offset += param.numel()
        return evaluate(self.task.model, self.task.eval, self.task.loss, torch.device("cpu"))[1]


def reachable(net: Testnet, i: int, j: int) -> bool:
    """Whether host i gets an answer from host j (a refused connection is one) within 1 s."""
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    socket.create_connection(('{net.address(j)}', 9), timeout=1)\n"
        "except ConnectionRefusedError:\n"
        "    sys.exit(0)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    done = subprocess.run([*net.exec_argv(i), sys.executable, "-c", probe], check=False)
    return done.returncode == 0


@pytest.mark.timeout(60)
def test_a_split_testnet_drops_traffic_between_groups_until_healed() -> None:
    with Testnet(PREFIX, 3, SUBNET) as net:
        assert reachable(net, 0, 1)
        assert reachable(net, 0, 2)
        net.split([[0, 1], [2]])
        assert reachable(net, 0, 1)
        assert not reachable(net, 0, 2)
        assert not reachable(net, 2, 1)
        net.heal()
        assert reachable(net, 0, 2)
        assert reachable(net, 2, 1)
    leftovers = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert f"{PREFIX}-" not in leftovers
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{PREFIX}-n" not in namespaces


@pytest.mark.timeout(420)
async def test_a_three_three_split_heals_into_one_view_and_one_model(tmp_path: Path) -> None:
    procs = [NodeProcess(i, tmp_path / f"node-{i}") for i in range(N)]
    ids: set[str] = set()
    with Testnet(PREFIX, N, SUBNET) as net:
        tls = provision(CFG, tmp_path, [p.state_dir for p in procs])  # mutual TLS
        transport = GrpcTransport(GrpcTransportConfig(tls=tls))
        models = Models(transport)
        try:
            await procs[0].start(host_argv(net, 0, procs[0].state_dir, None), 120)
            await asyncio.gather(
                *(
                    p.start(host_argv(net, p.index, p.state_dir, procs[0].address), 120)
                    for p in procs[1:]
                )
            )
            ids = {p.node_id for p in procs}
            await wait_for(
                transport, procs, lambda ss: all(s.step >= 200 for s in ss), "training", 180
            )
            before = await models.pull(procs)
            distance_before = consensus_distance(before)
            accuracy_before = {i: models.accuracy(m) for i, m in before.items()}

            net.split(HALVES)
            split_at = time.monotonic()
            halves = [{procs[i].node_id for i in half} for half in HALVES]
            # Each half declares the other dead (the split took effect).
            await wait_for(
                transport,
                procs,
                lambda ss: all(
                    dead(s) == ids - next(h for h in halves if s.node_id in h) for s in ss
                ),
                "each half to declare the other dead",
                SPLIT_S,
            )
            await asyncio.sleep(split_at + SPLIT_S - time.monotonic())  # the partition lasts 30 s
            during = await models.pull(procs)  # the halves' models, drifted longest, before heal

            # Times count from the first rule removed: heal() takes one command per rule (36),
            # seconds under load, and pairs whose rules are gone talk before it returns.
            healed_at = time.monotonic()
            net.heal()
            heal_s = time.monotonic() - healed_at
            await wait_for(
                transport,
                procs,
                lambda ss: all(alive(s) == ids for s in ss),
                f"every view to hold all {N} alive within {HEAL_BOUND_S:g} s of the heal",
                HEAL_BOUND_S - heal_s,
            )
            one_view_s = time.monotonic() - healed_at

            async def reconverged() -> tuple[float, dict[str, float]] | None:
                now = await models.pull(procs)
                accuracy = {i: models.accuracy(m) for i, m in now.items()}
                distance = consensus_distance(now)
                better = all(accuracy[i] >= accuracy_before[i] for i in ids)
                return (distance, accuracy) if distance < distance_before and better else None

            distance_after, accuracy_after = await poll(
                reconverged, "the models to reconverge", RECONVERGE_BOUND_S
            )
            reconverged_s = time.monotonic() - healed_at
        finally:
            codes = await asyncio.gather(*(p.stop(60) for p in procs))
            await transport.close(0)
    groups = [[procs[i].node_id for i in half] for half in HALVES]
    print(
        f"\nsplit {SPLIT_S:g} s; healing took {heal_s:.1f} s; one view {one_view_s:.1f} s "
        f"after it began; models back "
        f"{reconverged_s:.1f} s after it; consensus distance {distance_before:.3g} before, "
        f"{consensus_distance(during):.3g} near the end of the split, {distance_after:.3g} "
        f"after; gap between the halves' means {gap(before, groups):.3g} before, "
        f"{gap(during, groups):.3g} near the end; accuracy "
        f"before {sorted(round(a, 3) for a in accuracy_before.values())}, after "
        f"{sorted(round(a, 3) for a in accuracy_after.values())}"
    )
    assert codes == [0] * N, codes  # SIGTERM: each left politely and wrote its state
    # The halves drifted apart: their means are further apart at the end of the split than
    # before it. (Not the consensus distance of all six: mixing inside each half can shrink it
    # while the halves drift, as when the split comes before the nodes had mixed much.)
    assert gap(during, groups) > gap(before, groups), (gap(before, groups), gap(during, groups))
