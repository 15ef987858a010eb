"""An outer optimizer on the gossiped model: DiLoCo's Nesterov step, made decentralized.

DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models",
2023, Algorithm 1) treats the change of the model over a communication round as a
pseudo-gradient and applies Nesterov momentum to it. Here a round is one gossip round, and the
pseudo-gradient is what this node's own local steps did since the last round: g = anchor - x,
where the anchor is the model just after the previous round's mix and x the model before this
round's. Then

    v = μ v + g,    x = anchor - η (g + μ v),

then the mix, and the anchor becomes the mixed model (:meth:`OuterNesterov.rebase`). DiLoCo
averages the pseudo-gradients before the outer step; here mixing does the averaging, and the
momentum is kept out of it: a mix moved through the momentum too would be amplified up to
η (1 + μ) / (1 - μ) times (13 at DiLoCo's 0.7 and 0.9), far past what consensus stays stable
at (measured in bench/RESULTS.md: at one local step between rounds the swarm diverged).

With η = 1 and μ = 0 this is the identity: plain gossip.
"""

from __future__ import annotations

import torch

__all__ = ["OuterNesterov"]


class OuterNesterov:
    """Args:
    lr: the outer learning rate η (DiLoCo uses 0.7).
    momentum: μ (DiLoCo uses 0.9).
    """

    def __init__(self, lr: float, momentum: float) -> None:
        if lr <= 0 or not 0 <= momentum < 1:
            raise ValueError("the outer lr must be positive and the momentum in [0, 1)")
        self.lr = lr
        self.momentum = momentum
        self._anchor: torch.Tensor | None = None
        self._velocity: torch.Tensor | None = None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        """Apply one outer step to ``x`` in place, before the round's mix (the first call only
        sets the anchor); :meth:`rebase` after the mix."""
        if self._anchor is None or self._velocity is None:
            self._anchor = x.detach().clone()
            self._velocity = torch.zeros_like(self._anchor)
            return x
        g = self._anchor - x
        self._velocity.mul_(self.momentum).add_(g)
        x.copy_(self._anchor - self.lr * (g + self.momentum * self._velocity))
        self._anchor.copy_(x)
        return x

    def rebase(self, x: torch.Tensor) -> None:
        """The round's mix moved the model to ``x``: the next pseudo-gradient starts there."""
        if self._anchor is not None:
            self._anchor.copy_(x)
