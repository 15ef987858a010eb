"""Communication graphs over node ids, their mixing weights and spectral gaps.

Every graph is built from a set of node ids placed on a ring in sorted order, so that any two
nodes holding the same member list derive the same graph without talking to each other. All
graphs here are undirected: ``j in g.neighbours(i)`` iff ``i in g.neighbours(j)``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from gossip.cycles import expander_cycles, union_of_cycles
from gossip.regular_draws import draw_regular
from gossip.schedules import SCHEDULES

__all__ = [
    "AUTO_EXPONENTIAL_UP_TO",
    "TOPOLOGIES",
    "Graph",
    "block_region",
    "build",
    "crosses",
    "expander",
    "exponential",
    "metropolis_hastings",
    "mixing_matrix",
    "powers_below",
    "random_regular",
    "reachable_graph",
    "regional",
    "resolved",
    "ring",
    "ring_order",
    "spectral_gap",
]

NodeId = str


@dataclass(frozen=True)
class Graph:
    """An undirected simple graph: ``nodes`` in ring order, ``adj`` node -> neighbours."""

    nodes: tuple[NodeId, ...]
    adj: Mapping[NodeId, frozenset[NodeId]]

    def neighbours(self, node: NodeId) -> frozenset[NodeId]:
        return self.adj[node]

    def degree(self, node: NodeId) -> int:
        return len(self.adj[node])

    def is_symmetric(self) -> bool:
        return all(i in self.adj[j] for i in self.nodes for j in self.adj[i])

    def is_connected(self) -> bool:
        if not self.nodes:
            return True
        seen, frontier = {self.nodes[0]}, [self.nodes[0]]
        while frontier:
            for j in self.adj[frontier.pop()]:
                if j not in seen:
                    seen.add(j)
                    frontier.append(j)
        return len(seen) == len(self.nodes)


def ring_order(ids: Iterable[NodeId]) -> tuple[NodeId, ...]:
    order = tuple(sorted(set(ids)))
    if not order:
        raise ValueError("a graph needs at least one node")
    return order


def _from_offsets(order: tuple[NodeId, ...], offsets: Iterable[int]) -> Graph:
    n = len(order)
    adj: dict[NodeId, set[NodeId]] = {i: set() for i in order}
    for pos, i in enumerate(order):
        for off in offsets:
            for j in (order[(pos + off) % n], order[(pos - off) % n]):
                if j != i:
                    adj[i].add(j)
    return Graph(order, {i: frozenset(js) for i, js in adj.items()})


def ring(ids: Iterable[NodeId]) -> Graph:
    """Each node linked to its predecessor and successor on the ring (degree 2)."""
    return _from_offsets(ring_order(ids), [1])


def exponential(ids: Iterable[NodeId]) -> Graph:
    """Static exponential graph, made undirected: node i links to i ± 2^k for 2^k < n.

    The directed version is the one of Assran et al. (SGP, 2019) and BlueFog; linking both ways
    makes the graph symmetric (degree about 2 log2 n) so that Metropolis–Hastings weights apply.
    """
    order = ring_order(ids)
    return _from_offsets(order, powers_below(len(order)))


def powers_below(n: int) -> list[int]:
    """The exponential graph's offsets on a ring of ``n``: every 2^k < n."""
    return [1 << k for k in range((n - 1).bit_length())] if n > 1 else []


def expander(ids: Iterable[NodeId], seed: int = 0, paused: Iterable[NodeId] = ()) -> Graph:
    """The union of :func:`expander_cycles` (n) random cycles through the nodes
    (gossip/cycles.py): about as many neighbours as the exponential graph, a larger spectral
    gap from about 64 nodes on (random cycles make an expander), and a member that comes or
    goes moves three edges of each cycle, where on the exponential graph it shifts everyone's
    place on the ring (at 256 nodes 22 edges against 388; bench/RESULTS.md, "The expander
    against the exponential graph").

    ``paused`` members (of ``ids``) are out of the graph but keep their places, as on the
    exponential graph (gossip/view_graph.py ``paused_out``): their edges go, and only the
    first cycle closes the gaps they leave, so that it stays connected. A pause or a resume
    then moves the edges at that member and one across its gap, where rebuilding the cycles
    over the others would link its two neighbours in every cycle.
    """
    order = ring_order(ids)
    held = frozenset(paused)
    adj = union_of_cycles(order, expander_cycles(len(order)), seed, held)
    return Graph(tuple(i for i in order if i not in held), adj)


#: ``auto`` is the exponential graph up to this many members and :func:`expander` above. The
#: exponential graph's gap is larger up to about 40 members (0.67 against 0.27-0.52 at 8, 0.72
#: against 0.27-0.37 at 17); from 64 on the expander's is (0.37-0.40 against 0.33 at 64,
#: 0.45-0.46 against 0.25 at 256), on fewer edges, and it moves far fewer of them under churn
#: (``python -m bench.topology_churn``).
AUTO_EXPONENTIAL_UP_TO = 64


def resolved(kind: str, n: int) -> str:
    """The graph ``kind`` names among ``n`` members: ``auto`` is ``exponential`` up to
    :data:`AUTO_EXPONENTIAL_UP_TO` and ``expander`` above; any other kind is itself."""
    if kind != "auto":
        return kind
    return "exponential" if n <= AUTO_EXPONENTIAL_UP_TO else "expander"


def random_regular(ids: Iterable[NodeId], k: int, seed: int = 0) -> Graph:
    """A connected random k-regular graph (nearly, for a sparse even k), the same for the same
    ids, k and seed.

    Every member derives the graph from its view, so the graph must change little when the
    view does. For an even k, and sparse (k = 2, or k² ≤ n), it is the union of k/2 cycles
    through every node, each in the order of a hash of (seed, cycle, id) (random cycles make
    an expander, as random regular graphs do): a member that comes or goes changes two edges
    of each cycle and no other. Where two cycles pass through the same pair the pair is one
    edge, so a few nodes have k - 1 or k - 2 neighbours (rare when k² ≤ n). A pairing (below) is
    drawn afresh at every change of the ids: at 256 nodes and k = 4 one join kept 27 of the
    512 edges, and under 5% churn a minute the simulator's worst nodes spent seconds with no
    neighbour synced, every neighbour new (bench/RESULTS.md, "Simulated swarms: time to
    target under churn").

    Otherwise (an odd k, or a dense graph) it is an exactly regular graph drawn by pairing
    (gossip/regular_draws.py), or, after a few unlucky draws, a circulant graph, so the call
    always ends quickly.

    Raises:
        ValueError: no connected k-regular graph on these ids exists.
    """
    order = ring_order(ids)
    n = len(order)
    if k >= n or k < 0 or (n * k) % 2:
        raise ValueError(f"no {k}-regular graph on {n} nodes (need 0 <= k < n and n*k even)")
    if k < min(2, n - 1):
        raise ValueError(f"no connected {k}-regular graph on {n} nodes (need k >= 2)")
    if k % 2 == 0 and (k == 2 or k * k <= n):
        return Graph(order, union_of_cycles(order, k // 2, seed))
    edges = draw_regular(n, k, seed)
    if edges is None:
        return _circulant(order, k)
    adj: dict[NodeId, set[NodeId]] = {i: set() for i in order}
    for a, b in edges:
        adj[order[a]].add(order[b])
        adj[order[b]].add(order[a])
    return Graph(order, {i: frozenset(js) for i, js in adj.items()})


def _circulant(order: tuple[NodeId, ...], k: int) -> Graph:
    """Node i linked to i ± 1 .. i ± k/2 (and, for odd k, the opposite node): connected,
    k-regular, and no draw at all."""
    n = len(order)
    offsets = list(range(1, k // 2 + 1)) + ([n // 2] if k % 2 else [])
    return _from_offsets(order, offsets)


#: ``auto`` is ``exponential`` or ``expander`` by the number of members (:func:`resolved`). The
#: last two are time-varying schedules (gossip/schedules.py) over the exponential graph's
#: links: each round goes to some of them.
TOPOLOGIES = (
    "auto", "ring", "exponential", "expander", "random-regular", "regional", *SCHEDULES
)  # fmt: skip


def build(
    kind: str,
    ids: Iterable[NodeId],
    *,
    degree: int = 4,
    seed: int = 0,
    regions: Mapping[NodeId, str] | None = None,
) -> Graph:
    """The graph named ``kind`` (one of :data:`TOPOLOGIES`) over ``ids``; ``auto`` is the
    exponential graph or the expander by their number (:func:`resolved`).

    For ``random-regular``, ``degree`` is lowered to the largest valid value when the swarm is
    too small (n - 1, or one less when n * degree would be odd), and raised to 2 (a ring, drawn at
    random) when it is lower, since no connected graph of degree 0 or 1 on more than two nodes
    exists.

    For ``regional``, ``regions`` names each node's region (a node it leaves out, or names
    ``""``, is in the region of those without one) and ``degree`` is the number of bridges
    between each two regions (:func:`regional`); with one region it is the exponential graph.
    """
    order = ring_order(ids)
    kind = resolved(kind, len(order))
    named = tuple((i, regions.get(i, "")) for i in order) if kind == "regional" and regions else ()
    return _build(kind, order, degree, seed, named)


@functools.lru_cache(maxsize=64)
def _build(
    kind: str,
    order: tuple[NodeId, ...],
    degree: int,
    seed: int,
    regions: tuple[tuple[NodeId, str], ...] = (),
) -> Graph:
    # Cached: members with the same view derive the same graph, and a simulator hosts a
    # thousand of them (a random regular graph of 1,000 nodes takes a second to draw).
    if kind == "regional":
        return regional(dict(regions) or dict.fromkeys(order, ""), bridges=max(1, degree))
    if kind == "ring":
        return ring(order)
    if kind == "exponential" or kind in SCHEDULES:
        return exponential(order)
    if kind == "expander":
        return expander(order, seed)
    if kind == "random-regular":
        n = len(order)
        k = min(degree, n - 1)
        if (n * k) % 2:
            k -= 1
        if n > 2:
            k = max(k, 2)
        return random_regular(order, k, seed)
    raise ValueError(f"unknown topology {kind!r}; known: {', '.join(TOPOLOGIES)}")


def regional(region_of: Mapping[NodeId, str], bridges: int = 2) -> Graph:
    """Most edges inside a region, a few across (HALoS's local groups, Kim et al. 2025).

    Inside each region its members form the exponential graph. Between each two regions,
    ``bridges`` edges (fewer when a region has fewer members), each joining a member of one to a
    member of the other, distinct members on each side, picked in an order hashed from the two
    regions' names, so that the load of bridging spreads over the members and every member
    holding the same view picks the same ones. Connected whenever every region is.
    """
    if bridges < 1:
        raise ValueError(f"bridges is {bridges}: expected at least 1")
    order = ring_order(region_of)
    members: dict[str, list[NodeId]] = {}
    for node in order:
        members.setdefault(region_of[node], []).append(node)
    adj: dict[NodeId, set[NodeId]] = {i: set() for i in order}
    for group in members.values():
        for i, js in exponential(group).adj.items():
            adj[i].update(js)
    names = sorted(members)
    for a_pos, a in enumerate(names):
        for b in names[a_pos + 1 :]:
            side_a = _by_rank(f"{a}|{b}", tuple(members[a]))
            side_b = _by_rank(f"{a}|{b}", tuple(members[b]))
            for i, j in zip(side_a[:bridges], side_b[:bridges], strict=False):
                adj[i].add(j)
                adj[j].add(i)
    return Graph(order, {i: frozenset(js) for i, js in adj.items()})


def block_region(index: int, n: int, regions: int) -> str:
    """The region (``r0`` .. ``r{regions-1}``) of the ``index``-th of ``n`` nodes, when a swarm
    is split into ``regions`` equal, contiguous blocks by index (``murmur swarm`` and
    ``murmur simulate --regions``); a node past the first ``n`` (a joiner) goes round robin."""
    if regions < 1 or n < 1 or index < 0:
        raise ValueError(f"need regions ≥ 1, n ≥ 1 and index ≥ 0, got {regions}, {n}, {index}")
    return f"r{index * regions // n if index < n else index % regions}"


def crosses(region_of: Mapping[NodeId, str], i: NodeId, j: NodeId) -> bool:
    """Whether the edge (i, j) joins two regions."""
    return region_of[i] != region_of[j]


#: Reachable neighbours each unreachable node gets at least (fewer when fewer are reachable).
UNREACHABLE_ANCHORS = 2


def reachable_graph(
    graph: Graph, unreachable: frozenset[NodeId], anchors: int = UNREACHABLE_ANCHORS
) -> Graph:
    """``graph`` with only the edges that can exist when ``unreachable`` nodes cannot be
    dialled: an edge needs one end that can be, since the other end opens the connection.

    Edges between two unreachable nodes are dropped. Each unreachable node then gets reachable
    neighbours until it has as many as it had (at least ``anchors``, at most every reachable
    node), chosen by rendezvous hashing of the two ids (the same on every node, and moving few
    edges when members come or go), and the reachable nodes are joined in a ring of their own,
    so the graph stays connected whatever edges were dropped. Keeping the degrees keeps the
    mixing about as fast as with everyone reachable while most nodes are; the reachable nodes
    carry the edges (bench/nat_topology.py measures both). With no unreachable node, or none
    reachable, the graph is returned as it is.
    """
    unreachable = unreachable & frozenset(graph.nodes)
    reachable = [n for n in graph.nodes if n not in unreachable]
    if not unreachable or not reachable:
        return graph
    adj = {n: set(graph.adj[n]) for n in graph.nodes}

    def link(a: NodeId, b: NodeId) -> None:
        adj[a].add(b)
        adj[b].add(a)

    for u in unreachable:
        for j in list(adj[u]):
            if j in unreachable:
                adj[u].discard(j)
                adj[j].discard(u)
    degree = {n: len(graph.adj[n]) for n in graph.nodes}
    among = tuple(reachable)
    for u in sorted(unreachable):
        # As many reachable neighbours as the edges it lost (its degree, as far as can be).
        want = min(max(anchors, degree[u]), len(reachable))
        for r in _by_rank(u, among):
            if len(adj[u]) >= want:
                break
            link(u, r)
    if len(reachable) > 1:
        for a, b in zip(reachable, reachable[1:] + reachable[:1], strict=True):
            if a != b:
                link(a, b)
    return Graph(graph.nodes, {n: frozenset(adj[n]) for n in graph.nodes})


@functools.lru_cache(maxsize=8192)
def _by_rank(node: NodeId, among: tuple[NodeId, ...]) -> tuple[NodeId, ...]:
    """``among`` in ``node``'s rendezvous order. Kept, since every member builds the graph on
    every change of its view, and the reachable members change far less often than that: U x R
    hashes each time would cost a large swarm a second of CPU per change."""
    return tuple(sorted(among, key=lambda r: hashlib.sha256(f"{node}|{r}".encode()).digest()))


def metropolis_hastings(graph: Graph) -> dict[NodeId, dict[NodeId, float]]:
    """Metropolis–Hastings weights w_ij = 1 / (1 + max(d_i, d_j)) for each edge (Xiao & Boyd 2004).

    Returns node -> {neighbour: weight}; the self weight is 1 minus the row's sum. The matrix is
    symmetric and doubly stochastic, so gossip with it preserves the average.
    """
    return {
        i: {j: 1.0 / (1 + max(graph.degree(i), graph.degree(j))) for j in graph.neighbours(i)}
        for i in graph.nodes
    }


def mixing_matrix(graph: Graph) -> torch.Tensor:
    """The (n, n) float64 Metropolis–Hastings matrix W in the graph's node order."""
    index = {node: pos for pos, node in enumerate(graph.nodes)}
    w = torch.zeros(len(graph.nodes), len(graph.nodes), dtype=torch.float64)
    for i, row in metropolis_hastings(graph).items():
        for j, weight in row.items():
            w[index[i], index[j]] = weight
    w += torch.diag(1.0 - w.sum(dim=1))
    return w


def spectral_gap(w: torch.Tensor) -> float:
    """1 - |λ₂| of a symmetric mixing matrix: the fraction of disagreement one round removes.

    Exact gossip shrinks the consensus distance by at least (1 - gap)^2 per round.
    """
    eig = torch.linalg.eigvalsh(w.to(torch.float64)).abs().sort(descending=True).values
    return 1.0 - float(eig[1]) if eig.numel() > 1 else 1.0
