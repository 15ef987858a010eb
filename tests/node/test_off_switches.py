"""Settings that are off say so (None, ``none`` or ``off`` on the command line), instead of a
number so large that it stands for "never"."""

from __future__ import annotations

import asyncio
from pathlib import Path

from gossip.messages import Hello
from node.daemon.checkpoint import CHECKPOINT_FILE, PREVIOUS_FILE
from node.daemon.node import Node
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, poll

TIMEOUT_S = 60.0


async def lone_node(state_dir: Path, checkpoint_interval_s: float | None) -> Node:
    cfg = config(
        state_dir,
        listen="mem:0",
        checkpoint_interval_s=checkpoint_interval_s,
        **{"trainer.steps": 1_000_000},
    )
    return await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))


async def test_no_checkpoint_interval_writes_only_the_checkpoint_at_the_stop(
    tmp_path: Path,
) -> None:
    ticking = await lone_node(tmp_path / "ticking", 0.02)
    quiet = await lone_node(tmp_path / "quiet", None)
    async with quiet, ticking:

        async def two_written() -> bool:
            return (tmp_path / "ticking" / PREVIOUS_FILE).exists()

        # The same time passed for both: the one with an interval wrote twice meanwhile.
        await poll(two_written, "two periodic checkpoints", TIMEOUT_S)
        assert quiet.trainer.step > 0
        assert not (tmp_path / "quiet" / CHECKPOINT_FILE).exists()
    assert (tmp_path / "quiet" / CHECKPOINT_FILE).exists()  # the final one


async def test_no_wait_timeout_keeps_joining_until_the_seed_answers(tmp_path: Path) -> None:
    hellos_lost = 0
    lose = True

    def drop(caller: str, callee: str, message: object) -> bool:
        nonlocal hellos_lost
        if lose and isinstance(message, Hello):
            hellos_lost += 1
            return True
        return False

    network = MemoryNetwork(drop=drop)
    async with await Node.create(
        config(tmp_path / "seed", listen="mem:0"), transport=MemoryTransport(network)
    ) as seed:
        joiner_cfg = config(
            tmp_path / "joiner", listen="mem:0", join=(seed.address,), wait_timeout_s=None
        )
        joiner = await Node.create(joiner_cfg, transport=MemoryTransport(network))
        joining = asyncio.create_task(joiner.start())
        try:

            async def lost_three() -> bool:
                return hellos_lost >= 3

            # Its hellos are lost (the seed looks down); with no time limit it keeps trying.
            await poll(lost_three, "three lost hellos", TIMEOUT_S)
            assert not joining.done()
            lose = False
            async with asyncio.timeout(TIMEOUT_S):
                await joining
            assert seed.node_id in joiner.peers.view
        finally:
            await joiner.stop()
