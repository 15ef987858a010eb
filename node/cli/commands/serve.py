"""How ``murmur run`` keeps a node: start it, say on stdout when it is up and when it has
trained, stop it on a signal at any moment, and choose the exit code."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
from typing import TYPE_CHECKING, Any

from node.cli.commands.shared import fail

if TYPE_CHECKING:
    from node.config import NodeConfig

__all__ = ["serve"]

log = logging.getLogger("murmur")


async def serve(cfg: NodeConfig) -> int:
    """Run the node until a signal; a signal at any moment (loading, joining, waiting for
    members, pulling the model, training, writing a checkpoint) stops it within moments.

    Exit codes: 0 after a clean stop, 1 when the node failed while running, 2 when it could not
    start (no device, task or certificate; refused by the swarm; nobody answered).
    """
    from node.daemon.node import JoinError, Node

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if stop.is_set():
            log.warning("%s again: already stopping", sig.name)
        else:
            log.info("%s: stopping", sig.name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    stopped = asyncio.create_task(stop.wait())

    async def until_stopped(work: asyncio.Task[Any]) -> bool:
        """Wait for ``work`` or a signal; on a signal cancel ``work``. True if it finished."""
        await asyncio.wait({work, stopped}, return_when=asyncio.FIRST_COMPLETED)
        if work.done():
            return True
        work.cancel()
        await asyncio.gather(work, return_exceptions=True)
        return False

    creating = asyncio.create_task(Node.create(cfg))
    try:
        if not await until_stopped(creating):
            return 0
        node = creating.result()
    except (ValueError, OSError) as err:  # no device, task or certificate to be had
        return fail("run", err)
    # SIGUSR1 pauses the node by hand and SIGUSR2 ends that pause, as `murmur ctl` does.
    by_hand: set[asyncio.Task[Any]] = set()

    def on_pause_signal(sig: signal.Signals) -> None:
        action = "pause" if sig is signal.SIGUSR1 else "resume"
        log.info("%s: %s", sig.name, action)
        task = asyncio.create_task(node.control(action))
        by_hand.add(task)
        task.add_done_callback(by_hand.discard)

    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        loop.add_signal_handler(sig, on_pause_signal, sig)
    starting = asyncio.create_task(node.start())
    try:
        if not await until_stopped(starting):
            await node.stop()
            return 0
        starting.result()
    except (JoinError, OSError) as err:
        log.error("%s", err)
        await node.stop()
        return 2
    # One machine-readable line on stdout says the node is up (murmur swarm reads it).
    ready: dict[str, str | int] = {
        "event": "ready",
        "node_id": node.node_id,
        "address": node.address,
    }
    if node.metrics_server is not None:
        ready["metrics_port"] = node.metrics_server.port
    print(json.dumps(ready), flush=True)

    async def announce_trained() -> None:
        await node.training_finished.wait()
        if node.trainer.error is not None:  # it failed (diverged, say): nothing was trained
            return
        ev = node.trainer.last_eval
        print(
            json.dumps(
                {
                    "event": "trained",
                    "step": node.trainer.step,
                    "accuracy": ev.accuracy if ev else None,
                }
            ),
            flush=True,
        )

    announcer = asyncio.create_task(announce_trained())
    failed = asyncio.create_task(node.wait_failed())
    await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
    for t in (stopped, failed, announcer):
        t.cancel()
    await node.stop()
    if node.failure is not None:
        log.error("stopped because of an error: %s", node.failure)
        return 1
    return 0
