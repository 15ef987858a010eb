"""What avoiding edges between two nodes nobody can dial costs (gossip/topology.py's
reachable_graph): per topology, swarm size and share of nodes behind NAT, against the same swarm
with everyone reachable, in one invocation:

* messages per round (edges, each carrying one delta each way), the mean and the largest degree
  of a reachable node (what the public nodes carry for the others), and
* rounds of exact gossip (x <- W x with Metropolis-Hastings weights) until the distance to the
  mean falls to 1e-6 of where it started, from the same random start.

    python -m bench.nat_topology [--sizes 6 16 64 256] [--shares 0 0.5 0.67 0.9]

Which members are behind NAT is drawn with a fixed seed; a row's "vs all" is its figure over the
all-reachable figure of the same size and topology.
"""

from __future__ import annotations

import argparse
import random

import torch

from gossip.topology import build, mixing_matrix, reachable_graph

TOLERANCE = 1e-6
MAX_ROUNDS = 100_000


def rounds_to_average(w: torch.Tensor, seed: int = 0) -> int:
    x = torch.randn(w.shape[0], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    start = float((x - x.mean()).norm())
    for r in range(1, MAX_ROUNDS + 1):
        x = w @ x
        if float((x - x.mean()).norm()) <= TOLERANCE * start:
            return r
    return MAX_ROUNDS


def row(kind: str, n: int, share: float) -> dict[str, float]:
    ids = [f"{k:04d}" for k in range(n)]
    nated = frozenset(random.Random(n).sample(ids, round(share * n)))
    graph = reachable_graph(build(kind, ids, degree=4), nated)
    assert graph.is_connected()
    edges = sum(len(a) for a in graph.adj.values()) // 2
    public = [graph.degree(i) for i in ids if i not in nated]
    return {
        "edges": edges,
        "public_mean_degree": sum(public) / len(public),
        "public_max_degree": max(public),
        "rounds": rounds_to_average(mixing_matrix(graph)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[6, 16, 64, 256])
    parser.add_argument("--shares", type=float, nargs="+", default=[0.0, 0.5, 0.67, 0.9])
    parser.add_argument("--topologies", nargs="+", default=["exponential", "random-regular"])
    args = parser.parse_args()
    print(
        "| topology | nodes | behind NAT | edges | vs all | public degree mean / max "
        "| rounds to 1e-6 | vs all |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for kind in args.topologies:
        for n in args.sizes:
            base = row(kind, n, 0.0)
            for share in args.shares:
                r = row(kind, n, share) if share else base
                print(
                    f"| {kind} | {n} | {share:.0%} | {r['edges']:.0f} | "
                    f"{r['edges'] / base['edges']:.2f} | {r['public_mean_degree']:.1f} / "
                    f"{r['public_max_degree']:.0f} | {r['rounds']:.0f} | "
                    f"{r['rounds'] / base['rounds']:.2f} |"
                )


if __name__ == "__main__":
    main()
