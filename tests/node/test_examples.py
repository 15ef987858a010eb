"""The example task in examples/ works as the README says it does."""

from __future__ import annotations

from pathlib import Path

from node.tasks import Shard, load_task
from tests.node.helpers import memory_swarm

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "custom_task.py")


def test_the_example_factory_returns_a_full_task() -> None:
    task = load_task(f"{EXAMPLE}:make_task")(Shard(0, 2))
    assert task.batch_size == 64
    assert type(task.make_optimizer()).__name__ == "Adam"
    assert len(task.train) == 1000  # type: ignore[arg-type]


async def test_two_nodes_learn_the_example_task(tmp_path: Path) -> None:
    async with memory_swarm(
        tmp_path, 2, {"task": f"{EXAMPLE}:make_task", "trainer.steps": 150}
    ) as nodes:
        for n in nodes:
            await n.wait_until(n.training_finished.is_set, 60)
            assert n.trainer.last_eval is not None
            assert n.trainer.last_eval.accuracy > 0.9
