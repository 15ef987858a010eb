"""bench/momentum.py: AdamW steps on the first moment that gossip mixed, keeps its own second
moment floored at that moment's square, and the moments travel in the gossiped vector."""

from __future__ import annotations

import torch
from torch import nn

from bench.momentum import MixedMomentumAdamW, make_task
from bench.tracking import Tracked
from node.daemon.flat import FlatParams
from node.tasks.base import Shard


def one_step(model: Tracked, opt: MixedMomentumAdamW, grad: float) -> None:
    for p in model.inner.parameters():
        p.grad = torch.full_like(p, grad)
    opt.step()


def test_the_step_uses_the_mixed_moment_and_writes_the_new_one_back() -> None:
    torch.manual_seed(0)
    model = Tracked(nn.Linear(5, 3))
    twin = nn.Linear(5, 3)
    twin.load_state_dict(model.inner.state_dict())
    opt = MixedMomentumAdamW(model, weight_decay=0.0, lr=1e-2)
    adamw = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=0.0)
    one_step(model, opt, 1.0)
    for p in twin.parameters():
        p.grad = torch.ones_like(p)
    adamw.step()
    with torch.no_grad():
        for m in model.trackers:  # as if a mix had brought the neighbours' moments
            m.fill_(0.02)  # 0.02² is below v (1e-3 after one step): no floor
    for p in twin.parameters():
        adamw.state[p]["exp_avg"].fill_(0.02)
    one_step(model, opt, 1.0)
    for p in twin.parameters():
        p.grad = torch.ones_like(p)
    adamw.step()
    for a, b in zip(model.inner.parameters(), twin.parameters(), strict=True):
        assert torch.allclose(a, b)
    # What the node gossips next is its new moment: 0.9 * 0.02 + 0.1 * 1.
    assert all(torch.allclose(m, torch.full_like(m, 0.118)) for m in model.trackers)


def test_a_moment_mixed_in_where_the_node_saw_no_gradient_steps_by_about_the_rate() -> None:
    linear = nn.Linear(4, 1, bias=False)
    model = Tracked(linear)
    opt = MixedMomentumAdamW(model, weight_decay=0.0, lr=1e-2)
    for _ in range(20):
        one_step(model, opt, 0.0)  # this node's shard never touches the weight
    before = linear.weight.detach().clone()
    with torch.no_grad():
        model.trackers[0].fill_(0.3)  # the neighbours' shards do
    one_step(model, opt, 0.0)
    moved = (linear.weight - before).abs().max().item()
    # Its own second moment is zero: m / sqrt(v) alone would move it by 1e-2 * 0.27 / 1e-8.
    assert 0 < moved <= 2e-2


def test_make_task_gossips_the_moments_with_the_model() -> None:
    task = make_task(Shard(0, 8), size="1m", seq_len=16, batch_size=2, warmup=2)
    assert isinstance(task.model, Tracked)
    inner = sum(p.numel() for p in task.model.inner.parameters())
    assert FlatParams(task.model).numel == 2 * inner
    opt = task.make_optimizer()
    assert isinstance(opt, MixedMomentumAdamW)
    stepped = {id(p) for group in opt.param_groups for p in group["params"]}
    assert stepped == {id(p) for p in task.model.inner.parameters()}
