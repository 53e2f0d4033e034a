"""A fused seed group: k `train` trials that differ only in their seed, trained as one model.

One process, one data copy, one stacked model (rpevit.models.stacked): every kernel of a step runs
once for all k members instead of k times, which is what a launch-bound GPU needs
(docs/fused_groups.md). Each member keeps everything it has when run alone (tasks/train.py):
its initial weights, its data order and augmentation (its own generator), its stochastic-depth
masks (its own generator, in the eager order), its random-feature draws and redraws, its gradient
clipping (its own norm), its AdamW state and schedule, its draw-aware evaluation, its checkpoint
(in the solo layout, so either can continue the other's) and its own summary row. A member whose
loss diverges is recorded as failed at the end of that epoch, as a solo run would fail; the others
go on. tests/test_fused_group.py proves a fused group equal to its solo runs in float64.

Members of a mechanism that cannot run under vmap (`vmap_blockers`: the sparse CG Cayley solve)
are stepped one after another in the same loop, with the same everything else; the log says so.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Union

import torch
from torch import Tensor, nn

from rpevit import checkpoint, metrics
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import ConfigError, TrialConfig
from rpevit.data import Splits, augment_images, batch_indices, load_splits
from rpevit.models import build_model
from rpevit.models.stacked import StackedModels, vmap_blockers
from rpevit.registry import register_group_task
from rpevit.tasks.grouping import check_group
from rpevit.tasks.train import (DivergedError, checkpoint_payload, diverged_message, epoch_line, epoch_row,
                                lr_factor, make_optimizer, one_draw_note, resolve_device, save_checkpoint, solo_step,
                                summarize)
from rpevit.training import (GuardedCompile, autocast_context, clip_grad_norm_per_member, default_dtype,
                             forward_loss_fn, loss_of, make_adamw, path_mask_dtype)

Outcome = Union[dict, BaseException]  # a member's summary row, or why it failed
MemberEpoch = Callable[[int, dict, "Path | None"], None]  # (member index, epoch row, its checkpoint dir)


@register_group_task("train")
def train_group(cfgs: list[TrialConfig], *, checkpoint_dirs: list[str | Path | None] | None = None,
                on_epoch: MemberEpoch | None = None, log: Callable[[str], None] | None = print) -> list[Outcome]:
    """Train the members together; returns, per member, its summary row or the exception it failed with.

    Members whose checkpoints stand at different epochs are trained as sub-groups, one after another.
    A checkpoint that does not match its member's config fails that member only.
    """
    log = log or (lambda _msg: None)
    check_group(cfgs)
    dirs = list(checkpoint_dirs) if checkpoint_dirs is not None else [None] * len(cfgs)
    outcomes: list[Outcome | None] = [None] * len(cfgs)
    opened: dict[int, tuple[Path | None, dict | None]] = {}
    for i, (cfg, folder) in enumerate(zip(cfgs, dirs)):
        try:
            opened[i] = checkpoint.open_for_resume(folder, cfg)
        except ConfigError as err:
            outcomes[i] = err
    by_start: dict[int, list[int]] = {}
    for i, (_, state) in opened.items():
        by_start.setdefault(int(state["epoch"]) if state else 0, []).append(i)
    for start in sorted(by_start):
        members = by_start[start]
        results = _train_members([cfgs[i] for i in members], [opened[i] for i in members],
                                 lambda j, row, folder, _m=members: on_epoch(_m[j], row, folder) if on_epoch else None,
                                 log)
        for i, result in zip(members, results):
            outcomes[i] = result
    return outcomes  # type: ignore[return-value]


def _train_members(cfgs: list[TrialConfig], opened: list[tuple[Path | None, dict | None]],
                   on_epoch: MemberEpoch, log: Callable[[str], None]) -> list[Outcome]:
    """One group whose members all start at the same epoch (the loop of tasks/train.py, k-fold)."""
    cfg, k = cfgs[0], len(cfgs)
    device = resolve_device(cfg.device)
    tags = [f"[seed {c.seed}]" for c in cfgs]
    outcomes: list[Outcome | None] = [None] * k
    with default_dtype(cfg) as dtype:  # buffers built in float32 follow the parameters
        data = load_splits(cfg.dataset, data_dir=cfg.data_dir or None, device=device,
                           val_fraction=cfg.val_fraction, train_subset=cfg.train_subset)
        models, mask_generators, cpu_states = [], [], []
        for member in cfgs:
            models.append(build_model(member, data.spec.channels, data.spec.num_classes).to(device, dtype))
            cpu_states.append(torch.get_rng_state())  # the global CPU RNG where a solo run starts training
            mask_generators.append(_mask_generator(member, device, cpu_states[-1]))
        n_train, batch_size = len(data.x_train), cfg.resolved_batch_size
        steps_per_epoch = math.ceil(n_train / batch_size)
        total_steps = max(1, cfg.epochs * steps_per_epoch)
        schedule = lr_factor(cfg, steps_per_epoch, total_steps)
        for model in models:
            set_training_length(model, total_steps)
        data_generators = [torch.Generator(device=device).manual_seed(c.seed) for c in cfgs]
        augment = data.spec.augment if cfg.augment == "auto" else cfg.augment
        mask_dtype = path_mask_dtype(cfg, device)
        blockers = vmap_blockers(models[0])
        if blockers:
            log(f"fused group of {k}: members stepped in turn, not stacked: {'; '.join(blockers)}")
            stepper: Stepper = InTurnStep(models, cfg, device, data.normalize, schedule, log)
        else:
            stepper = StackedStep(models, cfg, device, data.normalize, schedule, log)
            log(f"fused group of {k} ({', '.join(tags)}): parameters stacked, one vmapped step"
                + (f", compiled ({cfg.compile})" if cfg.compile != "off" else ""))
        states = [state for _, state in opened]
        history: list[list[dict]] = [[] for _ in range(k)]
        start_epoch = 0
        if states[0] is not None:
            for i, (path, state) in enumerate(opened):
                models[i].load_state_dict(state["model"])
                _set_member_rng(state["rng"], device, data_generators[i], mask_generators[i])
                history[i] = list(state["history"])
            stepper.load_optimizer_states([s["optimizer"] for s in states], states[0]["scheduler"])
            start_epoch = int(states[0]["epoch"])
            log(f"fused group of {k}: resumed from the members' checkpoints after epoch {start_epoch}")
        if (note := one_draw_note(models[0], cfg)) is not None:
            log(note)

        alive = list(range(k))
        for epoch in range(start_epoch, cfg.epochs):
            stepper.train()
            t0 = time.perf_counter()
            loss_sum = torch.zeros(k, device=device)  # the default dtype, as the solo loop sums
            correct = torch.zeros(k, device=device, dtype=torch.long)
            orders = [batch_indices(n_train, batch_size, g) for g in data_generators]
            for batches in zip(*orders):
                images, labels, masks = step_inputs(data, batches, data_generators, augment, models,
                                                    mask_generators, mask_dtype)
                losses, logits = stepper.step(images, labels, masks)
                loss_sum += losses.detach() * len(batches[0])
                correct += (logits.argmax(-1) == torch.stack(labels)).sum(-1)
            train_losses = (loss_sum / n_train).tolist()  # one sync per epoch
            train_accs = (correct.double() / n_train).tolist()
            metrics.synchronize(device)
            epoch_s = time.perf_counter() - t0
            for i in list(alive):
                if not math.isfinite(train_losses[i]):
                    outcomes[i] = DivergedError(diverged_message(train_losses[i], epoch, cfgs[i]))
                    alive.remove(i)
                    log(f"{tags[i]} {outcomes[i]}: recorded as failed, the other members go on")
                    continue
                row = epoch_row(models[i], data, cfgs[i], device, epoch, train_losses[i], train_accs[i],
                                stepper.last_lr(), epoch_s)
                history[i].append(row)
                log(f"{tags[i]} {epoch_line(row, cfgs[i])}")
                path = opened[i][0]
                if path is not None:
                    save_checkpoint(path, checkpoint_payload(
                        models[i], stepper.member_optimizer_state(i), stepper.scheduler_for(i),
                        _member_rng(device, cpu_states[i], data_generators[i], mask_generators[i]),
                        history[i], epoch, cfgs[i]))
                on_epoch(i, row, path.parent if path is not None else None)
            if not alive:
                break

        for i in alive:
            models[i].eval()
            try:
                outcomes[i] = {**summarize(models[i], data, cfgs[i], device, history[i],
                                           lambda msg, tag=tags[i]: log(f"{tag} {msg}"),
                                           compile_fallback=stepper.forward_loss.fallback), "fused_members": k}
            except Exception as err:  # noqa: BLE001 - one member's evaluation failing fails that member only
                outcomes[i] = err
    return outcomes  # type: ignore[return-value]


def step_inputs(data: Splits, batches: tuple[Tensor, ...], data_generators: list[torch.Generator], augment: str,
                models: list[nn.Module], mask_generators: list[torch.Generator],
                mask_dtype: torch.dtype) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Each member's images (augmented with its generator), labels and stochastic-depth masks (drawn
    from its generator) for one step, after advancing its random features: what a solo run does
    before its forward, member by member, in the same order."""
    images, labels = [], []
    for i, idx in enumerate(batches):
        images.append(augment_images(data.x_train[idx], data_generators[i], augment, data.spec.crop_padding))
        labels.append(data.y_train[idx])
    for model in models:
        advance_random_features(model)
    masks = [m.draw_path_masks(len(batches[0]), dtype=mask_dtype, device=data.x_train.device, generator=g)
             for m, g in zip(models, mask_generators)]
    return images, labels, masks


# ---------------------------------------------------------------- the two ways to step a group
class Stepper:
    """Forward, backward, clipping, AdamW and schedule of one step for every member."""

    forward_loss: GuardedCompile  # its `fallback` says why a compiled group went eager

    def train(self) -> None: ...
    def step(self, images: list[Tensor], labels: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]: ...
    def last_lr(self) -> float: ...
    def member_optimizer_state(self, i: int) -> dict: ...
    def scheduler_for(self, i: int) -> object: ...
    def load_optimizer_states(self, states: list[dict], scheduler_state: dict) -> None: ...


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
    """Each member its own eager step (the solo step), one after another, in the group's loop."""

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


# ---------------------------------------------------------------- per-member random state
def _mask_generator(cfg: TrialConfig, device: torch.device, cpu_state: Tensor) -> torch.Generator:
    """The generator a solo run's stochastic-depth masks come from, as of its first step: the global
    CPU RNG after building the model (CPU), or the CUDA RNG torch.manual_seed(seed) left (GPU)."""
    generator = torch.Generator(device=device)
    if device.type == "cpu":
        generator.set_state(cpu_state)
    else:
        generator.manual_seed(cfg.seed)
    return generator


def _member_rng(device: torch.device, cpu_state: Tensor, data: torch.Generator, masks: torch.Generator) -> dict:
    """A member's RNG states in a solo checkpoint's layout (`torch`, `data`, and `cuda` on a GPU)."""
    if device.type == "cpu":
        return {"torch": masks.get_state(), "data": data.get_state()}
    return {"torch": cpu_state, "data": data.get_state(), "cuda": masks.get_state()}


def _set_member_rng(state: dict, device: torch.device, data: torch.Generator, masks: torch.Generator) -> None:
    data.set_state(state["data"])
    if device.type == "cpu":
        masks.set_state(state["torch"])
    elif "cuda" in state:  # a CPU checkpoint continued on a GPU has none
        masks.set_state(state["cuda"])


__all__ = ["InTurnStep", "StackedStep", "step_inputs", "train_group"]
