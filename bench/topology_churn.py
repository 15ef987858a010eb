"""The exponential graph against the expander: degree, spectral gap, and the edges a member that
comes or goes moves, over several sets of ids.

    python -m bench.topology_churn [--sizes 8 17 32 64 65 100 256 1024] [--id-sets 5]

Every member derives the graph from its view, so each edge that a change of the members adds
opens a new link, and every new link starts with a snapshot of the model. For each size and each
set of ids (random hex, as node ids are), one member joins and one leaves, and the edges added or
dropped are counted. The gap is that of the Metropolis-Hastings weights
(``gossip.topology.spectral_gap``): the larger, the fewer rounds of gossip to agree.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
from collections.abc import Callable

from gossip.topology import Graph, expander, exponential, mixing_matrix, spectral_gap


def ids(n: int, salt: int) -> list[str]:
    return [hashlib.sha256(f"{salt}-{k}".encode()).hexdigest()[:32] for k in range(n)]


def edges(graph: Graph) -> set[frozenset[str]]:
    return {frozenset((i, j)) for i in graph.nodes for j in graph.neighbours(i)}


def measure(
    make: Callable[[list[str]], Graph], n: int, id_sets: int
) -> tuple[float, list[float], float]:
    """Mean degree, the gap of each id set, the mean edges moved by a join or a departure."""
    degrees, gaps, moved = [], [], []
    for salt in range(id_sets):
        members = ids(n + 1, salt)
        graph = make(members[:n])
        degrees.append(statistics.mean(graph.degree(i) for i in graph.nodes))
        gaps.append(spectral_gap(mixing_matrix(graph)))
        before = edges(graph)
        moved.append(len(before ^ edges(make(members))))
        moved.append(len(before ^ edges(make(members[1:n]))))
    return statistics.mean(degrees), gaps, statistics.mean(moved)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[8, 17, 32, 64, 65, 100, 256, 1024])
    p.add_argument("--id-sets", type=int, default=5)
    args = p.parse_args()
    print(
        "| N | exponential: degree | gap | edges moved | expander: degree | gap (each id set) "
        "| edges moved |\n|---:|---:|---:|---:|---:|---|---:|"
    )
    for n in args.sizes:
        exp_degree, exp_gaps, exp_moved = measure(exponential, n, args.id_sets)
        x_degree, x_gaps, x_moved = measure(expander, n, args.id_sets)
        print(
            f"| {n} | {exp_degree:.1f} | {statistics.mean(exp_gaps):.3f} | {exp_moved:.0f} | "
            f"{x_degree:.1f} | {min(x_gaps):.3f}-{max(x_gaps):.3f} | {x_moved:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
