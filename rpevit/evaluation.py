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

Beside them, `rotation_accuracy` (config `eval_rotations: standard`): test accuracy with the test
images rotated, for the question of what a rotation-invariant RPE buys where rotation matters.
"""
from __future__ import annotations

import copy
import math
from contextlib import contextmanager
from typing import Callable, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from rpevit.attention.base import RandomFeatureBackend, softmax_attention_matrix, total_variation
from rpevit.config import TrialConfig
from rpevit.data import rotate_images
from rpevit.models.factory import build_attention

EVAL_DRAW_SALT = 1  # fresh draws never coincide with the training draws (salt 0)
FIDELITY_IMAGES = 128  # the fixed test batch of the fidelity metric (its first images)
FIDELITY_MAX_TOKENS = 256  # dense N x N rows per layer and head: only for small N

Predict = Callable[[nn.Module], Tensor]  # model -> float32 logits of the test set
PredictImages = Callable[[nn.Module, Tensor], Tensor]  # (model, uint8 images) -> float32 logits
ROTATION_EVAL_SEED = 20240528  # the random test angles: one fixed draw, the same for every trial
QUARTER_TURNS = (0, 90, 180, 270)  # exact test rotations (torch.rot90), degrees counter-clockwise
ROTATIONS = (*(str(d) for d in QUARTER_TURNS), "random")  # the test rotations, as the analysis names them


def random_feature_layers(model: nn.Module) -> list[nn.Module]:
    """Attention backends of the model whose output depends on a random draw."""
    return [m for m in model.modules() if isinstance(m, RandomFeatureBackend) and m.random_features]


@contextmanager
def fresh_draw(model: nn.Module, draw: int) -> Iterator[None]:
    """Temporarily give every random-feature layer its fresh evaluation draw `draw` (seeded from the
    trial seed, the layer and `draw`), restoring the training draws afterwards."""
    layers = random_feature_layers(model)
    saved = [layer.projection.clone() for layer in layers]
    try:
        for layer in layers:
            layer.use_draw(layer.draw_projection(draw, salt=EVAL_DRAW_SALT))
        yield
    finally:
        for layer, projection in zip(layers, saved):
            layer.use_draw(projection)


def draw_aware_accuracy(model: nn.Module, predict: Predict, labels: Tensor, draws: int) -> dict[str, float]:
    """Accuracy of the trained weights over `draws` fresh random-feature draws.

    Keys: test_acc_draw_mean / _std (sample std, ddof 1) / _min, and test_acc_draw_ensemble
    (argmax of the softmax probabilities averaged over the draws). NaN for models without random
    features or draws = 0: the keys are always present so every row has the same columns.
    """
    keys = ("test_acc_draw_mean", "test_acc_draw_std", "test_acc_draw_min", "test_acc_draw_ensemble")
    if draws <= 0 or not random_feature_layers(model):
        return dict.fromkeys(keys, math.nan)
    accuracies, mean_probs = [], None
    for draw in range(1, draws + 1):
        with fresh_draw(model, draw):
            logits = predict(model)
        accuracies.append((logits.argmax(-1) == labels).double().mean().item())
        probs = torch.softmax(logits.double(), dim=-1)
        mean_probs = probs if mean_probs is None else mean_probs + probs
    acc = np.asarray(accuracies)
    return {
        "test_acc_draw_mean": float(acc.mean()),
        "test_acc_draw_std": float(acc.std(ddof=1)) if len(acc) > 1 else math.nan,
        "test_acc_draw_min": float(acc.min()),
        "test_acc_draw_ensemble": (mean_probs.argmax(-1) == labels).double().mean().item(),
    }


def with_softmax_attention(model: nn.Module, cfg: TrialConfig) -> nn.Module:
    """A copy of the model whose every attention backend is exact softmax; all weights shared by value.

    The backends of this project hold no learned parameters (only random-feature buffers), so the
    copy is the same trained function with the kernel approximation removed.
    """
    swapped = copy.deepcopy(model)
    for layer, attn in enumerate(swapped.attention_layers()):
        old = attn.backend
        attn.backend = build_attention(cfg, layer, name="softmax").to(next(swapped.parameters()).device)
        if any(True for _ in old.parameters()):
            raise RuntimeError(f"backend {cfg.attention!r} has learned parameters; a softmax swap would drop them")
    return swapped


def softmax_swap_accuracy(model: nn.Module, cfg: TrialConfig, predict: Predict, labels: Tensor) -> float:
    """test accuracy of the same weights under exact softmax attention; NaN for softmax itself."""
    if cfg.attention == "softmax":
        return math.nan
    logits = predict(with_softmax_attention(model, cfg))
    return (logits.argmax(-1) == labels).double().mean().item()


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
    """The summary-row keys of rotation_accuracy: test_acc_rot{0,90,180,270,_random} and each one's
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


def rotation_accuracy(model: nn.Module, predict: PredictImages, images: Tensor, labels: Tensor, draws: int,
                      mode: str = "standard", *, upright: tuple[float, float] | None = None) -> dict[str, float]:
    """Test accuracy with the test images rotated (rotated_test_sets): `test_acc_rot<r>` with the
    model's own weights and draw, and `test_acc_rot<r>_draw_mean`, its mean over `draws` fresh
    random-feature draws (draw_aware_accuracy, the same draws for every rotation; NaN without random
    features or with draws = 0). Every key NaN when mode is "none": rows keep the same columns.
    Only the labels' images are rotated, never the labels (a rotated 6 stays a 6, even as a 9).

    `upright`: (test_acc, test_acc_draw_mean) the caller already measured on these images and labels;
    rotation 0 (rot90 by 0 is the identity) then takes them instead of 1 + draws more passes.
    """
    keys = rotation_keys()
    if mode == "none":
        return dict.fromkeys(keys, math.nan)
    if mode != "standard":
        raise ValueError(f"field 'eval_rotations' has value {mode!r}; allowed: none, standard")
    out: dict[str, float] = {}
    for name, rotated in rotated_test_sets(images).items():
        key = f"test_acc_rot{name}" if name != "random" else "test_acc_rot_random"
        if name == "0" and upright is not None:
            out[key], out[f"{key}_draw_mean"] = upright
            continue
        logits = predict(model, rotated)
        out[key] = (logits.argmax(-1) == labels).double().mean().item()
        out[f"{key}_draw_mean"] = draw_aware_accuracy(
            model, lambda m, x=rotated: predict(m, x), labels, draws)["test_acc_draw_mean"]
    return {key: out[key] for key in keys}
