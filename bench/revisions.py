"""One benchmark run from two checkouts, interleaved, so a change is measured against the code
before it in the same minutes of the same machine.

    python -m bench.revisions --before /tmp/before --after . --repeat 2 -- bench.step_rate --nodes 2

Each checkout runs ``<dir>/.venv/bin/python -m MODULE ARGS...`` in its own directory (so its
own code and its own environment), before, after, before, after, ... ``--repeat`` times each;
every run's output is printed under a heading with its checkout, its commit and its wall time,
and the CPU time the run and its children used, which load on the machine inflates less than
wall time. The benchmarks print their own in-run ratios (gossip on against off, TLS against
plain TCP); comparing those ratios between the checkouts is what says whether a change cost
anything.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import time
from pathlib import Path


def commit(source: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(source), "log", "-1", "--format=%h %s"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip()[:72] or "(not a git checkout)"


def run_once(source: Path, argv: list[str]) -> tuple[str, float]:
    """The output and the wall seconds of one run of ``python -m argv`` in ``source``."""
    python = source / ".venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"{source}: no .venv (run `make venv` there first)")
    started = time.perf_counter()
    proc = subprocess.run(
        [str(python), "-m", *argv], cwd=source, capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{source}: {' '.join(argv)} exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the checkout before")
    parser.add_argument("--after", type=Path, default=Path("."), help="the checkout after")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, interleaved")
    parser.add_argument("bench", nargs=argparse.REMAINDER, help="-- MODULE ARGS...")
    args = parser.parse_args()
    bench = [a for a in args.bench if a != "--"] if args.bench[:1] == ["--"] else args.bench
    if not bench:  # argparse keeps the "--" in the remainder
        parser.error("name the benchmark after --, for example -- bench.step_rate --nodes 2")
    sources = {"before": args.before.resolve(), "after": args.after.resolve()}
    for label, source in sources.items():
        print(f"{label}: {source} at {commit(source)}")
    print(f"benchmark: python -m {' '.join(bench)}\n", flush=True)
    for i in range(args.repeat):
        for label, source in sources.items():
            cpu_before = os.times()
            out, wall = run_once(source, bench)
            cpu_after = os.times()
            cpu = (cpu_after.children_user - cpu_before.children_user) + (
                cpu_after.children_system - cpu_before.children_system
            )
            print(f"## {label}, run {i + 1}: {wall:.0f} s wall, {cpu:.0f} s CPU", flush=True)
            print(out.rstrip(), "\n", flush=True)


if __name__ == "__main__":
    main()
