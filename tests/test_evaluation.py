"""Draw-aware evaluation, softmax swap and attention fidelity against brute force.

- every backend's dense `attention_matrix` is the matrix its fast forward applies (A v == forward);
- the total-variation metric equals an explicit double loop; it is 0 for softmax and falls towards
  0 as FAVOR+ gets more features;
- draw-aware keys are present (NaN without random features), seeded, and leave the training draw
  in place; the softmax swap equals a softmax model loaded from the same state dict;
- the batched final evaluation (variant_logits, final_evaluation) equals the plain whole-set passes
  of each draw (tests/eval_reference.py) exactly in float64, and logs a line per stage.
"""
import functools
import math

import pytest
import torch

from rpevit.attention.base import LowRankModulation, softmax_attention_matrix, total_variation
from rpevit.config import TrialConfig
from rpevit.evaluation import (FRESH, OWN, SWAP, EvalSet, attention_fidelity, draw_aware_metrics, evaluation_variants,
                               fresh_draw, random_feature_layers, variant_logits, with_softmax_attention)
from rpevit.models import build_attention, build_model
from rpevit.pe.relative_bias import RelativeBias
from rpevit.tasks.train import train_and_evaluate

DRAW_KEYS = ("test_acc_draw_mean", "test_acc_draw_std", "test_acc_draw_min", "test_acc_draw_ensemble")


def cfg(**kw):
    base = dict(dataset="digits", patch_size=2, dim=16, heads=2, depth=2, num_features=16)
    return TrialConfig.from_dict({**base, **kw})


def qkv(n=16, d=8, b=2, h=2, seed=0, norm=1.0):
    g = torch.Generator().manual_seed(seed)
    return [norm * torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3)]


def modulations(h=2, grid=(4, 4)):
    g = torch.Generator().manual_seed(5)
    n = grid[0] * grid[1]
    table = torch.randn(h, 2 * grid[0] - 1, 2 * grid[1] - 1, generator=g, dtype=torch.float64)
    f, gg = torch.rand(h, n, 3, generator=g, dtype=torch.float64), torch.rand(h, n, 3, generator=g, dtype=torch.float64)
    return {"none": None, "luo": RelativeBias(table, grid, path="dense"), "low_rank": LowRankModulation(f, gg)}


@pytest.mark.parametrize("attention,extra", [("softmax", {}), ("favor", {}), ("relu", {}),
                                             ("relu", {"relu_projection": "identity"})])
@pytest.mark.parametrize("kind", ["none", "luo", "low_rank"])
def test_attention_matrix_is_what_forward_applies(attention, extra, kind):
    backend = build_attention(cfg(attention=attention, **extra), layer=0).double()
    backend.eval()
    q, k, v = qkv()
    modulation = modulations()[kind]
    a = backend.attention_matrix(q, k, modulation)
    torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))
    torch.testing.assert_close(a @ v, backend(q, k, v, modulation))


def test_softmax_attention_matrix_equals_definition_with_luo_bias():
    q, k, _ = qkv()
    bias = modulations()["luo"]
    expected = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(8) + bias.dense_log(), dim=-1)
    torch.testing.assert_close(softmax_attention_matrix(q, k, bias), expected)


def test_total_variation_equals_explicit_sum():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1)
    b = torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1)
    tv = total_variation(a, b)
    for idx in [(0, 0, 0), (1, 2, 4), (0, 1, 3)]:
        expected = 0.5 * sum(abs(a[idx][j] - b[idx][j]).item() for j in range(5))
        assert tv[idx].item() == pytest.approx(expected, rel=1e-6)
    assert torch.all(total_variation(a, a) == 0)


def test_fidelity_is_zero_for_softmax_and_positive_for_favor():
    images = torch.randn(4, 1, 8, 8)
    soft = build_model(cfg(attention="softmax", pe="luo_rpe"), 1, 10)
    assert attention_fidelity(soft, images) == [0.0, 0.0]
    favor = build_model(cfg(attention="favor", pe="luo_rpe"), 1, 10)
    assert all(v > 0 for v in attention_fidelity(favor, images))
    assert all(a.captured is None for a in favor.attention_layers())  # the capture is switched off again


@pytest.mark.slow
def test_favor_fidelity_falls_towards_zero_as_m_grows():
    """Mean TV over 8 independent draws per m falls steadily, at about the Monte Carlo rate m^-1/2
    (measured slope -0.42 over m = 16..4096 for these inputs; 0.137 at m = 16, 0.013 at 4096)."""
    q, k, _ = qkv(n=16, d=16, b=4, h=2, norm=0.5)
    ms, means = (16, 256, 4096), []
    for m in ms:
        values = []
        for seed in range(8):
            backend = build_attention(cfg(attention="favor", num_features=m, dim=32, seed=seed), layer=0)
            tv = total_variation(backend.attention_matrix(q.float(), k.float()), softmax_attention_matrix(q, k).float())
            values.append(tv.mean().item())
        means.append(sum(values) / len(values))
    assert means[0] > means[1] > means[2], means
    slope = math.log(means[2] / means[0]) / math.log(ms[2] / ms[0])
    assert -0.6 < slope < -0.3, (slope, means)
    assert means[2] < 0.02, means


def test_fresh_draw_swaps_every_layer_and_restores_the_training_draw():
    model = build_model(cfg(attention="favor"), 1, 10)
    layers = random_feature_layers(model)
    assert len(layers) == 2
    trained = [layer.projection.clone() for layer in layers]
    with fresh_draw(model, 3):
        inside = [layer.projection.clone() for layer in layers]
        assert all(not torch.equal(a, b) for a, b in zip(inside, trained))
        assert not torch.equal(inside[0], inside[1])  # layers get different draws
    assert all(torch.equal(layer.projection, p) for layer, p in zip(layers, trained))
    with fresh_draw(model, 3):  # seeded: the same fresh draw again
        assert all(torch.equal(layer.projection, p) for layer, p in zip(layers, inside))


def predictor(images):
    @torch.no_grad()
    def predict(model):
        model.eval()
        return model(images)
    return predict


def test_draw_aware_metrics_by_hand_and_no_fresh_draws_without_random_features():
    images, labels = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    model = build_model(cfg(attention="favor"), 1, 10)
    predict = predictor(images)
    accs, probs, fresh = [], 0, []
    for draw in (1, 2, 3):
        with fresh_draw(model, draw):
            logits = predict(model)
        fresh.append(logits)
        accs.append((logits.argmax(-1) == labels).double().mean().item())
        probs = probs + torch.softmax(logits.double(), -1)
    got = draw_aware_metrics(fresh, labels)
    assert got["test_acc_draw_mean"] == pytest.approx(sum(accs) / 3)
    assert got["test_acc_draw_min"] == pytest.approx(min(accs))
    assert got["test_acc_draw_std"] == pytest.approx(torch.tensor(accs).std().item())
    assert got["test_acc_draw_ensemble"] == pytest.approx((probs.argmax(-1) == labels).double().mean().item())
    assert all(math.isnan(v) for v in draw_aware_metrics([], labels).values())
    assert [v.kind for v in evaluation_variants(model, cfg(attention="favor", eval_draws=3))] == [OWN, *[FRESH] * 3, SWAP]
    for attention, extra in [("softmax", {}), ("relu", {"relu_projection": "identity"})]:
        plain_cfg = cfg(attention=attention, eval_draws=3, **extra)
        kinds = [v.kind for v in evaluation_variants(build_model(plain_cfg, 1, 10), plain_cfg)]
        assert kinds == ([OWN] if attention == "softmax" else [OWN, SWAP])


def test_softmax_swap_equals_softmax_model_from_the_same_state_dict():
    favor_cfg = cfg(attention="favor", pe="ape+luo_rpe", qk_norm="l2")
    model = build_model(favor_cfg, 1, 10)
    with torch.no_grad():  # non-trivial encodings and temperatures
        for name, p in model.named_parameters():
            if "raw_table" in name or "log_temperature" in name:
                p.normal_()
    images = torch.randn(16, 1, 8, 8)
    softmax_model = build_model(favor_cfg.replace(attention="softmax"), 1, 10)
    state = {k: v for k, v in model.state_dict().items() if ".backend." not in k}
    missing, unexpected = softmax_model.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    softmax_model.eval()
    swapped = with_softmax_attention(model, favor_cfg)
    swapped.eval()
    torch.testing.assert_close(swapped(images), softmax_model(images))
    swap = evaluation_variants(model, favor_cfg)[-1]
    assert swap.kind == SWAP and swap.model is not model
    torch.testing.assert_close(predictor(images)(swap.model), softmax_model(images))


def test_variant_logits_batches_the_draws_and_restores_the_training_draw():
    """Each evaluation batch holds batch_size (image, variant) pairs: batch_size // k images, read by
    all k variants of their set before the next images; the logits are each variant's whole-set
    logits (float64: exactly), and the model keeps its training draw."""
    model_cfg = cfg(attention="favor", eval_draws=3, dtype="float64")
    model = build_model(model_cfg, 1, 10).double()
    layers = random_feature_layers(model)
    trained = [layer.projection.clone() for layer in layers]
    variants = evaluation_variants(model, model_cfg)  # own, 3 fresh, swap: 5 on the test set, 3 on val
    test = EvalSet("test", torch.randint(0, 256, (23, 1, 8, 8), dtype=torch.uint8), torch.randint(0, 10, (23,)),
                   (OWN, FRESH, SWAP))
    val = EvalSet("val", torch.randint(0, 256, (7, 1, 8, 8), dtype=torch.uint8), torch.randint(0, 10, (7,)), (FRESH,))
    calls, progress = [], []

    def forward(m, x):
        calls.append((m is model, len(x), [layer.projection.clone() for layer in layers]))
        return m(x)

    prepare = lambda x: x.double() / 255  # noqa: E731
    got = variant_logits([test, val], variants, prepare, forward, batch_size=20,
                         progress=lambda done, total: progress.append((done, total)))
    assert [n for _, n, _ in calls[:5]] == [4] * 5 and [n for _, n, _ in calls[-3:]] == [1] * 3  # 20 // 5, 20 // 3
    assert [(own, n) for own, n, _ in calls[:5]] == [(True, 4)] * 4 + [(False, 4)]  # one batch through every variant
    assert progress[-1] == (23 * 5 + 7 * 3, 23 * 5 + 7 * 3) and progress[0] == (20, 23 * 5 + 7 * 3)
    assert all(torch.equal(layer.projection, p) for layer, p in zip(layers, trained))
    same = functools.partial(torch.testing.assert_close, rtol=1e-13, atol=1e-13)  # a batch's rounding, float64
    with torch.no_grad():
        model.eval()
        same(got["test"][OWN], model(prepare(test.images)))
        for draw in (1, 2, 3):
            with fresh_draw(model, draw):
                same(got["test"][f"{FRESH} {draw}"], model(prepare(test.images)))
                same(got["val"][f"{FRESH} {draw}"], model(prepare(val.images)))
        same(got["test"][SWAP], variants[-1].model(prepare(test.images)))
        assert not torch.allclose(got["test"][f"{FRESH} 1"], got["test"][f"{FRESH} 2"])  # the draws really differ
    assert set(got["val"]) == {f"{FRESH} {d}" for d in (1, 2, 3)}


@pytest.mark.slow
@pytest.mark.parametrize("extra", [dict(attention="favor", pe="rope", eval_rotations="standard"),
                                   dict(attention="relu", pe="ape+luo_rpe", eval_draws=2),
                                   dict(attention="relu", pe="ape", relu_projection="identity"),
                                   dict(attention="softmax", pe="rope", eval_rotations="standard"),
                                   dict(attention="favor", pe="ape", eval_draws=1, val_fraction=0.0)])
def test_batched_final_evaluation_equals_the_plain_passes(extra):
    """Issue 43: the batched evaluation gives the summary row the old whole-set passes gave, with the
    same seeds and draws: every accuracy exactly, in float64 (eval batches of 50 pairs: many uneven
    batches), the log-likelihood to rounding."""
    from tests.eval_reference import reference_metrics

    from rpevit.data import load_splits
    from rpevit.tasks.train import summarize

    run_cfg = TrialConfig.from_dict({"dataset": "digits", "dim": 16, "heads": 2, "depth": 2, "num_features": 8,
                                     "eval_draws": 3, "dtype": "float64", "eval_batch_size": 50, "device": "cpu",
                                     **extra})
    device = torch.device("cpu")
    torch.set_default_dtype(torch.float64)
    try:
        data = load_splits("digits", val_fraction=run_cfg.val_fraction)
        torch.manual_seed(0)
        model = build_model(run_cfg, 1, 10).double()
        with torch.no_grad():  # spread the logits: no near-ties for rounding to break
            model.head.weight.mul_(30)
        expected = reference_metrics(model, data, run_cfg, device)
        lines = []
        row = summarize(model, data, run_cfg, device, history=[], log=lines.append)
    finally:
        torch.set_default_dtype(torch.float32)
    for key, value in expected.items():
        if key == "log_likelihood":
            assert row[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert (math.isnan(row[key]) and math.isnan(value)) or row[key] == value, (key, row[key], value)
    assert [line.split(":")[0].split(" (")[0] for line in lines if not line.endswith("...") and "%" not in line] == [
        "eval 1/4 passes", "eval 2/4 fidelity on 128 test images", "eval 3/4 FLOPs", "eval 4/4 inference timing"]


def small_run(**kw):
    cfg = TrialConfig.from_dict({"dataset": "digits", "epochs": 1, "train_subset": 160, "eval_draws": 3,
                                 "dim": 16, "heads": 2, "depth": 2, "num_features": 16, **kw})
    return train_and_evaluate(cfg, log=None)


@pytest.mark.slow
def test_train_rows_carry_draw_aware_keys_seeded():
    first, second = small_run(attention="favor", pe="rope"), small_run(attention="favor", pe="rope")
    for key in (*DRAW_KEYS, "test_acc_softmax_swap", "attn_tv_to_softmax"):
        assert math.isfinite(first[key]) and first[key] == second[key], key
    assert len(first["attn_tv_per_layer"]) == 2 and first["attn_tv_per_layer"] == second["attn_tv_per_layer"]
    soft = small_run(attention="softmax", pe="rope")
    assert all(math.isnan(soft[key]) for key in (*DRAW_KEYS, "test_acc_softmax_swap"))
    assert soft["attn_tv_to_softmax"] == 0.0


# ---- issue 28, item 5: test-time rotations (rotation_metrics, `eval_rotations: standard`)
ROT_KEYS = ("test_acc_rot0", "test_acc_rot90", "test_acc_rot180", "test_acc_rot270", "test_acc_rot_random")


def test_rotation_metrics_by_hand_with_a_quadrant_reader():
    """A 'model' that names the quadrant of the one bright pixel (0 top-left, 1 top-right, 2 bottom-left,
    3 bottom-right): what a rot90 does to each image, and so each accuracy, is known by hand."""
    from rpevit.evaluation import rotated_test_sets, rotation_metrics

    def marked(i: int, j: int) -> torch.Tensor:
        img = torch.zeros(1, 6, 6, dtype=torch.uint8)
        img[0, i, j] = 255
        return img

    images = torch.stack([marked(0, 0), marked(0, 0), marked(0, 5), marked(5, 5), marked(1, 1)])
    labels = torch.tensor([0, 2, 0, 0, 3])

    def predict(x):
        flat = x[:, 0].flatten(1).float().argmax(-1)
        row, col = flat // 6, flat % 6
        return torch.nn.functional.one_hot(2 * (row >= 3).long() + (col >= 3).long(), 4).float()

    # counter-clockwise quarter turns as displayed: top-left -> bottom-left -> bottom-right -> top-right
    # quadrants after k turns: image 0/1 (TL): 0, 2, 3, 1; image 2 (TR): 1, 0, 2, 3; image 3 (BR): 3, 1, 0, 2;
    # image 4 (TL): 0, 2, 3, 1. Correct: k=0 images 0 (0); k=1 image 1 (2), image 2 (0); k=2 image 3 (0),
    # image 4 (3); k=3 none.
    sets = rotated_test_sets(images)
    got = rotation_metrics({name: predict(x) for name, x in sets.items()}, {name: [] for name in sets}, labels)
    assert [got[k] for k in ROT_KEYS[:4]] == pytest.approx([1 / 5, 2 / 5, 2 / 5, 0.0])
    assert all(math.isnan(got[f"{k}_draw_mean"]) for k in ROT_KEYS)  # no random features
    assert 0.0 <= got["test_acc_rot_random"] <= 1.0
    fresh = rotation_metrics({name: predict(x) for name, x in sets.items()},
                             {name: [predict(x), predict(sets["90"])] for name, x in sets.items()}, labels)
    assert fresh["test_acc_rot0_draw_mean"] == pytest.approx((1 / 5 + 2 / 5) / 2)


def test_random_test_angles_are_fixed():
    from rpevit.data import rotate_images
    from rpevit.evaluation import random_test_angles, rotated_test_sets

    angles = random_test_angles(50)
    assert torch.equal(angles, random_test_angles(50)) and 0 <= angles.min() and angles.max() < 360
    assert torch.equal(random_test_angles(60)[:50], angles)  # image i's angle does not depend on the set size
    images = torch.randint(0, 256, (32, 1, 8, 8), dtype=torch.uint8)
    sets = rotated_test_sets(images)
    assert list(sets) == ["0", "90", "180", "270", "random"]
    assert torch.equal(sets["90"], torch.rot90(images, 1, dims=(-2, -1)))
    assert torch.equal(sets["random"], rotate_images(images, random_test_angles(32)))


@pytest.mark.slow
def test_train_rows_carry_rotation_keys_only_when_asked():
    favor = small_run(attention="favor", pe="rotinv", eval_rotations="standard")
    assert favor["test_acc_rot0"] == favor["test_acc"]
    assert favor["test_acc_rot0_draw_mean"] == pytest.approx(favor["test_acc_draw_mean"])
    assert all(math.isfinite(favor[k]) and math.isfinite(favor[f"{k}_draw_mean"]) for k in ROT_KEYS)
    plain = small_run(attention="softmax", pe="ape")
    assert all(math.isnan(plain[k]) and math.isnan(plain[f"{k}_draw_mean"]) for k in ROT_KEYS)


@pytest.mark.slow
def test_validation_draw_mean_is_the_mean_validation_accuracy_over_fresh_draws():
    """What choices for random-feature models are made on (issue 28): by hand, draw by draw."""
    from rpevit.data import load_splits
    from rpevit.tasks.train import predict, summarize

    cfg = TrialConfig.from_dict({"dataset": "digits", "attention": "favor", "pe": "rope", "dim": 16, "heads": 2,
                                 "depth": 1, "num_features": 8, "eval_draws": 3, "device": "cpu"})
    data = load_splits("digits", val_fraction=0.1)
    model = build_model(cfg, 1, 10).eval()
    by_hand, outputs = [], []
    for draw in (1, 2, 3):
        with fresh_draw(model, draw):
            logits = predict(model, data, data.x_val, cfg, torch.device("cpu"))
        by_hand.append((logits.argmax(-1) == data.y_val).double().mean().item())
        outputs.append(logits)
    assert summarize(model, data, cfg, torch.device("cpu"), [])["val_acc_draw_mean"] == pytest.approx(sum(by_hand) / 3)
    assert not torch.allclose(outputs[0], outputs[1])  # the draws really differ
    softmax_cfg = cfg.replace(attention="softmax")
    softmax = build_model(softmax_cfg, 1, 10).eval()
    assert math.isnan(summarize(softmax, data, softmax_cfg, torch.device("cpu"), [])["val_acc_draw_mean"])
