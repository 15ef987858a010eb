"""How long the light commands take to start, and their peak memory: ``murmur --help``,
``status``, ``monitor`` and ``ca``, which need no torch.

    python -m bench.cli_startup                         # this tree
    python -m bench.cli_startup --source /tmp/before    # another checkout (say, an older commit)

Each command runs ``--repeat`` times as ``python -m node ...`` from the source dir (so that dir's
code is what runs); the table gives the median wall time and the median peak resident memory,
beside two baselines measured in the same run: an empty interpreter and ``import torch``. Report
ratios to the baselines: absolute times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(argv: list[str], cwd: Path) -> tuple[float, float]:
    """(seconds, peak MiB) of one run of ``argv``: the child's own rusage (wait4), not the
    running maximum over all children that RUSAGE_CHILDREN gives."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"{argv} exited {proc.returncode}")
    return took, usage.ru_maxrss / 1024


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", type=Path, default=ROOT, help="the checkout whose code runs")
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    py = sys.executable
    with socket.socket() as dead, tempfile.TemporaryDirectory() as tmp:
        dead.bind(("127.0.0.1", 0))  # nothing listens: status fails fast, as against a dead node
        address = f"127.0.0.1:{dead.getsockname()[1]}"
        commands = {
            "python -c pass": [py, "-c", "pass"],
            "python -c 'import torch'": [py, "-c", "import torch"],
            "murmur --help": [py, "-m", "node", "--help"],
            "murmur run --help": [py, "-m", "node", "run", "--help"],
            "murmur status --help": [py, "-m", "node", "status", "--help"],
            "murmur monitor --help": [py, "-m", "node", "monitor", "--help"],
            "murmur ca --help": [py, "-m", "node", "ca", "--help"],
            "murmur status ADDR --insecure (nobody there)": [
                *[py, "-m", "node", "status", address, "--insecure", "--timeout", "0.2"]
            ],
        }
        results: dict[str, tuple[float, float]] = {}
        for name, argv in commands.items():
            runs = []
            for _ in range(args.repeat):
                runs.append(measure(argv, args.source))
            results[name] = (
                statistics.median(t for t, _ in runs),
                statistics.median(m for _, m in runs),
            )
        for k in range(args.repeat):
            ca = Path(tmp) / f"ca-{k}"
            runs.append(measure([py, "-m", "node", "ca", "init", str(ca)], args.source))
        results["murmur ca init DIR"] = (
            statistics.median(t for t, _ in runs[-args.repeat :]),
            statistics.median(m for _, m in runs[-args.repeat :]),
        )
    torch_s = results["python -c 'import torch'"][0]
    print(f"source: {args.source}, {args.repeat} runs each (medians)\n")
    print("| command | seconds | peak RSS (MiB) | time vs `import torch` |")
    print("|---|---:|---:|---:|")
    for name, (seconds, mib) in results.items():
        print(f"| `{name}` | {seconds:.2f} | {mib:.0f} | {seconds / torch_s:.2f} |")


if __name__ == "__main__":
    main()
