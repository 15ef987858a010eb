"""Exactly regular random graphs on the nodes 0..n-1, for gossip/topology.py's random-regular.

Drawn by the pairing algorithm of Steger and Wormald ("Generating random regular graphs
quickly", 1999): stubs are paired at random, a pair that would make a loop or a repeated edge is
put back and re-paired with the other leftovers, and only a draw that gets stuck starts over.
The plain configuration model (reject the whole pairing on the first bad pair) succeeds with
probability about exp(-(k^2 - 1) / 4), so it all but never draws k >= 7. A dense graph
(k > (n - 1) / 2) is the complement of a sparse one, which is then connected by itself.

Written here rather than taken from a library because every node must derive the very same
graph: Python's ``random.Random`` with an int seed is stable across versions and platforms, and
so is this code; a library's algorithm may change between releases.
"""

from __future__ import annotations

import random

__all__ = ["draw_regular"]

Edges = set[tuple[int, int]]


def draw_regular(n: int, k: int, seed: int) -> Edges | None:
    """A connected k-regular simple graph on 0..n-1 as edges (a, b) with a < b, the same for the
    same n, k and seed; None after :data:`_DRAWS` draws that got stuck or were disconnected
    (rare for k >= 3). The caller checks that such a graph exists."""
    rng = random.Random(seed)
    for _ in range(_DRAWS):
        if 2 * k > n - 1:
            sparse = _pairing(n, n - 1 - k, rng)
            edges = None if sparse is None else _complement(n, sparse)
        else:
            edges = _pairing(n, k, rng)
        if edges is not None and _connected(n, edges):
            return edges
    return None


#: Draws before giving up (the caller then uses a circulant graph); each succeeds with a
#: probability near 1.
_DRAWS = 20


def _pairing(n: int, k: int, rng: random.Random) -> Edges | None:
    """One Steger–Wormald draw of a k-regular simple graph on 0..n-1; None when it got stuck."""
    edges: Edges = set()
    stubs = [i for i in range(n) for _ in range(k)]
    while stubs:
        rng.shuffle(stubs)
        left: dict[int, int] = {}
        for a, b in zip(stubs[::2], stubs[1::2], strict=True):
            edge = (min(a, b), max(a, b))
            if a != b and edge not in edges:
                edges.add(edge)
            else:
                left[a] = left.get(a, 0) + 1
                left[b] = left.get(b, 0) + 1
        if left and not _can_pair(left, edges):
            return None
        stubs = [i for i, count in left.items() for _ in range(count)]
    return edges


def _can_pair(left: dict[int, int], edges: Edges) -> bool:
    """Whether two of the nodes with stubs left can still be joined by a new edge."""
    nodes = sorted(left)
    return any((a, b) not in edges for i, a in enumerate(nodes) for b in nodes[i + 1 :])


def _complement(n: int, edges: Edges) -> Edges:
    return {(a, b) for a in range(n) for b in range(a + 1, n) if (a, b) not in edges}


def _connected(n: int, edges: Edges) -> bool:
    adj: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        adj[a].append(b)
        adj[b].append(a)
    seen, frontier = {0}, [0]
    while frontier:
        for j in adj[frontier.pop()]:
            if j not in seen:
                seen.add(j)
                frontier.append(j)
    return len(seen) == n
