"""bench/hivemind_peer.py's figures: when every hivemind peer had reached the target, read from
the peers' own evaluations, as bench/slow_links.py reads murmur's nodes at once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench.hivemind_peer import run_hivemind, worst_target_s


def peer(rank: int, *evals: tuple[float, float]) -> dict[str, Any]:
    return {"rank": rank, "evals": [{"t": t, "accuracy": a} for t, a in evals]}


def test_the_time_is_when_the_last_peer_gets_there() -> None:
    runs = [peer(0, (101, 0.5), (103, 0.96)), peer(1, (102, 0.7), (106, 0.97))]
    assert worst_target_s(runs, 0.95, t0=100.0) == 6.0


def test_a_peer_that_falls_back_below_the_target_holds_the_time_back() -> None:
    runs = [peer(0, (101, 0.96), (102, 0.90), (109, 0.96)), peer(1, (104, 0.97))]
    assert worst_target_s(runs, 0.95, t0=100.0) == 9.0


def test_evaluations_before_the_window_count_as_state_not_as_time() -> None:
    runs = [peer(0, (90, 0.96)), peer(1, (95, 0.96), (103, 0.97))]
    assert worst_target_s(runs, 0.95, t0=100.0) == 3.0


def test_none_when_a_peer_never_gets_there() -> None:
    runs = [peer(0, (101, 0.96)), peer(1, (102, 0.94), (110, 0.949))]
    assert worst_target_s(runs, 0.95, t0=100.0) is None


def test_without_the_hivemind_environment_it_says_how_to_make_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-env" / "bin" / "python"
    unused = SimpleNamespace(n=4)  # the network is not reached: the check comes first
    with pytest.raises(SystemExit, match="make hivemind-env"):
        asyncio.run(run_hivemind(unused, 4096, 0.95, 60, 300, tmp_path, missing))  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # and nothing was started or written
