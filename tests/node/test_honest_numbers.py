"""Honest numbers: one train loss, one eval loss and one eval accuracy, the same in the log,
``murmur status``, MQTT, Prometheus and ``murmur report``; a finished node's accuracy follows
its model; the console's summary, countdowns and no repeated lines (whole nodes, in-process)."""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from node.cli.report import write_report
from node.daemon.node import JoinError, Node
from node.telemetry.mqtt_messages import parse_status, status_payload
from node.telemetry.status import status_to_json
from node.transport.memory import MemoryNetwork, MemoryTransport
from tests.node.helpers import config, memory_swarm
from tests.node.test_metrics import scrape, value
from tests.node.test_report import table

TIMEOUT_S = 60.0


class Lines(logging.Handler):
    """Collects log messages, and wakes a waiter when a condition on them holds (the nodes
    log from the event loop's thread, so the waiter's event can be set right here)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []
        self._waits: list[tuple[Callable[[list[str]], bool], asyncio.Event]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
        for done, event in self._waits:
            if done(self.messages):
                event.set()

    async def wait(self, done: Callable[[list[str]], bool], what: str) -> None:
        event = asyncio.Event()
        self._waits.append((done, event))
        if done(self.messages):
            event.set()
        try:
            await asyncio.wait_for(event.wait(), TIMEOUT_S)
        except TimeoutError:
            raise AssertionError(f"timed out waiting for {what}") from None


@pytest.fixture
def lines() -> Iterator[Lines]:
    handler = Lines()
    root = logging.getLogger("node")
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield handler
    root.removeHandler(handler)
    root.setLevel(old)


async def test_a_finished_node_goes_on_evaluating_so_its_accuracy_follows_its_model(
    tmp_path: Path,
) -> None:
    """The issue's case: a first node with --wait-members 1 spends its budget alone; the
    neighbour that joins later pulls its model toward a good one, and what the first node
    reports must follow."""
    network = MemoryNetwork()
    common = {"alpha": 0.5, "shard_count": 2, "trainer.idle_eval_interval_s": 0.1}
    first_cfg = config(tmp_path / "a", listen="mem:0", **common, **{"trainer.steps": 20})
    first = await Node.create(first_cfg, transport=MemoryTransport(network))
    await first.start()
    second: Node | None = None
    try:
        await first.wait_until(first.training_finished.is_set, TIMEOUT_S)
        assert first.trainer.last_eval is not None
        alone = first.trainer.last_eval.accuracy
        assert alone < 0.8  # 20 steps on half the data
        cfg = config(
            tmp_path / "b",
            listen="mem:0",
            join=(first.address,),
            shard_index=1,
            wait_members=2,
            **common,
            **{"trainer.steps": 600},
        )
        second = await Node.create(cfg, transport=MemoryTransport(network))
        await second.start()
        b = second

        def caught_up() -> bool:
            """Both done, and the first reports what the second does (gossip brings their
            models together), far above what it had alone."""
            mine, theirs = first.trainer.last_eval, b.trainer.last_eval
            return (
                b.training_finished.is_set()
                and mine is not None
                and theirs is not None
                and theirs.after_budget
                and abs(mine.accuracy - theirs.accuracy) <= 0.02
                and mine.accuracy >= alone + 0.2
            )

        try:
            await first.wait_until(caught_up, TIMEOUT_S)
        except TimeoutError:
            raise AssertionError(
                f"the first node reports {first.trainer.last_eval}; the second "
                f"{'has' if b.training_finished.is_set() else 'has not'} finished, at "
                f"{b.trainer.last_eval}"
            ) from None
        status = await first.status()
        ev = first.trainer.last_eval
        assert ev is not None
        assert ev.after_budget
        assert (status.step, status.eval_step) == (20, 20)  # it stepped no more
        assert status.eval_accuracy == ev.accuracy >= alone + 0.2
        assert 0 <= status.eval_age_s < 10
    finally:
        for node in (first, second):
            if node is not None:
                await node.stop(grace_s=0)
    records = list(map(json.loads, (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()))
    evals = [r for r in records if r["event"] == "eval"]
    assert [r["after_budget"] for r in evals[:1]] == [False]
    assert any(r["after_budget"] and r["accuracy"] >= alone + 0.2 for r in evals)
    # The report's last eval accuracy is the model's now, not the one it had when alone.
    rows = table(write_report([tmp_path / "a"], tmp_path / "out").read_text())
    assert float(rows["a"]["last eval accuracy"]) >= alone + 0.2


async def test_every_surface_labels_the_same_figures_the_same_way(
    tmp_path: Path, lines: Lines
) -> None:
    # No evaluation after the budget (its interval is longer than the test), so that every
    # surface shows the evaluation made when the budget ran out.
    settings = {
        "metrics_port": 0,
        "metrics_host": "127.0.0.1",
        "trainer.steps": 30,
        "trainer.eval_every": 10,
        "trainer.idle_eval_interval_s": 1e6,
    }
    async with memory_swarm(tmp_path, 1, settings) as [node]:
        await node.wait_until(node.training_finished.is_set, TIMEOUT_S)
        await node.wait_until(lambda: node.trainer.last_eval is not None, TIMEOUT_S)
        status = await node.status()
        metrics = await scrape(node)
    ev = node.trainer.last_eval
    assert ev is not None
    assert (status.eval_step, status.eval_loss, status.eval_accuracy) == (30, ev.loss, ev.accuracy)
    assert status.train_loss == node.trainer.loss
    # murmur status --json and MQTT: the same keys and numbers.
    as_json = json.loads(status_to_json(status))
    mqtt = parse_status(status_payload(status, True, 0.0, 2.0))
    assert mqtt is not None
    for data in (as_json, mqtt):
        assert (data["train_loss"], data["eval_loss"], data["eval_accuracy"]) == (
            status.train_loss,
            ev.loss,
            ev.accuracy,
        )
        assert not {"loss", "accuracy"} & data.keys()  # nothing unlabelled
    # Prometheus: the same figures under the same labels (and the old name of the train loss).
    assert value(metrics["murmur_train_loss"]) == status.train_loss
    assert value(metrics["murmur_training_loss"]) == status.train_loss
    assert value(metrics["murmur_eval_loss"]) == ev.loss
    assert value(metrics["murmur_eval_accuracy_ratio"]) == ev.accuracy
    assert value(metrics["murmur_eval_step"]) == 30
    # The log labels them the same way.
    assert f"step 30 eval_loss {ev.loss:.4f} eval_accuracy {ev.accuracy:.4f}" in "\n".join(
        lines.messages
    )
    # The final checkpoint says how big it was and how long it took.
    me = node.node_id[:8]
    assert [m for m in lines.messages if m.startswith(f"node {me} writing the final checkpoint: ")]
    # And so does the report, from the metrics log.
    rows = table(write_report([node.cfg.state_dir], tmp_path / "out").read_text())
    row = rows[node.cfg.state_dir.name]
    assert (row["last eval loss"], row["last eval accuracy"]) == (
        f"{ev.loss:.4f}",
        f"{ev.accuracy:.4f}",
    )


SUMMARY = re.compile(
    r"node (\w{8}) step \d+/300(?: \(done\))?, \d+ samples/s, rounds \d+ \([\d.]+/s\), "
    r"sent [\d.]+ (?:B|KiB|MiB)/s, received [\d.]+ (?:B|KiB|MiB)/s, mix \d/\d neighbours, "
    r"train_loss (?:[\d.]+|-), (?:no eval yet|eval_loss [\d.]+ eval_accuracy [\d.]+ "
    r"\(step \d+\))"
)


async def test_nodes_log_a_summary_now_and_then_and_no_line_twice(
    tmp_path: Path, lines: Lines
) -> None:
    settings = {"summary_interval_s": 0.2, "trainer.steps": 300}
    async with memory_swarm(tmp_path, 3, settings) as nodes:
        ids = {n.node_id[:8] for n in nodes}

        def summaries(messages: list[str]) -> dict[str, int]:
            found: dict[str, int] = {}
            for m in messages:
                if match := SUMMARY.fullmatch(m):
                    found[match[1]] = found.get(match[1], 0) + 1
            return found

        def three_each(messages: list[str]) -> bool:
            got = summaries(messages)
            return set(got) == ids and min(got.values()) >= 3

        await lines.wait(three_each, "three summary lines from every node")
    # Each node's neighbour set is logged when it changes, never twice in a row the same.
    for node_id in ids:
        sets = [m for m in lines.messages if m.startswith(f"node {node_id} neighbours (")]
        assert sets, lines.messages
        assert all(a != b for a, b in itertools.pairwise(sets)), sets


async def test_a_wait_for_members_counts_down(tmp_path: Path, lines: Lines) -> None:
    cfg = config(tmp_path / "a", listen="mem:0", wait_members=2, wait_timeout_s=1.0)
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    await node.start()
    try:
        await node.wait_until(lambda: node.trainer.step > 0, TIMEOUT_S)
    finally:
        await node.stop(grace_s=0)
    me = node.node_id[:8]
    waits = [m for m in lines.messages if m.startswith(f"node {me} waiting for")]
    assert waits[0].startswith(f"node {me} waiting for members (1 of 2 known); training starts")
    assert re.search(r"starts anyway in (1\.0|0\.\d)s$", waits[0]), waits
    assert (
        f"node {me} starts training with 1 of 2 members, 0 of 0 links up (still waiting for "
        "members (1 of 2 known))" in lines.messages
    )


async def test_a_join_that_gets_no_answer_counts_down_to_giving_up(
    tmp_path: Path, lines: Lines
) -> None:
    # 3 s: the countdown's first line comes after 2 s without an answer.
    cfg = config(tmp_path / "a", listen="mem:0", join=("mem:9",), wait_timeout_s=3.0)
    node = await Node.create(cfg, transport=MemoryTransport(MemoryNetwork()))
    try:
        with pytest.raises(JoinError, match="did not answer"):
            await node.start()
    finally:
        await node.stop(grace_s=0)
    counting = [m for m in lines.messages if "joining through mem:9: no answer yet" in m]
    assert len(counting) == 1, lines.messages
    assert re.search(r"giving up in (1\.0|0\.\d)s$", counting[0]), counting
