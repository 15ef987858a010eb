"""Regions against a flat graph when the links between regions are 10× slower (issue 19).

    python -m bench.sim_regions [--nodes 64,256] [--regions 4] [--slower 10] [--dim 4096]
        [--factor 1e6] [--max-rounds 3000]

No training: each node starts from its own Gaussian vector plus one, members are split into
``--regions`` regions of consecutive ids, and every link inside a region carries one int8 delta
of the vector per time unit while a link between regions carries one per ``--slower`` units.
The table gives the time until the consensus distance fell ``--factor``-fold, the rounds, and the
bytes a node sent in all and across regions by then:

* ``flat, lock-step``: CHOCO int8 on the exponential graph over all members, every link every
  round; a round lasts until its slowest link has carried it (``--slower`` units), which is how
  a murmur node paces its rounds today (one public copy, one delta for all links).
* ``flat, per-link pace``: the same graph with a copy per link (gossip/pairwise.py): each link
  sends as often as its rate allows (a cross link every ``--slower`` rounds, with the change of
  all of them), and a round lasts one unit.
* ``regions, int8 across``: gossip/topology.py ``regional`` (the exponential graph inside each
  region, 2 bridges between each two regions), per-link pace.
* ``regions, sign across``: the same, with 1-bit sign on the bridges (sign's default γ there),
  which a slow link carries ``--slower`` × (its size / int8's) rounds apart.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from gossip.codecs import Codec, get_codec
from gossip.pairwise import Edge, PairwiseSwarm
from gossip.simulate import rounds_to_consensus
from gossip.topology import Graph, crosses, exponential, regional

HEADER = (
    "| n | graph | time units | rounds | KiB/node | KiB/node across | cross edges | wall s |\n"
    "|---:|---|---:|---:|---:|---:|---:|---:|"
)


def initial(ids: list[str], dim: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(len(ids))
    return {i: torch.randn(dim, generator=g) + 1.0 for i in ids}


def run(
    graph: Graph,
    init: dict[str, torch.Tensor],
    region_of: dict[str, str],
    across: str,
    period_across: int,
    unit_per_round: int,
    args: argparse.Namespace,
) -> tuple[str, ...]:
    int8 = get_codec("int8")
    slow = get_codec(across)

    def codec_of(e: Edge) -> Codec:
        return slow if crosses(region_of, *e) else int8

    def period_of(e: Edge) -> int:
        return period_across if crosses(region_of, *e) else 1

    gamma_across = 0.1 if across == "sign" else 0.8

    def gamma_of(e: Edge) -> float:
        return gamma_across if crosses(region_of, *e) else 0.8

    started = time.perf_counter()
    swarm = PairwiseSwarm(graph, init, codec_of, 0.8, period_of, gamma_of=gamma_of)
    reached = rounds_to_consensus(swarm, args.factor, args.max_rounds)
    n = len(init)
    cross = [e for e in swarm.edges if crosses(region_of, *e)]
    across_bytes = sum(swarm.bytes_by_edge[e] for e in cross) / n
    wall = time.perf_counter() - started
    if reached is None:
        return ("-", "-", "-", "-", str(len(cross)), f"{wall:.0f}")
    return (
        str(reached * unit_per_round),
        str(reached),
        f"{swarm.bytes_sent / n / 1024:.0f}",
        f"{across_bytes / 1024:.0f}",
        str(len(cross)),
        f"{wall:.0f}",
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="64,256")
    p.add_argument("--regions", type=int, default=4)
    p.add_argument("--slower", type=int, default=10)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--factor", type=float, default=1e6)
    p.add_argument("--max-rounds", type=int, default=3000)
    args = p.parse_args()
    sign_share = get_codec("sign").encoded_nbytes(args.dim) / get_codec("int8").encoded_nbytes(
        args.dim
    )
    sign_period = max(1, math.ceil(args.slower * sign_share))
    print(
        f"dim {args.dim}, {args.regions} regions, links across {args.slower}x slower "
        f"(sign across every {sign_period} rounds), consensus distance down "
        f"{args.factor:g}-fold\n"
    )
    print(HEADER)
    for n in [int(v) for v in args.nodes.split(",")]:
        ids = [f"node-{k:04d}" for k in range(n)]
        size = math.ceil(n / args.regions)
        region_of = {i: f"region-{k // size}" for k, i in enumerate(ids)}
        init = initial(ids, args.dim)
        flat, regions = exponential(ids), regional(region_of)
        variants: list[tuple[str, Graph, str, int, int]] = [  # across, its period, units/round
            ("flat, lock-step", flat, "int8", 1, args.slower),
            ("flat, per-link pace", flat, "int8", args.slower, 1),
            ("regions, int8 across", regions, "int8", args.slower, 1),
            ("regions, sign across", regions, "sign", sign_period, 1),
        ]
        for name, graph, across, period, units in variants:
            cells = run(graph, init, region_of, across, period, units, args)
            print(f"| {n} | {name} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
