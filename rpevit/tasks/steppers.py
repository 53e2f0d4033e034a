"""How one training step is taken for the members of a run: the one loop (tasks/train.py) hands
each step's inputs to a `Stepper` and knows nothing else of how the members are computed.

- `InTurnStep`: each member its own eager (or compiled) step, one after another. A solo trial is a
  group of one stepped this way: `solo_step` is the whole training step of one model.
- `StackedStep`: a fused seed group (docs/fused_groups.md): the members' parameters stacked, one
  vmapped forward + loss, one backward, per-member clipping, one AdamW. tests/test_fused_group.py
  proves it equal to the members' solo steps in float64.

`make_stepper` picks: `compile: graph`, the whole step in one graph (tasks/whole_step.WholeStep, any
group size); else one member, or a mechanism that cannot run under vmap (`vmap_blockers`: the sparse CG
Cayley solve), steps in turn; any other group is stacked.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from rpevit.config import TrialConfig
from rpevit.models.stacked import StackedModels, vmap_blockers
from rpevit.tasks.whole_step import WholeStep
from rpevit.training import (GuardedCompile, autocast_context, clip_grad_norm_per_member, forward_loss_fn, loss_of,
                             make_adamw)


def make_optimizer(model: nn.Module, cfg: TrialConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on what the model declares in `no_weight_decay()` (biases, norms,
    temperatures, every position-encoding parameter), decay on the rest (weight matrices)."""
    device = next(model.parameters()).device
    return make_adamw(model.named_parameters(), model.no_weight_decay(), cfg, device)


def solo_step(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object, forward_loss: Callable,
              images: Tensor, labels: Tensor, masks: Tensor, grad_clip: float) -> tuple[Tensor, Tensor]:
    """Forward + loss, backward, clipping by the global norm, AdamW, schedule: one training step of
    one model (random features already advanced, masks already drawn). Returns (loss, logits).
    `forward_loss` from forward_loss_fn: a failing compiled forward/backward is redone eagerly."""
    def forward_backward(fn: Callable) -> tuple[Tensor, Tensor]:
        loss, logits = fn(model, images, labels, masks)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        return loss, logits

    loss, logits = forward_loss.step(forward_backward)
    if grad_clip > 0:
        nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()
    return loss, logits


class Stepper:
    """Forward, backward, clipping, AdamW and schedule of one step for every member."""

    forward_loss: GuardedCompile  # its `fallback` says why a compiled run went eager

    def train(self) -> None: ...
    def step(self, images: list[Tensor], labels: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]: ...
    def last_lr(self) -> float: ...
    def member_optimizer_state(self, i: int) -> dict: ...
    def scheduler_for(self, i: int) -> object: ...
    def load_optimizer_states(self, states: list[dict], scheduler_state: dict) -> None: ...


def make_stepper(models: list[nn.Module], cfg: TrialConfig, device: torch.device,
                 normalize: Callable[[Tensor], Tensor], schedule: Callable[[int], float],
                 log: Callable[[str], None]) -> Stepper:
    """The stepper for these members: in turn for one member or a vmap blocker (the log says which
    blocks a group), stacked otherwise."""
    if cfg.compile == "graph":  # the whole step in one graph, any group size (tasks/whole_step.py)
        return WholeStep(models, cfg, device, normalize, schedule, log)
    if len(models) > 1 and not (blockers := vmap_blockers(models[0])):
        return StackedStep(models, cfg, device, normalize, schedule, log)
    if len(models) > 1:
        log(f"fused group of {len(models)}: members stepped in turn, not stacked: {'; '.join(blockers)}")
    return InTurnStep(models, cfg, device, normalize, schedule, log)


class StackedStep(Stepper):
    """Stacked parameters, one vmapped (and optionally compiled) forward + loss, one backward of the
    summed losses (each member's gradient is its own), per-member clipping, one AdamW."""

    def __init__(self, models: list[nn.Module], cfg: TrialConfig, device: torch.device,
                 normalize: Callable[[Tensor], Tensor], schedule: Callable[[int], float],
                 log: Callable[[str], None] | None = None) -> None:
        self.stack, self.cfg = StackedModels(models), cfg
        self.optimizer = make_adamw(self.stack.named_parameters(), models[0].no_weight_decay(), cfg, device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        forward = self.stack.member_forward()

        def member_loss(params: dict, buffers: dict, images: Tensor, labels: Tensor,
                        masks: Tensor) -> tuple[Tensor, Tensor]:
            with autocast_context(cfg, device):
                logits = forward(params, buffers, normalize(images), masks)
                return loss_of(logits, labels, cfg.label_smoothing), logits

        self.forward_loss = GuardedCompile(self.stack.vmapped(member_loss), cfg, log)

    def train(self) -> None:
        self.stack.train()

    def step(self, images: list[Tensor], labels: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]:
        inputs = (self.stack.params, self.stack.buffers, torch.stack(images), torch.stack(labels), torch.stack(masks))

        def forward_backward(fn: Callable) -> tuple[Tensor, Tensor]:
            losses, logits = fn(*inputs)
            self.optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            return losses, logits

        losses, logits = self.forward_loss.step(forward_backward)
        if self.cfg.grad_clip > 0:
            clip_grad_norm_per_member(self.stack.params.values(), self.cfg.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return losses, logits

    def last_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def member_optimizer_state(self, i: int) -> dict:
        return self.stack.member_optimizer_state(self.optimizer.state_dict(), i)

    def scheduler_for(self, i: int) -> object:
        return self.scheduler  # one schedule: every member's is this one

    def load_optimizer_states(self, states: list[dict], scheduler_state: dict) -> None:
        self.optimizer.load_state_dict(StackedModels.stack_optimizer_states(states))
        self.scheduler.load_state_dict(scheduler_state)


class InTurnStep(Stepper):
    """Each member its own step (`solo_step`), one after another: a solo trial (a group of one), or a
    group whose mechanism cannot run under vmap."""

    def __init__(self, models: list[nn.Module], cfg: TrialConfig, device: torch.device,
                 normalize: Callable[[Tensor], Tensor], schedule: Callable[[int], float],
                 log: Callable[[str], None] | None = None) -> None:
        self.models, self.cfg = models, cfg
        self.optimizers = [make_optimizer(m, cfg) for m in models]
        self.schedulers = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in self.optimizers]
        self.forward_loss = forward_loss_fn(cfg, device, normalize, log)

    def train(self) -> None:
        for model in self.models:
            model.train()

    def step(self, images: list[Tensor], labels: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]:
        losses, all_logits = [], []
        for model, optimizer, scheduler, x, y, mask in zip(self.models, self.optimizers, self.schedulers,
                                                           images, labels, masks):
            loss, logits = solo_step(model, optimizer, scheduler, self.forward_loss, x, y, mask, self.cfg.grad_clip)
            losses.append(loss.detach())
            all_logits.append(logits.detach())
        return torch.stack(losses), torch.stack(all_logits)

    def last_lr(self) -> float:
        return self.schedulers[0].get_last_lr()[0]

    def member_optimizer_state(self, i: int) -> dict:
        return self.optimizers[i].state_dict()

    def scheduler_for(self, i: int) -> object:
        return self.schedulers[i]

    def load_optimizer_states(self, states: list[dict], scheduler_state: dict) -> None:
        for optimizer, scheduler, state in zip(self.optimizers, self.schedulers, states):
            optimizer.load_state_dict(state)
            scheduler.load_state_dict(scheduler_state)


__all__ = ["InTurnStep", "StackedStep", "Stepper", "make_optimizer", "make_stepper", "solo_step"]
