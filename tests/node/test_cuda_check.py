"""bench/cuda_check.py: without CUDA it says what it would check and exits 0; with the CPU in
the GPU's place it runs every check (the e2e stage, as it trains real nodes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch


@pytest.mark.skipif(torch.cuda.is_available(), reason="this is the path of a machine without CUDA")
def test_without_cuda_it_says_what_it_would_check_and_exits_0(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.cuda_check", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "no CUDA device here, so nothing was run" in done.stdout
    for check in ("Decoding is device-independent", "bit-identical", "Step rate", "throughput"):
        assert check in done.stdout
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_every_check_runs_with_the_cpu_in_the_gpus_place(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.cuda_check",
            "--device",
            "cpu",
            "--task",
            "text:seq_len=32,batch_size=4,eval_windows=4",
            "--steps",
            "10",
            "--codecs",
            "int4,sign",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=580,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "cuda_check.json").read_text())
    for codec in ("int4", "sign"):
        r = report["codecs"][codec]
        assert r["decode"] == {"rounds": 50, "mismatches": 0}
        assert len(r["swarm"]["identical"]) == 6  # every ordered pair of three nodes
        assert all(r["swarm"]["identical"].values())
        assert all(rate > 0 for rate in r["swarm"]["steps_per_s"].values())
    assert report["throughput"]["sign"]["bytes_vs_fp32"] < 0.04
    assert (tmp_path / "cuda_check.md").read_text().startswith("# CUDA check")
