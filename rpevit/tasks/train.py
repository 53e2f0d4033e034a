"""The `train` task: fit one ViT, evaluate it, return one summary row.

Readable in one sitting (nanoGPT style): data on the device, AdamW + warm-up/cosine schedule,
label smoothing, gradient clipping, bf16 autocast on GPU, a checkpoint after every epoch that a
resumed run continues from exactly (model, optimiser, scheduler, RNG states, history).
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rpevit import checkpoint, metrics
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import TrialConfig, field_error
from rpevit.data import Splits, augment_images, batch_indices, load_splits
from rpevit.evaluation import (FIDELITY_IMAGES, EvalLog, fidelity_row, final_evaluation, random_feature_layers,
                               rotation_keys)
from rpevit.flops import count_flops
from rpevit.models import build_model
from rpevit.registry import TaskMetrics, register_task
from rpevit.tasks.budget_ladder import Branch, plan_branches, write_branches
from rpevit.tasks.schedule import (WARMUP_MAX_FRACTION, cooldown_start, lr_factor, warmup_cosine,  # noqa: F401
                                   warmup_stable_decay, warmup_steps_for)
from rpevit.training import (autocast_context, default_dtype, forward_loss_fn, make_adamw,  # noqa: F401
                             path_mask_dtype)

EpochCallback = Callable[[dict, "Path | None"], None]


class DivergedError(RuntimeError):
    """The training loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("field 'device' has value 'cuda' but torch sees no CUDA device; allowed here: cpu, auto")
    return torch.device(name)


def make_optimizer(model: nn.Module, cfg: TrialConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on what the model declares in `no_weight_decay()` (biases, norms,
    temperatures, every position-encoding parameter), decay on the rest (weight matrices)."""
    device = next(model.parameters()).device
    return make_adamw(model.named_parameters(), model.no_weight_decay(), cfg, device)


@torch.no_grad()
def predict(model: nn.Module, data: Splits, x: Tensor, cfg: TrialConfig, device: torch.device) -> Tensor:
    """Float32 logits of every image in x, in eval mode, in batches."""
    model.eval()
    out = []
    for idx in batch_indices(len(x), cfg.eval_batch_size):
        with autocast_context(cfg, device):
            out.append(model(data.normalize(x[idx.to(x.device)])).float())
    return torch.cat(out) if out else torch.empty(0, data.spec.num_classes, device=device)


def _rng_state(device: torch.device, generator: torch.Generator) -> dict:
    state = {"torch": torch.get_rng_state(), "data": generator.get_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    generator.set_state(state["data"])
    if device.type == "cuda" and "cuda" in state:  # a CPU checkpoint continued on GPU has none
        torch.cuda.set_rng_state(state["cuda"], device)


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
           "epoch_s": float, "attn_tv_to_softmax": float, "attn_tv_per_layer": list[float]},
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
                       extend_epochs: bool = False, branches: Sequence[Branch] = ()) -> dict:
    """Train and evaluate; returns the summary row (config + metrics + environment).

    A checkpoint in checkpoint_dir is checked against cfg before anything else (rpevit.checkpoint);
    extend_epochs lets it continue to more epochs than the run that wrote it planned. `branches`: the
    shorter runs of a budget ladder this run is the trunk of; each gets its checkpoint at its cool-down
    start (rpevit.tasks.budget_ladder).
    """
    log = log or (lambda _msg: None)
    ckpt_path, resume_state = checkpoint.open_for_resume(checkpoint_dir, cfg, extend_epochs=extend_epochs)
    device = resolve_device(cfg.device)
    with default_dtype(cfg) as dtype:  # buffers built in float32 follow the parameters
        data = load_splits(cfg.dataset, data_dir=cfg.data_dir or None, device=device,
                           val_fraction=cfg.val_fraction, train_subset=cfg.train_subset)
        model = build_model(cfg, data.spec.channels, data.spec.num_classes).to(device, dtype)
        optimizer = make_optimizer(model, cfg)
        n_train = len(data.x_train)
        batch_size = cfg.resolved_batch_size
        steps_per_epoch = math.ceil(n_train / batch_size)
        total_steps = max(1, cfg.epochs * steps_per_epoch)
        set_training_length(model, total_steps)  # redraw_until counts in training steps
        if note := one_draw_note(model, cfg):
            log(note)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(cfg, steps_per_epoch, total_steps))
        generator = torch.Generator(device=device).manual_seed(cfg.seed)  # data order + augmentation
        augment = data.spec.augment if cfg.augment == "auto" else cfg.augment
        forward_loss = forward_loss_fn(cfg, device, data.normalize, log)
        mask_dtype = path_mask_dtype(cfg, device)
        history: list[dict] = []
        start_epoch = 0
        if resume_state is not None:
            start_epoch = int(resume_state["epoch"])
        due = plan_branches(cfg, branches, steps_per_epoch, start_epoch, log) if branches else {}

        if resume_state is not None:  # loaded with weights_only=True and matched to cfg
            state = resume_state
            try:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                _set_rng_state(state["rng"], device, generator)
            except (RuntimeError, KeyError, ValueError, TypeError) as err:
                raise checkpoint.CheckpointError(
                    f"checkpoint {ckpt_path} does not fit this model ({type(err).__name__}: "
                    f"{' '.join(str(err).split())[:300]}); allowed: a checkpoint of this code and config; "
                    f"delete it to start afresh") from err
            history, start_epoch = list(state["history"]), int(state["epoch"])
            planned = int(checkpoint.stored_fingerprint(state, ckpt_path)["epochs"])
            log(f"resumed from {ckpt_path} after epoch {start_epoch}"
                + (f", extended from {planned} to {cfg.epochs} epochs" if planned != cfg.epochs else ""))

        for epoch in range(start_epoch, cfg.epochs):
            model.train()
            t0 = time.perf_counter()
            loss_sum = torch.zeros((), device=device)
            correct = torch.zeros((), device=device, dtype=torch.long)
            for idx in batch_indices(n_train, batch_size, generator):
                images = data.x_train[idx]
                images = augment_images(images, generator, augment, data.spec.crop_padding)
                labels = data.y_train[idx]
                advance_random_features(model)  # redraws where due, outside the (compilable) forward
                # the stochastic-depth masks the eager forward would draw from the global RNG, drawn first
                masks = model.draw_path_masks(len(idx), dtype=mask_dtype, device=device)
                loss, logits = solo_step(model, optimizer, scheduler, forward_loss, images, labels, masks,
                                         cfg.grad_clip)
                loss_sum += loss.detach() * len(idx)
                correct += (logits.argmax(-1) == labels).sum()
            train_loss = loss_sum.item() / n_train  # one sync per epoch, not per step
            if not math.isfinite(train_loss):
                raise DivergedError(diverged_message(train_loss, epoch, cfg))
            metrics.synchronize(device)
            epoch_s = time.perf_counter() - t0
            row = epoch_row(model, data, cfg, device, epoch, train_loss, correct.item() / n_train,
                            scheduler.get_last_lr()[0], epoch_s)
            history.append(row)
            log(epoch_line(row, cfg))
            if ckpt_path is not None:
                save_checkpoint(ckpt_path, checkpoint_payload(model, optimizer.state_dict(), scheduler,
                                                              _rng_state(device, generator), history, epoch, cfg))
            if epoch + 1 in due:
                state = (optimizer.state_dict(), _rng_state(device, generator))
                write_branches(due[epoch + 1], lambda rung: checkpoint_payload(model, state[0], scheduler, state[1],
                                                                               history, epoch, rung), log)
            if on_epoch is not None:
                on_epoch(row, ckpt_path.parent if ckpt_path is not None else None)

        return summarize(model, data, cfg, device, history, log, compile_fallback=forward_loss.fallback)


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


def diverged_message(train_loss: float, epoch: int, cfg: TrialConfig) -> str:
    return f"training loss is {train_loss} at epoch {epoch + 1} (lr={cfg.resolved_lr}, grad_clip={cfg.grad_clip})"


def epoch_row(model: nn.Module, data: Splits, cfg: TrialConfig, device: torch.device, epoch: int,
              train_loss: float, train_acc: float, lr: float, epoch_s: float) -> dict:
    """One epoch row: training figures, validation, lr, time and attention fidelity."""
    return {"epoch": epoch + 1, "train_loss": train_loss, "train_acc": train_acc,
            **_validation(model, data, cfg, device), "lr": lr, "epoch_s": epoch_s,
            **fidelity_row(model, fidelity_batch(data))}


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
