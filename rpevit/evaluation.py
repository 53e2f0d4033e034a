"""Evaluations that make random-feature effects visible in every trained model.

A random-feature backend (FAVOR+, ReLU with a random projection) is a random function of its draw
W. Its test accuracy with the one draw it was trained with is a single sample: a redraw late in
training leaves a draw the weights never adapted to, and a model trained without redraws can
learn its own random-feature kernel rather than an approximation of softmax attention. Three
measurements tell these cases apart (docs/random_features.md):

- draw-aware accuracy: the same weights over `eval_draws` fresh draws (mean, std, min) and the
  accuracy of the probabilities averaged over those draws (the ensemble);
- softmax swap: the same weights with exact softmax attention (same encodings, same qk norm);
- attention fidelity: total-variation distance between the backend's attention rows and the
  exact softmax rows on the same q, k and modulation.

Beside them, `rotation_metrics` (config `eval_rotations: standard`): test accuracy with the test
images rotated, for the question of what a rotation-invariant RPE buys where rotation matters.

`final_evaluation` computes them all for the train task's summary row from one pass of each variant
of the model (its own draw, each fresh draw, the softmax swap) over each image set, with the draws
batched (`variant_logits`), and logs its progress like the training's epoch lines (`EvalLog`).
"""
from __future__ import annotations

import copy
import functools
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from rpevit import metrics
from rpevit.attention.base import RandomFeatureBackend, softmax_attention_matrix, total_variation
from rpevit.config import TrialConfig
from rpevit.data import Splits, batch_indices, rotate_images
from rpevit.models.factory import build_attention
from rpevit.training import autocast_context

EVAL_DRAW_SALT = 1  # fresh draws never coincide with the training draws (salt 0)
FIDELITY_IMAGES = 128  # the fixed test batch of the fidelity metric (its first images)
FIDELITY_MAX_TOKENS = 256  # dense N x N rows per layer and head: only for small N

ROTATION_EVAL_SEED = 20240528  # the random test angles: one fixed draw, the same for every trial
QUARTER_TURNS = (0, 90, 180, 270)  # exact test rotations (torch.rot90), degrees counter-clockwise
ROTATIONS = (*(str(d) for d in QUARTER_TURNS), "random")  # the test rotations, as the analysis names them


def random_feature_layers(model: nn.Module) -> list[nn.Module]:
    """Attention backends of the model whose output depends on a random draw."""
    return [m for m in model.modules() if isinstance(m, RandomFeatureBackend) and m.random_features]


def draw_projections(model: nn.Module, draw: int) -> tuple[Tensor, ...]:
    """Fresh evaluation draw `draw` of every random-feature layer (seeded from the trial seed, the layer
    and `draw`; salt EVAL_DRAW_SALT, so never a training draw)."""
    return tuple(layer.draw_projection(draw, salt=EVAL_DRAW_SALT) for layer in random_feature_layers(model))


@contextmanager
def fresh_draw(model: nn.Module, draw: int) -> Iterator[None]:
    """Temporarily give every random-feature layer its fresh evaluation draw `draw`, restoring the
    training draws afterwards."""
    layers = random_feature_layers(model)
    saved = [layer.projection.clone() for layer in layers]
    try:
        for layer, projection in zip(layers, draw_projections(model, draw)):
            layer.use_draw(projection)
        yield
    finally:
        for layer, projection in zip(layers, saved):
            layer.use_draw(projection)


def accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy as a float64 fraction (every accuracy of the summary row is computed this way)."""
    return (logits.argmax(-1) == labels).double().mean().item()


def draw_aware_metrics(fresh_logits: list[Tensor], labels: Tensor) -> dict[str, float]:
    """Accuracy of the trained weights over fresh random-feature draws, from each draw's logits.

    Keys: test_acc_draw_mean / _std (sample std, ddof 1) / _min, and test_acc_draw_ensemble
    (argmax of the softmax probabilities averaged over the draws, summed in float64 in draw
    order). All NaN without draws (no random features, or eval_draws 0): the keys are always
    present so every row has the same columns.
    """
    keys = ("test_acc_draw_mean", "test_acc_draw_std", "test_acc_draw_min", "test_acc_draw_ensemble")
    if not fresh_logits:
        return dict.fromkeys(keys, math.nan)
    acc = np.asarray([accuracy(logits, labels) for logits in fresh_logits])
    summed_probs = functools.reduce(torch.add, (torch.softmax(logits.double(), dim=-1) for logits in fresh_logits))
    return {
        "test_acc_draw_mean": float(acc.mean()),
        "test_acc_draw_std": float(acc.std(ddof=1)) if len(acc) > 1 else math.nan,
        "test_acc_draw_min": float(acc.min()),
        "test_acc_draw_ensemble": accuracy(summed_probs, labels),
    }


def with_softmax_attention(model: nn.Module, cfg: TrialConfig) -> nn.Module:
    """A copy of the model whose every attention backend is exact softmax; all weights shared by value.

    The backends of this project hold no learned parameters (only random-feature buffers; config validation
    refuses a backend with any, TrialConfig._check_backend_parameters), so the copy is the same trained
    function with the kernel approximation removed.
    """
    swapped = copy.deepcopy(model)
    for layer, attn in enumerate(swapped.attention_layers()):
        old = attn.backend
        attn.backend = build_attention(cfg, layer, name="softmax").to(next(swapped.parameters()).device)
        if any(True for _ in old.parameters()):
            raise RuntimeError(f"backend {cfg.attention!r} has learned parameters; a softmax swap would drop them")
    return swapped


@torch.no_grad()
def attention_fidelity(model: nn.Module, images: Tensor) -> list[float]:
    """Per layer: mean over images, heads and query rows of TV(A_backend row, exact softmax row).

    Both rows are computed densely from the q, k and modulation the backend receives in the
    forward pass on `images` (eval mode, current draw). 0 for softmax; for FAVOR+ it falls like
    m^-1/2 as the number of features m grows. NaN per layer when N > FIDELITY_MAX_TOKENS.
    """
    layers = model.attention_layers()
    was_training = model.training
    model.eval()
    for attn in layers:
        attn.captured = []
    try:
        model(images)
        values = []
        for attn in layers:
            q, k, modulation = attn.captured[0]
            if q.shape[-2] > FIDELITY_MAX_TOKENS:
                values.append(math.nan)
                continue
            q, k = q.float(), k.float()
            exact = softmax_attention_matrix(q, k, modulation)
            approx = attn.backend.attention_matrix(q, k, modulation)
            values.append(total_variation(approx, exact).mean().item())
    finally:
        for attn in layers:
            attn.captured = None
        model.train(was_training)
    return values


def fidelity_row(model: nn.Module, images: Tensor) -> dict[str, object]:
    """{'attn_tv_to_softmax': mean over layers, 'attn_tv_per_layer': [per layer]} for epoch and summary rows."""
    per_layer = attention_fidelity(model, images)
    finite = [v for v in per_layer if math.isfinite(v)]
    return {"attn_tv_to_softmax": float(np.mean(finite)) if finite else math.nan,
            "attn_tv_per_layer": per_layer}


def rotation_keys() -> tuple[str, ...]:
    """The summary-row keys of rotation_metrics: test_acc_rot{0,90,180,270,_random} and each one's
    `_draw_mean` (judged accuracy of a random-feature model: mean over fresh draws)."""
    names = [f"test_acc_rot{r}" if r != "random" else "test_acc_rot_random" for r in ROTATIONS]
    return (*names, *(f"{name}_draw_mean" for name in names))


def random_test_angles(n: int) -> Tensor:
    """n angles in degrees, uniform in [0, 360), from ROTATION_EVAL_SEED on the CPU: test image i
    gets the same angle in every trial, on every device."""
    return 360.0 * torch.rand(n, generator=torch.Generator().manual_seed(ROTATION_EVAL_SEED), dtype=torch.float64)


def rotated_test_sets(images: Tensor) -> dict[str, Tensor]:
    """Rotation name (ROTATIONS) -> the images rotated: 0/90/180/270 exactly (torch.rot90 over H, W,
    counter-clockwise as displayed), `random` by random_test_angles (bilinear, zero fill:
    rpevit.data.rotate_images)."""
    sets = {str(d): torch.rot90(images, d // 90, dims=(-2, -1)) for d in QUARTER_TURNS}
    sets["random"] = rotate_images(images, random_test_angles(len(images)))
    return sets


def rotation_metrics(own: dict[str, Tensor], fresh: dict[str, list[Tensor]], labels: Tensor) -> dict[str, float]:
    """Test accuracy with the test images rotated (rotated_test_sets), from the logits of each rotation
    name (ROTATIONS): `test_acc_rot<r>` with the model's own weights and draw (`own`), and
    `test_acc_rot<r>_draw_mean`, its mean over the fresh random-feature draws (`fresh`: the same
    draws for every rotation; NaN when the list is empty). Only the images are rotated, never the
    labels (a rotated 6 stays a 6, even as a 9). Rotation 0 is the upright test set: the caller
    passes the logits it already has."""
    out: dict[str, float] = {}
    for name in ROTATIONS:
        key = f"test_acc_rot{name}" if name != "random" else "test_acc_rot_random"
        out[key] = accuracy(own[name], labels)
        out[f"{key}_draw_mean"] = draw_aware_metrics(fresh[name], labels)["test_acc_draw_mean"]
    return {key: out[key] for key in rotation_keys()}


# ---------------------------------------------------------------- the final evaluation of a trained model
@dataclass(frozen=True)
class Variant:
    """One way the final evaluation runs the trained weights: with its own (training) draw, with fresh
    draw i, or with exact softmax attention (the swap: a copy of the model)."""
    name: str
    kind: str  # OWN | FRESH | SWAP
    model: nn.Module
    projections: tuple[Tensor, ...] | None = None  # per random-feature layer; None: the model as it is


OWN, FRESH, SWAP = "own draw", "fresh draw", "softmax swap"


def evaluation_variants(model: nn.Module, cfg: TrialConfig) -> list[Variant]:
    """The model with its own draw, with each of cfg.eval_draws fresh draws (random-feature models
    only) and with softmax attention (every backend but softmax), in that order."""
    layers = random_feature_layers(model)
    own = Variant(OWN, OWN, model, tuple(layer.projection.clone() for layer in layers) if layers else None)
    fresh = [Variant(f"{FRESH} {draw}", FRESH, model, draw_projections(model, draw))
             for draw in range(1, cfg.eval_draws + 1)] if layers else []
    swap = [Variant(SWAP, SWAP, with_softmax_attention(model, cfg))] if cfg.attention != "softmax" else []
    return [own, *fresh, *swap]


@dataclass(frozen=True)
class EvalSet:
    """Images to evaluate (uint8, as stored), their labels, and the kinds of variant they are read by."""
    name: str
    images: Tensor
    labels: Tensor
    kinds: tuple[str, ...]


@torch.no_grad()
def variant_logits(sets: list[EvalSet], variants: list[Variant], prepare: Callable[[Tensor], Tensor],
                   forward: Callable[[nn.Module, Tensor], Tensor], batch_size: int,
                   progress: Callable[[int, int], None] = lambda done, total: None) -> dict[str, dict[str, Tensor]]:
    """logits[set name][variant name] of every image of every set, under each variant of the kinds the
    set asks for; variants in eval mode, every draw restored afterwards.

    The draws are batched: an evaluation batch holds `batch_size` (image, variant) pairs, i.e.
    batch_size // k images of a set read by k variants, which all run on those images (prepared once)
    before the next images are read. Each image's logits are those of a whole-set pass with that
    variant alone (the forward treats images independently; tests/test_evaluation.py checks it
    against the plain passes in float64), and each forward holds at most batch_size // k images, a
    working set that stays in cache on the CPU (2x faster than whole eval batches for FAVOR+ at
    MNIST size, measured). progress(done, total) is called after every batch with (image, variant)
    pairs done and in all.
    """
    chosen = {s.name: [v for v in variants if v.kind in s.kinds] for s in sets}
    total, done = sum(len(s.images) * len(chosen[s.name]) for s in sets), 0
    layers = {id(v.model): random_feature_layers(v.model) for v in variants if v.projections is not None}
    saved = {key: [layer.projection.clone() for layer in group] for key, group in layers.items()}
    for v in variants:
        v.model.eval()
    out: dict[str, dict[str, list[Tensor]]] = {s.name: {v.name: [] for v in chosen[s.name]} for s in sets}
    try:
        for s in sets:
            readers = chosen[s.name]
            for idx in batch_indices(len(s.images), max(1, batch_size // max(1, len(readers)))):
                images = prepare(s.images[idx.to(s.images.device)])
                for v in readers:
                    if v.projections is not None:
                        for layer, projection in zip(layers[id(v.model)], v.projections):
                            layer.use_draw(projection)
                    out[s.name][v.name].append(forward(v.model, images))
                done += len(idx) * len(readers)
                progress(done, total)
    finally:
        for key, group in layers.items():
            for layer, projection in zip(group, saved[key]):
                layer.use_draw(projection)
    return {s: {v: torch.cat(parts) for v, parts in by_variant.items()} for s, by_variant in out.items()}


class EvalLog:
    """The final evaluation's progress, in lines like the training's epoch lines: one per stage
    ('eval 2/4 fidelity on 128 test images: attn_tv_to_softmax 0.1262, 0.1s'); a long stage also
    says what it starts and logs each quarter of its work done."""

    def __init__(self, log: Callable[[str], None], stages: int) -> None:
        self.log, self.stages, self.stage_no = log, stages, 0

    @contextmanager
    def stage(self, name: str, *, announce: bool = False) -> Iterator[dict[str, str]]:
        """A stage; what the body puts under 'result' ends its closing line."""
        self.stage_no += 1
        if announce:
            self.log(f"eval {self.stage_no}/{self.stages} {name} ...")
        t0, note = time.perf_counter(), {"result": ""}
        yield note
        self.log(f"eval {self.stage_no}/{self.stages} {name}: {note['result']} {time.perf_counter() - t0:.1f}s")

    def quarters(self, unit: str) -> Callable[[int, int], None]:
        """progress(done, total) that logs at each quarter of `total` reached (once each)."""
        t0, shown = time.perf_counter(), [0]

        def report(done: int, total: int) -> None:
            quarter = 4 * done // max(1, total)
            if quarter > shown[0] and done < total:  # the stage's own line closes it
                shown[0] = quarter
                self.log(f"eval {self.stage_no}/{self.stages} {done}/{total} {unit} ({25 * quarter}%) "
                         f"{time.perf_counter() - t0:.1f}s")

        return report


def evaluation_sets(data: Splits, cfg: TrialConfig, has_fresh: bool) -> list[EvalSet]:
    """The test set (every variant), the validation set (fresh draws: val_acc_draw_mean) and, with
    eval_rotations standard, the rotated test sets (own and fresh draws; rotation 0 is the test set)."""
    sets = [EvalSet("test", data.x_test, data.y_test, (OWN, FRESH, SWAP))]
    if has_fresh and len(data.x_val):
        sets.append(EvalSet("val", data.x_val, data.y_val, (FRESH,)))
    if cfg.eval_rotations == "standard":
        rotated = rotated_test_sets(data.x_test)
        sets += [EvalSet(f"rotated {name}", rotated[name], data.y_test, (OWN, FRESH)) for name in ROTATIONS if name != "0"]
    elif cfg.eval_rotations != "none":
        raise ValueError(f"field 'eval_rotations' has value {cfg.eval_rotations!r}; allowed: none, standard")
    return sets


def final_evaluation(model: nn.Module, data: Splits, cfg: TrialConfig, device: torch.device,
                     progress: EvalLog) -> dict[str, float]:
    """The test metrics of the summary row from one pass of each variant over each set (variant_logits,
    then metrics_from_logits), as the first stage of `progress`."""
    variants = evaluation_variants(model, cfg)
    fresh = [v.name for v in variants if v.kind == FRESH]
    sets = evaluation_sets(data, cfg, bool(fresh))
    kinds = ", ".join(dict.fromkeys((f"{len(fresh)} fresh draws" if v.kind == FRESH else v.kind) for v in variants))
    reads = ", ".join(f"{len(s.images)} {s.name}" for s in sets)
    with progress.stage(f"passes ({kinds}) over {reads} images", announce=True) as note:

        def forward(m: nn.Module, images: Tensor) -> Tensor:
            with autocast_context(cfg, device):
                return m(images).float()

        logits = variant_logits(sets, variants, data.normalize, forward, cfg.eval_batch_size,
                                progress.quarters("image passes"))
        row = metrics_from_logits(logits, fresh, data, cfg.eval_rotations == "standard")
        shown = (("test_acc", "test_acc"), ("draw mean", "test_acc_draw_mean"),
                 ("draw ensemble", "test_acc_draw_ensemble"), ("softmax swap", "test_acc_softmax_swap"),
                 ("val draw mean", "val_acc_draw_mean"))
        note["result"] = ", ".join(f"{label} {row[key]:.4f}" for label, key in shown if math.isfinite(row[key])) + ","
    return row


def metrics_from_logits(logits: dict[str, dict[str, Tensor]], fresh: list[str], data: Splits,
                        rotations: bool) -> dict[str, float]:
    """Classification metrics of the model's own draw on the test set, the draw-aware keys
    (draw_aware_metrics over the `fresh` variants), the softmax swap, val_acc_draw_mean (validation
    accuracy over the same fresh draws: what choices for a random-feature model are made on, so the
    test set is read once, at the end) and the rotation keys (rotation_metrics; NaN unless
    `rotations`); NaN where a variant or set is absent."""
    test = logits["test"]
    row: dict[str, float] = {
        **metrics.classification_metrics(test[OWN], data.y_test),
        **draw_aware_metrics([test[f] for f in fresh], data.y_test),
        "test_acc_softmax_swap": accuracy(test[SWAP], data.y_test) if SWAP in test else math.nan,
        "val_acc_draw_mean": (draw_aware_metrics([logits["val"][f] for f in fresh], data.y_val)["test_acc_draw_mean"]
                              if "val" in logits else math.nan),
    }
    if not rotations:
        return {**row, **dict.fromkeys(rotation_keys(), math.nan)}
    rotated = {name: logits[f"rotated {name}"] if name != "0" else test for name in ROTATIONS}
    return {**row, **rotation_metrics({name: by[OWN] for name, by in rotated.items()},
                                      {name: [by[f] for f in fresh] for name, by in rotated.items()}, data.y_test)}
