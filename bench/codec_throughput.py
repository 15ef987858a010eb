"""Codec throughput on a 10M-parameter vector, as ratios to a plain copy and to int8 in one run.

    python -m bench.codec_throughput [--numel 10000000] [--device cpu] [--repeat 7]
        [--fraction 0.01] [--codecs int8 topk ...]

Times are medians over ``--repeat`` runs after a warm-up, every codec timed in turn within each
run so that a shared machine's changing load reaches all of them alike. "encode" is what a
sender pays per round (quantize on the device, then the bytes to the host); "decode" is what a
receiver pays (bytes to the device, dequantize). The baseline is ``x.clone()``: one read and one
write of the fp32 vector, the least any codec must do. The sparse codecs (topk, randk, dct-topk)
send ``--fraction`` of each block; their bytes and times are also given against int8's.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch

from gossip.codecs import CODECS, DEFAULT_FRACTION, get_codec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def medians_s(
    fns: dict[str, Callable[[], object]], device: torch.device, repeat: int
) -> dict[str, float]:
    """Median seconds of each function, timed in turns (one call of each per turn), so that a
    change of the machine's load during the run reaches every ratio alike."""
    for fn in fns.values():
        fn()  # warm-up
    _sync(device)
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=10_000_000)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--fraction", type=float, default=DEFAULT_FRACTION)
    parser.add_argument("--codecs", nargs="*", default=list(CODECS), choices=list(CODECS))
    args = parser.parse_args()
    device = torch.device(args.device)
    x = torch.randn(args.numel, generator=torch.Generator().manual_seed(0)).to(device)
    gen = torch.Generator(device=device).manual_seed(0)
    names = ["int8", *(n for n in args.codecs if n != "int8")]  # int8 first: the reference
    codecs = {name: get_codec(name, args.block_size, args.fraction) for name in names}
    encoded = {name: codec.encode(x, gen) for name, codec in codecs.items()}
    fns: dict[str, Callable[[], object]] = {"copy": x.clone}
    for name, codec in codecs.items():
        fns[f"{name} encode"] = partial(codec.compress, x, gen)
        fns[f"{name} decode"] = partial(codec.decode, encoded[name], device)
    t = medians_s(fns, device, args.repeat)
    copy_s = t["copy"]
    print(
        f"# {args.numel:,} float32 values on {device}, block size {args.block_size}, "
        f"sparse fraction {args.fraction}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"# baseline x.clone(): {1e3 * copy_s:.2f} ms ({4 * args.numel / copy_s / 1e9:.2f} GB/s)")
    print(
        "| codec | bytes vs fp32 | bytes vs int8 | encode ms | encode / copy | encode / int8 "
        "| decode ms | decode / copy | decode / int8 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    ref = encoded["int8"].nbytes, t["int8 encode"], t["int8 decode"]
    for name in names:
        nbytes, encode_s, decode_s = encoded[name].nbytes, t[f"{name} encode"], t[f"{name} decode"]
        print(
            f"| {name} | {nbytes / (4 * args.numel):.4f} | {nbytes / ref[0]:.4f} | "
            f"{1e3 * encode_s:.1f} | {encode_s / copy_s:.1f} | {encode_s / ref[1]:.2f} | "
            f"{1e3 * decode_s:.1f} | {decode_s / copy_s:.1f} | {decode_s / ref[2]:.2f} |"
        )


if __name__ == "__main__":
    main()
