"""What one gossip round costs a node's CPU, by codec, as a ratio to a copy of the model.

    python -m bench.round_cost [--numel 1100000] [--neighbours 3] [--rounds 30]
        [--codecs sign int4 int8 fp16] [--threads 1]

A node's share of a round with ``--neighbours`` links and one public copy (``--pace node``):
the deltas its neighbours sent it (decode, checks, the replica's update) and its own round
through the same ``Mixer`` the daemon and the simulator use (the event-triggered rule, the mix,
compressing x - x̂ and updating x̂). The neighbours' own encoding happens outside the timed
part. Between rounds every model takes a small random step, as training does. On a device
whose cores train, this time comes out of training: on 2 cores shared by 4 real nodes of the
1.1M-parameter MLP, the rounds' CPU cut the steps a node made by up to half (bench/RESULTS.md,
bench/slow_links.py). Times are medians over ``--rounds`` rounds on ``--threads`` threads;
the baseline is ``x.clone()`` of the model, timed in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.mixing import MixConfig, Mixer
from gossip.replicas import GossipState
from gossip.trigger import TriggerConfig

STEP = 1e-3  # each round every model moves by about this much per value


def round_times_s(codec: str, numel: int, neighbours: int, rounds: int) -> list[float]:
    """Seconds of each of ``rounds`` rounds: the deltas received, then the node's own round."""
    clock = ManualClock()
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(numel, generator=g)
    peers = [f"n{i}" for i in range(neighbours)]
    me = GossipState(x0.clone(), get_codec(codec), clock, torch.Generator().manual_seed(1), 1)
    me.set_peers(frozenset(peers))
    others = {}
    for i, p in enumerate(peers):
        gen = torch.Generator().manual_seed(2 + i)
        others[p] = (GossipState(x0.clone(), get_codec(codec), clock, gen, 1), x0.clone())
        me.receive_snapshot(p, 1, 0, x0.clone(), degree=neighbours)
    mixer = Mixer(me, MixConfig(gamma=0.3, silence_limit_s=60.0, trigger=TriggerConfig()))
    x = x0.clone()
    times = []
    for _ in range(rounds + 3):  # the first three warm up
        clock.advance(0.05)
        x.add_(torch.randn(numel, generator=g), alpha=STEP)
        sent = []
        for p, (state, model) in others.items():
            model.add_(torch.randn(numel, generator=g), alpha=STEP)
            sent.append((p, *state.make_delta(model)))
        began = time.perf_counter()
        for p, seq, payload in sent:
            me.receive_delta(p, 1, seq, payload)
        mixer.round(x)
        times.append(time.perf_counter() - began)
    return times[3:]


def clone_s(numel: int, repeat: int) -> float:
    x = torch.randn(numel)
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        x.clone()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--numel", type=int, default=1_100_000)
    ap.add_argument("--neighbours", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--codecs", nargs="+", default=["sign", "int4", "int8", "fp16"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    base = clone_s(args.numel, 50)
    print(
        f"# {args.numel:,} values, {args.neighbours} neighbours, {args.threads} thread(s), "
        f"torch {torch.__version__}; baseline x.clone() {base * 1e3:.2f} ms"
    )
    print("| codec | round ms (median) | round / copy |\n|---|---:|---:|")
    for codec in args.codecs:
        t = statistics.median(round_times_s(codec, args.numel, args.neighbours, args.rounds))
        print(f"| {codec} | {t * 1e3:.1f} | {t / base:.0f} |")


if __name__ == "__main__":
    main()
