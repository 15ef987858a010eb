"""A codec per link, chosen by measurement, against one codec for all, on a mix of links
(issue 17).

    python -m bench.sim_codec_mix [--nodes 32] [--dim 2048] [--numel 1100000] [--factor 1e6]
        [--max-ticks 20000]

No training: each node starts from its own Gaussian vector plus one, and gossips by CHOCO with a
copy per link (gossip/pairwise.py) on the exponential graph. Every link is drawn (seeded) as a
LAN (125 MB/s, 1 ms), a home uplink (20 Mbit/s, 20 ms) or a cellular one (1 Mbit/s, 80 ms),
40/40/20, and sends a delta every ``period`` ticks of 50 ms (a node's compute between rounds):
the ticks one delta of a ``--numel``-value model takes on it (gossip/codec_choice.py
round_time_s), so the timing is that of the 1.1M-parameter MLP while the vectors moved are
``--dim`` long. Each codec runs at its default γ. The table: seconds until the consensus
distance fell ``--factor``-fold, bytes per node by then (at ``--numel``), and which codecs
``auto`` chose (gossip/codec_choice.py choose_codec, per link).
"""

from __future__ import annotations

import argparse
import math
import random
import time
from collections import Counter

import torch

from gossip.codec_choice import ROUNDS_TO_CONSENSUS, LinkMeasure, choose_codec, round_time_s
from gossip.codecs import get_codec
from gossip.pairwise import Edge, PairwiseSwarm
from gossip.topology import exponential
from node.config import DEFAULT_GAMMA

TICK_S = 0.05
KINDS = {
    "lan": LinkMeasure(125e6, 0.001, TICK_S),
    "home": LinkMeasure(2.5e6, 0.020, TICK_S),
    "cellular": LinkMeasure(125e3, 0.080, TICK_S),
}
SHARES = (("lan", 0.4), ("home", 0.4), ("cellular", 0.2))


def run(
    codec_of: dict[Edge, str],
    init: dict[str, torch.Tensor],
    kind_of: dict[Edge, str],
    args: argparse.Namespace,
) -> tuple[float | None, float]:
    period = {
        e: max(1, math.ceil(round_time_s(c, args.numel, KINDS[kind_of[e]]) / TICK_S))
        for e, c in codec_of.items()
    }
    swarm = PairwiseSwarm(
        exponential(init),
        init,
        lambda e: get_codec(codec_of[e]),
        0.8,
        lambda e: period[e],
        gamma_of=lambda e: DEFAULT_GAMMA[codec_of[e]],
    )
    target = swarm.consensus_distance() / args.factor
    sent = 0.0
    n = len(init)
    for tick in range(1, args.max_ticks + 1):
        live = [e for e in swarm.edges if swarm.active(e)]
        sent += sum(2 * get_codec(codec_of[e]).encoded_nbytes(args.numel) for e in live) / n
        swarm.round()
        if swarm.consensus_distance() <= target:
            return tick * TICK_S, sent
    return None, sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", type=int, default=32)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--numel", type=int, default=1_100_000)
    p.add_argument("--factor", type=float, default=1e6)
    p.add_argument("--max-ticks", type=int, default=20_000)
    args = p.parse_args()
    ids = [f"node-{k:04d}" for k in range(args.nodes)]
    g = torch.Generator().manual_seed(0)
    init = {i: torch.randn(args.dim, generator=g) + 1.0 for i in ids}
    edges = sorted({(min(i, j), max(i, j)) for i, js in exponential(ids).adj.items() for j in js})
    rng = random.Random(0)
    kind_of = {
        e: rng.choices([k for k, _ in SHARES], weights=[w for _, w in SHARES])[0] for e in edges
    }
    print(f"{args.nodes} nodes, {len(edges)} links: {dict(Counter(kind_of.values()))}\n")
    print("| codec | seconds to consensus | MB/node by then | codecs chosen | wall s |")
    print("|---|---:|---:|---|---:|")
    # Pure gossip from far apart: the rounds to consensus, and bytes as free as rounds.
    auto = {
        e: choose_codec(args.numel, KINDS[kind_of[e]], rounds=ROUNDS_TO_CONSENSUS, frugal=1.0)
        for e in edges
    }
    plans = [(c, dict.fromkeys(edges, c)) for c in ("fp16", "int8", "int4", "sign")]
    for name, plan in [*plans, ("auto", auto)]:
        started = time.perf_counter()
        seconds, sent = run(plan, init, kind_of, args)
        chosen = ", ".join(f"{k} {v}" for k, v in sorted(Counter(plan.values()).items()))
        shown = "-" if seconds is None else f"{seconds:.1f}"
        print(
            f"| {name} | {shown} | {sent / 1e6:.1f} | {chosen} | "
            f"{time.perf_counter() - started:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
