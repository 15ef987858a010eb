"""One malicious node among eight real node processes, with and without robust mixing.

The last node (shard 7) runs with ``--attack scale``: through valid deltas it publishes ten
times its model and never mixes, so its neighbours' replicas of it stay consistent and accept
every message. With ``--robust`` (ClippedGossip and anomaly eviction, gossip/robust.py) every
honest node must reach the accuracy of "A working swarm" (0.93 on digits); with plain mixing the
same run must fall clearly short, so the test can fail either way.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from node.cli.swarm import SwarmConfig, run_swarm
from node.config import GossipConfig

pytestmark = pytest.mark.e2e

NODES, STEPS, TARGET = 8, 600, 0.93
ATTACKER = NODES - 1  # node_argv gives --attack to the last node only


def honest_accuracies(workdir: Path, robust: bool) -> list[float]:
    cfg = SwarmConfig(
        nodes=NODES,
        steps=STEPS,
        eval_every=200,
        workdir=workdir,
        baseline=False,
        progress=False,
        gossip=GossipConfig(codec="int8", robust=robust, attack="scale"),
    )
    assert asyncio.run(run_swarm(cfg)) == 0
    report = json.loads((workdir / "report.json").read_text())
    assert len(report["nodes"]) == NODES
    return [n["accuracy"] for n in report["nodes"] if n["shard"] != ATTACKER]


@pytest.mark.timeout(900)  # two swarms of eight processes, one after the other
def test_robust_mixing_keeps_the_honest_nodes_on_target_and_plain_mixing_does_not(
    tmp_path: Path,
) -> None:
    robust = honest_accuracies(tmp_path / "robust", robust=True)
    plain = honest_accuracies(tmp_path / "plain", robust=False)
    print(f"honest accuracies, robust: {robust}\nhonest accuracies, plain: {plain}")
    assert len(robust) == len(plain) == NODES - 1
    assert min(robust) >= TARGET, robust
    # Plain mixing is dragged towards the attacker's 10x model: every honest node falls short,
    # and by a clear margin on average.
    assert max(plain) < TARGET, plain
    assert sum(robust) / len(robust) - sum(plain) / len(plain) > 0.1, (robust, plain)
