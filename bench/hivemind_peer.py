"""One hivemind peer on a murmur task: the decentralized trainer users would pick instead.

Run by bench/slow_links.py's ``hivemind`` system, each peer in its own network namespace, under
the Python of a separate environment that has hivemind (``make hivemind-env``: hivemind pins its
own dependencies, so it is kept out of the project's). One peer per shard of the task, as a
murmur node of that index would train it (same shard, initial model and batch order), wrapped in
``hivemind.Optimizer`` as hivemind's quick start does: each peer steps its own optimizer after
every batch (``use_local_updates``) and the peers average their parameters and optimizer state
each time the swarm has seen ``--target-batch`` samples, compressed to 8 bits.

Rank 0 starts the DHT and writes its addresses to ``--addresses``; the others join through
them. A peer writes ``<out>.ready`` (a wall-clock time) after its first step, evaluates its own
model every ``--eval-s`` seconds and trains until ``<out>.stop`` exists (or ``--limit`` seconds
pass), then writes its evaluations and counts to ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from bench.allreduce import reap

if TYPE_CHECKING:
    from bench.testnet import Testnet

#: Where ``make hivemind-env`` puts the environment with hivemind.
PYTHON = Path(".venv-hivemind/bin/python")


def _parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rank", type=int, required=True)
    p.add_argument("--world", type=int, required=True)
    p.add_argument("--host", required=True, help="this peer's address")
    p.add_argument("--addresses", type=Path, required=True, help="rank 0's multiaddrs, a file")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--task", default="bench.wide_task:make_task")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target-batch", type=int, default=4096)
    p.add_argument("--matchmaking", type=float, default=3.0, help="seconds, hivemind's default 15")
    p.add_argument("--eval-s", type=float, default=1.0)
    p.add_argument("--limit", type=float, default=600.0)
    return p.parse_args()


def main() -> None:
    args = _parse()
    import hivemind
    import torch
    from hivemind.compression import Uniform8BitQuantization

    from node.daemon.local_sgd import batches
    from node.tasks import Shard, load_task
    from node.tasks.base import evaluate_task

    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # the same initial model as every murmur node
    task = load_task(args.task)(Shard(args.rank, args.world, args.alpha, args.seed))
    initial: list[str] = []
    if args.rank > 0:
        while not args.addresses.exists():  # rank 0 writes it once its DHT listens
            time.sleep(0.1)
        initial = json.loads(args.addresses.read_text())
    dht = hivemind.DHT(host_maddrs=[f"/ip4/{args.host}/tcp/0"], initial_peers=initial, start=True)
    if args.rank == 0:
        tmp = args.addresses.with_suffix(".tmp")
        tmp.write_text(json.dumps([str(a) for a in dht.get_visible_maddrs()]))
        tmp.replace(args.addresses)
    made = task.make_optimizer()
    eight_bit = Uniform8BitQuantization()
    opt = hivemind.Optimizer(
        dht=dht,
        run_id="murmur-bench",
        params=task.model.parameters(),
        optimizer=lambda params: type(made)(params, **made.defaults),
        target_batch_size=args.target_batch,
        batch_size_per_step=task.batch_size,
        use_local_updates=True,
        matchmaking_time=args.matchmaking,
        averaging_timeout=10.0,
        grad_compression=eight_bit,
        state_averaging_compression=eight_bit,
        verbose=False,
    )
    draws = batches(task, torch.device("cpu"), args.seed * 1_000_003 + args.rank)
    stop = args.out.with_suffix(".stop")
    evals: list[dict[str, float]] = []
    steps, started, last_eval = 0, time.time(), 0.0
    while not stop.exists() and time.time() - started < args.limit:
        inputs, targets = next(draws)
        opt.zero_grad()
        task.loss(task.model(inputs), targets).backward()  # type: ignore[no-untyped-call]
        opt.step()
        steps += 1
        if steps == 1:
            args.out.with_suffix(".ready").write_text(str(time.time()))
        if time.time() - last_eval >= args.eval_s:
            last_eval = time.time()
            loss, acc = evaluate_task(task, torch.device("cpu"))
            evals.append({"t": last_eval, "accuracy": acc, "loss": loss, "epoch": opt.local_epoch})
    args.out.write_text(
        json.dumps({"rank": args.rank, "steps": steps, "epoch": opt.local_epoch, "evals": evals})
    )
    opt.shutdown()
    dht.shutdown()


def worst_target_s(runs: list[dict[str, Any]], target: float, t0: float) -> float | None:
    """Seconds from ``t0`` until every peer's latest evaluation was at ``target`` or above."""
    events = sorted((e["t"], r["rank"], e["accuracy"]) for r in runs for e in r["evals"])
    latest: dict[int, float] = {}
    for t, rank, acc in events:
        latest[rank] = acc
        if t >= t0 and len(latest) == len(runs) and min(latest.values()) >= target:
            return float(t - t0)
    return None


def _prepare(python: Path, workdir: Path, n: int) -> tuple[list[Path], list[IO[bytes]]]:
    """The peers' result paths and open logs; says how to make the environment if it is missing."""
    if not python.exists():
        raise SystemExit(f"{python} is missing: make hivemind-env makes it")
    workdir.mkdir(parents=True, exist_ok=True)
    outs = [workdir / f"peer-{i}.json" for i in range(n)]
    return outs, [open(workdir / f"peer-{i}.log", "wb") for i in range(n)]


def _wait_ready(outs: list[Path], limit_s: float) -> None:
    """Until every peer made its first step (it writes ``<out>.ready``): polled, as a file is."""
    ready = [o.with_suffix(".ready") for o in outs]
    deadline = time.monotonic() + limit_s
    while not all(r.exists() for r in ready):
        if time.monotonic() > deadline:
            raise TimeoutError(f"hivemind peers not all training after {limit_s:.0f} s")
        time.sleep(0.2)


async def run_hivemind(
    net: Testnet,
    target_batch: int,
    target: float,
    window_s: float,
    limit_s: float,
    workdir: Path,
    python: Path = PYTHON,
) -> dict[str, Any]:
    """Run one hivemind peer a namespace of ``net`` for ``window_s`` seconds from the moment all
    of them train; returns the figures bench/slow_links.py reports for a murmur system."""
    outs, logs = _prepare(python, workdir, net.n)
    before = [net.sent_bytes(i) for i in range(net.n)]
    procs = [
        await asyncio.create_subprocess_exec(
            *net.exec_argv(i),
            str(python),
            "-m",
            "bench.hivemind_peer",
            *("--rank", str(i), "--world", str(net.n), "--host", net.address(i)),
            *("--addresses", str(workdir / "addresses.json"), "--out", str(outs[i])),
            *("--target-batch", str(target_batch), "--limit", str(limit_s + window_s)),
            stdout=logs[i],
            stderr=logs[i],
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for i in range(net.n)
    ]
    window: dict[str, Any] = {}
    try:
        await asyncio.to_thread(_wait_ready, outs, limit_s)
        t0 = time.time()
        wire0 = [net.sent_bytes(i) for i in range(net.n)]
        await asyncio.sleep(window_s)  # the window is a span of time, not an event
        window["wire_bytes"] = sum(net.sent_bytes(i) - wire0[i] for i in range(net.n)) / net.n
        for o in outs:
            o.with_suffix(".stop").touch()
        async with asyncio.timeout(120):
            codes = await asyncio.gather(*(p.wait() for p in procs))
    finally:
        await reap(procs, logs)
    if not all(o.exists() for o in outs):
        raise RuntimeError(f"hivemind peers exited {codes} without results: see {workdir}")
    runs = [json.loads(o.read_text()) for o in outs]
    last = [r["evals"][-1]["accuracy"] for r in runs]
    reached = worst_target_s(runs, target, t0)
    if reached is not None:
        window["worst_target_s"] = reached
    window.update(worst=min(last), acc=sum(last) / len(last), distance=float("nan"))
    return {
        "reached_s": reached,
        "accuracy": min(last),
        "steps": sum(r["steps"] for r in runs) / net.n,
        "rounds": sum(r["epoch"] for r in runs) / net.n,
        "node_bytes": float("nan"),
        "wire_bytes": sum(net.sent_bytes(i) - before[i] for i in range(net.n)) / net.n,
        "curve": [(round(e["t"] - t0, 1), round(e["accuracy"], 4)) for e in runs[0]["evals"]],
        "window": window,
    }


if __name__ == "__main__":
    main()
