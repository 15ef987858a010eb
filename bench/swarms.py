"""Running a swarm of real node processes for the benchmarks."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from node.cli.swarm import NodeProcess, SwarmConfig, node_argv, provision

#: Rewrites node ``index``'s command line (to run it in a network namespace, say).
ArgvHook = Callable[[int, list[str]], list[str]]


async def start_swarm(
    cfg: SwarmConfig,
    workdir: Path,
    together: bool,
    hook: ArgvHook = lambda i, argv: argv,
    start_timeout_s: float = 120.0,
) -> list[NodeProcess]:
    """Start ``cfg.nodes`` processes, joined into one swarm through the first (or each alone)."""
    procs = [NodeProcess(i, workdir / f"node-{i}") for i in range(cfg.nodes)]
    provision(cfg, workdir, [p.state_dir for p in procs])
    wait = None if together else 1
    try:
        first = hook(0, node_argv(cfg, 0, procs[0].state_dir, None, wait))
        await procs[0].start(first, start_timeout_s)
        join = procs[0].address if together else None
        await asyncio.gather(
            *(
                p.start(
                    hook(p.index, node_argv(cfg, p.index, p.state_dir, join, wait)),
                    start_timeout_s,
                )
                for p in procs[1:]
            )
        )
    except BaseException:
        await asyncio.gather(*(p.stop(60) for p in procs))
        raise
    return procs


async def train_to_the_end(
    cfg: SwarmConfig, workdir: Path, together: bool, hook: ArgvHook = lambda i, argv: argv
) -> list[dict[str, Any]]:
    """Start the swarm, wait until every node has spent its step budget, stop them, and return
    their summaries."""
    procs = await start_swarm(cfg, workdir, together, hook)
    try:
        # Each node says on stdout when its budget is spent.
        await asyncio.gather(*(p.trained.wait() for p in procs))
    finally:
        await asyncio.gather(*(p.stop(60) for p in procs))
    return [json.loads((p.state_dir / "summary.json").read_text()) for p in procs]
