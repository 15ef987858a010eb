"""Regenerate the Python code for protos/murmur.proto (run: ``python -m protos.generate``).

The generated files are committed so that installing murmur needs no protoc; a test regenerates
them into a temporary folder and compares, so a stale copy cannot land.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("protos") / "murmur.proto"
GENERATED = ("murmur_pb2.py", "murmur_pb2.pyi", "murmur_pb2_grpc.py")


def generate(out_root: Path) -> list[Path]:
    """Run protoc on the schema, writing ``<out_root>/protos/*``; returns the written paths."""
    from grpc_tools import protoc  # dev dependency, imported only here

    (out_root / "protos").mkdir(parents=True, exist_ok=True)
    args = [
        "grpc_tools.protoc",
        f"-I{ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        str(ROOT / PROTO),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO}")
    return [out_root / "protos" / name for name in GENERATED]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT, help="root to write protos/ under")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
