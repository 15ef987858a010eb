"""How long the light commands take to start, and their peak memory: ``murmur --help``,
``status``, ``monitor`` and ``ca``, which need no torch.

    python -m bench.cli_startup                                      # this tree
    python -m bench.cli_startup --source /tmp/before --source .      # an older checkout, and this

Each command runs ``--repeat`` times as ``python -m node ...`` from each source dir (so that
dir's code is what runs), the sources interleaved so that they share the machine's load; the
table gives the median wall time and the median peak resident memory of each, beside two
baselines measured in the same run (an empty interpreter, ``import torch``), and with two
sources the ratios of the second to the first. Absolute times depend on the machine and its
load.
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
    p.add_argument(
        "--source",
        type=Path,
        action="append",
        help="a checkout whose code runs (repeatable; runs interleave, so that all see the "
        "same load; default: this tree)",
    )
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args()
    sources: list[Path] = args.source or [ROOT]
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
            "murmur ca init DIR": [py, "-m", "node", "ca", "init"],
        }
        runs: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for k in range(args.repeat):
            for name, argv in commands.items():
                for i, source in enumerate(sources):
                    if name == "murmur ca init DIR":
                        argv = [*commands[name], str(Path(tmp) / f"ca-{i}-{k}")]
                    runs.setdefault((name, i), []).append(measure(argv, source))
    print(f"{args.repeat} runs each, interleaved (medians); sources:")
    for i, source in enumerate(sources):
        print(f"- [{i}] {source}")
    head = " | ".join(f"[{i}] s | [{i}] MiB" for i in range(len(sources)))
    ratio = " | time [1]/[0] | memory [1]/[0]" if len(sources) == 2 else ""
    print(f"\n| command | {head}{ratio} |")
    print("|---|" + "---:|" * (2 * len(sources) + (2 if ratio else 0)))
    for name in commands:
        cells, medians = [], []
        for i in range(len(sources)):
            t = statistics.median(r[0] for r in runs[(name, i)])
            m = statistics.median(r[1] for r in runs[(name, i)])
            medians.append((t, m))
            cells += [f"{t:.2f}", f"{m:.0f}"]
        if ratio:
            (t0, m0), (t1, m1) = medians
            cells += [f"{t1 / t0:.2f}", f"{m1 / m0:.2f}"]
        print(f"| `{name}` | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
