"""Time-varying topologies against the static exponential graph: rounds and bytes until gossip
alone averages a swarm (issue 19).

    python -m bench.sim_topologies [--nodes 64,100,256,1024] [--dim 4096] [--factor 1e8]
        [--loss 0,0.1] [--max-rounds 600]

No training: each node starts from its own Gaussian vector plus one, and a row gives the rounds
until the consensus distance (1/n) Σ ||x_i − x̄||² fell ``--factor``-fold and the bytes each node
sent by then, with that against CHOCO int8 on the static exponential graph in the same run.

* ``exponential int8`` / ``exponential fp32``: synchronous CHOCO gossip (gossip/simulate.py
  SyncSwarm) on the static exponential graph (degree about 2 log2 n), γ 0.8 and 1.0; it has no
  message loss model, so it runs at loss 0 only.
* ``one-peer-exponential`` and ``epidemic s``: push-sum (gossip/pushsum.py) under the
  time-varying schedules (gossip/schedules.py), float32 shares, each message lost with the
  row's probability and the link resynced by its running sums (counted in the bytes).

The vector's mean is checked after every run: it must be the initial one to 1e-6 (push-sum's
promise, losses included); "-" is a run that did not get there in ``--max-rounds``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from gossip.codecs import get_codec
from gossip.pushsum import in_flight
from gossip.simulate import PushSumSwarm, SyncSwarm, rounds_to_consensus
from gossip.topology import build

HEADER = (
    "| n | topology | loss | rounds | KiB/node | bytes vs exponential int8 | wall s |\n"
    "|---:|---|---:|---:|---:|---:|---:|"
)


def initial(n: int, dim: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(n)
    return {f"node-{i:04d}": torch.randn(dim, generator=g) + 1.0 for i in range(n)}


def run_choco(
    codec: str, gamma: float, init: dict[str, torch.Tensor], args: argparse.Namespace
) -> tuple[int | None, float]:
    swarm = SyncSwarm(build("exponential", list(init)), init, get_codec(codec), gamma)
    reached = rounds_to_consensus(swarm, args.factor, args.max_rounds)
    return reached, swarm.bytes_sent / len(init)


def run_pushsum(
    kind: str, fanout: int, loss: float, init: dict[str, torch.Tensor], args: argparse.Namespace
) -> tuple[int | None, float]:
    swarm = PushSumSwarm(init, kind, fanout=fanout, loss=loss, seed=1)
    mean0 = torch.stack([v.to(torch.float64) for v in init.values()]).mean(0)
    reached = rounds_to_consensus(swarm, args.factor, args.max_rounds)
    held, _ = swarm.total()
    moving, _ = in_flight(swarm.nodes)
    drift = float(((held + moving) / len(init) - mean0).abs().max())
    if drift > 1e-6 * float(mean0.abs().max()):
        raise AssertionError(f"{kind} at loss {loss}: the mean moved by {drift:.3g}")
    return reached, swarm.bytes_sent / len(init)


Row = tuple[str, float, int | None, float, float]  # name, loss, rounds, bytes/node, wall s


def one_size(n: int, args: argparse.Namespace) -> list[Row]:
    init = initial(n, args.dim)
    runs: list[Row] = []

    def timed(name: str, loss: float, fn: Any, *fn_args: Any) -> None:
        started = time.perf_counter()
        rounds, sent = fn(*fn_args, init, args)
        runs.append((name, loss, rounds, sent, time.perf_counter() - started))

    timed("exponential int8", 0.0, run_choco, "int8", 0.8)
    timed("exponential fp32", 0.0, run_choco, "none", 1.0)
    for loss in [float(v) for v in args.loss.split(",")]:
        for name, kind, fanout in [
            ("one-peer-exponential", "one-peer-exponential", 1),
            ("epidemic 1", "epidemic", 1),
            ("epidemic 2", "epidemic", 2),
        ]:
            timed(name, loss, run_pushsum, kind, fanout, loss)
    return runs


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nodes", default="64,100,256,1024")
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--factor", type=float, default=1e8)
    p.add_argument("--loss", default="0,0.1")
    p.add_argument("--max-rounds", type=int, default=600)
    args = p.parse_args()
    print(f"dim {args.dim}, consensus distance down {args.factor:g}-fold\n")
    print(HEADER)
    for n in [int(v) for v in args.nodes.split(",")]:
        runs = one_size(n, args)
        _, _, base_rounds, base_bytes, _ = runs[0]
        for name, loss, rounds, sent, wall in runs:
            ratio = "-" if rounds is None or base_rounds is None else f"{sent / base_bytes:.2f}"
            shown = "-" if rounds is None else str(rounds)
            kib = "-" if rounds is None else f"{sent / 1024:.0f}"
            print(f"| {n} | {name} | {loss:g} | {shown} | {kib} | {ratio} | {wall:.1f} |")


if __name__ == "__main__":
    main()
