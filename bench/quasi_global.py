"""AdamW whose momentum also takes in what gossip moved the model by: quasi-global momentum
(Lin et al., ICML 2021), an experiment on the text task (bench/RESULTS.md, "Quasi-global
momentum"). It did not help there, and at its full share it diverged, so the node does not
offer it; this module keeps the experiment runnable:

    Q=bench.quasi_global:make_task:size=1m,seq_len=64,batch_size=8,warmup=20,lr=0.002
    .venv/bin/python -m bench.text_compression --nodes 8 --steps 200 --points 4 --no-allreduce \
        --task $Q,mix_share=0.3 --codecs int8 --out /tmp/quasi-global

Eight nodes that each step their own AdamW on their own shard each remember only their own
gradients. On non-iid data those point different ways, and gossip is slow to carry a direction
across the graph. Quasi-global momentum takes the memory from what the model did instead: over
the last step it moved by the node's own step and by what gossip mixed in, and the mix's share,
read back into the units of AdamW's first moment, joins it:

    m ← m + mix_share · (1 − β1^t) · (x_after − x) · den / lr_last

where ``x_after`` is the model right after the node's last step and ``x`` the model now. With
``mix_share`` 0 this is torch's AdamW (to rounding); with 1, under exact averaging, each node's
momentum holds every node's last step. The mix's share is replayed in the next steps, as
heavy-ball replays a descent's: on a slowly mixing graph that speeds consensus, and on a well
mixed one it turns a fast contraction (γλ near 1) into an oscillation of modulus √β1.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

import torch

from node.tasks import text
from node.tasks.base import Shard, Task
from node.tasks.schedules import decay_groups

__all__ = ["QuasiGlobalAdamW", "make_task"]


class QuasiGlobalAdamW(torch.optim.Optimizer):
    """Args: as torch's AdamW (decoupled weight decay); ``betas[0]`` weighs the model's last
    move, ``betas[1]`` is the second moment's as in AdamW."""

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        mix_share: float = 1.0,
    ) -> None:
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        defaults = {
            "lr": lr,
            "betas": betas,
            "eps": eps,
            "weight_decay": weight_decay,
            "mix_share": mix_share,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (b1, b2), eps = group["lr"], group["betas"], group["eps"]
            last_lr = group.get("last_lr", 0.0)
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p)
                    state["v"] = torch.zeros_like(p)
                    state["after"] = torch.empty_like(p)
                m, v, after, t = state["m"], state["v"], state["after"], state["step"]
                if t > 0 and last_lr > 0:
                    # What the mix moved the model by since the last step, in the units of m:
                    # a step of lr·m̂/den moved it by lr·m/(den·(1 - β1^t)).
                    den = _denominator(v, b2, t, eps)
                    scale = group["mix_share"] * (1 - b1**t) / last_lr
                    m.addcmul_(after.sub_(p), den, value=scale)
                t = state["step"] = t + 1
                m.lerp_(p.grad, 1 - b1)
                v.mul_(b2).addcmul_(p.grad, p.grad, value=1 - b2)
                den = _denominator(v, b2, t, eps)
                p.mul_(1 - lr * group["weight_decay"])
                p.addcdiv_(m, den, value=-lr / (1 - b1**t))
                after.copy_(p)
            group["last_lr"] = lr
        return loss


def _denominator(v: torch.Tensor, b2: float, t: int, eps: float) -> torch.Tensor:
    """AdamW's (torch's rounds differently: sqrt(v)/sqrt(1 - β2^t))."""
    return (v / (1 - b2**t)).sqrt_().add_(eps)


def make_task(
    shard: Shard,
    size: str = "1m",
    seq_len: int = 128,
    batch_size: int = 16,
    lr: float = 1e-3,
    warmup: int = 100,
    split: str = "package",
    mix_share: float = 0.3,
) -> Task:
    """The text task (these options as ``text``'s) with this optimizer at ``mix_share``."""
    task = text.make_task(shard, size, seq_len, batch_size, lr, warmup, split=split)

    def make(params: Iterable[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return QuasiGlobalAdamW(decay_groups(params, 0.1), lr=lr, mix_share=mix_share)

    return dataclasses.replace(task, optimizer=make)
