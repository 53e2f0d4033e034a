"""The `train` task: fit a ViT, evaluate it, return one summary row; and the one training loop.

Readable in one sitting (nanoGPT style): data on the device, AdamW + warm-up/cosine (or WSD)
schedule, label smoothing, gradient clipping, bf16 autocast on GPU, a checkpoint after every epoch
that a resumed run continues from exactly (model, optimiser, scheduler, RNG states, history).

There is one loop, `train_members`: a solo trial is a group of one, and a fused seed group
(tasks/train_group.py) is k members of one recipe in the same loop. How a step is computed for the
members (each in turn, or stacked and vmapped) is the Stepper's business (tasks/steppers.py); each
member's random streams are its own (tasks/generators.py). A change to training is made once.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpevit import checkpoint, metrics
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import ConfigError, TrialConfig, field_error
from rpevit.data import Splits, augment_images, batch_indices, load_splits
from rpevit.evaluation import (FIDELITY_IMAGES, EvalLog, fidelity_row, final_evaluation, random_feature_layers,
                               rotation_keys)
from rpevit.flops import count_flops
from rpevit.models import build_model
from rpevit.registry import TaskMetrics, register_task
from rpevit.tasks.budget_ladder import Branch, TrunkPaused, last_branch_epoch, plan_branches, write_branches
from rpevit.tasks.generators import MemberRandom, member_random
from rpevit.tasks.schedule import (WARMUP_MAX_FRACTION, cooldown_start, lr_factor, warmup_cosine,  # noqa: F401
                                   warmup_stable_decay, warmup_steps_for)
from rpevit.tasks.steppers import StackedStep, Stepper, make_stepper
from rpevit.tasks.whole_step import WholeStep
from rpevit.training import autocast_context, default_dtype, path_mask_dtype

EpochCallback = Callable[[dict, "Path | None"], None]
MemberEpoch = Callable[[int, dict, "Path | None"], None]  # (member index, epoch row, its checkpoint dir)
Outcome = Union[dict, BaseException]  # a member's summary row, or why it failed


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite. Deterministic: a run resumed from its last checkpoint
    replays the same steps (tests/test_sweep_cli.py's sigkill resume equals an uninterrupted run), so it
    diverges again; the sweep records it failed at once instead of retrying it (sweep/trainable.py)."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("field 'device' has value 'cuda' but torch sees no CUDA device; allowed here: cpu, auto")
    return torch.device(name)


@torch.no_grad()
def predict(model: nn.Module, data: Splits, x: Tensor, cfg: TrialConfig, device: torch.device) -> Tensor:
    """Float32 logits of every image in x, in eval mode, in batches."""
    model.eval()
    out = []
    for idx in batch_indices(len(x), cfg.eval_batch_size):
        with autocast_context(cfg, device):
            out.append(model(data.normalize(x[idx.to(x.device)])).float())
    return torch.cat(out) if out else torch.empty(0, data.spec.num_classes, device=device)


def save_checkpoint(path: Path, payload: dict) -> None:
    """Atomic: a kill during the write leaves the previous checkpoint intact."""
    checkpoint.save(path, payload)


METRICS = TaskMetrics(
    headline={"test_acc": float, "final_val_acc": float},
    other={"precision": float, "recall": float, "f1": float, "log_likelihood": float,
           "test_acc_draw_mean": float, "test_acc_draw_std": float, "test_acc_draw_min": float,
           "val_acc_draw_mean": float,
           "test_acc_draw_ensemble": float, "test_acc_softmax_swap": float, "attn_tv_to_softmax": float,
           "attn_tv_per_layer": list[float], "aic": float, "bic": float, "params": int, "flops": int,
           "flops_unsupported": str, "train_s_per_epoch": float, "images_per_s": float,
           "infer_ms_per_sample": float, "peak_mem_mb": float, "peak_mem_kind": str, "n_train": int, "n_test": int,
           "fused_members": int, "compile_fallback": str, **dict.fromkeys(rotation_keys(), float)},
    epoch={"train_loss": float, "train_acc": float, "val_loss": float, "val_acc": float, "lr": float,
           "epoch_s": float, "attn_tv_to_softmax": float, "attn_tv_per_layer": list[float],
           "device_name": str, "git_commit": str},
)


def one_draw_note(model: nn.Module, cfg: TrialConfig) -> str | None:
    """A warning for a random-feature model trained on one draw (redraw_interval 0): such a model can learn
    its own random kernel (MNIST: favor+ape 98.7 % on its draw, 29 % over fresh draws), so it must be judged
    by test_acc_draw_mean, not test_acc. None for other runs."""
    if cfg.redraw_interval != 0 or not random_feature_layers(model):
        return None
    return ("note: redraw_interval 0 trains on one random-feature draw; the model can learn its own kernel, so "
            "judge it by test_acc_draw_mean (docs/random_features.md; the studies use --redraw-interval 100 "
            "with --redraw-until 0.8)")


def check_config(cfg: TrialConfig, source: str) -> None:
    """Training reads the dataset at its native size: image_size is 0 (the recipe's) or that size."""
    native = cfg.spec.image_size
    if (cfg.image_size or native) != native:
        raise field_error(source, "image_size", cfg.image_size,
                          f"0 or {native} for dataset {cfg.dataset!r} (train uses native size)")


@register_task("train", METRICS, check=check_config)
def train_and_evaluate(cfg: TrialConfig, *, checkpoint_dir: str | Path | None = None,
                       on_epoch: EpochCallback | None = None, log: Callable[[str], None] | None = print,
                       extend_epochs: bool = False, branches: Sequence[Branch] = (),
                       pause_at_branch: bool = False) -> dict:
    """Train and evaluate one trial: a group of one through `train_members`; returns its summary row
    (config + metrics + environment), or raises what it failed with.

    A checkpoint in checkpoint_dir is checked against cfg before anything else (rpevit.checkpoint);
    extend_epochs lets it continue to more epochs than the run that wrote it planned. `branches`: the
    shorter runs of a budget ladder this run is the trunk of; each gets its checkpoint at its cool-down
    start (rpevit.tasks.budget_ladder). `pause_at_branch`: stop after the last branch's epoch, its
    checkpoint written, and raise TrunkPaused (sweep.py --rungs-first); needs checkpoint_dir.
    """
    if pause_at_branch and checkpoint_dir is None:
        raise ConfigError("pause_at_branch is set without a checkpoint_dir; allowed: a checkpoint_dir (a paused "
                          "trunk continues from its checkpoint)")
    opened = checkpoint.open_for_resume(checkpoint_dir, cfg, extend_epochs=extend_epochs)
    report = (lambda _i, row, folder: on_epoch(row, folder)) if on_epoch is not None else None
    outcome, = train_members([cfg], [opened], on_epoch=report, log=log, branches=[branches],
                             pause_at_branch=pause_at_branch)
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


@dataclass
class Member:
    """One run in the loop: its config, model, random streams, checkpoint and history."""

    cfg: TrialConfig
    model: nn.Module
    random: MemberRandom
    ckpt_path: Path | None
    resume_state: dict | None
    tag: str  # "" alone, "[seed s] " in a group: the prefix of its log lines
    history: list[dict] = field(default_factory=list)
    due: dict[int, list[Branch]] = field(default_factory=dict)  # trunk epoch -> branches written after it


def train_members(cfgs: list[TrialConfig], opened: list[tuple[Path | None, dict | None]], *,
                  on_epoch: MemberEpoch | None = None, log: Callable[[str], None] | None = print,
                  branches: Sequence[Sequence[Branch]] | None = None, tagged: bool = False,
                  pause_at_branch: bool = False) -> list[Outcome]:
    """The training loop of every `train` run: k members of one recipe (k = 1: a solo trial; k > 1: a
    fused seed group, rpevit.tasks.train_group) that start at the same epoch, stepped by one Stepper
    (rpevit.tasks.steppers). `opened`: each member's (checkpoint path, resume state) from
    checkpoint.open_for_resume. Returns, per member, its summary row or the exception it failed with:
    a member whose loss diverges fails at the end of that epoch and the others go on. `tagged`: each
    log line starts with the member's seed (always so for k > 1). `pause_at_branch` (one member): stop after
    the epoch its last branch starts from, with TrunkPaused as its outcome (train_and_evaluate)."""
    log = log or (lambda _msg: None)
    cfgs = [c.resolved() for c in cfgs]  # what runs: the recipe's init, clipping, redraw, ... where left to it
    cfg, k = cfgs[0], len(cfgs)
    device = resolve_device(cfg.device)
    for path, state in opened:  # before the data load: a checkpoint of another device kind cannot continue here
        if state is not None:
            checkpoint.check_device(state, device.type, path)
    outcomes: list[Outcome | None] = [None] * k
    with default_dtype(cfg) as dtype:  # buffers built in float32 follow the parameters
        data = load_splits(cfg.dataset, data_dir=cfg.data_dir or None, device=device,
                           val_fraction=cfg.val_fraction, train_subset=cfg.train_subset)
        members = []
        for member_cfg, (path, state) in zip(cfgs, opened):
            model = build_model(member_cfg, data.spec.channels, data.spec.num_classes).to(device, dtype)
            members.append(Member(member_cfg, model, member_random(member_cfg.seed, device, alone=k == 1), path,
                                  state, f"[seed {member_cfg.seed}] " if tagged or k > 1 else ""))
        steps_per_epoch = math.ceil(len(data.x_train) / cfg.resolved_batch_size)
        total_steps = max(1, cfg.epochs * steps_per_epoch)
        for member in members:
            set_training_length(member.model, total_steps)  # redraw_until counts in training steps
        if note := one_draw_note(members[0].model, cfg):
            log(note)
        stepper = make_stepper([m.model for m in members], cfg, device, data.normalize,
                               lr_factor(cfg, steps_per_epoch, total_steps), log)
        if isinstance(stepper, StackedStep):
            log(f"fused group of {k} ({', '.join(m.tag.strip() for m in members)}): parameters stacked, one "
                f"vmapped step" + (f", compiled ({cfg.compile})" if cfg.compile != "off" else ""))
        elif k == 1 and tagged:  # a member of a fused group whose checkpoint stands apart from the others'
            log(f"fused group of 1 ({members[0].tag.strip()}): one member at this epoch, stepped alone")
        start_epoch = int(opened[0][1]["epoch"]) if opened[0][1] is not None else 0
        for member, own in zip(members, branches or [()] * k):
            member.due = plan_branches(member.cfg, own, steps_per_epoch, start_epoch, log) if own else {}
        if opened[0][1] is not None:
            resume(members, stepper, log)

        stop = cfg.epochs
        if pause_at_branch:
            if k != 1:
                raise ValueError(f"pause_at_branch is for one member; this group has {k}")
            stop = min(cfg.epochs, last_branch_epoch(cfg, (branches or [()])[0], steps_per_epoch) or cfg.epochs)
        alive = list(range(k))
        for epoch in range(start_epoch, stop):
            losses, accs, epoch_s = train_epoch(stepper, members, data)
            for i in list(alive):
                if not math.isfinite(losses[i]):
                    outcomes[i] = DivergedError(diverged_message(losses[i], epoch, cfgs[i]))
                    alive.remove(i)
                    if k > 1:
                        log(f"{members[i].tag}{outcomes[i]}: recorded as failed, the other members go on")
                    continue
                end_epoch(members[i], i, stepper, data, device, epoch, (losses[i], accs[i], epoch_s), on_epoch, log)
            if not alive:
                break

        for i in alive:
            member = members[i]
            if stop < cfg.epochs:  # paused at its last branch: its checkpoint holds epoch `stop`, no row yet
                outcomes[i] = TrunkPaused(max(stop, start_epoch), cfg.epochs)
                log(f"{member.tag}{outcomes[i]}")
                continue
            try:
                outcomes[i] = {**summarize(member.model, data, member.cfg, device, member.history,
                                           lambda msg, tag=member.tag: log(f"{tag}{msg}"),
                                           compile_fallback=stepper.forward_loss.fallback), "fused_members": k}
            except Exception as err:  # noqa: BLE001 - one member's evaluation failing fails that member only
                outcomes[i] = err
    return outcomes  # type: ignore[return-value]


def resume(members: list[Member], stepper: Stepper, log: Callable[[str], None]) -> None:
    """Load every member's checkpoint (model, random streams, history; optimizer and schedule through
    the stepper); one that does not fit this code fails with CheckpointError naming it."""
    for member in members:
        with fitting(member.ckpt_path):
            member.model.load_state_dict(member.resume_state["model"])
            member.random.load(member.resume_state["rng"])
        member.history = list(member.resume_state["history"])
    first = members[0]
    with fitting(first.ckpt_path):
        stepper.load_optimizer_states([m.resume_state["optimizer"] for m in members], first.resume_state["scheduler"])
    start_epoch = int(first.resume_state["epoch"])
    if len(members) > 1:
        log(f"fused group of {len(members)}: resumed from the members' checkpoints after epoch {start_epoch}")
        return
    planned = int(checkpoint.stored_fingerprint(first.resume_state, first.ckpt_path)["epochs"])
    log(f"resumed from {first.ckpt_path} after epoch {start_epoch}"
        + (f", extended from {planned} to {first.cfg.epochs} epochs" if planned != first.cfg.epochs else ""))


@contextmanager
def fitting(path: Path | None) -> Iterator[None]:
    """Turn a state that does not load into this model into CheckpointError naming the checkpoint."""
    try:
        yield
    except (RuntimeError, KeyError, ValueError, TypeError) as err:
        raise checkpoint.CheckpointError(
            f"checkpoint {path} does not fit this model ({type(err).__name__}: "
            f"{' '.join(str(err).split())[:300]}); allowed: a checkpoint of this code and config; "
            f"delete it to start afresh") from err


def train_epoch(stepper: Stepper, members: list[Member], data: Splits) -> tuple[list[float], list[float], float]:
    """One epoch of every member: (mean training losses, training accuracies, seconds). One host sync
    at the end, none per step."""
    stepper.train()
    if isinstance(stepper, WholeStep):  # compile: graph draws the epoch's inputs on the device, then replays
        return stepper.run_epoch([m.random for m in members], data)
    cfg, device = members[0].cfg, data.x_train.device
    n_train, k = len(data.x_train), len(members)
    augment = data.spec.augment if cfg.augment == "auto" else cfg.augment
    mask_dtype = path_mask_dtype(cfg, device)
    t0 = time.perf_counter()
    loss_sum = torch.zeros(k, device=device)  # the default dtype
    correct = torch.zeros(k, device=device, dtype=torch.long)
    orders = [batch_indices(n_train, cfg.resolved_batch_size, m.random.data) for m in members]
    for batches in zip(*orders):
        images, labels, masks = step_inputs(data, batches, [m.random.data for m in members], augment,
                                            [m.model for m in members], [m.random.masks for m in members],
                                            mask_dtype)
        losses, logits = stepper.step(images, labels, masks)
        loss_sum += losses.detach() * len(batches[0])
        correct += (logits.argmax(-1) == torch.stack(labels)).sum(-1)
    train_losses = [total / n_train for total in loss_sum.tolist()]
    train_accs = [hits / n_train for hits in correct.tolist()]
    metrics.synchronize(device)
    return train_losses, train_accs, time.perf_counter() - t0


def step_inputs(data: Splits, batches: tuple[Tensor, ...], data_generators: list[torch.Generator], augment: str,
                models: list[nn.Module], mask_generators: list[torch.Generator],
                mask_dtype: torch.dtype) -> tuple[list[Tensor], list[Tensor], list[Tensor]]:
    """Each member's images (augmented with its generator), labels and stochastic-depth masks (drawn
    from its generator) for one step, after advancing its random features (redraws where due, outside
    the compilable forward): what a solo run does before its forward, member by member, in that order."""
    images, labels = [], []
    for i, idx in enumerate(batches):
        images.append(augment_images(data.x_train[idx], data_generators[i], augment, data.spec.crop_padding))
        labels.append(data.y_train[idx])
    for model in models:
        advance_random_features(model)
    masks = [m.draw_path_masks(len(batches[0]), dtype=mask_dtype, device=data.x_train.device, generator=g)
             for m, g in zip(models, mask_generators)]
    return images, labels, masks


def end_epoch(member: Member, i: int, stepper: Stepper, data: Splits, device: torch.device, epoch: int,
              figures: tuple[float, float, float], on_epoch: MemberEpoch | None, log: Callable[[str], None]) -> None:
    """A member's epoch row (validation, fidelity), its log line, its checkpoint, the budget-ladder
    branches due after this epoch, then the caller's callback."""
    train_loss, train_acc, epoch_s = figures
    row = epoch_row(member.model, data, member.cfg, device, epoch, train_loss, train_acc, stepper.last_lr(), epoch_s)
    member.history.append(row)
    log(f"{member.tag}{epoch_line(row, member.cfg)}")
    optimizer_state, rng = stepper.member_optimizer_state(i), member.random.state()
    # The branches before the trunk's own checkpoint: a kill between the two leaves the trunk at the epoch
    # before, so its resume writes a missing branch again (plan_branches) instead of having passed it.
    if epoch + 1 in member.due:
        write_branches(member.due[epoch + 1], lambda rung: checkpoint_payload(
            member.model, optimizer_state, stepper.scheduler_for(i), rng, member.history, epoch, rung), log)
    if member.ckpt_path is not None:
        save_checkpoint(member.ckpt_path, checkpoint_payload(member.model, optimizer_state, stepper.scheduler_for(i),
                                                             rng, member.history, epoch, member.cfg))
    if on_epoch is not None:
        on_epoch(i, row, member.ckpt_path.parent if member.ckpt_path is not None else None)


def diverged_message(train_loss: float, epoch: int, cfg: TrialConfig) -> str:
    return f"training loss is {train_loss} at epoch {epoch + 1} (lr={cfg.resolved_lr}, grad_clip={cfg.grad_clip})"


def epoch_row(model: nn.Module, data: Splits, cfg: TrialConfig, device: torch.device, epoch: int,
              train_loss: float, train_acc: float, lr: float, epoch_s: float) -> dict:
    """One epoch row: training figures, validation, lr, time and attention fidelity, and where it ran (the
    device and the commit): stored in the checkpoint's history with the row, so the epochs of a run resumed on
    another machine or commit still say where each ran (the summary row names only the run that finished it)."""
    return {"epoch": epoch + 1, "train_loss": train_loss, "train_acc": train_acc,
            **_validation(model, data, cfg, device), "lr": lr, "epoch_s": epoch_s,
            **fidelity_row(model, fidelity_batch(data)),
            "device_name": metrics.device_name(device), "git_commit": metrics.git_commit()}


def epoch_line(row: dict, cfg: TrialConfig) -> str:
    return (f"epoch {row['epoch']}/{cfg.epochs} train_loss {row['train_loss']:.4f} "
            f"train_acc {row['train_acc']:.4f} val_loss {row['val_loss']:.4f} "
            f"val_acc {row['val_acc']:.4f} lr {row['lr']:.2e} {row['epoch_s']:.1f}s")


def checkpoint_payload(model: nn.Module, optimizer_state: dict, scheduler: object, rng: dict,
                       history: list[dict], epoch: int, cfg: TrialConfig) -> dict:
    """What a checkpoint holds after `epoch` (0-based): the same layout for a solo run and for a
    member of a fused group, so either can continue the other's checkpoint."""
    return {"model": model.state_dict(), "optimizer": optimizer_state, "scheduler": scheduler.state_dict(),
            "rng": rng, "history": history, "epoch": epoch + 1, "config": cfg.to_dict(),
            "fingerprint": checkpoint.fingerprint(cfg)}


def _validation(model: nn.Module, data: Splits, cfg: TrialConfig, device: torch.device) -> dict:
    if len(data.x_val) == 0:
        return {"val_loss": float("nan"), "val_acc": float("nan")}
    logits = predict(model, data, data.x_val, cfg, device)
    return {"val_loss": F.cross_entropy(logits, data.y_val).item(),
            "val_acc": (logits.argmax(-1) == data.y_val).float().mean().item()}


def fidelity_batch(data: Splits) -> Tensor:
    """The fixed, normalised test images of the attention-fidelity metric (the same every epoch)."""
    return data.normalize(data.x_test[:FIDELITY_IMAGES])


def summarize(model: nn.Module, data: Splits, cfg: TrialConfig, device: torch.device,
              history: list[dict], log: Callable[[str], None] | None = None, compile_fallback: str = "") -> dict:
    """Test metrics, draw-aware and softmax-swap accuracy, attention fidelity, information criteria,
    FLOPs, timing, memory and environment in one flat row; `log` gets a progress line per stage of
    the evaluation (rpevit.evaluation.EvalLog) as the training gets one per epoch. `compile_fallback`:
    why a compiled run went eager ("" when it did not: rpevit.training.GuardedCompile)."""
    progress = EvalLog(log or (lambda _msg: None), stages=4)
    draw_aware = final_evaluation(model, data, cfg, device, progress)
    with progress.stage(f"fidelity on {FIDELITY_IMAGES} test images") as note:
        draw_aware.update(fidelity_row(model, fidelity_batch(data)))
        note["result"] = f"attn_tv_to_softmax {draw_aware['attn_tv_to_softmax']:.4f},"
    params = metrics.count_parameters(model)
    with progress.stage("FLOPs") as note:
        flops, unsupported = count_flops(model, data.normalize(data.x_test[:2]))
        note["result"] = f"{flops:,} per image,"
    batch = data.normalize(data.x_test[: cfg.eval_batch_size])

    def infer() -> None:
        with torch.no_grad(), autocast_context(cfg, device):
            model(batch)

    model.eval()
    with progress.stage(f"inference timing (batch {len(batch)})") as note:
        infer_s = metrics.median_time(infer, device, warmup=2, iters=5)
        note["result"] = f"{1000.0 * infer_s / len(batch):.3f} ms per image,"
    epoch_times = [row["epoch_s"] for row in history]
    train_s_per_epoch = sum(epoch_times) / len(epoch_times) if epoch_times else float("nan")
    peak_mb, peak_kind = metrics.peak_memory_mb(device)
    return {
        **cfg.resolved().to_dict(),
        **draw_aware,
        **metrics.information_criteria(draw_aware["log_likelihood"], params, len(data.y_test)),
        "params": params,
        "flops": flops,
        "flops_unsupported": ",".join(sorted(unsupported)),
        "train_s_per_epoch": train_s_per_epoch,
        "images_per_s": len(data.x_train) / train_s_per_epoch if epoch_times else float("nan"),
        "infer_ms_per_sample": 1000.0 * infer_s / len(batch),
        "peak_mem_mb": peak_mb,
        "peak_mem_kind": peak_kind,
        "n_train": len(data.x_train),
        "n_test": len(data.y_test),
        "fused_members": 1,  # a fused group's members say how many trained together (their times are the group's)
        "compile_fallback": compile_fallback,
        "epochs_done": len(history),
        "final_val_acc": history[-1]["val_acc"] if history else float("nan"),
        **metrics.environment(device),
    }
