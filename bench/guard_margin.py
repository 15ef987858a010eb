"""How close honest traffic comes to the update guard's bound (gossip/replicas.py UpdateGuard):
the largest distance, in norms of the receiver's model, that an accepted delta or snapshot put
a replica at, over whole runs of every codec.

    python -m bench.guard_margin [--nodes 4] [--steps 600]

Each configuration runs ``--nodes`` real nodes (the daemon's Node, over gRPC on loopback, in
this process) on non-iid digits shards to the end of their step budget, one more joining late
(after the others' first third) through the first, and reads every node's
``GossipState.largest_move`` and its ``implausible`` refusals (there must be none).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from node.config import GossipConfig, NodeConfig
from node.daemon.node import Node
from node.daemon.trainer import TrainerConfig

RUNS: dict[str, dict[str, object]] = {
    "fp32": {"codec": "fp32"},
    "fp16": {"codec": "fp16"},
    "int8": {"codec": "int8"},
    "int4": {"codec": "int4"},
    "sign": {"codec": "sign"},
    "int8, --robust": {"codec": "int8", "robust": True},
    "int8, --local-steps 8": {"codec": "int8", "local_steps": 8},
    "int8, --outer-lr 0.7": {"codec": "int8", "outer_lr": 0.7},
}


def node_config(
    workdir: Path,
    i: int,
    n: int,
    steps: int,
    gossip: dict[str, object],
    join: str | None,
    wait_members: int,
) -> NodeConfig:
    return NodeConfig(
        listen="127.0.0.1:0",
        join=(join,) if join else (),
        state_dir=workdir / f"node-{i}",
        device="cpu",
        shard_index=i,
        shard_count=n,
        alpha=0.5,
        insecure=True,
        wait_members=wait_members,
        wait_timeout_s=60.0,
        trainer=TrainerConfig(steps=steps, eval_every=steps),
        gossip=GossipConfig(**gossip),  # type: ignore[arg-type]
    )


async def run(workdir: Path, nodes: int, steps: int, gossip: dict[str, object]) -> list[Node]:
    started: list[Node] = []
    try:
        for i in range(nodes - 1):
            join = started[0].address if started else None
            cfg = node_config(workdir, i, nodes, steps, gossip, join, nodes - 1)
            node = await Node.create(cfg)
            await node.start()
            started.append(node)
        first = started[0]
        await first.wait_until(lambda: first.trainer.step >= steps // 3, 600)
        late = await Node.create(
            node_config(workdir, nodes - 1, nodes, steps, gossip, first.address, nodes)
        )
        await late.start()
        started.append(late)
        for node in started:
            await node.wait_until(node.training_finished.is_set, 900)
        return started
    finally:
        for node in started:
            await node.stop(grace_s=0)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args()
    print(
        "| run | largest move accepted (norms of x̂_i) | bound | implausible refusals | "
        "accuracy (worst node) |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, gossip in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            nodes = await run(Path(tmp), args.nodes, args.steps, gossip)
        largest = max(n.state.largest_move for n in nodes)
        refused = sum(n.counters.rejected["implausible"] for n in nodes)
        accuracy = min(n.trainer.last_eval.accuracy for n in nodes if n.trainer.last_eval)
        bound = nodes[0].state.guard.max_distance if nodes[0].state.guard else float("inf")
        print(f"| {name} | {largest:.3f} | {bound:g} | {refused} | {accuracy:.3f} |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
