"""Every cell of search_spaces/all12.yaml as the GPU runs it: a fused seed group (k members stacked, one
vmapped step), compiled (`compile: on`), under bf16 autocast, at the cell's own token count (MNIST: 7 x 7
= 49 tokens, CIFAR-10: 8 x 8 = 64), checked against the same members' eager solo steps.

Used by tests/test_gpu.py (CUDA, Inductor) and by the CPU rehearsal of the device
(benchmarks/gpu_rehearsal.sh: `python -m tests.all12_cells --device cpu`). What a cell's check does:

1. builds k members from the cell's config (the space's own width, heads, patch, drop path, random
   features; depth cut to `depth`, since compile time grows with depth and the ops do not), and a
   deep copy of each for the solo runs: the same initial weights;
2. steps both `steps` times on the same synthetic batches, with the same drop-path masks and
   random-feature redraws (redraw_interval 2, so a redraw happens inside the check): the fused group
   through StackedStep (compiled, clipped per member, one AdamW), each solo copy through solo_step
   with compile off (eager);
3. compares, per member, the clipped gradients of every step (relative L2 error over every
   parameter), every step's loss, and the parameters after the last step. Under bf16 the two differ
   by rounding (a few 1e-3 relative); a wrong kernel differs by O(1). Every step, not the first only:
   under CUDA graphs (`compile: cudagraphs`) the first step runs the compiled code without a graph
   (warm-up), the second records it, and only the third and later replay it, reading their inputs from
   the captured buffers; a replay that read a stale buffer (a redraw that replaced a tensor instead of
   copying into it) would be wrong from step 3 on, in the gradients and the update before any loss
   (issue 60). A compile that fell back to eager is a failure here (the check is about the compiled
   path), named with its reason.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import torch

from rpevit import registry, training
from rpevit.analysis.common import write_text_file
from rpevit.attention.kernelized import advance_random_features, set_training_length
from rpevit.config import TrialConfig
from rpevit.data import synthetic_splits
from rpevit.models import build_model
from rpevit.sweep.space import load_space
from rpevit.tasks.schedule import warmup_cosine
from rpevit.tasks.steppers import make_optimizer, solo_step
from rpevit.tasks.steppers import StackedStep
from rpevit.training import forward_loss_fn, path_mask_dtype

ROOT = Path(__file__).resolve().parent.parent
ALL12 = ROOT / "search_spaces" / "all12.yaml"
TOLERANCE = {"bf16": 0.05, "none": 1e-4}  # relative error allowed: bf16 rounding vs float32 rounding


def all12_cells(depth: int | None = 2, device: str = "cuda", amp: str = "bf16") -> list[TrialConfig]:
    """One config per (dataset, attention, pe) of all12.yaml, as the space resolves it (seed 0), with the
    depth cut to `depth` (None: the space's), a small batch, and a redraw every 2 steps."""
    registry.load_all()
    cells: dict[tuple, TrialConfig] = {}
    for values in load_space(ALL12).trials:
        key = (values["dataset"], values["attention"], values["pe"])
        if key not in cells:
            cfg = TrialConfig.from_dict({**values, "seed": 0, "device": device, "amp": amp, "batch_size": 8,
                                         "redraw_interval": 2})
            cells[key] = cfg.replace(depth=depth) if depth else cfg
    return list(cells.values())


def cell_id(cfg: TrialConfig) -> str:
    tokens = (cfg.spec.image_size // cfg.resolved_patch_size) ** 2
    return f"{cfg.dataset}-{tokens}tok-{cfg.attention}+{cfg.pe}"


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def check_cell(cfg: TrialConfig, members: int = 3, steps: int = 3) -> dict[str, Any]:
    """The check of the module docstring for one cell; returns its figures (errors, times, fallback)."""
    device = torch.device(cfg.device)
    torch.manual_seed(0)
    cfgs = [cfg.replace(seed=s) for s in range(members)]
    spec = cfg.spec
    data = synthetic_splits(cfg.dataset, members * steps * cfg.resolved_batch_size, device)
    fused_models = [build_model(c, spec.channels, spec.num_classes).to(device) for c in cfgs]
    solo_models = [copy.deepcopy(m) for m in fused_models]
    for model in fused_models + solo_models:
        set_training_length(model, 10 * steps)
        model.train()
    schedule = warmup_cosine(10 * steps, 1)
    logs: list[str] = []
    stepper = StackedStep(fused_models, cfg, device, data.normalize, schedule, logs.append)
    solo_cfg = cfg.replace(compile="off")
    solo = []
    for model in solo_models:
        optimizer = make_optimizer(model, solo_cfg)
        solo.append((model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule),
                     forward_loss_fn(solo_cfg, device, data.normalize)))
    mask_dtype = path_mask_dtype(cfg, device)
    fused_masks = [torch.Generator(device=device).manual_seed(100 + i) for i in range(members)]
    solo_masks = [torch.Generator(device=device).manual_seed(100 + i) for i in range(members)]
    batch = cfg.resolved_batch_size
    grad_errors, loss_error, fused_s = [0.0] * steps, 0.0, []
    for t in range(steps):
        images = [data.x_train[(t * members + i) * batch:(t * members + i + 1) * batch] for i in range(members)]
        labels = [data.y_train[(t * members + i) * batch:(t * members + i + 1) * batch] for i in range(members)]
        for model in fused_models + solo_models:
            advance_random_features(model)
        masks = [m.draw_path_masks(batch, dtype=mask_dtype, device=device, generator=g)
                 for m, g in zip(fused_models, fused_masks)]
        start = time.perf_counter()
        losses, _ = stepper.step(images, labels, masks)
        losses = losses.float().cpu()
        fused_s.append(time.perf_counter() - start)
        for i, (model, optimizer, scheduler, forward_loss) in enumerate(solo):
            mask = model.draw_path_masks(batch, dtype=mask_dtype, device=device, generator=solo_masks[i])
            loss, _ = solo_step(model, optimizer, scheduler, forward_loss, images[i], labels[i], mask, cfg.grad_clip)
            loss_error = max(loss_error, abs(losses[i].item() - loss.item()) / max(abs(loss.item()), 1e-6))
            grad_errors[t] = max(grad_errors[t], member_error(stepper, i, model, "grad"))
    param_error = max(member_error(stepper, i, model, "param") for i, (model, *_) in enumerate(solo))
    tolerance = TOLERANCE["bf16" if training.uses_bf16(cfg, device) else "none"]
    grad_error = max(grad_errors)
    finite = all(math.isfinite(x) for x in (grad_error, loss_error, param_error))
    fallback = stepper.forward_loss.fallback
    return {"cell": cell_id(cfg), "grad_error": grad_error, "grad_error_by_step": grad_errors,
            "param_error": param_error, "loss_error": loss_error, "tolerance": tolerance, "steps": steps,
            "compile_fallback": fallback, "first_step_s": fused_s[0],
            "later_step_ms": 1e3 * (sum(fused_s[1:]) / max(1, len(fused_s) - 1)),
            "ok": finite and not fallback and max(grad_error, loss_error, param_error) < tolerance}


def member_error(stepper: StackedStep, i: int, model: torch.nn.Module, what: str) -> float:
    """Relative L2 error of fused member i's clipped gradients ("grad") or parameters ("param") against its
    solo copy's, over every parameter, matched by name (the stack keeps the model's names)."""
    solo = dict(model.named_parameters())
    pairs = [(stacked[i] if what == "param" else stacked.grad[i], solo[name] if what == "param" else solo[name].grad)
             for name, stacked in stepper.stack.params.items()
             if what == "param" or (stacked.grad is not None and solo[name].grad is not None)]
    if not pairs:
        return math.inf  # nothing to compare is no evidence of equality
    fused, reference = (torch.cat([t.detach().flatten() for t in side]) for side in zip(*pairs))
    return relative_error(fused, reference)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager)")
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4, help="steps compared (4: under CUDA graphs steps 3 and 4 replay)")
    parser.add_argument("--members", type=int, default=3)
    parser.add_argument("--amp", default="bf16", choices=("bf16", "none"))
    parser.add_argument("--only", default=None, help="cells whose id contains this text")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.json and Path(args.json).is_symlink():  # said before the cells run; write_text_file refuses it anyway
        parser.error(f"--json {args.json} is a symbolic link; allowed: a regular file or nothing there (never "
                     f"written through a link)")
    training.COMPILE_BACKEND = args.backend
    results = []
    print(f"all12 cells, fused k={args.members} + compiled ({args.backend}) + amp {args.amp}, depth {args.depth}, "
          f"{args.steps} steps, on {args.device}; torch {torch.__version__}", flush=True)
    for cfg in all12_cells(args.depth, args.device, args.amp):
        if args.only and args.only not in cell_id(cfg):
            continue
        start = time.perf_counter()
        try:
            row = check_cell(cfg, args.members, args.steps)
        except Exception as err:  # noqa: BLE001 - a cell that raises is reported, the others still run
            row = {"cell": cell_id(cfg), "ok": False, "error": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"}
        row["wall_s"] = time.perf_counter() - start
        results.append(row)
        detail = row.get("error") or (f"grad err {row['grad_error']:.2e} (every step) param err "
                                      f"{row['param_error']:.2e} loss err {row['loss_error']:.2e} "
                                      f"(tol {row['tolerance']:g}); first step {row['first_step_s']:.1f} s, then "
                                      f"{row['later_step_ms']:.0f} ms" + (f"; FELL BACK: {row['compile_fallback']}"
                                                                          if row["compile_fallback"] else ""))
        print(f"{'ok  ' if row['ok'] else 'FAIL'} {row['cell']:<40} {row['wall_s']:6.1f} s  {detail}", flush=True)
    failed = [r["cell"] for r in results if not r["ok"]]
    print(f"{len(results) - len(failed)} of {len(results)} cells ok" + (f"; failed: {', '.join(failed)}" if failed else ""))
    if args.json:
        # atomic and never through a link at the file or its folder (a planted link: one line, nothing written)
        write_text_file(Path(args.json), json.dumps({"torch": torch.__version__, "device": args.device,
                                                     "backend": args.backend, "cells": results}, indent=1))
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
