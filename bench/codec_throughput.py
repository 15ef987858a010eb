"""Codec throughput on a 10M-parameter vector, as ratios to a plain copy of it in the same run.

    python -m bench.codec_throughput [--numel 10000000] [--device cpu] [--repeat 7]

Times are medians over ``--repeat`` runs after a warm-up. "encode" is what a sender pays per
round (quantize on the device, then the bytes to the host); "decode" is what a receiver pays
(bytes to the device, dequantize). The baseline is ``x.clone()``: one read and one write of the
fp32 vector, the least any codec must do.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from gossip.codecs import CODECS, get_codec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_s(fn: Callable[[], object], device: torch.device, repeat: int) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=10_000_000)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    device = torch.device(args.device)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(0)).to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    copy_s = median_s(x.clone, device, args.repeat)
    print(
        f"# {args.numel:,} float32 values on {device}, block size {args.block_size}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )
    print(f"# baseline x.clone(): {1e3 * copy_s:.2f} ms ({4 * args.numel / copy_s / 1e9:.2f} GB/s)")
    print("| codec | bytes vs fp32 | encode ms | encode / copy | decode ms | decode / copy |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in CODECS:
        codec = get_codec(name, args.block_size)
        enc = codec.encode(x, gen)
        encode_s = median_s(partial(codec.compress, x, gen), device, args.repeat)
        decode_s = median_s(partial(codec.decode, enc, device), device, args.repeat)
        print(
            f"| {name} | {enc.nbytes / (4 * args.numel):.3f} | {1e3 * encode_s:.1f} | "
            f"{encode_s / copy_s:.1f} | {1e3 * decode_s:.1f} | {decode_s / copy_s:.1f} |"
        )


if __name__ == "__main__":
    main()
