"""Running one simulated swarm in a child process of its own, for clean memory figures."""

from __future__ import annotations

import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict
from typing import Any

import torch

from node.sim import SimConfig, Simulation


def rss_bytes() -> int:
    """This process's resident set size now (Linux)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_here(cfg: SimConfig) -> dict[str, Any]:
    """Build and run ``cfg``; its summary, the time series and the simulator's own costs."""
    torch.set_num_threads(1)
    Simulation(SimConfig(nodes=2, duration_s=0.1, task=cfg.task))  # imports and caches warm
    before = rss_bytes()
    started = time.perf_counter()
    sim = Simulation(cfg)
    built_s = time.perf_counter() - started
    built = rss_bytes()
    summary = sim.run()
    return {
        "summary": json.loads(summary.to_json()),
        "samples": [asdict(s) for s in sim.samples],
        "build_s": built_s,
        "wall_s": time.perf_counter() - started,
        "rss_per_node": (built - before) / cfg.nodes,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def run_child(module: str, args: list[str], timeout_s: float = 3600) -> dict[str, Any]:
    """``python -m module --one args...`` in a child; it prints one JSON line."""
    out = subprocess.run(
        [sys.executable, "-m", module, "--one", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def first_at_or_below(
    samples: list[dict[str, Any]], key: str, bound: float
) -> dict[str, Any] | None:
    return next((s for s in samples if s["t"] > 0 and s[key] <= bound), None)


def fmt_s(sample: dict[str, Any] | None, rounds: bool = True) -> str:
    if sample is None:
        return "—"
    return (
        f"{sample['t']:.2f} ({sample['rounds_per_node']:.0f})" if rounds else f"{sample['t']:.1f}"
    )


def rounds_to(samples: list[dict[str, Any]], factor: float) -> float | None:
    """Mean rounds per node until the consensus distance fell ``factor`` times from the first
    sample that has one (at time 0 no node trains yet, so there is none); None if it never did."""
    cd0 = next(x["consensus_distance"] for x in samples if math.isfinite(x["consensus_distance"]))
    s = next((x for x in samples if x["consensus_distance"] <= cd0 / factor), None)
    return None if s is None else float(s["rounds_per_node"])
