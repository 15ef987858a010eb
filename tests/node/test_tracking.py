"""bench/tracking.py: the trackers' mean is the mean of the newest gradients under any mix that
keeps their sum, the trackers travel in the gossiped vector, and the last gradient is
checkpointed with the optimizer."""

from __future__ import annotations

import torch
from torch import nn

from bench.tracking import Tracked, TrackingAdamW, make_task
from node.daemon.flat import FlatParams
from node.tasks.base import Shard

NODES = 4


def swarm() -> tuple[list[Tracked], list[TrackingAdamW]]:
    torch.manual_seed(0)
    models = [Tracked(nn.Linear(5, 3)) for _ in range(NODES)]
    return models, [TrackingAdamW(m, lr=1e-2) for m in models]


def ring_mix(models: list[Tracked]) -> None:
    """Half to itself, a quarter to each ring neighbour: symmetric, so the sum is kept."""
    with torch.no_grad():
        for params in zip(*(m.parameters() for m in models), strict=True):
            stacked = torch.stack(params)
            mixed = stacked / 2 + (stacked.roll(1, 0) + stacked.roll(-1, 0)) / 4
            for p, x in zip(params, mixed, strict=True):
                p.copy_(x)


def test_the_trackers_mean_is_the_mean_of_the_newest_gradients() -> None:
    models, opts = swarm()
    gen = torch.Generator().manual_seed(1)
    for _ in range(7):
        grads = []
        for model, opt in zip(models, opts, strict=True):
            g = [torch.randn(p.shape, generator=gen) for p in model.inner.parameters()]
            for p, gi in zip(model.inner.parameters(), g, strict=True):
                p.grad = gi.clone()
            grads.append(g)
            opt.step()
        ring_mix(models)
        for k, _ in enumerate(models[0].trackers):
            mean_y = torch.stack([m.trackers[k] for m in models]).mean(0)
            mean_g = torch.stack([g[k] for g in grads]).mean(0)
            assert torch.allclose(mean_y, mean_g, atol=1e-5), (mean_y - mean_g).abs().max()
    # The nodes' trackers differ (the ring mixes them only partly), yet their mean is exact.
    assert not torch.allclose(models[0].trackers[0], models[1].trackers[0])


def test_the_step_is_adamw_on_the_tracker() -> None:
    torch.manual_seed(0)
    model = Tracked(nn.Linear(5, 3))
    twin = nn.Linear(5, 3)
    twin.load_state_dict(model.inner.state_dict())
    opt = TrackingAdamW(model, weight_decay=0.0, lr=1e-2)
    adamw = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.0)
    with torch.no_grad():
        for y in model.trackers:
            y.fill_(0.5)  # as if a mix had brought the neighbours' gradients
    for p in model.inner.parameters():
        p.grad = torch.ones_like(p)
    for p in twin.parameters():
        p.grad = torch.full_like(p, 1.5)  # the tracker after adding the first gradient
    opt.step()
    adamw.step()
    for a, b in zip(model.inner.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(a, b)
    assert all(torch.equal(y, torch.full_like(y, 1.5)) for y in model.trackers)


def test_the_last_gradient_is_checkpointed_with_the_optimizer() -> None:
    models, opts = swarm()
    model, opt = models[0], opts[0]
    for p in model.inner.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    saved = opt.state_dict()
    again = TrackingAdamW(models[1], lr=1e-2)
    again.load_state_dict(saved)
    with torch.no_grad():
        for y in models[1].trackers:
            y.zero_()
    for p in models[1].inner.parameters():
        p.grad = torch.full_like(p, 3.0)
    again.step()
    # Resumed, it adds the change since the saved gradient (3 - 1), not the whole gradient.
    assert all(torch.equal(y, torch.full_like(y, 2.0)) for y in models[1].trackers)


def test_make_task_gossips_the_trackers_with_the_model() -> None:
    task = make_task(Shard(0, 8), size="1m", seq_len=16, batch_size=2, warmup=2)
    assert isinstance(task.model, Tracked)
    inner = sum(p.numel() for p in task.model.inner.parameters())
    assert FlatParams(task.model).numel == 2 * inner
    opt = task.make_optimizer()
    assert isinstance(opt, TrackingAdamW)
    stepped = {id(p) for group in opt.param_groups for p in group["params"]}
    assert stepped == {id(p) for p in task.model.inner.parameters()}
