"""The round scheduler (node/daemon/rounds.py) over a worker and links of its own: rounds at
least ``local_steps`` apart, one at a time, none while a link is busy, each made one offered;
a trainer held at ``max_local_steps`` until its links take the next round."""

from __future__ import annotations

import asyncio
import random
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest
import torch

from gossip.clock import ManualClock
from gossip.codecs import get_codec
from gossip.messages import Delta
from node.daemon.rounds import Made, RoundScheduler
from node.daemon.signals import Signals
from node.runtime import Runtime
from node.telemetry.events import Counters

TIMEOUT_S = 5.0


class Worker:
    def __init__(self) -> None:
        self.rounds: list[tuple[int, Future[Made | None]]] = []

    def submit_round(self, step: int, ready: frozenset[str]) -> Future[Made | None]:
        fut: Future[Made | None] = Future()
        self.rounds.append((step, fut))
        return fut


@dataclass
class Links:
    busy: bool = False
    offered: list[Made] = field(default_factory=list)

    def pace(self) -> tuple[bool, frozenset[str]]:
        return not self.busy, frozenset()

    def offer(self, delta: Made) -> None:
        self.offered.append(delta)


@dataclass
class Steps:
    step: int = 0
    running: bool = True
    holds: int = 0
    releases: int = 0

    def hold(self) -> None:
        self.holds += 1

    def release(self) -> None:
        self.releases += 1

    def held(self) -> bool:
        assert self.releases <= self.holds <= self.releases + 1  # never held twice over
        return self.holds > self.releases


def delta(seq: int) -> Delta:
    payload = get_codec("fp32").encode(torch.zeros(4))
    return Delta("a" * 32, 1, seq, seq, payload)


async def scheduler(
    local_steps: int, max_local_steps: int | None = None, runtime: Runtime | None = None
) -> tuple[RoundScheduler, Worker, Links, Counters, Signals]:
    worker, links, counters, signals = Worker(), Links(), Counters(), Signals("test")
    signals.bind(asyncio.get_running_loop())
    rounds = RoundScheduler(
        local_steps,
        worker,
        links,
        Steps(),
        counters,
        signals,
        runtime or Runtime.on_loop(),
        max_local_steps,
    )
    return rounds, worker, links, counters, signals


async def after_callbacks() -> None:
    """Until the loop ran what a finished round handed it (the scheduler's callback)."""
    handled = asyncio.Event()
    asyncio.get_running_loop().call_soon_threadsafe(handled.set)
    await asyncio.wait_for(handled.wait(), TIMEOUT_S)


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
    await after_callbacks()  # the scheduler's callback was handed to the loop just above
    assert rounds.try_round(2)  # the round is no longer being made
    assert links.offered == []
    assert counters.rounds == 0
    assert counters.rounds_skipped == (1 if result is None else 0)


def step_to(rounds: RoundScheduler, step: int) -> None:
    """The trainer takes its steps up to ``step``, as its thread would: one, then ask."""
    trainer = rounds.trainer
    assert isinstance(trainer, Steps)
    for s in range(trainer.step + 1, step + 1):
        assert not trainer.held(), f"a held trainer took step {s}"
        trainer.step = s
        rounds.after_step(s)


async def test_a_trainer_at_the_bound_is_held_until_its_links_take_the_next_round() -> None:
    clock = ManualClock(100.0)
    runtime = Runtime(clock, asyncio.sleep, random.Random(0))
    rounds, worker, links, counters, _ = await scheduler(2, max_local_steps=5, runtime=runtime)
    trainer = rounds.trainer
    assert isinstance(trainer, Steps)
    step_to(rounds, 2)
    assert [s for s, _ in worker.rounds] == [2]
    worker.rounds[0][1].set_result(delta(1))
    links.busy = True  # the link carries the round from step 2, and does not finish
    await after_callbacks()
    step_to(rounds, 6)  # rounds are due from step 4 on, but the link is busy
    assert [s for s, _ in worker.rounds] == [2]
    assert not trainer.held()  # 6 - 2 = 4 steps since the last round began: below the bound
    step_to(rounds, 7)  # 7 - 2 = 5 steps since the round at step 2: the bound
    assert trainer.held()
    assert [s for s, _ in worker.rounds] == [2]
    clock.advance(3.0)
    rounds.links_changed()  # still busy: still held
    assert trainer.held()
    links.busy = False
    clock.advance(1.5)
    rounds.links_changed()  # idle: the round the trainer waits for begins, at step 7
    assert [s for s, _ in worker.rounds] == [2, 7]
    assert not trainer.held()
    assert not rounds.holding
    assert counters.held_s == pytest.approx(4.5)
    step_to(rounds, 9)  # the round at step 7 is still being made: due, not held
    assert not trainer.held()


async def test_without_a_bound_a_busy_link_never_holds_the_trainer() -> None:
    rounds, worker, links, counters, _ = await scheduler(1)
    links.busy = True
    rounds.links_changed()
    step_to(rounds, 1_000)
    assert worker.rounds == []
    assert not rounds.holding
    assert counters.held_s == 0.0


async def test_a_round_that_ends_releases_a_trainer_held_by_it() -> None:
    """The bound is reached while the last round is still being made, links idle: its end
    (the links may then be idle) begins the next round and releases the trainer."""
    rounds, worker, _, counters, _ = await scheduler(1, max_local_steps=3)
    trainer = rounds.trainer
    assert isinstance(trainer, Steps)
    step_to(rounds, 1)
    step_to(rounds, 4)  # the round from step 1 is still being made
    assert trainer.held()
    worker.rounds[0][1].set_result(None)  # nothing to send, even
    await after_callbacks()
    assert [s for s, _ in worker.rounds] == [1, 4]
    assert not trainer.held()
    assert counters.rounds_skipped == 1
