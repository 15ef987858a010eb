"""The upload cap (node/daemon/pacing.py) on virtual time: links that share one pacer send, all
together, no more than the models' share of the cap over any window of a second and more, and
as much as it allows when they have more to send."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from gossip.clock import ManualClock
from node.cli.swarm import SwarmConfig, node_argv
from node.config import GossipConfig
from node.daemon.pacing import (
    BURST_S,
    MEMBERSHIP_SHARE,
    MIN_UPLOAD_RATE,
    WIRE_OVERHEAD,
    UploadPacer,
)
from node.settings_sources import SettingsError, load_settings
from node.sim import SimConfig, Simulation
from tests.vtime import runtime, virtual, virtual_now

RATE = 200_000.0
WINDOWS_S = (1.0, 2.0, 5.0)


def most_in_any_window(sends: list[tuple[float, int]], window_s: float) -> int:
    """The most bytes sent within any ``window_s`` (a window starting at each send)."""
    return max(sum(n for at, n in sends if start <= at < start + window_s) for start, _ in sends)


@virtual
async def test_links_sharing_a_pacer_keep_under_the_cap_over_every_window() -> None:
    rt = runtime(0)
    pacer = UploadPacer(RATE, rt.clock, rt.sleep)
    sends: list[tuple[float, int]] = []
    draw = random.Random(1)

    async def link(sizes: list[int]) -> None:
        for nbytes in sizes:
            await pacer.take(nbytes)
            sends.append((virtual_now(), nbytes))

    # Three links with more to send than the cap allows: deltas of 5-40 kB.
    await asyncio.gather(*(link([draw.randint(5_000, 40_000) for _ in range(60)]) for _ in "abc"))
    share = RATE * (1 - MEMBERSHIP_SHARE) / WIRE_OVERHEAD
    for window_s in WINDOWS_S:
        # The bucket's burst is all that a window may hold beyond its share.
        assert most_in_any_window(sends, window_s) <= share * (window_s + BURST_S) + 40_000
        assert most_in_any_window(sends, window_s) * WIRE_OVERHEAD <= RATE * (window_s + BURST_S)
    total = sum(n for _, n in sends)
    elapsed = max(at for at, _ in sends)
    assert total / elapsed == pytest.approx(share, rel=0.05)  # and no slower than its share


@virtual
async def test_a_message_bigger_than_the_bucket_waits_for_a_full_one_and_leaves_a_debt() -> None:
    rt = runtime(0)
    pacer = UploadPacer(MIN_UPLOAD_RATE, rt.clock, rt.sleep)
    big = int(pacer.capacity * 4)
    await pacer.take(big)  # the bucket starts full
    began = virtual_now()
    await pacer.take(1_000)
    # The debt of three buckets, then the thousand bytes, at the models' rate.
    assert virtual_now() - began == pytest.approx((big - pacer.capacity + 1_000) / pacer.model_rate)


def test_murmur_swarm_hands_the_cap_to_its_nodes() -> None:
    gossip = GossipConfig(max_upload_rate=250_000)
    argv = node_argv(SwarmConfig(gossip=gossip), 1, Path("state"), None)
    assert argv[argv.index("--max-upload-rate") + 1] == "250000"


def test_a_cap_below_what_membership_needs_is_refused() -> None:
    with pytest.raises(ValueError, match="membership alone needs a few kB/s"):
        UploadPacer(MIN_UPLOAD_RATE - 1, ManualClock(), asyncio.sleep)
    with pytest.raises(SettingsError, match="max-upload-rate"):
        load_settings(
            environ={},
            flags={"gossip.max_upload_rate": "10kB/s"},
            flag_labels={"gossip.max_upload_rate": "--max-upload-rate"},
        )


@pytest.mark.parametrize(
    ("written", "rate"),
    [("200KB/s", 200_000), ("2MiB/s", 2 * 1024 * 1024), ("500kB", 500_000), ("16000", 16_000)],
)
def test_a_rate_is_read_with_its_units(written: str, rate: int) -> None:
    settings = load_settings(environ={}, flags={"gossip.max_upload_rate": written})
    assert settings.gossip.max_upload_rate == rate
    assert load_settings(environ={}).gossip.max_upload_rate is None  # no cap unless asked


def test_the_simulator_holds_a_capped_swarm_under_its_cap_as_the_daemon_does() -> None:
    gossip = GossipConfig(codec="int8")
    base = SimConfig(
        nodes=4, duration_s=20.0, eval_every_s=5.0, target_accuracy=0.75, gossip=gossip
    )
    free = Simulation(base)
    free.run()
    cap = 3.0 * MIN_UPLOAD_RATE  # under half of what the swarm sends uncapped
    cfg = dataclasses.replace(base, gossip=dataclasses.replace(base.gossip, max_upload_rate=cap))
    capped = Simulation(cfg)
    sends: dict[str, list[tuple[float, int]]] = {a: [] for a in capped.nodes}
    send = capped.network.send

    def logged(
        src: str, dst: str, nbytes: int, deliver: Callable[[], None], lossy: bool = True
    ) -> bool:
        sends[src].append((capped.events.now(), nbytes))
        return send(src, dst, nbytes, deliver, lossy)

    capped.network.send = logged  # type: ignore[method-assign]
    summary = capped.run()
    model_rate = cap * (1 - MEMBERSHIP_SHARE) / WIRE_OVERHEAD
    for node in capped.nodes.values():
        # Everything the node put on its uplink, membership included, is under the cap over
        # any window of 5 s (the simulated wire has no framing: the cap's overhead is slack).
        assert most_in_any_window(sends[node.address], 5.0) <= cap * (5.0 + BURST_S)
        # ... and its models used what the cap left them: more to send than it allows.
        assert node.counters.bytes_sent >= 0.8 * model_rate * base.duration_s
        assert node.counters.bytes_sent <= model_rate * (base.duration_s + BURST_S) + 4 * 330
    free_bytes = min(n.counters.bytes_sent for n in free.nodes.values())
    assert free_bytes > 2 * max(n.counters.bytes_sent for n in capped.nodes.values())
    assert summary.target_worst_s is not None  # and the capped swarm still got there
