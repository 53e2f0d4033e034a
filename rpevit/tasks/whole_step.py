"""`compile: graph`: the whole training step of a group as one compiled function: one CUDA graph on a
GPU, no host work per step but the replay (and a random-feature redraw where due).

Why: on an H100 the step of `compile: cudagraphs` took 5.2 ms, of which ~2.0 ms were the step's
inputs (indexing, augmentation, masks) and ~1.1 ms the optimizer, both outside its graph, which holds
only the forward and backward (~2.2 ms): the GPU sat at 5% of its peak (issue 60). Here everything a
step computes is inside one function of device tensors:

    images, labels  <- the epoch's order at this step (gathered on the device)
    augmentation    <- the epoch's pre-drawn crop offsets and flips (or rotation angles) at this step
    path masks      <- the epoch's pre-drawn stochastic-depth table at this step, times 1 / keep
    gradients       <- torch.func.grad of the summed vmapped losses (each member's gradient is its own)
    clipping        <- each member by its own global norm (as clip_grad_norm_per_member)
    AdamW           <- torch.optim.AdamW's arithmetic, on that optimizer's own state tensors
    learning rate   <- the schedule's table at the optimizer's step count
    running sums    <- the epoch's loss and correct-prediction sums, the random-feature step counts

and it is compiled (fullgraph) once: the short last batch of an epoch is padded to the batch size with
weight-0 images (one_step), so every step has one shape and one graph.

Randomness is drawn once per epoch, in one batch per member, from the member's own generators (its
data generator: order and augmentation; its mask generator: stochastic depth), with the same
distributions as the per-step draws of the other modes but in another order, so a `graph` run's
random stream is its own: its rows are not bit-equal to an `on` run's of the same seed (`compile` is
part of the trial key, and the checkpoint's fingerprint holds it). What is proven equal
(tests/test_whole_step.py, float64 on the CPU): given the same drawn inputs, this step and the
stacked step (tasks/steppers.StackedStep: autograd, clipping, torch's AdamW, LambdaLR) give the same
losses, parameters and optimizer state, step after step, eager and compiled.

Outside the graph, per step: the host schedule of random-feature redraws (a redraw copies the new
draw into the buffer the graph reads) and LambdaLR's step (Python, for checkpoints and the epoch row's
lr). Per epoch: the batched draws, copied into the tensors the graphs read (their addresses never
change: a CUDA graph replays fixed addresses).
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn
from torch.func import grad_and_value

from rpevit import metrics
from rpevit.attention.base import RandomFeatureBackend
from rpevit.attention.kernelized import KernelizedAttention
from rpevit.config import TrialConfig
from rpevit.data import Splits, crop_flip, rotate_images
from rpevit.models.stacked import StackedModels, vmap_blockers
from rpevit.tasks.generators import MemberRandom
from rpevit.training import (CLIP_EPS, GuardedCompile, autocast_context, make_adamw, path_mask_dtype,
                             weighted_loss_of)

State = dict[str, Tensor]


class WholeStepError(ValueError):
    """A group that `compile: graph` cannot step (a mechanism that cannot run under vmap)."""


@dataclass
class EpochDraws:
    """One epoch's random inputs of every member, drawn in one batch per member: the order (k, n), the
    augmentation's draws (crop offsets and flips, or angles; (k, n) each) and the raw stochastic-depth
    Bernoulli draws (k, sites, n)."""

    order: Tensor
    augment: dict[str, Tensor]
    masks: Tensor


def draw_epoch(randoms: list[MemberRandom], n: int, augment: str, crop_padding: int, keeps: list[float],
               mask_dtype: torch.dtype, device: torch.device) -> EpochDraws:
    """Each member's epoch from its own generators: data generator -> order, then the augmentation's
    draws in the per-step functions' order (crop: rows, columns, flips; rotate: angles); mask generator ->
    one Bernoulli(keep) per site and training image."""
    orders, draws, masks = [], [], []
    keep = torch.tensor(keeps, dtype=torch.float64, device=device)[:, None].expand(len(keeps), n)
    for r in randoms:
        orders.append(torch.randperm(n, generator=r.data, device=device))
        if augment in ("crop", "crop_flip"):
            span = 2 * crop_padding + 1
            oy = torch.randint(0, span, (n,), generator=r.data, device=device)
            ox = torch.randint(0, span, (n,), generator=r.data, device=device)
            flips = torch.rand(n, generator=r.data, device=device) < 0.5
            draws.append({"oy": oy, "ox": ox, "flip": flips & (augment == "crop_flip")})
        elif augment == "rotate":
            draws.append({"degrees": 360.0 * torch.rand(n, generator=r.data, device=device)})
        else:
            draws.append({})
        masks.append(torch.bernoulli(keep, generator=r.masks).to(mask_dtype))  # 0 or 1: exact in any dtype
    stacked = {name: torch.stack([d[name] for d in draws]) for name in draws[0]}
    return EpochDraws(torch.stack(orders), stacked, torch.stack(masks))


def augmented(x: Tensor, draws: dict[str, Tensor], augment: str, crop_padding: int) -> Tensor:
    """x (k, b, C, H, W) uint8 under the given draws ((k, b) each): rpevit.data's per-step functions'
    arithmetic, with the randomness passed in."""
    if augment == "none":
        return x
    flat = x.flatten(0, 1)
    if augment == "rotate":
        out = rotate_images(flat, draws["degrees"].flatten())
    else:
        out = crop_flip(flat, draws["oy"].flatten(), draws["ox"].flatten(), draws["flip"].flatten(), crop_padding)
    return out.view_as(x)


class WholeStep:
    """The Stepper of `compile: graph` (tasks/steppers.Stepper's interface, plus `run_epoch`, which the
    loop calls instead of drawing and stepping batch by batch)."""

    def __init__(self, models: list[nn.Module], cfg: TrialConfig, device: torch.device,
                 normalize: Callable[[Tensor], Tensor], schedule: Callable[[int], float],
                 log: Callable[[str], None] | None = None) -> None:
        if blockers := vmap_blockers(models[0]):
            raise WholeStepError(f"field 'compile' has value 'graph' but this model cannot run under vmap "
                                 f"({'; '.join(blockers)}); allowed here: off, on, cudagraphs")
        if others := sorted({type(m).__name__ for m in models[0].modules()
                             if isinstance(m, RandomFeatureBackend) and not isinstance(m, KernelizedAttention)}):
            raise WholeStepError(f"field 'compile' has value 'graph' but {', '.join(others)} counts its steps on the "
                                 f"device itself (advance_step), outside the graph; allowed here: off, on, cudagraphs")
        self.models, self.cfg, self.device, self.normalize = models, cfg, device, normalize
        self.stack = StackedModels(models)
        self.optimizer = make_adamw(self.stack.named_parameters(), models[0].no_weight_decay(), cfg, device)
        for p in self.stack.params.values():
            p.requires_grad_(False)  # gradients come from torch.func.grad, not from autograd's leaves
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule)
        self.schedule = schedule
        self.log = log or (lambda _msg: None)
        self.counted = [name for name, module in models[0].named_modules()
                        if isinstance(module, KernelizedAttention) and module.uses_projection
                        and module.redraw_interval > 0]
        self.state: State = {}
        self.bind_optimizer_state()
        forward = self.stack.member_forward()

        def member_loss(params: dict, buffers: dict, images: Tensor, labels: Tensor, masks: Tensor,
                        weights: Tensor) -> tuple[Tensor, Tensor]:
            with autocast_context(cfg, device):
                logits = forward(params, buffers, normalize(images), masks)
                return weighted_loss_of(logits, labels, cfg.label_smoothing, weights), logits

        mapped = self.stack.vmapped(member_loss)

        def summed(params: dict, buffers: dict, images: Tensor, labels: Tensor, masks: Tensor, weights: Tensor):
            losses, logits = mapped(params, buffers, images, labels, masks, weights)
            return losses.sum(), (losses.detach(), logits.detach())

        self.grad_and_losses = grad_and_value(summed, has_aux=True)
        self.graph = GuardedCompile(self.one_step, cfg, self.log)
        self.forward_loss = self.graph  # its `fallback` says why a compiled run went eager (the row records it)

    # ------------------------------------------------------------------ the optimizer's state as graph inputs
    def bind_optimizer_state(self) -> None:
        """Give every stacked parameter AdamW's state (zeros at step 0, or what a checkpoint loaded), as
        tensors on the device that the graphs read and update in place: torch's AdamW keeps the same
        objects, so its state_dict (checkpoints) sees every step. `slots`: per parameter group, its
        hyper-parameters and (name, parameter, step, exp_avg, exp_avg_sq) of each parameter, plain lists
        the compiled step iterates."""
        names = {id(p): name for name, p in self.stack.params.items()}
        self.slots = []
        for group in self.optimizer.param_groups:
            entries = []
            for p in group["params"]:
                entry = self.optimizer.state[p]
                entry["step"] = torch.as_tensor(entry.get("step", 0.0), dtype=torch.float32).to(self.device).clone()
                for key in ("exp_avg", "exp_avg_sq"):
                    entry[key] = entry[key].to(p).clone() if key in entry else torch.zeros_like(p)
                entries.append((names[id(p)], p, entry["step"], entry["exp_avg"], entry["exp_avg_sq"]))
            self.slots.append((*group["betas"], group["weight_decay"], group["eps"], entries))

    def lr_table(self, total_steps: int) -> Tensor:
        """base lr x the schedule's factor at every step count 0 .. total_steps (LambdaLR's values), float64."""
        base = self.scheduler.base_lrs[0]
        return torch.tensor([base * self.schedule(t) for t in range(total_steps + 1)], dtype=torch.float64,
                            device=self.device)

    # ------------------------------------------------------------------ the step itself
    def train_step(self, s: State, images: Tensor, labels: Tensor, raw_masks: Tensor, valid: Tensor) -> None:
        """Everything one step computes, on tensors of `s` in place: (k, b) images, labels and raw masks
        (k, sites, b) in, and which of the b positions are real images (the last batch of an epoch is
        short: its padding gets weight 0); parameters, AdamW state and the epoch's sums updated."""
        cfg = self.cfg
        masks = raw_masks[..., None, None] * s["path_scales"]
        count = valid.sum()
        weights = (valid.to(s["loss_sum"].dtype) / count).expand(labels.shape)
        grads, (_, (losses, logits)) = self.grad_and_losses(self.stack.params, self.stack.buffers, images, labels,
                                                              masks, weights)
        with torch.no_grad():
            names = list(self.stack.params)
            if cfg.grad_clip > 0:  # each member by its own global norm (clip_grad_norm_per_member)
                squares = torch.stack([grads[n].flatten(1).pow(2).sum(1) for n in names]).sum(0)
                coef = (cfg.grad_clip / (squares.sqrt() + CLIP_EPS)).clamp(max=1.0)
                for n in names:
                    grads[n] = grads[n] * coef.to(grads[n].dtype).view(-1, *([1] * (grads[n].ndim - 1)))
            self.adamw(s, grads)
            for name in self.counted:
                self.stack.buffers[f"{name}.forward_count"].add_(1)
            s["loss_sum"].add_(losses.to(s["loss_sum"].dtype) * count)
            s["correct"].add_(((logits.argmax(-1) == labels) & valid).sum(-1))

    def adamw(self, s: State, grads: dict[str, Tensor]) -> None:
        """torch.optim.AdamW's update (decoupled weight decay, bias corrections at the new step count), on
        the optimizer's own state; lr from the schedule's table at the step count before this step."""
        for beta1, beta2, weight_decay, eps, entries in self.slots:
            for name, p, step, exp_avg, exp_avg_sq in entries:
                lr = s["lr_table"].index_select(0, step.long().view(1)).view(())  # no .item(): stays in the graph
                step.add_(1)
                t = step.to(torch.float64)
                grad = grads[name]
                p.mul_(1 - lr * weight_decay)
                exp_avg.lerp_(grad, 1 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                bias_correction1 = 1 - beta1 ** t
                bias_correction2_sqrt = (1 - beta2 ** t).sqrt()
                denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
                p.sub_((lr / bias_correction1) * exp_avg / denom)

    def one_step(self, s: State) -> None:
        """Step s['i'] of the epoch: its b positions of the epoch's tables, gathered on the device; then
        i += 1. The last step of an epoch whose length b does not divide is padded to b with the last image
        at weight 0, so every step has one shape and one graph (a second graph for the short batch cost a
        second compilation and, under CUDA graphs, a second memory pool). Exact: nothing mixes images
        within a batch (no batch statistics), so a weight-0 image changes no other image's loss or gradient,
        and the weights 1 / (real images) make the loss the real images' mean."""
        n = s["order"].shape[1]
        positions = s["i"] * self.cfg.resolved_batch_size + s["arange"]
        valid = positions < n
        positions = positions.clamp(max=n - 1)
        idx = s["order"].index_select(1, positions)
        draws = {name: table.index_select(1, positions) for name, table in self.aug_tables(s).items()}
        self.gather_and_step(s, idx, draws, s["masks"].index_select(2, positions), valid)
        s["i"].add_(1)

    @staticmethod
    def aug_tables(s: State) -> State:
        return {name[4:]: t for name, t in s.items() if name.startswith("aug_")}

    def gather_and_step(self, s: State, idx: Tensor, draws: State, raw_masks: Tensor, valid: Tensor) -> None:
        images = s["x_train"][idx]
        labels = s["y_train"][idx]
        self.train_step(s, augmented(images, draws, self.augment, self.crop_padding), labels, raw_masks, valid)

    # ------------------------------------------------------------------ an epoch
    def prepare(self, data: Splits, total_steps: int) -> None:
        """The tensors every graph reads (fixed addresses), made once."""
        cfg, k = self.cfg, len(self.models)
        n, b = len(data.x_train), cfg.resolved_batch_size
        self.augment = data.spec.augment if cfg.augment == "auto" else cfg.augment
        self.crop_padding = data.spec.crop_padding
        self.mask_dtype = path_mask_dtype(cfg, self.device)
        self.keeps = self.models[0]._path_keeps()
        self.steps = math.ceil(n / b)
        dev = self.device
        self.state = {
            "x_train": data.x_train, "y_train": data.y_train,
            "lr_table": self.lr_table(total_steps),
            "path_scales": self.models[0]._path_scales(self.mask_dtype, dev).view(1, -1, 1, 1, 1),
            "i": torch.zeros((), dtype=torch.long, device=dev),
            "arange": torch.arange(b, device=dev),
            "loss_sum": torch.zeros(k, device=dev), "correct": torch.zeros(k, dtype=torch.long, device=dev),
            "order": torch.zeros((k, n), dtype=torch.long, device=dev),
            "masks": torch.zeros((k, len(self.keeps), n), dtype=self.mask_dtype, device=dev),
        }
        if self.augment in ("crop", "crop_flip"):
            self.state.update({"aug_oy": torch.zeros((k, n), dtype=torch.long, device=dev),
                               "aug_ox": torch.zeros((k, n), dtype=torch.long, device=dev),
                               "aug_flip": torch.zeros((k, n), dtype=torch.bool, device=dev)})
        elif self.augment == "rotate":
            self.state["aug_degrees"] = torch.zeros((k, n), device=dev)
        for t in [*self.state.values(), *self.stack.params.values(), *self.stack.buffers.values(),
                  *(t for *_, entries in self.slots for _, _, *state in entries for t in state)]:
            torch._dynamo.mark_static_address(t)

    def run_epoch(self, randoms: list[MemberRandom], data: Splits) -> tuple[list[float], list[float], float]:
        """One epoch of every member: the batched draws, then one call (a replay, once captured) per step.
        Returns (mean training losses, training accuracies, seconds), one host sync at the end."""
        if not self.state:
            steps_per_epoch = math.ceil(len(data.x_train) / self.cfg.resolved_batch_size)
            self.prepare(data, max(1, self.cfg.epochs * steps_per_epoch))
        s, n = self.state, len(data.x_train)
        t0 = time.perf_counter()
        draws = draw_epoch(randoms, n, self.augment, self.crop_padding, self.keeps, self.mask_dtype, self.device)
        s["order"].copy_(draws.order)
        s["masks"].copy_(draws.masks)
        for name, table in draws.augment.items():
            s[f"aug_{name}"].copy_(table)
        for name in ("i", "loss_sum", "correct"):
            s[name].zero_()
        for _ in range(self.steps):
            for model in self.models:
                advance_redraws(model)
            self.graph.step(lambda fn: fn(s))
            self.scheduler_step()
        losses = [total / n for total in s["loss_sum"].tolist()]
        accs = [hits / n for hits in s["correct"].tolist()]
        metrics.synchronize(self.device)
        return losses, accs, time.perf_counter() - t0

    def scheduler_step(self) -> None:
        """LambdaLR's step (its state goes into checkpoints; the graph reads the same values from its table).
        torch warns that the optimizer has not stepped, since AdamW's own step() never runs here: the
        graph applies its update; the warning is silenced for that reason only."""
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
            self.scheduler.step()

    # ------------------------------------------------------------------ the Stepper interface
    def train(self) -> None:
        self.stack.train()

    def step(self, images: list[Tensor], labels: list[Tensor], masks: list[Tensor]) -> tuple[Tensor, Tensor]:
        raise TypeError("compile 'graph' steps whole epochs (run_epoch): its inputs are drawn on the device")

    def last_lr(self) -> float:
        return self.scheduler.get_last_lr()[0]

    def member_optimizer_state(self, i: int) -> dict:
        return self.stack.member_optimizer_state(self.optimizer.state_dict(), i)

    def scheduler_for(self, i: int) -> object:
        return self.scheduler

    def load_optimizer_states(self, states: list[dict], scheduler_state: dict) -> None:
        self.optimizer.load_state_dict(StackedModels.stack_optimizer_states(states))
        self.scheduler.load_state_dict(scheduler_state)
        self.bind_optimizer_state()


def advance_redraws(model: nn.Module) -> None:
    """A step begins: each kernelized layer's host schedule (redraw where due), without its device-side
    count, which the graph adds (WholeStep.train_step)."""
    for module in model.modules():
        if isinstance(module, KernelizedAttention):  # WholeStep refuses any other RandomFeatureBackend
            module.advance_step(count_on_device=False)


__all__ = ["EpochDraws", "WholeStep", "WholeStepError", "advance_redraws", "augmented", "draw_epoch"]
