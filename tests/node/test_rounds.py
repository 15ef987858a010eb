"""The round scheduler (node/daemon/rounds.py) over a worker and links of its own: rounds at
least ``local_steps`` apart, one at a time, none while a link is busy, each made one offered."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
import torch

from gossip.codecs import get_codec
from gossip.messages import Delta
from node.daemon.rounds import RoundScheduler
from node.daemon.signals import Signals
from node.runtime import Runtime
from node.telemetry.events import Counters

TIMEOUT_S = 5.0


class Worker:
    def __init__(self) -> None:
        self.rounds: list[tuple[int, Future[Delta | None]]] = []

    def submit_round(self, step: int) -> Future[Delta | None]:
        fut: Future[Delta | None] = Future()
        self.rounds.append((step, fut))
        return fut


@dataclass
class Links:
    busy: bool = False
    offered: list[Delta] = field(default_factory=list)

    def offer(self, delta: Delta) -> None:
        self.offered.append(delta)


@dataclass
class Steps:
    step: int = 0
    running: bool = True


def delta(seq: int) -> Delta:
    payload = get_codec("fp32").encode(torch.zeros(4))
    return Delta("a" * 32, 1, seq, seq, payload)


async def scheduler(local_steps: int) -> tuple[RoundScheduler, Worker, Links, Counters, Signals]:
    worker, links, counters, signals = Worker(), Links(), Counters(), Signals("test")
    signals.bind(asyncio.get_running_loop())
    rounds = RoundScheduler(
        local_steps, worker, links, Steps(), counters, signals, Runtime.on_loop()
    )
    return rounds, worker, links, counters, signals


async def test_rounds_are_local_steps_apart_and_one_at_a_time() -> None:
    rounds, worker, links, counters, signals = await scheduler(local_steps=5)
    for step in range(1, 5):
        rounds.after_step(step)
    assert worker.rounds == []
    rounds.after_step(5)
    assert [s for s, _ in worker.rounds] == [5]
    rounds.after_step(10)  # due, but the round at step 5 is still being made
    assert len(worker.rounds) == 1
    made = delta(1)
    worker.rounds[0][1].set_result(made)
    await signals.wait_until(lambda: counters.rounds == 1, TIMEOUT_S)
    assert links.offered == [made]
    rounds.after_step(10)
    assert [s for s, _ in worker.rounds] == [5, 10]


async def test_no_round_starts_while_a_link_is_busy() -> None:
    rounds, worker, links, _, _ = await scheduler(local_steps=1)
    links.busy = True
    rounds.links_changed()
    rounds.after_step(1)
    assert worker.rounds == []
    links.busy = False
    rounds.links_changed()
    rounds.after_step(2)
    assert [s for s, _ in worker.rounds] == [2]


async def test_a_round_that_fails_fails_the_node() -> None:
    rounds, worker, _, counters, signals = await scheduler(local_steps=1)
    rounds.after_step(1)
    worker.rounds[0][1].set_exception(RuntimeError("worker broke"))
    err = await asyncio.wait_for(signals.wait_failed(), TIMEOUT_S)
    assert str(err) == "worker broke"
    assert counters.rounds == 0
    assert rounds.try_round(2)  # the failed round no longer counts as being made


@pytest.mark.parametrize("result", [None, "cancelled"])
async def test_a_round_with_nothing_to_send_offers_nothing(result: str | None) -> None:
    rounds, worker, links, counters, _ = await scheduler(local_steps=1)
    rounds.after_step(1)
    fut = worker.rounds[0][1]
    if result == "cancelled":
        fut.cancel()
    else:
        fut.set_result(None)
    # The scheduler's callback was handed to the loop by the line above; this one comes after.
    handled = asyncio.Event()
    asyncio.get_running_loop().call_soon_threadsafe(handled.set)
    await asyncio.wait_for(handled.wait(), TIMEOUT_S)
    assert rounds.try_round(2)  # the round is no longer being made
    assert links.offered == []
    assert counters.rounds == 0
    assert counters.rounds_skipped == (1 if result is None else 0)
