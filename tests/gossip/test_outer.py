"""DiLoCo's outer Nesterov step on hand-computed cases."""

from __future__ import annotations

import pytest
import torch

from gossip.outer import OuterNesterov


def test_with_lr_one_and_no_momentum_it_changes_nothing() -> None:
    outer = OuterNesterov(lr=1.0, momentum=0.0)
    x = torch.tensor([1.0, 2.0])
    outer.step(x)
    for moved in ([0.5, 2.5], [-1.0, 0.0]):
        x.copy_(torch.tensor(moved))
        assert torch.equal(outer.step(x), torch.tensor(moved))


def test_nesterov_on_the_pseudo_gradient_by_hand() -> None:
    outer = OuterNesterov(lr=0.5, momentum=0.9)
    x = torch.tensor([0.0])
    outer.step(x)  # anchor 0
    x.fill_(-1.0)  # the round moved the model by -1: g = 1
    # v = 1; x = 0 - 0.5 * (1 + 0.9 * 1) = -0.95
    assert outer.step(x).item() == pytest.approx(-0.95)
    x.fill_(-1.95)  # another -1 from the new anchor: g = 1
    # v = 0.9 * 1 + 1 = 1.9; x = -0.95 - 0.5 * (1 + 0.9 * 1.9) = -2.305
    assert outer.step(x).item() == pytest.approx(-2.305)


def test_settings_that_would_diverge_or_do_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="outer lr"):
        OuterNesterov(lr=0.0, momentum=0.9)
    with pytest.raises(ValueError, match="momentum"):
        OuterNesterov(lr=0.7, momentum=1.0)
