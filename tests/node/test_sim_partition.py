"""The simulator splits its network and the swarm heals (issue 13): one view, one model again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node.cli.main import main
from node.config import GossipConfig
from node.sim import SimConfig, Simulation
from node.sim.config import NetConfig, PartitionConfig
from node.sim.run import JSONL_FILE

SPLIT = SimConfig(
    nodes=8,
    duration_s=36.0,
    eval_every_s=1.0,
    step_time_s=0.2,
    gossip=GossipConfig(topology="random-regular", degree=3, codec="int8"),
    net=NetConfig(partition=PartitionConfig(at_s=4.0, for_s=16.0)),
)


def test_a_split_swarm_has_two_views_then_one_and_reconverges() -> None:
    sim = Simulation(SPLIT)
    summary = sim.run()
    assert sim.groups == {n.address: i // 4 for i, n in enumerate(sim.nodes.values())}
    by_t = {s.t: s for s in sim.samples}
    before, split = by_t[4.0], by_t[20.0]
    # Each half declared the other dead: every view holds its own half only.
    assert split.partial_views == 8
    assert split.consensus_distance > 3 * before.consensus_distance  # the halves drift apart
    assert summary.healed_s is not None
    assert summary.healed_s <= 30.0
    after = [s for s in sim.samples if s.t >= 20.0 + summary.healed_s]
    assert all(s.partial_views == 0 for s in after)
    assert after[-1].consensus_distance < split.consensus_distance / 10
    assert after[-1].worst_accuracy >= before.worst_accuracy - 0.02


@pytest.mark.parametrize(
    ("text", "expected"),
    [("30:30", PartitionConfig(30.0, 30.0, 2)), ("0:5.5:3", PartitionConfig(0.0, 5.5, 3))],
)
def test_a_partition_is_read_from_at_for_and_groups(text: str, expected: PartitionConfig) -> None:
    assert PartitionConfig.parse(text) == expected


@pytest.mark.parametrize("text", ["30", "a:b", "30:0", "30:30:1", "1:2:3:4", "-1:5"])
def test_a_bad_partition_is_refused_with_what_was_expected(text: str) -> None:
    with pytest.raises(ValueError, match=r"AT:FOR\[:GROUPS\]"):
        PartitionConfig.parse(text)


def test_murmur_simulate_takes_a_partition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = "simulate --nodes 6 --duration 24 --step-time 0.2 --eval-every 2 --partition 4:12"
    assert main([*argv.split(), "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "partition into 2 groups at 4 s for 12 s: one view again" in out
    records = [json.loads(line) for line in (tmp_path / JSONL_FILE).read_text().splitlines()]
    assert records[0]["net"]["partition"] == {"at_s": 4.0, "for_s": 12.0, "groups": 2}
    assert max(r["partial_views"] for r in records if r["record"] == "sample") == 6
    assert records[-1]["healed_s"] is not None
    assert main(["simulate", "--partition", "4", "--out", str(tmp_path)]) == 2
    assert "expected AT:FOR[:GROUPS]" in capsys.readouterr().err
