"""The CUDA path on a real model: one prepared script for a machine with a GPU.

    .venv/bin/python -m bench.cuda_check [--task text:size=10m] [--steps 60]
        [--codecs fp32,fp16,int8,int4,sign] [--out DIR]

On a machine with CUDA it checks, for every codec:

1. *Decoding is device-independent.* A sender's ``GossipState`` on CUDA makes 50 rounds of
   deltas of the task's model (x moves by random steps between rounds); one replica on CUDA and
   one on the CPU apply the same payloads. Both must equal the sender's public copy x̂ to the
   bit, after every round.
2. *Nodes on CUDA and on the CPU stay bit-identical.* Three real ``Node``s over the in-memory
   transport, two on CUDA and one on the CPU, train ``--steps`` steps of the task and gossip; at
   a quiet moment (same sequence number) every replica of every node equals its sender's x̂ to
   the bit: the CUDA nodes' replicas of each other, the CPU node's replicas of the CUDA nodes
   (deltas quantized on the GPU, decoded on the CPU), and the CUDA nodes' replicas of the CPU node.
3. *Step rate on the device*: each node's local steps per second in that run (the CUDA nodes
   against the CPU node of the same run).
4. *Codec throughput on the device*: encode (quantize on the GPU, bytes to the host) and
   decode (bytes to the GPU, dequantize) of the task's parameter vector, against a plain
   ``x.clone()`` on the GPU (bench/codec_throughput.py's method).

It writes ``cuda_check.json`` and ``cuda_check.md`` into ``--out`` (default ``$OUT`` if set,
else the current folder) and exits 1 if a bit-identity check fails. Without CUDA it says what
it would check and exits 0. ``--device cpu`` runs everything with the CPU in the GPU's place
(to check the script itself on a machine without one).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.replicas import GossipState

TASK = "text:size=10m,seq_len=128,batch_size=16,eval_windows=8"
CODECS = "fp32,fp16,int8,int4,sign"


def plan() -> str:
    doc = __doc__ or ""
    return doc[doc.index("On a machine") : doc.index("It writes")].strip()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_s(fn: Callable[[], object], device: torch.device, repeat: int = 5) -> float:
    fn()
    _sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _model_vector(task_spec: str) -> torch.Tensor:
    from node.daemon.flat import FlatParams
    from node.tasks import Shard, load_task

    torch.manual_seed(0)
    return FlatParams(load_task(task_spec)(Shard()).model).flat.detach().clone()


def decode_check(codec_name: str, x0: torch.Tensor, gpu: torch.device) -> dict[str, Any]:
    """Rounds from a sender on ``gpu``; replicas on ``gpu`` and on the CPU apply the same."""
    codec = get_codec(codec_name, 256)
    clock = ManualClock()
    gen = torch.Generator(device=gpu).manual_seed(1)
    sender = GossipState(x0.to(gpu), codec, clock, gen, session=7)
    receivers = {
        dev: GossipState(x0.to(dev), codec, clock, None, session=1)
        for dev in (gpu, torch.device("cpu"))
    }
    for r in receivers.values():
        r.set_peers(frozenset({"sender"}))
        seq, values = sender.snapshot()
        r.receive_snapshot("sender", 7, seq, values.to(r.public.device))
    noise = torch.Generator(device=gpu).manual_seed(2)
    x = x0.to(gpu).clone()
    mismatches = 0
    for _ in range(50):
        x += 1e-3 * torch.randn(x.shape, generator=noise, device=gpu)
        seq, payload = sender.make_delta(x)
        for r in receivers.values():
            r.receive_delta("sender", 7, seq, payload)
            if not torch.equal(r.replicas["sender"].value.cpu(), sender.public.cpu()):
                mismatches += 1
    return {"rounds": 50, "mismatches": mismatches}


async def swarm_check(
    codec: str, task: str, steps: int, gpu: torch.device, workdir: Path
) -> dict[str, Any]:
    from node.config import GossipConfig, NodeConfig
    from node.daemon.node import Node
    from node.daemon.trainer import TrainerConfig
    from node.transport.memory import MemoryNetwork, MemoryTransport

    network = MemoryNetwork()
    devices = [str(gpu), str(gpu), "cpu"]
    nodes: list[Node] = []
    started = time.perf_counter()
    try:
        for i, device in enumerate(devices):
            cfg = NodeConfig(
                listen="mem:0",
                state_dir=workdir / f"{codec}-{i}",
                device=device,
                task=task,
                shard_index=i,
                shard_count=len(devices),
                wait_members=len(devices),
                join=(nodes[0].address,) if nodes else (),
                insecure=True,
                trainer=TrainerConfig(steps=steps, eval_every=steps),
                gossip=GossipConfig(codec=codec, idle_round_interval_s=0.05),
            )
            node = await Node.create(cfg, transport=MemoryTransport(network))
            nodes.append(node)
            await node.start()
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, 1800)
        rates = [n.trainer.samples_per_s / n.task.batch_size for n in nodes]

        def identical(receiver: Node, sender: Node) -> bool:
            replica = receiver.state.replicas.get(sender.node_id)
            return (
                replica is not None
                and replica.seq == sender.state.seq
                and torch.equal(replica.value.cpu(), sender.state.public.cpu())
            )

        result: dict[str, bool] = {}
        for r, receiver in enumerate(nodes):
            for s, sender in enumerate(nodes):
                if r == s:
                    continue
                key = f"node {r} ({receiver.device}) holds node {s} ({sender.device})'s x̂"
                try:
                    await receiver.wait_until(partial(identical, receiver, sender), 60)
                    result[key] = True
                except TimeoutError:
                    result[key] = False
    finally:
        for n in nodes:
            await n.stop(grace_s=0)
    return {
        "identical": result,
        "steps_per_s": {
            f"node {i} ({d})": r for i, (d, r) in enumerate(zip(devices, rates, strict=True))
        },
        "wall_s": time.perf_counter() - started,
    }


def throughput(x0: torch.Tensor, gpu: torch.device, codecs: list[str]) -> dict[str, Any]:
    x = x0.to(gpu)
    gen = torch.Generator(device=gpu).manual_seed(0)
    copy_s = median_s(x.clone, gpu)
    out: dict[str, Any] = {"numel": x.numel(), "copy_ms": 1e3 * copy_s}
    for name in codecs:
        codec = get_codec(name, 256)
        enc = codec.encode(x, gen)
        encode_s = median_s(partial(codec.compress, x, gen), gpu)
        decode_s = median_s(partial(codec.decode, enc, gpu), gpu)
        out[name] = {
            "bytes_vs_fp32": enc.nbytes / (4 * x.numel()),
            "encode_ms": 1e3 * encode_s,
            "decode_ms": 1e3 * decode_s,
            "encode_GBps_of_fp32": 4 * x.numel() / encode_s / 1e9,
            "decode_GBps_of_fp32": 4 * x.numel() / decode_s / 1e9,
        }
    return out


def markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# CUDA check: {report['device_name']}, task {report['task']}, torch {report['torch']}",
        "",
        "| codec | decode on GPU and CPU: mismatching rounds | swarm replicas bit-identical |",
        "|---|---:|---|",
    ]
    for codec, r in report["codecs"].items():
        ok = all(r["swarm"]["identical"].values())
        lines.append(f"| {codec} | {r['decode']['mismatches']} of {r['decode']['rounds']} | {ok} |")
    lines += ["", "| codec | steps/s by node |", "|---|---|"]
    for codec, r in report["codecs"].items():
        rates = ", ".join(f"{k}: {v:.2f}" for k, v in r["swarm"]["steps_per_s"].items())
        lines.append(f"| {codec} | {rates} |")
    t = report["throughput"]
    lines += [
        "",
        f"Codec throughput on the device, {t['numel']:,} values; x.clone() {t['copy_ms']:.2f} ms",
        "",
        "| codec | bytes vs fp32 | encode ms | decode ms |",
        "|---|---:|---:|---:|",
    ]
    for name, c in t.items():
        if isinstance(c, dict):
            cells = f"{c['bytes_vs_fp32']:.3f} | {c['encode_ms']:.2f} | {c['decode_ms']:.2f}"
            lines.append(f"| {name} | {cells} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--codecs", default=CODECS)
    parser.add_argument("--device", default="cuda", help="cpu: check the script without a GPU")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = parser.parse_args(argv)
    gpu = torch.device(args.device)
    if gpu.type == "cuda" and not torch.cuda.is_available():
        print("bench/cuda_check: no CUDA device here, so nothing was run. On a machine with one:")
        print(plan())
        return 0
    codecs = args.codecs.split(",")
    x0 = _model_vector(args.task)
    report: dict[str, Any] = {
        "task": args.task,
        "torch": torch.__version__,
        "device_name": torch.cuda.get_device_name(gpu) if gpu.type == "cuda" else "cpu",
        "codecs": {},
    }
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        for codec in codecs:
            decode = decode_check(codec, x0, gpu)
            swarm = asyncio.run(swarm_check(codec, args.task, args.steps, gpu, Path(tmp)))
            report["codecs"][codec] = {"decode": decode, "swarm": swarm}
            print(f"{codec}: decode {decode}, swarm {swarm}", flush=True)
    report["throughput"] = throughput(x0, gpu, codecs)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cuda_check.json").write_text(json.dumps(report, indent=1))
    text = markdown(report)
    (args.out / "cuda_check.md").write_text(text)
    print(text)
    failed = [
        c
        for c, r in report["codecs"].items()
        if r["decode"]["mismatches"] or not all(r["swarm"]["identical"].values())
    ]
    if failed:
        print(f"bit-identity FAILED for {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
