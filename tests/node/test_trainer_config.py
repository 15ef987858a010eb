"""How long the trainer waits after a step, to emulate a device's pace and a straggler."""

from __future__ import annotations

import pytest

from node.daemon.trainer import TrainerConfig


@pytest.mark.parametrize(
    ("step_time", "slowdown", "compute", "wait"),
    [
        (0.0, 1.0, 0.010, 0.0),  # as fast as the machine goes
        (0.0, 5.0, 0.010, 0.040),  # five times its natural step
        (0.050, 1.0, 0.010, 0.040),  # a device that needs 50 ms a step
        (0.050, 1.0, 0.080, 0.0),  # compute slower than the device pace: no extra wait
        (0.050, 5.0, 0.010, 0.240),  # a straggler among 50 ms devices takes 250 ms
        (0.050, 2.0, 0.080, 0.080),  # slower than the pace: the slowdown scales the compute
    ],
)
def test_wait_after_a_step(step_time: float, slowdown: float, compute: float, wait: float) -> None:
    cfg = TrainerConfig(step_time=step_time, slowdown=slowdown)
    assert cfg.wait_after(compute) == pytest.approx(wait)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"slowdown": 0.5}, "slowdown must be at least 1"), ({"step_time": -1}, "not be negative")],
)
def test_bad_pace_is_refused(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainerConfig(**kwargs)  # type: ignore[arg-type]
