"""A training loss that turns non-finite rolls back to the last finite state (model and
optimizer); only when there is none, or going back keeps failing, does training stop."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

from node.daemon.trainer import Diverged, Rollback, Trainer, TrainerConfig
from node.tasks import Shard
from node.tasks.digits import make_task
from tests.node.diverging_task import poisoned

TIMEOUT_S = 60.0

Run = Callable[..., tuple[Trainer, list[Rollback]]]


@pytest.fixture
def run() -> Iterator[Run]:
    """Trains a poisoned digits task to its budget; the trainers are stopped after the test
    (past its budget a trainer goes on evaluating until asked to stop)."""
    trainers: list[Trainer] = []

    def train(bad: Callable[[int], bool], steps: int = 80) -> tuple[Trainer, list[Rollback]]:
        torch.manual_seed(0)
        task = poisoned(make_task(Shard()), bad)
        rollbacks: list[Rollback] = []
        cfg = TrainerConfig(steps=steps, eval_every=1000, rollback_every=10)
        trainer = Trainer(
            task, torch.device("cpu"), threading.Lock(), cfg, on_rollback=rollbacks.append
        )
        trainers.append(trainer)
        trainer.start()
        assert trainer.done.wait(TIMEOUT_S), "the trainer did not finish"
        return trainer, rollbacks

    yield train
    for trainer in trainers:
        trainer.request_stop()
        trainer.join(TIMEOUT_S)


def finite(trainer: Trainer) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in trainer.task.model.parameters())


def test_one_bad_step_rolls_back_and_training_goes_on(run: Run) -> None:
    trainer, rollbacks = run(lambda n: n == 35)
    assert trainer.error is None
    assert rollbacks == [Rollback(step=35, to_step=30, loss=rollbacks[0].loss, in_a_row=1)]
    assert rollbacks[0].loss != rollbacks[0].loss  # NaN
    assert trainer.rollbacks == 1
    assert trainer.step == 80
    assert finite(trainer)
    assert trainer.last_eval is not None
    assert trainer.last_eval.accuracy > 0.5


def test_a_second_failure_in_a_row_goes_further_back(run: Run) -> None:
    trainer, rollbacks = run(lambda n: n in (35, 36))
    assert trainer.error is None
    assert [(r.step, r.to_step, r.in_a_row) for r in rollbacks] == [(35, 30, 1), (36, 20, 2)]
    assert finite(trainer)


def test_rollbacks_that_keep_failing_stop_training_with_the_reason(run: Run) -> None:
    trainer, rollbacks = run(lambda n: n >= 35)
    assert isinstance(trainer.error, Diverged)
    assert "training loss became nan at step 38 again after 3 rollbacks in a row" in str(
        trainer.error
    )
    assert [(r.to_step, r.in_a_row) for r in rollbacks] == [(30, 1), (20, 2), (20, 3)]


def test_a_finite_state_is_kept_only_after_enough_finite_steps_again(run: Run) -> None:
    # Failing every 12 steps: a copy needs 10 finite steps after the rollback, so each
    # rollback starts a new count, and training goes on.
    trainer, rollbacks = run(lambda n: n % 12 == 0, steps=60)
    assert trainer.error is None
    assert [r.in_a_row for r in rollbacks] == [1] * 5
    assert finite(trainer)


def test_without_a_finite_state_to_go_back_to_training_stops_at_once() -> None:
    torch.manual_seed(0)
    task = make_task(Shard())
    with torch.no_grad():
        next(task.model.parameters()).fill_(float("nan"))
    trainer = Trainer(task, torch.device("cpu"), threading.Lock(), TrainerConfig(steps=10))
    trainer.start()
    assert trainer.done.wait(TIMEOUT_S)
    assert isinstance(trainer.error, Diverged)
    assert "there is no finite state to go back to" in str(trainer.error)
    assert trainer.step == 1


@pytest.mark.parametrize(("field", "value"), [("rollback_every", 0), ("max_rollbacks", -1)])
def test_rollback_settings_are_checked(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        TrainerConfig(**{field: value})
