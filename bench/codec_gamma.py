"""Consensus step size γ by codec: rounds and bytes until gossip alone averages a swarm.

    python -m bench.codec_gamma [--nodes 16] [--dim 16384] [--factor 1e4] [--max-rounds 4000]

Synchronous CHOCO gossip (gossip/simulate.py, every message through encode, bytes and decode)
on the exponential graph, no training: each node starts from its own Gaussian vector and the
table gives, per codec and γ, the rounds until the consensus distance fell ``--factor``-fold and
the bytes each node sent by then, with the ratio of those bytes to int8's at γ 0.8 in the same
run. The sparse codecs are tried at γ a multiple of the share k / B of each block they keep
(``--fraction``): "-" is a run that stalled (less than 2-fold progress in 500 rounds), diverged
or ran past ``--max-rounds``.
"""

from __future__ import annotations

import argparse

import torch

from gossip.codecs import DEFAULT_FRACTION, get_codec
from gossip.simulate import SyncSwarm
from gossip.topology import build

#: γ to try: fixed for the dense codecs, multiples of the kept share k / B for the sparse ones.
DENSE_GRID = {"int8": [0.8], "sign": [0.1, 0.3]}  # sign: best from afar, default
SPARSE_MULTIPLES = {
    "topk": [0.5, 1.0, 1.5, 2.0, 3.0],
    "dct-topk": [0.5, 1.0, 1.5, 2.0, 3.0],
    # random-k's error waits B / k rounds on average to be sent: it needs a smaller step.
    "randk": [0.25, 0.375, 0.5, 0.75, 1.0],
}
#: A run whose distance fell less than 2-fold over this many rounds has stalled.
STALL_ROUNDS = 500


def run(
    codec: str, gamma: float, args: argparse.Namespace, ids: list[str]
) -> tuple[int | None, float]:
    """(rounds to the target or None, bytes each node sent by then)."""
    g = torch.Generator().manual_seed(0)
    initial = {i: torch.randn(args.dim, generator=g) + 1.0 for i in ids}
    swarm = SyncSwarm(
        build("exponential", ids), initial, get_codec(codec, args.block_size, args.fraction), gamma
    )
    history = [swarm.consensus_distance()]
    target = history[0] / args.factor
    for r in range(1, args.max_rounds + 1):
        swarm.round()
        history.append(swarm.consensus_distance())
        if history[-1] <= target:
            return r, swarm.bytes_sent / len(ids)
        if not history[-1] < 1e6 * history[0]:  # diverged (or NaN)
            break
        if r >= STALL_ROUNDS and not history[-1] < 0.5 * history[r - STALL_ROUNDS]:
            break
    return None, swarm.bytes_sent / len(ids)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--dim", type=int, default=16384)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=DEFAULT_FRACTION)
    parser.add_argument("--factor", type=float, default=1e4)
    parser.add_argument("--max-rounds", type=int, default=4000)
    parser.add_argument(
        "--codecs", nargs="*", default=["int8", "sign", "topk", "randk", "dct-topk"]
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    ids = [f"n{i:03d}" for i in range(args.nodes)]
    print(
        f"# {args.nodes} nodes, exponential graph, {args.dim} values, block {args.block_size}, "
        f"fraction {args.fraction}, consensus distance down {args.factor:g}-fold, "
        f"torch {torch.__version__}"
    )
    _, int8_bytes = run("int8", 0.8, args, ids)
    print("| codec | kept k/B | γ | γ / (k/B) | rounds | bytes per node | bytes / int8's |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name in args.codecs:
        codec = get_codec(name, args.block_size, args.fraction)
        kept = getattr(codec, "k", args.block_size) / args.block_size
        grid = DENSE_GRID.get(name) or [round(m * kept, 5) for m in SPARSE_MULTIPLES[name]]
        for gamma in grid:
            rounds, sent = run(name, gamma, args, ids)
            cells = ["-", "-", "-"]
            if rounds is not None:
                cells = [str(rounds), f"{sent:,.0f}", f"{sent / int8_bytes:.3f}"]
            print(f"| {name} | {kept:.4f} | {gamma} | {gamma / kept:.2f} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
