"""Memory of a node of the 25M-parameter text task, and of a joiner pulling such a model.

    .venv/bin/python -m bench.text_memory [--nodes 3] [--steps 20]
        [--task text:size=25m,seq_len=64,batch_size=4,eval_windows=4]

Starts ``--nodes`` ``murmur run`` processes on loopback (int8 gossip, exponential graph, so
each has ``nodes - 1`` neighbours up to 4), lets them train ``--steps`` steps and gossip, and
reads every node's peak resident memory (VmHWM) before stopping it. The baseline is a process
that imports the node and builds the same task without training (interpreter, torch, gRPC,
the text corpus, the model): what any process of this task holds. Above it a node keeps, in
units of one fp32 model M: the gradients (1), AdamW's two moments (2), the public copy x̂ (1),
one replica per neighbour (d), and bounded buffers: the trainer's two in-memory finite copies
of model and optimizer for rollback (2 x 3 = 6), the outbox (at most 16 int8 deltas, ~0.27 M
each, shared by the links), activations of one batch and a round's compressed delta. Then a
probe process pulls the model from node 0 as a joiner does (tests/node/pull_probe.py) and
reports how much it grew.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.swarms import start_swarm
from node.cli.swarm import NodeProcess, SwarmConfig
from node.config import GossipConfig

TASK = "text:size=25m,seq_len=64,batch_size=4,eval_windows=4"

BASELINE = """
import json, sys, torch
torch.set_num_threads(1)
import node.daemon.node  # what a node process imports
from node.tasks import Shard, load_task
torch.manual_seed(0)
task = load_task(sys.argv[1])(Shard(0, int(sys.argv[2])))
numel = sum(p.numel() for p in task.model.parameters())
status = open("/proc/self/status").read().split("\\n")
hwm = next(int(x.split()[1]) * 1024 for x in status if x.startswith("VmHWM:"))
print(json.dumps({"numel": numel, "peak_bytes": hwm}))
"""


def status_bytes(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key} for {pid}")


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", BASELINE, args.task, str(args.nodes)],
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def measure(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    base = await asyncio.to_thread(baseline, args)
    cfg = SwarmConfig(
        nodes=args.nodes,
        steps=args.steps,
        task=args.task,
        alpha=None,
        eval_every=args.steps,
        gossip=GossipConfig(codec="int8"),
        insecure=True,
        start_timeout_s=900.0,  # a 25M model's nodes start slowly on a busy machine
    )
    procs: list[NodeProcess] = await start_swarm(cfg, workdir, together=True, start_timeout_s=900)
    try:
        await asyncio.gather(*(p.trained.wait() for p in procs))
        peaks = [status_bytes(p.proc.pid, "VmHWM") for p in procs if p.proc]
        probe = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.node.pull_probe",
            procs[0].address,
            str(base["numel"]),
            stdout=subprocess.PIPE,
        )
        out, _ = await probe.communicate()
        pulled = json.loads(out)
    finally:
        await asyncio.gather(*(p.stop(120) for p in procs))
    summaries = [json.loads((p.state_dir / "summary.json").read_text()) for p in procs]
    return {"baseline": base, "peaks": peaks, "pull": pulled, "summaries": summaries}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--task", default=TASK)
    parser.add_argument("--out", type=Path, default=Path("bench/results/text-memory"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        r = asyncio.run(measure(args, Path(tmp)))
    model = 4 * r["baseline"]["numel"]
    degree = min(args.nodes - 1, 4)
    delta = model * (1 + 4 / 256) / 4  # int8 values and one fp32 scale per 256
    kept = model * (1 + 2 + 1 + degree)  # grads, AdamW moments, x̂, replicas
    buffers = model * 6 + 16 * delta  # two rollback copies of model + optimizer; the outbox
    bound = r["baseline"]["peak_bytes"] + kept + buffers
    grown = r["pull"]["peak_bytes"] - r["pull"]["baseline_bytes"]
    lines = [
        f"{args.task}: {r['baseline']['numel'] / 1e6:.2f}M parameters, M = {model / 2**20:.0f} "
        f"MiB; {args.nodes} nodes ({degree} neighbours each), {args.steps} steps, int8",
        "",
        "| what | MiB | in M |",
        "|---|---:|---:|",
        f"| baseline process (imports, corpus, model) | {r['baseline']['peak_bytes'] / 2**20:.0f} "
        f"| {r['baseline']['peak_bytes'] / model:.2f} |",
        f"| + gradients, AdamW moments, x̂, {degree} replicas | {kept / 2**20:.0f} | "
        f"{kept / model:.2f} |",
        f"| + bounded buffers (rollback copies, outbox of 16 int8 deltas) | {buffers / 2**20:.0f} "
        f"| {buffers / model:.2f} |",
        f"| = the bound | {bound / 2**20:.0f} | {bound / model:.2f} |",
    ]
    for i, peak in enumerate(r["peaks"]):
        above = (peak - r["baseline"]["peak_bytes"]) / model
        lines.append(
            f"| node {i}: measured peak RSS (VmHWM) | {peak / 2**20:.0f} | {peak / model:.2f} "
            f"({100 * peak / bound:.0f}% of the bound; {above:.2f} M above the baseline) |"
        )
    lines.append(
        f"| joiner pulling the model: growth of its RSS | {grown / 2**20:.0f} | "
        f"{grown / model:.2f} |"
    )
    text = "\n".join(lines) + "\n"
    (args.out / "memory.md").write_text(text)
    (args.out / "results.json").write_text(json.dumps(r, indent=1))
    print(text)


if __name__ == "__main__":
    main()
