"""The synchronous baseline users would pick instead of gossip: data-parallel SGD with all-reduce.

Each worker is one process training the same task on the same shard a murmur node of that index
would (same seed, same initial model, same batch order), wrapped in torch's
DistributedDataParallel over gloo: every step all-reduces full-precision gradients, so every step
waits for the slowest worker. The same device emulation as the node applies (``step_time``: a
step takes at least this long; ``slowdowns``: a worker X times slower, by waiting after its step).

Every worker evaluates its model (all hold the same one) every ``eval_every`` steps, as every
murmur node does, and writes a JSON summary. :func:`run_allreduce` starts the workers (optionally
each under a command prefix, such as ``ip netns exec``) and collects the summaries.

    python -m bench.allreduce --world 4 --steps 300        # a quick run on loopback
    python -m bench.allreduce worker --rank 0 --world 4 ... # one worker, as run_allreduce does
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

__all__ = ["AllReduceConfig", "reap", "run_allreduce"]


@dataclass(frozen=True)
class AllReduceConfig:
    world: int = 8
    steps: int = 600
    task: str = "digits"
    alpha: float | None = 0.5
    seed: int = 0
    eval_every: int = 100
    #: Emulated device pace, as ``murmur run --step-time``.
    step_time: float = 0.0
    #: rank -> how many times slower it steps, as ``murmur run --slowdown``.
    slowdowns: Mapping[int, float] = field(default_factory=dict)
    #: Stop every worker once the model reaches this value of the task's metric: an accuracy,
    #: or an eval loss to get below for a task judged by its loss (None: spend the budget).
    target: float | None = None
    #: Stop every worker at the first evaluation after this many seconds of training.
    limit_s: float | None = None


def worker_argv(cfg: AllReduceConfig, rank: int, master: str, out: Path) -> list[str]:
    argv = [
        sys.executable,
        "-m",
        "bench.allreduce",
        "worker",
        "--rank",
        str(rank),
        "--world",
        str(cfg.world),
        "--master",
        master,
        "--out",
        str(out),
        "--task",
        cfg.task,
        "--seed",
        str(cfg.seed),
        "--steps",
        str(cfg.steps),
        "--eval-every",
        str(cfg.eval_every),
        "--step-time",
        str(cfg.step_time),
        "--slowdown",
        str(cfg.slowdowns.get(rank, 1.0)),
    ]
    if cfg.alpha is not None:
        argv += ["--alpha", str(cfg.alpha)]
    if cfg.target is not None:
        argv += ["--target", str(cfg.target)]
    if cfg.limit_s is not None:
        argv += ["--limit", str(cfg.limit_s)]
    return argv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _open_logs(workdir: Path, world: int) -> list[IO[bytes]]:
    workdir.mkdir(parents=True, exist_ok=True)
    return [open(workdir / f"allreduce-{r}.log", "wb") for r in range(world)]


async def reap(procs: list[asyncio.subprocess.Process], logs: list[IO[bytes]]) -> None:
    """Kill whichever of ``procs`` still runs, wait for it, and close ``logs``."""
    for p in procs:
        if p.returncode is None:
            p.kill()
            await p.wait()
    for f in logs:
        f.close()


async def run_allreduce(
    cfg: AllReduceConfig,
    workdir: Path,
    master: str | None = None,
    prefix: Callable[[int], list[str]] = lambda rank: [],
    env: Callable[[int], Mapping[str, str]] = lambda rank: {"GLOO_SOCKET_IFNAME": "lo"},
    timeout_s: float = 1800.0,
) -> list[dict[str, Any]]:
    """Start ``cfg.world`` workers, wait for all of them, and return their summaries by rank.

    Args:
        master: host:port where rank 0 listens for the others (default: a free loopback port).
        prefix: a command to run each rank's worker under (e.g. ``ip netns exec ns-3``).
        env: extra environment per rank (gloo needs to know which interface to use).
    """
    master = master or f"127.0.0.1:{free_port()}"
    procs: list[asyncio.subprocess.Process] = []
    logs = _open_logs(workdir, cfg.world)
    try:
        for rank in range(cfg.world):
            out = workdir / f"allreduce-{rank}.json"
            procs.append(
                await asyncio.create_subprocess_exec(
                    *prefix(rank),
                    *worker_argv(cfg, rank, master, out),
                    stdout=logs[rank],
                    stderr=logs[rank],
                    env={**os.environ, "PYTHONPATH": os.getcwd(), **env(rank)},
                )
            )
        async with asyncio.timeout(timeout_s):
            codes = await asyncio.gather(*(p.wait() for p in procs))
    finally:
        await reap(procs, logs)
    if any(codes):
        tails = "\n".join(
            f"--- rank {r} (exit {c}) ---\n"
            + (workdir / f"allreduce-{r}.log").read_text(errors="replace")[-2000:]
            for r, c in enumerate(codes)
            if c
        )
        raise RuntimeError(f"all-reduce workers failed:\n{tails}")
    return [json.loads((workdir / f"allreduce-{r}.json").read_text()) for r in range(cfg.world)]


def _worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from node.daemon.trainer import TrainerConfig
    from node.daemon.trainer import batches as endless_batches
    from node.tasks import Shard, load_task
    from node.tasks.base import evaluate_task

    torch.set_num_threads(1)
    pace = TrainerConfig(step_time=args.step_time, slowdown=args.slowdown)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{args.master}",
        rank=args.rank,
        world_size=args.world,
        timeout=timedelta(seconds=300),
    )
    torch.manual_seed(args.seed)  # the same initial model as every murmur node
    task = load_task(args.task)(Shard(args.rank, args.world, args.alpha, args.seed))
    model = DistributedDataParallel(task.model)
    optimizer = task.make_optimizer()
    schedule = task.make_schedule(optimizer, args.steps)  # as a murmur node's trainer makes it
    # The batch order a murmur node with this shard index would draw.
    batches = endless_batches(task, torch.device("cpu"), args.seed * 1_000_003 + args.rank)
    numel = sum(p.numel() for p in task.model.parameters())
    evals: list[dict[str, float | None]] = []
    samples = 0
    dist.barrier()
    started = time.perf_counter()
    step = 0
    stop = torch.zeros(1)
    while step < args.steps:
        began = time.perf_counter()
        inputs, targets = next(batches)
        optimizer.zero_grad(set_to_none=True)
        task.loss(model(inputs), targets).backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        if schedule is not None:
            schedule.step()
        step += 1
        samples += len(targets)
        wait = pace.wait_after(time.perf_counter() - began)
        if wait > 0:
            time.sleep(wait)
        if step % args.eval_every == 0 or step == args.steps:
            loss, acc = evaluate_task(task, torch.device("cpu"))
            evals.append(
                {
                    "t": time.perf_counter() - started,
                    "step": step,
                    "accuracy": acc if acc == acc else None,  # NaN: judged by its loss
                    "loss": loss,
                }
            )
            value = acc if task.metric == "accuracy" else loss
            reached = args.target is not None and (
                value >= args.target if task.metric == "accuracy" else value <= args.target
            )
            late = args.limit is not None and evals[-1]["t"] > args.limit
            # All must stop at the same step or the next all-reduce waits forever: agree.
            stop.fill_(float(reached or late))
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                break
    elapsed = time.perf_counter() - started
    dist.barrier()
    dist.destroy_process_group()
    Path(args.out).write_text(
        json.dumps(
            {
                "rank": args.rank,
                "steps": step,
                "samples": samples,
                "train_s": elapsed,
                "samples_per_s": samples / elapsed,
                "parameters": numel,
                "metric": task.metric,
                # Ring all-reduce sends 2(n-1)/n of the gradient per step from every worker.
                "bytes_sent_model": int(step * 2 * (args.world - 1) / args.world * 4 * numel),
                "evals": evals,
            }
        )
    )


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker")
    w.add_argument("--rank", type=int, required=True)
    w.add_argument("--world", type=int, required=True)
    w.add_argument("--master", required=True)
    w.add_argument("--out", required=True)
    for p in (parser, w):
        p.add_argument("--task", default="digits")
        p.add_argument("--alpha", type=float, default=None)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--steps", type=int, default=600)
        p.add_argument("--eval-every", type=int, default=100)
        p.add_argument("--step-time", type=float, default=0.0)
        p.add_argument("--slowdown", type=float, default=1.0)
        p.add_argument("--target", type=float, default=None)
        p.add_argument("--limit", type=float, default=None)
    parser.add_argument("--world", type=int, default=4)
    return parser.parse_args(argv)


def main(argv: list[str]) -> None:
    args = _parse(argv)
    if args.cmd == "worker":
        _worker(args)
        return
    cfg = AllReduceConfig(
        world=args.world,
        steps=args.steps,
        task=args.task,
        alpha=args.alpha,
        seed=args.seed,
        eval_every=args.eval_every,
        step_time=args.step_time,
        slowdowns={args.world - 1: args.slowdown} if args.slowdown > 1 else {},
        target=args.target,
        limit_s=args.limit,
    )
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        results = asyncio.run(run_allreduce(cfg, Path(tmp)))
    for r in results:
        last = r["evals"][-1]
        judged = (
            f"accuracy {last['accuracy']:.3f}"
            if r["metric"] == "accuracy"
            else f"eval loss {last['loss']:.4f}"
        )
        print(
            f"rank {r['rank']}: {r['steps']} steps, {r['samples_per_s']:.0f} samples/s, "
            f"{judged} at {last['t']:.1f} s"
        )


if __name__ == "__main__":
    main(sys.argv[1:])
