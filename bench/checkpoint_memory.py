"""How much a checkpoint raises a node's peak memory: node/daemon/checkpoint.py's streamed writer
against safetensors' own ``save`` (what murmur used before), in the same run.

    python -m bench.checkpoint_memory [--params 25000000]

Each way runs in a fresh process: a model of ``--params`` fp32 parameters (one flat buffer, as
a model's parameters are views of) with AdamW's state after one step and a public copy, as a
25M text node holds; the peak resident memory (VmHWM) is reset (``/proc/self/clear_refs``),
then the node's capture (model, optimizer and public copy copied to the CPU, as
``StateKeeper.capture`` in node/daemon/statedir.py does) and the write run, and the rise of the
peak over the resident memory before them is read, in units of the model's fp32 size M.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

PROBE = """
import copy, json, sys, tempfile
from pathlib import Path
import torch
from safetensors.torch import save
from node.daemon.checkpoint import Checkpoint, _checksum, _flatten_optimizer, atomic_write, \\
    save_checkpoint

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(key)

way, numel = sys.argv[1], int(sys.argv[2])
torch.set_num_threads(1)
flat = torch.zeros(numel)
params = [torch.nn.Parameter(flat[i : i + numel // 4]) for i in range(0, numel, numel // 4)]
opt = torch.optim.AdamW(params, lr=1e-3)
for p in params:
    p.grad = torch.randn_like(p)
opt.step()
for p in params:
    p.grad = None
public = torch.randn(numel)
path = Path(tempfile.mkdtemp()) / "ckpt.safetensors"
open("/proc/self/clear_refs", "w").write("5")  # the peak starts again from here
before = status("VmRSS")
model = {f"p{i}": p.detach().to("cpu", copy=True) for i, p in enumerate(params)}
ckpt = Checkpoint(model, public.to("cpu", copy=True), copy.deepcopy(opt.state_dict()), {"step": 1})
captured = status("VmHWM") - before
if way == "streamed":
    save_checkpoint(path, ckpt)
else:  # murmur's writer before: a clone of each tensor, then safetensors builds the file
    tensors = {k: v.detach().cpu().clone().contiguous() for k, v in ckpt.model.items()}
    tensors["murmur.public_copy"] = ckpt.public.detach().cpu().clone()
    optim, rest = _flatten_optimizer(ckpt.optimizer)
    tensors.update({k: v.detach().cpu().clone() for k, v in optim.items()})
    meta = {"murmur": json.dumps(dict(ckpt.meta)), "murmur.optimizer": json.dumps(rest)}
    meta["murmur.checksum"] = _checksum(tensors, meta)
    atomic_write(path, save(tensors, metadata=meta))
print(json.dumps({"capture": captured, "peak": status("VmHWM") - before,
                  "file": path.stat().st_size}))
"""


def probe(way: str, numel: int) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, way, str(numel)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"the {way} probe failed:\n{done.stderr}")
    result: dict[str, int] = json.loads(done.stdout)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=25_000_000)
    args = parser.parse_args()
    m = args.params * 4
    print(f"model M = {m / 2**20:.0f} MiB; rise of the peak RSS over the RSS before, in M")
    print("| writer | capture | capture + write | file |")
    print("|---|---:|---:|---:|")
    for way in ("safetensors save (before)", "streamed"):
        got = probe("streamed" if way == "streamed" else "before", args.params)
        print(
            f"| {way} | {got['capture'] / m:.2f} | {got['peak'] / m:.2f} | {got['file'] / m:.2f} |"
        )


if __name__ == "__main__":
    main()
