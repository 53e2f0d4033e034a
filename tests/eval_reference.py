"""The final evaluation as it was written before it was batched (issue 43): every variant reads each
set in its own whole-set passes, one draw at a time. Kept as the plain definition that
rpevit.evaluation.final_evaluation must equal (tests/test_evaluation.py)."""
from __future__ import annotations

import math

import numpy as np
import torch

from rpevit import metrics
from rpevit.evaluation import fresh_draw, random_feature_layers, rotated_test_sets, rotation_keys, with_softmax_attention
from rpevit.tasks.train import predict


def draw_aware_accuracy(model, predict_fn, labels, draws):
    keys = ("test_acc_draw_mean", "test_acc_draw_std", "test_acc_draw_min", "test_acc_draw_ensemble")
    if draws <= 0 or not random_feature_layers(model):
        return dict.fromkeys(keys, math.nan)
    accuracies, mean_probs = [], None
    for draw in range(1, draws + 1):
        with fresh_draw(model, draw):
            logits = predict_fn(model)
        accuracies.append((logits.argmax(-1) == labels).double().mean().item())
        probs = torch.softmax(logits.double(), dim=-1)
        mean_probs = probs if mean_probs is None else mean_probs + probs
    acc = np.asarray(accuracies)
    return {"test_acc_draw_mean": float(acc.mean()),
            "test_acc_draw_std": float(acc.std(ddof=1)) if len(acc) > 1 else math.nan,
            "test_acc_draw_min": float(acc.min()),
            "test_acc_draw_ensemble": (mean_probs.argmax(-1) == labels).double().mean().item()}


def reference_metrics(model, data, cfg, device) -> dict[str, float]:
    """The metrics of the old `summarize` that the batched evaluation computes."""
    def predict_test(m):
        return predict(m, data, data.x_test, cfg, device)

    row = metrics.classification_metrics(predict_test(model), data.y_test)
    row.update(draw_aware_accuracy(model, predict_test, data.y_test, cfg.eval_draws))
    row["test_acc_softmax_swap"] = (math.nan if cfg.attention == "softmax" else
                                    (predict_test(with_softmax_attention(model, cfg)).argmax(-1) == data.y_test)
                                    .double().mean().item())
    row["val_acc_draw_mean"] = (math.nan if len(data.x_val) == 0 else draw_aware_accuracy(
        model, lambda m: predict(m, data, data.x_val, cfg, device), data.y_val, cfg.eval_draws)["test_acc_draw_mean"])
    if cfg.eval_rotations == "none":
        return {**row, **dict.fromkeys(rotation_keys(), math.nan)}
    for name, rotated in rotated_test_sets(data.x_test).items():
        key = f"test_acc_rot{name}" if name != "random" else "test_acc_rot_random"
        logits = predict(model, data, rotated, cfg, device)
        row[key] = (logits.argmax(-1) == data.y_test).double().mean().item()
        row[f"{key}_draw_mean"] = draw_aware_accuracy(
            model, lambda m, x=rotated: predict(m, data, x, cfg, device), data.y_test, cfg.eval_draws)["test_acc_draw_mean"]
    return row
